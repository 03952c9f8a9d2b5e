//! atunnel (src/lib.rs) against a real actor network namespace, without a sandbox (root and
//! iproute2; no runc): what the router reads to tell its 502s apart. A port nothing listens on
//! is a 502 marked `x-ate-port-closed: true`; a probe (`ate-probe: 1`) answers 200 or 421
//! without dialing the actor or counting as activity; ingress off cuts the open tunnels and then
//! the probe answers 421 (the router's "cut by a suspend").

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ate_atunnel::Tunnels;
use ate_netns::{ACTOR_IP, NetnsDialer};
use ate_test_support::h2_client::{self, H2, body_text, h2_connect};
use bytes::Bytes;
use http_body_util::Empty;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Deletes the test's namespace however the test ends.
struct Named(String);

impl Drop for Named {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// A listener on the actor address inside `ns`: bound on a thread that entered the namespace (a
/// socket keeps the namespace it was made in).
fn listen_in(ns: &str, port: u16) -> tokio::net::TcpListener {
    let path = ate_netns::netns_path(ns);
    let listener = std::thread::spawn(move || {
        let file = std::fs::File::open(path).expect("open netns");
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        std::net::TcpListener::bind(SocketAddr::new(ACTOR_IP.into(), port)).expect("bind")
    })
    .join()
    .expect("listener thread");
    listener.set_nonblocking(true).expect("nonblocking");
    tokio::net::TcpListener::from_std(listener).expect("tokio listener")
}

/// A stand-in actor: counts connections; `GET /sleep` is never answered, anything else gets
/// `200 ok`.
fn serve_actor(listener: tokio::net::TcpListener) -> Arc<AtomicUsize> {
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let Ok(n) = tcp.read(&mut buf).await else {
                    return;
                };
                if buf[..n].starts_with(b"GET /sleep") {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return;
                }
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = tcp.read(&mut buf).await;
            });
        }
    });
    accepted
}

async fn connect(h2: &mut H2, headers: &[(&str, &str)]) -> http::Response<hyper::body::Incoming> {
    h2_client::connect_stream(h2, "a.t:80", headers).await
}

/// HTTP/1.1 over a new tunnel to port 80.
async fn open_h1(h2: &mut H2) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let resp = connect(h2, &[("ate-target-actor", "t/a"), ("ate-activation", "7")]).await;
    assert_eq!(resp.status(), 200);
    h2_client::http1_over(resp).await
}

fn get(path: &str) -> http::Request<Empty<Bytes>> {
    http::Request::builder()
        .uri(path)
        .header("host", "a.t")
        .body(Empty::<Bytes>::new())
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_ports_probes_and_cut_tunnels_are_told_apart() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "atunnel tests need root (ip netns, setns)"
    );
    let ns = format!("ate-tatun-{}", std::process::id());
    ate_netns::create(&ns).await.expect("create netns");
    let _cleanup = Named(ns.clone());
    let accepted = serve_actor(listen_in(&ns, 80));

    let tunnels = Arc::new(Tunnels::new());
    let dialer = NetnsDialer::new(&ns).await.expect("dialer");
    let activation = tunnels.activate("t/a", 7, dialer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(ate_atunnel::serve(
        listener,
        None,
        tunnels.clone(),
        std::future::pending::<()>(),
    ));
    let mut h2 = h2_connect(addr).await;

    // A probe: served here, nothing dialed, no activity recorded.
    let before = activation.last_activity_unix_ms();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let probe = [
        ("ate-target-actor", "t/a"),
        ("ate-activation", "7"),
        ("ate-probe", "1"),
    ];
    let resp = connect(&mut h2, &probe).await;
    assert_eq!(resp.status(), 200);
    drop(resp);
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "a probe dials nothing");
    assert_eq!(activation.last_activity_unix_ms(), before);
    assert_eq!(activation.open_tunnels(), 0);
    // Not served here: the usual 421. A bad probe value: 400.
    let resp = connect(
        &mut h2,
        &[("ate-target-actor", "t/zzz"), ("ate-probe", "1")],
    )
    .await;
    assert_eq!(resp.status(), 421);
    assert_eq!(resp.headers()[ate_atunnel::HEADER_STALE], "true");
    let resp = connect(
        &mut h2,
        &[("ate-target-actor", "t/a"), ("ate-probe", "yes")],
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert!(body_text(resp).await.contains("ate-probe"));

    // Nothing listens on port 9: a 502 marked as such, naming the actor and the port.
    let resp = connect(
        &mut h2,
        &[
            ("ate-target-actor", "t/a"),
            ("ate-activation", "7"),
            ("ate-target-port", "9"),
        ],
    )
    .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()[ate_atunnel::HEADER_PORT_CLOSED], "true");
    assert_eq!(
        body_text(resp).await,
        "actor t/a: nothing listens on port 9 in the actor\n"
    );

    // A real tunnel works.
    let mut h1 = open_h1(&mut h2).await;
    let resp = h1.send_request(get("/")).await.expect("GET /");
    assert_eq!(resp.status(), 200);
    assert_eq!(body_text(resp).await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // Ingress off (a suspend) while a request waits for its answer: the tunnel is cut, and a
    // probe now answers 421, which is how the router tells this from the actor closing.
    let mut h1 = open_h1(&mut h2).await;
    let pending = tokio::spawn(async move { h1.send_request(get("/sleep")).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while accepted.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    tunnels.deactivate("t/a").expect("was active");
    let cut = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the request ends when its tunnel is cut")
        .expect("task");
    assert!(cut.is_err(), "no answer through a cut tunnel: {cut:?}");
    let resp = connect(&mut h2, &probe).await;
    assert_eq!(resp.status(), 421);
    assert_eq!(resp.headers()[ate_atunnel::HEADER_STALE], "true");
    assert!(
        activation.wait_closed(Duration::from_secs(2)).await,
        "tunnels closed"
    );
}
