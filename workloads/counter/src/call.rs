//! `GET /call?actor=A/N&path=P[&n=K][&forge=1][&method=POST&body=…]`: calls another actor through the platform
//! (plain HTTP/1.1 to `169.254.17.1:80`, or `$ATE_PLATFORM_ADDR`, with `ate-target-actor: A/N`)
//! over one kept-alive connection reused across calls, and answers `status: <code>\n` followed
//! by the callee's body, with the callee's status. `n=K` makes K calls (the last one answers)
//! and adds `x-call-p50-us` (their median, microseconds); every answer carries `x-call-us` (the
//! last call's time). `forge=1` also sends `ate-caller-actor: evil/forged`, which the platform
//! must replace. Without `actor`, `path` goes to the local actor API (`/v1/identity`, …).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::http::Response;

const DEFAULT_PLATFORM: &str = "169.254.17.1:80";
/// Largest callee body relayed.
const MAX_BODY: usize = 16 << 20;
/// Most calls one `/call` makes.
const MAX_CALLS: usize = 10_000;

/// The kept-alive platform connection, shared by every request of this process.
pub struct Platform {
    addr: String,
    conn: Mutex<Option<BufReader<TcpStream>>>,
}

impl Platform {
    pub fn from_env() -> Platform {
        let addr = std::env::var("ATE_PLATFORM_ADDR")
            .ok()
            .filter(|a| !a.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_PLATFORM.to_string());
        Platform {
            addr,
            conn: Mutex::new(None),
        }
    }

    /// `/call?…`.
    pub fn handle(&self, query: &str) -> Response {
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        let actor = param("actor").filter(|a| !a.is_empty());
        let path = param("path").filter(|p| p.starts_with('/')).unwrap_or("/");
        let n = match param("n").map(str::parse::<usize>) {
            None => 1,
            Some(Ok(n)) if (1..=MAX_CALLS).contains(&n) => n,
            Some(_) => return Response::text(400, format!("n must be 1-{MAX_CALLS}\n")),
        };
        let forge = param("forge") == Some("1");
        // `method=POST` with an optional percent-encoded `body` (the local API's
        // `/v1/keep-awake` and `/v1/suspend`).
        let post = param("method") == Some("POST");
        let body = match param("body").map(percent_decode) {
            Some(Some(b)) => b,
            Some(None) => return Response::text(400, "body: bad percent-encoding\n"),
            None => Vec::new(),
        };
        if actor.is_some_and(|a| a.contains(['\r', '\n', ' '])) || path.contains(['\r', '\n', ' '])
        {
            return Response::text(400, "bad actor or path\n");
        }
        let mut headers = String::new();
        if let Some(a) = actor {
            headers.push_str(&format!("ate-target-actor: {a}\r\n"));
        }
        if forge {
            headers.push_str("ate-caller-actor: evil/forged\r\n");
        }
        let mut times = Vec::with_capacity(n);
        let mut last = (0u16, Vec::new());
        for _ in 0..n {
            let begun = Instant::now();
            match self.request(post, path, &headers, &body) {
                Ok(answer) => last = answer,
                Err(e) => {
                    return Response::text(502, format!("call via {}: {e}\n", self.addr));
                }
            }
            times.push(begun.elapsed());
        }
        let (status, body) = last;
        let mut out = format!("status: {status}\n").into_bytes();
        out.extend_from_slice(&body);
        let mut resp = Response::bytes(status, "text/plain; charset=utf-8", out);
        let us = |d: Duration| d.as_micros().to_string();
        if let Some(t) = times.last() {
            resp.headers.push(("x-call-us".into(), us(*t)));
        }
        if n > 1 {
            times.sort();
            resp.headers
                .push(("x-call-p50-us".into(), us(times[times.len() / 2])));
        }
        resp
    }

    /// `POST <path>` with `body` to the local actor API; answers with its status and body.
    pub fn local_post(&self, path: &str, body: &[u8]) -> Response {
        match self.request(true, path, "content-type: application/json\r\n", body) {
            Ok((status, body)) => Response::bytes(status, "text/plain; charset=utf-8", body),
            Err(e) => Response::text(502, format!("local API via {}: {e}\n", self.addr)),
        }
    }

    /// One request on the kept connection; one retry on a fresh connection when a kept one
    /// turns out closed (the platform closes idle connections, and a suspend resets them).
    fn request(
        &self,
        post: bool,
        path: &str,
        headers: &str,
        body: &[u8],
    ) -> io::Result<(u16, Vec<u8>)> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            let reused = conn.is_some();
            if conn.is_none() {
                let addr = self.addr.parse::<std::net::SocketAddr>().map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {e}", self.addr))
                })?;
                let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                stream.set_read_timeout(Some(Duration::from_secs(30)))?;
                let _ = stream.set_nodelay(true);
                *conn = Some(BufReader::new(stream));
            }
            let Some(c) = conn.as_mut() else { continue };
            match exchange(c, post, path, headers, body) {
                Ok((status, body, keep)) => {
                    if !keep {
                        *conn = None;
                    }
                    return Ok((status, body));
                }
                Err(e) => {
                    *conn = None;
                    if !reused || attempt == 1 {
                        return Err(e);
                    }
                }
            }
        }
        Err(io::Error::other("no connection"))
    }
}

/// `%XX` and `+` decoded; None for a malformed escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Writes a GET (or a POST with `body`) and reads the answer: status, body, whether the
/// connection stays open.
fn exchange(
    conn: &mut BufReader<TcpStream>,
    post: bool,
    path: &str,
    headers: &str,
    body: &[u8],
) -> io::Result<(u16, Vec<u8>, bool)> {
    let method = if post { "POST" } else { "GET" };
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 169.254.17.1\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    conn.get_mut().write_all(&req)?;
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "platform closed the connection",
        ));
    }
    let status = line
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {:?}", line.trim())))?;
    let mut length = None;
    let mut chunked = false;
    let mut keep = true;
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(io::Error::other("platform closed the connection"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse::<usize>().map_err(io::Error::other)?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                keep = !value.eq_ignore_ascii_case("close");
            }
        }
    }
    let body = if chunked {
        read_chunked(conn)?
    } else if let Some(n) = length {
        if n > MAX_BODY {
            return Err(io::Error::other(format!("body of {n} bytes is too large")));
        }
        let mut b = vec![0u8; n];
        conn.read_exact(&mut b)?;
        b
    } else {
        // Neither: the body runs to the end of the connection.
        let mut b = Vec::new();
        conn.take(MAX_BODY as u64).read_to_end(&mut b)?;
        keep = false;
        b
    };
    Ok((status, body, keep))
}

fn read_chunked(conn: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line)?;
        let size = line.trim().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size.trim(), 16).map_err(io::Error::other)?;
        if size == 0 {
            // Trailers until the empty line.
            loop {
                line.clear();
                if conn.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(io::Error::other("body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        conn.read_exact(&mut body[start..])?;
        line.clear();
        conn.read_line(&mut line)?;
    }
}
