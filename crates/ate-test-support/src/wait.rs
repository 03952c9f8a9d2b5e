//! Polling until something holds, and the ready files components write once they listen.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Polls `f` every `every` until it returns Some; panics naming `what` after `within`.
pub fn wait_for<T>(
    what: &str,
    within: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}

/// Polls `done` every `every` until it is true; panics naming `what` after `within`.
pub fn wait_until(what: &str, within: Duration, every: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}

/// Polls `cond` every `every` for up to `within` without blocking the runtime; whether it held
/// (checked once more at the deadline).
pub async fn eventually(within: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(every).await;
    }
    cond()
}

/// Polls the async `check` every `every` until it returns Some, without blocking the runtime;
/// panics naming `what` after `within`. `check` may borrow what the test holds mutably (a
/// client) between polls.
pub async fn poll_until<T>(
    what: &str,
    within: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

/// The JSON in `path` once it is complete (a ready file is written whole, but may be read
/// while it is being written): None while absent or not yet valid JSON.
pub fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Waits up to `within` for the ready file `path` of the process `child`, polling every 50 ms;
/// panics with `"{who} exited early: {status}"` if the process ends first.
pub fn wait_for_ready_file(path: &Path, child: &mut Child, who: &str, within: Duration) -> Value {
    let start = Instant::now();
    loop {
        if let Some(v) = read_json(path) {
            return v;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{who} exited early: {status}");
        }
        assert!(start.elapsed() < within, "not ready in time");
        std::thread::sleep(Duration::from_millis(50));
    }
}
