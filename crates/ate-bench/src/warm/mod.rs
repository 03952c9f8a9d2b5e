//! `ate bench warm`: the router's warm path (keep-alive, the actor running and its route cached)
//! beside baselines measured in the same invocation, interleaved in rounds so that a noisy
//! neighbour hits every path alike:
//!
//! - a direct loopback server in this process (what no proxy at all costs);
//! - with `--baseline nginx`, Debian's nginx as a plain reverse proxy to the same actor's
//!   listener inside its network namespace (`nginx.rs`): what a user who puts agents behind a
//!   reverse proxy compares us with; with `--tls-router`, also nginx with TLS beside the router's
//!   TLS listener;
//! - optionally the router over TLS, a second plaintext system and other routers.
//!
//! The load is the bench's own client (`--generator builtin`: keep-alive HTTP/1.1 connections in
//! this process, one request in flight each) or h2load (`--generator h2load`, which also speaks
//! h2c with `--protocol h2c`). Every `--concurrency` value is measured for every path.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_client::Clients;
use ate_tls::rustls::pki_types::ServerName;
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::task::JoinSet;

use crate::{
    Common, apply_yaml, counter_template, ensure_actor, h2load, images_dir, median, nginx, pct,
    sorted, write_json,
};
pub use side::Load;
use side::{Role, Side, baseline_server, load, medians};

mod side;

#[derive(Args, Debug)]
pub struct WarmArgs {
    #[command(flatten)]
    common: Common,
    /// Measured seconds per path, connection count and round (after one second of warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Connections (keep-alive), one request in flight each; comma separated to measure
    /// several (e.g. `16,64`).
    #[arg(long, default_value = "32", value_delimiter = ',', value_parser = parse_connections)]
    concurrency: Vec<usize>,
    /// Path requested on every side (`/healthz` answers without touching disk).
    #[arg(long, default_value = "/healthz")]
    path: String,
    /// Rounds; each measures every side in turn, and the table shows the medians (the sides
    /// are interleaved so that a noisy neighbour hits them alike).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A reverse proxy measured beside the router, in front of the same actor (`nginx`: needs
    /// nginx installed, root, and the system's state directory on this machine).
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
    /// The nginx binary for `--baseline nginx` (default: `nginx` on PATH, then /usr/sbin/nginx).
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// The `ate up` state directory (`--baseline nginx` finds the actor's network namespace
    /// there, and takes the router's certificate for nginx's TLS listener).
    #[arg(long, env = "ATE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// The load generator.
    #[arg(long, value_enum, default_value_t = Generator::Builtin)]
    generator: Generator,
    /// The protocol clients speak (`h2c` needs `--generator h2load`; over TLS it means h2 by
    /// ALPN).
    #[arg(long, value_enum, default_value_t = Protocol::H1)]
    protocol: Protocol,
    /// The same system's router over TLS (`ate up --router-arg=--tls-listen=ADDR`), e.g.
    /// `https://127.0.0.1:17682`: client → router TLS, router → atunnel mTLS.
    #[arg(long)]
    tls_router: Option<String>,
    /// CA bundle that checks `--tls-router`'s certificate (default: `$ATE_STATE_DIR/tls/ca.crt`).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Router URL of a second system running without TLS on any hop (components started without
    /// `--tls-*`; see docs/benchmarks.md): the plaintext side of the TLS cost.
    #[arg(long)]
    plain_router: Option<String>,
    /// api address of that plaintext system (the bench creates its actor there).
    #[arg(long)]
    plain_api: Option<String>,
    /// Another router of the same system, measured beside the first (repeatable), as
    /// `NAME=URL`: e.g. a second `ate router` with other flags, for a before/after in one run.
    #[arg(long, value_name = "NAME=URL")]
    extra_router: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    Nginx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generator {
    /// Keep-alive HTTP/1.1 connections in this process.
    Builtin,
    /// nghttp2's h2load (Debian `nghttp2-client`), a separate process.
    H2load,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// HTTP/1.1.
    H1,
    /// HTTP/2 with prior knowledge in the clear (h2 by ALPN over TLS).
    H2c,
}

/// A connection count: 1 to 10 000.
fn parse_connections(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text:?}: want a number of connections from 1 to 10000"
        )),
    }
}

