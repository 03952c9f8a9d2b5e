//! This machine's node agent and workers: their arguments, addresses and certificates, and the
//! wait until the api lists every worker.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_proto::v1;

use super::pki::Pki;
use super::supervise::{Component, READY_TIMEOUT, Role, spawn, spawn_with_env, tail, wait_ready};
use super::{UpArgs, UpRole, command_line};
use crate::client::Clients;

/// The `/metrics` addresses of this machine's node agent and workers: `--node-metrics-listen`
/// and `--worker-metrics-listen` (worker N on its port + N - 1), else free loopback ports; chosen
/// once, so that a restarted component comes back on the same one.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeMetrics {
    pub(super) node: String,
    pub(super) workers: Vec<String>,
}

impl NodeMetrics {
    pub(super) fn pick(
        node: Option<SocketAddr>,
        first_worker: Option<SocketAddr>,
        workers: u32,
    ) -> anyhow::Result<Self> {
        let loopback = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
        let free = |on: SocketAddr| -> anyhow::Result<String> {
            let l = std::net::TcpListener::bind(on)
                .with_context(|| format!("cannot find a free port for metrics on {}", on.ip()))?;
            Ok(l.local_addr()?.to_string())
        };
        let node = match node {
            Some(a) if a.port() != 0 => a.to_string(),
            Some(a) => free(a)?,
            None => free(loopback)?,
        };
        let workers = match first_worker {
            Some(base) if base.port() != 0 => (0..workers)
                .map(|i| {
                    let port = u16::try_from(u32::from(base.port()) + i).map_err(|_| {
                        anyhow::anyhow!(
                            "--worker-metrics-listen {base}: worker {} would need port {} (over 65535)",
                            i + 1,
                            u32::from(base.port()) + i
                        )
                    })?;
                    Ok(SocketAddr::new(base.ip(), port).to_string())
                })
                .collect::<anyhow::Result<_>>()?,
            Some(base) => (0..workers)
                .map(|_| free(base))
                .collect::<anyhow::Result<_>>()?,
            None => (0..workers)
                .map(|_| free(loopback))
                .collect::<anyhow::Result<_>>()?,
        };
        Ok(NodeMetrics { node, workers })
    }
}

/// Starts the node agent and the workers, and waits until the api lists every worker; returns
/// their metrics addresses.
#[allow(clippy::too_many_arguments)]
pub(super) async fn start_node_and_workers(
    args: &UpArgs,
    node_name: &str,
    api_addrs: &str,
    logs: &Path,
    run_dir: &Path,
    pki: &mut Pki,
    clients: &Clients,
    components: &mut Vec<Component>,
) -> anyhow::Result<NodeMetrics> {
    let metrics = NodeMetrics::pick(
        args.node_metrics_listen,
        args.worker_metrics_listen,
        args.workers,
    )?;
    let td = pki.td.clone();
    let state = args.state_dir.display().to_string();
    if args.workers > 0 && !nix::unistd::Uid::effective().is_root() {
        anyhow::bail!(
            "workers run runc sandboxes and need root: run `ate up` as root (or with --workers 0)"
        );
    }
    let node_ready = run_dir.join("node.json");
    let _ = std::fs::remove_file(&node_ready);
    let flags = [
        ("--name", node_name.into()),
        ("--listen", args.node_listen.to_string()),
        ("--api", api_addrs.to_string()),
        ("--state-dir", state.clone()),
        ("--ready-file", node_ready.display().to_string()),
        ("--metrics-listen", metrics.node.clone()),
    ];
    let mut node_args = command_line("node", args, flags);
    if args.no_snapshot_encryption {
        node_args.push("--no-snapshot-encryption".to_string());
    } else {
        let dir = super::snapshot_keys(args)?;
        node_args.extend(["--snapshot-keys".to_string(), dir.display().to_string()]);
    }
    if let Some(url) = &args.durable_store {
        node_args.extend(["--durable-store".to_string(), url.clone()]);
    }
    let volume_roots = default_volume_roots(args);
    if let Some(roots) = &volume_roots {
        node_args.extend(["--external-volume-roots".to_string(), roots.clone()]);
    }
    node_args.extend(
        // A per-node identity: the api lets a node suspend only the actors on its own workers.
        pki.issue(
            crate::join::NODE_CERT_NAME,
            ate_tls::SpiffeId::node_instance(&td, node_name)?,
        )?
        .1
        .to_args(),
    );
    components.push(spawn("node", Role::Node, node_args, logs)?);
    let node_index = components.len() - 1;
    wait_ready(&mut components[node_index], &node_ready).await?;

    let deny = control_plane_addresses(args, api_addrs);
    let memory = worker_memory(ate_worker::config::total_memory_bytes(), args.workers);
    for (i, id) in (1..=args.workers).zip(worker_ids(args, node_name)) {
        let listen = SocketAddr::new(worker_address(args.worker_first_ip, i)?, args.worker_port);
        let flags = [
            ("--id", id.clone()),
            ("--state-dir", state.clone()),
            ("--listen", listen.to_string()),
            ("--slots", args.worker_slots.to_string()),
            ("--cpu-overcommit", args.cpu_overcommit.to_string()),
            ("--memory", memory.to_string()),
            // Lets an actor be pinned to one worker with a selector (`ate update actor
            // --selector`).
            (
                "--labels",
                format!("ate.dev/worker={id},ate.dev/node={node_name}"),
            ),
            (
                "--metrics-listen",
                metrics.workers[(i - 1) as usize].clone(),
            ),
        ];
        let mut worker_args = command_line("worker", args, flags);
        if args.no_snapshot_encryption {
            // Otherwise the worker seals its generations with STATE_DIR/keys, as the node does.
            worker_args.push("--no-snapshot-encryption".to_string());
        }
        if !deny.is_empty() {
            // No egress policy may let an actor reach the api, the store or the object store.
            worker_args.extend(["--deny-egress".to_string(), deny.join(",")]);
        }
        worker_args.extend(
            pki.issue(&id, ate_tls::SpiffeId::worker_instance(&td, &id)?)?
                .1
                .to_args(),
        );
        let mut env = registry_env(args)?;
        // The api keeps actors' alarms (the local actor API's /v1/alarm), reached with this
        // worker's certificate.
        env.push(("ATE_WORKER_API".to_string(), api_addrs.to_string()));
        if let Some(roots) = &volume_roots {
            env.push(("ATE_EXTERNAL_VOLUME_ROOTS".to_string(), roots.clone()));
        }
        if let Some(router) = super::router_for_workers(args) {
            // The router's internal listener for the actors' calls (`ate worker --router`). The
            // worker connects when an actor first calls, so the router may start after it.
            env.push(("ATE_WORKER_ROUTER".to_string(), router));
        }
        components.push(spawn_with_env(&id, Role::Worker, worker_args, logs, env)?);
    }
    wait_workers(clients, node_name, args.workers as usize, components).await?;
    Ok(metrics)
}

