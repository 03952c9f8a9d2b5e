//! `ate bench scale`: the control plane with many actors in its store (issue 34, item 4). The
//! store is filled with suspended actors up to each size in turn (written straight into the
//! PostgreSQL store `ate up --store` uses: a million CreateActor calls would take the bench's
//! time, not the system's), and at each size it measures, against one probe actor:
//!
//! - a warm ResumeActor (the probe RUNNING: one store read, no lease);
//! - a cold resume through the router (the probe suspended, then requested);
//! - listing every actor the way `ate get actors -A` does (pages of 1,000);
//! - the api's own CPU while nothing is asked of it.
//!
//! The seeded actors are the counter template's, never started; they are deleted at the end.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_client::Clients;
use ate_proto::v1;
use clap::Args;

use crate::{
    Common, apply_yaml, call, counter_template, ensure_actor, ensure_suspended, http_client,
    images_dir, median, obj, pct, rpc, sorted, write_json,
};

#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    #[command(flatten)]
    common: Common,
    /// The system's store (`ate up --store …`): PostgreSQL, where the seeded actors are written.
    #[arg(long, env = "ATE_STORE")]
    store: String,
    /// Store sizes (actors) to measure at, in increasing order.
    #[arg(long, value_delimiter = ',', default_value = "1000,1000000")]
    sizes: Vec<u64>,
    /// Warm ResumeActor calls per size.
    #[arg(long, default_value_t = 300)]
    warm_samples: usize,
    /// Cold resumes per size.
    #[arg(long, default_value_t = 5)]
    cold_samples: usize,
    /// How long the api's idle CPU is measured per size.
    #[arg(long, default_value = "20s", value_parser = ate_core::duration::parse_duration)]
    idle: Duration,
    /// Leave the seeded actors in the store.
    #[arg(long)]
    keep: bool,
}

/// Seeded actors' names: `s-0000001` …, after the probe in name order.
const SEED_PREFIX: &str = "s-";
const SEED_BATCH: u64 = 100_000;

