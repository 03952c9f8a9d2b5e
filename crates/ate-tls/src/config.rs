//! rustls server/client configurations whose verifiers authenticate peers by SPIFFE ID during
//! the handshake, with trust anchors read from the `CertSource` at each handshake (so a reloaded
//! CA bundle applies to new connections).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    Resumption, WantsClientCert, verify_server_cert_signed_by_trust_anchor, verify_server_name,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, ConfigBuilder, DistinguishedName, RootCertStore, ServerConfig};

use crate::error::TlsError;
use crate::id::SpiffeId;
use crate::peer::spiffe_id_from_der;
use crate::source::CertSource;

/// The handshake signature checks of a rustls certificate verifier, which every verifier here
/// makes the same way: with the signature algorithms of its `provider` field. A macro because
/// `ServerCertVerifier` and `ClientCertVerifier` each declare the same three methods.
macro_rules! provider_signature_checks {
    () => {
        provider_signature_checks!(@check verify_tls12_signature);
        provider_signature_checks!(@check verify_tls13_signature);

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
    // rustls names its checking functions as the trait names the methods.
    (@check $check:ident) => {
        fn $check(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::$check(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }
    };
}
pub(crate) use provider_signature_checks;

/// Which client SPIFFE IDs a server admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowList {
    /// None: any ID whose certificate chains to the CA.
    ids: Option<BTreeSet<SpiffeId>>,
}

impl AllowList {
    /// Any SPIFFE ID issued by the trusted CA (authorization happens later, e.g. api roles).
    pub fn any() -> Self {
        AllowList { ids: None }
    }

    /// Exactly these IDs.
    pub fn only(ids: impl IntoIterator<Item = SpiffeId>) -> Self {
        AllowList {
            ids: Some(ids.into_iter().collect()),
        }
    }

    /// Comma- or whitespace-separated SPIFFE IDs (`--ingress-allowed-spiffe-ids`).
    pub fn parse_list(s: &str) -> Result<Self, TlsError> {
        let ids = s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
            .map(SpiffeId::parse)
            .collect::<Result<BTreeSet<_>, _>>()?;
        Ok(AllowList { ids: Some(ids) })
    }

    pub fn allows(&self, id: &SpiffeId) -> bool {
        self.ids.as_ref().is_none_or(|ids| ids.contains(id))
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ids {
            None => f.write_str("any ID from the trusted CA"),
            Some(ids) if ids.is_empty() => f.write_str("nobody"),
            Some(ids) => {
                let list: Vec<String> = ids.iter().map(ToString::to_string).collect();
                f.write_str(&list.join(", "))
            }
        }
    }
}

/// Client-certificate policy of a server.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// No client certificate is requested (plain server TLS).
    None,
    /// A certificate is requested; if sent it must chain to the CA and be allowed. Clients
    /// without one get through (e.g. JWT clients of the api, AgentGateway ingress).
    Optional { allowed: AllowList },
    /// A certificate chaining to the CA with an allowed SPIFFE ID is required.
    Required { allowed: AllowList },
}

/// How a client identifies the server.
#[derive(Clone, Debug)]
pub enum ServerCheck {
    /// Any certificate chaining to the CA (AgentGateway semantics).
    ChainOnly,
    /// The chain, then exactly this SPIFFE ID (workers are dialed by IP, so the URI SAN replaces
    /// hostname verification).
    Pin(SpiffeId),
    /// The chain, then any of these SPIFFE IDs.
    OneOf(AllowList),
    /// The chain, then any node-agent identity of this trust domain: the shared
    /// `…/sa/ate-node` or a per-node `…/sa/ate-node-<node>` (the api dialing node agents).
    NodeAgent { trust_domain: String },
    /// The chain, then classic hostname/IP verification against the name we connected to
    /// (servicedns certificates on Kubernetes).
    Hostname,
}

/// ALPN protocols we speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    H2,
    Http11,
}

impl Alpn {
    pub fn id(self) -> &'static [u8] {
        match self {
            Alpn::H2 => b"h2",
            Alpn::Http11 => b"http/1.1",
        }
    }
}

