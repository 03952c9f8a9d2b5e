//! mTLS on the router → atunnel hop, in process: atunnel accepts only the router's SPIFFE ID, and
//! the router pins the worker's SPIFFE ID from the assignment.

use std::sync::Arc;
use std::time::Duration;

use ate_router::Stats;
use ate_router::cache::Route;
use ate_router::tunnel::{TunnelConfig, TunnelError, Tunnels};
use ate_tls::{
    AllowList, Alpn, CertSource, ClientAuth, LocalCa, SpiffeId, SvidRequest, server_config,
    set_server_alpn,
};
use tokio::net::TcpListener;

const TD: &str = "ate.local";

struct Atunnel {
    addr: String,
    ca: Arc<LocalCa>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// atunnel of worker `w1` over mTLS (no actor active: a tunnel that gets through is a 421).
async fn atunnel() -> Atunnel {
    ate_tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(LocalCa::open_or_create(dir.path(), TD).unwrap());
    let worker = CertSource::issued(
        ca.clone(),
        SvidRequest::new(SpiffeId::worker_instance(TD, "w1").unwrap()),
    )
    .unwrap();
    let mut server = server_config(
        &worker,
        ClientAuth::Required {
            allowed: AllowList::only([SpiffeId::router(TD).unwrap()]),
        },
    )
    .unwrap();
    set_server_alpn(&mut server, &[Alpn::H2]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _worker = worker;
        ate_atunnel::serve(
            listener,
            Some(Arc::new(server)),
            Arc::new(ate_atunnel::Tunnels::new()),
            async move {
                let _ = rx.await;
            },
        )
        .await
    });
    Atunnel {
        addr,
        ca,
        _dir: dir,
        _stop: tx,
    }
}

fn dialer(t: &Atunnel, id: SpiffeId) -> Arc<Tunnels> {
    let src = CertSource::issued(t.ca.clone(), SvidRequest::new(id)).unwrap();
    Tunnels::new(
        TunnelConfig {
            idle_per_actor: 0,
            idle_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(3),
            local_tunnels: None,
        },
        Some(src),
        Arc::new(Stats::default()),
    )
}

fn route(t: &Atunnel, identity: &str) -> Route {
    Route {
        worker: Arc::from(t.addr.as_str()),
        worker_id: "w1".into(),
        epoch: 1,
        worker_identity: identity.into(),
        activation: 0,
        hibernate_web_sockets: false,
    }
}

fn w1() -> String {
    SpiffeId::worker_instance(TD, "w1").unwrap().uri()
}

#[tokio::test]
async fn router_reaches_atunnel_pinning_the_worker() {
    let t = atunnel().await;
    let router = dialer(&t, SpiffeId::router(TD).unwrap());
    // Through the handshake both ways: atunnel answers 421 (no such actor here).
    let e = router
        .open(&route(&t, &w1()), "team-a/x", 80, "")
        .await
        .err();
    assert!(matches!(e, Some(TunnelError::Stale)), "{e:?}");
}

#[tokio::test]
async fn atunnel_refuses_a_client_that_is_not_the_router() {
    let t = atunnel().await;
    for id in [
        SpiffeId::parse("spiffe://ate.local/ns/team/sa/client").unwrap(),
        SpiffeId::worker_instance(TD, "w2").unwrap(),
        SpiffeId::admin(TD).unwrap(),
    ] {
        let client = dialer(&t, id.clone());
        let e = client
            .open(&route(&t, &w1()), "team-a/x", 80, "")
            .await
            .err();
        assert!(
            matches!(
                e,
                Some(
                    TunnelError::Tls { .. }
                        | TunnelError::Handshake { .. }
                        | TunnelError::Stream(_)
                )
            ),
            "{id} must be refused during the handshake, got {e:?}"
        );
    }
}

#[tokio::test]
async fn router_refuses_a_worker_that_is_not_the_pinned_id() {
    let t = atunnel().await;
    let router = dialer(&t, SpiffeId::router(TD).unwrap());
    // The assignment names w2, but the server at that address is w1.
    let w2 = SpiffeId::worker_instance(TD, "w2").unwrap().uri();
    let e = router.open(&route(&t, &w2), "team-a/x", 80, "").await.err();
    assert!(matches!(e, Some(TunnelError::Tls { .. })), "{e:?}");
    // No identity in the assignment: refused before dialing.
    let e = router.open(&route(&t, ""), "team-a/x", 80, "").await.err();
    assert!(matches!(e, Some(TunnelError::Identity { .. })), "{e:?}");
}
