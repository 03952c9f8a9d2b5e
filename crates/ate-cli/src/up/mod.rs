//! `ate up`: the embedded all-in-one. Starts each component as a child process, waits for it to
//! be healthy, registers the demo template, prints one ready line, and stops everything on
//! Ctrl-C / SIGTERM. A component that exits after start-up is reported on stderr and restarted
//! with the same arguments after a backoff (100 ms doubling to 10 s, reset after 60 s up); one
//! that exits more than 10 times in 5 minutes makes `ate up` stop everything and exit non-zero.
//! Stopping goes router, workers, node agent, api, each group waiting for its processes, so the
//! workers can still suspend their actors through the node agent and the api.

mod generation;
mod node;
mod pki;
mod supervise;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ate_tls::process::shutdown_signal;
use clap::Args;

use crate::client::{self, API_ADDRESS_FILE, ApplyError, Clients};
use crate::serve::{LogFormat, write_atomically};
use node::{NodeMetrics, start_node_and_workers, worker_ids};
pub(crate) use pki::identity_key_in;
use pki::{Pki, ca_dir, identity_key, publish_admin, with_sans};
use supervise::{
    Component, Role, set_flag, spawn, spawn_with_env, start_or_stop, stop_all,
    supervise_until_stopped, wait_listening, wait_ready,
};

const DEMO_TEMPLATE: &str = include_str!("demo-counter.yaml");