/// Sets the server's ALPN list in preference order (`[H2, Http11]` for hyper auto servers,
/// `[H2]` for gRPC).
pub fn set_server_alpn(config: &mut ServerConfig, protocols: &[Alpn]) {
    config.alpn_protocols = protocols.iter().map(|p| p.id().to_vec()).collect();
}

/// Sets the client's ALPN offer.
pub fn set_client_alpn(config: &mut ClientConfig, protocols: &[Alpn]) {
    config.alpn_protocols = protocols.iter().map(|p| p.id().to_vec()).collect();
}

/// A server config presenting `source`'s current certificate and applying `client_auth`.
/// Session resumption is off so every connection runs the verifier against the current
/// allow-list and validity (and presents the current certificate).
pub fn server_config(
    source: &CertSource,
    client_auth: ClientAuth,
) -> Result<ServerConfig, TlsError> {
    let provider = crate::crypto_provider();
    let spiffe = |allowed, mandatory| -> Arc<dyn ClientCertVerifier> {
        let roots = Roots::Source(source.clone());
        Arc::new(SpiffeClientVerifier::new(
            roots,
            allowed,
            mandatory,
            provider.clone(),
        ))
    };
    let verifier = match client_auth {
        ClientAuth::None => WebPkiClientVerifier::no_client_auth(),
        ClientAuth::Optional { allowed } => spiffe(allowed, false),
        ClientAuth::Required { allowed } => spiffe(allowed, true),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(source.resolver());
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// A client config presenting `source`'s current certificate and checking the server with
/// `expected_server` against `source`'s CA roots.
pub fn client_config(
    source: &CertSource,
    expected_server: ServerCheck,
) -> Result<ClientConfig, TlsError> {
    spiffe_client_config(Roots::Source(source.clone()), expected_server, |b| {
        b.with_client_cert_resolver(source.resolver())
    })
}

/// A client config without a client certificate (JWT clients, ingress clients in AgentGateway
/// mode), checking the server against `roots`.
pub fn client_config_no_cert(
    roots: RootCertStore,
    expected_server: ServerCheck,
) -> Result<ClientConfig, TlsError> {
    spiffe_client_config(Roots::Fixed(Arc::new(roots)), expected_server, |b| {
        b.with_no_client_auth()
    })
}

/// A client config checking the server with a [`SpiffeServerVerifier`].
fn spiffe_client_config(
    roots: Roots,
    check: ServerCheck,
    auth: impl FnOnce(ConfigBuilder<ClientConfig, WantsClientCert>) -> ClientConfig,
) -> Result<ClientConfig, TlsError> {
    let provider = crate::crypto_provider();
    let verifier = SpiffeServerVerifier {
        roots,
        check,
        provider: provider.clone(),
    };
    client_config_with(provider, Arc::new(verifier), auth)
}

/// A client config checking the server with `verifier`, its own authentication set by `auth`.
/// Resumption is off so every connection runs the verifier (as in [`server_config`]).
pub(crate) fn client_config_with(
    provider: Arc<CryptoProvider>,
    verifier: Arc<dyn ServerCertVerifier>,
    auth: impl FnOnce(ConfigBuilder<ClientConfig, WantsClientCert>) -> ClientConfig,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = auth(builder);
    config.resumption = Resumption::disabled();
    Ok(config)
}

#[derive(Clone, Debug)]
enum Roots {
    Fixed(Arc<RootCertStore>),
    Source(CertSource),
}

impl Roots {
    fn load(&self) -> Arc<RootCertStore> {
        match self {
            Roots::Fixed(r) => r.clone(),
            Roots::Source(s) => s.roots(),
        }
    }
}

type CachedVerifier = (Arc<RootCertStore>, Arc<dyn ClientCertVerifier>);

/// WebPKI chain validation, then the SPIFFE allow-list, both inside the handshake.
struct SpiffeClientVerifier {
    roots: Roots,
    allowed: AllowList,
    mandatory: bool,
    provider: Arc<CryptoProvider>,
    /// The WebPKI verifier for the last root store seen; rebuilt when the CA bundle reloads.
    cache: ArcSwapOption<CachedVerifier>,
}

impl fmt::Debug for SpiffeClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeClientVerifier")
            .field("allowed", &self.allowed)
            .field("mandatory", &self.mandatory)
            .finish_non_exhaustive()
    }
}

