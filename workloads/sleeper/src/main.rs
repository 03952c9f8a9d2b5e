//! The demo sleeper actor: holds `$SLEEPER_MEMORY_MIB` MiB (default 50) of pseudo-random memory so
//! that memory snapshots have real weight, and reports a checksum over it.
//!
//! The pattern is seeded from the clock and PID at start, so a cold start gives a different checksum
//! while a memory restore gives the same one.
//!
//! - `GET /healthz` → `ok`.
//! - `GET /dirty?percent=P` (P a decimal number, 0 < P <= 100, e.g. `1` or `0.5`) → rewrites one
//!   u64 word in each of P % of the held 4 KiB pages (rounded up, so at least one page), spread
//!   evenly over the whole buffer, with new pseudo-random values (the generator continues from the
//!   start-up fill, so the values differ on every call), then answers
//!   `dirtied N pages, checksum X` with X the new checksum over all held memory.  Lets a benchmark
//!   time a suspend when only a small share of the memory changed since the previous snapshot.
//!   A missing or invalid `percent` → 400.
//! - `GET /tail?percent=P` → reads only the last P % of the held memory (a working set at the end
//!   of the buffer, which a lazy restore's push in address order reaches last) and answers
//!   `tail N pages, checksum X` over those pages. Lets a benchmark time a first request that needs
//!   part of the memory. A missing or invalid `percent` → 400.
//! - any other request → `sleeper holding N MiB, checksum X` (X: 16 hex digits, computed over the
//!   held memory on every request).
//!
//! Listens on `$BIND_ADDR:$PORT` (0.0.0.0:80).

#[path = "../../common/http.rs"]
mod http;

use http::{Request, Response};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bytes per page as counted by `/dirty`.
const PAGE_BYTES: usize = 4096;
const WORDS_PER_PAGE: usize = PAGE_BYTES / 8;
/// `/dirty` shares are kept as parts per billion, so the page arithmetic is exact integer math.
const PPB: u64 = 1_000_000_000;

/// The held memory and the generator state that produced it.  The HTTP server runs one thread per
/// connection, so both sit behind one lock.
struct Memory {
    words: Vec<u64>,
    rng: u64,
}

