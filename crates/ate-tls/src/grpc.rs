//! tonic over our own tokio-rustls: `TlsIncoming` for `Server::serve_with_incoming`, with the
//! peer's SPIFFE ID in each request's extensions, and TLS channels for clients.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::{Alpn, set_client_alpn};
use crate::error::TlsError;
use crate::id::SpiffeId;
use crate::peer::PeerIdentity;

/// How long a client may take to complete the TLS handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight per listener; beyond this, accepting waits, so a flood of idle
/// connections cannot grow tasks without bound.
const MAX_PENDING_HANDSHAKES: usize = 512;

/// Connection facts placed in every request's extensions (tonic `ConnectInfo`).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The client's verified SPIFFE ID (None when the server's `ClientAuth` let it in without
    /// a certificate).
    pub spiffe_id: Option<SpiffeId>,
    pub remote_addr: SocketAddr,
    pub local_addr: Option<SocketAddr>,
    pub alpn: Option<Vec<u8>>,
}

/// An accepted, handshaken TLS connection.
pub struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
}

impl TlsConn {
    fn new(stream: tokio_rustls::server::TlsStream<TcpStream>, remote_addr: SocketAddr) -> Self {
        let info = PeerInfo {
            spiffe_id: stream.peer_spiffe_id(),
            remote_addr,
            local_addr: stream.get_ref().0.local_addr().ok(),
            alpn: stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec),
        };
        TlsConn { stream, info }
    }

    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }

    pub fn into_inner(self) -> tokio_rustls::server::TlsStream<TcpStream> {
        self.stream
    }
}

