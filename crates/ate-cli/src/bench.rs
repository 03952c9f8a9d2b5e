//! `ate bench`: measurements against a running system (`ate up`), through the router like a client.
//!
//! - `resume`: n suspended sleeper actors resumed by n simultaneous requests (the spec's burst table).
//! - `parking`: the spec's parking demo timeline, then its load run (4 actors, each suspended after
//!   its answer), printing the spec's summary block. Needs a pool with room for 2 actors.
//! - `throughput`: resumes/s of small counter actors. Default (burst, the spec's shape): N suspended
//!   actors, then one request to each with at most C in flight; resumes/s = cold resumes / wall
//!   time from the first request sent to the last answer. `--cycle`: a sustained loop instead,
//!   every request to a suspended actor and background suspenders suspending each served actor
//!   again (bounded by the suspends' dumps).
//! - `warm`: router warm path (keep-alive) against a direct loopback baseline served by this
//!   process, in the same invocation; optionally also over the router's TLS listener and through a
//!   second, plaintext system (the cost of TLS on both hops), interleaved in rounds.
//!
//! Progress goes to stderr, the table to stdout, the results as JSON to `--out` (default
//! `bench-<kind>.json`, with every sample) and an SVG chart beside it (`plot.rs`).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ate_core::{Document, SuspendMode};
use ate_proto::v1;
use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::sync::{Barrier, Mutex};
use tokio::task::JoinSet;

use crate::client::Clients;

mod h2load;
mod nginx;
mod warm;

pub use warm::WarmArgs;

const SUSPENDED: i32 = 1;
const RUNNING: i32 = 3;
const NO_ROOM: &str = "unavailable: no worker has room for the actor";

#[derive(Subcommand)]
pub enum BenchCmd {
    /// n suspended sleeper actors resumed by n simultaneous requests, for each n.
    Resume(ResumeArgs),
    /// The parking demo timeline and its load run (needs 2 workers × 1 slot).
    Parking(ParkingArgs),
    /// Resumes/s of small counter actors: one request to each of N suspended actors, at most C
    /// in flight (default), or a sustained resume/suspend loop (`--cycle`).
    Throughput(ThroughputArgs),
    /// Router warm path (keep-alive) against a direct loopback baseline.
    Warm(WarmArgs),
    /// Suspend time and resume-to-first-response of the small counter and of sleepers, from the
    /// node-local generation and from the durable copy.
    Snapshots(SnapshotsArgs),
    /// A Jepsen-style fault suite on a system of its own (the bench starts and stops its own
    /// `ate up`): kills and outages of each component, the store and the snapshot disk under a
    /// client load; checks that no actor loses state or runs twice, slots add up and nothing is
    /// orphaned.
    Faults(crate::faults::FaultsArgs),
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Router URL.
    #[arg(long, env = "ATE_ROUTER", default_value = "http://127.0.0.1:8080")]
    router: String,
    /// Atespace for the bench's templates and actors.
    #[arg(long)]
    atespace: Option<String>,
    /// Directory of the demo OCI image layouts (default: the one `ate up`'s `ate-demo/counter`
    /// template uses).
    #[arg(long)]
    images_dir: Option<PathBuf>,
    /// JSON results file (default: bench-<kind>.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    #[command(flatten)]
    common: Common,
    /// Simultaneous resumes per level, comma separated.
    #[arg(long, default_value = "1,2,4,8,16", value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Rounds per level.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Memory each sleeper actor holds (e.g. 50MiB).
    #[arg(long, default_value = "50MiB")]
    memory: String,
    /// Path of the waking request. `/` makes the sleeper checksum all its memory (~25 ms of CPU
    /// per request at 50 MiB, which alone bounds how fast 16 first answers can come on 2
    /// cores); `/healthz` answers without touching it, so the substrate's own cost shows.
    #[arg(long, default_value = "/")]
    path: String,
    /// Pause between suspending the actors and each burst, in seconds. Every suspend leaves
    /// work behind it (the generation's durable upload, pruning older ones): ~0.1 s of node CPU
    /// per 50 MiB actor, so a burst sent at once competes with 16 uploads. The spec's burst is
    /// of actors suspended a while ago; 0 measures the burst on the heels of the suspends.
    #[arg(long, default_value_t = 2.0, value_parser = parse_settle)]
    settle: f64,
}

#[derive(Args, Debug)]
pub struct SnapshotsArgs {
    #[command(flatten)]
    common: Common,
    /// Suspend/resume cycles per workload and copy.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Sleeper sizes measured after the counter, comma separated (empty: counter only).
    #[arg(long, default_value = "50MiB,256MiB", value_delimiter = ',')]
    memory: Vec<String>,
    /// The `ate up` state directory on this machine. For the durable rows the bench deletes the
    /// actor's node-local generations there after a DURABLE suspend, so the node has to restore
    /// from the durable store. Without it only node-local rows are measured.
    #[arg(long, env = "ATE_STATE_DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ParkingArgs {
    #[command(flatten)]
    common: Common,
    /// Length of the load run in seconds (0 skips it).
    #[arg(long, default_value_t = 30)]
    load_seconds: u64,
    /// When p1 is suspended, in seconds into the second p3 request.
    #[arg(long, default_value_t = 2.0)]
    free_after: f64,
}

#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    common: Common,
    /// Number of suspended counter actors (default: 600; with --cycle, 2 × concurrency). Actors
    /// of an earlier run that are still suspended are reused.
    #[arg(long)]
    actors: Option<usize>,
    /// Requests in flight at most (default: 300; with --cycle, 64).
    #[arg(long)]
    concurrency: Option<usize>,
    /// The sustained resume/suspend loop instead of the burst: requesters keep --concurrency
    /// requests to suspended actors in flight for --seconds while --suspenders suspend each
    /// served actor again.
    #[arg(long)]
    cycle: bool,
    /// With --cycle: length of the measurement in seconds.
    #[arg(long, default_value_t = 20, requires = "cycle")]
    seconds: u64,
    /// With --cycle: suspend calls in flight.
    #[arg(long, default_value_t = 16, requires = "cycle")]
    suspenders: usize,
    /// Burst only: pause between preparing the suspended actors and the burst, in seconds, so
    /// the preparing suspends' durable uploads are not measured as resume time (as in `bench
    /// resume`). 0 sends the burst at once.
    #[arg(long, default_value_t = 2.0, conflicts_with = "cycle", value_parser = parse_settle)]
    settle: f64,
}

pub async fn run(c: Clients, cmd: BenchCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCmd::Resume(a) => resume(c, a).await,
        BenchCmd::Parking(a) => parking(c, a).await,
        BenchCmd::Throughput(a) => throughput(c, a).await,
        BenchCmd::Warm(a) => warm::warm(c, a).await,
        BenchCmd::Snapshots(a) => snapshots(c, a).await,
        // Normally routed by main before connecting: it starts its own system.
        BenchCmd::Faults(a) => crate::faults::run(a).await,
    }
}

// ------------------------------------------------------------------ HTTP

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn http_client(idle_per_host: usize) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle_per_host)
        .build(conn)
}

#[derive(Clone, Debug)]
struct Reply {
    status: u16,
    body: String,
    /// The router's `ate-resume` header (cold / warm / parked).
    resume: String,
    secs: f64,
    start: SystemTime,
}

/// One GET; transport errors and a 60 s timeout give status 0 with the error as body.
async fn call(c: &HttpClient, base: &str, actor: Option<&str>, path: &str) -> Reply {
    let start = SystemTime::now();
    let started = Instant::now();
    let mut req = hyper::Request::get(format!("{}{path}", base.trim_end_matches('/')));
    if let Some(a) = actor {
        req = req.header("ate-target-actor", a);
    }
    let result = async {
        let req = req.body(Empty::new())?;
        let resp = c.request(req).await?;
        let status = resp.status().as_u16();
        let resume = resp
            .headers()
            .get("ate-resume")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, resume, String::from_utf8_lossy(&body).into_owned()))
    };
    let (status, resume, body) = match tokio::time::timeout(Duration::from_secs(60), result).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => (0, String::new(), format!("{e:#}")),
        Err(_) => (0, String::new(), "timed out after 60 s".into()),
    };
    Reply {
        status,
        body,
        resume,
        secs: started.elapsed().as_secs_f64(),
        start,
    }
}

