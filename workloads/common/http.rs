//! A tiny HTTP/1.1 server on `std::net`: one thread per connection, keep-alive, `Connection: close`,
//! Content-Length and chunked request bodies, `Expect: 100-continue`.  Shared by the demo workloads
//! (included with `#[path]`, so each workload stays a dependency-free single crate).

#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const MAX_LINE: usize = 16 * 1024;
const MAX_HEADERS: usize = 128;
const MAX_BODY: usize = 16 * 1024 * 1024;
/// An idle keep-alive connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Extra header lines (name, value), written after the standard ones.
    pub headers: Vec<(String, String)>,
    /// A protocol switch: the server answers `101 Switching Protocols` with `body` as extra header
    /// lines (each ending in CRLF), then hands the connection to this function.
    pub upgrade: Option<Upgrade>,
}

/// Takes over a connection after a `101` (reads from the reader, writes to `reader.get_mut()`).
pub type Upgrade = fn(&mut BufReader<TcpStream>) -> io::Result<()>;

impl Response {
    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            headers: Vec::new(),
            upgrade: None,
        }
    }
    pub fn bytes(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            body,
            headers: Vec::new(),
            upgrade: None,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        403 => "Forbidden",
        421 => "Misdirected Request",
        426 => "Upgrade Required",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

pub type Handler = dyn Fn(&Request) -> Response + Send + Sync + 'static;

/// Write a log line to stderr, ignoring errors (a closed pipe must not kill the server).
pub fn log(msg: &str) {
    let _ = writeln!(io::stderr(), "{msg}");
}

/// Make SIGTERM and SIGINT end the process at once.  As PID 1 in a container the process would
/// otherwise ignore SIGTERM and every stop would wait for SIGKILL.
pub fn exit_on_sigterm() {
    unsafe extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
        fn _exit(code: i32) -> !;
    }
    extern "C" fn on_signal(_sig: i32) {
        // Async-signal-safe: no destructors, no locks.
        unsafe { _exit(0) }
    }
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;
    let h = on_signal as extern "C" fn(i32) as usize;
    unsafe {
        signal(SIGTERM, h);
        signal(SIGINT, h);
    }
}

/// Parse `name` from the environment as a port; `default` when unset or empty.
pub fn env_port(name: &str, default: u16) -> Option<u16> {
    match std::env::var(name) {
        Err(_) => Some(default),
        Ok(v) if v.trim().is_empty() => Some(default),
        Ok(v) if v.trim() == "off" || v.trim() == "0" => None,
        Ok(v) => match v.trim().parse::<u16>() {
            Ok(p) => Some(p),
            Err(_) => {
                log(&format!("invalid {name}={v:?}"));
                std::process::exit(2);
            }
        },
    }
}

/// The address to bind: `$BIND_ADDR` (default 0.0.0.0) and `port`.
pub fn bind_addr(port: u16) -> SocketAddr {
    let ip = std::env::var("BIND_ADDR").unwrap_or_default();
    let ip = if ip.trim().is_empty() {
        "0.0.0.0".to_string()
    } else {
        ip.trim().to_string()
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => {
            log(&format!("invalid BIND_ADDR={ip:?}"));
            std::process::exit(2);
        }
    }
}

/// Bind `addr` or exit with a message.
pub fn bind(addr: SocketAddr) -> TcpListener {
    match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            log(&format!("cannot listen on {addr}: {e}"));
            std::process::exit(1);
        }
    }
}

