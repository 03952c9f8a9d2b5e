//! Wakeup probe: HTTP GET inside the actor's namespace until it answers 200.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Result, SandboxError};
use ate_netns::{ACTOR_IP, connect_in_netns_timeout};

/// Pause between attempts: short, because restore → first answer is the latency we sell.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(15);

/// Polls `GET path` on `169.254.17.2:port` inside `netns` until a 200 or `timeout`; returns the
/// time from the call to the first 200.
pub async fn wait_ready(netns: &str, port: u16, path: &str, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    let deadline = start + timeout;
    let addr = SocketAddr::new(ACTOR_IP.into(), port);
    let mut last = String::from("no attempt made");
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match tokio::time::timeout(
            deadline - now,
            get_status(netns, addr, path, deadline - now),
        )
        .await
        {
            Ok(Ok(200)) => return Ok(start.elapsed()),
            Ok(Ok(status)) => last = format!("HTTP {status}"),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => {
                last = "attempt timed out".to_string();
                break;
            }
        }
        let now = Instant::now();
        if now + PROBE_INTERVAL >= deadline {
            break;
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    Err(SandboxError::ProbeTimeout {
        path: path.to_string(),
        port,
        timeout,
        last,
    })
}

/// One `GET` with `Connection: close`; returns the status code from the status line.
pub async fn get_status(
    netns: &str,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<u16> {
    let (status, _) = get(netns, addr, path, timeout).await?;
    Ok(status)
}

/// One `GET` with `Connection: close`; returns the status code and the body (the whole reply
/// after the header block; no chunked decoding — enough for probes and tests).
pub async fn get(
    netns: &str,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let work = async {
        let mut stream = connect_in_netns_timeout(netns, addr, timeout).await?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: ate-probe\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut reply = Vec::with_capacity(512);
        // Bounded: a probe never needs more than a small reply.
        let mut limited = (&mut stream).take(1 << 20);
        limited.read_to_end(&mut reply).await?;
        parse_reply(&reply)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("GET {path} on {addr} timed out"),
        )),
    }
}

fn parse_reply(reply: &[u8]) -> std::io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(reply);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or("");
    let code = parts.next().and_then(|c| c.parse::<u16>().ok());
    match code {
        Some(code) if version.starts_with("HTTP/1.") => {
            let body = text
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default();
            Ok((code, body))
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not an HTTP/1 status line: {:?}", ate_cmd::tail(line, 80)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_body() {
        let r = parse_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").ok();
        assert_eq!(r, Some((200, "hi".to_string())));
        assert!(parse_reply(b"SSH-2.0-OpenSSH").is_err());
        assert!(parse_reply(b"").is_err());
    }
}
