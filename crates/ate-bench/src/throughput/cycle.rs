//! `ate bench throughput --cycle`: the sustained resume/suspend loop.

use super::*;

/// The sustained loop: requesters keep `concurrency` requests to suspended actors in flight for
/// `--seconds`, suspenders suspend each served actor again (bounded by the suspends' dumps).
pub(super) async fn cycle(run: TpRun, a: &ThroughputArgs) -> anyhow::Result<ExitCode> {
    let concurrency = run.concurrency;
    let n_actors = run.names.len();
    // Ready (suspended) actors → requesters → suspend queue → suspenders → ready again.
    let (ready_tx, ready_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for n in &run.names {
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
        let (c, ns) = (run.c.clone(), run.ns.clone());
        let (done_rx, ready_tx) = (done_rx.clone(), ready_tx.clone());
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
            run.http.clone(),
            run.router.clone(),
            run.ns.clone(),
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
    let (requests, cold_n) = (replies.len(), cold.len());
    let row = TpRow::new(n_actors, concurrency, requests, ok, cold_n, &secs, elapsed);
    println!(
        "Cycle: {concurrency} requests in flight to suspended actors for {} s, {} suspenders; \
         seconds include draining",
        a.seconds, a.suspenders
    );
    println!("{}", row.table());
    let all: Vec<&Reply> = replies.iter().map(|(_, _, r)| r).collect();
    println!("not 200: {}", not_ok_summary(&all));
    let errors = first_errors(&all);
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
