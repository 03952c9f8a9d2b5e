//! Metric names (the spec's `atenet.router.*` in Prometheus form), the process-wide Prometheus
//! recorder, and in-process counters that tests (and `/healthz`) read without parsing text.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub const PARKING_ACTIVE: &str = "atenet_router_parking_active";
pub const PARKING_REJECTED: &str = "atenet_router_parking_rejected_total";
pub const PARKING_WAIT: &str = "atenet_router_parking_wait_seconds";
pub const RESOLVE_SECONDS: &str = "atenet_router_resolve_duration_seconds";
pub const FORWARD_SECONDS: &str = "atenet_router_forward_duration_seconds";
pub const REQUESTS: &str = "atenet_router_requests_total";
pub const RESUME_CALLS: &str = "atenet_router_resume_calls_total";
pub const STALE_RETRIES: &str = "atenet_router_stale_assignment_retries_total";

const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 30.0,
];

/// The Prometheus handle behind `/metrics`. Installed once per process; if the embedding binary
/// already installed another recorder, ours renders only what it was given (nothing).
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new();
        let builder = builder
            .set_buckets(BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics shows only ours");
        }
        handle
    })
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
}

impl Stats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// A `&'static str` label for common status codes (no allocation per request); others by class.
pub fn status_label(status: http::StatusCode) -> &'static str {
    #[allow(clippy::match_overlapping_arm)] // exact codes first, then the class
    match status.as_u16() {
        101 => "101",
        200 => "200",
        201 => "201",
        204 => "204",
        301 => "301",
        302 => "302",
        304 => "304",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        414 => "414",
        421 => "421",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
