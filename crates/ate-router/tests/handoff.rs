//! The router's end of the same-machine handoff (docs/tunnel-protocol.md, "Handoff") against a
//! test atunnel on a real unix socket that passes real TCP sockets (SCM_RIGHTS) to an actor
//! port on 127.0.0.1. A handed-off connection's I/O is polled by the request that holds it, not
//! by a task of its own; these tests pin what that must not change: reuse, RETIRE closing an
//! idle connection at once and a busy one after its response, atunnel's end cutting the socket
//! mid-request, and an idle connection the actor closed never carrying a request.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};

const ACTOR: &str = "team-a/agent";

/// An actor port: answers `ok <n>` (`/sleep/<ms>` after that long), counts the connections it
/// has open; with `idle_close`, closes a connection that waits that long for its next request.
#[derive(Clone)]
struct Actor {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
}

impl Actor {
    /// A listener on a free loopback port and the actor it serves, no connection counted yet.
    async fn listen() -> (TcpListener, Actor) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let actor = Actor {
            addr: listener.local_addr().unwrap(),
            open: Arc::new(AtomicUsize::new(0)),
            accepted: Arc::new(AtomicUsize::new(0)),
        };
        (listener, actor)
    }

    /// Whether every connection to the actor is closed within `within`.
    async fn all_closed(&self, within: Duration) -> bool {
        eventually(within, || self.open.load(Ordering::SeqCst) == 0).await
    }
}

async fn start_actor(idle_close: Option<Duration>) -> Actor {
    let (listener, actor) = Actor::listen().await;
    let (open, accepted) = (actor.open.clone(), actor.accepted.clone());
    let served = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            open.fetch_add(1, Ordering::SeqCst);
            let open = open.clone();
            let served = served.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let n = served.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        if let Some(ms) = req.uri().path().strip_prefix("/sleep/") {
                            let ms = ms.parse().unwrap_or(0);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "ok {n}"
                        )))))
                    }
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                if let Some(after) = idle_close {
                    builder.timer(TokioTimer::new()).header_read_timeout(after);
                }
                let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    actor
}

/// One handed-off tunnel as the test atunnel sees it: its unix connection (to write RETIRE on,
/// or to drop), and whether the router has ended it.
struct Handoff {
    control: Option<tokio::net::unix::OwnedWriteHalf>,
    /// atunnel's own copy of the actor's socket (worker: `upstream`), kept until the router
    /// ends the tunnel.
    socket: Option<std::net::TcpStream>,
    ended: Arc<tokio::sync::Notify>,
    ended_flag: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone, Default)]
struct TestAtunnel {
    handoffs: Arc<Mutex<Vec<Handoff>>>,
}

impl TestAtunnel {
    /// Serves handoffs for the worker advertised at `worker` under `dir`, dialing `actor`.
    fn start(dir: &Path, worker: &str, actor: SocketAddr) -> TestAtunnel {
        let name = ate_core::handoff::socket_name(worker).unwrap();
        let listener = UnixListener::bind(dir.join(name)).unwrap();
        let atunnel = TestAtunnel::default();
        let handoffs = atunnel.handoffs.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handoffs = handoffs.clone();
                tokio::spawn(async move { serve(stream, actor, handoffs).await });
            }
        });
        atunnel
    }

    fn count(&self) -> usize {
        self.handoffs.lock().unwrap().len()
    }

    fn retire(&self, i: usize) -> impl std::future::Future<Output = ()> + use<> {
        let mut control = self.handoffs.lock().unwrap()[i].control.take();
        async move {
            let w = control.as_mut().unwrap();
            w.write_all(&[ate_core::handoff::RETIRE]).await.unwrap();
            // Kept open: the router's end of it is what this test watches.
            std::mem::forget(control);
        }
    }

    /// atunnel goes away: the unix connection closes.
    fn vanish(&self, i: usize) {
        drop(self.handoffs.lock().unwrap()[i].control.take());
    }

    /// Ingress off as the worker's atunnel does it: the unix connection closes, then atunnel's
    /// own copy of the socket is cut (`shutdown(2)`) at once, before the router's watcher can
    /// have acted on the first.
    fn ingress_off(&self, i: usize) {
        let mut handoffs = self.handoffs.lock().unwrap();
        drop(handoffs[i].control.take());
        let socket = handoffs[i].socket.take().unwrap();
        socket.shutdown(std::net::Shutdown::Both).unwrap();
    }

    fn ended(&self, i: usize) -> bool {
        self.handoffs.lock().unwrap()[i]
            .ended_flag
            .load(Ordering::SeqCst)
    }

    async fn wait_ended(&self, i: usize, within: Duration) -> bool {
        let ended = self.handoffs.lock().unwrap()[i].ended.clone();
        let notified = ended.notified();
        if self.ended(i) {
            return true;
        }
        tokio::time::timeout(within, notified).await.is_ok() || self.ended(i)
    }
}

