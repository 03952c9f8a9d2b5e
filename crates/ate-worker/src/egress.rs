//! Actor egress: every outbound TCP connection of an actor goes through the worker, which applies
//! the template's egress policy and, for allowed destinations, dials them from its own namespace.
//!
//! Per actor start (cold boot and every restore), once the sandbox's netns exists:
//! - a listener on `127.0.0.1:`[`EGRESS_PORT`] **inside the actor's netns** (socket made on a thread
//!   that did `setns`, then handed to tokio);
//! - nftables in that netns: a `nat` `output` chain that leaves loopback alone (`oifname "lo"`,
//!   `127.0.0.0/8`: the actor's own addresses, atunnel's dials and the probes) and redirects all
//!   other TCP to the listener. IPv4 only: the actor netns has no IPv6 address or route, so IPv6
//!   connects fail with "network unreachable" before reaching any rule;
//! - an accept loop: for each connection the original destination (`SO_ORIGINAL_DST`) is checked
//!   against the policy, one line is logged at info with target `egress`, denied connections are
//!   reset at once, allowed ones are dialed from the worker's namespace and spliced.
//!
//! Policy ([`decide`]): a CIDR deny list that always applies (link-local, loopback, `0.0.0.0/8`,
//! multicast, broadcast, every address of the node, and the worker's `--deny-egress` networks:
//! the control plane's addresses, which not even an explicit allow entry opens); then the private
//! and cluster ranges (10/8, 172.16/12, 192.168/16, 100.64/10, 198.18/15 — where a deployment's
//! api, store, object store and other nodes live) only through an explicit `allow` entry,
//! whatever the default; then `allow-all` → allow, `deny-all` → allow only destinations matching
//! an `allow` entry (`host:port`; a host that is not an IPv4 literal is resolved in the worker's
//! namespace at check time).
//!
//! Teardown ([`Egress::stop`]) aborts the accept loop, drops the listener (a socket keeps its netns
//! alive) and resets every open connection of the actor: the worker calls it when ingress goes off
//! (before a checkpoint's dump: CRIU here cannot dump established TCP) and before the netns is
//! deleted. Counters per actor are logged at teardown.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::template::EgressPolicy;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{getsockopt, sockopt};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::netns::netns_path;

/// Port of the egress listener on the actor netns' loopback (nothing else redirects to it).
pub const EGRESS_PORT: u16 = 15001;
/// Bound on the worker's dial of an allowed destination.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on resolving a DNS name of an allow entry.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the cached node addresses are trusted for a deny (an allow re-reads them).
const NODE_ADDRS_TTL: Duration = Duration::from_secs(30);
/// Name of the nftables table the worker owns in each actor netns.
const NFT_TABLE: &str = "ate_egress";

/// Destinations no policy can allow.
const ALWAYS_DENIED: [(Ipv4Addr, u8, &str); 5] = [
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "this-network (0.0.0.0/8)"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
];

/// Destinations only an explicit allow entry opens, even under `allow-all`: on a cluster network
/// these hold the control plane, its store and object store, and the other nodes.
const EXPLICIT_ONLY: [(Ipv4Addr, u8, &str); 5] = [
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10.0.0.0/8)"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16.0.0/12)"),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        "private (192.168.0.0/16)",
    ),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "shared address space (100.64.0.0/10)",
    ),
    (
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        "benchmarking (198.18.0.0/15)",
    ),
];

/// The reason `ip` needs an explicit allow entry, if it does.
pub fn explicit_only(ip: Ipv4Addr) -> Option<&'static str> {
    EXPLICIT_ONLY
        .iter()
        .find(|(net, bits, _)| in_cidr(ip, *net, *bits))
        .map(|(_, _, why)| *why)
}

fn in_cidr(ip: Ipv4Addr, net: Ipv4Addr, bits: u8) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(bits))
    };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// The reason `ip` is on the fixed deny list, if it is.
pub fn always_denied(ip: Ipv4Addr) -> Option<&'static str> {
    ALWAYS_DENIED
        .iter()
        .find(|(net, bits, _)| in_cidr(ip, *net, *bits))
        .map(|(_, _, why)| *why)
}

