//! Prometheus metrics shared by every component (api, router, node agent, worker): the
//! process-wide recorder, `ate_build_info`, the `process_*` series, and the operations endpoint
//! that serves `/metrics` and `/healthz`.
//!
//! A component calls [`install`] once at start with its name and a function that describes its
//! own series (`metrics::describe_*!`, so each gets `# HELP` and `# TYPE`), then either serves
//! [`serve`] on its operations listener or renders [`render`] from its own server. Every
//! histogram is rendered as a Prometheus histogram (never a summary): durations with
//! [`DURATION_BUCKETS`], series ending in `_bytes` with [`BYTES_BUCKETS`].
//!
//! Series names follow one scheme, `ate_<component>_…` (`ate_api_`, `ate_router_`, `ate_node_`,
//! `ate_worker_`), except the spec's two router series (`atenet_router_parking_active`,
//! `atenet_router_parking_rejected_total`) and the conventional `process_*` ones. No label of a
//! recorder series may take a value per actor (the recorder never forgets a series): per-actor
//! detail belongs in logs and traces, or in text rendered at each scrape by an [`on_render`]
//! hook, capped (the worker's `ate_worker_actor_*` families, `docs/observability.md`).
//!
//! The same text is what the OTLP metrics export sends (`ate-cli`'s `otel::metrics`, which
//! renders [`render`] on its own interval), so every series here reaches both.
//!
//! And [`trace_context`]: W3C trace context in and out of calls, and [`trace_span!`]. Every
//! component depends on this crate; it depends on no project crate.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod trace_context;

use std::collections::HashSet;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
/// The recorder's handle (re-exported: components need no exporter dependency of their own).
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::net::TcpListener;

/// Buckets of every duration histogram (seconds): 1 ms to 60 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of histograms whose name ends in `_bytes`: 64 KiB to 16 GiB, ×4 apart.
pub const BYTES_BUCKETS: &[f64] = &[
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
    268_435_456.0,
    1_073_741_824.0,
    4_294_967_296.0,
    17_179_869_184.0,
];

/// Finer buckets for histograms whose name starts with one of these prefixes (a warm path that
/// takes microseconds would otherwise land entirely in the first bucket).
pub const FINE_PREFIXES: &[&str] = &[
    "ate_router_resolve_duration_seconds",
    "ate_router_forward_duration_seconds",
];

/// [`DURATION_BUCKETS`] with three buckets below 1 ms, for [`FINE_PREFIXES`].
pub const FINE_DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// `ate_build_info{component, version} 1`.
pub const BUILD_INFO: &str = "ate_build_info";

/// The workspace version every component shares.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How often the recorder's histograms are compacted when nobody scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// A scrape hook: refreshes gauges from a component's state just before rendering. Returns
/// false once its component is gone (the hook is then dropped).
type Hook = Box<dyn Fn() -> bool + Send + Sync>;

struct State {
    handle: PrometheusHandle,
    /// False when another recorder was installed first: ours then renders nothing but the
    /// process series.
    ours: bool,
    components: Mutex<HashSet<&'static str>>,
}

/// Scrape hooks, apart from the recorder: registering one installs nothing (a process that
/// never serves `/metrics` keeps the no-op recorder, and no histogram grows unscraped).
static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// A render hook: whole metric families in the text format (with `# HELP` / `# TYPE`), made at
/// each render; `None` once its component is gone (the hook is then dropped).
type TextHook = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// Render hooks: series that must disappear when what they describe does (the recorder keeps
/// every series it ever saw), rendered after the recorder's and before the process series.
static TEXT_HOOKS: Mutex<Vec<TextHook>> = Mutex::new(Vec::new());

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let mut builder = PrometheusBuilder::new();
        // Only fails on empty bucket lists, which these are not.
        for prefix in FINE_PREFIXES {
            builder = builder
                .set_buckets_for_metric(
                    Matcher::Prefix((*prefix).to_string()),
                    FINE_DURATION_BUCKETS,
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
        }
        let builder = builder
            .set_buckets_for_metric(Matcher::Suffix("_bytes".to_string()), BYTES_BUCKETS)
            .and_then(|b| b.set_buckets(DURATION_BUCKETS))
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let ours = metrics::set_global_recorder(recorder).is_ok();
        if !ours {
            tracing::warn!(
                "a metrics recorder was already installed; /metrics shows only the process series"
            );
        }
        metrics::describe_gauge!(
            BUILD_INFO,
            metrics::Unit::Count,
            "Always 1; its labels name the component and its version."
        );
        State {
            handle,
            ours,
            components: Mutex::new(HashSet::new()),
        }
    })
}

