//! `ate bench hibernate` (issue 35): the router's memory per hibernated WebSocket.
//!
//! 1. A counter template with `webSockets: hibernate` and `--actors` actors of it.
//! 2. The router's resident memory (`VmRSS` of `--router-pid`) before any socket.
//! 3. Per actor, `--concurrency` actors at a time: `--sockets-per-actor` WebSockets to `/ws`
//!    through the router (the first wakes the actor), one echo on each, then the actor is
//!    suspended: its sockets stay open on the router, hibernated.
//! 4. The router's resident memory again, with every socket hibernated: the difference over
//!    the sockets is the memory per hibernated socket (it includes the router's bookkeeping
//!    and the client side's kernel-independent buffers; socket buffers are the kernel's).
//! 5. Wakes: one message on a socket of each of `--wakes` actors, each waking its actor; the
//!    time to the echo, median and slowest.
//! 6. Every socket is closed and every actor deleted (unless `--keep`).
//!
//! `VmRSS` counts pages the allocator keeps after frees too; the figure is an upper bound.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_client::Clients;
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::{
    Common, apply_yaml, counter_container, ensure_actor, ensure_suspended, images_dir, median,
    sorted, template_yaml, write_json,
};

#[derive(Args, Debug, Clone)]
pub struct HibernateArgs {
    #[command(flatten)]
    common: Common,
    /// The router's process id (its memory is read from /proc): with `ate up`, the child whose
    /// command line is `… router …` (`pgrep -f 'exe router'`).
    #[arg(long)]
    router_pid: u32,
    /// The router's metrics address (`--router-metrics-listen`): the number of hibernated
    /// sockets is read there before the memory is.
    #[arg(long, default_value = "127.0.0.1:9091")]
    router_metrics: String,
    /// Actors of the bench.
    #[arg(long, default_value_t = 100)]
    actors: usize,
    /// WebSockets to each actor.
    #[arg(long, default_value_t = 10)]
    sockets_per_actor: usize,
    /// Actors woken and suspended at once while the sockets are opened.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Actors woken by one message each at the end (the wake latency).
    #[arg(long, default_value_t = 10)]
    wakes: usize,
    /// Leave the actors at the end (default: delete them all).
    #[arg(long)]
    keep: bool,
}

const TEMPLATE: &str = "hibernate";

