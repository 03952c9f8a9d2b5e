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
//! - `noisy`: a quiet counter's warm latency without and with a CPU-hog actor beside it
//!   (`noisy.rs`).
//! - `density`: as many idle counters running as the system admits, their memory, the limit
//!   that stopped them and a resume with 1 vs N running (`density.rs`).
//!
//! Progress goes to stderr, the table to stdout, the results as JSON to `--out` (default
//! `bench-<kind>.json`, with every sample) and an SVG chart beside it (`plot/`).
//!
//! `ate bench faults` starts a system of its own and stays in ate-cli (`faults/`), which puts
//! these subcommands and its own under `ate bench`.
//!
//! Errors are `anyhow`: this crate is used only by the `ate` binary (ate-cli), and the benches
//! report failures as the binary does (a message with its context chain), nothing matches on them.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ate_client::{ApplyError, Clients};
use ate_core::SuspendMode;
use ate_proto::v1;
use bytes::Bytes;
use clap::{Args, Subcommand};
use futures::{StreamExt, stream};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

mod alarms;
mod calls;
mod density;
pub mod faults;
mod h2load;
mod hibernate;
mod nginx;
mod noisy;
mod parking;
mod plot;
mod podman;
mod resume;
mod scale;
mod snapshots;
mod throughput;
mod warm;

pub use alarms::AlarmsArgs;
pub use calls::CallsArgs;
pub use density::DensityArgs;
pub use hibernate::HibernateArgs;
pub use noisy::NoisyArgs;
pub use parking::ParkingArgs;
pub use resume::ResumeArgs;
pub use snapshots::SnapshotsArgs;
pub use throughput::ThroughputArgs;
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
    /// What a warm call from one actor to another adds over a direct router request to the
    /// same callee.
    Calls(CallsArgs),
    /// Lateness of many alarms due within a few seconds (one per counter actor, each asking to
    /// be suspended once it has its alarm).
    Alarms(AlarmsArgs),
    /// A quiet counter's warm request latency without and with a CPU-hog actor beside it.
    Noisy(NoisyArgs),
    /// As many idle counters RUNNING as the system admits: memory per actor, the limit that
    /// stopped them, a resume with 1 vs N running.
    Density(DensityArgs),
    /// The control plane with many actors in its PostgreSQL store (1,000 then 1,000,000 by
    /// default): warm and cold resume, listing them all, the api's idle CPU.
    Scale(scale::ScaleArgs),
    /// The router's memory per hibernated WebSocket (`webSockets: hibernate`): N sockets to M
    /// actors, all asleep; then the wake of one actor per message.
    Hibernate(HibernateArgs),
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

impl Common {
    /// The atespace the bench works in: `--atespace`, or the bench's own default.
    fn atespace_or(&self, default: &str) -> String {
        self.atespace.clone().unwrap_or_else(|| default.to_string())
    }
}

pub async fn run(c: Clients, cmd: BenchCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCmd::Resume(a) => resume::resume(c, a).await,
        BenchCmd::Parking(a) => parking::parking(c, a).await,
        BenchCmd::Throughput(a) => throughput::throughput(c, a).await,
        BenchCmd::Warm(a) => warm::warm(c, a).await,
        BenchCmd::Snapshots(a) => snapshots::snapshots(c, a).await,
        BenchCmd::Calls(a) => calls::calls(c, a).await,
        BenchCmd::Alarms(a) => alarms::alarms(c, a).await,
        BenchCmd::Noisy(a) => noisy::noisy(c, a).await,
        BenchCmd::Density(a) => density::density(c, a).await,
        BenchCmd::Scale(a) => scale::scale(c, a).await,
        BenchCmd::Hibernate(a) => hibernate::hibernate(c, a).await,
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
    r.map(tonic::Response::into_inner).map_err(status_error)
}

/// An api error as the bench reports it: the message and the code.
fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", s.message(), s.code())
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
    ate_client::apply_documents(c, text)
        .await
        .map_err(|e| match e {
            ApplyError::Invalid(e) => e.into(),
            ApplyError::Atespace { name, status } => {
                anyhow::anyhow!("atespace {name}: {}", status.message())
            }
            ApplyError::Template { name, status } => {
                status_error(status).context(format!("template {name}"))
            }
        })
}

/// Memory of every counter actor of the bench's templates.
const COUNTER_MEMORY_MIB: u64 = 64;

fn counter_template(ns: &str, name: &str, images: &str, cpu: &str) -> String {
    counter_template_sized(ns, name, images, cpu, COUNTER_MEMORY_MIB)
}

/// The counter with its CPU and memory limit (MiB) given.
fn counter_template_sized(
    ns: &str,
    name: &str,
    images: &str,
    cpu: &str,
    memory_mib: u64,
) -> String {
    let counter = counter_container("counter", images, "", 80);
    counter_spec(ns, name, &counter, cpu, memory_mib)
}