/// `--worker-slots` unless given: with `--workers 2` and the CPU overcommit, a 2-core, 24 GiB
/// machine holds 384 idle demo counters (memory, 64Mi each against 12 GiB per worker, is what
/// stops it: docs/actors.md, "Density").
const DEFAULT_WORKER_SLOTS: u32 = 256;

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where the store, snapshots, images and logs live.
    #[arg(long, env = "ATE_STATE_DIR", default_value = client::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Number of workers to start.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Actor slots per worker: the most actors one worker runs at once. Sized for idle agents
    /// (hundreds of demo counters on a small machine); memory (templates' limits against half
    /// the machine's RAM per worker) and CPU bookings (`--cpu-overcommit`) still bound them.
    #[arg(long, default_value_t = DEFAULT_WORKER_SLOTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub worker_slots: u32,
    /// How many times its CPU each worker may book to actors (`ate worker --cpu-overcommit`): a
    /// template's `cpu` is its actor's share and cap, not a reservation. `1`: strict
    /// reservations.
    #[arg(
        long,
        default_value_t = ate_worker::config::DEFAULT_CPU_OVERCOMMIT,
        value_parser = ate_worker::config::parse_cpu_overcommit
    )]
    pub cpu_overcommit: f64,
    /// Store snapshots unencrypted: no STATE_DIR/keys is created or used (by default `ate up`
    /// creates it, its workers seal every node-local generation and its node every durable
    /// object; docs/security.md).
    #[arg(long)]
    pub no_snapshot_encryption: bool,
    /// Do not register the `ate-demo` atespace and `ate-demo/counter` template.
    #[arg(long)]
    pub no_demo: bool,
    /// api gRPC address.
    #[arg(long, default_value = ate_core::DEFAULT_API_ADDR)]
    pub api_listen: SocketAddr,
    /// api health/metrics address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub api_http_listen: SocketAddr,
    /// Store URL (default: SQLite file in the state dir).
    #[arg(long)]
    pub store: Option<String>,
    /// Directory of OCI image layouts for the demo (default: STATE_DIR/images).
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
    /// Router (ingress) address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub router_listen: SocketAddr,
    /// Router metrics address.
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub router_metrics_listen: SocketAddr,
    /// Node agent address.
    #[arg(long, default_value = "127.0.0.1:8085")]
    pub node_listen: SocketAddr,
    /// Node agent metrics address (`/metrics`, `/healthz`). Default: a free loopback port,
    /// chosen at the start (port 0: a free port on that address). The ready file names it
    /// (`node_metrics`).
    #[arg(long)]
    pub node_metrics_listen: Option<SocketAddr>,
    /// Worker 1's metrics address (`/metrics`, `/healthz`); worker N listens on the same IP at
    /// this port + N - 1. Default: a free loopback port for each worker, chosen at the start
    /// (port 0: free ports on that address). The ready file lists them (`worker_metrics`, in
    /// worker order).
    #[arg(long)]
    pub worker_metrics_listen: Option<SocketAddr>,
    /// Durable snapshot store URL (default: a directory in the state dir).
    #[arg(long)]
    pub durable_store: Option<String>,
    /// First worker's loopback address; worker i gets this address + (i - 1).
    #[arg(long, default_value = "127.0.0.2")]
    pub worker_first_ip: std::net::Ipv4Addr,
    /// atunnel port of every worker.
    #[arg(long, default_value_t = 8443)]
    pub worker_port: u16,
    /// Write the addresses of the running system as JSON here once ready.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Extra flags for the router, e.g. `--router-arg=--parked-request-budget=2s` (repeatable).
    #[arg(long = "router-arg", allow_hyphen_values = true)]
    pub router_args: Vec<String>,
    /// Extra flags for the api, e.g. `--api-arg=--heartbeat-timeout-seconds=20` (repeatable; the flags
    /// `ate up` sets itself — listeners, store, TLS, ready file — cannot be given again).
    #[arg(long = "api-arg", allow_hyphen_values = true)]
    pub api_args: Vec<String>,
    /// The router uses mTLS CONNECT tunnels through atunnel for every request, instead of
    /// taking plain HTTP/1.1 tunnels as the actor's own socket from the workers of this
    /// machine (docs/tunnel-protocol.md, "Handoff").
    #[arg(long)]
    pub no_local_tunnels: bool,
    /// SPIFFE trust domain of the local CA and every component's identity.
    #[arg(long, default_value = ate_tls::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Lifetime of every component certificate; each is re-issued at 2/3 of it (e.g. `60s`).
    /// Also the lifetime of the certificates the api signs for joining nodes.
    #[arg(long, default_value = "24h", value_parser = ate_router::config::parse_duration)]
    pub cert_lifetime: Duration,
    /// What this machine runs: `all` (api, router, node agent, workers), `control` (api and
    /// router; machines join it) or `node` (node agent and workers, joined to a control host
    /// with `--join` and `--join-token`).
    #[arg(long, value_enum, default_value_t = UpRole::All)]
    pub role: UpRole,
    /// `--role node`: the api address(es) to join, comma-separated (`10.0.0.1:7443,10.0.0.2:7443`).
    #[arg(long, env = "ATE_JOIN")]
    pub join: Option<String>,
    /// `--role node`: the router's internal listener on a control host (`HOST:PORT`, started
    /// there with `--router-arg=--internal-listen=ADDR`), where this machine's workers send
    /// their actors' calls to other actors (mTLS with the workers' certificates). Without it,
    /// actors on this machine cannot call other actors by name.
    #[arg(long, env = "ATE_ROUTER_INTERNAL", value_name = "HOST:PORT")]
    pub router_internal: Option<String>,
    /// `--role node`: the join token from `ate token create` on a control host. Needed for the
    /// first start only: a restarted node renews with the certificates it holds.
    #[arg(long, env = "ATE_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// This machine's node name (`--role node`: default the host name; else `node-1`). Its
    /// workers are `<node>-worker-<i>`.
    #[arg(long)]
    pub node_name: Option<String>,
    /// The CA that signs every certificate (default STATE_DIR/ca). Control hosts that serve one
    /// fleet share it (as api replicas share a Kubernetes Secret).
    #[arg(long)]
    pub ca_dir: Option<PathBuf>,
    /// Extra DNS name or IP in the api's and the router's certificates, for clients that check
    /// the host name (repeatable).
    #[arg(long = "tls-san")]
    pub tls_sans: Vec<String>,
    /// Another api replica on the same store (repeatable): the router fails over to it, and the
    /// api no longer assumes it is the only replica.
    #[arg(long = "peer-api")]
    pub peer_apis: Vec<String>,
    /// A registry the workers may reach over plain HTTP (`HOST:PORT`, repeatable; e.g. a
    /// loopback registry for your own images). Adds to `ATE_INSECURE_REGISTRIES`.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Registry credentials for the workers (a Docker `config.json`; `ATE_REGISTRY_AUTH_FILE`).
    #[arg(long)]
    pub registry_auth_file: Option<PathBuf>,
    /// Log line format of every component (their logs in STATE_DIR/logs): `text` (plain, no
    /// colours in a file) or `json` (JSON lines).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What one `ate up` runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpRole {
    All,
    Control,
    Node,
}