/// Installs the process-wide recorder (once per process), sets `ate_build_info` for
/// `component` and runs `describe` (its `describe_*!` calls) the first time `component` is
/// installed. Later calls share the recorder; several components in one process (tests) each
/// get their own `ate_build_info` series.
pub fn install(component: &'static str, describe: fn()) -> &'static PrometheusHandle {
    let st = state();
    let first = lock(&st.components).insert(component);
    if first {
        metrics::gauge!(BUILD_INFO, "component" => component, "version" => VERSION).set(1.0);
        describe();
    }
    &st.handle
}

/// Runs `hook` before every render until it returns false (its component is gone).
pub fn on_scrape(hook: impl Fn() -> bool + Send + Sync + 'static) {
    lock(&HOOKS).push(Box::new(hook));
}

/// An async refresh of state a render reads (a store read behind a gauge); `None` once its
/// component is gone (the hook is then dropped).
type RefreshHook =
    Box<dyn Fn() -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> + Send + Sync>;

/// Refresh hooks: run by `/metrics` before it renders and by the OTLP export before it does.
static REFRESH_HOOKS: Mutex<Vec<RefreshHook>> = Mutex::new(Vec::new());

/// Runs `hook`'s future before every `/metrics` render and every OTLP export ([`refresh`]) until
/// it returns `None`.
pub fn on_refresh(
    hook: impl Fn() -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>
    + Send
    + Sync
    + 'static,
) {
    lock(&REFRESH_HOOKS).push(Box::new(hook));
}

/// Runs the refresh hooks (one after the other), before a [`render`] that must be current.
pub async fn refresh() {
    let mut pending = Vec::new();
    lock(&REFRESH_HOOKS).retain(|hook| match hook() {
        Some(refresh) => {
            pending.push(refresh);
            true
        }
        None => false,
    });
    for refresh in pending {
        refresh.await;
    }
}

/// Appends `hook`'s families to every render until it returns `None` (its component is gone).
/// The text must be whole families in the exposition format, named apart from the recorder's.
pub fn on_render(hook: impl Fn() -> Option<String> + Send + Sync + 'static) {
    lock(&TEXT_HOOKS).push(Box::new(hook));
}

/// The text exposition of every series: the recorder's, after the scrape hooks ran, then the
/// render hooks' families, then the `process_*` series read from `/proc` now.
pub fn render() -> String {
    let st = state();
    lock(&HOOKS).retain(|hook| hook());
    let mut out = if st.ours {
        st.handle.render()
    } else {
        String::new()
    };
    // One blank line between the recorder's families and ours, as between its own.
    out.truncate(out.trim_end_matches('\n').len());
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    lock(&TEXT_HOOKS).retain(|hook| match hook() {
        Some(text) => {
            out.push_str(&text);
            true
        }
        None => false,
    });
    out.push_str(&process_metrics());
    out
}

/// `outcome` label of a gRPC call's result: `ok`, or its status code in snake case.
pub fn outcome<T>(result: &Result<T, tonic::Status>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(status) => code_label(status.code()),
    }
}

