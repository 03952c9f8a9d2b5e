//! Real TLS over loopback: who gets in, who is refused during the handshake, and why.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ate_tls::{
    AllowList, CertSource, ClientAuth, LocalCa, ServerCheck, SpiffeId, SvidRequest, client_config,
    client_config_no_cert, server_config,
};
use support::{echo_server, round_trip};

const TD: &str = ate_tls::DEFAULT_TRUST_DOMAIN;

fn router() -> SpiffeId {
    SpiffeId::router(TD).unwrap()
}

fn worker(n: u32) -> SpiffeId {
    SpiffeId::worker_instance(TD, &format!("w{n}")).unwrap()
}

fn new_ca() -> (tempfile::TempDir, Arc<LocalCa>) {
    let dir = tempfile::tempdir().unwrap();
    let ca = LocalCa::open_or_create(dir.path(), TD).unwrap();
    (dir, Arc::new(ca))
}

/// A non-rotating source for `id` from `ca`, trusting `trust`.
fn fixed(ca: &LocalCa, id: SpiffeId, trust: &LocalCa) -> CertSource {
    let svid = ca.issue(&SvidRequest::new(id)).unwrap();
    CertSource::fixed(&svid, trust.roots().unwrap()).unwrap()
}

async fn atunnel_like(ca: &LocalCa) -> support::EchoServer {
    // Worker w1's atunnel: only the router may connect.
    let source = fixed(ca, worker(1), ca);
    let cfg = server_config(
        &source,
        ClientAuth::Required {
            allowed: AllowList::only([router()]),
        },
    )
    .unwrap();
    echo_server(cfg).await
}

#[tokio::test]
async fn required_accepts_the_router() {
    let (_d, ca) = new_ca();
    let mut server = atunnel_like(&ca).await;
    let client = client_config(&fixed(&ca, router(), &ca), ServerCheck::Pin(worker(1))).unwrap();
    round_trip(&client, server.addr).await.unwrap();
    assert_eq!(server.next().await.unwrap(), Some(router()));
}

#[tokio::test]
async fn required_refuses_no_client_certificate() {
    let (_d, ca) = new_ca();
    let mut server = atunnel_like(&ca).await;
    let client = client_config_no_cert(ca.roots().unwrap(), ServerCheck::ChainOnly).unwrap();
    assert!(round_trip(&client, server.addr).await.is_err());
    let err = server.next().await.unwrap_err();
    assert!(err.contains("peer sent no certificates"), "{err}");
}

#[tokio::test]
async fn required_refuses_another_ca() {
    let (_d, ca) = new_ca();
    let (_d2, other) = new_ca();
    let mut server = atunnel_like(&ca).await;
    // Same SPIFFE ID, but signed by a different CA; the client itself trusts the real CA so
    // the refusal is the server's.
    let client = client_config(&fixed(&other, router(), &ca), ServerCheck::Pin(worker(1))).unwrap();
    assert!(round_trip(&client, server.addr).await.is_err());
    let err = server.next().await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
}

#[tokio::test]
async fn required_refuses_wrong_spiffe_id() {
    let (_d, ca) = new_ca();
    let mut server = atunnel_like(&ca).await;
    // A worker (e.g. an escaped actor) calling atunnel directly.
    let client = client_config(&fixed(&ca, worker(2), &ca), ServerCheck::Pin(worker(1))).unwrap();
    assert!(round_trip(&client, server.addr).await.is_err());
    let err = server.next().await.unwrap_err();
    assert!(
        err.contains("peer spiffe://ate.local/ns/ate-system/sa/ate-worker-w2 is not allowed here")
            && err.contains("atenet-router"),
        "{err}"
    );
}