/// One `--deny-egress` entry: an IP address or an `IP/prefix` network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

/// Why a `--deny-egress` entry did not parse (the message names the entry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("empty entry (a stray comma?)")]
    Empty,
    #[error("{0:?} is not an IP address or IP/prefix-length")]
    Syntax(String),
    #[error("{entry:?}: prefix length {bits} is longer than {max}")]
    PrefixTooLong { entry: String, bits: u8, max: u8 },
    #[error("{entry:?} has bits set past the prefix length (the network is {network})")]
    HostBits { entry: String, network: Cidr },
}

impl Cidr {
    /// Whether `ip` is inside this network (an IPv4-mapped IPv6 address counts as its IPv4 one;
    /// otherwise the families never match).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => in_cidr(ip, net, self.bits),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let entry = text.trim();
        if entry.is_empty() {
            return Err(CidrError::Empty);
        }
        let syntax = || CidrError::Syntax(entry.to_string());
        let (ip, bits) = match entry.split_once('/') {
            Some((ip, bits)) => (
                ip.parse::<IpAddr>().map_err(|_| syntax())?,
                Some(bits.parse::<u8>().map_err(|_| syntax())?),
            ),
            None => (entry.parse::<IpAddr>().map_err(|_| syntax())?, None),
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(CidrError::PrefixTooLong {
                entry: entry.to_string(),
                bits,
                max,
            });
        }
        // An IPv4-mapped network (`::ffff:a.b.c.d/104`) is the IPv4 one: destinations are
        // compared in canonical form.
        let (net, bits) = match ip {
            IpAddr::V6(v6) if bits >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), bits - 96),
                None => (ip, bits),
            },
            _ => (ip, bits),
        };
        let masked = Cidr {
            net: mask_ip(net, bits),
            bits,
        };
        // A set host bit usually means a typo in the prefix: refuse rather than guess.
        if masked.net != net {
            return Err(CidrError::HostBits {
                entry: entry.to_string(),
                network: masked,
            });
        }
        Ok(masked)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