/// Starts the api, registers the demo, then the data path; returns the api's gRPC address, its
/// bound health/metrics (http) address, and the node agent's and workers' metrics addresses.
async fn start_all(
    args: &UpArgs,
    store: &str,
    images_dir: &Path,
    pki: &mut Pki,
    components: &mut Vec<Component>,
) -> anyhow::Result<(String, String, Option<NodeMetrics>)> {
    let state = &args.state_dir;
    let logs = state.join("logs");
    let run_dir = state.join("run");
    let api_ready = run_dir.join("api.json");
    let _ = std::fs::remove_file(&api_ready);
    if args.role == UpRole::Control && !args.no_snapshot_encryption {
        // The fleet's snapshot keys, made here for the machines that join to copy.
        snapshot_keys(args)?;
    }
    let flags = [
        ("--listen", args.api_listen.to_string()),
        ("--http-listen", args.api_http_listen.to_string()),
        ("--store", store.to_string()),
        ("--ready-file", api_ready.display().to_string()),
        // Signs the certificates of machines that join (`ate up --role node`).
        ("--ca-dir", ca_dir(args).display().to_string()),
        // Signs actors' identity tokens (`GET /v1/identity?audience=…`); beside the CA, not in
        // STATE_DIR/keys, which nodes hold.
        ("--identity-key", identity_key(args).display().to_string()),
        (
            "--join-cert-lifetime",
            format!("{}s", args.cert_lifetime.as_secs().max(60)),
        ),
    ];
    let mut api_args = command_line("api", args, flags);
    // One api on its store (no --peer-api): a store outage need not fence the workers.
    if args.role == UpRole::All && args.peer_apis.is_empty() {
        api_args.push("--sole-replica".into());
    }
    let td = args.trust_domain.clone();
    let api_req = with_sans(
        ate_tls::SvidRequest::new(ate_tls::SpiffeId::api(&td)?),
        &args.tls_sans,
    );
    api_args.extend(pki.issue_req("api", api_req)?.1.to_args());
    api_args.extend(args.api_args.iter().cloned());
    let (admin, _) = pki.issue(client::ADMIN_CERT_NAME, ate_tls::SpiffeId::admin(&td)?)?;
    let mut api_env = Vec::new();
    if let Some(router) = router_for_api(args) {
        // Actors' alarms go through the router's internal listener (`ate api --router-internal`).
        api_env.push(("ATE_API_ROUTER_INTERNAL".to_string(), router));
    }
    components.push(spawn_with_env("api", Role::Api, api_args, &logs, api_env)?);
    let api = &mut components[0];
    let ready = wait_ready(api, &api_ready).await?;
    let api_addr = ready["grpc"].as_str().unwrap_or_default().to_string();
    let api_http = ready["http"].as_str().unwrap_or_default().to_string();
    // A restarted api must come back where the others were told it is (`--api-listen` may be
    // port 0).
    set_flag(&mut api.args, "--listen", &api_addr);
    set_flag(&mut api.args, "--http-listen", &api_http);
    let channel = client::connect_to(&api_addr, Some(&admin))
        .await
        .with_context(|| format!("cannot reach the api at {api_addr}"))?;
    let clients = Clients::new(channel);
    if !args.no_demo {
        register_demo(&clients, images_dir).await?;
    }
    write_atomically(&state.join(API_ADDRESS_FILE), &api_addr)?;
    let api_addrs = api_list(&api_addr, &args.peer_apis);
    let mut node_metrics = None;
    if args.role == UpRole::All {
        let node_name = args.node_name.clone().unwrap_or_else(|| "node-1".into());
        node_metrics = Some(
            start_node_and_workers(
                args, &node_name, &api_addrs, &logs, &run_dir, pki, &clients, components,
            )
            .await?,
        );
    }
    start_router(args, &api_addrs, &logs, pki, components).await?;
    // A CLI context of this state dir (current unless the user already uses another one), only
    // once everything started: an `ate up` that fails (a port in use) leaves no context behind,
    // let alone a current one pointing at nothing.
    let context = crate::contexts::name_for_state_dir(state);
    match crate::contexts::publish(&context, &api_addr) {
        Ok(_) => {
            if let Some(dir) = crate::contexts::context_dir(&context) {
                publish_admin(&admin, &pki.dir, dir);
            }
        }
        Err(e) => eprintln!("ate up: cannot write the CLI context {context:?}: {e:#}"),
    }
    Ok((api_addr, api_http, node_metrics))
}

