//! The optional access log (`--access-log stdout|stderr|<file>`): one JSON line per request.
//!
//! The data path never waits for it: a request hands its [`Entry`] to a bounded channel with
//! `try_send`, and a thread of its own formats and writes the lines (buffered, flushed whenever
//! the channel is empty). When the channel is full the line is dropped and counted
//! ([`AccessLog::dropped`], metric `ate_router_access_log_dropped_total`, a warning at every
//! power of two).
//!
//! A line (keys in this order; `trace_id`, `resume`, `resolve_ms`, `forward_ms` and `bytes` only
//! when known):
//!
//! ```text
//! {"time":"2025-06-01T12:00:00.123Z","request_id":"test-123","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","actor":"ate-demo/counter","method":"GET","path":"/","status":200,"resume":"cold","duration_ms":412.501,"resolve_ms":410.2,"forward_ms":2.187,"bytes":86}
//! ```
//!
//! `time` is when the request arrived (UTC, milliseconds); `path` is without the query;
//! `duration_ms` runs from the request's arrival to its response head; `resolve_ms` is the time
//! spent finding (or waking) the actor (parking included, and the resolution again after a stale
//! route), `forward_ms` the time from sending the request to the actor to its response head (the
//! last attempt); `bytes` is the response body's size when it is known up front
//! (`content-length`, or a body the router wrote). `actor` is empty when the request named no
//! valid actor. `caller` (after `actor`, only on calls from another actor) is the calling actor.
//! `trace_id` is the request span's (traces on) or the client's `traceparent`'s (traces off), as
//! on the router's log lines for the request.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

/// Lines waiting for the writer at most; more are dropped.
pub const CAPACITY: usize = 8192;

/// Metric counting dropped lines.
pub const DROPPED_METRIC: &str = "ate_router_access_log_dropped_total";

/// One request, as the access log records it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub time: SystemTime,
    pub request_id: String,
    pub trace_id: Option<ate_telemetry::trace_context::TraceId>,
    /// `<atespace>/<name>`; empty when the request named no valid actor.
    pub actor: String,
    /// For a call from another actor (`ate-caller-actor`, from a worker): the caller.
    pub caller: Option<String>,
    pub method: http::Method,
    pub path: String,
    pub status: u16,
    /// `cold`, `warm` or `parked` (the `ate-resume` header) when the actor was found.
    pub resume: Option<&'static str>,
    pub duration: Duration,
    pub resolve: Option<Duration>,
    pub forward: Option<Duration>,
    pub bytes: Option<u64>,
}

/// The sending side of the access log; cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
    tx: mpsc::Sender<Entry>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl AccessLog {
    /// The access log `--access-log` names: `stdout`, `stderr`, or a file (created if needed,
    /// appended to).
    pub fn open(target: &str) -> std::io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = match target {
            "stdout" => Box::new(std::io::stdout()),
            "stderr" => Box::new(std::io::stderr()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        Self::to_writer(out, CAPACITY)
    }

    /// An access log writing to `out` from a thread of its own, holding at most `capacity`
    /// lines not yet written. The thread ends (after writing what is left) once every
    /// [`AccessLog`] clone is gone.
    pub fn to_writer(out: Box<dyn Write + Send>, capacity: usize) -> std::io::Result<AccessLog> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx, out))?;
        Ok(AccessLog {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Hands `entry` to the writer; never waits. Dropped (and counted) when the writer is behind.
    pub fn record(&self, entry: Entry) {
        if self.tx.try_send(entry).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            metrics::counter!(DROPPED_METRIC).increment(1);
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "access log writer is behind; lines dropped");
            }
        }
    }

    /// Lines dropped so far because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn write_lines(mut rx: mpsc::Receiver<Entry>, out: Box<dyn Write + Send>) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    let mut line = String::with_capacity(512);
    let mut failed = false;
    while let Some(entry) = rx.blocking_recv() {
        let mut next = Some(entry);
        while let Some(entry) = next {
            line.clear();
            format_line(&entry, &mut line);
            if let Err(e) = out.write_all(line.as_bytes())
                && !failed
            {
                failed = true;
                tracing::warn!(error = %e, "cannot write the access log");
            }
            next = rx.try_recv().ok();
        }
        // Nothing waiting: make what was written visible.
        if let Err(e) = out.flush()
            && !failed
        {
            failed = true;
            tracing::warn!(error = %e, "cannot write the access log");
        }
    }
    let _ = out.flush();
}