fn mask_ip(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// The first `--deny-egress` entry holding `ip`, if any.
pub fn control_plane(denied: &[Cidr], ip: IpAddr) -> Option<&Cidr> {
    denied.iter().find(|c| c.contains(ip))
}

/// The node's own addresses (every interface of the worker's namespace), cached.
#[derive(Debug)]
pub struct NodeAddrs {
    /// When the set was last read (`None`: never successfully).
    cached: Mutex<(Option<Instant>, Arc<HashSet<IpAddr>>)>,
    /// A set given by a test, never re-read.
    fixed: bool,
}

impl NodeAddrs {
    /// Reads the addresses now (an error leaves the set empty and logs; the next check re-reads).
    pub fn new() -> Self {
        let read = match read_node_addrs() {
            Ok(s) => (Some(Instant::now()), s),
            Err(e) => {
                tracing::warn!(target: "egress", error = %e, "reading the node's addresses");
                (None, HashSet::new())
            }
        };
        NodeAddrs {
            cached: Mutex::new((read.0, Arc::new(read.1))),
            fixed: false,
        }
    }

    /// A fixed set (tests).
    pub fn fixed(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        NodeAddrs {
            cached: Mutex::new((Some(Instant::now()), Arc::new(addrs.into_iter().collect()))),
            fixed: true,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<Instant>, Arc<HashSet<IpAddr>>)> {
        match self.cached.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The cached set, re-read when older than [`NODE_ADDRS_TTL`].
    pub fn cached(&self) -> Arc<HashSet<IpAddr>> {
        let (at, set) = self.lock().clone();
        let current = at.is_some_and(|t| t.elapsed() < NODE_ADDRS_TTL);
        if self.fixed || current {
            return set;
        }
        self.refresh().unwrap_or(set)
    }

    /// Re-reads the set now (a fixed set stays as it is).
    pub fn fresh(&self) -> Arc<HashSet<IpAddr>> {
        let set = self.lock().1.clone();
        if self.fixed {
            return set;
        }
        self.refresh().unwrap_or(set)
    }

    fn refresh(&self) -> Option<Arc<HashSet<IpAddr>>> {
        match read_node_addrs() {
            Ok(s) => {
                let s = Arc::new(s);
                *self.lock() = (Some(Instant::now()), s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::warn!(target: "egress", error = %e, "reading the node's addresses");
                None
            }
        }
    }
}

impl Default for NodeAddrs {
    fn default() -> Self {
        Self::new()
    }
}

fn read_node_addrs() -> nix::Result<HashSet<IpAddr>> {
    let mut set = HashSet::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let Some(addr) = ifa.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            set.insert(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            set.insert(IpAddr::V6(v6.ip()));
        }
    }
    Ok(set)
}

/// A template's egress policy, parsed once per actor start, with the worker's control-plane
/// deny list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    allow_all: bool,
    /// `(host, port)` of each allow entry (host without brackets).
    allow: Vec<(String, u16)>,
    /// `--deny-egress`: denied whatever the template says, allow entries included.
    control_plane: Arc<[Cidr]>,
}

impl Policy {
    /// From the validated template policy (an entry that does not parse is ignored, with a log).
    pub fn from_spec(p: &EgressPolicy) -> Self {
        let allow = p
            .allow
            .iter()
            .filter_map(|e| {
                let parsed = e.rsplit_once(':').and_then(|(h, port)| {
                    let h = h.trim_start_matches('[').trim_end_matches(']');
                    Some((h.to_ascii_lowercase(), port.parse::<u16>().ok()?))
                });
                if parsed.is_none() {
                    tracing::warn!(target: "egress", entry = %e, "ignoring an allow entry that is not host:port");
                }
                parsed
            })
            .collect();
        Policy {
            allow_all: p.default_action != "deny-all",
            allow,
            control_plane: Arc::from([]),
        }
    }

    /// Adds the worker's `--deny-egress` networks.
    pub fn with_control_plane(mut self, denied: Arc<[Cidr]>) -> Self {
        self.control_plane = denied;
        self
    }
}

/// What [`decide`] says about one connection, with the reason that goes into the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed(String),
    Denied(String),
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed(_))
    }
}

/// Whether allow entry `(host, port)` names `dst` (a DNS name is resolved now, in the worker's
/// namespace; a failed or slow lookup does not match).
pub async fn entry_matches(host: &str, port: u16, dst: SocketAddrV4) -> bool {
    if port != dst.port() {
        return false;
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return ip == *dst.ip();
    }
    if host.parse::<IpAddr>().is_ok() {
        // An IPv6 literal never matches an IPv4 destination.
        return false;
    }
    match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await {
        Ok(Ok(addrs)) => addrs.into_iter().any(|a| a.ip() == IpAddr::V4(*dst.ip())),
        Ok(Err(e)) => {
            tracing::debug!(target: "egress", %host, error = %e, "resolving an allow entry");
            false
        }
        Err(_) => {
            tracing::debug!(target: "egress", %host, "resolving an allow entry timed out");
            false
        }
    }
}

/// The policy decision for one destination.
pub async fn decide(policy: &Policy, node: &NodeAddrs, dst: SocketAddrV4) -> Verdict {
    let ip = *dst.ip();
    if let Some(why) = always_denied(ip) {
        return Verdict::Denied(format!("{why} addresses are always denied"));
    }
    // Checked on the destination IP, before any allow entry: an explicit entry (even a DNS
    // name resolving here) cannot open the control plane.
    if let Some(cidr) = control_plane(&policy.control_plane, IpAddr::V4(ip)) {
        return Verdict::Denied(format!(
            "control-plane address (--deny-egress {cidr}) is always denied"
        ));
    }
    if node.cached().contains(&IpAddr::V4(ip)) {
        return Verdict::Denied("node address".into());
    }
    let explicit = explicit_only(ip);
    let allowed = if policy.allow_all && explicit.is_none() {
        "allow-all".to_string()
    } else {
        let mut matched = None;
        for (host, port) in &policy.allow {
            if entry_matches(host, *port, dst).await {
                let default = if policy.allow_all {
                    "allow-all"
                } else {
                    "deny-all"
                };
                matched = Some(format!("{default}, allow entry {host}:{port}"));
                break;
            }
        }
        match (matched, explicit) {
            (Some(m), _) => m,
            (None, Some(why)) if policy.allow_all => {
                return Verdict::Denied(format!("{why} addresses need an explicit allow entry"));
            }
            (None, _) => return Verdict::Denied("deny-all and no allow entry matches".into()),
        }
    };
    // An address added to the node since the last read must not slip through.
    if node.fresh().contains(&IpAddr::V4(ip)) {
        return Verdict::Denied("node address".into());
    }
    Verdict::Allowed(allowed)
}

