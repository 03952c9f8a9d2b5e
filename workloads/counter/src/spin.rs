//! `GET /spin?seconds=N[&threads=T]`: a CPU hog for the noisy-neighbour bench (`ate bench noisy`).
//!
//! Starts T threads (default: the cores this process may use, `available_parallelism`) that spin
//! on arithmetic for N seconds (at most 600), and answers at once `spinning T threads for N s`.
//! `seconds=0` stops every spin still running (they check a shared stop counter each iteration).
//! A new spin does not stop an older one: each ends at its own deadline.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::http::Response;

/// Bumped by `seconds=0`: a spinning thread that sees it change stops.
static STOPS: AtomicU64 = AtomicU64::new(0);

const MAX_SECONDS: u64 = 600;
const MAX_THREADS: usize = 256;

pub fn handle(query: &str) -> Response {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    let Some(seconds) = param("seconds").and_then(|s| s.parse::<u64>().ok()) else {
        return Response::text(400, "use /spin?seconds=N[&threads=T]\n");
    };
    if seconds == 0 {
        STOPS.fetch_add(1, Ordering::SeqCst);
        return Response::text(200, "stopped\n");
    }
    let seconds = seconds.min(MAX_SECONDS);
    let threads = match param("threads") {
        Some(t) => match t.parse::<usize>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => n,
            _ => return Response::text(400, format!("threads: 1 to {MAX_THREADS}\n")),
        },
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let epoch = STOPS.load(Ordering::SeqCst);
    for i in 0..threads {
        let spawned = std::thread::Builder::new()
            .name(format!("spin-{i}"))
            .spawn(move || spin(deadline, epoch));
        if let Err(e) = spawned {
            return Response::text(500, format!("cannot start spin thread {i}: {e}\n"));
        }
    }
    Response::text(200, format!("spinning {threads} threads for {seconds} s\n"))
}

fn spin(deadline: Instant, epoch: u64) {
    let mut x: u64 = 1;
    while STOPS.load(Ordering::Relaxed) == epoch && Instant::now() < deadline {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}
