//! A connection to the router's internal listener: a pooled keep-alive HTTP/1.1 client, over a
//! unix socket (plaintext, same machine: `ate up`) or TCP with mTLS (the caller's certificate,
//! the router's SPIFFE ID pinned). Workers send actors' calls to other actors through it
//! (`ate worker --router`), the api its alarm deliveries (`ate api --router-internal`).

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use ate_tls::tokio_rustls::client::TlsStream;
use hyper::Uri;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// Bound on connecting (and the TLS handshake) to one router address.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A pooled router connection unused this long is closed.
const POOL_IDLE: Duration = Duration::from_secs(30);

/// Where the router's internal listener is (`ate worker --router`, `ate api --router-internal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterAddr {
    /// `unix:/path`: the router's internal socket on this machine (plaintext HTTP/1.1).
    Unix(PathBuf),
    /// `host:port[,host:port…]`: the router's internal listener over mTLS, tried in order
    /// (the last one that answered first).
    Tcp(Vec<(String, u16)>),
}

#[derive(Debug, thiserror::Error)]
pub enum RouterAddrError {
    #[error("unix: needs an absolute socket path (unix:/path/to/socket), got {0:?}")]
    UnixPath(String),
    #[error("{0:?} is not host:port")]
    HostPort(String),
    #[error("no router address given")]
    Empty,
}

impl FromStr for RouterAddr {
    type Err = RouterAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(RouterAddrError::UnixPath(s.to_string()));
            }
            return Ok(RouterAddr::Unix(path));
        }
        let mut hosts = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (host, port) = part
                .rsplit_once(':')
                .ok_or_else(|| RouterAddrError::HostPort(part.to_string()))?;
            let port = ate_core::tunnel::parse_port(port.as_bytes())
                .ok_or_else(|| RouterAddrError::HostPort(part.to_string()))?;
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            if bare.is_empty() {
                return Err(RouterAddrError::HostPort(part.to_string()));
            }
            hosts.push((host.to_string(), port));
        }
        if hosts.is_empty() {
            return Err(RouterAddrError::Empty);
        }
        Ok(RouterAddr::Tcp(hosts))
    }
}

impl fmt::Display for RouterAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouterAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            RouterAddr::Tcp(hosts) => {
                let list: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

/// One connection to the router.
pub enum RouterIo {
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for RouterIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RouterIo::Unix(s) => Pin::new(s).poll_read(cx, buf),
            RouterIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for RouterIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RouterIo::Unix(s) => Pin::new(s).poll_write(cx, buf),
            RouterIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RouterIo::Unix(s) => Pin::new(s).poll_flush(cx),
            RouterIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RouterIo::Unix(s) => Pin::new(s).poll_shutdown(cx),
            RouterIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Connection for RouterIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// How the connector reaches the router.
enum Dial {
    Unix(PathBuf),
    Tls {
        hosts: Vec<(String, u16)>,
        config: Arc<ate_tls::rustls::ClientConfig>,
        /// The address that answered last: tried first next time.
        preferred: AtomicUsize,
    },
}

/// The hyper connector: every URI leads to the router.
#[derive(Clone)]
pub struct RouterConnector(Arc<Dial>);

impl RouterConnector {
    async fn connect(dial: &Dial) -> io::Result<RouterIo> {
        match dial {
            Dial::Unix(path) => {
                let s = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path))
                    .await
                    .map_err(|_| timed_out(&path.display().to_string()))?
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("router {}: {e}", path.display()))
                    })?;
                Ok(RouterIo::Unix(s))
            }
            Dial::Tls {
                hosts,
                config,
                preferred,
            } => {
                let start = preferred.load(Ordering::Relaxed) % hosts.len().max(1);
                let mut last = io::Error::other("no router address");
                for i in 0..hosts.len() {
                    let idx = (start + i) % hosts.len();
                    let (host, port) = &hosts[idx];
                    let what = format!("{host}:{port}");
                    match tokio::time::timeout(
                        CONNECT_TIMEOUT,
                        ate_tls::connect(config.clone(), host, *port),
                    )
                    .await
                    {
                        Ok(Ok(s)) => {
                            preferred.store(idx, Ordering::Relaxed);
                            return Ok(RouterIo::Tls(Box::new(s)));
                        }
                        Ok(Err(e)) => {
                            last = io::Error::new(e.kind(), format!("router {what}: {e}"))
                        }
                        Err(_) => last = timed_out(&what),
                    }
                }
                Err(last)
            }
        }
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("router {what}: no connection within {CONNECT_TIMEOUT:?}"),
    )
}