/// Per-actor counters, logged when the actor's egress stops.
#[derive(Debug, Default)]
struct Stats {
    allowed: AtomicU64,
    denied: AtomicU64,
    dial_failed: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    /// Outbound connections being handled now (idle suspend waits for them).
    open: AtomicU64,
    /// Last outbound connection opened or closed, Unix ms (0: none yet).
    last_activity_ms: AtomicI64,
}

impl Stats {
    fn touch(&self) {
        self.last_activity_ms
            .store(ate_core::clock::now_ms(), Ordering::Release);
    }
}

/// Counts one outbound connection as open for as long as it lives (any exit path).
struct OpenGuard(Arc<Stats>);

impl OpenGuard {
    fn new(stats: Arc<Stats>) -> Self {
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

/// Outbound activity of one actor: what idle suspend counts besides inbound tunnels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EgressActivity {
    pub open_connections: u64,
    /// Unix ms of the last connection opened or closed (0: none).
    pub last_activity_unix_ms: i64,
}

struct Running {
    accept: JoinHandle<()>,
    conns: Arc<Mutex<JoinSet<()>>>,
    stats: Arc<Stats>,
}

fn lock_set(m: &Mutex<JoinSet<()>>) -> std::sync::MutexGuard<'_, JoinSet<()>> {
    match m.lock() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The worker's egress proxies, one per active actor.
pub struct Egress {
    node: Arc<NodeAddrs>,
    /// `--deny-egress`, applied to every actor's policy.
    control_plane: Arc<[Cidr]>,
    running: Mutex<HashMap<String, Running>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").finish_non_exhaustive()
    }
}

impl Default for Egress {
    fn default() -> Self {
        Self::new()
    }
}

