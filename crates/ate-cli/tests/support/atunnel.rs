//! Talking to a worker's atunnel directly, as the router does and as strangers would: one
//! HTTP/2 CONNECT, over mTLS with a certificate of the system's CA or in the clear.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ate_test_support::block_on;

/// A TLS client config for atunnel presenting `<tls>/<name>.crt` (ALPN h2; any worker of the CA).
pub fn atunnel_tls(tls: &Path, name: &str) -> std::sync::Arc<ate_tls::rustls::ClientConfig> {
    let src = ate_tls::CertSource::from_files(
        ate_tls::PemFiles::in_dir(tls, name),
        Duration::from_secs(60),
    )
    .expect("read certificate");
    let mut cfg =
        ate_tls::client_config(&src, ate_tls::ServerCheck::ChainOnly).expect("client config");
    ate_tls::set_client_alpn(&mut cfg, &[ate_tls::Alpn::H2]);
    std::sync::Arc::new(cfg)
}

/// An HTTP/2 client over `io`, its connection driven on its own task.
async fn h2_over<IO>(
    io: IO,
) -> Result<
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
    String,
>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let exec = hyper_util::rt::TokioExecutor::new();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(exec, hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One CONNECT to atunnel over HTTP/2; `as_cert` names the certificate in `<tls>` to present
/// (None: h2c in the clear). Err: the connection was refused before any response.
pub async fn atunnel_request(
    tls: &Path,
    as_cert: Option<&str>,
    worker: SocketAddr,
    actor: &str,
    port: Option<&str>,
) -> Result<(u16, Option<String>), String> {
    use http_body_util::Empty;
    use hyper::body::Bytes;
    let mut req = hyper::Request::new(Empty::<Bytes>::new());
    *req.method_mut() = hyper::Method::CONNECT;
    *req.uri_mut() = "x.y:80".parse().expect("uri");
    req.headers_mut()
        .insert("ate-target-actor", actor.parse().expect("header"));
    if let Some(p) = port {
        req.headers_mut()
            .insert("ate-target-port", p.parse().expect("header"));
    }
    let mut sender = match as_cert {
        Some(name) => {
            let stream = ate_tls::connect(
                atunnel_tls(tls, name),
                &worker.ip().to_string(),
                worker.port(),
            )
            .await
            .map_err(|e| format!("TLS: {e}"))?;
            h2_over(stream).await?
        }
        None => {
            let tcp = tokio::net::TcpStream::connect(worker)
                .await
                .expect("connect atunnel");
            h2_over(tcp).await?
        }
    };
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
        .map_err(|e| format!("CONNECT: {e}"))?;
    let stale = resp
        .headers()
        .get("x-ate-assignment-stale")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    Ok((resp.status().as_u16(), stale))
}

/// One CONNECT to atunnel as the router (mTLS with `<tls>/router.crt`); returns (status, stale
/// header).
pub fn atunnel_connect(
    tls: &Path,
    worker: SocketAddr,
    actor: &str,
    port: Option<&str>,
) -> (u16, Option<String>) {
    block_on(atunnel_request(tls, Some("router"), worker, actor, port)).expect("CONNECT")
}
