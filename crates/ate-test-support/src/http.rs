//! Plain HTTP/1.1 over a std TcpStream: what sync tests use to ask a component's `/healthz` or
//! `/metrics`, with no client library.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// `GET path` on a plain HTTP/1.1 endpoint: (status, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let (status, head, body) = read_response(&mut s);
    // hyper answers HTTP/1.1 with a fixed length here; a chunked body would not parse below.
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    (status, body)
}

/// Reads an HTTP/1.1 response to the end of the stream (the request asked for
/// `Connection: close`): (status, head, body); status 0 when the head does not parse.
pub fn read_response(stream: &mut impl Read) -> (u16, String, String) {
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// True when a component answers `/healthz` with 200 on its metrics address.
pub fn healthz(metrics: SocketAddr) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(metrics) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200")
}