/// A gRPC status code in snake case (a bounded set of label values).
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The media type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What `/healthz` answers: `Ok` → 200 `ok`, `Err(reason)` → 503 with the reason.
pub type Health = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Runs before a `/metrics` render (e.g. to re-read state that needs an `.await`).
pub type BeforeScrape =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Options of [`serve_with`].
#[derive(Clone, Default)]
pub struct Endpoint {
    /// `/healthz`; default: always healthy.
    pub health: Option<Health>,
    /// Called before each `/metrics` render.
    pub before_scrape: Option<BeforeScrape>,
    /// JSON documents served as they are at their paths (the api's JWKS and OpenID discovery
    /// document for actors' identity tokens).
    pub documents: Arc<[(String, Bytes)]>,
}

/// Serves `/metrics` and `/healthz` (always 200) on `listener` until `stop` resolves.
pub async fn serve(listener: TcpListener, stop: impl Future<Output = ()>) {
    serve_with(listener, Endpoint::default(), stop).await
}

/// [`serve`] with a health check and a pre-scrape hook.
pub async fn serve_with(listener: TcpListener, endpoint: Endpoint, stop: impl Future<Output = ()>) {
    let upkeep = tokio::spawn(async {
        let mut tick = tokio::time::interval(UPKEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let st = state();
            if st.ours {
                st.handle.run_upkeep();
            }
        }
    });
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let endpoint = endpoint.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let endpoint = endpoint.clone();
                    async move { Ok::<_, Infallible>(respond(request.uri().path(), &endpoint).await) }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        }
    }
    upkeep.abort();
}

/// The response to a GET of `path` on the operations endpoint.
pub async fn respond(path: &str, endpoint: &Endpoint) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        response
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    match path {
        "/metrics" => {
            if let Some(before) = &endpoint.before_scrape {
                before().await;
            }
            refresh().await;
            text(StatusCode::OK, CONTENT_TYPE, render())
        }
        "/healthz" => match endpoint.health.as_ref().map_or(Ok(()), |h| h()) {
            Ok(()) => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, format!("{why}\n")),
        },
        _ => match endpoint.documents.iter().find(|(p, _)| p == path) {
            Some((_, body)) => {
                let mut response = text(StatusCode::OK, "application/json", String::new());
                *response.body_mut() = Full::new(body.clone());
                response
            }
            None => text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into()),
        },
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The conventional `process_*` series of this process (Linux `/proc`), each with HELP and TYPE;
/// a value that cannot be read is left out.
pub fn process_metrics() -> String {
    let mut out = String::new();
    let mut series = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    };
    let stat = ProcStat::read();
    let tick = clock_ticks_per_second();
    series(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        stat.as_ref().map(|s| (s.utime + s.stime) as f64 / tick),
    );
    series(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        stat.as_ref()
            .and_then(|s| boot_time().map(|boot| boot + s.starttime as f64 / tick)),
    );
    series(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        statm_pages(1).map(|pages| pages * page_size()),
    );
    series(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        statm_pages(0).map(|pages| pages * page_size()),
    );
    series(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64),
    );
    series(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        max_fds(),
    );
    series(
        "process_threads",
        "gauge",
        "Number of OS threads in the process.",
        stat.as_ref().map(|s| s.threads as f64),
    );
    out
}

/// The fields of `/proc/self/stat` that the process series use.
struct ProcStat {
    utime: u64,
    stime: u64,
    threads: u64,
    starttime: u64,
}

impl ProcStat {
    fn read() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces and parentheses: fields after its last ')'.
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): field n is fields[n - 3].
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        Some(ProcStat {
            utime: field(14)?,
            stime: field(15)?,
            threads: field(20)?,
            starttime: field(22)?,
        })
    }
}

/// Field `index` of `/proc/self/statm`, in pages (0: size, 1: resident).
fn statm_pages(index: usize) -> Option<f64> {
    std::fs::read_to_string("/proc/self/statm")
        .ok()?
        .split_whitespace()
        .nth(index)?
        .parse::<f64>()
        .ok()
}

