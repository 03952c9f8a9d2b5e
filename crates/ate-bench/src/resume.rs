//! `ate bench resume`: n suspended sleeper actors resumed by n simultaneous requests, for each n.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ate_client::Clients;
use clap::Args;
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::{
    Common, Reply, apply_yaml, call, ensure_actor, ensure_suspended, http_client, images_dir,
    median, parse_mib, parse_settle, pct, prime, reply_json, sleeper_template, sorted, write_json,
};

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

pub(super) async fn resume(c: Clients, a: ResumeArgs) -> anyhow::Result<ExitCode> {
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