pub async fn hibernate(c: Clients, a: HibernateArgs) -> anyhow::Result<ExitCode> {
    let ns = a.common.atespace_or("bench-ws");
    let images = images_dir(&c, &a.common).await?;
    let spec = format!(
        "  containers:\n{}  resources: {{cpu: 250m, memory: 64Mi}}\n  snapshots: {{fidelity: memory}}\n  idleTimeout: 5m\n  webSockets: hibernate\n",
        counter_container("counter", &images, "", 80)
    );
    apply_yaml(&c, &template_yaml(&ns, TEMPLATE, &spec)).await?;
    let names: Vec<String> = (0..a.actors).map(|i| format!("h-{i:04}")).collect();
    for name in &names {
        ensure_actor(&c, &ns, name, TEMPLATE).await?;
        ensure_suspended(&c, &ns, name).await?;
    }
    let router = router_addr(&a.common)?;
    let before = rss_kib(a.router_pid)?;
    eprintln!("==> router VmRSS before: {before} KiB");

    // Sockets, grouped by actor; each group opened by one task, `concurrency` at a time.
    let sockets: Arc<Mutex<Vec<Vec<TcpStream>>>> = Arc::new(Mutex::new(Vec::new()));
    let opened = Instant::now();
    let mut pending = names.clone().into_iter();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        while tasks.len() < a.concurrency.max(1) {
            let Some(name) = pending.next() else { break };
            let (c, ns, sockets) = (c.clone(), ns.clone(), sockets.clone());
            let n = a.sockets_per_actor;
            tasks.spawn(async move {
                let actor = format!("{ns}/{name}");
                let mut group = Vec::with_capacity(n);
                for i in 0..n {
                    let mut s = connect(router, &actor).await?;
                    let text = format!("{name} #{i}");
                    anyhow::ensure!(echo(&mut s, &text).await? == text, "{actor}: wrong echo");
                    group.push(s);
                }
                // Explicitly, so the bench need not wait for the idle timeout.
                ensure_suspended(&c, &ns, &name).await?;
                sockets.lock().await.push(group);
                anyhow::Ok(())
            });
        }
        match tasks.join_next().await {
            Some(r) => r.context("socket task")??,
            None => break,
        }
    }
    let open: usize = sockets.lock().await.iter().map(Vec::len).sum();
    eprintln!(
        "==> {open} WebSockets to {} actors open and hibernated in {:.1} s",
        a.actors,
        opened.elapsed().as_secs_f64()
    );
    // Give the router's closed upstream legs a moment to be freed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hibernated = hibernated_gauge(&a.router_metrics).await?;
    eprintln!("==> the router counts {hibernated} hibernated WebSockets");
    anyhow::ensure!(
        hibernated as usize == open,
        "{open} sockets open but {hibernated} hibernated: the measurement would not be of sleeping sockets"
    );
    let after = rss_kib(a.router_pid)?;
    let per_socket = (after.saturating_sub(before) as f64) * 1024.0 / open.max(1) as f64;
    eprintln!(
        "==> router VmRSS with {open} hibernated: {after} KiB: {per_socket:.0} bytes per socket"
    );

    // Wakes: one message on the first socket of each of the first `wakes` actors.
    let mut wake_secs = Vec::new();
    {
        let mut groups = sockets.lock().await;
        for group in groups.iter_mut().take(a.wakes) {
            if let Some(s) = group.first_mut() {
                let started = Instant::now();
                let text = "wake up";
                anyhow::ensure!(echo(s, text).await? == text, "wrong echo after a wake");
                wake_secs.push(started.elapsed().as_secs_f64());
            }
        }
    }
    let wake_secs = sorted(wake_secs);
    eprintln!(
        "==> wake to echo: median {:.3} s, slowest {:.3} s over {}",
        median(&wake_secs),
        wake_secs.last().copied().unwrap_or(0.0),
        wake_secs.len()
    );
    drop(sockets);
    if !a.keep {
        crate::delete_all(&c, &ns, names.clone(), 8).await;
    }
    write_json(
        &a.common,
        "hibernate",
        &json!({
            "actors": a.actors,
            "sockets": open,
            "hibernated_gauge": hibernated,
            "router_rss_kib_before": before,
            "router_rss_kib_after": after,
            "bytes_per_hibernated_socket": per_socket.round(),
            "wake_to_echo_seconds": wake_secs,
            "wake_to_echo_median_seconds": median(&wake_secs),
        }),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `ate_router_hibernate_websockets_hibernated` on the router's `/metrics`.
async fn hibernated_gauge(metrics: &str) -> anyhow::Result<f64> {
    let base = format!("http://{metrics}");
    let reply = crate::call(&crate::http_client(1), &base, None, "/metrics").await;
    anyhow::ensure!(
        reply.status == 200,
        "{base}/metrics: {} {}",
        reply.status,
        reply.body
    );
    Ok(reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix("ate_router_hibernate_websockets_hibernated "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// `host:port` of `--router` (`http://host:port`).
fn router_addr(common: &Common) -> anyhow::Result<std::net::SocketAddr> {
    let hostport = common
        .router
        .trim_start_matches("http://")
        .trim_end_matches('/');
    hostport
        .parse()
        .with_context(|| format!("--router {:?} is not http://<ip>:<port>", common.router))
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("--router-pid {pid}: no such process"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/status has no VmRSS"))
}

/// A WebSocket to `/ws` of `actor` through the router (the RFC 6455 handshake by hand).
async fn connect(router: std::net::SocketAddr, actor: &str) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(router).await?;
    s.set_nodelay(true)?;
    s.write_all(
        format!(
            "GET /ws HTTP/1.1\r\nHost: bench\r\nate-target-actor: {actor}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(60), s.read_exact(&mut b))
            .await
            .context("handshake timed out")??;
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    anyhow::ensure!(head.starts_with("HTTP/1.1 101"), "{actor}: {head}");
    Ok(s)
}

/// Sends a masked text frame (under 126 bytes) and reads the echo.
async fn echo(s: &mut TcpStream, text: &str) -> anyhow::Result<String> {
    anyhow::ensure!(text.len() < 126, "frame too long for this client");
    let mask = [3u8, 1, 4, 1];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).await?;
    let read = async {
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await?;
        anyhow::ensure!(head[0] == 0x81, "expected a text frame, got {:#x}", head[0]);
        let mut payload = vec![0u8; usize::from(head[1] & 0x7f)];
        s.read_exact(&mut payload).await?;
        anyhow::Ok(String::from_utf8_lossy(&payload).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .context("echo timed out")?
}
