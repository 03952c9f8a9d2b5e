//! The per-actor proxy: listener and nftables redirect in the actor netns, accept loop, splice.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{getsockopt, sockopt};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::platform::{self, is_platform};
use super::policy::{NodeAddrs, Policy, Verdict, decide};
use super::{EGRESS_PORT, lock_set};
use ate_netns::netns_path;

/// Bound on the worker's dial of an allowed destination.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Name of the nftables table the worker owns in each actor netns.
const NFT_TABLE: &str = "ate_egress";

/// Per-actor counters, logged when the actor's egress stops.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) allowed: AtomicU64,
    pub(super) denied: AtomicU64,
    pub(super) dial_failed: AtomicU64,
    pub(super) bytes_out: AtomicU64,
    pub(super) bytes_in: AtomicU64,
    /// Outbound connections being handled now (idle suspend waits for them).
    pub(super) open: AtomicU64,
    /// Last outbound connection opened or closed, Unix ms (0: none yet).
    pub(super) last_activity_ms: AtomicI64,
}

impl Stats {
    fn touch(&self) {
        self.last_activity_ms
            .store(ate_core::clock::now_ms(), Ordering::Release);
    }
}

/// Counts one outbound connection (or one platform request) as open for as long as it lives
/// (any exit path).
pub(super) struct OpenGuard(Arc<Stats>);

impl OpenGuard {
    pub(super) fn new(stats: Arc<Stats>) -> Self {
        stats.open.fetch_add(1, Ordering::AcqRel);
        stats.touch();
        OpenGuard(stats)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.touch();
    }
}

/// Creates the listener inside `netns`: a short-lived std thread enters the namespace and binds;
/// the socket keeps that namespace, so tokio serves it from any thread.
pub(super) async fn listen_in_netns(netns: &str) -> std::io::Result<TcpListener> {
    let path = netns_path(netns);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ate-egress-listen".into())
        .spawn(move || {
            let made = (|| -> std::io::Result<std::net::TcpListener> {
                let ns = std::fs::File::open(&path)?;
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
                let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, EGRESS_PORT))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })();
            let _ = tx.send(made);
        })?;
    let listener = rx
        .await
        .map_err(|_| std::io::Error::other("egress listener thread died"))?
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("egress listener 127.0.0.1:{EGRESS_PORT} in netns {netns}: {e}"),
            )
        })?;
    TcpListener::from_std(listener)
}

/// The ruleset loaded into each actor netns.
fn ruleset() -> String {
    format!(
        "table ip {NFT_TABLE} {{
\tchain output {{
\t\ttype nat hook output priority -100; policy accept;
\t\toifname \"lo\" return
\t\tip daddr 127.0.0.0/8 return
\t\tmeta l4proto tcp redirect to :{EGRESS_PORT}
\t}}
}}
"
    )
}

/// `nsenter --net=<netns path> nft -f -` with [`ruleset`] on stdin.
pub(super) async fn apply_rules(netns: &str) -> std::io::Result<()> {
    let net = format!("--net={}", netns_path(netns).display());
    let mut child = tokio::process::Command::new("nsenter")
        .args([net.as_str(), "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("run nsenter … nft: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(ruleset().as_bytes()).await?;
        stdin.shutdown().await?;
    }
    let out = child.wait_with_output().await?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "nft -f - in netns {netns}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

pub(super) async fn accept_loop(
    listener: TcpListener,
    key: String,
    policy: Arc<Policy>,
    node: Arc<NodeAddrs>,
    conns: Arc<Mutex<JoinSet<()>>>,
    stats: Arc<Stats>,
    platform: Option<Arc<platform::Ctx>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(target: "egress", actor = %key, error = %e, "egress accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let task = handle(
            stream,
            key.clone(),
            policy.clone(),
            node.clone(),
            stats.clone(),
            platform.clone(),
        );
        let mut set = lock_set(&conns);
        while set.try_join_next().is_some() {}
        set.spawn(task);
    }
}

/// Resets a connection (RST, not FIN): the actor's socket is gone at once, so it neither looks
/// reached nor lingers in the actor's TCP table before a dump.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Resets the actor's side of a spliced connection when dropped before the splice ended
/// (teardown aborts the task).
struct ResetOnDrop {
    stream: TcpStream,
    armed: bool,
}

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if self.armed {
            reset(&self.stream);
        }
    }
}

fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddrV4> {
    let sa = getsockopt(&stream.as_fd(), sockopt::OriginalDst)?;
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    ))
}

async fn handle(
    stream: TcpStream,
    key: String,
    policy: Arc<Policy>,
    node: Arc<NodeAddrs>,
    stats: Arc<Stats>,
    platform: Option<Arc<platform::Ctx>>,
) {
    // An outbound connection is activity (an agent waiting on a model API is not idle), from
    // the accept until the splice ends, whatever the verdict.
    let open = OpenGuard::new(stats.clone());
    let dst = match original_dst(&stream) {
        Ok(d) => d,
        Err(e) => {
            // A direct connect to the listener: there is no redirected destination.
            stats.denied.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: "egress", actor = %key, destination = "-", verdict = "denied", reason = %format!("no original destination ({e})"), "egress denied");
            reset(&stream);
            return;
        }
    };
    if is_platform(dst)
        && let Some(ctx) = platform
    {
        // Served by the worker itself, never dialed: no policy decision. Activity is counted
        // per request in flight there, not for the (kept-alive) connection.
        drop(open);
        tracing::debug!(target: "egress", actor = %key, destination = %dst, "platform connection");
        platform::serve(stream, ctx).await;
        return;
    }
    let verdict = decide(&policy, &node, dst).await;
    let reason = match &verdict {
        Verdict::Allowed(r) | Verdict::Denied(r) => r.clone(),
    };
    if !verdict.is_allowed() {
        stats.denied.fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: "egress", actor = %key, destination = %dst, verdict = "denied", %reason, "egress denied");
        reset(&stream);
        return;
    }
    stats.allowed.fetch_add(1, Ordering::Relaxed);
    tracing::info!(target: "egress", actor = %key, destination = %dst, verdict = "allowed", %reason, "egress allowed");
    // Dialed from the worker's own namespace: this task runs on tokio, never on a setns thread.
    let upstream = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(SocketAddr::V4(dst)))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            stats.dial_failed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: "egress", actor = %key, destination = %dst, error = %e, "egress dial failed");
            reset(&stream);
            return;
        }
        Err(_) => {
            stats.dial_failed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: "egress", actor = %key, destination = %dst, "egress dial timed out");
            reset(&stream);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let _ = stream.set_nodelay(true);
    let mut client = ResetOnDrop {
        stream,
        armed: true,
    };
    let mut upstream = upstream;
    match tokio::io::copy_bidirectional(&mut client.stream, &mut upstream).await {
        Ok((out, back)) => {
            client.armed = false;
            stats.bytes_out.fetch_add(out, Ordering::Relaxed);
            stats.bytes_in.fetch_add(back, Ordering::Relaxed);
            tracing::debug!(target: "egress", actor = %key, destination = %dst, bytes_out = out, bytes_in = back, "egress connection closed");
        }
        Err(e) => {
            tracing::debug!(target: "egress", actor = %key, destination = %dst, error = %e, "egress connection ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_redirects_tcp_but_not_loopback() {
        let r = ruleset();
        assert!(r.contains("oifname \"lo\" return"));
        assert!(r.contains("ip daddr 127.0.0.0/8 return"));
        assert!(r.contains(&format!("redirect to :{EGRESS_PORT}")));
    }
}