async fn serve(stream: UnixStream, actor: SocketAddr, handoffs: Arc<Mutex<Vec<Handoff>>>) {
    let (mut read, write) = stream.into_split();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        if read.read(&mut byte).await.unwrap_or(0) == 0 {
            return;
        }
        line.push(byte[0]);
    }
    let text = String::from_utf8(line).unwrap();
    let request = ate_core::handoff::Request::parse(&text).unwrap();
    assert_eq!(request.actor, ACTOR);
    let upstream = std::net::TcpStream::connect(actor).unwrap();
    let reply = ate_core::handoff::Reply::Ok.encode();
    {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        let fds = [upstream.as_raw_fd()];
        let iov = [std::io::IoSlice::new(reply.as_bytes())];
        let sock = write.as_ref().as_raw_fd();
        sendmsg::<()>(
            sock,
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }
    let ended = Arc::new(tokio::sync::Notify::new());
    let ended_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let i = {
        let mut handoffs = handoffs.lock().unwrap();
        handoffs.push(Handoff {
            control: Some(write),
            socket: Some(upstream),
            ended: ended.clone(),
            ended_flag: ended_flag.clone(),
        });
        handoffs.len() - 1
    };
    // The router's end: it closed the unix connection (nothing else comes this way). Then the
    // router holds the only descriptor of the socket, so closing it reaches the actor.
    let _ = read.read(&mut byte).await;
    drop(handoffs.lock().unwrap()[i].socket.take());
    ended_flag.store(true, Ordering::SeqCst);
    ended.notify_waiters();
}

struct Setup {
    world: World,
    actor: Actor,
    atunnel: TestAtunnel,
    _dir: tempfile::TempDir,
}

async fn setup(idle_close: Option<Duration>) -> Setup {
    setup_to(start_actor(idle_close).await).await
}

async fn setup_to(actor: Actor) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let world = World::start(|c| c.local_tunnels = Some(path)).await;
    world.running(ACTOR);
    let atunnel = TestAtunnel::start(dir.path(), &world.worker(), actor.addr);
    Setup {
        world,
        actor,
        atunnel,
        _dir: dir,
    }
}

