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
//! The platform address (`169.254.17.1:80`, see `ate_core::platform`) is not dialed: its
//! connections are served by the worker itself ([`platform`]): calls to other actors, relayed to
//! the router (`--router`, [`RouterClient`]), and the local actor API ([`LocalApi`]). Every other
//! link-local destination stays denied.
//!
//! Teardown ([`Egress::stop`]) aborts the accept loop, drops the listener (a socket keeps its netns
//! alive) and resets every open connection of the actor: the worker calls it when ingress goes off
//! (before a checkpoint's dump: CRIU here cannot dump established TCP) and before the netns is
//! deleted. Counters per actor are logged at teardown.
//!
//! The worker process keeps one [`Egress`] for its actors and starts an actor's proxy behind its
//! sandbox's [`gate`]; the local actor API behind [`LocalApi`] is the worker's.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod cidr;
pub mod gate;
mod platform;
mod policy;
mod proxy;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ate_core::template::EgressPolicy;
use tokio::task::{JoinHandle, JoinSet};

pub use ate_router_client::{RouterAddr, RouterAddrError, RouterClient, RouterClientError};
pub use cidr::{Cidr, CidrError, control_plane};
pub use platform::{ActorIdentity, LocalApi, LocalRequest, LocalResponse};
pub use policy::{NodeAddrs, Policy, Verdict, always_denied, decide, entry_matches, explicit_only};
use proxy::{Stats, accept_loop, apply_rules, listen_in_netns};

/// Port of the egress listener on the actor netns' loopback (nothing else redirects to it).
pub const EGRESS_PORT: u16 = 15001;

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
    /// The router for calls between actors and the local actor API, shared by every actor.
    platform: platform::Shared,
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
            platform: platform::Shared {
                router: None,
                local: Arc::new(NoLocalApi),
            },
        }
    }

    /// Calls between actors go to this router (`--router`); without one they are answered 503.
    pub fn with_router(mut self, router: Option<RouterClient>) -> Self {
        self.platform.router = router;
        self
    }

    /// The local actor API served at the platform address.
    pub fn with_local_api(mut self, local: Arc<dyn LocalApi>) -> Self {
        self.platform.local = local;
        self
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

    /// Starts the egress proxy of `actor` (key `<atespace>/<name>`) whose sandbox runs in
    /// `netns` (which must exist): listener, nftables redirect, accept loop. An earlier proxy
    /// of the same actor is stopped.
    pub async fn start(
        &self,
        actor: ActorIdentity,
        netns: &str,
        policy: &EgressPolicy,
    ) -> std::io::Result<()> {
        self.start_with(actor, netns, policy, true).await
    }

    /// [`start`](Self::start) for a netns that already holds the redirect (a sandbox thawed in
    /// place keeps its netns and nftables rules; only the proxy was stopped).
    pub async fn restart(
        &self,
        actor: ActorIdentity,
        netns: &str,
        policy: &EgressPolicy,
    ) -> std::io::Result<()> {
        self.start_with(actor, netns, policy, false).await
    }

    async fn start_with(
        &self,
        actor: ActorIdentity,
        netns: &str,
        policy: &EgressPolicy,
        load_rules: bool,
    ) -> std::io::Result<()> {
        let key = actor.key();
        let key = key.as_str();
        self.stop(key).await;
        let listener = listen_in_netns(netns).await?;
        if load_rules {
            apply_rules(netns).await?;
        }
        let policy =
            Arc::new(Policy::from_spec(policy).with_control_plane(self.control_plane.clone()));
        let conns = Arc::new(Mutex::new(JoinSet::new()));
        let stats = Arc::new(Stats::default());
        let platform =
            platform::Ctx::new(actor, self.platform.clone(), stats.clone()).map(Arc::new);
        let accept = tokio::spawn(accept_loop(
            listener,
            key.to_string(),
            policy.clone(),
            self.node.clone(),
            conns.clone(),
            stats.clone(),
            platform,
        ));
        tracing::info!(
            target: "egress",
            actor = %key,
            %netns,
            allow_all = policy.allow_all,
            allow_entries = policy.allow.len(),
            deny_egress = policy.control_plane.len(),
            actor_calls = self.platform.router.is_some(),
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

/// The local API of an `Egress` nobody gave one: every path is unknown.
struct NoLocalApi;

#[async_trait::async_trait]
impl LocalApi for NoLocalApi {
    async fn serve(&self, _: &ActorIdentity, req: LocalRequest) -> LocalResponse {
        LocalResponse::text(
            http::StatusCode::NOT_FOUND,
            format!("no local actor API on this worker: {}\n", req.path),
        )
    }
}
