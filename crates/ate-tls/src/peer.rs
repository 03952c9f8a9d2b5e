//! Reading the SPIFFE ID out of certificates and established connections.

use rustls::CommonState;
use rustls::pki_types::CertificateDer;
use x509_parser::prelude::*;

use crate::error::TlsError;
use crate::id::SpiffeId;

/// The SPIFFE ID in a certificate's URI SAN. An X509-SVID carries exactly one.
pub fn spiffe_id_from_der(der: &CertificateDer<'_>) -> Result<SpiffeId, TlsError> {
    let (_, cert) =
        parse_x509_certificate(der).map_err(|e| TlsError::CertParse(format!("{e:?}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| TlsError::CertParse(format!("{e:?}")))?
        .ok_or(TlsError::MissingSpiffeId)?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) if u.starts_with("spiffe://") => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [] => Err(TlsError::MissingSpiffeId),
        [one] => SpiffeId::parse(one),
        many => Err(TlsError::MultipleSpiffeIds(many.len())),
    }
}

/// The verified peer's SPIFFE ID on an established rustls connection (server or client side;
/// `&ServerConnection`/`&ClientConnection` coerce). None if the peer sent no certificate or it
/// carries no valid ID. Our verifiers already checked the chain during the handshake.
pub fn peer_spiffe_id(conn: &CommonState) -> Option<SpiffeId> {
    conn.peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|leaf| spiffe_id_from_der(leaf).ok())
}

/// `peer_spiffe_id` for tokio-rustls streams.
pub trait PeerIdentity {
    fn peer_spiffe_id(&self) -> Option<SpiffeId>;
}

impl<IO> PeerIdentity for tokio_rustls::server::TlsStream<IO> {
    fn peer_spiffe_id(&self) -> Option<SpiffeId> {
        peer_spiffe_id(self.get_ref().1)
    }
}

impl<IO> PeerIdentity for tokio_rustls::client::TlsStream<IO> {
    fn peer_spiffe_id(&self) -> Option<SpiffeId> {
        peer_spiffe_id(self.get_ref().1)
    }
}

impl<IO> PeerIdentity for tokio_rustls::TlsStream<IO> {
    fn peer_spiffe_id(&self) -> Option<SpiffeId> {
        peer_spiffe_id(self.get_ref().1)
    }
}