async fn get_path(router: SocketAddr, path: &str) -> (http::StatusCode, String) {
    let tcp = tokio::net::TcpStream::connect(router).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(path)
        .header("host", "app.example")
        .header("ate-target-actor", ACTOR)
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn eventually(within: Duration, check: impl FnMut() -> bool) -> bool {
    ate_test_support::wait::eventually(within, Duration::from_millis(10), check).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_requests_reuse_one_handed_off_connection() {
    let s = setup(None).await;
    for n in 1..=20 {
        let (status, body) = get_path(s.world.router.addr, "/").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, format!("ok {n}"));
    }
    assert_eq!(s.atunnel.count(), 1, "one handoff for sequential requests");
    assert_eq!(s.actor.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        s.world.atunnel.connects(),
        0,
        "no CONNECT tunnel was opened"
    );
    assert_eq!(
        s.world.router.stats.tunnel_handoffs.load(Ordering::SeqCst),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_closes_an_idle_handed_off_connection_at_once() {
    let s = setup(None).await;
    assert_eq!(get_path(s.world.router.addr, "/").await.0, 200);
    assert_eq!(s.actor.open.load(Ordering::SeqCst), 1);
    s.atunnel.retire(0).await;
    assert!(
        s.atunnel.wait_ended(0, Duration::from_secs(2)).await,
        "the router did not end the retired tunnel"
    );
    assert!(
        s.actor.all_closed(Duration::from_secs(2)).await,
        "the actor's connection is still open"
    );
    // The next request gets a new tunnel.
    assert_eq!(get_path(s.world.router.addr, "/").await.0, 200);
    assert_eq!(s.atunnel.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_lets_the_request_in_flight_finish_then_closes() {
    let s = setup(None).await;
    let router = s.world.router.addr;
    let slow = tokio::spawn(async move { get_path(router, "/sleep/600").await });
    assert!(eventually(Duration::from_secs(2), || s.atunnel.count() == 1).await);
    // Time for the request to reach the actor (nothing to observe before its answer), then
    // for a wrong close after the retire to show.
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.atunnel.retire(0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !s.atunnel.ended(0),
        "the tunnel ended with its request in flight"
    );
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "ok 1");
    assert!(
        s.atunnel.wait_ended(0, Duration::from_secs(2)).await,
        "the retired tunnel was not closed after its response"
    );
    assert!(s.actor.all_closed(Duration::from_secs(2)).await);
    assert_eq!(get_path(router, "/").await.0, 200);
    assert_eq!(
        s.atunnel.count(),
        2,
        "the retired connection was pooled again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atunnel_gone_cuts_the_socket_even_mid_request() {
    let s = setup(None).await;
    let router = s.world.router.addr;
    let started = Instant::now();
    let slow = tokio::spawn(async move { get_path(router, "/sleep/5000").await });
    assert!(eventually(Duration::from_secs(2), || s.atunnel.count() == 1).await);
    // Time for the request to reach the actor: the cut comes mid-request.
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.atunnel.vanish(0);
    assert!(
        s.actor.all_closed(Duration::from_secs(2)).await,
        "the actor's socket outlived its atunnel"
    );
    let (status, _) = slow.await.unwrap();
    assert!(status.is_server_error(), "{status}");
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_the_actor_closed_carries_no_request() {
    let s = setup(Some(Duration::from_millis(200))).await;
    let router = s.world.router.addr;
    assert_eq!(get_path(router, "/").await.0, 200);
    // The actor closes the idle connection; nobody polls it while it sits in the pool.
    assert!(s.actor.all_closed(Duration::from_secs(3)).await);
    // The closed connection sits in the pool a while before the next request takes it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        let (status, body) = get_path(router, "/").await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(s.atunnel.count(), 2, "a new tunnel replaced the closed one");
    assert!(s.atunnel.wait_ended(0, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_each_get_their_answer() {
    let s = setup(None).await;
    let router = s.world.router.addr;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        tasks.push(tokio::spawn(async move {
            let mut bodies = Vec::new();
            for _ in 0..25 {
                let (status, body) = get_path(router, "/").await;
                assert_eq!(status, 200, "{body}");
                bodies.push(body);
            }
            bodies
        }));
    }
    let mut all: Vec<u64> = Vec::new();
    for t in tasks {
        for body in t.await.unwrap() {
            all.push(body.strip_prefix("ok ").unwrap().parse().unwrap());
        }
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 400, "every request reached the actor once");
}

/// An actor port that answers every request with a body delimited by the connection's close
/// (HTTP/1.1 200, neither Content-Length nor chunked): `first half, ` at once, then after
/// `pause` `second half` and the close. Python's `http.server` answers like this by default.
async fn start_until_close_actor(pause: Duration) -> Actor {
    let (listener, actor) = Actor::listen().await;
    let (open, accepted) = (actor.open.clone(), actor.accepted.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            open.fetch_add(1, Ordering::SeqCst);
            let open = open.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => {
                            open.fetch_sub(1, Ordering::SeqCst);
                            return;
                        }
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let first = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nfirst half, ";
                if tcp.write_all(first).await.is_ok() {
                    tokio::time::sleep(pause).await;
                    let _ = tcp.write_all(b"second half").await;
                }
                drop(tcp);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    actor
}

/// The head of a response to `/` through the router, over HTTP/1.1 or h2 (prior knowledge).
async fn head_of(router: SocketAddr, h2: bool) -> Response<Incoming> {
    let tcp = tokio::net::TcpStream::connect(router).await.unwrap();
    let req = Request::builder()
        .uri("http://app.example/")
        .header("ate-target-actor", ACTOR)
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    }
}

/// Reads the first data frame of `resp`'s body (the actor is mid-body after it), then cuts the
/// tunnel with `cut` and reads the rest: the client must get an error, not a clean end.
async fn cut_mid_body(h2: bool, cut: impl FnOnce(&TestAtunnel)) {
    let s = setup_to(start_until_close_actor(Duration::from_secs(30)).await).await;
    let resp = head_of(s.world.router.addr, h2).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first half came")
        .expect("a frame")
        .expect("not an error yet");
    assert_eq!(first.into_data().unwrap(), "first half, ");
    // The tunnel is counted by its own task, which may run just after the first frame.
    eventually(Duration::from_secs(5), || s.atunnel.count() > 0).await;
    assert_eq!(s.atunnel.count(), 1, "a handed-off tunnel");
    cut(&s.atunnel);
    let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
        .await
        .expect("the body ended");
    match rest {
        Err(e) => tracing::debug!(error = %e, "the cut body failed as it must"),
        Ok(rest) => panic!(
            "a body cut mid-way ended cleanly (h2: {h2}), the client would take {:?} for all of it",
            rest.to_bytes()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_until_close_cut_by_atunnel_going_fails_over_http1() {
    cut_mid_body(false, |a| a.vanish(0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_until_close_cut_by_atunnel_going_fails_over_h2() {
    cut_mid_body(true, |a| a.vanish(0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_until_close_cut_by_ingress_off_fails_over_http1() {
    for _ in 0..5 {
        cut_mid_body(false, |a| a.ingress_off(0)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_until_close_cut_by_ingress_off_fails_over_h2() {
    for _ in 0..5 {
        cut_mid_body(true, |a| a.ingress_off(0)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_until_close_the_actor_ends_is_whole() {
    let s = setup_to(start_until_close_actor(Duration::from_millis(50)).await).await;
    for h2 in [false, true] {
        let resp = head_of(s.world.router.addr, h2).await;
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.expect("a clean end");
        assert_eq!(body.to_bytes(), "first half, second half", "h2: {h2}");
    }
    assert_eq!(
        s.atunnel.count(),
        2,
        "one handoff per response (each ends in a close)"
    );
}