// ------------------------------------------------------------------ api helpers

fn rpc<T>(r: Result<tonic::Response<T>, tonic::Status>) -> anyhow::Result<T> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| anyhow::anyhow!("{} ({:?})", s.message(), s.code()))
}

fn obj(atespace: &str, name: &str) -> Option<v1::ObjectRef> {
    Some(v1::ObjectRef {
        atespace: atespace.to_string(),
        name: name.to_string(),
    })
}

/// The images directory: `--images-dir`, else derived from the `ate-demo/counter` template's image
/// (`oci-layout:DIR/counter:latest`).
async fn images_dir(c: &Clients, common: &Common) -> anyhow::Result<String> {
    if let Some(d) = &common.images_dir {
        return Ok(d.display().to_string());
    }
    let t = rpc(c
        .templates
        .clone()
        .get_template(v1::GetTemplateRequest {
            namespace: "ate-demo".into(),
            name: "counter".into(),
        })
        .await)
    .context("cannot read the ate-demo/counter template to find the images (pass --images-dir)")?;
    let image = t
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .map(|c| c.image)
        .unwrap_or_default();
    image
        .strip_prefix("oci-layout:")
        .and_then(|i| i.strip_suffix("/counter:latest"))
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("unexpected demo image {image:?}; pass --images-dir"))
}

/// Creates the atespace and applies the templates of a YAML text (the `ate apply` documents).
async fn apply_yaml(c: &Clients, text: &str) -> anyhow::Result<()> {
    for doc in crate::verbs::parse_documents(text)? {
        match doc {
            Document::Atespace(a) => match c
                .atespaces
                .clone()
                .create_atespace(v1::CreateAtespaceRequest {
                    name: a.metadata.name.clone(),
                })
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::AlreadyExists => {}
                Err(s) => anyhow::bail!("atespace {}: {}", a.metadata.name, s.message()),
            },
            Document::ActorTemplate(t) => {
                let spec = ate_core::template::TemplateSpec::from_document(&t.spec)?;
                rpc(c
                    .templates
                    .clone()
                    .apply_template(v1::ApplyTemplateRequest {
                        template: Some(v1::ActorTemplate {
                            namespace: t.metadata.namespace.clone(),
                            name: t.metadata.name.clone(),
                            spec: Some(ate_proto::spec_to_wire(&spec)),
                            ..Default::default()
                        }),
                    })
                    .await)
                .with_context(|| format!("template {}", t.metadata.name))?;
            }
        }
    }
    Ok(())
}

/// Memory of every counter actor of the bench's templates.
const COUNTER_MEMORY_MIB: u64 = 64;

fn counter_template(ns: &str, name: &str, images: &str, cpu: &str) -> String {
    format!(
        r#"apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {{name: {ns}}}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {{namespace: {ns}, name: {name}}}
spec:
  containers:
    - name: counter
      image: "oci-layout:{images}/counter:latest"
      command: ["/counter"]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 80}}, timeoutSeconds: 10}}
  resources: {{cpu: {cpu}, memory: {COUNTER_MEMORY_MIB}Mi}}
  volumes: [{{name: data, mountPath: /data}}]
  snapshots: {{fidelity: memory}}
  idleTimeout: 5m
"#
    )
}

/// The counter with a sidecar (a second counter it calls over loopback on every request):
/// `ate bench snapshots` measures it beside the single counter.
fn counter_sidecar_template(ns: &str, name: &str, images: &str) -> String {
    format!(
        r#"apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {{name: {ns}}}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {{namespace: {ns}, name: {name}}}
spec:
  containers:
    - name: counter
      image: "oci-layout:{images}/counter:latest"
      command: ["/counter"]
      env: [{{name: SIDECAR_ADDR, value: "127.0.0.1:9000"}}, {{name: PORT2, value: "off"}}]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 80}}, timeoutSeconds: 10}}
    - name: sidecar
      image: "oci-layout:{images}/counter:latest"
      command: ["/counter"]
      env: [{{name: PORT, value: "9000"}}, {{name: PORT2, value: "off"}}, {{name: ATE_DATA_DIR, value: /data/sidecar}}]
      ports: [{{containerPort: 9000}}]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 9000}}, timeoutSeconds: 10}}
  resources: {{cpu: 250m, memory: {memory}Mi}}
  volumes: [{{name: data, mountPath: /data}}]
  snapshots: {{fidelity: memory}}
  idleTimeout: 5m
"#,
        memory = 2 * COUNTER_MEMORY_MIB,
    )
}

fn sleeper_template(ns: &str, name: &str, images: &str, mib: u64, eager: bool) -> String {
    let restore = if eager { ", memoryRestore: eager" } else { "" };
    format!(
        r#"apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {{name: {ns}}}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {{namespace: {ns}, name: {name}}}
spec:
  containers:
    - name: sleeper
      image: "oci-layout:{images}/sleeper:latest"
      command: ["/sleeper"]
      env: [{{name: SLEEPER_MEMORY_MIB, value: "{mib}"}}]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 80}}, timeoutSeconds: {probe}}}
  resources: {{cpu: 250m, memory: {limit}Mi}}
  snapshots: {{fidelity: memory{restore}}}
  idleTimeout: 5m
"#,
        limit = mib + 64,
        // A cold start fills the memory first, on a quarter of a core: 4 GiB takes about a
        // minute.
        probe = 10 + mib / 32,
    )
}

async fn ensure_actor(c: &Clients, ns: &str, name: &str, template: &str) -> anyhow::Result<()> {
    match c
        .actors
        .clone()
        .create_actor(v1::CreateActorRequest {
            atespace: ns.into(),
            name: name.into(),
            template: format!("{ns}/{template}"),
            ..Default::default()
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(s) if s.code() == tonic::Code::AlreadyExists => Ok(()),
        Err(s) => anyhow::bail!("create actor {ns}/{name}: {}", s.message()),
    }
}

async fn get_actor(c: &Clients, ns: &str, name: &str) -> anyhow::Result<v1::Actor> {
    rpc(c
        .actors
        .clone()
        .get_actor(v1::GetActorRequest {
            actor: obj(ns, name),
        })
        .await)
}

async fn actor_state(c: &Clients, ns: &str, name: &str) -> anyhow::Result<i32> {
    Ok(get_actor(c, ns, name).await?.state)
}

async fn suspend(c: &Clients, ns: &str, name: &str) -> anyhow::Result<()> {
    suspend_mode(c, ns, name, SuspendMode::Async).await
}

async fn suspend_mode(c: &Clients, ns: &str, name: &str, mode: SuspendMode) -> anyhow::Result<()> {
    rpc(c
        .actors
        .clone()
        .suspend_actor(v1::SuspendActorRequest {
            actor: obj(ns, name),
            mode: mode.wire(),
            grace_ms: 0,
        })
        .await)
    .with_context(|| format!("suspend {ns}/{name}"))?;
    Ok(())
}

/// Suspends the actor if it runs; waits (up to 30 s) until it reads SUSPENDED.
async fn ensure_suspended(c: &Clients, ns: &str, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = actor_state(c, ns, name).await?;
        match state {
            SUSPENDED => return Ok(()),
            RUNNING => suspend(c, ns, name).await?,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        if Instant::now() > deadline {
            let state = v1::ActorState::try_from(state)
                .map_or_else(|_| state.to_string(), |s| s.as_str_name().to_string());
            anyhow::bail!("{ns}/{name} did not reach SUSPENDED in 30 s (still {state})");
        }
    }
}

/// First request (a fresh start) and a suspend, so that later requests restore a snapshot. An
/// actor that is already suspended with a snapshot (an earlier run's) is left as it is; a running
/// one is only suspended. True when the actor was not ready as it was found.
async fn prime(
    c: &Clients,
    http: &HttpClient,
    router: &str,
    ns: &str,
    name: &str,
) -> anyhow::Result<bool> {
    let found = get_actor(c, ns, name).await?;
    if found.state == SUSPENDED && found.generation > 0 {
        return Ok(false);
    }
    if found.state == SUSPENDED {
        let actor = format!("{ns}/{name}");
        let r = call(http, router, Some(&actor), "/").await;
        if r.status != 200 {
            anyhow::bail!("priming {actor}: {} {}", r.status, r.body);
        }
    }
    ensure_suspended(c, ns, name).await?;
    Ok(true)
}

// ------------------------------------------------------------------ numbers and output

pub(crate) fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Nearest-rank percentile of sorted values (`p` in 0..=1); 0 for none.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub(crate) fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// UTC time as `2026-11-12T11:32:40.522Z`.
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

fn write_json(common: &Common, kind: &str, value: &serde_json::Value) -> anyhow::Result<()> {
    let path = common
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-{kind}.json")));
    write_file(&path, &serde_json::to_string_pretty(value)?)?;
    eprintln!("==> wrote {}", path.display());
    // The chart beside it; a bench whose plot fails still succeeds.
    let svg_path = path.with_extension("svg");
    let plotted = crate::plot::svg(kind, value).and_then(|svg| {
        anyhow::ensure!(svg_path != path, "--out already ends in .svg");
        write_file(&svg_path, &svg)
    });
    match plotted {
        Ok(()) => eprintln!("==> wrote {}", svg_path.display()),
        Err(e) => eprintln!("warning: no chart for {}: {e:#}", path.display()),
    }
    Ok(())
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("cannot write {}", path.display()))
}

