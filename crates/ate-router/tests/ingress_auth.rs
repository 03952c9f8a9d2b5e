//! Authenticated ingress (`--ingress-auth-mode`), end to end on real 127.0.0.1 sockets: a router
//! serving `--tls-listen` with its own ingress certificate (a servicedns name), in front of the
//! scripted api and a test atunnel.
//!
//! mtls: a client certificate whose SPIFFE ID is on `--ingress-allowed-spiffe-ids` gets the
//! actor's answer; another SPIFFE ID from the same CA, a certificate from another CA, and no
//! certificate are refused in the TLS handshake (no HTTP status ever); the plain listener answers
//! 401. jwt: a good token gets the answer (and the token does not reach the actor); a missing,
//! badly signed, expired or foreign-audience token gets 401 naming the problem; a token for
//! another atespace gets 403.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ate_router::auth::IngressAuthMode;
use ate_router::{Router, RouterConfig};
use ate_test_support::jwt::{Signer, merged, now};
use ate_tls::{
    CertSource, LocalCa, PemFiles, ServerCheck, SpiffeId, SvidRequest, rustls, tokio_rustls,
};
use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

const TD: &str = "cluster.local";
/// The spec's default allow-list entry.
const CLIENT_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/atenet-client";
/// The router's Service name: the ingress certificate's DNS SAN, which clients check.
const SERVICE_DNS: &str = "ate-router.ate-system.svc";
const ISS: &str = "https://issuer.test";
const AUD: &str = "ate-ingress";

struct Pki {
    dir: tempfile::TempDir,
    ca: Arc<LocalCa>,
    /// The ingress certificate (DNS SAN `SERVICE_DNS`, no SPIFFE role of its own).
    ingress: PemFiles,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Arc::new(LocalCa::open_or_create(&dir.path().join("ca"), TD).unwrap());
        let ingress = Self::issue_files(
            &ca,
            dir.path(),
            "ingress",
            SvidRequest::new(SpiffeId::router(TD).unwrap()).dns(SERVICE_DNS),
        );
        Pki { dir, ca, ingress }
    }

    fn issue_files(ca: &LocalCa, dir: &Path, name: &str, req: SvidRequest) -> PemFiles {
        let files = PemFiles::in_dir(dir, name);
        let svid = ca.issue(&req).unwrap();
        svid.write_pem(&files.cert, &files.key).unwrap();
        std::fs::write(&files.ca, ca.cert_pem()).unwrap();
        files
    }

    /// A client identity with this SPIFFE ID, from this CA.
    fn client(&self, id: &str) -> CertSource {
        let id = SpiffeId::parse(id).unwrap();
        CertSource::issued(self.ca.clone(), SvidRequest::new(id)).unwrap()
    }

    fn ca_file(&self) -> PathBuf {
        self.ingress.ca.clone()
    }
}

struct Setup {
    world_api: ScriptedApi,
    up80: Upstream,
    _atunnel: Atunnel,
    plain: SocketAddr,
    tls: SocketAddr,
    router: TestRouter,
}

/// Scripted api + atunnel + upstream on port 80, and a router whose ingress listens on TLS with
/// the ingress certificate; `tune` sets the auth flags. Actor `team-a/agent-7` is running.
async fn setup(pki: &Pki, tune: impl FnOnce(&mut RouterConfig)) -> Setup {
    let api = ScriptedApi::default();
    let api_addr = api.start().await;
    let up80 = start_upstream("port80").await;
    let atunnel = start_atunnel(std::collections::HashMap::from([(80, up80.addr)])).await;
    let worker = atunnel.addr.to_string();
    api.script("team-a/agent-7", {
        let w = worker.clone();
        move |_| Reply::ok(&w, false)
    });
    api.script("team-b/agent-1", move |_| Reply::ok(&worker, false));

    let tls_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_addr = tls_listener.local_addr().unwrap();
    let mut cfg = config(api_addr);
    cfg.tls_listen = Some(tls_addr);
    cfg.ingress_tls_cert = Some(pki.ingress.cert.clone());
    cfg.ingress_tls_key = Some(pki.ingress.key.clone());
    cfg.ingress_client_ca = Some(pki.ca_file());
    tune(&mut cfg);

    let router = start_router_with_tls(cfg, Some(tls_listener)).await;
    let plain = router.addr;
    Setup {
        world_api: api,
        up80,
        _atunnel: atunnel,
        plain,
        tls: tls_addr,
        router,
    }
}

/// A TLS client config: checks the router's servicedns certificate; presents `identity` if any.
fn client_tls(pki: &Pki, identity: Option<&CertSource>) -> Arc<rustls::ClientConfig> {
    let mut cfg = match identity {
        Some(source) => ate_tls::client_config(source, ServerCheck::Hostname).unwrap(),
        None => {
            ate_tls::client_config_no_cert(pki.ca.roots().unwrap(), ServerCheck::Hostname).unwrap()
        }
    };
    ate_tls::set_client_alpn(&mut cfg, &[ate_tls::Alpn::Http11]);
    Arc::new(cfg)
}

