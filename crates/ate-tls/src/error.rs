//! One error type for the crate; handshake rejections wrap it in a rustls `OtherError` so the
//! message survives into the `accept`/`connect` error seen by the caller.

use std::path::PathBuf;

use crate::id::SpiffeId;

/// Everything that can go wrong while building identities and TLS configurations.
#[derive(thiserror::Error)]
pub enum TlsError {
    #[error("invalid SPIFFE ID {id:?}: {reason}")]
    InvalidSpiffeId { id: String, reason: String },

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "refusing CA key file {path}: mode {mode:04o} gives access to group/other; run `chmod 600 {path}`"
    )]
    InsecureKeyPermissions { path: PathBuf, mode: u32 },

    #[error(
        "CA directory {dir} holds {present} but not {missing}; restore the missing file or remove both"
    )]
    CaIncomplete {
        dir: PathBuf,
        present: &'static str,
        missing: &'static str,
    },

    #[error("CA for trust domain {ca} cannot issue {id}")]
    ForeignTrustDomain { ca: String, id: Box<SpiffeId> },

    #[error("invalid certificate lifetime: {0}")]
    InvalidLifetime(String),

    #[error("no certificate found in {0}")]
    NoCertificate(PathBuf),

    #[error("no private key found in {0}")]
    NoPrivateKey(PathBuf),

    #[error("bad PEM in {path}: {reason}")]
    Pem { path: PathBuf, reason: String },

    #[error("certificate parse error: {0}")]
    CertParse(String),

    #[error("certificate has no SPIFFE ID (URI SAN with scheme spiffe://)")]
    MissingSpiffeId,

    #[error("certificate has {0} SPIFFE URI SANs; an X509-SVID must have exactly one")]
    MultipleSpiffeIds(usize),

    #[error("peer {peer} is not allowed here (allowed: {allowed})")]
    PeerNotAllowed {
        peer: Box<SpiffeId>,
        allowed: String,
    },

    #[error("server presented {presented}, expected {expected}")]
    ServerIdMismatch {
        expected: Box<SpiffeId>,
        presented: Box<SpiffeId>,
    },

    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),

    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),

    #[error("verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),

    #[error("--tls-cert, --tls-key and --tls-ca must be given together (or none of them)")]
    IncompleteFlags,

    #[error("{0} needs a tokio runtime (call it from async code)")]
    NoRuntime(&'static str),

    #[error("invalid endpoint {0:?}")]
    InvalidEndpoint(String),

    #[error("certificate signing request refused: {0}")]
    BadCsr(String),

    #[error("invalid join token: {0}")]
    BadJoinToken(String),

    #[error(
        "the api's CA (sha256 {presented}) is not the one the join token names ({expected}): wrong api address, or a token of another system"
    )]
    CaPinMismatch { expected: String, presented: String },

    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

// rustls renders `CertificateError::Other` with `{:?}`, so Debug shows the human message to keep
// handshake errors readable ("invalid peer certificate: Other(OtherError(peer ... is not allowed"))
impl std::fmt::Debug for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl TlsError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TlsError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Wraps this error as a rustls certificate error so a handshake fails with our message.
    pub(crate) fn into_cert_error(self) -> rustls::Error {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
            std::sync::Arc::new(self),
        )))
    }
}

pub type Result<T, E = TlsError> = std::result::Result<T, E>;
