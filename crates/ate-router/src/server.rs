//! Listeners: the ingress (HTTP/1.1 and h2c on one port, with limits and graceful drain) and the
//! operations port (`/healthz`, `/metrics`).
//!
//! The drain waits for client connections (in-flight and parked requests) and for the relays the
//! proxy registered ([`crate::drain`]): WebSocket relays and client CONNECT tunnels. At the drain
//! deadline everything still open is closed, and only then does [`Ingress::run`] return.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::RouterBody;
use crate::drain::{Drain, Phase};
use crate::proxy::{Proxy, text};

/// After the drain deadline, how long relays get to notice the cut before `run` returns anyway.
const CUT_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub drain_delay: Duration,
}

/// The ingress: accepts connections until `shutdown`, then drains.
pub struct Ingress {
    proxy: Arc<Proxy>,
    drain: Arc<Drain>,
    builder: auto::Builder<TokioExecutor>,
    graceful: GracefulShutdown,
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
            builder,
            graceful: GracefulShutdown::new(),
        }
    }

    /// Serves one client connection. This is the TLS seam: a TLS acceptor (ALPN h2 / http/1.1,
    /// mTLS allowlist) hands its stream here instead of the raw TCP stream.
    pub fn serve_connection<I>(&self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let proxy = self.proxy.clone();
        let service = service_fn(move |request: Request<Incoming>| proxy.clone().handle(request));
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let conn = self.graceful.watch(conn);
        let mut phase = self.drain.watch();
        tokio::spawn(async move {
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

    /// Accepts until `shutdown`; then closes the listener (new connections are refused), lets
    /// in-flight and parked requests, WebSocket relays and client CONNECT tunnels finish, and
    /// returns once they have, or once `drain_delay` passed and whatever was left is closed.
    pub async fn run(
        self,
        listener: TcpListener,
        mut tls: Option<ate_tls::TlsIncoming>,
        shutdown: impl Future<Output = ()>,
        drain_delay: Duration,
    ) {
        use futures::StreamExt;
        tokio::pin!(shutdown);
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
                    Ok(conn) => self.serve_connection(conn),
                    Err(e) => tracing::warn!(error = %e, "TLS accept failed"),
                },
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _peer)) => {
                        let _ = tcp.set_nodelay(true);
                        self.serve_connection(tcp);
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

/// `/healthz` (503 while draining) and `/metrics` until `stop` turns true.
pub async fn serve_operations(
    listener: TcpListener,
    draining: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) {
    let handle = crate::metrics::prometheus();
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let draining = draining.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let draining = draining.clone();
                    async move {
                        let response: Response<RouterBody> = match request.uri().path() {
                            "/healthz" if draining.load(Ordering::Relaxed) => {
                                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                            }
                            "/healthz" => text(StatusCode::OK, "ok\n"),
                            "/metrics" => text(StatusCode::OK, handle.render()),
                            _ => text(StatusCode::NOT_FOUND, "not found\n"),
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        }
    }
}
