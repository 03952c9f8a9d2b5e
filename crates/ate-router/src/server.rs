//! Listeners: the ingress (HTTP/1.1 and h2c on one port, with limits and graceful drain) and the
//! operations port (`/healthz`, `/metrics`). A TCP connection whose first bytes are not the h2c
//! preface goes straight to hyper's HTTP/1 server (see [`Ingress::serve_tcp`] for why).
//!
//! The drain waits for client connections (in-flight and parked requests) and for the relays the
//! proxy registered ([`crate::drain`]): WebSocket relays and client CONNECT tunnels. At the drain
//! deadline everything still open is closed, and only then does [`Ingress::run`] return.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::auth::ConnAuth;
use crate::body::RouterBody;
use crate::drain::{Drain, Phase};
use crate::internal::InternalListeners;
use crate::proxy::Proxy;

/// After the drain deadline, how long relays get to notice the cut before `run` returns anyway.
const CUT_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub drain_delay: Duration,
}

/// The first bytes an h2c prior-knowledge client sends (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The ingress: accepts connections until `shutdown`, then drains.
pub struct Ingress {
    proxy: Arc<Proxy>,
    drain: Arc<Drain>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    /// The same HTTP/1 settings as `builder.http1()`, for TCP connections known to be HTTP/1.x
    /// (see [`Ingress::serve_tcp`]).
    http1: Arc<http1::Builder>,
    graceful: GracefulShutdown,
    /// A client that sends nothing at all is closed after this long (the slowloris guard for
    /// the bytes before a request head; hyper's header timer only starts once it reads).
    first_byte_timeout: Duration,
}

impl Ingress {
    pub fn new(proxy: Arc<Proxy>, cfg: &ListenerConfig) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            // Slowloris guard: the whole request head must arrive within this time.
            .header_read_timeout(cfg.header_read_timeout)
            .max_buf_size(cfg.max_header_bytes.max(8192));
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .keep_alive(true)
            .header_read_timeout(cfg.header_read_timeout)
            .max_buf_size(cfg.max_header_bytes.max(8192))
            // `max_buf_size` alone is not a strict limit (a buffer that grew past it can still
            // hold a whole head); this is, and answers 431. The auto builder has no such setting.
            .max_header_size(cfg.max_header_bytes);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(cfg.max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            // SETTINGS_ENABLE_CONNECT_PROTOCOL: WebSocket over HTTP/2 (RFC 8441).
            .enable_connect_protocol();
        Self {
            drain: proxy.drain().clone(),
            proxy,
            builder: Arc::new(builder),
            http1: Arc::new(http1),
            graceful: GracefulShutdown::new(),
            first_byte_timeout: cfg.header_read_timeout,
        }
    }

