//! `ate bench calls`: what a warm call from one actor to another adds over a direct request to
//! the same callee through the router (issue 31: ≤ 1 ms p50 on one machine). Both sides are
//! measured on kept-alive connections: the direct side from this client through the router, the
//! call side inside the calling counter (`/call?…&n=K`, its `x-call-p50-us`), which goes actor →
//! worker (platform address) → router (internal socket) → callee.

use std::process::ExitCode;

use clap::Args;
use http_body_util::{BodyExt, Empty};
use serde_json::json;

use crate::{
    Clients, Common, apply_yaml, call, counter_template, ensure_actor, http_client, images_dir,
    median, sorted, write_json,
};

#[derive(Args, Debug, Clone)]
pub struct CallsArgs {
    #[command(flatten)]
    common: Common,
    /// Requests per side and round.
    #[arg(long, default_value_t = 300)]
    calls: u32,
    /// Rounds (the sides alternate, so machine load hits both alike).
    #[arg(long, default_value_t = 5)]
    rounds: u32,
}

/// One GET to `actor` through the router, with the value of response header `header`.
async fn get_header(
    c: &crate::HttpClient,
    base: &str,
    actor: &str,
    path: &str,
    header: &str,
) -> anyhow::Result<(u16, Option<String>, String)> {
    let req = hyper::Request::get(format!("{}{path}", base.trim_end_matches('/')))
        .header("ate-target-actor", actor)
        .body(Empty::new())?;
    let resp = c.request(req).await?;
    let status = resp.status().as_u16();
    let value = resp
        .headers()
        .get(header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, value, String::from_utf8_lossy(&body).into_owned()))
}

pub async fn calls(c: Clients, a: CallsArgs) -> anyhow::Result<ExitCode> {
    let ns = a.common.atespace_or("bench-calls");
    let images = images_dir(&c, &a.common).await?;
    // A whole core each: the figure is the path's, not a CPU quota's.
    apply_yaml(&c, &counter_template(&ns, "counter", &images, "1000m")).await?;
    ensure_actor(&c, &ns, "caller", "counter").await?;
    ensure_actor(&c, &ns, "callee", "counter").await?;
    let router = a.common.router.clone();
    let client = http_client(1);
    let caller = format!("{ns}/caller");
    let callee = format!("{ns}/callee");
    let call_path = format!("/call?actor={callee}&path=/healthz&n={}", a.calls);
    // Warm both paths (resumes, connections, the callee's assignment in the router).
    for _ in 0..20 {
        call(&client, &router, Some(&callee), "/healthz").await;
    }
    let (status, _, body) =
        get_header(&client, &router, &caller, &call_path, "x-call-p50-us").await?;
    anyhow::ensure!(
        status == 200,
        "a call from {caller} to {callee} failed: {status} {body}"
    );

    let mut rows = Vec::new();
    println!("round | direct p50 ms | call p50 ms | added ms");
    for round in 1..=a.rounds {
        let mut direct = Vec::with_capacity(a.calls as usize);
        for _ in 0..a.calls {
            let r = call(&client, &router, Some(&callee), "/healthz").await;
            anyhow::ensure!(r.status == 200, "direct request: {} {}", r.status, r.body);
            direct.push(r.secs * 1000.0);
        }
        let direct_p50 = median(&sorted(direct));
        let (status, p50_us, body) =
            get_header(&client, &router, &caller, &call_path, "x-call-p50-us").await?;
        anyhow::ensure!(status == 200, "calls from {caller}: {status} {body}");
        let call_p50 = p50_us
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|us| us / 1000.0)
            .ok_or_else(|| anyhow::anyhow!("the counter's answer has no x-call-p50-us"))?;
        println!(
            "{round:>5} | {direct_p50:>13.3} | {call_p50:>11.3} | {:>+8.3}",
            call_p50 - direct_p50
        );
        rows.push(
            json!({"round": round, "direct_p50_ms": direct_p50, "call_p50_ms": call_p50,
            "added_ms": call_p50 - direct_p50}),
        );
    }
    let added: Vec<f64> = rows.iter().filter_map(|r| r["added_ms"].as_f64()).collect();
    let added = median(&sorted(added));
    println!("median added by an actor-to-actor call: {added:+.3} ms (target ≤ 1 ms)");
    write_json(
        &a.common,
        "calls",
        &json!({"kind": "calls", "calls_per_round": a.calls, "rounds": rows, "median_added_ms": added}),
    )?;
    Ok(ExitCode::SUCCESS)
}
