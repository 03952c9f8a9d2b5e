//! Metric names (the spec's two `atenet.router.parking.*` series in Prometheus form, the rest
//! under `ate_router_`), their descriptions, the process-wide Prometheus recorder (shared with
//! the other components: [`ate_telemetry`]), and in-process counters that tests (and
//! `/healthz`) read without parsing text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use ate_telemetry::PrometheusHandle;
use metrics::Unit;

/// The spec's `atenet.router.parking.active`: requests parked now.
pub const PARKING_ACTIVE: &str = "atenet_router_parking_active";
/// The spec's `atenet.router.parking.rejected`: requests refused because the lot was full.
pub const PARKING_REJECTED: &str = "atenet_router_parking_rejected_total";
pub const PARKING_WAIT: &str = "ate_router_parking_wait_seconds";
pub const RESOLVE_SECONDS: &str = "ate_router_resolve_duration_seconds";
pub const FORWARD_SECONDS: &str = "ate_router_forward_duration_seconds";
pub const REQUESTS: &str = "ate_router_requests_total";
pub const RESUME_CALLS: &str = "ate_router_resume_calls_total";
pub const STALE_RETRIES: &str = "ate_router_stale_assignment_retries_total";
pub const TUNNEL_CONNECTS: &str = "ate_router_tunnel_connects_total";
pub const TUNNEL_REUSES: &str = "ate_router_tunnel_reuses_total";
pub const TUNNEL_HANDOFFS: &str = "ate_router_tunnel_handoffs_total";
/// Requests refused by the ingress policy (`--ingress-auth-mode`), by status (401, 403). TLS
/// handshakes refused for a missing or unlisted certificate never become requests; they are
/// logged ("TLS handshake refused").
pub const INGRESS_REFUSED: &str = "ate_router_ingress_refused_total";

/// Every series of the router with its help text (`# HELP` / `# TYPE` on `/metrics`).
pub fn describe() {
    metrics::describe_counter!(
        crate::callers::ACTOR_CALLS,
        Unit::Count,
        "Calls from one actor to another (from a worker's internal connection), by the caller policy's verdict (verdict: allowed, denied)."
    );
    metrics::describe_counter!(
        INGRESS_REFUSED,
        Unit::Count,
        "Requests refused by --ingress-auth-mode (status: 401 missing or bad credentials, 403 token not allowed for the actor)."
    );
    metrics::describe_counter!(
        crate::access_log::DROPPED_METRIC,
        Unit::Count,
        "Access log lines dropped because the writer fell behind (--access-log; requests never wait for it)."
    );
    metrics::describe_gauge!(
        crate::proxy::WEBSOCKETS_OPEN,
        Unit::Count,
        "Client WebSockets the router terminates for actors with webSockets: hibernate (awake or hibernated)."
    );
    metrics::describe_gauge!(
        crate::proxy::WEBSOCKETS_HIBERNATED,
        Unit::Count,
        "Of those, the ones whose actor side is closed now (the actor sleeps); the next client message wakes it."
    );
    metrics::describe_counter!(
        crate::proxy::WEBSOCKET_WAKES,
        Unit::Count,
        "Upstream WebSockets opened again for a client message, by outcome (woken, refused, failed)."
    );
    metrics::describe_gauge!(
        PARKING_ACTIVE,
        Unit::Count,
        "Requests parked now, waiting for their actor's resume (spec: atenet.router.parking.active)."
    );
    metrics::describe_counter!(
        PARKING_REJECTED,
        Unit::Count,
        "Requests answered 503 at once because the parking lot was full (spec: atenet.router.parking.rejected)."
    );
    metrics::describe_histogram!(
        PARKING_WAIT,
        Unit::Seconds,
        "Time a request spent parked, by how the wait ended (outcome: served, timeout, canceled, error)."
    );
    metrics::describe_histogram!(
        RESOLVE_SECONDS,
        Unit::Seconds,
        "Time to find a request's worker: assignment cache hit, or a ResumeActor call (parking included)."
    );
    metrics::describe_histogram!(
        FORWARD_SECONDS,
        Unit::Seconds,
        "Time from sending a request to the worker's atunnel to its response head."
    );
    metrics::describe_counter!(
        REQUESTS,
        Unit::Count,
        "Requests answered by the router, by HTTP status code (status: exact for common codes, else 1xx..5xx)."
    );
    metrics::describe_counter!(
        RESUME_CALLS,
        Unit::Count,
        "ResumeActor calls the router made to the api (one per actor per wake-up, shared by the requests waiting on it)."
    );
    metrics::describe_counter!(
        STALE_RETRIES,
        Unit::Count,
        "Requests retried after the worker answered 421 (a stale cached assignment, or an actor suspending)."
    );
    metrics::describe_counter!(
        TUNNEL_CONNECTS,
        Unit::Count,
        "New atunnel connections (TCP + TLS + HTTP/2) the router opened to workers."
    );
    metrics::describe_counter!(
        TUNNEL_REUSES,
        Unit::Count,
        "Requests sent over an already open atunnel connection."
    );
    metrics::describe_counter!(
        TUNNEL_HANDOFFS,
        Unit::Count,
        "Tunnels taken as the actor's own socket from a worker on this machine (--local-tunnels) instead of a CONNECT stream."
    );
    // Present (at zero) from the start: alerts and rate() need the series before the first event.
    metrics::gauge!(PARKING_ACTIVE).increment(0.0);
    metrics::counter!(PARKING_REJECTED).increment(0);
    metrics::counter!(RESUME_CALLS).increment(0);
    metrics::counter!(STALE_RETRIES).increment(0);
}