/// One GET to `team-a/agent-7` (or `actor`) over TLS: the response, or the error that ended the
/// connection (handshake or first read).
async fn tls_get(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    actor: &str,
    headers: &[(&str, String)],
) -> Result<Got, String> {
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(SERVICE_DNS).unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let mut req = Request::builder()
        .uri("/hello")
        .header("host", "app.example")
        .header("ate-target-actor", actor)
        .body(Empty::<Bytes>::new())
        .unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let result = sender.send_request(req).await;
    match result {
        Ok(resp) => Ok(collect(resp, started).await),
        Err(e) => {
            // The reason (a TLS alert) is on the connection task.
            let why = match conn.await {
                Ok(Err(ce)) => format!("{e}: {ce} ({:?})", std::error::Error::source(&ce)),
                _ => format!("{e} ({:?})", std::error::Error::source(&e)),
            };
            Err(why)
        }
    }
}

/// The `WWW-Authenticate` challenge of a 401 (it must have one).
fn challenge_of(got: &Got) -> &str {
    let header = got.headers.get("www-authenticate").expect("a challenge");
    header.to_str().unwrap()
}

/// A GET of team-a/agent-7 with `headers` over the TLS listener of `s`, by a client whose
/// certificate is on the list ([`CLIENT_ID`]).
async fn allowed_get(s: &Setup, pki: &Pki, headers: &[(&str, String)]) -> Result<Got, String> {
    let allowed = pki.client(CLIENT_ID);
    tls_get(
        s.tls,
        client_tls(pki, Some(&allowed)),
        "team-a/agent-7",
        headers,
    )
    .await
}

fn mtls(cfg: &mut RouterConfig) {
    cfg.ingress_allowed_spiffe_ids = Some(CLIENT_ID.to_string());
}

