//! The router's TLS ingress (`--tls-listen`) with `--ingress-allowed-spiffe-ids`, through `ate up`:
//! a listed client certificate gets through the handshake and reaches the actor; a certificate
//! not on the list, one from another CA, and no certificate are refused in the handshake. The
//! router runs with the specification's install command line (`--mode=ingress
//! --namespace=ate-system --drain-delay=13s --ingress-allowed-spiffe-ids=… --preview=`).

mod support;

use std::sync::Arc;

use ate_tls::{Alpn, CertSource, LocalCa, ServerCheck, SpiffeId, SvidRequest};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CLIENT: &str = "spiffe://ate.local/ns/team/sa/agent-client";

/// GET / with the actor header over TLS; Ok(status line) or Err (refused before a response).
async fn get_tls(
    port: u16,
    cfg: ate_tls::rustls::ClientConfig,
    actor: &str,
) -> Result<String, String> {
    let mut cfg = cfg;
    ate_tls::set_client_alpn(&mut cfg, &[Alpn::Http11]);
    let mut s = ate_tls::connect(Arc::new(cfg), "127.0.0.1", port)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let req = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nate-target-actor: {actor}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    if text.is_empty() {
        return Err("closed without a response".into());
    }
    Ok(text)
}

#[test]
fn tls_ingress_admits_only_listed_client_ids() {
    let port = free_port();
    let sys = System::up(UpOptions {
        workers: 1,
        router_args: vec![
            "--mode=ingress".to_string(),
            "--namespace=ate-system".to_string(),
            "--drain-delay=13s".to_string(),
            format!("--tls-listen=127.0.0.1:{port}"),
            format!("--ingress-allowed-spiffe-ids={CLIENT}"),
            "--preview=".to_string(),
        ],
        ..Default::default()
    });
    sys.ate_ok(&create_actor_args("ing", "ate-demo", "ate-demo/counter"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let ca = Arc::new(LocalCa::open(&sys.state_dir().join("ca")).expect("ate up's CA"));
        let router = || ServerCheck::Pin(SpiffeId::router("ate.local").unwrap());
        let as_id = |id: SpiffeId| {
            let src = CertSource::issued(ca.clone(), SvidRequest::new(id)).unwrap();
            ate_tls::client_config(&src, router()).unwrap()
        };

        let ok = get_tls(
            port,
            as_id(SpiffeId::parse(CLIENT).unwrap()),
            "ate-demo/ing",
        )
        .await
        .expect("the listed client gets through");
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.contains("preserved memory count: 1"),
            "{ok}"
        );
        // Hostname verification works too (the router's certificate names 127.0.0.1).
        let src = CertSource::issued(
            ca.clone(),
            SvidRequest::new(SpiffeId::parse(CLIENT).unwrap()),
        )
        .unwrap();
        let by_name = ate_tls::client_config(&src, ServerCheck::Hostname).unwrap();
        let ok = get_tls(port, by_name, "ate-demo/ing")
            .await
            .expect("hostname check");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");

        // Not on the list (even the admin), another CA, no certificate: refused.
        let r = get_tls(
            port,
            as_id(SpiffeId::admin("ate.local").unwrap()),
            "ate-demo/ing",
        )
        .await;
        assert!(r.is_err(), "admin is not on the ingress list: {r:?}");
        let other_dir = tempfile::tempdir().unwrap();
        let other = LocalCa::open_or_create(other_dir.path(), "ate.local").unwrap();
        let svid = other
            .issue(&SvidRequest::new(SpiffeId::parse(CLIENT).unwrap()))
            .unwrap();
        let foreign = CertSource::fixed(&svid, ca.roots().unwrap()).unwrap();
        let r = get_tls(
            port,
            ate_tls::client_config(&foreign, router()).unwrap(),
            "ate-demo/ing",
        )
        .await;
        assert!(r.is_err(), "a certificate from another CA: {r:?}");
        let none = ate_tls::client_config_no_cert(ca.roots().unwrap(), router()).unwrap();
        let r = get_tls(port, none, "ate-demo/ing").await;
        assert!(r.is_err(), "no client certificate: {r:?}");
    });
    let log = std::fs::read_to_string(sys.state_dir().join("logs/router.log")).expect("router log");
    assert!(
        log.lines()
            .any(|l| l.contains("router starting") && l.contains("namespace=ate-system")),
        "the router's start line names its mode and namespace:\n{log}"
    );
}
