//! WebSockets (over HTTP/1.1 upgrades and HTTP/2 extended CONNECT) and client `CONNECT` tunnels.

use std::convert::Infallible;
use std::sync::Arc;

use ate_core::{ACTIVATION_HEADER, TARGET_ACTOR_HEADER, TARGET_PORT_HEADER};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioTimer;
use tracing::Instrument;

use super::headers::{strip_hop_by_hop, uri_len};
use super::observe::{Timings, request_span, text, with_detail};
use super::{Proxy, REQUEST_ID};
use crate::actor_ref::ActorKey;
use crate::body::RouterBody;
use crate::cache::Route;
use crate::callers::Caller;
use crate::drain::spawn_pipe;
use crate::error::{ForwardError, RequestError};
use crate::tunnel::{H1Conn, SendFailed, TunnelError};

/// Set on the HTTP/1.1 upgrade the router makes for an HTTP/2 WebSocket (RFC 6455 §4.1).
pub(super) const SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

impl Proxy {
    /// Sends an upgrade handshake to the actor on a fresh tunnel (never a pooled one: the
    /// connection becomes the relay). Returns the client's side of the upgrade and the actor's
    /// answer, and the connection, which the caller keeps until it has taken the actor's side
    /// of the upgrade; the request comes back when no tunnel could be had, so it can be retried.
    /// Callers box it: it would otherwise sit in every request's future (one allocation per
    /// upgrade, which opens a tunnel anyway).
    async fn send_upgrade(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<(OnUpgrade, Response<Incoming>, H1Conn), SendFailed<Request<Incoming>>> {
        let id = crate::tunnel::request_id_of(&request);
        let mut conn = match self.tunnels.new_h1(route, actor, port, id).await {
            Ok(conn) => conn,
            Err(error) => {
                return Err(SendFailed {
                    error,
                    request: Some(request),
                });
            }
        };
        let client_side = hyper::upgrade::on(&mut request);
        let response = conn
            .sender
            .send_request(request)
            .await
            .map_err(|e| SendFailed {
                error: TunnelError::Actor(e),
                request: None,
            })?;
        Ok((client_side, response, conn))
    }

    /// WebSocket (any HTTP/1.1 upgrade): forward the handshake on a fresh tunnel, then relay
    /// bytes; a WebSocket to an actor that hibernates them is terminated here instead
    /// ([`Proxy::hibernate`]).
    pub(super) async fn upgrade(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        if route.hibernate_web_sockets && is_websocket(&request) {
            return Box::pin(self.hibernate(route, actor, port, request, false)).await;
        }
        let (client_side, mut response, _conn) =
            Box::pin(self.send_upgrade(route, actor, port, request)).await?;
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let actor_side = hyper::upgrade::on(&mut response);
            spawn_pipe(self.drain.relay(), client_side, actor_side, "websocket");
        }
        Ok(response.map(RouterBody::from))
    }