async fn register_demo(c: &Clients, images_dir: &Path) -> anyhow::Result<()> {
    let text = DEMO_TEMPLATE.replace("IMAGES_DIR", &images_dir.display().to_string());
    client::apply_documents(c, &text)
        .await
        .map_err(|e| match e {
            ApplyError::Invalid(e) => e.into(),
            ApplyError::Atespace { name, status } => {
                anyhow::anyhow!("cannot create atespace {name}: {}", status.message())
            }
            ApplyError::Template { status, .. } => {
                anyhow::anyhow!("cannot apply the demo template: {}", status.message())
            }
        })
}

/// Starts the router and waits until it listens.
fn router_args(args: &UpArgs, api_addrs: &str, pki: &mut Pki) -> anyhow::Result<Vec<String>> {
    let td = pki.td.clone();
    let flags = [
        ("--listen", args.router_listen.to_string()),
        ("--metrics-listen", args.router_metrics_listen.to_string()),
        ("--api", api_addrs.to_string()),
    ];
    let mut router_args = command_line("router", args, flags);
    // Also valid for `localhost` / 127.0.0.1, for clients of `--router-arg=--tls-listen=…` that
    // check the hostname rather than the SPIFFE ID.
    let router_req = ate_tls::SvidRequest::new(ate_tls::SpiffeId::router(&td)?)
        .dns("localhost")
        .ip(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let router_req = with_sans(router_req, &args.tls_sans);
    router_args.extend(pki.issue_req("router", router_req)?.1.to_args());
    // The workers' handoff sockets (every worker of `ate up` is on this machine): plain
    // HTTP/1.1 tunnels skip atunnel's byte pipe.
    let chosen = args.no_local_tunnels
        || args
            .router_args
            .iter()
            .any(|a| a == "--local-tunnels" || a.starts_with("--local-tunnels="));
    if !chosen {
        router_args.push("--local-tunnels".into());
        router_args.push(
            args.state_dir
                .join("run")
                .join("atunnel")
                .display()
                .to_string(),
        );
    }
    // The workers' actor calls (issue 31): every worker of an all-in-one is on this machine.
    if args.role == UpRole::All && flag_value(&args.router_args, "--internal-socket").is_none() {
        router_args.push("--internal-socket".into());
        router_args.push(default_internal_socket(args).display().to_string());
    }
    router_args.extend(args.router_args.iter().cloned());
    Ok(router_args)
}

/// Where the router of an all-in-one listens for its workers' actor calls (the router makes the
/// directory 0700 and the socket 0600).
fn default_internal_socket(args: &UpArgs) -> PathBuf {
    args.state_dir
        .join("run")
        .join("router")
        .join("internal.sock")
}

/// The router's internal socket that this machine's workers send their actors' calls to: the
/// default one of an all-in-one, or the one given with `--router-arg=--internal-socket=…`.
/// None for `--role node` and `control` (their workers and router are on different machines).
pub(super) fn internal_socket(args: &UpArgs) -> Option<PathBuf> {
    if args.role != UpRole::All {
        return None;
    }
    Some(
        flag_value(&args.router_args, "--internal-socket")
            .map(PathBuf::from)
            .unwrap_or_else(|| default_internal_socket(args)),
    )
}

/// STATE_DIR/keys, the snapshot keys every machine of a fleet shares (one data key: a
/// generation sealed on one node restores on any other, and chunks dedupe across them). An
/// all-in-one or a control host creates them if missing; a joined node must be given the
/// control host's copy: without it, it would store unencrypted snapshots, or seal them under a
/// key of its own that no other node can open, so it refuses to start instead.
pub(super) fn snapshot_keys(args: &UpArgs) -> anyhow::Result<PathBuf> {
    let dir = args.state_dir.join("keys");
    if args.role == UpRole::Node {
        if !dir.join(ate_snapshot::DATA_KEY_FILE).is_file() {
            anyhow::bail!(
                "no snapshot keys in {dir}: every machine of a fleet seals snapshots with the same keys; copy STATE_DIR/keys from the control host (`scp -rp control:/var/lib/ate/keys {dir}`, kept 0700), or run with --no-snapshot-encryption to store snapshots unencrypted",
                dir = dir.display()
            );
        }
        let keys = ate_snapshot::SnapshotKeys::load(&dir)
            .with_context(|| format!("snapshot keys in {}", dir.display()))?;
        tracing::info!(keys = %dir.display(), data_key = keys.data_key_id(), "snapshots are sealed with the fleet's keys");
        return Ok(dir);
    }
    let keys = ate_snapshot::SnapshotKeys::init(&dir)
        .with_context(|| format!("snapshot keys in {}", dir.display()))?;
    tracing::info!(keys = %dir.display(), data_key = keys.data_key_id(), "snapshots are sealed (machines that join need a copy of this directory)");
    Ok(dir)
}

/// Where this machine's workers send their actors' calls (`ate worker --router`): the router's
/// internal socket on an all-in-one, `--router-internal` on a joined node; none on a control
/// host (it runs no workers).
pub(super) fn router_for_workers(args: &UpArgs) -> Option<String> {
    match args.role {
        UpRole::All => internal_socket(args).map(|s| format!("unix:{}", s.display())),
        UpRole::Node => args.router_internal.clone(),
        UpRole::Control => None,
    }
}

/// Where the api delivers actors' alarms (`ate api --router-internal`): this machine's router,
/// through its internal socket (all-in-one) or its `--internal-listen` (a control host, whose
/// router joined nodes' workers reach too); none when the router has neither.
fn router_for_api(args: &UpArgs) -> Option<String> {
    match args.role {
        UpRole::All => internal_socket(args).map(|s| format!("unix:{}", s.display())),
        UpRole::Control => flag_value(&args.router_args, "--internal-listen")
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .map(|mut a| {
                // Bound to every address: reach it on loopback.
                if a.ip().is_unspecified() {
                    a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                a.to_string()
            }),
        UpRole::Node => None,
    }
}

/// The value of `flag` in `args` (`--flag=V` or `--flag V`; the last one wins, as in clap).
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut found = None;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if word == flag {
            found = words.next().map(String::as_str);
        } else if let Some(value) = word.strip_prefix(flag).and_then(|v| v.strip_prefix('=')) {
            found = Some(value);
        }
    }
    found
}

