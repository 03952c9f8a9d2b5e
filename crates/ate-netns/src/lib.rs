//! Per-actor network namespaces and sockets created inside them.
//!
//! Each actor gets `ate-<10 hex>` (a hash of its directory on the worker, so the name is stable
//! across worker restarts, unique per worker and system on a host, and short enough for any
//! interface-name use): loopback up, a dummy link
//! carrying [`ACTOR_IP`]/32 and a default route through it, so the workload can bind and its
//! connect() calls find a route (egress redirection is layered on top by `ate-egress`).
//!
//! The worker's namespaces: made here ([`create`]) or taken from the spares of [`pool`], dialed
//! into by a [`NetnsDialer`] (atunnel, `ate-atunnel`) or [`connect_in_netns`] (wakeup probes).

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod error;
mod lockfile;
pub mod pool;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

pub use crate::error::{NetnsError, Result};

/// The address every actor's workload is reached at, inside its own namespace.
pub const ACTOR_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 2);
/// Name of the link inside the actor namespace (namespaced, so it never collides).
pub const ACTOR_LINK: &str = "ate0";
/// Peer of [`ACTOR_LINK`] when it has to be a veth pair.
const ACTOR_PEER_LINK: &str = "ate1";
/// Where iproute2 keeps named namespaces (runc gets the actor's namespace by this path).
pub const NETNS_DIR: &str = "/var/run/netns";

const IP: &str = "ip";