/// The Prometheus handle behind `/metrics`. Installed once per process; if the embedding binary
/// already installed another recorder, ours renders only the process series.
pub fn prometheus() -> &'static PrometheusHandle {
    ate_telemetry::install("router", describe)
}

/// Exports `stats`' tunnel counters (kept by the tunnel pool, which has no recorder calls of its
/// own) at every scrape, for as long as the router holding them lives.
pub fn export_tunnel_stats(stats: &Arc<Stats>) {
    let stats: Weak<Stats> = Arc::downgrade(stats);
    ate_telemetry::on_scrape(move || {
        let Some(stats) = stats.upgrade() else {
            return false;
        };
        metrics::counter!(TUNNEL_CONNECTS).absolute(Stats::get(&stats.tunnel_connects));
        metrics::counter!(TUNNEL_REUSES).absolute(Stats::get(&stats.tunnel_reuses));
        metrics::counter!(TUNNEL_HANDOFFS).absolute(Stats::get(&stats.tunnel_handoffs));
        true
    });
}

/// Counters of one router instance, read by tests and logs.
#[derive(Debug, Default)]
pub struct Stats {
    pub resume_calls: AtomicU64,
    pub parking_active: AtomicU64,
    pub parking_rejected: AtomicU64,
    pub stale_retries: AtomicU64,
    pub tunnel_connects: AtomicU64,
    pub tunnel_reuses: AtomicU64,
    /// Tunnels taken as the actor's socket from a worker on this machine (`--local-tunnels`).
    pub tunnel_handoffs: AtomicU64,
}

impl Stats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The `status` label values of [`REQUESTS`]: common codes exactly, others by class.
const STATUS_LABELS: [&str; 22] = [
    "101", "200", "201", "204", "301", "302", "304", "400", "401", "403", "404", "414", "421",
    "500", "502", "503", "504", "1xx", "2xx", "3xx", "4xx", "5xx",
];

/// Where `status` stands in [`STATUS_LABELS`].
fn status_slot(status: http::StatusCode) -> usize {
    #[allow(clippy::match_overlapping_arm)] // exact codes first, then the class
    match status.as_u16() {
        101 => 0,
        200 => 1,
        201 => 2,
        204 => 3,
        301 => 4,
        302 => 5,
        304 => 6,
        400 => 7,
        401 => 8,
        403 => 9,
        404 => 10,
        414 => 11,
        421 => 12,
        500 => 13,
        502 => 14,
        503 => 15,
        504 => 16,
        100..=199 => 17,
        200..=299 => 18,
        300..=399 => 19,
        400..=499 => 20,
        _ => 21,
    }
}

/// A `&'static str` label for common status codes (no allocation per request); others by class.
pub fn status_label(status: http::StatusCode) -> &'static str {
    STATUS_LABELS[status_slot(status)]
}

/// The series every request touches, looked up once. A `counter!`/`histogram!` call hashes its
/// key, takes a registry shard's lock and allocates a new handle each time (five allocations per
/// request between them); a handle kept here records straight into the series.
pub struct RequestMetrics {
    resolve: metrics::Histogram,
    forward: metrics::Histogram,
    /// One per [`STATUS_LABELS`] entry, registered on the first answer with that status (a
    /// series appears on `/metrics` once it has counted something, as with `counter!`).
    requests: [OnceLock<metrics::Counter>; STATUS_LABELS.len()],
}

impl RequestMetrics {
    /// Binds to the process's recorder, which this installs if nothing has yet (a handle taken
    /// before would stay bound to the no-op recorder).
    pub fn new() -> Self {
        prometheus();
        Self {
            resolve: metrics::histogram!(RESOLVE_SECONDS),
            forward: metrics::histogram!(FORWARD_SECONDS),
            requests: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    pub fn resolved(&self, took: Duration) {
        self.resolve.record(took.as_secs_f64());
    }

    pub fn forwarded(&self, took: Duration) {
        self.forward.record(took.as_secs_f64());
    }

    pub fn answered(&self, status: http::StatusCode) {
        let slot = status_slot(status);
        self.requests[slot]
            .get_or_init(|| metrics::counter!(REQUESTS, "status" => STATUS_LABELS[slot]))
            .increment(1);
    }
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for RequestMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestMetrics")
    }
}