    /// WebSocket over HTTP/2 (RFC 8441): the client's extended CONNECT (already shaped by
    /// [`prepare_request`] into an HTTP/1.1 upgrade) goes to the actor on a fresh tunnel; the
    /// actor's 101 becomes the client's 200 and the bytes are relayed between the HTTP/2 stream
    /// and the tunnel. Any other answer is passed back as it is, except a 2xx, which would open
    /// a stream the actor never agreed to (502).
    ///
    /// [`prepare_request`]: super::headers::prepare_request
    pub(super) async fn h2_websocket(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        if route.hibernate_web_sockets {
            return Box::pin(self.hibernate(route, actor, port, request, true)).await;
        }
        let (client_side, mut response, _conn) =
            Box::pin(self.send_upgrade(route, actor, port, request)).await?;
        let status = response.status();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let actor_side = hyper::upgrade::on(&mut response);
            spawn_pipe(
                self.drain.relay(),
                client_side,
                actor_side,
                "websocket over h2",
            );
            *response.status_mut() = StatusCode::OK;
            let headers = response.headers_mut();
            // HTTP/1.1-only handshake headers; the HTTP/2 stream itself is the upgrade.
            headers.remove(SEC_WEBSOCKET_ACCEPT);
            headers.remove(header::CONTENT_LENGTH);
            strip_hop_by_hop(headers, false);
            return Ok(response.map(RouterBody::from));
        }
        if status.is_success() {
            let why = ForwardError::UpgradeRefused;
            let detail = format!("the actor answered the WebSocket upgrade with {status}");
            return Ok(with_detail(
                text(why.status(), why.body(actor, port)),
                detail,
            ));
        }
        Ok(response.map(RouterBody::from))
    }

    /// Client `CONNECT host:port` with the actor header: answer 200, then serve the bytes inside as
    /// HTTP/1.1, routing (and resuming) each request independently to that port. An
    /// `ate-target-port` on the CONNECT must name the same port.
    pub(super) fn client_connect(
        self: &Arc<Self>,
        request: Request<Incoming>,
        actor: &str,
        header_port: Option<u16>,
    ) -> Response<RouterBody> {
        let port = match request.uri().port_u16() {
            Some(port) if port != 0 => port,
            _ => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("actor {actor}: CONNECT needs host:port with a port from 1 to 65535"),
                );
            }
        };
        if let Some(header) = header_port.filter(|h| *h != port) {
            let e = RequestError::PortMismatch {
                header,
                connect: port,
            };
            return text(e.status(), e.body(Some(actor), None));
        }
        let actor = ActorKey::from_validated(actor);
        let proxy = self.clone();
        // A worker's CONNECT: each request inside is a call from the same actor.
        let caller = request.extensions().get::<Caller>().cloned();
        let on_upgrade = hyper::upgrade::on(request);
        // Registered before the 200 goes out, so a drain starting now still waits for it.
        let mut relay = self.drain.relay();
        tokio::spawn(async move {
            let upgraded = tokio::select! {
                upgraded = on_upgrade => match upgraded {
                    Ok(upgraded) => upgraded,
                    Err(e) => {
                        tracing::debug!(error = %e, "client CONNECT upgrade failed");
                        return;
                    }
                },
                () = relay.cut() => return,
            };
            let header_read_timeout = proxy.cfg.header_read_timeout;
            let service = service_fn(move |mut inner: Request<Incoming>| {
                let proxy = proxy.clone();
                let actor = actor.clone();
                if let Some(caller) = &caller {
                    inner.extensions_mut().insert(caller.clone());
                }
                async move {
                    let mut begun = proxy.begin(&mut inner);
                    begun.note_caller(&inner);
                    if !begun.kept {
                        inner.headers_mut().insert(REQUEST_ID, begun.id.clone());
                    }
                    let span = request_span(&begun.id, actor.as_str());
                    begun.trace_id =
                        ate_telemetry::trace_context::continue_http(&span, inner.headers());
                    let (response, timings) = proxy
                        .tunneled_request(inner, &actor, port)
                        .instrument(span)
                        .await;
                    Ok::<_, Infallible>(proxy.finish(response, begun, actor.as_str(), timings))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(upgraded, service)
                .with_upgrades();
            tokio::pin!(conn);
            // Like a client connection: on drain, close after the request in flight (at once
            // when idle); at the drain deadline, close regardless.
            let served = tokio::select! {
                served = conn.as_mut() => Some(served),
                () = relay.draining() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::select! {
                        served = conn.as_mut() => Some(served),
                        () = relay.cut() => None,
                    }
                }
            };
            match served {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "client CONNECT tunnel ended"),
                None => tracing::info!("drain deadline passed: client CONNECT tunnel closed"),
            }
        });
        Response::new(RouterBody::empty())
    }

    /// A request inside a client CONNECT: routed to the CONNECT's actor and port.
    async fn tunneled_request(
        self: &Arc<Self>,
        mut request: Request<Incoming>,
        actor: &ActorKey,
        port: u16,
    ) -> (Response<RouterBody>, Timings) {
        if request.method() == Method::CONNECT {
            let body = format!("actor {actor}: a CONNECT inside a CONNECT tunnel is not supported");
            return (text(StatusCode::BAD_REQUEST, body), Timings::default());
        }
        if uri_len(request.uri()) > self.cfg.max_uri_len {
            let body = format!(
                "actor {actor}: request target longer than {} bytes",
                self.cfg.max_uri_len
            );
            return (text(StatusCode::URI_TOO_LONG, body), Timings::default());
        }
        // The tunnel's actor and port apply to every request inside; these are dropped.
        request.headers_mut().remove(TARGET_ACTOR_HEADER);
        request.headers_mut().remove(TARGET_PORT_HEADER);
        request.headers_mut().remove(ACTIVATION_HEADER);
        let forwarded = self.clone().forward(request, actor.as_str(), port).await;
        (forwarded.response, forwarded.timings)
    }
}

/// Whether an HTTP/1.1 upgrade asks for a WebSocket (`Upgrade: websocket`).
fn is_websocket<B>(request: &Request<B>) -> bool {
    request.headers().get_all(header::UPGRADE).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
        })
    })
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 §4.1).
pub(super) fn websocket_key() -> HeaderValue {
    let key = base64_16(rand::random());
    HeaderValue::from_bytes(&key)
        .unwrap_or_else(|_| HeaderValue::from_static("AAAAAAAAAAAAAAAAAAAAAA=="))
}

/// Standard base64 (with padding) of 16 bytes.
fn base64_16(bytes: [u8; 16]) -> [u8; 24] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = [b'='; 24];
    for (i, chunk) in bytes.chunks(3).enumerate() {
        let byte = |k: usize| u32::from(chunk.get(k).copied().unwrap_or(0));
        let n = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        // A chunk of k bytes makes k + 1 characters; the rest of the group stays `=`.
        for j in 0..=chunk.len() {
            out[i * 4 + j] = ALPHABET[((n >> (18 - 6 * j)) & 63) as usize];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_keys_are_base64_of_16_bytes() {
        // RFC 6455 §1.3's sample nonce.
        assert_eq!(
            &base64_16(*b"the sample nonce"),
            b"dGhlIHNhbXBsZSBub25jZQ=="
        );
        assert_eq!(&base64_16([0xff; 16]), b"/////////////////////w==");
        assert_eq!(&base64_16([0; 16]), b"AAAAAAAAAAAAAAAAAAAAAA==");
        let (a, b) = (websocket_key(), websocket_key());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }
}