async fn start_router(
    args: &UpArgs,
    api_addrs: &str,
    logs: &Path,
    pki: &mut Pki,
    components: &mut Vec<Component>,
) -> anyhow::Result<()> {
    let router_args = router_args(args, api_addrs, pki)?;
    components.push(spawn("router", Role::Router, router_args, logs)?);
    let router_index = components.len() - 1;
    wait_listening(&mut components[router_index], args.router_listen).await
}

/// The api addresses a router or node agent of this host uses: ours first, then the peers.
/// A component's command line: `subcommand`, each flag with its value, then the log format
/// (every component of `ate up` logs alike).
fn command_line(
    subcommand: &str,
    args: &UpArgs,
    flags: impl IntoIterator<Item = (&'static str, String)>,
) -> Vec<String> {
    let mut line = vec![subcommand.to_string()];
    for (flag, value) in flags {
        line.extend([flag.to_string(), value]);
    }
    line.extend(["--log-format".to_string(), args.log_format.as_str().into()]);
    line
}

fn api_list(own: &str, peers: &[String]) -> String {
    std::iter::once(own.to_string())
        .chain(peers.iter().cloned())
        .collect::<Vec<_>>()
        .join(",")
}

/// `--role node`: joins the fleet (or renews the certificates it holds), then runs the node
/// agent and the workers, renewing their certificates in the background.
async fn run_node(args: UpArgs) -> anyhow::Result<ExitCode> {
    let Some(join) = args.join.clone() else {
        anyhow::bail!("--role node needs --join <api address[,address…]> of a control host");
    };
    let token = args
        .join_token
        .as_deref()
        .map(str::parse::<ate_tls::JoinToken>)
        .transpose()?;
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_ascii_lowercase())
            .context("cannot read the host name: give --node-name")?,
    };
    ate_core::validate_label("--node-name", &node_name)?;
    if !args.no_snapshot_encryption {
        // Before joining: a node without the fleet's keys cannot store snapshots.
        snapshot_keys(&args)?;
    }
    let state = &args.state_dir;
    let logs = state.join("logs");
    let run_dir = state.join("run");
    let tls_dir = state.join(client::TLS_DIR);
    let ids = Arc::new(crate::join::NodeIdentities {
        api: join.clone(),
        node: node_name.clone(),
        workers: worker_ids(&args, &node_name),
        dir: tls_dir.clone(),
    });
    let issued = ids.obtain(token.as_ref()).await?;
    let _renewal = ids.clone().spawn_renewal(issued.clone());
    let mut pki = Pki::joined(tls_dir, &issued);
    // The node's own identity reads the fleet (to wait for its workers).
    let (node_source, _) = pki.issue(
        crate::join::NODE_CERT_NAME,
        ate_tls::SpiffeId::node_instance(&issued.trust_domain, &node_name)?,
    )?;
    let clients = Clients::new(client::connect_to(&join, Some(&node_source)).await?);

    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut components = Vec::new();
    let metrics = start_or_stop(&mut components, &mut signal, async |components| {
        let (args, pki) = (&args, &mut pki);
        start_node_and_workers(
            args, &node_name, &join, &logs, &run_dir, pki, &clients, components,
        )
        .await
    })
    .await?;
    let ready = serde_json::json!({
        "node": node_name,
        "api": join,
        "node_listen": args.node_listen.to_string(),
        "workers": worker_ids(&args, &node_name),
        "node_metrics": metrics.node,
        "worker_metrics": metrics.workers,
    });
    let line = format!(
        "ate up: ready node={node_name} api={join} state={} (workers={} slots={})",
        state.display(),
        args.workers,
        args.worker_slots
    );
    ready_then_supervise(&args, &pki, ready, &line, &mut components, &mut signal).await
}