/// The actor's listener as atunnel dials it, inside its namespace (the counter's port 80).
const ACTOR_LISTENER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(ate_netns::ACTOR_IP), 80);

/// Creates the bench's 1-CPU counter actor on a system and answers one request through its
/// router, so that the actor runs and the router has its route.
async fn warm_actor(
    c: &Clients,
    ns: &str,
    name: &str,
    images: &str,
    side: &Side,
) -> anyhow::Result<()> {
    // A whole CPU for the actor, so that its CPU quota does not cap the warm path.
    apply_yaml(c, &counter_template(ns, "counter-1cpu", images, "1")).await?;
    ensure_actor(c, ns, name, "counter-1cpu").await?;
    let mut sender = side.connect().await?;
    let ok = side.get(&mut sender, "/").await?;
    anyhow::ensure!(ok, "warming {ns}/{name} through {} failed", side.name);
    Ok(())
}

/// The router's side against its baseline, one connection count: the acceptance of issue 18
/// (router ≥ 0.8× the baseline's req/s, p99 ≤ 2×, max ≤ 5×).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Versus {
    rps_ratio: f64,
    p99_ratio: f64,
    max_ratio: f64,
}

impl Versus {
    fn of(ours: &Load, theirs: &Load) -> Versus {
        let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
        Versus {
            rps_ratio: ratio(ours.rps, theirs.rps),
            p99_ratio: ratio(ours.p99_ms, theirs.p99_ms),
            max_ratio: ratio(ours.max_ms, theirs.max_ms),
        }
    }

    fn meets_targets(&self) -> bool {
        self.rps_ratio >= 0.8 && self.p99_ratio <= 2.0 && self.max_ratio <= 5.0
    }

    fn line(&self, ours: &str, theirs: &str) -> String {
        format!(
            "{ours} / {theirs}: req/s ×{:.2} (target ≥ 0.8), p99 ×{:.2} (≤ 2), max ×{:.2} (≤ 5){}",
            self.rps_ratio,
            self.p99_ratio,
            self.max_ratio,
            if self.meets_targets() {
                ""
            } else {
                " — below target"
            }
        )
    }
}

/// The TLS client config that checks the system's certificates (`--tls-ca` or the state dir's CA).
fn tls_config(a: &WarmArgs) -> anyhow::Result<Arc<ate_tls::rustls::ClientConfig>> {
    let ca = match &a.tls_ca {
        Some(ca) => ca.clone(),
        None => a
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(ate_client::DEFAULT_STATE_DIR))
            .join(ate_client::TLS_DIR)
            .join("ca.crt"),
    };
    let roots =
        ate_tls::load_roots(&ca).with_context(|| format!("CA for TLS: {}", ca.display()))?;
    let mut config = ate_tls::client_config_no_cert(roots, ate_tls::ServerCheck::Hostname)?;
    ate_tls::set_client_alpn(&mut config, &[ate_tls::Alpn::Http11]);
    Ok(Arc::new(config))
}

/// nginx in front of `atespace/name`, plain and (with `--tls-router`) TLS; the processes stop
/// when the returned guards drop.
fn start_nginx(
    a: &WarmArgs,
    atespace: &str,
    name: &str,
    sides: &mut Vec<Side>,
    tls: Option<&Arc<ate_tls::rustls::ClientConfig>>,
) -> anyhow::Result<Vec<nginx::Nginx>> {
    let binary = nginx::binary(a.nginx.as_deref())?;
    let state = a.state_dir.as_deref().context(
        "--baseline nginx needs --state-dir (or ATE_STATE_DIR): the system's state directory",
    )?;
    let netns = nginx::actor_netns(state, atespace, name)?;
    let work = std::env::temp_dir().join(format!("ate-bench-nginx-{}", std::process::id()));
    let plain_listen = match a.protocol {
        Protocol::H1 => nginx::Listen::Http1,
        Protocol::H2c => nginx::Listen::H2c,
    };
    let plain = nginx::Nginx::start(
        &binary,
        &netns,
        ACTOR_LISTENER,
        plain_listen,
        work.join("plain"),
    )?;
    sides.push(Side::new(
        "nginx → actor (plain reverse proxy)",
        Role::Nginx,
        &format!("http://{}", plain.addr),
        None,
        None,
    )?);
    let mut running = vec![plain];
    if a.tls_router.is_some() {
        let tls_dir = state.join(ate_client::TLS_DIR);
        let listen = nginx::Listen::Tls {
            cert: tls_dir.join("router.crt"),
            key: tls_dir.join("router.key"),
        };
        let with_tls =
            nginx::Nginx::start(&binary, &netns, ACTOR_LISTENER, listen, work.join("tls"))?;
        // The router's certificate names localhost and 127.0.0.1.
        sides.push(Side::new(
            "nginx TLS → actor",
            Role::NginxTls,
            &format!("https://localhost:{}", with_tls.addr.port()),
            None,
            tls,
        )?);
        running.push(with_tls);
    }
    Ok(running)
}