/// Accept connections on `listener` forever, one thread per connection.
pub fn serve(listener: TcpListener, handler: Arc<Handler>) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let handler = handler.clone();
                let spawned = thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let _ = handle_connection(stream, &*handler);
                    });
                if let Err(e) = spawned {
                    log(&format!("cannot spawn connection thread: {e}"));
                }
            }
            Err(e) => {
                // EMFILE and friends: back off a little instead of spinning.
                log(&format!("accept: {e}"));
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Serve `listener` on a background thread.
pub fn serve_in_background(listener: TcpListener, handler: Arc<Handler>) {
    thread::Builder::new()
        .name("listener".into())
        .spawn(move || serve(listener, handler))
        .expect("spawn listener thread");
}

enum ReadError {
    Closed,
    Io,
    Bad(u16, &'static str),
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Io
    }
}

fn read_line(r: &mut BufReader<TcpStream>, buf: &mut Vec<u8>) -> Result<usize, ReadError> {
    buf.clear();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', buf)?;
    if n > MAX_LINE {
        return Err(ReadError::Bad(431, "line too long"));
    }
    while matches!(buf.last(), Some(b'\n' | b'\r')) {
        buf.pop();
    }
    Ok(n)
}

fn handle_connection(stream: TcpStream, handler: &Handler) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let mut reader = BufReader::new(stream);
    loop {
        match read_request(&mut reader) {
            Ok((req, keep_alive)) => {
                let resp = handler(&req);
                if let Some(upgrade) = resp.upgrade {
                    let mut head =
                        format!("HTTP/1.1 101 {}\r\nConnection: Upgrade\r\n", reason(101))
                            .into_bytes();
                    head.extend_from_slice(&resp.body);
                    head.extend_from_slice(b"\r\n");
                    reader.get_mut().write_all(&head)?;
                    return upgrade(&mut reader);
                }
                let head_only = req.method == "HEAD";
                write_response(reader.get_mut(), &resp, keep_alive, head_only)?;
                if !keep_alive {
                    return Ok(());
                }
            }
            Err(ReadError::Closed) | Err(ReadError::Io) => return Ok(()),
            Err(ReadError::Bad(status, msg)) => {
                let resp = Response::text(status, format!("{msg}\n"));
                let _ = write_response(reader.get_mut(), &resp, false, false);
                return Ok(());
            }
        }
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> Result<(Request, bool), ReadError> {
    let mut line = Vec::new();
    // Skip blank lines between requests (RFC 9112 §2.2).
    loop {
        let n = read_line(r, &mut line)?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        if !line.is_empty() {
            break;
        }
    }
    let request_line =
        String::from_utf8(line.clone()).map_err(|_| ReadError::Bad(400, "bad request line"))?;
    let mut parts = request_line.split_ascii_whitespace();
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) => (m.to_string(), t.to_string(), v.to_string()),
        _ => return Err(ReadError::Bad(400, "bad request line")),
    };
    let http10 = match version.as_str() {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(ReadError::Bad(400, "unsupported HTTP version")),
    };

    let mut headers = Vec::new();
    loop {
        let n = read_line(r, &mut line)?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        if line.is_empty() {
            break;
        }
        if headers.len() >= MAX_HEADERS {
            return Err(ReadError::Bad(431, "too many headers"));
        }
        let text = String::from_utf8_lossy(&line);
        let Some((k, v)) = text.split_once(':') else {
            return Err(ReadError::Bad(400, "bad header line"));
        };
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }

    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.clone(), String::new()),
    };
    let mut req = Request {
        method,
        path,
        query,
        headers,
        body: Vec::new(),
    };

    let connection = req.header("connection").unwrap_or("").to_ascii_lowercase();
    let has_token = |t: &str| connection.split(',').any(|x| x.trim() == t);
    let keep_alive = if http10 {
        has_token("keep-alive")
    } else {
        !has_token("close")
    };

    let chunked = req
        .header("transfer-encoding")
        .map(|te| te.to_ascii_lowercase().contains("chunked"))
        .unwrap_or(false);
    let content_length = match req.header("content-length") {
        Some(v) => Some(
            v.parse::<usize>()
                .map_err(|_| ReadError::Bad(400, "bad content-length"))?,
        ),
        None => None,
    };
    if content_length.is_some_and(|n| n > MAX_BODY) {
        return Err(ReadError::Bad(413, "body too large"));
    }
    let expects_continue = req
        .header("expect")
        .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"));
    if expects_continue && (chunked || content_length.unwrap_or(0) > 0) && !http10 {
        r.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }

    if chunked {
        req.body = read_chunked(r)?;
    } else if let Some(n) = content_length {
        let mut body = vec![0u8; n];
        r.read_exact(&mut body)?;
        req.body = body;
    }
    Ok((req, keep_alive))
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    let mut line = Vec::new();
    loop {
        read_line(r, &mut line)?;
        let text = String::from_utf8_lossy(&line);
        let size_str = text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|_| ReadError::Bad(400, "bad chunk size"))?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                let n = read_line(r, &mut line)?;
                if n == 0 || line.is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(ReadError::Bad(413, "body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        read_line(r, &mut line)?; // CRLF after the chunk
    }
}

fn write_response(
    w: &mut TcpStream,
    resp: &Response,
    keep_alive: bool,
    head_only: bool,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(160 + resp.body.len());
    write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len()
    )?;
    for (name, value) in &resp.headers {
        write!(out, "{name}: {value}\r\n")?;
    }
    out.extend_from_slice(if keep_alive {
        b"Connection: keep-alive\r\n\r\n"
    } else {
        b"Connection: close\r\n\r\n"
    });
    if !head_only {
        out.extend_from_slice(&resp.body);
    }
    w.write_all(&out)?;
    w.flush()
}