fn parse_mib(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &t[digits.len()..];
    let n: u64 = digits
        .trim()
        .parse()
        .with_context(|| format!("memory {s:?}"))?;
    match unit {
        "" | "Mi" | "MiB" | "M" | "MB" => Ok(n),
        "Gi" | "GiB" | "G" | "GB" => Ok(n * 1024),
        _ => anyhow::bail!("memory {s:?}: use MiB or GiB"),
    }
}

fn reply_json(r: &Reply) -> serde_json::Value {
    json!({"status": r.status, "seconds": r.secs, "resume": r.resume,
           "start": rfc3339(r.start), "body": r.body})
}

// ------------------------------------------------------------------ resume (burst)

/// `--settle`: seconds, 0 to 600 (refused while parsing, before anything is sent).
fn parse_settle(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if seconds.is_finite() && (0.0..=600.0).contains(&seconds) {
        Ok(seconds)
    } else {
        Err(format!("{text}: use 0 to 600 seconds"))
    }
}

async fn resume(c: Clients, a: ResumeArgs) -> anyhow::Result<ExitCode> {
    let ns = a
        .common
        .atespace
        .clone()
        .unwrap_or_else(|| "ate-bench".into());
    let mib = parse_mib(&a.memory)?;
    let max = a.concurrency.iter().copied().max().unwrap_or(0);
    anyhow::ensure!(max > 0 && a.rounds > 0, "nothing to do");
    let settle = Duration::from_secs_f64(a.settle);
    let images = images_dir(&c, &a.common).await?;
    let template = format!("sleeper-{mib}mi");
    apply_yaml(&c, &sleeper_template(&ns, &template, &images, mib, false)).await?;
    let http = http_client(max);
    let router = a.common.router.clone();
    let names: Vec<String> = (0..max).map(|i| format!("burst-{mib}mi-{i}")).collect();
    eprintln!("==> preparing {max} suspended sleeper actors ({mib} MiB) in {ns}");
    for n in &names {
        ensure_actor(&c, &ns, n, &template).await?;
        prime(&c, &http, &router, &ns, n).await?;
    }
    let mut levels = Vec::new();
    let mut rows = Vec::new();
    for &n in &a.concurrency {
        let mut replies: Vec<(usize, Reply)> = Vec::new();
        for round in 1..=a.rounds {
            for name in &names[..n] {
                ensure_suspended(&c, &ns, name).await?;
            }
            tokio::time::sleep(settle).await;
            let barrier = Arc::new(Barrier::new(n));
            let mut set = JoinSet::new();
            for name in &names[..n] {
                let (http, router, barrier) = (http.clone(), router.clone(), barrier.clone());
                let actor = format!("{ns}/{name}");
                let path = a.path.clone();
                set.spawn(async move {
                    barrier.wait().await;
                    call(&http, &router, Some(&actor), &path).await
                });
            }
            let round_replies: Vec<Reply> = set.join_all().await;
            let ok = round_replies.iter().filter(|r| r.status == 200).count();
            let secs = sorted(round_replies.iter().map(|r| r.secs).collect());
            eprintln!(
                "n={n:<3} round {round}/{}: {ok}/{n} returned 200, median {:.3} s, slowest {:.3} s",
                a.rounds,
                median(&secs),
                pct(&secs, 1.0)
            );
            for r in &round_replies {
                if r.status != 200 {
                    eprintln!("    {} {}", r.status, r.body);
                }
            }
            replies.extend(round_replies.into_iter().map(|r| (round, r)));
            let mut set = JoinSet::new();
            for name in &names[..n] {
                let (c, ns, name) = (c.clone(), ns.clone(), name.clone());
                set.spawn(async move { ensure_suspended(&c, &ns, &name).await });
            }
            for r in set.join_all().await {
                r?;
            }
        }
        let ok = replies.iter().filter(|(_, r)| r.status == 200).count();
        let secs = sorted(replies.iter().map(|(_, r)| r.secs).collect());
        rows.push((n, replies.len(), ok, median(&secs), pct(&secs, 1.0)));
        levels.push(json!({
            "n": n, "requests": replies.len(), "returned_200": ok,
            "median_seconds": median(&secs), "p90_seconds": pct(&secs, 0.9),
            "slowest_seconds": pct(&secs, 1.0),
            "samples": replies.iter().map(|(round, r)| {
                let mut v = reply_json(r);
                v["round"] = json!(round);
                v
            }).collect::<Vec<_>>(),
        }));
    }
    println!("Resumes at the same instant | Requests | Returned 200 | Median  | Slowest");
    for (n, req, ok, med, slow) in &rows {
        println!("{n:>27} | {req:>8} | {ok:>12} | {med:>5.2} s | {slow:>5.2} s");
    }
    write_json(
        &a.common,
        "resume",
        &json!({"kind": "resume", "memory_mib": mib, "rounds": a.rounds, "path": a.path, "settle_seconds": a.settle, "router": router, "levels": levels}),
    )?;
    let all_ok = rows.iter().all(|(_, req, ok, _, _)| req == ok);
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

// ------------------------------------------------------------------ snapshots

/// One measured actor of `ate bench snapshots` and its figures over the rounds.
#[derive(Default)]
struct SnapSeries {
    label: String,
    template: String,
    restore: &'static str,
    /// Suspends after `GET /dirty?percent=1` (the sleeper), when the workload supports it.
    dirtied: bool,
    suspend: Vec<f64>,
    first_local: Vec<f64>,
    full_local: Vec<f64>,
    suspend_durable: Vec<f64>,
    uploaded: Vec<f64>,
    first_durable: Vec<f64>,
    full_durable: Vec<f64>,
}

impl SnapSeries {
    fn json(&self) -> serde_json::Value {
        json!({"workload": self.label, "template": self.template, "restore": self.restore,
            "dirtied_percent_before_suspend": if self.dirtied { 1.0 } else { 0.0 },
            "suspend_seconds": self.suspend, "resume_local_seconds": self.first_local,
            "full_local_seconds": self.full_local,
            "suspend_durable_seconds": self.suspend_durable,
            "uploaded_bytes": self.uploaded,
            "resume_durable_seconds": self.first_durable,
            "full_durable_seconds": self.full_durable})
    }
}

/// Bytes the last upload of `ns/name` wrote to a `file://` durable store under the state dir:
/// the newest generation's objects (`<state>/durable/<ns>/<name>/<generation>-<uuid>/`) plus the
/// memory chunks written since `since` (`<state>/durable/_chunks/`; chunks the store already
/// held are not sent again). None when the store is elsewhere.
/// Waits (up to 5 minutes) until generation `generation` of `ns/name` has its durable copy in
/// the state dir's `file://` store (its manifest is written last).
async fn wait_for_durable_copy(state: &Path, ns: &str, name: &str, generation: u64) {
    let dir = state.join("durable").join(ns).join(name);
    let prefix = format!("{generation}-");
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let done = std::fs::read_dir(&dir).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(&prefix)
                    && e.path().join("manifest.json").is_file()
            })
        });
        if done {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "generation {generation} of {ns}/{name} has no durable copy after 5 minutes; going on"
    );
}