#[tokio::test]
async fn required_refuses_expired_certificate() {
    let (_d, ca) = new_ca();
    let mut server = atunnel_like(&ca).await;
    let now = SystemTime::now();
    let svid = ca
        .issue_with_validity(
            &SvidRequest::new(router()),
            now - Duration::from_secs(7200),
            now - Duration::from_secs(3600),
        )
        .unwrap();
    let source = CertSource::fixed(&svid, ca.roots().unwrap()).unwrap();
    let client = client_config(&source, ServerCheck::Pin(worker(1))).unwrap();
    assert!(round_trip(&client, server.addr).await.is_err());
    let err = server.next().await.unwrap_err();
    assert!(err.contains("certificate expired"), "{err}");
}

#[tokio::test]
async fn required_refuses_certificate_after_it_expires() {
    let (_d, ca) = new_ca();
    let mut server = atunnel_like(&ca).await;
    let svid = ca
        .issue(&SvidRequest::new(router()).lifetime(Duration::from_secs(1)))
        .unwrap();
    let source = CertSource::fixed(&svid, ca.roots().unwrap()).unwrap();
    let client = client_config(&source, ServerCheck::Pin(worker(1))).unwrap();
    round_trip(&client, server.addr).await.unwrap();
    assert!(server.next().await.is_ok());
    // webpki compares whole seconds; 2.1 s guarantees we are past notAfter.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(round_trip(&client, server.addr).await.is_err());
    let err = server.next().await.unwrap_err();
    assert!(err.contains("certificate expired"), "{err}");
}

#[tokio::test]
async fn pinned_client_refuses_wrong_worker_and_foreign_ca() {
    let (_d, ca) = new_ca();
    let (_d2, other) = new_ca();
    let router_src = fixed(&ca, router(), &ca);
    let pin_w1 = client_config(&router_src, ServerCheck::Pin(worker(1))).unwrap();
    let any_router = ClientAuth::Required {
        allowed: AllowList::only([router()]),
    };

    // worker-2 answers where the router expected worker-1.
    let w2 =
        echo_server(server_config(&fixed(&ca, worker(2), &ca), any_router.clone()).unwrap()).await;
    let err = round_trip(&pin_w1, w2.addr).await.unwrap_err();
    assert!(
        err.contains("expected spiffe://ate.local/ns/ate-system/sa/ate-worker-w1")
            && err.contains("ate-worker-w2"),
        "{err}"
    );

    // worker-1's identity, but from another CA.
    let w1_other =
        echo_server(server_config(&fixed(&other, worker(1), &ca), any_router.clone()).unwrap())
            .await;
    let err = round_trip(&pin_w1, w1_other.addr).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // The genuine worker-1 works, and ChainOnly accepts worker-2 (AgentGateway semantics).
    let w1 = echo_server(server_config(&fixed(&ca, worker(1), &ca), any_router).unwrap()).await;
    round_trip(&pin_w1, w1.addr).await.unwrap();
    let chain_only = client_config(&router_src, ServerCheck::ChainOnly).unwrap();
    round_trip(&chain_only, w2.addr).await.unwrap();
}

#[tokio::test]
async fn hostname_check_uses_dns_sans() {
    let (_d, ca) = new_ca();
    let svid = ca
        .issue(&SvidRequest::new(SpiffeId::api(TD).unwrap()).dns("localhost"))
        .unwrap();
    let api = CertSource::fixed(&svid, ca.roots().unwrap()).unwrap();
    let server = echo_server(
        server_config(
            &api,
            ClientAuth::Optional {
                allowed: AllowList::any(),
            },
        )
        .unwrap(),
    )
    .await;
    let client =
        Arc::new(client_config_no_cert(ca.roots().unwrap(), ServerCheck::Hostname).unwrap());
    // By name: matches the DNS SAN.
    ate_tls::connect(client.clone(), "localhost", server.addr.port())
        .await
        .unwrap();
    // By IP: the certificate has no IP SAN.
    let err = ate_tls::connect(client, "127.0.0.1", server.addr.port())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not valid for"), "{err}");
}

