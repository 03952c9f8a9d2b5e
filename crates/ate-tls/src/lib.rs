//! Identity for Agent Substrate: SPIFFE IDs, the embedded local CA, rotating certificate
//! sources, rustls configs that authenticate peers by SPIFFE ID during the handshake, and
//! helpers to serve and call tonic over those configs; and [`process`], the shutdown signal and
//! ready file of every component. The metrics endpoint and trace context every component shares
//! are `ate-telemetry`.
//!
//! Everything uses the aws-lc-rs provider explicitly, so configs work whether or not
//! [`install_crypto_provider`] was called; call it anyway first thing in `main` so other crates
//! that use the process default (with both providers linked rustls would panic) agree.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod args;
pub mod ca;
pub mod config;
pub mod error;
mod fsutil;
pub mod grpc;
pub mod id;
pub mod join;
pub mod peer;
pub mod process;
pub mod source;

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

pub use args::TlsArgs;
pub use ca::{
    CA_CERT_FILE, CA_KEY_FILE, DEFAULT_SVID_LIFETIME, LocalCa, SignedCert, Svid, SvidRequest,
};
pub use config::{
    AllowList, Alpn, ClientAuth, ServerCheck, client_config, client_config_no_cert, server_config,
    set_client_alpn, set_server_alpn,
};
pub use error::TlsError;
pub use fsutil::write_atomic;
pub use grpc::{
    PeerInfo, TlsConn, TlsIncoming, connect, endpoint, replicas_channel_lazy, request_identity,
    request_peer, tls_channel, tls_channel_lazy,
};
pub use id::{DEFAULT_TRUST_DOMAIN, SYSTEM_NAMESPACE, SpiffeId};
pub use join::JoinToken;
pub use peer::{PeerIdentity, peer_spiffe_id, spiffe_id_from_der};
pub use source::{
    CertSource, DEFAULT_FILE_POLL, Material, PemFiles, load_roots, read_certs, read_key,
};

/// Re-exported so dependents need no direct rustls/tokio-rustls dependency.
pub use rustls;
pub use tokio_rustls;

/// Installs aws-lc-rs as the process-wide rustls provider. Idempotent: returns false if a
/// provider was already installed (by us or anyone else), which is fine.
pub fn install_crypto_provider() -> bool {
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .is_ok()
}

/// The aws-lc-rs provider used by every config in this crate.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}