fn uploaded_bytes(state: &Path, ns: &str, name: &str, since: std::time::SystemTime) -> Option<f64> {
    let durable = state.join("durable");
    let dir = durable.join(ns).join(name);
    let newest = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let gen_no: u64 = e
                .file_name()
                .to_string_lossy()
                .split('-')
                .next()?
                .parse()
                .ok()?;
            Some((gen_no, e.path()))
        })
        .max_by_key(|(g, _)| *g)?
        .1;
    let all = |_: &std::fs::Metadata| true;
    let fresh = |m: &std::fs::Metadata| m.modified().is_ok_and(|t| t >= since);
    let chunks = durable.join("_chunks");
    let chunk_bytes = if chunks.is_dir() {
        tree_size(&chunks, &fresh)?
    } else {
        0
    };
    Some((tree_size(&newest, &all)? + chunk_bytes) as f64)
}

/// Total size of the files under `dir` that `keep` accepts.
fn tree_size(dir: &Path, keep: &dyn Fn(&std::fs::Metadata) -> bool) -> Option<u64> {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let meta = e.metadata().ok()?;
            if meta.is_dir() {
                stack.push(e.path());
            } else if keep(&meta) {
                total += meta.len();
            }
        }
    }
    Some(total)
}

/// `GET path` that must answer 200, sent again (as the router's 503/504 ask) while the resume
/// takes longer than the router's parking budget (a large restore from the durable store): the
/// time until the answer, retries included.
async fn timed_path(
    http: &HttpClient,
    router: &str,
    actor: &str,
    path: &str,
) -> anyhow::Result<f64> {
    let begun = Instant::now();
    loop {
        let r = call(http, router, Some(actor), path).await;
        if r.status == 200 {
            return Ok(begun.elapsed().as_secs_f64());
        }
        let retry = matches!(r.status, 503 | 504) && begun.elapsed() < Duration::from_secs(120);
        anyhow::ensure!(retry, "{actor}{path}: {} {}", r.status, r.body);
        eprintln!(
            "{actor}{path}: {} after {:.1} s ({}); sending it again",
            r.status,
            begun.elapsed().as_secs_f64(),
            r.body.lines().next().unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Snapshot figures: for the counter and each sleeper size (restored lazily and, as a second
/// actor of the same size, eagerly: `memoryRestore: eager`), `rounds` times, lazy and eager
/// interleaved: 1 % of the sleeper's pages dirtied, an ASYNC suspend (timed), `GET /healthz`
/// (resume from the node-local generation, timed to the first answer), `GET /` (the sleeper
/// checksums all of its memory: every page in); then with a state dir a DURABLE suspend (timed,
/// upload included, bytes uploaded), the node-local copies deleted, and the same two requests
/// (restore from the durable store: download, verify, restore).
async fn snapshots(c: Clients, a: SnapshotsArgs) -> anyhow::Result<ExitCode> {
    let ns = a
        .common
        .atespace
        .clone()
        .unwrap_or_else(|| "ate-bench-snap".into());
    anyhow::ensure!(a.rounds > 0, "--rounds 0: nothing to do");
    let images = images_dir(&c, &a.common).await?;
    let mut groups: Vec<Vec<SnapSeries>> = vec![vec![
        SnapSeries {
            label: "counter".into(),
            template: "snap-counter".into(),
            restore: "lazy",
            ..Default::default()
        },
        SnapSeries {
            label: "counter + sidecar".into(),
            template: "snap-counter-sidecar".into(),
            restore: "lazy",
            ..Default::default()
        },
    ]];
    apply_yaml(&c, &counter_template(&ns, "snap-counter", &images, "250m")).await?;
    apply_yaml(
        &c,
        &counter_sidecar_template(&ns, "snap-counter-sidecar", &images),
    )
    .await?;
    for m in a.memory.iter().filter(|m| !m.trim().is_empty()) {
        let mib = parse_mib(m)?;
        let mut group = Vec::new();
        for restore in ["lazy", "eager"] {
            let template = format!("snap-sleeper-{mib}mi-{restore}");
            apply_yaml(
                &c,
                &sleeper_template(&ns, &template, &images, mib, restore == "eager"),
            )
            .await?;
            group.push(SnapSeries {
                label: format!("sleeper {mib} MiB"),
                template,
                restore,
                ..Default::default()
            });
        }
        groups.push(group);
    }
    let http = http_client(4);
    let router = a.common.router.clone();
    for group in &mut groups {
        for s in group.iter() {
            ensure_actor(&c, &ns, &s.template, &s.template).await?;
            // The cold start of a large sleeper outlasts the router's parking budget.
            timed_path(&http, &router, &format!("{ns}/{}", s.template), "/").await?;
        }
        for round in 1..=a.rounds {
            for s in group.iter_mut() {
                let name = s.template.clone();
                let actor = format!("{ns}/{name}");
                let dirty = call(&http, &router, Some(&actor), "/dirty?percent=1").await;
                s.dirtied = dirty.status == 200 && dirty.body.starts_with("dirtied");
                let t = Instant::now();
                let since_async = std::time::SystemTime::now();
                suspend_mode(&c, &ns, &name, SuspendMode::Async).await?;
                s.suspend.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                timed_path(&http, &router, &actor, "/healthz").await?;
                s.first_local.push(t.elapsed().as_secs_f64());
                timed_path(&http, &router, &actor, "/").await?;
                s.full_local.push(t.elapsed().as_secs_f64());
                if let Some(state) = &a.state_dir {
                    // The ASYNC suspend's background upload first: the DURABLE suspend is then
                    // timed, and its upload counted, on its own.
                    let async_generation = get_actor(&c, &ns, &name).await?.generation;
                    wait_for_durable_copy(state, &ns, &name, async_generation).await;
                    // What the 1 % dirtied cost in the store: the ASYNC suspend's upload.
                    if let Some(bytes) = uploaded_bytes(state, &ns, &name, since_async) {
                        s.uploaded.push(bytes);
                    }
                    let t = Instant::now();
                    suspend_mode(&c, &ns, &name, SuspendMode::Durable).await?;
                    s.suspend_durable.push(t.elapsed().as_secs_f64());
                    let local = state.join("snapshots").join(&ns).join(&name);
                    std::fs::remove_dir_all(&local).with_context(|| {
                        format!("delete the node-local copies in {}", local.display())
                    })?;
                    let t = Instant::now();
                    timed_path(&http, &router, &actor, "/healthz").await?;
                    s.first_durable.push(t.elapsed().as_secs_f64());
                    timed_path(&http, &router, &actor, "/").await?;
                    s.full_durable.push(t.elapsed().as_secs_f64());
                }
                let last = |v: &[f64]| v.last().map_or("-".to_string(), |x| format!("{x:.3} s"));
                eprintln!(
                    "{} ({}): round {round}/{}: suspend {}, node-local first answer {}, full memory {}; durable suspend {}, first answer {}, full memory {}",
                    s.label,
                    s.restore,
                    a.rounds,
                    last(&s.suspend),
                    last(&s.first_local),
                    last(&s.full_local),
                    last(&s.suspend_durable),
                    last(&s.first_durable),
                    last(&s.full_durable),
                );
            }
        }
        for s in group.iter() {
            ensure_suspended(&c, &ns, &s.template).await?;
        }
    }
    let all: Vec<&SnapSeries> = groups.iter().flatten().collect();
    print!("{}", snapshots_table(&all, a.rounds));
    write_json(
        &a.common,
        "snapshots",
        &json!({"kind": "snapshots", "rounds": a.rounds, "router": router,
            "workloads": all.iter().map(|s| s.json()).collect::<Vec<_>>()}),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The table `ate bench snapshots` prints: medians per series, then lazy/eager ratios.
fn snapshots_table(all: &[&SnapSeries], rounds: usize) -> String {
    let med = |v: &[f64]| median(&sorted(v.to_vec()));
    let secs = |v: &[f64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.3} s", med(v))
        }
    };
    let mib = |v: &[f64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2} MiB", med(v) / (1024.0 * 1024.0))
        }
    };
    let mut out = String::new();
    out.push_str("Workload          | Restore | Suspend  | Uploaded    | Local: first answer | Local: all memory | Suspend DURABLE | Durable: first answer | Durable: all memory\n");
    for s in all {
        out.push_str(&format!(
            "{:<17} | {:<7} | {:>8} | {:>11} | {:>19} | {:>17} | {:>15} | {:>21} | {:>19}\n",
            s.label,
            s.restore,
            secs(&s.suspend),
            mib(&s.uploaded),
            secs(&s.first_local),
            secs(&s.full_local),
            secs(&s.suspend_durable),
            secs(&s.first_durable),
            secs(&s.full_durable),
        ));
    }
    out.push_str(&format!(
        "(medians of {rounds} rounds; first answer = GET /healthz sent → answered through the router, resume included; all memory = until GET / answered (the sleeper checksums all of its memory); suspends of the sleeper follow GET /dirty?percent=1; uploaded = what that suspend's background upload sent)\n"
    ));
    for pair in all.windows(2) {
        let (lazy, eager) = (pair[0], pair[1]);
        if lazy.label == eager.label && lazy.restore == "lazy" && eager.restore == "eager" {
            let ratio = |l: &[f64], e: &[f64]| {
                if l.is_empty() || e.is_empty() || med(e) == 0.0 {
                    "-".to_string()
                } else {
                    format!("{:.2}×", med(l) / med(e))
                }
            };
            out.push_str(&format!(
                "{}: lazy/eager first answer node-local {}, durable {}; all memory node-local {}, durable {}\n",
                lazy.label,
                ratio(&lazy.first_local, &eager.first_local),
                ratio(&lazy.first_durable, &eager.first_durable),
                ratio(&lazy.full_local, &eager.full_local),
                ratio(&lazy.full_durable, &eager.full_durable),
            ));
        }
    }
    out
}

// ------------------------------------------------------------------ parking

fn timeline_line(event: &str, r: &Reply) -> String {
    format!(
        "{}\t{event}\t{}\t{:.6}\t{}",
        rfc3339(r.start),
        r.status,
        r.secs,
        r.body.trim_end()
    )
}

/// The summary block of the spec's load script.
pub fn summary_block(statuses: &[(u16, f64)]) -> String {
    let ok: Vec<f64> = statuses
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, t)| *t)
        .collect();
    let unavailable = statuses.iter().filter(|(s, _)| *s == 503).count();
    let avg = if ok.is_empty() {
        0.0
    } else {
        ok.iter().sum::<f64>() / ok.len() as f64
    };
    let slowest = ok.iter().copied().fold(0.0, f64::max);
    format!(
        "==> results\n    total requests : {}\n    200 OK         : {}\n    503 unavailable: {unavailable}\n    other          : {}\n    200 latency    : avg {avg:.3}s, slowest {slowest:.6}s",
        statuses.len(),
        ok.len(),
        statuses.len() - ok.len() - unavailable
    )
}

