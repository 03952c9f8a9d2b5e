//! The egress policy decision: fixed deny lists, the node's own addresses, allow entries.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_core::template::EgressPolicy;

use super::cidr::{Cidr, control_plane, in_cidr};

/// Bound on resolving a DNS name of an allow entry.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the cached node addresses are trusted for a deny (an allow re-reads them).
const NODE_ADDRS_TTL: Duration = Duration::from_secs(30);

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

/// The reason `ip` is on the fixed deny list, if it is.
pub fn always_denied(ip: Ipv4Addr) -> Option<&'static str> {
    ALWAYS_DENIED
        .iter()
        .find(|(net, bits, _)| in_cidr(ip, *net, *bits))
        .map(|(_, _, why)| *why)
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
    pub(super) allow_all: bool,
    /// `(host, port)` of each allow entry (host without brackets).
    pub(super) allow: Vec<(String, u16)>,
    /// `--deny-egress`: denied whatever the template says, allow entries included.
    pub(super) control_plane: Arc<[Cidr]>,
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
}