/// Appends `entry` as one JSON line (with its newline) to `out`.
pub fn format_line(entry: &Entry, out: &mut String) {
    use std::fmt::Write as _;
    out.push_str("{\"time\":\"");
    rfc3339_millis(entry.time, out);
    out.push_str("\",\"request_id\":");
    json_str(&entry.request_id, out);
    if let Some(id) = entry.trace_id {
        let _ = write!(out, ",\"trace_id\":\"{id}\"");
    }
    out.push_str(",\"actor\":");
    json_str(&entry.actor, out);
    if let Some(caller) = &entry.caller {
        out.push_str(",\"caller\":");
        json_str(caller, out);
    }
    out.push_str(",\"method\":");
    json_str(entry.method.as_str(), out);
    out.push_str(",\"path\":");
    json_str(&entry.path, out);
    let _ = write!(out, ",\"status\":{}", entry.status);
    if let Some(resume) = entry.resume {
        out.push_str(",\"resume\":");
        json_str(resume, out);
    }
    let _ = write!(out, ",\"duration_ms\":{}", millis(entry.duration));
    if let Some(d) = entry.resolve {
        let _ = write!(out, ",\"resolve_ms\":{}", millis(d));
    }
    if let Some(d) = entry.forward {
        let _ = write!(out, ",\"forward_ms\":{}", millis(d));
    }
    if let Some(bytes) = entry.bytes {
        let _ = write!(out, ",\"bytes\":{bytes}");
    }
    out.push_str("}\n");
}

/// Milliseconds with microsecond precision, as a JSON number.
fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// `s` as a JSON string (quotes included).
fn json_str(s: &str, out: &mut String) {
    use std::fmt::Write as _;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `time` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC); times before 1970 as the epoch.
fn rfc3339_millis(time: SystemTime, out: &mut String) {
    use std::fmt::Write as _;
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    );
}

/// The proleptic Gregorian date `days` after 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            time: UNIX_EPOCH + Duration::from_millis(1_748_779_200_123),
            request_id: "test-123".into(),
            trace_id: ate_telemetry::trace_context::TraceId::from_traceparent(
                b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            actor: "ate-demo/counter".into(),
            caller: None,
            method: http::Method::GET,
            path: "/a\"b\\c".into(),
            status: 200,
            resume: Some("cold"),
            duration: Duration::from_micros(412_501),
            resolve: Some(Duration::from_micros(410_200)),
            forward: Some(Duration::from_micros(2_187)),
            bytes: Some(86),
        }
    }

    #[test]
    fn lines() {
        let mut line = String::new();
        format_line(&entry(), &mut line);
        assert_eq!(
            line,
            "{\"time\":\"2025-06-01T12:00:00.123Z\",\"request_id\":\"test-123\",\
             \"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\",\"actor\":\"ate-demo/counter\",\"method\":\"GET\",\"path\":\"/a\\\"b\\\\c\",\
             \"status\":200,\"resume\":\"cold\",\"duration_ms\":412.501,\"resolve_ms\":410.2,\
             \"forward_ms\":2.187,\"bytes\":86}\n"
        );
        let mut e = entry();
        e.resume = None;
        e.trace_id = None;
        e.resolve = None;
        e.forward = None;
        e.bytes = None;
        e.path = "/\u{1}".into();
        line.clear();
        format_line(&e, &mut line);
        assert!(line.ends_with("\"path\":\"/\\u0001\",\"status\":200,\"duration_ms\":412.501}\n"));
        e.caller = Some("n1/a".into());
        line.clear();
        format_line(&e, &mut line);
        assert!(
            line.contains("\"actor\":\"ate-demo/counter\",\"caller\":\"n1/a\",\"method\""),
            "{line}"
        );
    }

    #[test]
    fn dates() {
        let at = |secs: u64| {
            let mut s = String::new();
            rfc3339_millis(UNIX_EPOCH + Duration::from_secs(secs), &mut s);
            s
        };
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59.000Z");
        assert_eq!(at(1_709_208_000), "2024-02-29T12:00:00.000Z");
    }

    /// A writer that never finishes a write: the channel fills, lines are dropped, `record`
    /// never waits.
    #[test]
    fn a_stuck_writer_drops_lines_without_blocking() {
        struct Stuck(std::sync::mpsc::Receiver<()>);
        impl Write for Stuck {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let _ = self.0.recv();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (release, stuck) = std::sync::mpsc::channel();
        let log = AccessLog::to_writer(Box::new(Stuck(stuck)), 4).unwrap();
        let started = std::time::Instant::now();
        for _ in 0..10_000 {
            log.record(entry());
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        // Only what the channel and the writer's buffer hold was taken.
        assert!(log.dropped() > 9_000, "{}", log.dropped());
        drop(release);
    }
}