#[tokio::test]
async fn mtls_admits_only_allowed_spiffe_ids_in_the_handshake() {
    ate_tls::install_crypto_provider();
    let pki = Pki::new();
    let mut s = setup(&pki, mtls).await;

    // On the list: the actor answers.
    let got = allowed_get(&s, &pki, &[])
        .await
        .expect("allowed client is served");
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert!(got.body.contains("name=port80"), "{}", got.body);
    assert_eq!(s.up80.requests.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Same CA, another SPIFFE ID: refused in the handshake, no HTTP status.
    let other = pki.client("spiffe://cluster.local/ns/team-a/sa/intruder");
    let refused = tls_get(s.tls, client_tls(&pki, Some(&other)), "team-a/agent-7", &[]).await;
    let why = refused.expect_err("a SPIFFE ID not on the list must not get a response");
    assert!(
        why.to_lowercase().contains("alert") || why.contains("handshake"),
        "refusal is a TLS alert: {why}"
    );

    // No certificate at all: refused in the handshake too.
    let refused = tls_get(s.tls, client_tls(&pki, None), "team-a/agent-7", &[]).await;
    let why = refused.expect_err("a client without a certificate must not get a response");
    assert!(
        why.to_lowercase().contains("alert") || why.contains("handshake"),
        "refusal is a TLS alert: {why}"
    );

    // A certificate with the allowed ID but from another CA: refused.
    let rogue_dir = tempfile::tempdir().unwrap();
    let rogue_ca = Arc::new(LocalCa::open_or_create(rogue_dir.path(), TD).unwrap());
    let rogue = CertSource::issued(
        rogue_ca,
        SvidRequest::new(SpiffeId::parse(CLIENT_ID).unwrap()),
    )
    .unwrap();
    let refused = tls_get(s.tls, client_tls(&pki, Some(&rogue)), "team-a/agent-7", &[]).await;
    assert!(refused.is_err(), "another CA's certificate: {refused:?}");

    // None of the refused clients reached the actor.
    assert_eq!(s.up80.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(s.world_api.calls("team-a/agent-7") <= 1);

    // The plain listener holds the same policy: 401, and the actor is not resumed.
    let got = get(s.plain, Some("team-a/agent-7")).await;
    assert_eq!(got.status, StatusCode::UNAUTHORIZED, "{got:?}");
    assert!(
        got.body.contains("client certificate required"),
        "{}",
        got.body
    );
    assert_eq!(s.up80.requests.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The allowed client still works after the refusals.
    let got = allowed_get(&s, &pki, &[]).await.unwrap();
    assert_eq!(got.status, StatusCode::OK);
    s.router.shutdown();
}

fn claims(extra: serde_json::Value) -> serde_json::Value {
    let valid = json!({
        "iss": ISS, "aud": AUD, "sub": "alice", "exp": now() + 600,
        "ate_atespaces": ["team-a"],
    });
    merged(valid, extra)
}

#[tokio::test]
async fn jwt_mode_good_bad_and_missing_tokens() {
    ate_tls::install_crypto_provider();
    let pki = Pki::new();
    let signer = Signer::ec("k1");
    let jwks = pki.dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [signer.jwk()]}).to_string()).unwrap();
    let mut s = setup(&pki, |cfg| {
        cfg.ingress_auth_mode = Some(IngressAuthMode::Jwt);
        cfg.ingress_jwt_issuer = Some(ISS.into());
        cfg.ingress_jwt_audience = Some(AUD.into());
        cfg.ingress_jwt_jwks_file = Some(jwks.clone());
    })
    .await;
    let tls = client_tls(&pki, None);
    let bearer = |t: &str| vec![("authorization", format!("Bearer {t}"))];

    // Good token: served, and the token does not reach the actor.
    let good = signer.sign(&claims(json!({})));
    let got = tls_get(s.tls, tls.clone(), "team-a/agent-7", &bearer(&good))
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert!(got.body.contains("name=port80"), "{}", got.body);
    assert!(
        !got.body.to_lowercase().contains("header authorization"),
        "the ingress token reached the actor: {}",
        got.body
    );
    // In Proxy-Authorization, the actor's own Authorization passes through untouched.
    let got = tls_get(
        s.tls,
        tls.clone(),
        "team-a/agent-7",
        &[
            ("proxy-authorization", format!("Bearer {good}")),
            ("authorization", "Basic YWN0b3I6cHc=".to_string()),
        ],
    )
    .await
    .unwrap();
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert!(
        got.body.contains("authorization: Basic YWN0b3I6cHc="),
        "{}",
        got.body
    );
    assert!(
        !got.body.contains("proxy-authorization"),
        "the ingress token reached the actor: {}",
        got.body
    );
    let served = s.up80.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(served, 2);

    // Missing token: 401 with a challenge, naming the problem.
    let got = tls_get(s.tls, tls.clone(), "team-a/agent-7", &[])
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::UNAUTHORIZED, "{got:?}");
    assert!(got.body.contains("missing bearer token"), "{}", got.body);
    let challenge = challenge_of(&got);
    assert!(challenge.starts_with("Bearer"), "{challenge}");

    // Signed by a key that is not in the JWKS (same kid): bad signature.
    let forger = Signer::ec("k1");
    let got = tls_get(
        s.tls,
        tls.clone(),
        "team-a/agent-7",
        &bearer(&forger.sign(&claims(json!({})))),
    )
    .await
    .unwrap();
    assert_eq!(got.status, StatusCode::UNAUTHORIZED, "{got:?}");
    assert!(got.body.contains("bad signature"), "{}", got.body);
    let challenge = challenge_of(&got);
    assert!(challenge.contains("invalid_token"), "{challenge}");

    // Expired, wrong audience, garbage.
    let expired = signer.sign(&claims(json!({"exp": now() - 3600})));
    let got = tls_get(s.tls, tls.clone(), "team-a/agent-7", &bearer(&expired))
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert!(got.body.contains("expired"), "{}", got.body);
    let foreign = signer.sign(&claims(json!({"aud": "ate-api"})));
    let got = tls_get(s.tls, tls.clone(), "team-a/agent-7", &bearer(&foreign))
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert!(got.body.contains("audience"), "{}", got.body);
    let got = tls_get(s.tls, tls.clone(), "team-a/agent-7", &bearer("not-a-jwt"))
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert!(got.body.contains("malformed bearer token"), "{}", got.body);

    // A good token for team-a does not open team-b.
    let got = tls_get(s.tls, tls.clone(), "team-b/agent-1", &bearer(&good))
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::FORBIDDEN, "{got:?}");
    assert!(got.body.contains("team-b"), "{}", got.body);

    // An unauthenticated request learns nothing, not even whether the target is valid.
    let got = tls_get(s.tls, tls.clone(), "Not A Target", &[])
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);

    // None of the refused requests reached the actor or resumed anything.
    assert_eq!(
        s.up80.requests.load(std::sync::atomic::Ordering::SeqCst),
        served
    );
    assert_eq!(s.world_api.calls("team-b/agent-1"), 0);

    // The plain listener needs a token as well.
    let got = get(s.plain, Some("team-a/agent-7")).await;
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    s.router.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(15), async {
        if let Some(done) = s.router.done.take() {
            let _ = done.await;
        }
    })
    .await;
}

