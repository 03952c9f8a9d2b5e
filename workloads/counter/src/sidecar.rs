//! `$SIDECAR_ADDR` (e.g. `127.0.0.1:9000`): on every counted request the counter asks a sidecar
//! container (another counter) over one kept-alive loopback connection for its own in-memory
//! count, and reports it with the number of connections it has had to open so far — `1` after
//! suspends and resumes means the connection between the two containers survived them.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub struct Sidecar {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    opened: u64,
}

impl Sidecar {
    pub fn from_env() -> Option<Sidecar> {
        let addr = std::env::var("SIDECAR_ADDR")
            .ok()
            .filter(|a| !a.is_empty())?;
        Some(Sidecar {
            addr,
            conn: None,
            opened: 0,
        })
    }

    /// ` | sidecar memory count: N | sidecar rootfs counter: R | sidecar connection: C`, or the
    /// error.
    pub fn report(&mut self) -> String {
        match self.call() {
            Ok(body) => {
                let field = |name: &str| {
                    body.split('|')
                        .find_map(|f| f.trim().strip_prefix(name))
                        .unwrap_or("?")
                        .to_string()
                };
                format!(
                    " | sidecar memory count: {} | sidecar rootfs counter: {} | sidecar connection: {}",
                    field("preserved memory count: "),
                    field("preserved rootfs counter: "),
                    self.opened
                )
            }
            Err(e) => format!(" | sidecar error: {e}"),
        }
    }

    /// `POST /sidecar-exit?code=N` on the counter: the sidecar is asked to exit with code N.
    pub fn exit(&mut self, query: &str) -> io::Result<String> {
        let stream = TcpStream::connect(&self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut conn = BufReader::new(stream);
        request(&mut conn, &format!("POST /exit?{query}"))
    }

    fn call(&mut self) -> io::Result<String> {
        // One retry on a fresh connection: a kept connection may have been closed meanwhile.
        for attempt in 0..2 {
            if self.conn.is_none() {
                let stream = TcpStream::connect(&self.addr)?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                self.conn = Some(BufReader::new(stream));
                self.opened += 1;
            }
            match self.conn.as_mut().map(|c| request(c, "GET /")) {
                Some(Ok(body)) => return Ok(body),
                Some(Err(e)) if attempt == 1 => return Err(e),
                _ => self.conn = None,
            }
        }
        Err(io::Error::other("unreachable"))
    }
}

fn request(conn: &mut BufReader<TcpStream>, line: &str) -> io::Result<String> {
    conn.get_mut().write_all(
        format!("{line} HTTP/1.1\r\nHost: sidecar\r\nContent-Length: 0\r\n\r\n").as_bytes(),
    )?;
    let mut length = 0usize;
    let mut status = String::new();
    conn.read_line(&mut status)?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(io::Error::other(format!(
            "sidecar answered {:?}",
            status.trim()
        )));
    }
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line)? == 0 {
            return Err(io::Error::other("sidecar closed the connection"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().map_err(io::Error::other)?;
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    conn.read_exact(&mut body)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}