/// Makes [`NETNS_DIR`] what `ip netns add` makes it, before the worker names any namespace
/// there: a shared bind mount of itself. Only `ip netns add` did this, and not every namespace is
/// named by it (the user-namespace hook and spare adoption bind-mount their own): a namespace
/// bound while the directory was still a plain directory sits on the parent mount, and the bind
/// a later `ip netns add` puts over the directory hides it for good (`ip netns delete`: "Cannot
/// remove namespace file … Device or resource busy", and a stop or restore of that actor fails).
/// Recursive, so namespaces bound before are carried into the bind. Under a lock across the
/// node's workers: two binds at once would stack and hide each other the same way.
pub fn prepare_dir() -> Result<()> {
    use nix::errno::Errno;
    use nix::mount::{MsFlags, mount};

    use crate::error::IoContext;

    std::fs::create_dir_all(NETNS_DIR).ctx(|| format!("create {NETNS_DIR}"))?;
    let _lock = crate::lockfile::lock_exclusive(std::path::Path::new("/run/ate-netns-dir.lock"))?;
    let shared = || {
        mount(
            None::<&str>,
            NETNS_DIR,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match shared() {
        Ok(()) => Ok(()),
        // Not a mount point yet.
        Err(Errno::EINVAL) => {
            mount(
                Some(NETNS_DIR),
                NETNS_DIR,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|e| NetnsError::io(format!("bind {NETNS_DIR} onto itself"), e.into()))?;
            shared().map_err(|e| NetnsError::io(format!("make {NETNS_DIR} shared"), e.into()))
        }
        Err(e) => Err(NetnsError::io(format!("make {NETNS_DIR} shared"), e.into())),
    }
}

pub use ate_worker_client::sandbox::short_id;

/// `ate-<short id>`: 14 characters, valid as a netns, link and container name.
pub fn netns_name(key: &str) -> String {
    format!("ate-{}", short_id(key))
}

pub fn netns_path(netns: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(netns)
}

/// Creates the actor namespace from scratch (a stale one of the same name is deleted first, so a
/// worker restart never inherits old routes or sockets).
pub async fn create(netns: &str) -> Result<()> {
    delete(netns).await?;
    let ip = ACTOR_IP.to_string();
    let addr = format!("{ip}/32");
    let result = async {
        ate_cmd::run(IP, ["netns", "add", netns]).await?;
        // Everything else in one `ip -batch` (one process instead of five: these run on every
        // start and restore). The link is a dummy device, or a veth pair with both ends inside
        // on kernels built without `CONFIG_DUMMY` (some VM guests): the same effect, an up link
        // that carries the address and the default route and leads nowhere.
        let veth = !DUMMY_LINKS.load(Ordering::Relaxed);
        let batch = link_batch(&addr, veth);
        match ate_cmd::run_with_input(IP, ["-n", netns, "-batch", "-"], &batch).await {
            Ok(_) => Ok(()),
            Err(e) if !veth && e.to_string().contains("Unknown device type") => {
                DUMMY_LINKS.store(false, Ordering::Relaxed);
                ate_cmd::run(IP, ["netns", "delete", netns]).await?;
                ate_cmd::run(IP, ["netns", "add", netns]).await?;
                ate_cmd::run_with_input(IP, ["-n", netns, "-batch", "-"], &link_batch(&addr, true))
                    .await
                    .map(|_| ())
            }
            Err(e) => Err(e),
        }
    }
    .await;
    if let Err(e) = result {
        let _ = delete(netns).await;
        return Err(e.into());
    }
    Ok(())
}

/// Whether dummy links work here (cleared at the first "Unknown device type").
static DUMMY_LINKS: AtomicBool = AtomicBool::new(true);

/// Whether dummy links are believed to work here (else a veth pair stands in).
pub fn dummy_links() -> bool {
    DUMMY_LINKS.load(Ordering::Relaxed)
}

/// Records that this kernel has no dummy links (an "Unknown device type" from ip).
pub(crate) fn no_dummy_links() {
    DUMMY_LINKS.store(false, Ordering::Relaxed);
}

/// `ip -batch` lines that set up an actor namespace: lo up, [`ACTOR_LINK`] (dummy, or a veth
/// pair with [`ACTOR_PEER_LINK`] when `veth`) carrying `addr`, and the default route through it.
pub fn link_batch(addr: &str, veth: bool) -> String {
    let link = if veth {
        format!(
            "link add {ACTOR_LINK} type veth peer name {ACTOR_PEER_LINK}\nlink set {ACTOR_PEER_LINK} up\n"
        )
    } else {
        format!("link add {ACTOR_LINK} type dummy\n")
    };
    format!(
        "link set lo up\n{link}addr add {addr} dev {ACTOR_LINK}\nlink set {ACTOR_LINK} up\nroute add default dev {ACTOR_LINK}\n"
    )
}

/// Deletes the namespace; a missing one is not an error.
pub async fn delete(netns: &str) -> Result<()> {
    if !exists(netns) {
        return Ok(());
    }
    let out = ate_cmd::output(IP, ["netns", "delete", netns]).await?;
    if out.status.success() || !exists(netns) {
        return Ok(());
    }
    Err(ate_cmd::failed(IP, ["netns", "delete", netns], &out).into())
}

pub fn exists(netns: &str) -> bool {
    netns_path(netns).exists()
}

/// Creates a TCP socket inside `netns` and connects it to `addr` (no timeout of its own; see
/// [`connect_in_netns_timeout`]).
///
/// `setns` changes only the calling thread, so the socket is created on a short-lived dedicated
/// std thread — never a tokio worker, whose later tasks would silently run in the actor's
/// namespace. A socket keeps the namespace it was created in, so the connect itself runs on tokio.
pub async fn connect_in_netns(
    netns: &str,
    addr: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let path = netns_path(netns);
    let family = match addr.ip() {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ate-netns-socket".into())
        .spawn(move || {
            let made = (|| -> std::io::Result<std::os::fd::OwnedFd> {
                let ns = std::fs::File::open(&path)?;
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
                new_socket(family)
            })();
            let _ = tx.send(made);
        })?;
    let fd = rx
        .await
        .map_err(|_| std::io::Error::other("netns socket thread died"))??;
    let std_stream = std::net::TcpStream::from(fd);
    let sock = tokio::net::TcpSocket::from_std_stream(std_stream);
    sock.connect(addr).await
}

/// [`connect_in_netns`] bounded by `timeout` (a dropped SYN on the dummy link would otherwise
/// wait for the kernel's minutes-long retry limit).
pub async fn connect_in_netns_timeout(
    netns: &str,
    addr: SocketAddr,
    timeout: Duration,
) -> std::io::Result<tokio::net::TcpStream> {
    match tokio::time::timeout(timeout, connect_in_netns(netns, addr)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("connect {addr} in {netns} timed out"),
        )),
    }
}

/// Unconnected sockets kept ready per namespace, so the common connect needs no thread hop.
const SPARE_SOCKETS: usize = 16;
/// Refill when the spare pool drops below this.
const SPARE_LOW_WATER: usize = 4;

enum FactoryRequest {
    /// One socket of this family, sent back on the oneshot.
    One(
        AddressFamily,
        tokio::sync::oneshot::Sender<std::io::Result<std::os::fd::OwnedFd>>,
    ),
    /// Top the IPv4 spare pool up to [`SPARE_SOCKETS`].
    Refill,
}

/// A long-lived socket factory for one network namespace: a dedicated std thread enters the
/// namespace once (`setns`) and then creates sockets on request; connects run on tokio (a socket
/// keeps the namespace it was created in). Replaces a thread spawn per connect on atunnel's hot
/// path. The thread holds a reference to the namespace, so drop the dialer when the actor's
/// namespace is deleted (sockets would otherwise be made in the orphaned namespace).
#[derive(Clone)]
pub struct NetnsDialer {
    netns: String,
    tx: std::sync::mpsc::Sender<FactoryRequest>,
    spare: std::sync::Arc<std::sync::Mutex<Vec<std::os::fd::OwnedFd>>>,
    refill_pending: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for NetnsDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetnsDialer")
            .field("netns", &self.netns)
            .finish()
    }
}

