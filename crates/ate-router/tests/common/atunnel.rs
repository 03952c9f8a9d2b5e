//! A test atunnel: an h2c server taking CONNECT streams like the worker's atunnel
//! (docs/tunnel-protocol.md) and piping each to an upstream.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

/// Cuts a tunnel when dropped (or sent on).
type Cut = tokio::sync::oneshot::Sender<()>;

#[derive(Clone, Default)]
pub struct AtunnelState {
    /// Actors this worker answers 421 stale for.
    pub stale: Arc<Mutex<HashSet<String>>>,
    /// Probe CONNECTs (`ate-probe: 1`): (actor, answered status).
    pub probes: Arc<Mutex<Vec<(String, u16)>>>,
    /// Per actor, what cuts each of its open tunnels (as ingress off does in atunnel).
    cuts: Arc<Mutex<HashMap<String, Vec<Cut>>>>,
    /// Every CONNECT: (actor, port, :authority).
    pub connects: Arc<Mutex<Vec<(String, u16, String)>>>,
    /// TCP connections from the router.
    pub connections: Arc<AtomicUsize>,
    /// Tunnels piping to an upstream right now.
    pub open_tunnels: Arc<AtomicUsize>,
}

pub struct Atunnel {
    pub addr: SocketAddr,
    pub state: AtunnelState,
}

impl Atunnel {
    pub fn mark_stale(&self, actor: &str) {
        self.state.stale.lock().unwrap().insert(actor.to_string());
    }
    /// What atunnel does when an actor is suspended: ingress off (421 from now on) and every
    /// open tunnel of the actor closed at once.
    pub fn suspend(&self, actor: &str) {
        self.mark_stale(actor);
        self.state.cuts.lock().unwrap().remove(actor);
    }
    /// Cuts every open tunnel of `actor` (and forgets them) without turning its ingress off.
    pub fn cut_tunnels(&self, actor: &str) {
        self.state.cuts.lock().unwrap().remove(actor);
    }
    pub fn probes(&self) -> Vec<(String, u16)> {
        self.state.probes.lock().unwrap().clone()
    }
    pub fn connects(&self) -> usize {
        self.state.connects.lock().unwrap().len()
    }
    pub fn open_tunnels(&self) -> usize {
        self.state.open_tunnels.load(Ordering::SeqCst)
    }
}

/// An h2c server accepting CONNECT streams like atunnel (docs/tunnel-protocol.md); port `p`
/// pipes to `ports[p]`, any other port is the 502 of a port nothing listens on.
pub async fn start_atunnel(ports: HashMap<u16, SocketAddr>) -> Atunnel {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AtunnelState::default();
    let st = state.clone();
    let ports = Arc::new(ports);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            st.connections.fetch_add(1, Ordering::SeqCst);
            let st = st.clone();
            let ports = ports.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let st = st.clone();
                let ports = ports.clone();
                async move { Ok::<_, Infallible>(atunnel_stream(req, &st, &ports)) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Atunnel { addr, state }
}

fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r
}

fn atunnel_stream(
    req: Request<Incoming>,
    st: &AtunnelState,
    ports: &HashMap<u16, SocketAddr>,
) -> Response<Full<Bytes>> {
    if req.method() != http::Method::CONNECT {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "CONNECT only");
    }
    let Some(actor) = req
        .headers()
        .get("ate-target-actor")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return reply(StatusCode::BAD_REQUEST, "missing ate-target-actor");
    };
    let port: u16 = match req.headers().get("ate-target-port") {
        None => 80,
        Some(v) => match v.to_str().ok().and_then(|s| s.parse().ok()) {
            Some(p) if p != 0 => p,
            _ => return reply(StatusCode::BAD_REQUEST, "bad ate-target-port"),
        },
    };
    let stale = st.stale.lock().unwrap().contains(&actor);
    let stale_reply = || {
        let mut r = reply(StatusCode::MISDIRECTED_REQUEST, "stale");
        r.headers_mut()
            .insert("x-ate-assignment-stale", "true".parse().unwrap());
        r
    };
    if req.headers().get("ate-probe").is_some_and(|v| v == "1") {
        let status = if stale { 421 } else { 200 };
        st.probes.lock().unwrap().push((actor, status));
        return if stale {
            stale_reply()
        } else {
            reply(StatusCode::OK, "")
        };
    }
    st.connects
        .lock()
        .unwrap()
        .push((actor.clone(), port, req.uri().to_string()));
    if stale {
        return stale_reply();
    }
    let Some(upstream) = ports.get(&port).copied() else {
        let mut r = reply(
            StatusCode::BAD_GATEWAY,
            &format!("actor {actor}: nothing listens on port {port} in the actor"),
        );
        r.headers_mut()
            .insert("x-ate-port-closed", "true".parse().unwrap());
        return r;
    };
    let on = hyper::upgrade::on(req);
    let open = st.open_tunnels.clone();
    let (cut, mut cut_rx) = tokio::sync::oneshot::channel::<()>();
    st.cuts.lock().unwrap().entry(actor).or_default().push(cut);
    tokio::spawn(async move {
        let Ok(up) = on.await else { return };
        let Ok(mut tcp) = TcpStream::connect(upstream).await else {
            return;
        };
        open.fetch_add(1, Ordering::SeqCst);
        let mut up = TokioIo::new(up);
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut up, &mut tcp) => {}
            // Dropping both ends here is how atunnel closes a tunnel when ingress goes off.
            _ = &mut cut_rx => {}
        }
        open.fetch_sub(1, Ordering::SeqCst);
    });
    reply(StatusCode::OK, "")
}