impl tower::Service<Uri> for RouterConnector {
    type Response = TokioIo<RouterIo>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<RouterIo>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let dial = self.0.clone();
        Box::pin(async move { Ok(TokioIo::new(Self::connect(&dial).await?)) })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouterClientError {
    #[error(
        "router address {0} needs this process's TLS material (--tls-cert, --tls-key, --tls-ca): calls to a router over TCP use mTLS; use unix:PATH for a router on this machine"
    )]
    NoTls(String),
    #[error("TLS client for the router: {0}")]
    Tls(#[from] ate_tls::TlsError),
}

/// Pooled keep-alive HTTP/1.1 client to the router, sending bodies of type `B`.
pub struct RouterClient<B = Incoming> {
    addr: Arc<RouterAddr>,
    client: Client<RouterConnector, B>,
}

impl<B> Clone for RouterClient<B> {
    fn clone(&self) -> Self {
        RouterClient {
            addr: self.addr.clone(),
            client: self.client.clone(),
        }
    }
}

impl<B> fmt::Debug for RouterClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouterClient")
            .field("addr", &self.addr.to_string())
            .finish_non_exhaustive()
    }
}

impl<B> RouterClient<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A client for `addr`. A TCP address needs `tls` (this process's certificate source):
    /// the router is checked against `SpiffeId::router(trust_domain)` and sees this process's
    /// certificate. Connects lazily (the router may start after the caller).
    pub fn new(
        addr: RouterAddr,
        tls: Option<&ate_tls::CertSource>,
        trust_domain: &str,
    ) -> Result<Self, RouterClientError> {
        let dial = match &addr {
            RouterAddr::Unix(p) => Dial::Unix(p.clone()),
            RouterAddr::Tcp(hosts) => {
                let src = tls.ok_or_else(|| RouterClientError::NoTls(addr.to_string()))?;
                let router = ate_tls::SpiffeId::router(trust_domain)?;
                let mut config = ate_tls::client_config(src, ate_tls::ServerCheck::Pin(router))?;
                ate_tls::set_client_alpn(&mut config, &[ate_tls::Alpn::Http11]);
                Dial::Tls {
                    hosts: hosts.clone(),
                    config: Arc::new(config),
                    preferred: AtomicUsize::new(0),
                }
            }
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            // The actor's own Host header goes through unchanged (none is made up).
            .set_host(false)
            .build(RouterConnector(Arc::new(dial)));
        Ok(RouterClient {
            addr: Arc::new(addr),
            client,
        })
    }

    /// Where the client connects (for messages).
    pub fn addr(&self) -> &RouterAddr {
        &self.addr
    }

    /// Sends `req` (origin-form URI; rewritten here to the pool's one authority).
    pub async fn send(
        &self,
        mut req: http::Request<B>,
    ) -> Result<http::Response<Incoming>, hyper_util::client::legacy::Error> {
        let pq = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        // Every request goes to the one router: the authority only keys the pool.
        if let Ok(uri) = Uri::try_from(format!("http://router{pq}")) {
            *req.uri_mut() = uri;
        }
        self.client.request(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_addresses_parse() {
        assert_eq!(
            "unix:/run/ate/router.sock".parse::<RouterAddr>().ok(),
            Some(RouterAddr::Unix(PathBuf::from("/run/ate/router.sock")))
        );
        assert_eq!(
            "r1:8444, 10.0.0.2:8444".parse::<RouterAddr>().ok(),
            Some(RouterAddr::Tcp(vec![
                ("r1".into(), 8444),
                ("10.0.0.2".into(), 8444)
            ]))
        );
        assert_eq!(
            "[::1]:8444".parse::<RouterAddr>().ok(),
            Some(RouterAddr::Tcp(vec![("[::1]".into(), 8444)]))
        );
        for bad in ["", "unix:rel/path", "r1", "r1:0", ":8444", "r1:x"] {
            assert!(bad.parse::<RouterAddr>().is_err(), "{bad:?}");
        }
        assert_eq!(
            "unix:/a".parse::<RouterAddr>().map(|a| a.to_string()).ok(),
            Some("unix:/a".to_string())
        );
    }
}