/// The counter with a sidecar (a second counter it calls over loopback on every request):
/// `ate bench snapshots` measures it beside the single counter.
fn counter_sidecar_template(ns: &str, name: &str, images: &str) -> String {
    let counter = counter_container(
        "counter",
        images,
        r#"      env: [{name: SIDECAR_ADDR, value: "127.0.0.1:9000"}, {name: PORT2, value: "off"}]
"#,
        80,
    );
    let sidecar = counter_container(
        "sidecar",
        images,
        r#"      env: [{name: PORT, value: "9000"}, {name: PORT2, value: "off"}, {name: ATE_DATA_DIR, value: /data/sidecar}]
      ports: [{containerPort: 9000}]
"#,
        9000,
    );
    let containers = format!("{counter}{sidecar}");
    counter_spec(ns, name, &containers, "250m", 2 * COUNTER_MEMORY_MIB)
}

/// One container of the counter image: `extra` its lines between the command and the wake-up
/// probe, which asks port `probe_port`.
fn counter_container(name: &str, images: &str, extra: &str, probe_port: u16) -> String {
    format!(
        r#"    - name: {name}
      image: "oci-layout:{images}/counter:latest"
      command: ["/counter"]
{extra}      wakeupProbe: {{httpGet: {{path: /healthz, port: {probe_port}}}, timeoutSeconds: 10}}
"#
    )
}

/// A counter template: `containers`, then the resources, the data volume, memory snapshots and
/// the idle timeout.
fn counter_spec(ns: &str, name: &str, containers: &str, cpu: &str, memory_mib: u64) -> String {
    let spec = format!(
        r#"  containers:
{containers}  resources: {{cpu: {cpu}, memory: {memory_mib}Mi}}
  volumes: [{{name: data, mountPath: /data}}]
  snapshots: {{fidelity: memory}}
  idleTimeout: 5m
"#
    );
    template_yaml(ns, name, &spec)
}

fn sleeper_template(ns: &str, name: &str, images: &str, mib: u64, eager: bool) -> String {
    let restore = if eager { ", memoryRestore: eager" } else { "" };
    let spec = format!(
        r#"  containers:
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
    );
    template_yaml(ns, name, &spec)
}

/// The ids of the workers under `<state>/workers` that left sandboxes behind (their `actors`
/// directory is not empty): what `ate worker --remove-leftovers` has to be run for, one run per
/// id. Sandboxes outlive their workers on purpose (a restarted worker re-adopts them).
pub fn workers_with_leftovers(state: &Path) -> Vec<String> {
    let Ok(workers) = std::fs::read_dir(state.join("workers")) else {
        return Vec::new();
    };
    workers
        .flatten()
        .filter(|w| {
            std::fs::read_dir(w.path().join("actors")).is_ok_and(|mut d| d.next().is_some())
        })
        .map(|w| w.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The arguments of `ate` that remove what worker `id` of the system in `state` left behind
/// (`ate worker --remove-leftovers`, no spare network namespaces made).
pub fn remove_leftovers_args(state: &Path, id: &str) -> Vec<std::ffi::OsString> {
    let args = [
        "worker",
        "--id",
        id,
        "--remove-leftovers",
        "--spare-netns",
        "0",
    ];
    let mut out: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    out.extend(["--state-dir".into(), state.as_os_str().to_owned()]);
    out
}

/// An atespace `ns` and the actor template `name` in it with `spec` (YAML, indented).
fn template_yaml(ns: &str, name: &str, spec: &str) -> String {
    format!(
        r#"apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {{name: {ns}}}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {{namespace: {ns}, name: {name}}}
spec:
{spec}"#
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
            reason: String::new(),
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

/// A baseline's program: `name` on PATH, else Debian's `fallback`.
fn find_program(name: &str, fallback: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .chain([PathBuf::from(fallback)])
        .find(|candidate| candidate.is_file())
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

/// Deletes the actors (forced: running ones are stopped without a snapshot), `concurrency` at
/// a time; failures are reported, not fatal.
pub(crate) async fn delete_all(c: &Clients, ns: &str, names: Vec<String>, concurrency: usize) {
    stream::iter(names)
        .for_each_concurrent(concurrency, |name| async move {
            let r = c
                .actors
                .clone()
                .delete_actor(v1::DeleteActorRequest {
                    actor: obj(ns, &name),
                    force: true,
                    purge_volumes: false,
                })
                .await;
            if let Err(s) = r
                && s.code() != tonic::Code::NotFound
            {
                eprintln!("    delete {ns}/{name}: {}", s.message());
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_block_matches_the_spec_format() {
        let mut s = vec![(200, 1.0), (200, 0.5), (503, 5.05)];
        s.push((502, 0.1));
        assert_eq!(
            summary_block(&s),
            "==> results\n    total requests : 4\n    200 OK         : 2\n    503 unavailable: 1\n    other          : 1\n    200 latency    : avg 0.750s, slowest 1.000000s"
        );
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