/// Where external hostPath volumes may live on this machine: STATE_DIR/volumes, unless the
/// operator set `ATE_EXTERNAL_VOLUME_ROOTS` (which the node and the workers then read as it is).
fn default_volume_roots(args: &UpArgs) -> Option<String> {
    if std::env::var_os("ATE_EXTERNAL_VOLUME_ROOTS").is_some() {
        return None;
    }
    let state = std::path::absolute(&args.state_dir).unwrap_or(args.state_dir.clone());
    Some(state.join("volumes").display().to_string())
}

/// Memory each of `workers` workers offers (templates' limits are booked against it): half
/// the machine's for one or two workers (a worker's own default), an equal share of it for
/// more, so the limits booked on one machine never add up to more than its memory however many
/// workers it runs (slots alone no longer bound them: `--worker-slots` is sized for idle
/// agents). A machine whose memory cannot be read gets 1 GiB per worker.
fn worker_memory(total: u64, workers: u32) -> u64 {
    if total == 0 {
        return 1 << 30;
    }
    total / u64::from(workers.max(2))
}

/// Waits until the api lists `n` ACTIVE workers of `node`.
async fn wait_workers(
    clients: &Clients,
    node: &str,
    n: usize,
    components: &mut [Component],
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        for c in components.iter_mut() {
            if let Some(status) = c.try_wait()? {
                anyhow::bail!(
                    "{} exited during start-up ({status}); last log lines:\n{}",
                    c.name,
                    tail(&c.log, 20)
                );
            }
        }
        let workers = clients
            .fleet
            .clone()
            .list_workers(v1::ListWorkersRequest {})
            .await
            .map(|r| r.into_inner().workers)
            .unwrap_or_default();
        let workers: Vec<_> = workers.into_iter().filter(|w| w.node == node).collect();
        if workers.iter().filter(|w| w.status == "ACTIVE").count() >= n {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!(
                "only {} of {n} workers registered after {READY_TIMEOUT:?}; see the logs in {}",
                workers.len(),
                components[0]
                    .log
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The workers' registry settings from `--insecure-registry` and `--registry-auth-file`, on top
/// of the environment `ate up` was started with.
fn registry_env(args: &UpArgs) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    if !args.insecure_registries.is_empty() {
        for r in &args.insecure_registries {
            if r.is_empty() || r.contains(['/', ',', ' ']) {
                anyhow::bail!("--insecure-registry {r:?}: expected HOST:PORT (no scheme, no path)");
            }
        }
        let mut list: Vec<String> = std::env::var("ATE_INSECURE_REGISTRIES")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        list.extend(args.insecure_registries.iter().cloned());
        env.push(("ATE_INSECURE_REGISTRIES".to_string(), list.join(",")));
    }
    if let Some(file) = &args.registry_auth_file {
        let file = std::fs::canonicalize(file)
            .with_context(|| format!("--registry-auth-file {}", file.display()))?;
        env.push((
            "ATE_REGISTRY_AUTH_FILE".to_string(),
            file.display().to_string(),
        ));
    }
    Ok(env)
}

/// The addresses of the control plane this machine knows: the api replicas, the SQL store and
/// the object store endpoint (`AWS_ENDPOINT_URL`), resolved now. Loopback ones are left out
/// (always denied anyway); a name that does not resolve is skipped with a warning.
fn control_plane_addresses(args: &UpArgs, api_addrs: &str) -> Vec<String> {
    let mut hosts: Vec<String> = api_addrs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    let mut add_url = |url: &str| {
        // scheme://[user[:pass]@]host[:port][/…]
        let Some((_, rest)) = url.split_once("://") else {
            return;
        };
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if !host_port.is_empty() {
            hosts.push(host_port.to_string());
        }
    };
    if let Some(store) = &args.store {
        add_url(store);
    }
    if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
        add_url(&endpoint);
    }
    let mut out = std::collections::BTreeSet::new();
    for h in hosts {
        let with_port = if h.starts_with('[') || h.matches(':').count() == 1 {
            h.clone()
        } else {
            format!("{h}:0")
        };
        match std::net::ToSocketAddrs::to_socket_addrs(&with_port) {
            Ok(addrs) => out.extend(
                addrs
                    .map(|a| a.ip())
                    .filter(|ip| !ip.is_loopback())
                    .map(|ip| ip.to_string()),
            ),
            Err(e) => eprintln!("ate up: cannot resolve control-plane address {h}: {e}"),
        }
    }
    out.into_iter().collect()
}

/// Worker ids of this machine: `worker-<i>` on an all-in-one (as before nodes could join), else
/// `<node>-worker-<i>` (the api signs a node's worker certificates only under its name).
pub(super) fn worker_ids(args: &UpArgs, node_name: &str) -> Vec<String> {
    (1..=args.workers)
        .map(|i| match args.role {
            UpRole::All => format!("worker-{i}"),
            _ => format!("{node_name}-worker-{i}"),
        })
        .collect()
}

/// The address of worker `i` (1-based): every worker serves atunnel on its own address, as a
/// pod would (loopback addresses on one machine; the host's addresses on a joined node).
fn worker_address(first: std::net::Ipv4Addr, i: u32) -> anyhow::Result<std::net::IpAddr> {
    let ip = u32::from(first)
        .checked_add(i - 1)
        .map(std::net::Ipv4Addr::from);
    match ip {
        Some(ip) if ip.is_loopback() == first.is_loopback() && !ip.is_unspecified() => {
            Ok(std::net::IpAddr::V4(ip))
        }
        _ => anyhow::bail!("worker {i} would not get an address starting from {first}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_share_the_machines_memory() {
        let total = 24 << 30;
        // One or two workers: half each (what a worker offers by itself).
        assert_eq!(worker_memory(total, 1), 12 << 30);
        assert_eq!(worker_memory(total, 2), 12 << 30);
        // More: never more than the machine in all.
        assert_eq!(worker_memory(total, 4), 6 << 30);
        assert!(worker_memory(total, 7) * 7 <= total);
        assert_eq!(worker_memory(0, 3), 1 << 30);
    }

    #[test]
    fn metrics_addresses_from_the_flags() -> anyhow::Result<()> {
        let a = |s: &str| s.parse::<SocketAddr>();
        let m = NodeMetrics::pick(Some(a("127.0.0.1:9100")?), Some(a("127.0.0.5:9200")?), 3)?;
        assert_eq!(m.node, "127.0.0.1:9100");
        assert_eq!(
            m.workers,
            ["127.0.0.5:9200", "127.0.0.5:9201", "127.0.0.5:9202"]
        );
        // Port 0: free ports on that address, one per worker.
        let m = NodeMetrics::pick(Some(a("127.0.0.1:0")?), Some(a("127.0.0.1:0")?), 2)?;
        assert!(m.node.starts_with("127.0.0.1:") && !m.node.ends_with(":0"));
        assert_eq!(m.workers.len(), 2);
        assert_ne!(m.workers[0], m.workers[1]);
        // Absent: free loopback ports.
        let m = NodeMetrics::pick(None, None, 1)?;
        assert!(m.workers[0].starts_with("127.0.0.1:"));
        // Past the last port.
        let err = NodeMetrics::pick(None, Some(a("127.0.0.1:65535")?), 2)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("worker 2 would need port 65536"), "{err}");
        Ok(())
    }
}
