//! `ate bench throughput` (default): one request to each of N suspended actors, at most C in
//! flight.

use super::*;

/// The spec's shape: one request to each suspended actor, at most `concurrency` in flight;
/// resumes/s = cold resumes / (last answer − first request sent).
pub(super) async fn burst(
    run: TpRun,
    common: &Common,
    settle: Duration,
) -> anyhow::Result<ExitCode> {
    let n = run.names.len();
    let memory = COUNTER_MEMORY_MIB << 20;
    let room = match rpc(run
        .c
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
    let TpRun {
        http,
        router,
        ns,
        names,
        concurrency,
        ..
    } = run;
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
    let row = TpRow::new(
        n,
        concurrency,
        samples.len(),
        ok,
        cold.len(),
        &cold_secs,
        wall,
    );
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
    let errors = first_errors(&replies);
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
