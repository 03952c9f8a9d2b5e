//! `ate bench alarms`: lateness of many alarms due within a few seconds (issue 31: 1,000 due in
//! the same 10 s all delivered, lateness p50/p99/max). The bench sets one alarm per counter
//! actor (AlarmService, as admin), due times spread evenly over `--window-secs`, each POSTing
//! `/on-alarm?suspend=1`: the counter counts it and asks to be suspended at once (an agent that
//! finished its turn frees its slot), so a machine with few slots cycles through all actors.
//! `--warm` starts every actor first and leaves it running: the delivery path alone.
//! Delivery is watched from outside: an alarm is delivered when the api drops it from
//! ListAlarms (polled every 100 ms), so lateness includes the resume, the handler and the
//! store's delete.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ate_proto::v1;
use clap::Args;
use serde_json::json;

use crate::{
    Clients, Common, apply_yaml, call, counter_template, ensure_actor, http_client, images_dir,
    pct, sorted, write_json,
};

#[derive(Args, Debug, Clone)]
pub struct AlarmsArgs {
    #[command(flatten)]
    common: Common,
    /// Actors, one alarm each.
    #[arg(long, default_value_t = 1000)]
    actors: u32,
    /// The due times are spread evenly over this many seconds.
    #[arg(long, default_value_t = 10)]
    window_secs: u64,
    /// The first alarm is due this long after the last one is set.
    #[arg(long, default_value_t = 5)]
    lead_secs: u64,
    /// CPU of each actor's template (small: many actors run at once).
    #[arg(long, default_value = "10m")]
    cpu: String,
    /// Start every actor first and leave it running (the alarm then resumes nothing): the
    /// delivery path's own lateness. Needs a slot per actor.
    #[arg(long)]
    warm: bool,
    /// Give up waiting for deliveries after this many seconds past the window.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub async fn alarms(c: Clients, a: AlarmsArgs) -> anyhow::Result<ExitCode> {
    let ns = a.common.atespace_or("bench-alarms");
    let images = images_dir(&c, &a.common).await?;
    apply_yaml(&c, &counter_template(&ns, "counter", &images, &a.cpu)).await?;
    let names: Vec<String> = (0..a.actors).map(|i| format!("a-{i}")).collect();
    for n in &names {
        ensure_actor(&c, &ns, n, "counter").await?;
    }
    if a.warm {
        let client = http_client(4);
        for n in &names {
            let r = call(
                &client,
                &a.common.router,
                Some(&format!("{ns}/{n}")),
                "/healthz",
            )
            .await;
            anyhow::ensure!(
                r.status == 200,
                "starting {ns}/{n}: {} {}",
                r.status,
                r.body
            );
        }
    }
    let path = if a.warm {
        "/on-alarm"
    } else {
        "/on-alarm?suspend=1"
    };
    println!("{} actors in {ns}; setting their alarms", names.len());
    // Due times are fixed relative to when setting ends; set them in a first pass 1 h ahead
    // (nothing fires), then move each to its slot in the window (one quick pass).
    let mut alarms = c.alarms.clone();
    let set = |name: &str, due: i64| v1::SetAlarmRequest {
        actor: Some(v1::ObjectRef {
            atespace: ns.clone(),
            name: name.to_string(),
        }),
        activation: 0,
        due_unix_ms: due,
        path: path.into(),
    };
    let later = now_ms() + 3_600_000;
    for n in &names {
        alarms.set_alarm(set(n, later)).await?;
    }
    let start = now_ms() + i64::try_from(a.lead_secs * 1000).unwrap_or(i64::MAX);
    let window_ms = i64::try_from(a.window_secs * 1000).unwrap_or(i64::MAX);
    let count = i64::try_from(names.len().max(1)).unwrap_or(1);
    let mut due: HashMap<String, i64> = HashMap::new();
    for (i, n) in names.iter().enumerate() {
        let at = start + window_ms * i64::try_from(i).unwrap_or(0) / count;
        alarms.set_alarm(set(n, at)).await?;
        due.insert(format!("{ns}/{n}"), at);
    }
    println!(
        "{} alarms due over {} s from {} ms ahead",
        names.len(),
        a.window_secs,
        start - now_ms()
    );

    let began = Instant::now();
    let give_up = Duration::from_secs(a.lead_secs + a.window_secs + a.timeout_secs);
    let mut late_ms: Vec<f64> = Vec::with_capacity(names.len());
    let mut failed = Vec::new();
    let mut pending = due.clone();
    while !pending.is_empty() && began.elapsed() < give_up {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let listed = alarms
            .list_alarms(v1::ListAlarmsRequest {
                atespace: ns.clone(),
            })
            .await?
            .into_inner()
            .alarms;
        let now = now_ms();
        let mut still: HashMap<String, ()> = HashMap::new();
        for al in &listed {
            let key = al
                .actor
                .as_ref()
                .map(|r| format!("{}/{}", r.atespace, r.name))
                .unwrap_or_default();
            if al.failed && pending.remove(&key).is_some() {
                failed.push(format!("{key}: {}", al.last_error));
            } else {
                still.insert(key, ());
            }
        }
        pending.retain(|key, at| {
            if still.contains_key(key) {
                return true;
            }
            late_ms.push((now - *at).max(0) as f64);
            false
        });
    }
    let late = sorted(late_ms);
    let secs = |ms: f64| ms / 1000.0;
    println!(
        "delivered {} of {} (failed {}, not delivered {}); lateness p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        late.len(),
        names.len(),
        failed.len(),
        pending.len(),
        secs(pct(&late, 0.5)),
        secs(pct(&late, 0.99)),
        secs(late.last().copied().unwrap_or(0.0)),
    );
    for f in failed.iter().take(5) {
        println!("  failed: {f}");
    }
    write_json(
        &a.common,
        "alarms",
        &json!({
            "kind": "alarms",
            "actors": names.len(),
            "warm": a.warm,
            "window_secs": a.window_secs,
            "delivered": late.len(),
            "failed": failed.len(),
            "not_delivered": pending.len(),
            "lateness_p50_s": secs(pct(&late, 0.5)),
            "lateness_p99_s": secs(pct(&late, 0.99)),
            "lateness_max_s": secs(late.last().copied().unwrap_or(0.0)),
        }),
    )?;
    Ok(if late.len() == names.len() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
