//! `ate bench snapshots`: suspend time and resume-to-first-response of the counter and of sleepers,
//! from the node-local generation and from the durable copy, with the table comparing them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_client::Clients;
use ate_core::SuspendMode;
use clap::Args;
use serde_json::json;

use super::{
    Common, HttpClient, apply_yaml, call, counter_sidecar_template, counter_template, ensure_actor,
    ensure_suspended, get_actor, http_client, images_dir, median, parse_mib, sleeper_template,
    sorted, suspend_mode, write_json,
};

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
pub(super) async fn snapshots(c: Clients, a: SnapshotsArgs) -> anyhow::Result<ExitCode> {
    let ns = a.common.atespace_or("ate-bench-snap");
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
}