/// The boot time (`btime` of `/proc/stat`), seconds since the epoch.
fn boot_time() -> Option<f64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit of open files (`/proc/self/limits`).
fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn page_size() -> f64 {
    // SAFETY: as above.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as f64 } else { 4096.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn describe_test() {
        metrics::describe_counter!("ate_test_things_total", "Things.");
        metrics::describe_histogram!("ate_test_wait_seconds", metrics::Unit::Seconds, "A wait.");
        metrics::describe_histogram!("ate_test_size_bytes", metrics::Unit::Bytes, "A size.");
    }

    #[test]
    fn renders_histograms_build_info_and_process_series() {
        install("test", describe_test);
        metrics::counter!("ate_test_things_total").increment(2);
        metrics::histogram!("ate_test_wait_seconds").record(0.002);
        metrics::histogram!("ate_test_size_bytes").record(100_000.0);
        let text = render();
        for want in [
            "# TYPE ate_build_info gauge",
            &format!("ate_build_info{{component=\"test\",version=\"{VERSION}\"}} 1"),
            "# HELP ate_test_things_total Things.",
            "ate_test_things_total 2",
            "# TYPE ate_test_wait_seconds histogram",
            "ate_test_wait_seconds_bucket{le=\"0.0025\"} 1",
            "ate_test_wait_seconds_bucket{le=\"60\"} 1",
            "ate_test_size_bytes_bucket{le=\"262144\"} 1",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_cpu_seconds_total counter",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(want), "{want:?} missing from\n{text}");
        }
        assert!(!text.contains("summary"), "{text}");
        let start: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        assert!(
            now - start >= 0.0 && now - start < 600.0,
            "start {start}, now {now}"
        );
    }

    #[test]
    fn scrape_hooks_run_until_they_say_they_are_done() {
        install("test", describe_test);
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = runs.clone();
        on_scrape(move || counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 1);
        render();
        render();
        render();
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn render_hooks_add_families_until_their_component_is_gone() {
        install("test", describe_test);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = alive.clone();
        on_render(move || {
            flag.load(std::sync::atomic::Ordering::SeqCst)
                .then(|| "# TYPE ate_test_hooked gauge\nate_test_hooked{k=\"v\"} 3\n\n".to_string())
        });
        let text = render();
        assert!(text.contains("ate_test_hooked{k=\"v\"} 3\n"), "{text}");
        assert!(text.contains("process_open_fds "), "{text}");
        alive.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(!render().contains("ate_test_hooked"));
        alive.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(
            !render().contains("ate_test_hooked"),
            "a hook that said it was done is dropped"
        );
    }

    #[tokio::test]
    async fn refresh_hooks_run_before_a_scrape_until_they_are_done() {
        install("test", describe_test);
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::downgrade(&runs);
        on_refresh(move || {
            let runs = counted.upgrade()?;
            Some(Box::pin(async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }))
        });
        refresh().await;
        respond("/metrics", &Endpoint::default()).await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
        drop(runs);
        refresh().await;
        assert!(
            lock(&REFRESH_HOOKS).is_empty(),
            "a hook whose component is gone is dropped"
        );
    }

    #[tokio::test]
    async fn healthz_reports_the_reason_when_unhealthy() {
        let endpoint = Endpoint {
            health: Some(Arc::new(|| Err("draining".to_string()))),
            ..Default::default()
        };
        let r = respond("/healthz", &endpoint).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let r = respond("/healthz", &Endpoint::default()).await;
        assert_eq!(r.status(), StatusCode::OK);
        let r = respond("/nope", &Endpoint::default()).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let documents = Endpoint {
            documents: vec![("/doc.json".to_string(), Bytes::from_static(b"{}"))].into(),
            ..Default::default()
        };
        let r = respond("/doc.json", &documents).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[hyper::header::CONTENT_TYPE], "application/json");
        let r = respond("/metrics", &Endpoint::default()).await;
        assert_eq!(
            r.headers()
                .get(hyper::header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            Some(CONTENT_TYPE.as_bytes())
        );
    }
}