#[tokio::test]
async fn optional_admits_anonymous_but_checks_presented_ids() {
    let (_d, ca) = new_ca();
    let api = fixed(&ca, SpiffeId::api(TD).unwrap(), &ca);
    let mut server = echo_server(
        server_config(
            &api,
            ClientAuth::Optional {
                allowed: AllowList::only([router()]),
            },
        )
        .unwrap(),
    )
    .await;
    let anon = client_config_no_cert(ca.roots().unwrap(), ServerCheck::ChainOnly).unwrap();
    round_trip(&anon, server.addr).await.unwrap();
    assert_eq!(server.next().await.unwrap(), None);
    let wrong = client_config(&fixed(&ca, worker(1), &ca), ServerCheck::ChainOnly).unwrap();
    assert!(round_trip(&wrong, server.addr).await.is_err());
    assert!(server.next().await.unwrap_err().contains("not allowed"));
}

#[test]
fn issued_svid_is_a_valid_x509_svid() {
    let (_d, ca) = new_ca();
    let svid = ca
        .issue(
            &SvidRequest::new(router())
                .dns("localhost")
                .ip("127.0.0.1".parse().unwrap()),
        )
        .unwrap();
    let chain: Vec<u8> = svid.chain.iter().flat_map(|c| c.to_vec()).collect();
    let key = svid.key_der();
    let parsed = spiffe::X509Svid::parse_from_der(&chain, key.secret_der()).unwrap();
    assert_eq!(parsed.spiffe_id().to_string(), router().to_string());
    assert_eq!(
        ate_tls::spiffe_id_from_der(&svid.chain[0]).unwrap(),
        router()
    );

    let (_, cert) = x509_parser::parse_x509_certificate(&svid.chain[0]).unwrap();
    let bc = cert.basic_constraints().unwrap().unwrap();
    assert!(!bc.value.ca);
    let ku = cert.key_usage().unwrap().unwrap();
    assert!(ku.value.digital_signature() && !ku.value.key_cert_sign());
    let eku = cert.extended_key_usage().unwrap().unwrap();
    assert!(eku.value.server_auth && eku.value.client_auth);
}

#[test]
fn ca_refuses_foreign_trust_domain() {
    let (_d, ca) = new_ca();
    let id = SpiffeId::router("example.org").unwrap();
    assert!(matches!(
        ca.issue(&SvidRequest::new(id)),
        Err(ate_tls::TlsError::ForeignTrustDomain { .. })
    ));
}

#[test]
fn install_crypto_provider_is_idempotent() {
    ate_tls::install_crypto_provider();
    assert!(!ate_tls::install_crypto_provider());
}

#[tokio::test]
async fn node_agent_check_accepts_shared_and_per_node_identities_only() {
    let (_d, ca) = new_ca();
    let api = SpiffeId::api(TD).unwrap();
    let check = || ServerCheck::NodeAgent {
        trust_domain: TD.to_string(),
    };
    for (server_id, ok) in [
        (SpiffeId::node(TD).unwrap(), true),
        (SpiffeId::node_instance(TD, "node-1").unwrap(), true),
        (worker(1), false),
        (router(), false),
    ] {
        let cfg = server_config(
            &fixed(&ca, server_id.clone(), &ca),
            ClientAuth::Required {
                allowed: AllowList::only([api.clone()]),
            },
        )
        .unwrap();
        let server = echo_server(cfg).await;
        let client = client_config(&fixed(&ca, api.clone(), &ca), check()).unwrap();
        let result = round_trip(&client, server.addr).await;
        assert_eq!(result.is_ok(), ok, "{server_id}: {result:?}");
    }
    // A node of another trust domain than the one expected is refused.
    let cfg = server_config(
        &fixed(&ca, SpiffeId::node_instance(TD, "node-1").unwrap(), &ca),
        ClientAuth::None,
    )
    .unwrap();
    let server = echo_server(cfg).await;
    let other = ServerCheck::NodeAgent {
        trust_domain: "other.td".to_string(),
    };
    let client = client_config(&fixed(&ca, api, &ca), other).unwrap();
    assert!(round_trip(&client, server.addr).await.is_err());
}
