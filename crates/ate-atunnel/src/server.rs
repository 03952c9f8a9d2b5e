//! The atunnel listener: h2c or mTLS connections, and each CONNECT checked, dialed and piped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ate_tls::rustls::ServerConfig;
use ate_tls::tokio_rustls::TlsAcceptor;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tracing::Instrument;

use super::{
    COPY_BUF, HEADER_ACTOR, HEADER_PORT, HEADER_PORT_CLOSED, HEADER_STALE, Refusal,
    TLS_HANDSHAKE_TIMEOUT, Tunnels, admit, dial, parse_activation, parse_hibernate, parse_probe,
    parse_target,
};
use crate::pipe::TunnelState;

/// Serves atunnel on `listener` until `shutdown` resolves; then stops accepting and cuts every
/// connection (the worker stops its sandboxes right after). With `tls` (a server config
/// requiring the router's SPIFFE ID, ALPN h2) every connection is mTLS and anyone else fails the
/// handshake; without, h2c.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    tunnels: Arc<Tunnels>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "atunnel accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let tunnels = tunnels.clone();
                let acceptor = acceptor.clone();
                conns.spawn(async move {
                    match acceptor {
                        None => serve_connection(stream, peer, tunnels).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => serve_connection(tls, peer, tunnels).await,
                                Ok(Err(e)) => {
                                    tracing::warn!(%peer, error = %e, "atunnel TLS handshake refused");
                                }
                                Err(_) => tracing::debug!(%peer, "atunnel TLS handshake timed out"),
                            }
                        }
                    }
                });
            }
            // Reap finished connection tasks so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

async fn serve_connection<S>(stream: S, peer: SocketAddr, tunnels: Arc<Tunnels>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let tunnels = tunnels.clone();
        let span = forward_span(&req);
        async move {
            let response = handle(&tunnels, req).instrument(span.clone()).await;
            span.record("status", response.status().as_u16());
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // One connection carries every tunnel from the router: many streams, roomy windows.
    builder
        .max_concurrent_streams(4096)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(16 << 20);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%peer, error = %e, "atunnel connection ended");
    }
}

/// The span of one CONNECT (one tunnel: its checks and the dial into the actor's netns, until
/// atunnel answers; the bytes piped afterwards are not in it). Carries the request id of the
/// request that opened the tunnel, so every line about it has one, and continues that request's
/// trace (the router's `traceparent` on the CONNECT). Requests sent later over the same pooled
/// tunnel never reach atunnel as requests: they are bytes in the pipe.
fn forward_span(req: &Request<Incoming>) -> tracing::Span {
    let headers = req.headers();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let request_id = Some(text(ate_core::REQUEST_ID_HEADER))
        .filter(|id| ate_core::request_id::is_valid(id.as_bytes()))
        .unwrap_or_default();
    let span = tracing::info_span!(
        "forward",
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        actor = %text(HEADER_ACTOR),
        port = %Some(text(HEADER_PORT)).filter(|p| !p.is_empty()).unwrap_or("80"),
        status = tracing::field::Empty,
    );
    ate_telemetry::trace_context::continue_http(&span, headers);
    span
}

