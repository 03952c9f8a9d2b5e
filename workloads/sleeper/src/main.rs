//! The demo sleeper actor: holds `$SLEEPER_MEMORY_MIB` MiB (default 50) of pseudo-random memory so
//! that memory snapshots have real weight, and reports a checksum over it.
//!
//! The pattern is seeded from the clock and PID at start, so a cold start gives a different checksum
//! while a memory restore gives the same one.
//!
//! `GET /healthz` → `ok`; any other request → `sleeper holding N MiB, checksum X` (X: 16 hex digits,
//! computed over the held memory on every request).  Listens on `$BIND_ADDR:$PORT` (0.0.0.0:80).

#[path = "../../common/http.rs"]
mod http;

use http::{Request, Response};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

struct Held {
    mib: usize,
    words: Vec<u64>,
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

fn fill(mib: usize) -> Vec<u64> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut state = (nanos ^ ((std::process::id() as u64) << 32)) | 1;
    let n = mib * 1024 * 1024 / 8;
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        words.push(xorshift(&mut state));
    }
    words
}

/// FNV-1a style mixing over 64-bit words: every word and its position count.
fn checksum(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &w in words {
        h ^= w;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn handle(held: &Held, req: &Request) -> Response {
    match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        _ => Response::text(
            200,
            format!(
                "sleeper holding {} MiB, checksum {:016x}",
                held.mib,
                checksum(&held.words)
            ),
        ),
    }
}

fn main() {
    http::exit_on_sigterm();
    let mib = match std::env::var("SLEEPER_MEMORY_MIB") {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(n) => n,
            Err(_) => {
                http::log(&format!("invalid SLEEPER_MEMORY_MIB={v:?}"));
                std::process::exit(2);
            }
        },
        _ => 50,
    };
    let held = Arc::new(Held {
        mib,
        words: fill(mib),
    });
    let port = http::env_port("PORT", 80).unwrap_or(80);
    let addr = http::bind_addr(port);
    let listener = http::bind(addr);
    http::log(&format!(
        "sleeper holding {mib} MiB (checksum {:016x}), listening on {addr}",
        checksum(&held.words)
    ));
    let handler: Arc<http::Handler> = Arc::new(move |req: &Request| handle(&held, req));
    http::serve(listener, handler);
}