async fn parking(c: Clients, a: ParkingArgs) -> anyhow::Result<ExitCode> {
    let ns = a
        .common
        .atespace
        .clone()
        .unwrap_or_else(|| "ate-demo-parking".into());
    let images = images_dir(&c, &a.common).await?;
    apply_yaml(&c, &counter_template(&ns, "counter", &images, "250m")).await?;
    let http = http_client(8);
    let router = a.common.router.clone();
    let actors = ["p1", "p2", "p3", "p4"];
    eprintln!("==> {ns}: actors p1..p4, all suspended (the pool must have room for exactly 2)");
    for p in actors {
        ensure_actor(&c, &ns, p, "counter").await?;
        ensure_suspended(&c, &ns, p).await?;
    }
    let mut timeline = Vec::new();
    println!("time\tevent\tcode\tseconds\tbody");
    let mut emit = |line: String, event: &str, r: Option<&Reply>| {
        println!("{line}");
        timeline.push(json!({"event": event, "line": line, "reply": r.map(reply_json)}));
    };
    let act = |p: &str| format!("{ns}/{p}");
    for p in ["p1", "p2"] {
        let r = call(&http, &router, Some(&act(p)), "/").await;
        emit(timeline_line(&format!("{p}-free-worker"), &r), p, Some(&r));
    }
    let r = call(&http, &router, Some(&act("p3")), "/").await;
    emit(
        timeline_line("p3-no-free-worker", &r),
        "p3-no-free-worker",
        Some(&r),
    );
    let full_pool_ok = r.status == 503 && r.body == format!("actor {ns}/p3 {NO_ROOM}");

    let start = SystemTime::now();
    let started = Instant::now();
    emit(
        format!(
            "{}\tp3-request-start\tparked while pool is full",
            rfc3339(start)
        ),
        "p3-request-start",
        None,
    );
    let parked = {
        let (http, router, actor) = (http.clone(), router.clone(), act("p3"));
        tokio::spawn(async move { call(&http, &router, Some(&actor), "/").await })
    };
    tokio::time::sleep(Duration::from_secs_f64(a.free_after)).await;
    suspend(&c, &ns, "p1").await?;
    let freed = started.elapsed().as_secs_f64();
    emit(
        format!(
            "{}\tsuspend-p1-done\tfreed a worker {} s after p3 request started ({freed:.3} s)",
            rfc3339(SystemTime::now()),
            a.free_after
        ),
        "suspend-p1-done",
        None,
    );
    let r = parked.await?;
    emit(
        timeline_line("p3-served-after-park", &r),
        "p3-served-after-park",
        Some(&r),
    );
    let served_ok = r.status == 200;

    let mut load = serde_json::Value::Null;
    if a.load_seconds > 0 {
        eprintln!(
            "==> load run: {} s, 4 actors, each suspended after its answer",
            a.load_seconds
        );
        let deadline = Instant::now() + Duration::from_secs(a.load_seconds);
        let mut set = JoinSet::new();
        for p in actors {
            let (c, http, router, ns) = (c.clone(), http.clone(), router.clone(), ns.clone());
            set.spawn(async move {
                let actor = format!("{ns}/{p}");
                let mut out = Vec::new();
                while Instant::now() < deadline {
                    let r = call(&http, &router, Some(&actor), "/").await;
                    eprintln!(
                        "{}\t{p}\t{}\t{:.6}\t{}",
                        rfc3339(r.start),
                        r.status,
                        r.secs,
                        r.body
                    );
                    let served = r.status == 200;
                    out.push(r);
                    if served && let Err(e) = suspend(&c, &ns, p).await {
                        eprintln!("suspend {p}: {e:#}");
                    }
                }
                out
            });
        }
        let replies: Vec<Reply> = set.join_all().await.into_iter().flatten().collect();
        let statuses: Vec<(u16, f64)> = replies.iter().map(|r| (r.status, r.secs)).collect();
        let summary = summary_block(&statuses);
        println!("{summary}");
        load = json!({"seconds": a.load_seconds, "summary": summary,
                      "requests": replies.iter().map(reply_json).collect::<Vec<_>>()});
    }
    write_json(
        &a.common,
        "parking",
        &json!({"kind": "parking", "atespace": ns, "timeline": timeline, "load": load}),
    )?;
    Ok(if full_pool_ok && served_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

// ------------------------------------------------------------------ throughput

/// CPU of each throughput actor: tiny, so that the slots (not the workers' CPU) bound how many
/// run at once.
const TP_CPU_MILLIS: u32 = 10;
/// Preparations (create, first request, suspend) in flight.
const TP_PREPARERS: usize = 8;

async fn throughput(c: Clients, a: ThroughputArgs) -> anyhow::Result<ExitCode> {
    let settle = Duration::from_secs_f64(a.settle);
    let ns = a
        .common
        .atespace
        .clone()
        .unwrap_or_else(|| "ate-bench-tp".into());
    let concurrency = a
        .concurrency
        .unwrap_or(if a.cycle { 64 } else { 300 })
        .max(1);
    let n_actors = if a.cycle {
        a.actors.unwrap_or(concurrency * 2).max(concurrency)
    } else {
        a.actors.unwrap_or(600)
    };
    anyhow::ensure!(n_actors > 0, "--actors 0: nothing to do");
    let images = images_dir(&c, &a.common).await?;
    let cpu = format!("{TP_CPU_MILLIS}m");
    apply_yaml(&c, &counter_template(&ns, "counter", &images, &cpu)).await?;
    let http = http_client(concurrency);
    let router = a.common.router.clone();
    let names: Vec<String> = (0..n_actors).map(|i| format!("tp-{i}")).collect();
    prepare_counters(&c, &http, &router, &ns, &names).await?;
    let run = TpRun {
        c,
        http,
        router,
        ns,
        names,
        concurrency,
    };
    if a.cycle {
        cycle(run, &a).await
    } else {
        burst(run, &a.common, settle).await
    }
}

/// What both throughput modes work on: prepared (suspended) actors and the client to reach them.
struct TpRun {
    c: Clients,
    http: HttpClient,
    router: String,
    ns: String,
    names: Vec<String>,
    concurrency: usize,
}

/// Makes every named actor exist and be suspended with a snapshot, [`TP_PREPARERS`] at a time;
/// actors that already are (an earlier run's) are only checked.
async fn prepare_counters(
    c: &Clients,
    http: &HttpClient,
    router: &str,
    ns: &str,
    names: &[String],
) -> anyhow::Result<()> {
    let n_actors = names.len();
    eprintln!(
        "==> preparing {n_actors} suspended counter actors in {ns} (create, first request, suspend; suspended ones are reused)"
    );
    let started = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let reused = Arc::new(AtomicU64::new(0));
    let queue = Arc::new(Mutex::new(names.iter().cloned().collect::<VecDeque<_>>()));
    let mut set = JoinSet::new();
    for _ in 0..TP_PREPARERS.min(n_actors) {
        let (c, http, router, ns) = (c.clone(), http.clone(), router.to_string(), ns.to_string());
        let (queue, done, reused) = (queue.clone(), done.clone(), reused.clone());
        set.spawn(async move {
            loop {
                let Some(name) = queue.lock().await.pop_front() else {
                    return anyhow::Ok(());
                };
                ensure_actor(&c, &ns, &name, "counter").await?;
                if !prime(&c, &http, &router, &ns, &name).await? {
                    reused.fetch_add(1, Ordering::Relaxed);
                }
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                if d % 16 == 0 || d as usize == n_actors {
                    eprintln!(
                        "    {d}/{n_actors} ready ({} were ready before), {:.0} s",
                        reused.load(Ordering::Relaxed),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        });
    }
    for r in set.join_all().await {
        r?;
    }
    Ok(())
}

/// How many more actors of `cpu_millis` and `memory_bytes` fit the ACTIVE workers now (the
/// scheduler's test: slots, CPU and memory), and the number of ACTIVE workers.
fn free_room(workers: &[v1::Worker], cpu_millis: u32, memory_bytes: u64) -> (u64, usize) {
    let active: Vec<&v1::Worker> = workers.iter().filter(|w| w.status == "ACTIVE").collect();
    let room = active
        .iter()
        .map(|w| {
            let (cap, used) = (w.capacity.unwrap_or_default(), w.used.unwrap_or_default());
            let slots = u64::from(cap.actor_slots.saturating_sub(used.actor_slots));
            let cpu = u64::from(cap.cpu_millis.saturating_sub(used.cpu_millis))
                / u64::from(cpu_millis.max(1));
            let mem = cap.memory_bytes.saturating_sub(used.memory_bytes) / memory_bytes.max(1);
            slots.min(cpu).min(mem)
        })
        .sum();
    (room, active.len())
}

/// One request of the burst, times in seconds since the burst started.
struct BurstSample {
    actor: String,
    sent: f64,
    done: f64,
    reply: Reply,
}

/// A 200 that resumed a suspended actor (`parked`: the resume waited for room first).
fn is_cold(r: &Reply) -> bool {
    r.status == 200 && (r.resume == "cold" || r.resume == "parked")
}

/// The row of the throughput table (both modes).
struct TpRow {
    actors: usize,
    concurrency: usize,
    requests: usize,
    ok: usize,
    cold: usize,
    seconds: f64,
    p50: f64,
    p99: f64,
}

impl TpRow {
    fn rate(&self) -> f64 {
        self.cold as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }

    fn table(&self) -> String {
        format!(
            "Actors | Concurrency | Requests | Returned 200 | Not 200 | Cold resumes | Seconds | Resumes/s | p50     | p99\n\
             {:>6} | {:>11} | {:>8} | {:>12} | {:>7} | {:>12} | {:>7.1} | {:>9.1} | {:>5.3} s | {:>5.3} s",
            self.actors,
            self.concurrency,
            self.requests,
            self.ok,
            self.requests - self.ok,
            self.cold,
            self.seconds,
            self.rate(),
            self.p50,
            self.p99
        )
    }
}

/// `503 × 12 (no worker has room: 12), 0 (no answer) × 1`: the answers that were not 200.
fn not_ok_summary(replies: &[&Reply]) -> String {
    let mut by_status = std::collections::BTreeMap::<u16, (usize, usize)>::new();
    for r in replies.iter().filter(|r| r.status != 200) {
        let e = by_status.entry(r.status).or_default();
        e.0 += 1;
        e.1 += usize::from(r.body.contains(NO_ROOM));
    }
    let parts: Vec<String> = by_status
        .iter()
        .map(|(status, (n, no_room))| {
            let name = match status {
                0 => "0 (no answer)".to_string(),
                s => s.to_string(),
            };
            match no_room {
                0 => format!("{name} × {n}"),
                k => format!("{name} × {n} (no worker has room: {k})"),
            }
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Per-second counts as a text table, bins of `ceil(len / 60)` seconds so that it stays short.
fn histogram(answers: &[u64], cold: &[u64], not_ok: &[u64]) -> String {
    let bin = answers.len().div_ceil(60).max(1);
    let sum = |v: &[u64], i: usize| v.iter().skip(i).take(bin).sum::<u64>();
    let rows: Vec<(usize, u64, u64, u64)> = (0..answers.len())
        .step_by(bin)
        .map(|i| (i, sum(answers, i), sum(cold, i), sum(not_ok, i)))
        .collect();
    let widest = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1);
    let mut out = format!(
        "Seconds | Answers | Cold resumes | Not 200 | (# cold resume, x not 200; per {bin} s)\n"
    );
    for (i, n, c, bad) in rows {
        let scale = |k: u64| (k * 50).div_ceil(widest) as usize;
        let line = format!(
            "{:>7} | {n:>7} | {c:>12} | {bad:>7} | {}{}",
            format!("{i}–{}", i + bin),
            "#".repeat(scale(c)),
            "x".repeat(scale(bad))
        );
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// Counts of `at` (seconds) per whole second, over `len` seconds.
fn per_second(len: usize, at: impl Iterator<Item = f64>) -> Vec<u64> {
    let mut v = vec![0u64; len.max(1)];
    for t in at {
        let i = (t.max(0.0) as usize).min(v.len() - 1);
        v[i] += 1;
    }
    v
}

/// The spec's shape: one request to each suspended actor, at most `concurrency` in flight;
/// resumes/s = cold resumes / (last answer − first request sent).
async fn burst(run: TpRun, common: &Common, settle: Duration) -> anyhow::Result<ExitCode> {
    let TpRun {
        c,
        http,
        router,
        ns,
        names,
        concurrency,
    } = run;
    let n = names.len();
    let memory = COUNTER_MEMORY_MIB << 20;
    let room = match rpc(c
        .fleet
        .clone()
        .list_workers(v1::ListWorkersRequest {})
        .await)
    {
        Ok(list) => Some(free_room(&list.workers, TP_CPU_MILLIS, memory)),
        Err(e) => {
            eprintln!("warning: cannot list the workers to check their free room: {e:#}");
            None
        }
    };
    let note = match room {
        Some((room, workers)) if (room as usize) < n => Some(format!(
            "note: the pool has room for {room} more actors of this size ({TP_CPU_MILLIS}m CPU, \
             {COUNTER_MEMORY_MIB} MiB; {workers} active workers), fewer than --actors {n}. Answered \
             actors keep running, so requests beyond that room park for the router's budget and \
             may get 503 (no worker has room): the pool is full, not a failed resume; they show \
             in the table as Not 200."
        )),
        _ => None,
    };
    if let Some(note) = &note {
        eprintln!("{note}");
    }
    tokio::time::sleep(settle).await;
    eprintln!(
        "==> burst: one request to each of {n} suspended actors, at most {concurrency} in flight{}",
        room.map(|(r, _)| format!(" (free room for {r})"))
            .unwrap_or_default()
    );
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let answered = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut set = JoinSet::new();
    for name in names {
        let (http, router, permits) = (http.clone(), router.clone(), permits.clone());
        let (answered, served) = (answered.clone(), served.clone());
        let actor = format!("{ns}/{name}");
        set.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("never closed");
            let sent = started.elapsed().as_secs_f64();
            let reply = call(&http, &router, Some(&actor), "/").await;
            let done = started.elapsed().as_secs_f64();
            answered.fetch_add(1, Ordering::Relaxed);
            served.fetch_add(u64::from(reply.status == 200), Ordering::Relaxed);
            BurstSample {
                actor,
                sent,
                done,
                reply,
            }
        });
    }
    let mut all = tokio::spawn(async move { set.join_all().await });
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    ticker.tick().await;
    let samples: Vec<BurstSample> = loop {
        tokio::select! {
            _ = ticker.tick() => {
                let (a, s) = (answered.load(Ordering::Relaxed), served.load(Ordering::Relaxed));
                eprintln!(
                    "    {:.0} s: {a}/{n} answered ({s} × 200), {} in flight",
                    started.elapsed().as_secs_f64(),
                    (n as u64 - a).min(concurrency as u64)
                );
            }
            r = &mut all => break r?,
        }
    };
    let first = samples.iter().map(|s| s.sent).fold(f64::INFINITY, f64::min);
    let last = samples.iter().map(|s| s.done).fold(0.0, f64::max);
    let wall = (last - first).max(0.0);
    let replies: Vec<&Reply> = samples.iter().map(|s| &s.reply).collect();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let cold: Vec<&BurstSample> = samples.iter().filter(|s| is_cold(&s.reply)).collect();
    let parked = cold.iter().filter(|s| s.reply.resume == "parked").count();
    let cold_secs = sorted(cold.iter().map(|s| s.reply.secs).collect());
    let all_secs = sorted(replies.iter().map(|r| r.secs).collect());
    let row = TpRow {
        actors: n,
        concurrency,
        requests: samples.len(),
        ok,
        cold: cold.len(),
        seconds: wall,
        p50: median(&cold_secs),
        p99: pct(&cold_secs, 0.99),
    };
    let bins = wall.ceil() as usize;
    let at = |f: fn(&Reply) -> bool| {
        per_second(
            bins,
            samples
                .iter()
                .filter(move |s| f(&s.reply))
                .map(move |s| s.done - first),
        )
    };
    let answers = at(|_| true);
    let cold_per_second = at(is_cold);
    let not_ok_per_second = at(|r| r.status != 200);

    println!(
        "Burst: one request to each of {n} suspended actors, at most {concurrency} in flight; \
         seconds from the first request sent to the last answer"
    );
    println!("{}", row.table());
    println!("not 200: {}", not_ok_summary(&replies));
    println!(
        "cold resumes (ate-resume cold|parked): {}, of which parked {parked}; other 200: {}; \
         p50/p99 of every answer: {:.3} s / {:.3} s",
        cold.len(),
        ok - cold.len(),
        median(&all_secs),
        pct(&all_secs, 0.99)
    );
    // The wall time runs to the last answer; when some answers were not 200 (a 503 comes after
    // the parking budget), the rate up to the last cold resume tells what the resumes did.
    let last_cold = cold.iter().map(|s| s.done - first).fold(0.0, f64::max);
    let rate_to_last_cold = cold.len() as f64 / last_cold.max(f64::MIN_POSITIVE);
    if ok < n && !cold.is_empty() {
        println!(
            "up to the last cold resume ({last_cold:.1} s after the first request): \
             {rate_to_last_cold:.1} resumes/s"
        );
    }
    if let Some(note) = &note {
        println!("{note}");
    }
    print!(
        "{}",
        histogram(&answers, &cold_per_second, &not_ok_per_second)
    );
    let errors: Vec<String> = replies
        .iter()
        .filter(|r| r.status != 200)
        .take(10)
        .map(|r| format!("{} {}", r.status, r.body))
        .collect();
    for e in &errors {
        eprintln!("    {e}");
    }
    let samples_json: Vec<serde_json::Value> = samples
        .iter()
        .map(|s| {
            let mut v = reply_json(&s.reply);
            v["actor"] = json!(s.actor);
            v["sent_seconds"] = json!(s.sent - first);
            v["done_seconds"] = json!(s.done - first);
            v
        })
        .collect();
    write_json(
        common,
        "throughput",
        &json!({"kind": "throughput", "mode": "burst", "router": router, "atespace": ns,
                "seconds": wall, "concurrency": concurrency, "actors": n,
                "free_room_at_start": room.map(|r| r.0), "active_workers": room.map(|r| r.1),
                "note": note,
                "requests": samples.len(), "returned_200": ok, "not_200": samples.len() - ok,
                "cold_resumes": cold.len(), "parked_resumes": parked,
                "resumes_per_second": row.rate(),
                "last_cold_resume_seconds": last_cold,
                "resumes_per_second_to_last_cold_resume": rate_to_last_cold,
                "p50_seconds": row.p50, "p99_seconds": row.p99,
                "p50_seconds_all": median(&all_secs), "p99_seconds_all": pct(&all_secs, 0.99),
                "answers_per_second": answers, "cold_per_second": cold_per_second,
                "not_200_per_second": not_ok_per_second,
                "first_errors": errors, "samples": samples_json}),
    )?;
    Ok(if ok == n {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The sustained loop: requesters keep `concurrency` requests to suspended actors in flight for
/// `--seconds`, suspenders suspend each served actor again (bounded by the suspends' dumps).
async fn cycle(run: TpRun, a: &ThroughputArgs) -> anyhow::Result<ExitCode> {
    let TpRun {
        c,
        http,
        router,
        ns,
        names,
        concurrency,
    } = run;
    let n_actors = names.len();
    // Ready (suspended) actors → requesters → suspend queue → suspenders → ready again.
    let (ready_tx, ready_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for n in &names {
        ready_tx.send(n.clone())?;
    }
    let ready_rx = Arc::new(Mutex::new(ready_rx));
    let done_rx = Arc::new(Mutex::new(done_rx));
    eprintln!(
        "==> cycle, {} s: {concurrency} requests in flight, each to a suspended actor; {} suspends in flight",
        a.seconds, a.suspenders
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.seconds);
    // Set at the end: each suspender finishes the suspend it is in and takes no other. A suspend
    // call is never dropped halfway: the api runs the workflow inside the call, and a cancelled
    // one has left the actor SUSPENDING under a lease that is never released.
    let stop = Arc::new(AtomicBool::new(false));
    let mut suspenders = JoinSet::new();
    for _ in 0..a.suspenders.max(1) {
        let (c, ns, done_rx, ready_tx) = (c.clone(), ns.clone(), done_rx.clone(), ready_tx.clone());
        let stop = stop.clone();
        suspenders.spawn(async move {
            let mut n = 0u64;
            loop {
                if stop.load(Ordering::Relaxed) {
                    return n;
                }
                let next = done_rx.lock().await.recv().await;
                let Some(name) = next else { return n };
                match suspend(&c, &ns, &name).await {
                    Ok(()) => n += 1,
                    Err(e) => {
                        eprintln!("{e:#}");
                        // Leave it a moment (it may be RESUMING) and try again later.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let _ = ready_tx.send(name);
                        continue;
                    }
                }
                let _ = ready_tx.send(name);
            }
        });
    }
    let mut requesters = JoinSet::new();
    for _ in 0..concurrency {
        let (http, router, ns, ready_rx, done_tx) = (
            http.clone(),
            router.clone(),
            ns.clone(),
            ready_rx.clone(),
            done_tx.clone(),
        );
        requesters.spawn(async move {
            let mut out = Vec::new();
            while Instant::now() < deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                let next =
                    tokio::time::timeout(left, async { ready_rx.lock().await.recv().await }).await;
                let Ok(Some(name)) = next else { break };
                let actor = format!("{ns}/{name}");
                let r = call(&http, &router, Some(&actor), "/").await;
                let at = started.elapsed().as_secs_f64();
                let _ = done_tx.send(name);
                out.push((at, actor, r));
            }
            out
        });
    }
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    ticker.tick().await;
    let replies: Vec<(f64, String, Reply)> = loop {
        tokio::select! {
            _ = ticker.tick() => eprintln!("    {:.0} s", started.elapsed().as_secs_f64()),
            _ = tokio::time::sleep_until(deadline.into()) => break requesters.join_all().await.into_iter().flatten().collect(),
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    drop(done_tx);
    drop(ready_tx);
    eprintln!("==> waiting for the suspends in flight");
    if tokio::time::timeout(Duration::from_secs(120), suspenders.join_all())
        .await
        .is_err()
    {
        eprintln!("warning: suspends still in flight after 120 s; abandoned");
    }
    let cold: Vec<&(f64, String, Reply)> = replies.iter().filter(|(_, _, r)| is_cold(r)).collect();
    let ok = replies.iter().filter(|(_, _, r)| r.status == 200).count();
    let secs = sorted(cold.iter().map(|(_, _, r)| r.secs).collect());
    let per_second = per_second(elapsed.ceil() as usize + 1, cold.iter().map(|c| c.0));
    let row = TpRow {
        actors: n_actors,
        concurrency,
        requests: replies.len(),
        ok,
        cold: cold.len(),
        seconds: elapsed,
        p50: median(&secs),
        p99: pct(&secs, 0.99),
    };
    println!(
        "Cycle: {concurrency} requests in flight to suspended actors for {} s, {} suspenders; \
         seconds include draining",
        a.seconds, a.suspenders
    );
    println!("{}", row.table());
    let all: Vec<&Reply> = replies.iter().map(|(_, _, r)| r).collect();
    println!("not 200: {}", not_ok_summary(&all));
    let errors: Vec<String> = replies
        .iter()
        .filter(|(_, _, r)| r.status != 200)
        .take(10)
        .map(|(_, _, r)| format!("{} {}", r.status, r.body))
        .collect();
    for e in &errors {
        eprintln!("    {e}");
    }
    let samples: Vec<serde_json::Value> = replies
        .iter()
        .map(|(at, actor, r)| {
            let mut v = reply_json(r);
            v["actor"] = json!(actor);
            v["done_seconds"] = json!(at);
            v
        })
        .collect();
    write_json(
        &a.common,
        "throughput",
        &json!({"kind": "throughput", "mode": "cycle", "seconds": elapsed,
                "concurrency": concurrency, "suspenders": a.suspenders,
                "actors": n_actors, "requests": replies.len(), "returned_200": ok,
                "not_200": replies.len() - ok,
                "cold_resumes": cold.len(), "resumes_per_second": row.rate(),
                "p50_seconds": row.p50, "p99_seconds": row.p99,
                "cold_per_second": per_second, "first_errors": errors, "samples": samples}),
    )?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_table_compares_lazy_with_eager() {
        let series = |restore: &'static str, first: f64| SnapSeries {
            label: "sleeper 1024 MiB".into(),
            template: format!("t-{restore}"),
            restore,
            suspend: vec![1.0, 2.0, 3.0],
            first_local: vec![first, first, first],
            full_local: vec![1.0],
            uploaded: vec![2.0 * 1024.0 * 1024.0],
            ..Default::default()
        };
        let (lazy, eager) = (series("lazy", 0.1), series("eager", 0.4));
        let table = snapshots_table(&[&lazy, &eager], 3);
        assert!(
            table.contains("sleeper 1024 MiB  | lazy    |  2.000 s |"),
            "{table}"
        );
        assert!(table.contains("2.00 MiB"), "{table}");
        assert!(
            table.contains("lazy/eager first answer node-local 0.25×, durable -"),
            "{table}"
        );
    }

    #[test]
    fn summary_block_matches_the_spec_format() {
        let mut s = vec![(200, 1.0), (200, 0.5), (503, 5.05)];
        s.push((502, 0.1));
        assert_eq!(
            summary_block(&s),
            "==> results\n    total requests : 4\n    200 OK         : 2\n    503 unavailable: 1\n    other          : 1\n    200 latency    : avg 0.750s, slowest 1.000000s"
        );
    }

    fn worker(status: &str, cap: (u32, u32, u64), used: (u32, u32, u64)) -> v1::Worker {
        let capacity = |(slots, cpu, mib): (u32, u32, u64)| v1::Capacity {
            actor_slots: slots,
            cpu_millis: cpu,
            memory_bytes: mib << 20,
        };
        v1::Worker {
            status: status.into(),
            capacity: Some(capacity(cap)),
            used: Some(capacity(used)),
            ..Default::default()
        }
    }

    #[test]
    fn free_room_is_the_tightest_resource_of_each_active_worker() {
        let workers = [
            // 64 − 10 slots, but CPU for (2000 − 1900) / 10 = 10.
            worker("ACTIVE", (64, 2000, 8192), (10, 1900, 0)),
            // Slots bound: 8 − 5 = 3.
            worker("ACTIVE", (8, 2000, 8192), (5, 0, 0)),
            // Memory bounds: (1024 − 64 × 12) / 64 = 4.
            worker("ACTIVE", (64, 2000, 1024), (12, 0, 768)),
            // Over-used: none, not a negative number.
            worker("ACTIVE", (4, 2000, 8192), (5, 0, 0)),
            worker("GONE", (64, 2000, 8192), (0, 0, 0)),
        ];
        assert_eq!(free_room(&workers, 10, 64 << 20), (17, 4));
        assert_eq!(free_room(&[], 10, 64 << 20), (0, 0));
    }

    #[test]
    fn per_second_counts_and_histogram() {
        assert_eq!(
            per_second(3, [0.1, 0.9, 1.0, 2.99, 3.0].into_iter()),
            [2, 1, 2]
        );
        assert_eq!(per_second(0, [5.0].into_iter()), [1]);
        let h = histogram(&[3, 1, 0], &[2, 1, 0], &[1, 0, 0]);
        assert_eq!(
            h,
            concat!(
                "Seconds | Answers | Cold resumes | Not 200 | (# cold resume, x not 200; per 1 s)\n",
                "    0–1 |       3 |            2 |       1 | ##################################xxxxxxxxxxxxxxxxx\n",
                "    1–2 |       1 |            1 |       0 | #################\n",
                "    2–3 |       0 |            0 |       0 |\n",
            )
        );
        // Long runs are binned so that the table stays short.
        let long = vec![1u64; 125];
        let h = histogram(&long, &long, &vec![0; 125]);
        assert_eq!(h.lines().count(), 1 + 42, "{h}");
        assert!(
            h.contains("per 3 s") && h.contains("123–126 |       2 |"),
            "{h}"
        );
    }

    #[test]
    fn throughput_table_and_not_200_summary() {
        let row = TpRow {
            actors: 64,
            concurrency: 32,
            requests: 64,
            ok: 60,
            cold: 59,
            seconds: 5.0,
            p50: 1.25,
            p99: 3.5,
        };
        assert_eq!(
            row.table(),
            concat!(
                "Actors | Concurrency | Requests | Returned 200 | Not 200 | Cold resumes | Seconds | Resumes/s | p50     | p99\n",
                "    64 |          32 |       64 |           60 |       4 |           59 |     5.0 |      11.8 | 1.250 s | 3.500 s",
            )
        );
        let reply = |status: u16, body: &str| Reply {
            status,
            body: body.into(),
            resume: String::new(),
            secs: 1.0,
            start: UNIX_EPOCH,
        };
        let replies = [
            reply(200, "ok"),
            reply(503, &format!("actor a/b {NO_ROOM}")),
            reply(503, "other"),
            reply(0, "timed out after 60 s"),
        ];
        let refs: Vec<&Reply> = replies.iter().collect();
        assert_eq!(
            not_ok_summary(&refs),
            "0 (no answer) × 1, 503 × 2 (no worker has room: 1)"
        );
        assert_eq!(not_ok_summary(&refs[..1]), "none");
        assert!(is_cold(&Reply {
            resume: "parked".into(),
            ..reply(200, "")
        }));
        assert!(!is_cold(&Reply {
            resume: "warm".into(),
            ..reply(200, "")
        }));
    }

    #[test]
    fn numbers() {
        let v = sorted(vec![3.0, 1.0, 2.0, 4.0]);
        assert_eq!(median(&v), 2.5);
        assert_eq!(pct(&v, 1.0), 4.0);
        assert_eq!(pct(&v, 0.5), 2.0);
        assert_eq!(parse_mib("50MiB").unwrap(), 50);
        assert_eq!(parse_mib("1Gi").unwrap(), 1024);
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_millis(1_794_483_160_522)),
            "2026-11-12T11:32:40.522Z"
        );
    }
}