/// The request id on a CONNECT (for the lines of the tunnel's task, which outlives its span).
fn request_id_of(headers: &http::HeaderMap) -> String {
    headers
        .get(ate_core::REQUEST_ID_HEADER)
        .filter(|v| ate_core::request_id::is_valid(v.as_bytes()))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn stale(key: &str) -> Response<Full<Bytes>> {
    stale_because(format!("actor {key} is not active on this worker\n"))
}

fn stale_because(body: String) -> Response<Full<Bytes>> {
    let mut r = reply(StatusCode::MISDIRECTED_REQUEST, body);
    r.headers_mut()
        .insert(HEADER_STALE, http::HeaderValue::from_static("true"));
    r
}

/// The 502 for a dial into the actor's netns that failed. A refused connection means nothing
/// listens on the port (the actor's process is not up on it, or listens elsewhere): marked, so
/// the router can say so instead of "unreachable".
fn dial_failed(key: &str, port: u16, e: &std::io::Error) -> Response<Full<Bytes>> {
    let (port_closed, body) = dial_failure(key, port, e);
    let mut r = reply(StatusCode::BAD_GATEWAY, body + "\n");
    if port_closed {
        r.headers_mut()
            .insert(HEADER_PORT_CLOSED, http::HeaderValue::from_static("true"));
    }
    r
}

/// Whether a failed dial means nothing listens on the port, and the text that says so.
pub fn dial_failure(key: &str, port: u16, e: &std::io::Error) -> (bool, String) {
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        return (
            true,
            format!("actor {key}: nothing listens on port {port} in the actor"),
        );
    }
    (
        false,
        format!("actor {key}: cannot connect to port {port} in the actor: {e}"),
    )
}

async fn handle(tunnels: &Tunnels, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::CONNECT {
        return reply(
            StatusCode::BAD_REQUEST,
            "atunnel accepts only CONNECT streams (docs/tunnel-protocol.md)\n",
        );
    }
    let (key, port) = match parse_target(req.headers()) {
        Ok(t) => t,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let token = match parse_activation(req.headers()) {
        Ok(t) => t,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let probe = match parse_probe(req.headers()) {
        Ok(p) => p,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let hibernate = match parse_hibernate(req.headers()) {
        Ok(h) => h,
        Err(msg) => return reply(StatusCode::BAD_REQUEST, msg + "\n"),
    };
    let activation = match admit(tunnels, &key, token) {
        Ok(a) => a,
        Err(body) => return stale_because(body),
    };
    if probe {
        // Not traffic: neither dialed nor counted as activity.
        if activation.off.load(Ordering::Acquire) {
            return stale(&key);
        }
        return reply(StatusCode::OK, Bytes::new());
    }
    let counted = if hibernate {
        super::Counted::BytesOnly
    } else {
        super::Counted::Open
    };
    let (upstream, guard) = match dial(&activation, port, counted).await {
        Ok(x) => x,
        Err(Refusal::Stale) => return stale(&key),
        Err(Refusal::Dial(e)) => return dial_failed(&key, port, &e),
    };
    let mut closed = activation.closed.subscribe();
    let state = if hibernate {
        // Weak: the pipe must not keep an activation that went away alive.
        let weak = Arc::downgrade(&activation);
        TunnelState::with_activity(move || {
            if let Some(a) = weak.upgrade() {
                a.touch();
            }
        })
    } else {
        TunnelState::new()
    };
    activation.register(&state);
    let request_id = request_id_of(req.headers());
    // The tunnel's trace is the CONNECT's (the router's request span), whether or not this
    // process exports traces.
    let trace_id = req
        .headers()
        .get(ate_telemetry::trace_context::TRACEPARENT)
        .and_then(|v| ate_telemetry::trace_context::TraceId::from_traceparent(v.as_bytes()));
    tokio::spawn(async move {
        let _guard = guard;
        let upgraded = tokio::select! {
            u = hyper::upgrade::on(req) => match u {
                Ok(u) => u,
                Err(e) => {
                    let trace_id = trace_id.map(tracing::field::display);
                    tracing::debug!(actor = %key, request_id = %request_id, trace_id, error = %e, "tunnel upgrade failed");
                    return;
                }
            },
            _ = closed.wait_for(|c| *c) => return,
        };
        let downstream = TokioIo::new(upgraded);
        crate::pipe::run(downstream, upstream, state, closed, COPY_BUF).await;
    });
    reply(StatusCode::OK, Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_dial_is_marked_port_closed() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let r = dial_failed("a/b", 8080, &refused);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(r.headers()[HEADER_PORT_CLOSED], "true");
        let other = std::io::Error::from(std::io::ErrorKind::TimedOut);
        let r = dial_failed("a/b", 8080, &other);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert!(r.headers().get(HEADER_PORT_CLOSED).is_none());
    }
}