#[tokio::test]
async fn contradictory_flags_are_refused_before_serving() {
    ate_tls::install_crypto_provider();
    let api: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let err = |tune: &dyn Fn(&mut RouterConfig)| {
        let mut cfg = config(api);
        tune(&mut cfg);
        match Router::new(cfg) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    assert!(
        err(&|c| c.ingress_allowed_spiffe_ids = Some(CLIENT_ID.into())).contains("--tls-listen")
    );
    assert!(
        err(&|c| {
            c.tls_listen = Some("127.0.0.1:0".parse().unwrap());
            c.ingress_auth_mode = Some(IngressAuthMode::Mtls);
        })
        .contains("--ingress-allowed-spiffe-ids")
    );
    assert!(
        err(&|c| {
            c.tls_listen = Some("127.0.0.1:0".parse().unwrap());
            c.ingress_auth_mode = Some(IngressAuthMode::Jwt);
        })
        .contains("--ingress-jwt-issuer")
    );
    assert!(err(&|c| c.ingress_jwt_issuer = Some(ISS.into())).contains("--ingress-auth-mode=jwt"));
    // No flags: the quickstart's plain, unauthenticated ingress.
    assert_eq!(err(&|_| {}), "");
}

// ---- calls between actors (issue 31) -------------------------------------------------------------

/// A TLS client's `ate-caller-actor` never reaches the actor: only a worker's internal
/// connection may name a caller.
#[tokio::test]
async fn a_tls_client_cannot_forge_a_caller() {
    ate_tls::install_crypto_provider();
    let pki = Pki::new();
    let mut s = setup(&pki, mtls).await;
    let forged = [("ate-caller-actor", "team-a/agent-1".to_string())];
    let got = allowed_get(&s, &pki, &forged).await.unwrap();
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    assert!(!got.body.contains("ate-caller-actor"), "{}", got.body);
    s.router.shutdown();
}

/// `--internal-listen`: TLS with the router's own certificate; a worker's certificate is served
/// as a worker (its request must name a caller), any other certificate is closed without an
/// answer, and no certificate is refused in the handshake. Without the router's TLS material
/// the router does not start.
#[tokio::test]
async fn internal_listen_admits_only_workers() {
    ate_tls::install_crypto_provider();
    let pki = Pki::new();
    let api = ScriptedApi::default();
    let api_addr = api.start().await;
    let own = Pki::issue_files(
        &pki.ca,
        pki.dir.path(),
        "router",
        SvidRequest::new(SpiffeId::router(TD).unwrap()).dns(SERVICE_DNS),
    );
    let internal = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let internal_addr = internal.local_addr().unwrap();
    let mut cfg = config(api_addr);
    cfg.internal_listen = Some(internal_addr);
    cfg.tls.tls_cert = Some(own.cert.clone());
    cfg.tls.tls_key = Some(own.key.clone());
    cfg.tls.tls_ca = Some(own.ca.clone());
    cfg.tls.trust_domain = TD.to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router = Router::new(cfg).unwrap().with_internal_listener(internal);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        router
            .serve(listener, metrics_listener, async move {
                let _ = rx.await;
            })
            .await
    });

    // A worker: admitted, and held to the caller rule (a plain client would have been
    // forwarded).
    let worker = pki.client("spiffe://cluster.local/ns/ate-system/sa/ate-worker-w1");
    let got = tls_get(
        internal_addr,
        client_tls(&pki, Some(&worker)),
        "team-a/agent-7",
        &[],
    )
    .await
    .expect("a worker is served");
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{got:?}");
    assert!(
        got.body.contains("missing ate-caller-actor header"),
        "{}",
        got.body
    );

    // A client certificate of the same CA that is not a worker's: closed, no answer.
    let client = pki.client(CLIENT_ID);
    let refused = tls_get(
        internal_addr,
        client_tls(&pki, Some(&client)),
        "team-a/agent-7",
        &[("ate-caller-actor", "team-a/agent-1".to_string())],
    )
    .await;
    assert!(refused.is_err(), "a non-worker got an answer: {refused:?}");

    // No certificate: refused in the handshake.
    let refused = tls_get(
        internal_addr,
        client_tls(&pki, None),
        "team-a/agent-7",
        &[("ate-caller-actor", "team-a/agent-1".to_string())],
    )
    .await;
    assert!(
        refused.is_err(),
        "a client without a certificate: {refused:?}"
    );
    assert_eq!(api.total_calls(), 0);
    let _ = tx.send(());
    done.await.unwrap().unwrap();

    // No TLS material: refuses to start.
    let mut cfg = config(api_addr);
    cfg.internal_listen = Some("127.0.0.1:0".parse().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = Router::new(cfg)
        .unwrap()
        .serve(listener, metrics_listener, async {})
        .await
        .expect_err("--internal-listen without TLS must not start");
    assert!(err.to_string().contains("--internal-listen needs"), "{err}");
}
