//! An HTTP/2 client of a worker's atunnel, as the router is one: the connection, CONNECT streams
//! with routing headers, and reading a body (the ate-atunnel and ate-worker tests).

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

pub type H2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// An h2c connection to the atunnel at `addr`, driven on its own task.
pub async fn h2_connect(addr: impl tokio::net::ToSocketAddrs) -> H2 {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect atunnel");
    tcp.set_nodelay(true).expect("nodelay");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// Sends a CONNECT to `authority` with the given routing headers; returns the response.
pub async fn connect_stream(
    h2: &mut H2,
    authority: &str,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    let mut b = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(authority);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Empty::<Bytes>::new()).expect("request");
    h2.ready().await.expect("h2 ready");
    h2.send_request(req).await.expect("send CONNECT")
}

pub async fn body_text(resp: http::Response<hyper::body::Incoming>) -> String {
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("read body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// HTTP/1.1 over the tunnel a CONNECT answered with `resp` opened (driven on its own task).
pub async fn http1_over(
    resp: http::Response<hyper::body::Incoming>,
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let upgraded = hyper::upgrade::on(resp).await.expect("upgrade");
    let (send, conn) = hyper::client::conn::http1::handshake(upgraded)
        .await
        .expect("h1 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}
