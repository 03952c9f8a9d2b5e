//! Upstream: an HTTP/1.1 (and h2 for gRPC) echo server standing in for an actor's port.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// The head of an upgrade request as the actor saw it.
#[derive(Debug, Clone)]
pub struct SeenUpgrade {
    pub method: http::Method,
    pub uri: String,
    pub version: http::Version,
    pub headers: http::HeaderMap,
}

#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    pub connections: Arc<AtomicUsize>,
    /// Every WebSocket upgrade request, in order.
    pub upgrades: Arc<Mutex<Vec<SeenUpgrade>>>,
}

/// A WebSocket server speaking frames (`/ws-frames`): echoes every message; on the text
/// `suspend` it closes with 1001 "actor suspending", as atunnel does on a suspend.
async fn ws_echo<S>(io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    while let Some(Ok(message)) = ws.next().await {
        let echo = match message {
            Message::Text(t) if t.as_str() == "suspend" => {
                let frame = CloseFrame {
                    code: CloseCode::Away,
                    reason: "actor suspending".into(),
                };
                let _ = ws.close(Some(frame)).await;
                return;
            }
            m @ (Message::Text(_) | Message::Binary(_)) => m,
            _ => continue,
        };
        if ws.send(echo).await.is_err() {
            return;
        }
    }
}

