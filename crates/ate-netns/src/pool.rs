//! Network namespaces made ahead of time, so a start or restore does not wait for `ip`.
//!
//! Making an actor's namespace takes two `ip` runs, 5–8 ms at n = 1 and far more when a burst
//! of restores shares the cores. A spare is an *unnamed* namespace: a background thread unshares
//! a new one, runs the same `ip -batch` setup as [`crate::create`] inside it (a child process
//! starts in its parent thread's namespace), and keeps only a file descriptor to it.
//! [`NetnsPool::create`] names one by bind-mounting that descriptor at
//! `/var/run/netns/<name>`, where runc, nftables and the socket factory look, then closes the
//! descriptor. From then on it is an ordinary named namespace (`ip netns delete` removes it).
//!
//! Architecture invariant: spares exist only as descriptors held by the worker process, so a
//! worker that exits, however it exits, leaves none behind (nothing to sweep at the next start).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nix::mount::MsFlags;
use nix::sched::{CloneFlags, unshare};

use crate::NETNS_DIR;
use crate::error::{IoContext, NetnsError, Result};

/// Spares a worker keeps by default (never more than its slots): a burst of 16 restores finds
/// one each. Measured, 16 restores at once: the netns step's median 46–48 ms with 4 spares,
/// 6–7 ms with 16. Each spare is a namespace with a loopback and one link.
pub const DEFAULT_SPARE_NETNS: usize = 16;

/// Nice value of the thread that makes spares (and of its `ip` runs): refilling waits for idle
/// CPU instead of competing with the restores that emptied the pool.
const REFILL_NICE: i32 = 19;

/// A worker's spare network namespaces (see the module docs).
pub struct NetnsPool {
    inner: Arc<Inner>,
}

struct Inner {
    spares: Mutex<Vec<OwnedFd>>,
    target: usize,
    refilling: AtomicBool,
}

impl NetnsPool {
    /// A pool that keeps `target` spares (0: none; every namespace is made on demand). The first
    /// ones are made in the background right away.
    pub fn new(target: usize) -> Self {
        let pool = NetnsPool {
            inner: Arc::new(Inner {
                spares: Mutex::new(Vec::with_capacity(target)),
                target,
                refilling: AtomicBool::new(false),
            }),
        };
        pool.refill();
        pool
    }

    /// Spares ready now.
    pub fn ready(&self) -> usize {
        self.inner.spares.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Gives the actor namespace `name` (a stale one of that name is deleted first): a spare
    /// when one is ready, else a new one made by [`crate::create`].
    pub async fn create(&self, name: &str) -> Result<()> {
        let spare = self.inner.spares.lock().ok().and_then(|mut s| s.pop());
        self.refill();
        if let Some(fd) = spare {
            match adopt(fd, name).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(netns = name, error = %e, "naming a spare netns failed; making one")
                }
            }
        }
        crate::create(name).await
    }

    /// Tops the pool up on a background thread, unless one is already doing it.
    fn refill(&self) {
        let inner = self.inner.clone();
        if inner.target == 0 || inner.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("ate-netns-spares".into())
            .spawn(move || {
                ate_snapshot::lower_this_thread_priority(REFILL_NICE);
                loop {
                    let short = inner.spares.lock().map(|s| s.len()).unwrap_or(usize::MAX)
                        < inner.target;
                    if !short {
                        break;
                    }
                    match make_spare() {
                        Ok(fd) => {
                            if let Ok(mut s) = inner.spares.lock() {
                                s.push(fd);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot make a spare netns; actors get theirs on demand");
                            break;
                        }
                    }
                }
                inner.refilling.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            self.inner.refilling.store(false, Ordering::Release);
            tracing::warn!(error = %e, "cannot start the spare-netns thread");
        }
    }
}

/// One spare: a new namespace set up like an actor's, held by a descriptor only. Runs on a
/// thread of its own, because `unshare` moves the calling thread into the new namespace for good.
fn make_spare() -> Result<OwnedFd> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<OwnedFd> {
                unshare(CloneFlags::CLONE_NEWNET).ctx(|| "unshare a network namespace")?;
                let fd: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")
                    .ctx(|| "open /proc/thread-self/ns/net")?
                    .into();
                configure_here()?;
                Ok(fd)
            })
            .join()
            .unwrap_or_else(|_| {
                Err(NetnsError::Invalid(
                    "the spare-netns thread panicked".into(),
                ))
            })
    })
}

/// Runs the actor-namespace `ip -batch` setup in the calling thread's namespace (the child
/// process starts there), retrying with a veth pair where dummy links don't exist.
fn configure_here() -> Result<()> {
    let addr = format!("{}/32", crate::ACTOR_IP);
    let veth = !crate::dummy_links();
    match ip_batch(&crate::link_batch(&addr, veth)) {
        Err(e) if !veth && e.contains("Unknown device type") => {
            crate::no_dummy_links();
            ip_batch(&crate::link_batch(&addr, true))
        }
        other => other,
    }
    .map_err(|stderr| {
        NetnsError::Command(ate_cmd::CommandError {
            command: "ip -batch - (spare netns)".into(),
            status: "failed".into(),
            stderr,
        })
    })
}

/// `ip -batch -` with `batch` on stdin; the error is ip's stderr.
fn ip_batch(batch: &str) -> std::result::Result<(), String> {
    let mut child = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(batch.as_bytes())
            .map_err(|e| format!("writing to ip: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Names the spare `fd` as `name` under [`NETNS_DIR`] (a bind mount of the descriptor, as
/// `ip netns attach` does) and closes the descriptor.
async fn adopt(fd: OwnedFd, name: &str) -> Result<()> {
    crate::delete(name).await?;
    // `ip netns add` sets the directory up (a shared bind mount of itself) the first time;
    // until one has run, spares are not used.
    if !Path::new(NETNS_DIR).is_dir() {
        return Err(NetnsError::Invalid(format!(
            "{NETNS_DIR} does not exist yet"
        )));
    }
    let target = crate::netns_path(name);
    tokio::task::spawn_blocking(move || -> Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .ctx(|| format!("create {}", target.display()))?;
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Err(e) = nix::mount::mount(
            Some(source.as_str()),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            let _ = std::fs::remove_file(&target);
            return Err(NetnsError::io(
                format!("bind {source} at {}", target.display()),
                std::io::Error::from(e),
            ));
        }
        drop(fd);
        Ok(())
    })
    .await
    .map_err(|e| NetnsError::Invalid(format!("naming a spare netns: {e}")))?
}