impl NetnsDialer {
    /// Starts the factory thread inside `netns` (which must exist) and fills the spare pool.
    pub async fn new(netns: &str) -> std::io::Result<Self> {
        let ns = std::fs::File::open(netns_path(netns))?;
        let (tx, rx) = std::sync::mpsc::channel::<FactoryRequest>();
        let spare = std::sync::Arc::new(std::sync::Mutex::new(Vec::with_capacity(SPARE_SOCKETS)));
        let refill_pending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<std::io::Result<()>>();
        let pool = spare.clone();
        let pending = refill_pending.clone();
        std::thread::Builder::new()
            .name(format!("netns-{netns}"))
            .spawn(move || {
                if let Err(e) = setns(ns.as_fd(), CloneFlags::CLONE_NEWNET) {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
                drop(ns);
                allow_time_wait_reuse();
                refill(&pool);
                let _ = ready_tx.send(Ok(()));
                // Ends when the dialer (the only sender) is dropped.
                while let Ok(req) = rx.recv() {
                    match req {
                        FactoryRequest::One(family, reply) => {
                            let _ = reply.send(new_socket(family));
                        }
                        FactoryRequest::Refill => {
                            pending.store(false, Ordering::Release);
                            refill(&pool);
                        }
                    }
                }
            })?;
        ready_rx
            .await
            .map_err(|_| std::io::Error::other("netns socket factory thread died"))??;
        Ok(NetnsDialer {
            netns: netns.to_string(),
            tx,
            spare,
            refill_pending,
        })
    }

    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// A fresh unconnected socket from inside the namespace.
    async fn socket(&self, family: AddressFamily) -> std::io::Result<std::os::fd::OwnedFd> {
        if family == AddressFamily::Inet {
            let (fd, left) = {
                let mut pool = match self.spare.lock() {
                    Ok(p) => p,
                    Err(poisoned) => poisoned.into_inner(),
                };
                (pool.pop(), pool.len())
            };
            if left < SPARE_LOW_WATER && !self.refill_pending.swap(true, Ordering::AcqRel) {
                let _ = self.tx.send(FactoryRequest::Refill);
            }
            if let Some(fd) = fd {
                return Ok(fd);
            }
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(FactoryRequest::One(family, reply))
            .map_err(|_| std::io::Error::other("netns socket factory stopped"))?;
        rx.await
            .map_err(|_| std::io::Error::other("netns socket factory stopped"))?
    }

    /// Connects to `addr` from a socket created inside the namespace (no timeout of its own).
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let family = match addr.ip() {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        let fd = self.socket(family).await?;
        let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        sock.set_nodelay(true)?;
        sock.connect(addr).await
    }

    /// [`NetnsDialer::connect`] bounded by `timeout`.
    pub async fn connect_timeout(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> std::io::Result<tokio::net::TcpStream> {
        match tokio::time::timeout(timeout, self.connect(addr)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect {addr} in {} timed out", self.netns),
            )),
        }
    }
}

/// `net.ipv4.tcp_tw_reuse` of the namespace the calling thread is in (`/proc/sys/net` follows
/// the thread's network namespace).
const TW_REUSE_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_tw_reuse";

/// Runs on the factory thread (inside the namespace): lets connects to the actor reuse ports held
/// by TIME-WAIT sockets (`tcp_tw_reuse=1`; the kernel default 2 allows it on loopback only).
/// Every tunnel is one connection from the same address to the same `ACTOR_IP:port`, and the
/// tunnel's atunnel end closes first, so without reuse a few hundred new tunnels a second
/// (CONNECT per gRPC request, WebSocket, a router without a keep-alive pool) fill the ephemeral
/// port range with TIME-WAIT: each connect() then scans it (most of a worker's CPU) and
/// throughput fell from ~6,000 to ~800 tunnels/s in `ate bench warm` against such a router.
fn allow_time_wait_reuse() {
    if let Err(e) = std::fs::write(TW_REUSE_SYSCTL, b"1") {
        tracing::warn!(error = %e, "netns socket factory: cannot set {TW_REUSE_SYSCTL}");
    }
}

fn new_socket(family: AddressFamily) -> std::io::Result<std::os::fd::OwnedFd> {
    Ok(socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?)
}

/// Runs on the factory thread (inside the namespace).
fn refill(pool: &std::sync::Mutex<Vec<std::os::fd::OwnedFd>>) {
    let missing = match pool.lock() {
        Ok(p) => SPARE_SOCKETS.saturating_sub(p.len()),
        Err(poisoned) => SPARE_SOCKETS.saturating_sub(poisoned.into_inner().len()),
    };
    let mut made = Vec::with_capacity(missing);
    for _ in 0..missing {
        match new_socket(AddressFamily::Inet) {
            Ok(fd) => made.push(fd),
            Err(e) => {
                tracing::warn!(error = %e, "netns socket factory: socket()");
                break;
            }
        }
    }
    let mut p = match pool.lock() {
        Ok(p) => p,
        Err(poisoned) => poisoned.into_inner(),
    };
    p.extend(made);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_dialer_lets_connects_reuse_time_wait_ports() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: creating a network namespace needs root");
            return;
        }
        let host_before = std::fs::read_to_string(TW_REUSE_SYSCTL).expect("host sysctl");
        let name = format!("ate-tw{}", std::process::id() % 1_000_000);
        create(&name).await.expect("netns");
        let dialer = NetnsDialer::new(&name).await.expect("dialer");
        let out = std::process::Command::new(IP)
            .args(["netns", "exec", &name, "cat", TW_REUSE_SYSCTL])
            .output()
            .expect("ip netns exec");
        let host = std::fs::read_to_string(TW_REUSE_SYSCTL).expect("host sysctl");
        drop(dialer);
        delete(&name).await.expect("delete netns");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
        // The host's own setting is left alone (a socket factory writes only its namespace's).
        assert_eq!(host, host_before, "host tcp_tw_reuse changed");
    }

    #[test]
    fn names_are_short_and_stable() {
        let a = netns_name("/var/lib/ate/workers/w1/actors/team/counter-1");
        assert_eq!(
            a,
            netns_name("/var/lib/ate/workers/w1/actors/team/counter-1")
        );
        assert_ne!(
            a,
            netns_name("/var/lib/ate/workers/w1/actors/team/counter-2")
        );
        assert_ne!(
            a,
            netns_name("/var/lib/ate/workers/w2/actors/team/counter-1")
        );
        assert_eq!(a.len(), 14);
        assert!(a.len() <= 15);
    }
}