/// Replies `name=<name>\nhost=<Host>\ncount=<n>\n`, one `header <k>: <v>` line per header, then
/// `body=<body>` (`/slow` after 100 ms, `/sleep/<ms>` after that long). A WebSocket upgrade gets
/// a 101 (echoing `sec-websocket-protocol`) and then raw bytes are echoed; an upgrade to
/// `/refuse` gets a 403, to `/plain` a 200 that switches nothing. gRPC requests (HTTP/2,
/// `application/grpc`) get [`grpc_echo`].
pub async fn start_upstream(name: &'static str) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let upgrades = Arc::new(Mutex::new(Vec::new()));
    let up = Upstream {
        addr,
        requests: requests.clone(),
        connections: connections.clone(),
        upgrades: upgrades.clone(),
    };
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            connections.fetch_add(1, Ordering::SeqCst);
            let requests = requests.clone();
            let upgrades = upgrades.clone();
            let service = service_fn(move |mut req: Request<Incoming>| {
                let requests = requests.clone();
                let upgrades = upgrades.clone();
                async move {
                    let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
                    if req
                        .headers()
                        .get("upgrade")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
                    {
                        upgrades.lock().unwrap().push(SeenUpgrade {
                            method: req.method().clone(),
                            uri: req.uri().to_string(),
                            version: req.version(),
                            headers: req.headers().clone(),
                        });
                        match req.uri().path() {
                            "/refuse" => {
                                let resp = Response::builder()
                                    .status(StatusCode::FORBIDDEN)
                                    .body(EchoBody::Full(Full::new(Bytes::from(
                                        "no websocket here",
                                    ))))
                                    .unwrap();
                                return Ok::<_, Infallible>(resp);
                            }
                            "/plain" => {
                                let resp = Response::new(EchoBody::Full(Full::new(Bytes::from(
                                    "just a page",
                                ))));
                                return Ok(resp);
                            }
                            _ => {}
                        }
                        let on = hyper::upgrade::on(&mut req);
                        let frames = req.uri().path() == "/ws-frames";
                        tokio::spawn(async move {
                            if let Ok(up) = on.await {
                                if frames {
                                    ws_echo(TokioIo::new(up)).await;
                                    return;
                                }
                                let (mut r, mut w) = tokio::io::split(TokioIo::new(up));
                                let _ = tokio::io::copy(&mut r, &mut w).await;
                            }
                        });
                        let mut resp = Response::builder()
                            .status(StatusCode::SWITCHING_PROTOCOLS)
                            .header("upgrade", "websocket")
                            .header("connection", "Upgrade")
                            .header("sec-websocket-accept", "not-checked-by-these-tests")
                            .body(EchoBody::Full(Full::new(Bytes::new())))
                            .unwrap();
                        if let Some(p) = req.headers().get("sec-websocket-protocol") {
                            resp.headers_mut()
                                .insert("sec-websocket-protocol", p.clone());
                        }
                        return Ok(resp);
                    }
                    if req
                        .headers()
                        .get("content-type")
                        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
                    {
                        return Ok(grpc_echo(req, name).await);
                    }
                    if req.uri().path() == "/slow" {
                        // Holds the request so that a test has many in flight at once.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    if let Some(ms) = req
                        .uri()
                        .path()
                        .strip_prefix("/sleep/")
                        .and_then(|ms| ms.parse().ok())
                    {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    let mut text = format!("name={name}\n");
                    let host = req
                        .headers()
                        .get("host")
                        .map(|h| h.to_str().unwrap_or("?").to_string())
                        .unwrap_or_default();
                    text.push_str(&format!("host={host}\ncount={n}\npath={}\n", req.uri()));
                    for (k, v) in req.headers() {
                        text.push_str(&format!("header {k}: {}\n", v.to_str().unwrap_or("?")));
                    }
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    text.push_str(&format!("body={}", String::from_utf8_lossy(&body)));
                    Ok(Response::new(EchoBody::Full(Full::new(Bytes::from(text)))))
                }
            });
            tokio::spawn(async move {
                // HTTP/1.1 and HTTP/2 (gRPC arrives as HTTP/2 over the tunnel).
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    up
}

type Frames =
    futures::stream::Iter<std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, Infallible>>>;

type Channel =
    futures::channel::mpsc::UnboundedReceiver<Result<hyper::body::Frame<Bytes>, Infallible>>;

/// Body of the upstream's answers: plain, data followed by trailers (gRPC), or frames sent as
/// they are made (streaming gRPC).
pub enum EchoBody {
    Full(Full<Bytes>),
    Frames(http_body_util::StreamBody<Frames>),
    Channel(http_body_util::StreamBody<Channel>),
}

impl hyper::body::Body for EchoBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            EchoBody::Full(b) => std::pin::Pin::new(b).poll_frame(cx),
            EchoBody::Frames(b) => std::pin::Pin::new(b).poll_frame(cx),
            EchoBody::Channel(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }
}

/// A gRPC-shaped echo: the request body back, `grpc-status: 0` and the Host/:authority it saw
/// as trailers. On `/stream` each request data frame is echoed as soon as it arrives (bidi
/// streaming), and the trailers follow the end of the request.
async fn grpc_echo(req: Request<Incoming>, name: &str) -> Response<EchoBody> {
    if req.uri().path().ends_with("/stream") {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let name = name.to_string();
        tokio::spawn(async move {
            let mut body = req.into_body();
            let mut frames = 0;
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    // An empty DATA frame may carry only END_STREAM.
                    if data.is_empty() {
                        continue;
                    }
                    frames += 1;
                    let _ = tx.unbounded_send(Ok(hyper::body::Frame::data(data)));
                }
            }
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            trailers.insert("x-frames", frames.to_string().parse().unwrap());
            trailers.insert("x-upstream", name.parse().unwrap());
            let _ = tx.unbounded_send(Ok(hyper::body::Frame::trailers(trailers)));
        });
        return Response::builder()
            .header("content-type", "application/grpc")
            .body(EchoBody::Channel(http_body_util::StreamBody::new(rx)))
            .unwrap();
    }
    let authority = req
        .uri()
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let version = format!("{:?}", req.version());
    // The caller header as the actor got it (tests/actor_calls.rs), `none` without one.
    let caller = req
        .headers()
        .get("ate-caller-actor")
        .cloned()
        .unwrap_or(http::HeaderValue::from_static("none"));
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert("x-seen-authority", authority.parse().unwrap());
    trailers.insert("x-seen-version", version.parse().unwrap());
    trailers.insert("x-seen-caller", caller);
    trailers.insert("x-upstream", name.parse().unwrap());
    let frames = vec![
        Ok(hyper::body::Frame::data(body)),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    Response::builder()
        .header("content-type", "application/grpc")
        .body(EchoBody::Frames(http_body_util::StreamBody::new(
            futures::stream::iter(frames),
        )))
        .unwrap()
}