impl Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A stream of TLS connections for `tonic::transport::Server::serve_with_incoming` (or any
/// hyper accept loop). Handshakes run concurrently in their own tasks, so a slow or hostile
/// client cannot stall accepting; refused handshakes are logged and never yielded.
pub struct TlsIncoming {
    rx: mpsc::Receiver<TlsConn>,
    local_addr: SocketAddr,
    task: AbortHandle,
}

impl TlsIncoming {
    /// Starts accepting on `listener`. Must be called inside a tokio runtime.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<Self> {
        Self::with_handshake_timeout(listener, config, DEFAULT_HANDSHAKE_TIMEOUT)
    }

    pub fn with_handshake_timeout(
        listener: TcpListener,
        config: Arc<ServerConfig>,
        handshake_timeout: Duration,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let task = tokio::spawn(accept_loop(listener, acceptor, tx, handshake_timeout));
        Ok(TlsIncoming {
            rx,
            local_addr,
            task: task.abort_handle(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stream for TlsIncoming {
    type Item = Result<TlsConn, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|c| c.map(Ok))
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<TlsConn>,
    handshake_timeout: Duration,
) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(permit) = pending.clone().acquire_owned().await else {
            return;
        };
        let (tcp, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Typically EMFILE; back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if tx.is_closed() {
            return;
        }
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await;
            drop(permit);
            match handshake {
                Ok(Ok(stream)) => {
                    let _ = tx.send(TlsConn::new(stream, remote)).await;
                }
                Ok(Err(e)) => {
                    tracing::warn!(%remote, error = %e, "TLS handshake refused");
                }
                Err(_) => {
                    tracing::debug!(%remote, "TLS handshake timed out");
                }
            }
        });
    }
}

/// The caller's SPIFFE ID, for authorization in a tonic handler or interceptor served over
/// `TlsIncoming`.
pub fn request_identity<T>(request: &tonic::Request<T>) -> Option<SpiffeId> {
    request_peer(request).and_then(|p| p.spiffe_id.clone())
}

/// All connection facts of a tonic request served over `TlsIncoming`.
pub fn request_peer<T>(request: &tonic::Request<T>) -> Option<&PeerInfo> {
    request.extensions().get::<PeerInfo>()
}

/// An endpoint for `host:port` (or a URI). The scheme is forced to `http` because TLS is done
/// by our connector; tonic must not try its own TLS for `https`.
pub fn endpoint(addr: &str) -> Result<Endpoint, TlsError> {
    let rest = addr
        .strip_prefix("https://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr);
    Endpoint::from_shared(format!("http://{rest}"))
        .map_err(|_| TlsError::InvalidEndpoint(addr.to_string()))
}

/// Connects a tonic channel over TLS with `config` (ALPN forced to h2). The server name used for
/// `ServerCheck::Hostname` is the endpoint's host.
pub async fn tls_channel(
    endpoint: Endpoint,
    config: Arc<ClientConfig>,
) -> Result<Channel, TlsError> {
    Ok(endpoint.connect_with_connector(connector(config)).await?)
}

/// Like `tls_channel` but connects on first use (components that start before their peer).
pub fn tls_channel_lazy(endpoint: Endpoint, config: Arc<ClientConfig>) -> Channel {
    endpoint.connect_with_connector_lazy(connector(config))
}

fn connector(
    config: Arc<ClientConfig>,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    Error = io::Error,
    Future = impl Future<Output = io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>>
             + Send,
> + Send
+ Clone
+ 'static {
    let mut h2 = (*config).clone();
    set_client_alpn(&mut h2, &[Alpn::H2]);
    let h2 = Arc::new(h2);
    tower::service_fn(move |uri: Uri| {
        let config = h2.clone();
        async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI has no host"))?
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            connect(config, &host, port).await.map(TokioIo::new)
        }
    })
}

/// A lazily connecting channel to one of several replicas of a service (the api): `addrs` is a
/// comma-separated list of `host:port` (a name resolving to several addresses also works: each
/// is tried). Each client starts at a replica picked from its pid and start time (so many
/// routers and node agents spread over the replicas); every (re)connection tries the replica
/// that answered last first, then the others in order, each within `connect_timeout`; a replica that dies costs the calls in flight on its
/// connection, and the next call goes to another one. With `tls`, every connection is mTLS with
/// that config (ALPN h2). `tune` adjusts the endpoint (timeouts, nodelay).
pub fn replicas_channel_lazy(
    addrs: &str,
    tls: Option<Arc<ClientConfig>>,
    connect_timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, TlsError> {
    let list: Vec<&str> = addrs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    let Some(first) = list.first() else {
        return Err(TlsError::InvalidEndpoint(addrs.to_string()));
    };
    let mut targets = Vec::with_capacity(list.len());
    for a in &list {
        let uri: Uri = endpoint(a)?.uri().clone();
        let host = uri
            .host()
            .ok_or_else(|| TlsError::InvalidEndpoint(a.to_string()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri
            .port_u16()
            .ok_or_else(|| TlsError::InvalidEndpoint(format!("{a}: no port")))?;
        targets.push((host, port));
    }
    let endpoint = tune(endpoint(first)?.connect_timeout(connect_timeout));
    let targets = Arc::new(targets);
    // Clients spread over the replicas: each process starts at a replica of its own (from its
    // pid and start time) and stays there until that replica stops answering.
    let spread = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as usize)
        .unwrap_or(0)
        .wrapping_add(std::process::id() as usize);
    let preferred = Arc::new(std::sync::atomic::AtomicUsize::new(spread % targets.len()));
    // Each attempt below has its own timeout; the endpoint's bounds the whole round.
    let round = connect_timeout * u32::try_from(targets.len()).unwrap_or(u32::MAX);
    let endpoint = endpoint.connect_timeout(round);
    Ok(match tls {
        Some(config) => {
            let mut h2 = (*config).clone();
            set_client_alpn(&mut h2, &[Alpn::H2]);
            let h2 = Arc::new(h2);
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let (config, targets, preferred) = (h2.clone(), targets.clone(), preferred.clone());
                async move {
                    first_answering(&targets, &preferred, connect_timeout, |host, port| {
                        let config = config.clone();
                        async move { connect(config, &host, port).await }
                    })
                    .await
                    .map(TokioIo::new)
                }
            }))
        }
        None => endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let (targets, preferred) = (targets.clone(), preferred.clone());
            async move {
                first_answering(
                    &targets,
                    &preferred,
                    connect_timeout,
                    |host, port| async move {
                        let tcp = TcpStream::connect((host.as_str(), port)).await?;
                        tcp.set_nodelay(true)?;
                        Ok(tcp)
                    },
                )
                .await
                .map(TokioIo::new)
            }
        })),
    })
}

/// Tries `targets` starting with `preferred`, each within `timeout`; remembers the one that
/// answered.
async fn first_answering<S, F, Fut>(
    targets: &[(String, u16)],
    preferred: &std::sync::atomic::AtomicUsize,
    timeout: Duration,
    dial: F,
) -> io::Result<S>
where
    F: Fn(String, u16) -> Fut,
    Fut: Future<Output = io::Result<S>>,
{
    use std::sync::atomic::Ordering;
    let start = preferred.load(Ordering::Relaxed);
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
    for i in 0..targets.len() {
        let idx = (start + i) % targets.len();
        let (host, port) = &targets[idx];
        match tokio::time::timeout(timeout, dial(host.clone(), *port)).await {
            Ok(Ok(stream)) => {
                if idx != start {
                    tracing::info!(replica = %format!("{host}:{port}"), "connected to another replica");
                }
                preferred.store(idx, Ordering::Relaxed);
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{host}:{port} did not answer within {timeout:?}"),
                )
            }
        }
    }
    Err(last)
}

/// Dials `host:port` and completes a TLS handshake (server name = `host`, an IP or DNS name;
/// with `ServerCheck::Pin` the name is not used for verification).
pub async fn connect(
    config: Arc<ClientConfig>,
    host: &str,
    port: u16,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    // URIs bracket IPv6 literals.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(bare.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tcp = TcpStream::connect((bare, port)).await?;
    tcp.set_nodelay(true)?;
    TlsConnector::from(config).connect(name, tcp).await
}