    /// Serves one client connection. This is the TLS seam: a TLS acceptor (ALPN h2 / http/1.1,
    /// mTLS allowlist) hands its stream here instead of the raw TCP stream.
    pub fn serve_connection<I>(&self, io: I, conn: ConnAuth)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let proxy = self.proxy.clone();
        let service = service_fn(move |request| handle(&proxy, request, conn));
        let builder = self.builder.clone();
        let watcher = self.graceful.watcher();
        let mut phase = self.drain.watch();
        tokio::spawn(async move {
            // Made in place (not moved in): a moved connection would take its size twice in the
            // task.
            let conn =
                watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(io), service));
            tokio::select! {
                served = conn => if let Err(e) = served {
                    tracing::debug!(error = %e, "client connection ended");
                },
                _ = phase.wait_for(|p| *p == Phase::Cut) => {
                    tracing::debug!("drain deadline passed: client connection closed");
                }
            }
        });
    }

    /// Serves one accepted TCP connection. HTTP/1.x goes straight to hyper's HTTP/1 server; only
    /// an h2c preface (or too few bytes to tell) goes through the auto builder.
    ///
    /// Why not the auto builder for everything: it reads up to 24 bytes to look for the h2c
    /// preface and hands them back to the HTTP/1 server first, which then parses an incomplete
    /// head, reserves again and doubles its 8 KiB read buffer to 16 KiB on every connection.
    /// Peeking (`MSG_PEEK`) leaves the bytes in the socket, so the first read gets the whole head
    /// and the buffer stays 8 KiB: ~8 KiB less per parked request (see the README decisions).
    fn serve_tcp(&self, tcp: TcpStream) {
        let proxy = self.proxy.clone();
        let service = service_fn(move |request| handle(&proxy, request, ConnAuth::Plain));
        let builder = self.builder.clone();
        let http1 = self.http1.clone();
        // Held for the connection's life: `GracefulShutdown::shutdown` waits for it.
        let watcher = self.graceful.watcher();
        let mut phase = self.drain.watch();
        let first_byte_timeout = self.first_byte_timeout;
        tokio::spawn(async move {
            let is_http1 = tokio::select! {
                peeked = tokio::time::timeout(first_byte_timeout, is_http1(&tcp)) => match peeked {
                    Ok(Ok(is_http1)) => is_http1,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "client connection ended");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(timeout = ?first_byte_timeout, "client sent nothing; connection closed");
                        return;
                    }
                },
                // Nothing received yet: closed like an idle keep-alive connection.
                _ = phase.wait_for(|p| *p != Phase::Serving) => return,
            };
            if !is_http1 {
                // Rare (h2c clients keep one connection); boxed so that the much larger auto
                // connection does not size every HTTP/1.1 connection's task.
                let conn = Box::pin(
                    watcher
                        .watch(builder.serve_connection_with_upgrades(TokioIo::new(tcp), service)),
                );
                tokio::select! {
                    served = conn => if let Err(e) = served {
                        tracing::debug!(error = %e, "client connection ended");
                    },
                    _ = phase.wait_for(|p| *p == Phase::Cut) => {
                        tracing::debug!("drain deadline passed: client connection closed");
                    }
                }
                return;
            }
            let conn = std::pin::pin!(
                http1
                    .serve_connection(TokioIo::new(tcp), service)
                    .with_upgrades()
            );
            // `GracefulShutdown` cannot watch an upgradeable HTTP/1 connection, so the drain is
            // followed here as it does it: graceful shutdown when the drain begins (the request
            // in flight or parked finishes, an idle connection closes), closed at the cut.
            let served = serve_until_cut(conn, |c| c.graceful_shutdown(), &mut phase).await;
            drop(watcher);
            match served {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "client connection ended"),
                None => tracing::debug!("drain deadline passed: client connection closed"),
            }
        });
    }

    /// Accepts until `shutdown`; then closes the listener (new connections are refused), lets
    /// in-flight and parked requests, WebSocket relays and client CONNECT tunnels finish, and
    /// returns once they have, or once `drain_delay` passed and whatever was left is closed.
    pub async fn run(
        self,
        listener: TcpListener,
        mut tls: Option<ate_tls::TlsIncoming>,
        tls_allow_list: bool,
        internal: InternalListeners,
        shutdown: impl Future<Output = ()>,
        drain_delay: Duration,
    ) {
        use futures::StreamExt;
        tokio::pin!(shutdown);
        let InternalListeners {
            unix: internal_unix,
            tls: mut internal_tls,
        } = internal;
        let own_uid = crate::internal::own_uid();
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                // Handshaken (and, with an allow-list, client-verified) TLS connections.
                Some(conn) = async {
                    match tls.as_mut() {
                        Some(incoming) => incoming.next().await,
                        None => std::future::pending().await,
                    }
                } => match conn {
                    Ok(conn) => {
                        // With an allow-list the handshake admitted only certificates on it,
                        // so any verified certificate here is an allowed one.
                        let allowed_cert = tls_allow_list && conn.peer().spiffe_id.is_some();
                        self.serve_connection(conn, ConnAuth::Tls { allowed_cert });
                    }
                    Err(e) => tracing::warn!(error = %e, "TLS accept failed"),
                },
                // Workers sending their actors' calls, over mTLS: only a worker's certificate.
                Some(conn) = async {
                    match internal_tls.as_mut() {
                        Some(incoming) => incoming.next().await,
                        None => std::future::pending().await,
                    }
                } => match conn {
                    Ok(conn) if crate::internal::admits(conn.peer().spiffe_id.as_ref()) => {
                        self.serve_connection(conn, ConnAuth::Worker);
                    }
                    Ok(conn) => {
                        let peer = conn.peer();
                        tracing::warn!(
                            remote = %peer.remote_addr,
                            spiffe_id = ?peer.spiffe_id.as_ref().map(ToString::to_string),
                            "internal listener: connection closed: the client certificate is not a worker's"
                        );
                    }
                    Err(e) => tracing::warn!(error = %e, "internal TLS accept failed"),
                },
                // Workers of this machine: root or the router's own user only.
                accepted = async {
                    match internal_unix.as_ref() {
                        Some(unix) => unix.accept().await,
                        None => std::future::pending().await,
                    }
                } => match accepted {
                    Ok((stream, _)) => match stream.peer_cred() {
                        Ok(cred) if crate::internal::peer_allowed(cred.uid(), own_uid) => {
                            self.serve_connection(stream, ConnAuth::Worker);
                        }
                        Ok(cred) => tracing::warn!(
                            pid = ?cred.pid(),
                            uid = cred.uid(),
                            own_uid,
                            "internal socket: connection refused: the peer is neither root nor the router's user"
                        ),
                        Err(e) => tracing::warn!(error = %e, "internal socket: cannot read the peer's credentials"),
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "internal socket accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _peer)) => {
                        let _ = tcp.set_nodelay(true);
                        self.serve_tcp(tcp);
                    }
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        drop(listener);
        drop(tls);
        drop(internal_unix);
        drop(internal_tls);
        let drain = self.drain.clone();
        drain.begin();
        let open = self.graceful.count();
        tracing::info!(open, relays = drain.open(), ?drain_delay, "draining");
        let everything = async {
            tokio::join!(self.graceful.shutdown(), drain.idle());
        };
        if tokio::time::timeout(drain_delay, everything).await.is_err() {
            tracing::warn!(
                relays = drain.open(),
                "drain delay passed with requests or relays still open; closing them"
            );
            drain.cut();
            // Each relay and connection stops at the cut; wait (briefly) until they are gone.
            if tokio::time::timeout(CUT_GRACE, drain.idle()).await.is_err() {
                tracing::warn!(relays = drain.open(), "relays still open after the cut");
            }
        }
        drain.cut();
    }
}