pub(crate) async fn scale(c: Clients, a: ScaleArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.store.starts_with("postgres://") || a.store.starts_with("postgresql://"),
        "the scale bench seeds a PostgreSQL store (--store postgres://…), got {:?}",
        a.store
    );
    anyhow::ensure!(
        a.sizes.windows(2).all(|w| w[0] < w[1]) && !a.sizes.is_empty(),
        "--sizes must increase"
    );
    let ns = a.common.atespace_or("bench-scale");
    let images = images_dir(&c, &a.common).await?;
    apply_yaml(&c, &counter_template(&ns, "counter", &images, "250m")).await?;
    ensure_actor(&c, &ns, "probe", "counter").await?;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&a.store)
        .await
        .with_context(|| format!("connect to {}", a.store))?;
    let http = http_client(4);
    let router = a.common.router.clone();
    let api_pid = find_api_pid();
    let mut results = Vec::new();
    for &size in &a.sizes {
        let seeded = seed(&db, &ns, size).await?;
        let total = count_actors(&c).await?;
        eprintln!("==> {total} actors in the store ({seeded} seeded)");
        // Cold: the probe suspended, then requested through the router.
        let mut cold = Vec::new();
        for _ in 0..a.cold_samples {
            ensure_suspended(&c, &ns, "probe").await?;
            let r = call(&http, &router, Some(&format!("{ns}/probe")), "/").await;
            anyhow::ensure!(r.status == 200, "probe: {} {}", r.status, r.body);
            cold.push(r.secs);
        }
        // Warm: ResumeActor of the running probe, as a router on a cache miss calls it.
        let mut warm = Vec::new();
        for _ in 0..a.warm_samples {
            let started = Instant::now();
            rpc(c
                .actors
                .clone()
                .resume_actor(v1::ResumeActorRequest {
                    actor: obj(&ns, "probe"),
                })
                .await)?;
            warm.push(started.elapsed().as_secs_f64());
        }
        let listed = Instant::now();
        let n = count_actors(&c).await?;
        let list_secs = listed.elapsed().as_secs_f64();
        let idle = match api_pid {
            Some(pid) => Some(idle_cpu(pid, a.idle).await?),
            None => None,
        };
        let (warm, cold) = (sorted(warm), sorted(cold));
        eprintln!(
            "    warm ResumeActor median {:.2} ms (p99 {:.2}); cold resume median {:.0} ms; list {n} in {list_secs:.1} s; api idle CPU {}",
            median(&warm) * 1e3,
            pct(&warm, 0.99) * 1e3,
            median(&cold) * 1e3,
            idle.map_or(
                "unknown (no `ate api` process found)".to_string(),
                |p| format!("{p:.2} %")
            ),
        );
        results.push(serde_json::json!({
            "actors": n,
            "warm_resume_ms": {"median": median(&warm) * 1e3, "p99": pct(&warm, 0.99) * 1e3},
            "cold_resume_ms": {"median": median(&cold) * 1e3, "samples": cold.iter().map(|s| s * 1e3).collect::<Vec<_>>()},
            "list_all_seconds": list_secs,
            "api_idle_cpu_percent": idle,
        }));
    }
    if let (Some(first), Some(last)) = (results.first(), results.last()) {
        let ratio = |k: &str| {
            last[k]["median"].as_f64().unwrap_or(0.0) / first[k]["median"].as_f64().unwrap_or(1.0)
        };
        eprintln!(
            "==> {} vs {} actors: warm {:.2}×, cold {:.2}×",
            last["actors"],
            first["actors"],
            ratio("warm_resume_ms"),
            ratio("cold_resume_ms")
        );
    }
    ensure_suspended(&c, &ns, "probe").await?;
    if !a.keep {
        let gone = sqlx::query("DELETE FROM actors WHERE atespace = $1 AND name LIKE 's-%'")
            .bind(&ns)
            .execute(&db)
            .await?
            .rows_affected();
        eprintln!("==> {gone} seeded actors deleted");
    }
    write_json(
        &a.common,
        "scale",
        &serde_json::json!({ "kind": "scale", "sizes": results }),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Adds suspended counter actors to the store until it holds `size` (the probe included);
/// returns how many it added. Written as the store writes a new actor (`ate-store`'s
/// `create_actor`), in batches of [`SEED_BATCH`].
async fn seed(db: &sqlx::PgPool, ns: &str, size: u64) -> anyhow::Result<u64> {
    let have: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM actors")
        .fetch_one(db)
        .await?;
    let have = u64::try_from(have).unwrap_or(0);
    let mut added = 0;
    let now = ate_core::clock::now_ms();
    let mut from = have;
    while from < size {
        let to = (from + SEED_BATCH).min(size);
        let done = sqlx::query(
            "INSERT INTO actors (atespace, name, uid, template, state, worker_selector, worker_id, \
             epoch, generation, attached_node, last_error, created_ms, updated_ms, activation) \
             SELECT $1, $2 || lpad(g::text, 7, '0'), 'seed-' || $1 || '-' || g, $1 || '/counter', \
             'ACTOR_STATE_SUSPENDED', '{}', NULL, 0, 0, NULL, '', $3, $3, 0 \
             FROM generate_series($4::bigint, $5::bigint) AS g ON CONFLICT DO NOTHING",
        )
        .bind(ns)
        .bind(SEED_PREFIX)
        .bind(now)
        .bind(i64::try_from(from + 1)?)
        .bind(i64::try_from(to)?)
        .execute(db)
        .await
        .context("seeding actors")?;
        added += done.rows_affected();
        from = to;
        eprintln!("    seeded up to {to}");
    }
    Ok(added)
}

/// Every actor, paged as `ate get actors -A --chunk-size 1000` reads them.
async fn count_actors(c: &Clients) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut page_token = String::new();
    loop {
        let page = rpc(c
            .actors
            .clone()
            .list_actors(v1::ListActorsRequest {
                atespace: String::new(),
                page_size: 1000,
                page_token,
            })
            .await)?;
        n += page.actors.len() as u64;
        if page.next_page_token.is_empty() {
            return Ok(n);
        }
        page_token = page.next_page_token;
    }
}

/// The process titled `ate api` (`ate up` starts one).
fn find_api_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "ate api").then_some(pid)
    })
}

/// The process's CPU (user + system) over `window`, in percent of one core.
async fn idle_cpu(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let ticks = || -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command (which may hold spaces) start after the last ')'.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = f.get(11).context("utime")?.parse()?;
        let stime: u64 = f.get(12).context("stime")?.parse()?;
        Ok(utime + stime)
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let before = ticks()?;
    tokio::time::sleep(window).await;
    let after = ticks()?;
    Ok((after - before) as f64 / hz / window.as_secs_f64() * 100.0)
}