impl SpiffeClientVerifier {
    fn new(
        roots: Roots,
        allowed: AllowList,
        mandatory: bool,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        SpiffeClientVerifier {
            roots,
            allowed,
            mandatory,
            provider,
            cache: ArcSwapOption::empty(),
        }
    }

    fn webpki(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        let roots = self.roots.load();
        if let Some(cached) = self.cache.load().as_ref()
            && Arc::ptr_eq(&cached.0, &roots)
        {
            return Ok(cached.1.clone());
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(format!("client verifier: {e}")))?;
        self.cache.store(Some(Arc::new((roots, verifier.clone()))));
        Ok(verifier)
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    // Hints are optional in TLS; with reloadable roots we cannot hand out a borrowed list, and
    // our clients send their one certificate regardless.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.webpki()?
            .verify_client_cert(end_entity, intermediates, now)?;
        let id = spiffe_id_from_der(end_entity).map_err(TlsError::into_cert_error)?;
        if !self.allowed.allows(&id) {
            return Err(TlsError::PeerNotAllowed {
                peer: Box::new(id),
                allowed: self.allowed.to_string(),
            }
            .into_cert_error());
        }
        Ok(ClientCertVerified::assertion())
    }

    provider_signature_checks!();
}

/// WebPKI chain validation (as `WebPkiServerVerifier`), then the SPIFFE check in place of the
/// hostname check (unless `ServerCheck::Hostname`).
struct SpiffeServerVerifier {
    roots: Roots,
    check: ServerCheck,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for SpiffeServerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeServerVerifier")
            .field("check", &self.check)
            .finish_non_exhaustive()
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        let roots = self.roots.load();
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        match &self.check {
            ServerCheck::ChainOnly => {}
            ServerCheck::Hostname => verify_server_name(&cert, server_name)?,
            ServerCheck::Pin(expected) => {
                let presented =
                    spiffe_id_from_der(end_entity).map_err(TlsError::into_cert_error)?;
                if presented != *expected {
                    return Err(TlsError::ServerIdMismatch {
                        expected: Box::new(expected.clone()),
                        presented: Box::new(presented),
                    }
                    .into_cert_error());
                }
            }
            ServerCheck::NodeAgent { trust_domain } => {
                let presented =
                    spiffe_id_from_der(end_entity).map_err(TlsError::into_cert_error)?;
                if !presented.is_node()
                    || !presented.trust_domain().eq_ignore_ascii_case(trust_domain)
                {
                    return Err(TlsError::PeerNotAllowed {
                        peer: Box::new(presented),
                        allowed: format!("a node agent of trust domain {trust_domain}"),
                    }
                    .into_cert_error());
                }
            }
            ServerCheck::OneOf(allowed) => {
                let presented =
                    spiffe_id_from_der(end_entity).map_err(TlsError::into_cert_error)?;
                if !allowed.allows(&presented) {
                    return Err(TlsError::PeerNotAllowed {
                        peer: Box::new(presented),
                        allowed: allowed.to_string(),
                    }
                    .into_cert_error());
                }
            }
        }
        Ok(ServerCertVerified::assertion())
    }

    provider_signature_checks!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_parsing_and_membership() {
        let router = SpiffeId::router("ate.local").unwrap();
        let list = AllowList::parse_list(
            "spiffe://ate.local/ns/ate-system/sa/atenet-router, spiffe://ate.local/ns/a/sa/b",
        )
        .unwrap();
        assert!(list.allows(&router));
        assert!(!list.allows(&SpiffeId::worker("ate.local").unwrap()));
        assert!(AllowList::any().allows(&router));
        assert!(!AllowList::parse_list("").unwrap().allows(&router));
        assert!(AllowList::parse_list("spiffe://ate.local/x").is_err());
        assert_eq!(AllowList::only([]).to_string(), "nobody");
    }
}