impl Egress {
    /// Reads the node's addresses (see [`NodeAddrs`]).
    pub fn new() -> Self {
        Egress {
            node: Arc::new(NodeAddrs::new()),
            control_plane: Arc::from([]),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Denies every actor the `denied` networks (`--deny-egress`), whatever its policy says.
    pub fn with_control_plane(mut self, denied: impl Into<Arc<[Cidr]>>) -> Self {
        self.control_plane = denied.into();
        self
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        match self.running.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Starts the egress proxy of actor `key` whose sandbox runs in `netns` (which must exist):
    /// listener, nftables redirect, accept loop. An earlier proxy of the same actor is stopped.
    pub async fn start(
        &self,
        key: &str,
        netns: &str,
        policy: &EgressPolicy,
    ) -> std::io::Result<()> {
        self.start_with(key, netns, policy, true).await
    }

    /// [`start`](Self::start) for a netns that already holds the redirect (a sandbox thawed in
    /// place keeps its netns and nftables rules; only the proxy was stopped).
    pub async fn restart(
        &self,
        key: &str,
        netns: &str,
        policy: &EgressPolicy,
    ) -> std::io::Result<()> {
        self.start_with(key, netns, policy, false).await
    }

    async fn start_with(
        &self,
        key: &str,
        netns: &str,
        policy: &EgressPolicy,
        load_rules: bool,
    ) -> std::io::Result<()> {
        self.stop(key).await;
        let listener = listen_in_netns(netns).await?;
        if load_rules {
            apply_rules(netns).await?;
        }
        let policy =
            Arc::new(Policy::from_spec(policy).with_control_plane(self.control_plane.clone()));
        let conns = Arc::new(Mutex::new(JoinSet::new()));
        let stats = Arc::new(Stats::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            key.to_string(),
            policy.clone(),
            self.node.clone(),
            conns.clone(),
            stats.clone(),
        ));
        tracing::info!(
            target: "egress",
            actor = %key,
            %netns,
            allow_all = policy.allow_all,
            allow_entries = policy.allow.len(),
            deny_egress = policy.control_plane.len(),
            "egress proxy on"
        );
        self.running().insert(
            key.to_string(),
            Running {
                accept,
                conns,
                stats,
            },
        );
        Ok(())
    }

    /// Stops the proxy of `key`: no more accepts, the listener closed, every open connection reset.
    /// Returns once all of them are gone. Nothing running is not an error.
    pub async fn stop(&self, key: &str) {
        let Some(r) = self.running().remove(key) else {
            return;
        };
        r.accept.abort();
        // The accept task owns the listener: once it is joined, the socket is closed.
        let _ = r.accept.await;
        let mut set = std::mem::take(&mut *lock_set(&r.conns));
        set.abort_all();
        while set.join_next().await.is_some() {}
        let s = &r.stats;
        tracing::info!(
            target: "egress",
            actor = %key,
            allowed = s.allowed.load(Ordering::Relaxed),
            denied = s.denied.load(Ordering::Relaxed),
            dial_failed = s.dial_failed.load(Ordering::Relaxed),
            bytes_out = s.bytes_out.load(Ordering::Relaxed),
            bytes_in = s.bytes_in.load(Ordering::Relaxed),
            "egress proxy off"
        );
    }

    /// Outbound connections of `key` (zero when no proxy runs).
    pub fn activity(&self, key: &str) -> EgressActivity {
        self.running()
            .get(key)
            .map(|r| EgressActivity {
                open_connections: r.stats.open.load(Ordering::Acquire),
                last_activity_unix_ms: r.stats.last_activity_ms.load(Ordering::Acquire),
            })
            .unwrap_or_default()
    }

    /// Whether `key` has a proxy running.
    pub fn is_running(&self, key: &str) -> bool {
        self.running().contains_key(key)
    }
}

/// Creates the listener inside `netns`: a short-lived std thread enters the namespace and binds;
/// the socket keeps that namespace, so tokio serves it from any thread.
async fn listen_in_netns(netns: &str) -> std::io::Result<TcpListener> {
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
async fn apply_rules(netns: &str) -> std::io::Result<()> {
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

async fn accept_loop(
    listener: TcpListener,
    key: String,
    policy: Arc<Policy>,
    node: Arc<NodeAddrs>,
    conns: Arc<Mutex<JoinSet<()>>>,
    stats: Arc<Stats>,
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
) {
    // An outbound connection is activity (an agent waiting on a model API is not idle), from
    // the accept until the splice ends, whatever the verdict.
    let _open = OpenGuard::new(stats.clone());
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

    fn policy(action: &str, allow: &[&str]) -> Policy {
        Policy::from_spec(&EgressPolicy {
            default_action: action.into(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn v4(s: &str) -> SocketAddrV4 {
        s.parse().expect("addr")
    }

    #[test]
    fn fixed_deny_list() {
        for ip in [
            "169.254.169.254",
            "169.254.17.2",
            "127.0.0.1",
            "127.5.6.7",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
        ] {
            assert!(always_denied(ip.parse().expect("ip")).is_some(), "{ip}");
        }
        for ip in ["10.0.0.1", "8.8.8.8", "169.253.255.255", "223.255.255.255"] {
            assert!(always_denied(ip.parse().expect("ip")).is_none(), "{ip}");
        }
    }

    #[tokio::test]
    async fn allow_all_allows_all_but_the_deny_list_and_node_addresses() {
        let node = NodeAddrs::fixed(["10.1.2.3".parse().expect("ip")]);
        let p = policy("allow-all", &[]);
        assert!(decide(&p, &node, v4("203.0.113.9:443")).await.is_allowed());
        // Private and cluster ranges only through an explicit entry, even under allow-all.
        for d in [
            "10.9.9.9:443",
            "172.20.0.1:5432",
            "192.168.1.1:80",
            "100.64.0.1:7443",
        ] {
            assert_eq!(
                decide(&p, &node, v4(d)).await,
                Verdict::Denied(format!(
                    "{} addresses need an explicit allow entry",
                    explicit_only(*v4(d).ip()).expect("listed")
                )),
                "{d}"
            );
        }
        let listed = policy("allow-all", &["10.9.9.9:443"]);
        assert!(
            decide(&listed, &node, v4("10.9.9.9:443"))
                .await
                .is_allowed()
        );
        assert!(
            !decide(&listed, &node, v4("10.9.9.9:444"))
                .await
                .is_allowed()
        );
        for d in [
            "10.1.2.3:80",
            "169.254.169.254:80",
            "127.0.0.1:8443",
            "224.0.0.5:1",
        ] {
            assert!(!decide(&p, &node, v4(d)).await.is_allowed(), "{d}");
        }
        assert_eq!(
            decide(&p, &node, v4("10.1.2.3:80")).await,
            Verdict::Denied("node address".into())
        );
    }

    #[tokio::test]
    async fn deny_all_allows_only_listed_host_ports() {
        let node = NodeAddrs::fixed(["10.1.2.3".parse().expect("ip")]);
        let p = policy(
            "deny-all",
            &["10.9.9.9:443", "10.1.2.3:80", "169.254.169.254:80"],
        );
        assert!(decide(&p, &node, v4("10.9.9.9:443")).await.is_allowed());
        assert!(!decide(&p, &node, v4("10.9.9.9:444")).await.is_allowed());
        assert!(!decide(&p, &node, v4("10.9.9.8:443")).await.is_allowed());
        // Listed, but on the fixed deny list or the node's own: still denied.
        assert!(!decide(&p, &node, v4("10.1.2.3:80")).await.is_allowed());
        assert!(
            !decide(&p, &node, v4("169.254.169.254:80"))
                .await
                .is_allowed()
        );
        let none = policy("deny-all", &[]);
        assert!(!decide(&none, &node, v4("10.9.9.9:443")).await.is_allowed());
    }

    #[tokio::test]
    async fn names_are_resolved_and_ports_must_match() {
        // `localhost` resolves through /etc/hosts without a network.
        assert!(entry_matches("localhost", 80, v4("127.0.0.1:80")).await);
        assert!(!entry_matches("localhost", 81, v4("127.0.0.1:80")).await);
        assert!(!entry_matches("no-such-host.invalid", 80, v4("10.0.0.1:80")).await);
        assert!(entry_matches("10.0.0.1", 80, v4("10.0.0.1:80")).await);
    }

    fn cidrs(list: &[&str]) -> Arc<[Cidr]> {
        list.iter()
            .map(|c| c.parse::<Cidr>().expect("cidr"))
            .collect()
    }

    #[test]
    fn cidr_parses_ips_and_networks() {
        let c = |s: &str| s.parse::<Cidr>();
        assert_eq!(c("10.1.2.3").expect("ip").to_string(), "10.1.2.3/32");
        assert_eq!(c(" 10.1.0.0/16 ").expect("net").to_string(), "10.1.0.0/16");
        assert_eq!(c("0.0.0.0/0").expect("all").to_string(), "0.0.0.0/0");
        assert_eq!(c("2001:db8::1").expect("v6").to_string(), "2001:db8::1/128");
        assert_eq!(
            c("2001:db8::/32").expect("v6 net").to_string(),
            "2001:db8::/32"
        );
        // IPv4-mapped is the IPv4 network.
        assert_eq!(
            c("::ffff:10.1.0.0/112").expect("mapped").to_string(),
            "10.1.0.0/16"
        );
        assert_eq!(c(""), Err(CidrError::Empty));
        for bad in [
            "10.1.2",
            "10.1.2.3/",
            "10.1.2.3/x",
            "db.internal",
            "10.0.0.300/8",
        ] {
            assert!(
                matches!(c(bad), Err(CidrError::Syntax(ref e)) if e == bad),
                "{bad}"
            );
        }
        assert!(matches!(
            c("10.0.0.0/33"),
            Err(CidrError::PrefixTooLong { .. })
        ));
        assert!(matches!(c("::/129"), Err(CidrError::PrefixTooLong { .. })));
        let err = c("10.1.2.3/16").expect_err("host bits");
        assert_eq!(
            err.to_string(),
            "\"10.1.2.3/16\" has bits set past the prefix length (the network is 10.1.0.0/16)"
        );
    }

    #[test]
    fn cidr_contains() {
        let net: Cidr = "10.1.0.0/16".parse().expect("net");
        assert!(net.contains("10.1.255.255".parse().expect("ip")));
        assert!(!net.contains("10.2.0.0".parse().expect("ip")));
        assert!(net.contains("::ffff:10.1.2.3".parse().expect("mapped")));
        assert!(!net.contains("2001:db8::1".parse().expect("ip")));
        let v6: Cidr = "2001:db8::/32".parse().expect("v6");
        assert!(v6.contains("2001:db8:ffff::1".parse().expect("ip")));
        assert!(!v6.contains("2001:db9::1".parse().expect("ip")));
        assert!(!v6.contains("10.1.2.3".parse().expect("ip")));
        let all: Cidr = "0.0.0.0/0".parse().expect("all");
        assert!(all.contains("203.0.113.9".parse().expect("ip")));
    }

    #[tokio::test]
    async fn control_plane_is_denied_under_allow_all() {
        let node = NodeAddrs::fixed([]);
        let cp = cidrs(&["203.0.113.10", "10.20.0.0/16", "2001:db8::/32"]);
        let p = policy("allow-all", &[]).with_control_plane(cp.clone());
        assert_eq!(
            decide(&p, &node, v4("203.0.113.10:5432")).await,
            Verdict::Denied(
                "control-plane address (--deny-egress 203.0.113.10/32) is always denied".into()
            )
        );
        assert_eq!(
            decide(&p, &node, v4("10.20.3.4:7443")).await,
            Verdict::Denied(
                "control-plane address (--deny-egress 10.20.0.0/16) is always denied".into()
            )
        );
        // Outside the list: what the policy says without it.
        assert_eq!(
            decide(&p, &node, v4("203.0.113.11:5432")).await,
            Verdict::Allowed("allow-all".into())
        );
        let without = policy("allow-all", &[]);
        assert_eq!(
            decide(&p, &node, v4("10.21.0.1:443")).await,
            decide(&without, &node, v4("10.21.0.1:443")).await
        );
    }

    #[tokio::test]
    async fn control_plane_is_denied_even_with_an_allow_entry() {
        let node = NodeAddrs::fixed([]);
        let cp = cidrs(&["203.0.113.10/32", "10.20.0.0/16"]);
        let allow = [
            "203.0.113.10:5432",
            "10.20.3.4:7443",
            "203.0.113.11:5432",
            "10.21.0.1:443",
        ];
        for action in ["deny-all", "allow-all"] {
            let p = policy(action, &allow).with_control_plane(cp.clone());
            for d in ["203.0.113.10:5432", "10.20.3.4:7443"] {
                let v = decide(&p, &node, v4(d)).await;
                assert!(
                    matches!(&v, Verdict::Denied(r) if r.starts_with("control-plane address")),
                    "{action} {d}: {v:?}"
                );
            }
            // Entries outside the list still open their destinations.
            for d in ["203.0.113.11:5432", "10.21.0.1:443"] {
                assert!(decide(&p, &node, v4(d)).await.is_allowed(), "{action} {d}");
            }
        }
    }

    #[test]
    fn node_addresses_include_loopback() {
        let node = NodeAddrs::new();
        assert!(node.cached().contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn ruleset_redirects_tcp_but_not_loopback() {
        let r = ruleset();
        assert!(r.contains("oifname \"lo\" return"));
        assert!(r.contains("ip daddr 127.0.0.0/8 return"));
        assert!(r.contains(&format!("redirect to :{EGRESS_PORT}")));
    }
}