pub(super) async fn warm(c: Clients, a: WarmArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !a.concurrency.is_empty(),
        "--concurrency: give one or more connection counts"
    );
    let h2load_bin = match a.generator {
        Generator::H2load => Some(h2load::binary()?),
        Generator::Builtin => {
            anyhow::ensure!(
                a.protocol == Protocol::H1,
                "--protocol h2c needs --generator h2load (the builtin client speaks HTTP/1.1)"
            );
            None
        }
    };
    let ns = a.common.atespace_or("ate-bench");
    let images = images_dir(&c, &a.common).await?;
    let actor = format!("{ns}/warm-1");
    let direct_addr = baseline_server().await?;
    let mut sides = vec![
        Side::new(
            "direct (in-process baseline)",
            Role::Direct,
            &format!("http://{direct_addr}"),
            None,
            None,
        )?,
        Side::new(
            "router → atunnel → actor",
            Role::Router,
            &a.common.router,
            Some(actor.clone()),
            None,
        )?,
    ];
    warm_actor(&c, &ns, "warm-1", &images, &sides[1]).await?;
    for extra in &a.extra_router {
        let (name, url) = extra
            .split_once('=')
            .with_context(|| format!("--extra-router {extra:?}: want NAME=URL"))?;
        sides.push(Side::new(
            name,
            Role::Other,
            url,
            Some(actor.clone()),
            None,
        )?);
    }
    let tls = a.tls_router.as_ref().map(|_| tls_config(&a)).transpose()?;
    if let (Some(url), Some(config)) = (&a.tls_router, &tls) {
        sides.push(Side::new(
            "router TLS listener (TLS both hops)",
            Role::RouterTls,
            url,
            Some(actor.clone()),
            Some(config),
        )?);
    }
    let _nginx = match a.baseline {
        Some(Baseline::Nginx) => start_nginx(&a, &ns, "warm-1", &mut sides, tls.as_ref())?,
        None => Vec::new(),
    };
    if let Some(url) = &a.plain_router {
        let api = a
            .plain_api
            .as_deref()
            .context("--plain-router needs --plain-api (the plaintext system's api)")?;
        let channel = ate_client::connect_to(api, None)
            .await
            .with_context(|| format!("plaintext api at {api}"))?;
        // Another name: a worker names the actor's network namespace and container after
        // `<atespace>/<name>`, so the same actor on both systems of one machine would collide.
        let side = Side::new(
            "plaintext system (no TLS on any hop)",
            Role::Other,
            url,
            Some(format!("{ns}/warm-plain-1")),
            None,
        )?;
        warm_actor(&Clients::new(channel), &ns, "warm-plain-1", &images, &side).await?;
        sides.push(side);
    }
    let plain_index = a.plain_router.as_ref().map(|_| sides.len() - 1);

    let log = std::env::temp_dir().join(format!("ate-bench-h2load-{}.log", std::process::id()));
    let rounds_n = a.rounds.max(1);
    // rounds[c][s]: the loads of side s at concurrency c, one per round.
    let mut rounds: Vec<Vec<Vec<Load>>> = vec![vec![Vec::new(); sides.len()]; a.concurrency.len()];
    for round in 1..=rounds_n {
        for (ci, &conc) in a.concurrency.iter().enumerate() {
            for (si, side) in sides.iter().enumerate() {
                eprintln!(
                    "==> round {round}/{rounds_n}: {} — {} s, {conc} keep-alive connections → {}{}",
                    side.name, a.seconds, side.url, a.path
                );
                let l = match &h2load_bin {
                    None => load(side, &a.path, conc, a.seconds).await,
                    Some(bin) => {
                        let run = h2load::Run {
                            url: &format!("{}{}", side.url, a.path),
                            actor: side.actor.as_deref(),
                            connections: conc,
                            seconds: a.seconds,
                            http1: a.protocol == Protocol::H1,
                            log: &log,
                        };
                        match run.measure(bin).await {
                            Ok(l) => l,
                            // One failed or stuck generator run (h2load once hung against
                            // nginx's TLS listener) costs that side this round, not the whole
                            // invocation; the tables say how many rounds each median has.
                            Err(e) => {
                                eprintln!("    left out of the medians: {e:#}");
                                continue;
                            }
                        }
                    }
                };
                eprintln!(
                    "    {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} errors",
                    l.rps, l.p50_ms, l.p99_ms, l.max_ms, l.errors
                );
                rounds[ci][si].push(l);
            }
        }
    }
    let _ = std::fs::remove_file(&log);
    drop(_nginx);
    every_side_measured(&rounds, &a.concurrency, &sides)?;

    let generator = match a.generator {
        Generator::Builtin => "builtin client",
        Generator::H2load => "h2load",
    };
    let protocol = match a.protocol {
        Protocol::H1 => "HTTP/1.1",
        Protocol::H2c => "h2c",
    };
    let mut sides_json = Vec::new();
    let mut comparisons = Vec::new();
    let mut first = None;
    for (ci, &conc) in a.concurrency.iter().enumerate() {
        let summary: Vec<Load> = rounds[ci].iter().map(|r| medians(r)).collect();
        println!(
            "Medians of {rounds_n} round(s) of {} s, {conc} connections, GET {}, {protocol} by {generator}",
            a.seconds, a.path
        );
        println!(
            "Path                                 | Requests | Errors | Req/s    | p50      | p99      | max"
        );
        for (side, l) in sides.iter().zip(&summary) {
            println!(
                "{:<36} | {:>8} | {:>6} | {:>8.0} | {:>5.2} ms | {:>5.2} ms | {:>6.2} ms",
                side.name, l.requests, l.errors, l.rps, l.p50_ms, l.p99_ms, l.max_ms
            );
        }
        for (side, r) in sides.iter().zip(&rounds[ci]) {
            if r.len() < rounds_n {
                println!(
                    "({}: medians of {} of {rounds_n} rounds; the others failed, see above)",
                    side.name,
                    r.len()
                );
            }
        }
        let find = |role: Role| sides.iter().position(|s| s.role == role);
        let (direct, routed) = (summary[0], summary[1]);
        let ratio = routed.rps / direct.rps.max(f64::MIN_POSITIVE);
        println!(
            "router/direct req/s ratio: {ratio:.3}; added latency p50 {:+.2} ms, p99 {:+.2} ms",
            routed.p50_ms - direct.p50_ms,
            routed.p99_ms - direct.p99_ms
        );
        for (ours, theirs) in [
            (Role::Router, Role::Nginx),
            (Role::RouterTls, Role::NginxTls),
        ] {
            if let (Some(o), Some(t)) = (find(ours), find(theirs)) {
                let v = Versus::of(&summary[o], &summary[t]);
                println!("{}", v.line(&sides[o].name, &sides[t].name));
                comparisons.push(json!({"concurrency": conc, "ours": sides[o].name,
                    "baseline": sides[t].name, "rps_ratio": v.rps_ratio, "p99_ratio": v.p99_ratio,
                    "max_ratio": v.max_ratio, "meets_targets": v.meets_targets()}));
            }
        }
        if let (Some(ti), Some(pi)) = (find(Role::RouterTls), plain_index) {
            let (t, p) = (summary[ti], summary[pi]);
            let r = t.rps / p.rps.max(f64::MIN_POSITIVE);
            println!(
                "TLS both hops / plaintext: req/s ratio {r:.3} (TLS costs {:.1} % of plaintext throughput); p50 {:+.2} ms",
                (1.0 - r) * 100.0,
                t.p50_ms - p.p50_ms
            );
        }
        println!();
        for ((side, m), r) in sides.iter().zip(&summary).zip(&rounds[ci]) {
            let name = if a.concurrency.len() > 1 {
                format!("{} ({conc} conns)", side.name)
            } else {
                side.name.clone()
            };
            sides_json.push(
                json!({"name": name, "concurrency": conc, "median": m.json(),
                "rounds": r.iter().map(Load::json).collect::<Vec<_>>(),
                "rounds_failed": rounds_n - r.len()}),
            );
        }
        if first.is_none() {
            first = Some((direct, routed, ratio));
        }
    }
    let Some((direct, routed, ratio)) = first else {
        anyhow::bail!("nothing measured");
    };
    write_json(
        &a.common,
        "warm",
        &json!({"kind": "warm", "seconds": a.seconds, "concurrency": a.concurrency, "path": a.path,
                "rounds": rounds_n, "generator": generator, "protocol": protocol,
                "sides": sides_json, "baseline_comparisons": comparisons,
                "direct": direct.json(), "router": routed.json(), "ratio": ratio,
                "added_p50_ms": routed.p50_ms - direct.p50_ms,
                "added_p99_ms": routed.p99_ms - direct.p99_ms}),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Every side has at least one round at every concurrency (`rounds[c][s]`): a median needs one.
fn every_side_measured(
    rounds: &[Vec<Vec<Load>>],
    concurrency: &[usize],
    sides: &[Side],
) -> anyhow::Result<()> {
    every_name_measured(rounds, concurrency, sides.iter().map(|s| s.name.as_str()))
}

fn every_name_measured<'a>(
    rounds: &[Vec<Vec<Load>>],
    concurrency: &[usize],
    names: impl Iterator<Item = &'a str> + Clone,
) -> anyhow::Result<()> {
    for (per_side, conc) in rounds.iter().zip(concurrency) {
        for (r, name) in per_side.iter().zip(names.clone()) {
            anyhow::ensure!(
                !r.is_empty(),
                "{name}: every round at {conc} connections failed (see the lines above)"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_without_any_round_is_an_error_naming_it() {
        let ok = vec![vec![load(1.0, 1.0, 1.0)], vec![load(2.0, 1.0, 1.0)]];
        let names = ["router", "nginx TLS"];
        assert!(
            every_name_measured(std::slice::from_ref(&ok), &[16], names.iter().copied()).is_ok()
        );
        let partial = vec![vec![load(1.0, 1.0, 1.0)], Vec::new()];
        let err = every_name_measured(&[ok, partial], &[16, 64], names.iter().copied())
            .expect_err("nginx TLS has no round at 64");
        assert_eq!(
            err.to_string(),
            "nginx TLS: every round at 64 connections failed (see the lines above)"
        );
    }

    fn load(rps: f64, p99: f64, max: f64) -> Load {
        Load {
            requests: 1,
            errors: 0,
            rps,
            p50_ms: 0.1,
            p99_ms: p99,
            max_ms: max,
        }
    }

    #[test]
    fn versus_checks_the_three_targets() {
        let nginx = load(50_000.0, 1.0, 4.0);
        assert!(Versus::of(&load(40_000.0, 2.0, 20.0), &nginx).meets_targets());
        assert!(!Versus::of(&load(39_000.0, 1.0, 4.0), &nginx).meets_targets());
        assert!(!Versus::of(&load(45_000.0, 2.1, 4.0), &nginx).meets_targets());
        assert!(!Versus::of(&load(45_000.0, 1.0, 20.1), &nginx).meets_targets());
        let v = Versus::of(&load(25_000.0, 2.0, 8.0), &nginx);
        assert_eq!(v.rps_ratio, 0.5);
        assert!(v.line("router", "nginx").ends_with("below target"));
    }

    #[test]
    fn loads_from_latencies_and_medians() {
        let l = Load::from_latencies(vec![3.0, 1.0, 2.0], 1, 10.0);
        assert_eq!((l.requests, l.errors, l.max_ms), (3, 1, 3.0));
        let m = medians(&[
            load(1.0, 1.0, 5.0),
            load(3.0, 3.0, 2.0),
            load(2.0, 2.0, 1.0),
        ]);
        assert_eq!((m.rps, m.p99_ms, m.max_ms), (2.0, 2.0, 5.0));
    }
}
