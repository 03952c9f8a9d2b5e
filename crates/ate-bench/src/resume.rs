//! `ate bench resume`: n suspended sleeper actors resumed by n simultaneous requests, for each n.

use std::path::Path;
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
    /// Also measure a baseline on the same machine, interleaved round by round with one actor's
    /// suspend and resume (`podman`: the same sleeper image checkpointed and restored by
    /// podman, on the same CRIU; needs podman installed and root).
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    Podman,
}

pub(super) async fn resume(c: Clients, a: ResumeArgs) -> anyhow::Result<ExitCode> {
    let ns = a.common.atespace_or("ate-bench");
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
    let mut all_ok = rows.iter().all(|(_, req, ok, _, _)| req == ok);
    let baseline = match a.baseline {
        None => serde_json::Value::Null,
        Some(Baseline::Podman) => {
            let sleeper = crate::podman::Sleeper::start(Path::new(&images), mib, &a.path).await?;
            let actor = &names[0];
            let mut ours: Vec<(f64, Reply)> = Vec::new();
            let mut theirs = Vec::new();
            for round in 1..=a.rounds {
                // Ours first: the actor runs (the burst's last round left it suspended).
                let r = call(&http, &router, Some(&format!("{ns}/{actor}")), &a.path).await;
                anyhow::ensure!(r.status == 200, "{ns}/{actor}: {} {}", r.status, r.body);
                let begun = std::time::Instant::now();
                ensure_suspended(&c, &ns, actor).await?;
                let suspend = begun.elapsed().as_secs_f64();
                tokio::time::sleep(settle).await;
                let resumed = call(&http, &router, Some(&format!("{ns}/{actor}")), &a.path).await;
                all_ok &= resumed.status == 200;
                let p = sleeper.round(&a.path).await?;
                eprintln!(
                    "podman round {round}/{}: ours suspend {suspend:.3} s, resume {:.3} s ({}); podman checkpoint {:.3} s, restore {:.3} s, first answer {:.3} s",
                    a.rounds, resumed.secs, resumed.resume, p.checkpoint, p.restore, p.first_answer
                );
                ours.push((suspend, resumed));
                theirs.push(p);
            }
            ensure_suspended(&c, &ns, actor).await?;
            let med = |v: Vec<f64>| median(&sorted(v));
            let our_suspend = med(ours.iter().map(|(s, _)| *s).collect());
            let our_resume = med(ours.iter().map(|(_, r)| r.secs).collect());
            let checkpoint = med(theirs.iter().map(|p| p.checkpoint).collect());
            let first = med(theirs.iter().map(|p| p.first_answer).collect());
            println!();
            println!(
                "Beside podman ({mib} MiB sleeper, {} rounds) | ours    | podman  | ratio",
                a.rounds
            );
            println!(
                "{:<44} | {our_suspend:>5.3} s | {checkpoint:>5.3} s | {:>5.2}x",
                "suspend / checkpoint",
                our_suspend / checkpoint
            );
            println!(
                "{:<44} | {our_resume:>5.3} s | {first:>5.3} s | {:>5.2}x",
                "resume / restore, to the first answer",
                our_resume / first
            );
            json!({
                "baseline": "podman",
                "median_suspend_seconds": our_suspend,
                "median_resume_seconds": our_resume,
                "podman_median_checkpoint_seconds": checkpoint,
                "podman_median_restore_seconds": med(theirs.iter().map(|p| p.restore).collect()),
                "podman_median_first_answer_seconds": first,
                "suspend_ratio": our_suspend / checkpoint,
                "resume_ratio": our_resume / first,
                "rounds": ours.iter().zip(&theirs).map(|((s, r), p)| json!({
                    "suspend_seconds": s, "resume_seconds": r.secs, "resume": r.resume,
                    "podman_checkpoint_seconds": p.checkpoint, "podman_restore_seconds": p.restore,
                    "podman_first_answer_seconds": p.first_answer,
                })).collect::<Vec<_>>(),
            })
        }
    };
    write_json(
        &a.common,
        "resume",
        &json!({"kind": "resume", "memory_mib": mib, "rounds": a.rounds, "path": a.path, "settle_seconds": a.settle, "router": router, "levels": levels, "baseline": baseline}),
    )?;
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
