//! The TCP table check before a memory dump with sidecars: the actor's connections to peers
//! outside it (closed tunnels left in CLOSE_WAIT) get a moment to close, as CRIU would restore
//! them under TCP repair with their peer gone.

use std::time::{Duration, Instant};

/// Waits until the actor's network namespace has no TCP socket other than listeners, TIME_WAIT
/// remnants and connections between two loopback addresses (closed tunnels leave the actor's
/// end in CLOSE_WAIT until it closes it; with sidecars CRIU would restore such a socket under
/// TCP repair, its peer gone). Gives up after `timeout`: the dump takes what is left.
pub(super) async fn wait_tcp_quiet(pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        match busy_tcp_sockets(pid) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if Instant::now() >= deadline {
                    tracing::warn!(
                        pid,
                        sockets = n,
                        "actor still has TCP connections before the dump"
                    );
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Connected-ish TCP sockets in `pid`'s network namespace (`/proc/<pid>/net/tcp{,6}`), not
/// counting those between two loopback addresses (inside the actor's netns, both ends belong
/// to the actor).
fn busy_tcp_sockets(pid: u32) -> std::io::Result<usize> {
    const LISTEN: &str = "0A";
    const TIME_WAIT: &str = "06";
    let mut busy = 0;
    for file in ["tcp", "tcp6"] {
        let text = match std::fs::read_to_string(format!("/proc/{pid}/net/{file}")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file == "tcp6" => continue,
            Err(e) => return Err(e),
        };
        busy += text
            .lines()
            .skip(1)
            .filter(|l| {
                let fields: Vec<&str> = l.split_whitespace().take(4).collect();
                let [_, local, remote, state] = fields[..] else {
                    return false;
                };
                state != LISTEN
                    && state != TIME_WAIT
                    && !(is_loopback(local) && is_loopback(remote))
            })
            .count();
    }
    Ok(busy)
}

/// `/proc/net/tcp{,6}` address `HEX:PORT` on loopback: 127.0.0.0/8 (IPv4 in host byte order:
/// the first octet is the last hex pair), ::1, or ::ffff:127.x.y.z.
fn is_loopback(addr: &str) -> bool {
    let ip = addr.split(':').next().unwrap_or("");
    match ip.len() {
        8 => ip.ends_with("7F"),
        32 => {
            ip == "00000000000000000000000001000000"
                || (ip.starts_with("0000000000000000FFFF0000") && ip.ends_with("7F"))
        }
        _ => false,
    }
}
