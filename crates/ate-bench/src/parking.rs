//! `ate bench parking`: the spec's parking demo timeline and its load run.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use ate_client::Clients;
use clap::Args;
use serde_json::json;
use tokio::task::JoinSet;

use super::{
    Common, NO_ROOM, Reply, apply_yaml, call, counter_template, ensure_actor, ensure_suspended,
    http_client, images_dir, reply_json, rfc3339, summary_block, suspend, write_json,
};

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

fn timeline_line(event: &str, r: &Reply) -> String {
    format!(
        "{}\t{event}\t{}\t{:.6}\t{}",
        rfc3339(r.start),
        r.status,
        r.secs,
        r.body.trim_end()
    )
}

pub(super) async fn parking(c: Clients, a: ParkingArgs) -> anyhow::Result<ExitCode> {
    let ns = a.common.atespace_or("ate-demo-parking");
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