pub async fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    let state = &args.state_dir;
    let logs = state.join("logs");
    let run_dir = state.join("run");
    for d in [state, &logs, &run_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    if args.role != UpRole::Node
        && (args.join.is_some() || args.join_token.is_some() || args.router_internal.is_some())
    {
        anyhow::bail!("--join, --join-token and --router-internal are for --role node");
    }
    // Nothing of this generation starts while a process of the last one on this state dir
    // still runs (generation.rs); a Ctrl-C while waiting just ends the wait.
    let generation = {
        let signal = shutdown_signal();
        tokio::select! {
            g = generation::Generation::acquire(state) => g?,
            s = signal => anyhow::bail!("{s} while waiting for the earlier `ate up` to exit"),
        }
    };
    supervise::hand_down(generation.fd());
    let ran = match args.role {
        UpRole::Node => run_node(args).await,
        _ => run_all(args).await,
    };
    drop(generation);
    ran
}

/// `--role all` or `--role control`.
async fn run_all(args: UpArgs) -> anyhow::Result<ExitCode> {
    let state = &args.state_dir;
    let store = args
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", state.join("ate.db").display()));
    let images_dir = args
        .images_dir
        .clone()
        .unwrap_or_else(|| state.join("images"));

    let mut pki = Pki::open(&args)?;
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut components = Vec::new();
    // Ctrl-C / SIGTERM during start-up stops whatever already started.
    let (api_addr, api_http, node_metrics) =
        start_or_stop(&mut components, &mut signal, async |components| {
            start_all(&args, &store, &images_dir, &mut pki, components).await
        })
        .await?;
    let ready = serde_json::json!({
        "router": format!("http://{}", args.router_listen),
        "api": api_addr,
        // The api's bound health/metrics address (`--api-http-listen` may be port 0).
        "api_http": api_http,
        "router_metrics": args.router_metrics_listen.to_string(),
        // The node agent's and each worker's `/metrics` (absent with `--role control`).
        "node_metrics": node_metrics.as_ref().map(|m| m.node.clone()),
        "worker_metrics": node_metrics.map(|m| m.workers).unwrap_or_default(),
        // The router's socket for the workers' actor calls (`--role all` only).
        "router_internal_socket": internal_socket(&args).map(|p| p.display().to_string()),
    });
    let line = format!(
        "ate up: ready router=http://{} api={api_addr} store={store} state={} (workers={} slots={})",
        args.router_listen,
        state.display(),
        args.workers,
        args.worker_slots
    );
    println!("{}", ingress_line(&args));
    ready_then_supervise(&args, &pki, ready, &line, &mut components, &mut signal).await
}