struct Held {
    mib: usize,
    memory: Mutex<Memory>,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, Memory> {
        // A panic while holding the lock cannot leave the words inconsistent: keep serving.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

fn fill(mib: usize) -> Memory {
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
    Memory { words, rng: state }
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

/// Parse the `percent` query parameter into parts per billion of the pages: a decimal number with
/// 0 < P <= 100.  A positive share too small to represent still counts as 1 ppb (one page).
fn parse_percent(query: &str) -> Result<u64, String> {
    const USAGE: &str = "a number with 0 < percent <= 100, e.g. /dirty?percent=1";
    let value = query
        .split('&')
        .find_map(|kv| match kv.split_once('=') {
            Some(("percent", v)) => Some(v),
            None if kv == "percent" => Some(""),
            _ => None,
        })
        .ok_or_else(|| format!("missing query parameter `percent` ({USAGE})"))?;
    let p: f64 = value
        .trim()
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite() && *p > 0.0 && *p <= 100.0)
        .ok_or_else(|| format!("invalid query parameter percent={value:?} ({USAGE})"))?;
    Ok(((p / 100.0 * PPB as f64).round() as u64).clamp(1, PPB))
}

/// The pages `/dirty` rewrites: `ceil(pages * ppb / 1e9)` of them (every page at 100 %), page
/// `j * pages / count` for j in 0..count, i.e. on an even stride of `pages / count` starting at
/// page 0 and reaching to the end of the buffer.
fn dirty_pages(pages: usize, ppb: u64) -> impl Iterator<Item = usize> {
    let pages = pages as u128;
    let count = (pages * ppb as u128).div_ceil(PPB as u128).min(pages);
    (0..count).map(move |j| (j * pages / count) as usize)
}

/// Rewrite one word in each selected page with fresh generator output; returns the number of pages.
fn dirty(memory: &mut Memory, ppb: u64) -> usize {
    let Memory { words, rng } = memory;
    let mut n = 0;
    // Word 0 of each 4 KiB block of the buffer: consecutive blocks are 4 KiB apart, so whatever
    // the buffer's alignment every selected block puts its word into a different OS page.
    for page in dirty_pages(words.len() / WORDS_PER_PAGE, ppb) {
        words[page * WORDS_PER_PAGE] = xorshift(rng);
        n += 1;
    }
    n
}

/// Pages in the last `ppb` parts per billion of `words` (rounded up) and the checksum over them.
fn tail_checksum(words: &[u64], ppb: u64) -> (usize, u64) {
    let pages = words.len() / WORDS_PER_PAGE;
    let n = ((pages as u128 * ppb as u128).div_ceil(PPB as u128) as usize).clamp(1, pages.max(1));
    let start = pages.saturating_sub(n) * WORDS_PER_PAGE;
    (n.min(pages), checksum(&words[start..]))
}

fn handle(held: &Held, req: &Request) -> Response {
    match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        "/dirty" => match parse_percent(&req.query) {
            Ok(ppb) => {
                let mut memory = held.lock();
                let n = dirty(&mut memory, ppb);
                let sum = checksum(&memory.words);
                drop(memory);
                Response::text(200, format!("dirtied {n} pages, checksum {sum:016x}"))
            }
            Err(msg) => Response::text(400, format!("{msg}\n")),
        },
        "/tail" => match parse_percent(&req.query) {
            Ok(ppb) => {
                let memory = held.lock();
                let (pages, sum) = tail_checksum(&memory.words, ppb);
                drop(memory);
                Response::text(200, format!("tail {pages} pages, checksum {sum:016x}"))
            }
            Err(msg) => Response::text(400, format!("{msg}\n")),
        },
        _ => {
            let sum = checksum(&held.lock().words);
            Response::text(
                200,
                format!("sleeper holding {} MiB, checksum {sum:016x}", held.mib),
            )
        }
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
    let memory = fill(mib);
    let initial = checksum(&memory.words);
    let held = Arc::new(Held {
        mib,
        memory: Mutex::new(memory),
    });
    let port = http::env_port("PORT", 80).unwrap_or(80);
    let addr = http::bind_addr(port);
    let listener = http::bind(addr);
    http::log(&format!(
        "sleeper holding {mib} MiB (checksum {initial:016x}), listening on {addr}"
    ));
    let handler: Arc<http::Handler> = Arc::new(move |req: &Request| handle(&held, req));
    http::serve(listener, handler);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(n: usize, ppb: u64) -> Vec<usize> {
        dirty_pages(n, ppb).collect()
    }

    #[test]
    fn one_percent_of_2048_pages_is_spread_over_the_buffer() {
        let ppb = parse_percent("percent=1").unwrap();
        assert_eq!(ppb, PPB / 100);
        let sel = pages(2048, ppb);
        assert!(sel.len() == 20 || sel.len() == 21, "{} pages", sel.len());
        assert_eq!(sel[0], 0);
        // Strictly increasing, in range, on an even stride (2048 / 21 ≈ 97.5 → gaps of 97 or 98),
        // and the last one near the end of the buffer.
        for w in sel.windows(2) {
            let gap = w[1] - w[0];
            assert!((97..=103).contains(&gap), "gap {gap} in {sel:?}");
        }
        assert!(*sel.last().unwrap() < 2048);
        assert!(*sel.last().unwrap() >= 2048 - 103, "{sel:?}");
    }

    #[test]
    fn hundred_percent_is_every_page() {
        let ppb = parse_percent("percent=100").unwrap();
        assert_eq!(pages(2048, ppb), (0..2048).collect::<Vec<_>>());
    }

    #[test]
    fn small_shares_still_dirty_a_page() {
        assert_eq!(pages(2048, parse_percent("percent=0.5").unwrap()).len(), 11);
        assert_eq!(
            pages(2048, parse_percent("percent=0.0000001").unwrap()),
            vec![0]
        );
        assert_eq!(pages(0, PPB).len(), 0);
    }

    #[test]
    fn tail_reads_the_last_share_of_the_pages() {
        let words: Vec<u64> = (0..(WORDS_PER_PAGE * 100) as u64).collect();
        let (n, sum) = tail_checksum(&words, PPB / 10);
        assert_eq!(n, 10);
        assert_eq!(sum, checksum(&words[90 * WORDS_PER_PAGE..]));
        assert_eq!(tail_checksum(&words, PPB).0, 100);
        assert_eq!(tail_checksum(&words, 1).0, 1);
    }

    #[test]
    fn percent_parsing() {
        assert_eq!(parse_percent("x=1&percent=50"), Ok(PPB / 2));
        assert_eq!(parse_percent("percent=0.5"), Ok(PPB / 200));
        for bad in [
            "",
            "percent",
            "percent=",
            "percent=0",
            "percent=-1",
            "percent=100.1",
            "percent=abc",
            "percent=nan",
            "percent=inf",
            "pct=1",
        ] {
            let err = parse_percent(bad).unwrap_err();
            assert!(
                err.contains("percent") && !err.contains('\n'),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn dirty_changes_only_the_selected_words() {
        let mut memory = fill(1);
        let before = memory.words.clone();
        let sum = checksum(&memory.words);
        let n = dirty(&mut memory, PPB / 100);
        assert_eq!(n, 3); // 256 pages → ceil(2.56)
        assert_ne!(checksum(&memory.words), sum);
        let changed: Vec<usize> = (0..before.len())
            .filter(|&i| before[i] != memory.words[i])
            .collect();
        assert_eq!(changed, vec![0, 85 * WORDS_PER_PAGE, 170 * WORDS_PER_PAGE]);
    }
}