/// Does the client speak HTTP/1.x? Looks at its first bytes without consuming them. `false` for
/// the h2c preface, a prefix of it (too few bytes to tell) or end of stream: the auto builder
/// decides those as before.
async fn is_http1(tcp: &TcpStream) -> std::io::Result<bool> {
    let mut head = [0u8; H2_PREFACE.len()];
    let n = tcp.peek(&mut head).await?;
    Ok(n > 0 && head[..n] != H2_PREFACE[..n])
}

/// The ingress service: every request goes to the proxy. Runs as hyper hands over a request
/// head, before hyper reads the socket again (see [`Proxy::handle`]).
/// The connection's [`ConnAuth`] travels on each request as an extension.
fn handle(
    proxy: &Arc<Proxy>,
    mut request: Request<Incoming>,
    conn: ConnAuth,
) -> impl Future<Output = Result<Response<RouterBody>, Infallible>> + Send + use<> {
    request.extensions_mut().insert(conn);
    proxy.clone().handle(request)
}

/// Drives a client connection through the drain: `shutdown` (graceful) once the drain begins,
/// `None` if the drain deadline closes it first.
async fn serve_until_cut<F: Future>(
    mut conn: Pin<&mut F>,
    shutdown: impl FnOnce(Pin<&mut F>),
    phase: &mut watch::Receiver<Phase>,
) -> Option<F::Output> {
    tokio::select! {
        served = conn.as_mut() => return Some(served),
        _ = phase.wait_for(|p| *p != Phase::Serving) => {}
    }
    shutdown(conn.as_mut());
    tokio::select! {
        served = conn => Some(served),
        _ = phase.wait_for(|p| *p == Phase::Cut) => None,
    }
}

/// `/healthz` (503 while draining) and `/metrics` until `stop` turns true (the endpoint every
/// component shares: [`ate_telemetry`]).
pub async fn serve_operations(
    listener: TcpListener,
    draining: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) {
    crate::metrics::prometheus();
    let health: ate_telemetry::Health = Arc::new(move || {
        if draining.load(Ordering::Relaxed) {
            Err("draining".to_string())
        } else {
            Ok(())
        }
    });
    let endpoint = ate_telemetry::Endpoint {
        health: Some(health),
        ..Default::default()
    };
    ate_telemetry::serve_with(listener, endpoint, async move {
        let _ = stop.wait_for(|s| *s).await;
    })
    .await
}