/// The one startup line that says how the router's `--listen` ingress is protected: `ate up`
/// keeps it plain HTTP for the local quickstart (docs/security.md, "Ingress"); the Kubernetes
/// manifests serve TLS with client certificates instead.
fn ingress_line(args: &UpArgs) -> String {
    let addr = args.router_listen;
    let authenticated = args.router_args.iter().any(|a| {
        a.starts_with("--ingress-auth-mode") || a.starts_with("--ingress-allowed-spiffe-ids")
    });
    if authenticated {
        format!(
            "ate up: ingress http://{addr} is plain HTTP; client authentication as set by --router-arg (see the router's log)"
        )
    } else if addr.ip().is_loopback() {
        format!(
            "ate up: ingress http://{addr} is plain HTTP on loopback, no client authentication (local quickstart; Kubernetes: TLS + --ingress-allowed-spiffe-ids)"
        )
    } else {
        format!(
            "ate up: WARNING ingress http://{addr} is plain HTTP on a non-loopback address, no client authentication: anyone who reaches it can wake and call every actor"
        )
    }
}

/// Start-up done: the ready file (`--ready-file`: `ready` with the state and TLS directories),
/// the ready `line`, then supervision until a shutdown signal, and every component stopped.
async fn ready_then_supervise(
    args: &UpArgs,
    pki: &Pki,
    mut ready: serde_json::Value,
    line: &str,
    components: &mut [Component],
    signal: &mut std::pin::Pin<&mut impl std::future::Future<Output = ate_tls::process::Signal>>,
) -> anyhow::Result<ExitCode> {
    if let Some(file) = &args.ready_file {
        ready["state_dir"] = args.state_dir.display().to_string().into();
        ready["tls_dir"] = pki.dir.display().to_string().into();
        write_atomically(file, &ready.to_string())?;
    }
    println!("{line}");
    let code = supervise_until_stopped(components, signal).await;
    stop_all(components).await;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(flag_value(&args(&[]), "--internal-socket"), None);
        assert_eq!(
            flag_value(&args(&["--internal-socket=/a", "--x"]), "--internal-socket"),
            Some("/a")
        );
        assert_eq!(
            flag_value(
                &args(&["--internal-socket", "/a", "--internal-socket", "/b"]),
                "--internal-socket"
            ),
            Some("/b")
        );
        assert_eq!(
            flag_value(&args(&["--internal-socket-x=/a"]), "--internal-socket"),
            None
        );
    }
}
