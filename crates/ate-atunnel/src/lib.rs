//! atunnel: the router's only way to an actor (docs/tunnel-protocol.md, server side), served by
//! the worker process, which activates and deactivates the actors in its [`Tunnels`].
//!
//! h2c with prior knowledge; every tunnel is one HTTP/2 `CONNECT` stream naming the actor in
//! `ate-target-actor` and the port in `ate-target-port`. A stream for an actor that is active here
//! becomes a byte pipe to `169.254.17.2:<port>`, dialed from a socket made inside the actor's
//! network namespace by its [`NetnsDialer`]; a probe (`ate-probe: 1`) only answers whether the
//! actor is served here. A port nothing listens on is a 502 marked `x-ate-port-closed: true`. atunnel also counts open tunnels and the last
//! activity per actor (idle auto-suspend), and closes an actor's tunnels when ingress goes off
//! (so a memory dump sees no established connection).
//!
//! Egress does not pass through here: an actor's outbound TCP is redirected by nftables in its
//! netns to the worker's egress proxy (`ate-egress`), started per actor with ingress.
//!
//! `server.rs` is the listener and the CONNECT handling; `headers.rs` parses the tunnel
//! protocol's headers; [`pipe`] is one tunnel's byte pipe; this file holds the actors served here
//! and the checks every tunnel passes, CONNECT or the worker's same-machine handoff
//! (`ate_worker::handoff`: [`admit`], [`dial`]).

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod headers;
pub mod pipe;
mod server;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ate_netns::{ACTOR_IP, NetnsDialer};
use tokio::sync::watch;

use crate::pipe::{Command, TunnelState};

pub use headers::{parse_activation, parse_hibernate, parse_probe, parse_target};
pub use server::dial_failure;
pub use server::serve;

/// A tunnel whose last bytes were the actor's answer and that was quiet this long has no
/// request in flight (a drain closes it).
const DRAIN_QUIET: Duration = Duration::from_millis(100);
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// The tunnel protocol's headers (defined in [`ate_core::tunnel`]). A probe (`ate-probe: 1`)
/// only answers whether this copy of the actor serves (200, or the usual 421) and dials nothing:
/// the router asks after a tunnel broke mid-request, to tell a tunnel cut by a suspend (ingress
/// off: 421) from the actor closing its connection (still 200).
pub use ate_core::tunnel::{
    ACTIVATION as HEADER_ACTIVATION, PORT_CLOSED as HEADER_PORT_CLOSED, PROBE as HEADER_PROBE,
    STALE as HEADER_STALE, TARGET_ACTOR as HEADER_ACTOR, TARGET_PORT as HEADER_PORT,
    WEBSOCKET_HIBERNATE as HEADER_HIBERNATE,
};
/// A SYN into an actor netns is answered at once (RST or SYN-ACK); this only bounds a stuck one.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Per-direction pipe buffer: small, since most tunnels carry a few KiB and many stay open idle.
const COPY_BUF: usize = 16 * 1024;
/// Time a client gets to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One actor's ingress while it is active on this worker.
#[derive(Debug)]
pub struct Activation {
    key: String,
    /// The fencing token of the activation this copy belongs to.
    token: u64,
    dialer: NetnsDialer,
    open: AtomicU32,
    /// Open tunnels that do not keep the actor from idle suspend ([`Counted::BytesOnly`]); a
    /// suspend still waits for them to close (no established connection in a memory dump).
    uncounted: AtomicU32,
    last_activity_ms: AtomicI64,
    closed: watch::Sender<bool>,
    /// Set once ingress is off: a tunnel dialed concurrently with `deactivate` is refused.
    off: AtomicBool,
    /// The open tunnels, for a graceful drain.
    pipes: std::sync::Mutex<Vec<std::sync::Weak<TunnelState>>>,
}

impl Activation {
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn token(&self) -> u64 {
        self.token
    }

    /// The socket factory of this activation (a sandbox thawed in place reuses it).
    pub fn dialer(&self) -> &NetnsDialer {
        &self.dialer
    }

    /// Turns true when ingress goes off for good (every tunnel is cut).
    pub fn subscribe_closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    pub fn open_tunnels(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    pub fn last_activity_unix_ms(&self) -> i64 {
        self.last_activity_ms.load(Ordering::Acquire)
    }

    pub(crate) fn touch(&self) {
        self.last_activity_ms
            .store(now_unix_ms(), Ordering::Release);
    }

    pub fn register(&self, state: &Arc<TunnelState>) {
        let mut pipes = match self.pipes.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        pipes.retain(|w| w.strong_count() > 0);
        pipes.push(Arc::downgrade(state));
    }

    fn live_pipes(&self) -> Vec<Arc<TunnelState>> {
        let pipes = match self.pipes.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        pipes.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// A graceful ingress off, before the suspend cuts what is left: new tunnels are refused
    /// (421: the router parks the request, and it resumes the actor after the suspend), idle
    /// tunnels (pooled keep-alive connections) close at once, WebSockets get a close frame
    /// (1001 "actor suspending") at a frame boundary, and tunnels with a request in flight get
    /// up to `grace` to finish. Returns how many tunnels were still open at the end.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.off.store(true, Ordering::Release);
        let deadline = Instant::now() + grace;
        loop {
            let live = self.live_pipes();
            if live.is_empty() {
                return 0;
            }
            for p in &live {
                if p.is_websocket() {
                    p.command(Command::GoingAway);
                } else if p.is_idle(DRAIN_QUIET) {
                    p.command(Command::Close);
                }
            }
            if Instant::now() >= deadline {
                return live.len();
            }
            drop(live);
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Waits until every tunnel of this activation has closed, up to `timeout`; true if they did.
    pub async fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.open_tunnels() > 0 || self.uncounted.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

/// Decrements the open count (for a counted tunnel) and records activity when a tunnel ends,
/// whichever way it ends.
pub struct OpenGuard {
    activation: Arc<Activation>,
    counted: bool,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let count = if self.counted {
            &self.activation.open
        } else {
            &self.activation.uncounted
        };
        count.fetch_sub(1, Ordering::AcqRel);
        self.activation.touch();
    }
}

/// Whether an open tunnel keeps its actor from idle suspend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Every tunnel, except:
    Open,
    /// The upstream leg of a hibernating WebSocket: only its bytes count, as activity (the
    /// router keeps the client's socket open while the actor sleeps).
    BytesOnly,
}

/// The actors whose ingress is on, keyed `<atespace>/<name>`, and the worker's liveness lease.
#[derive(Debug)]
pub struct Tunnels {
    actors: RwLock<HashMap<String, Arc<Activation>>>,
    /// Milliseconds after `base` until which the lease admits traffic; `UNLEASED` until the
    /// first renewal (a worker driven without a node, as in tests, is never fenced).
    lease_until_ms: AtomicI64,
    base: Instant,
    /// Copies refused because a CONNECT carried a newer token: `(key, their token)`, for the
    /// worker to discard.
    superseded: std::sync::Mutex<Vec<(String, u64)>>,
}

const UNLEASED: i64 = i64::MIN;

impl Default for Tunnels {
    fn default() -> Self {
        Self {
            actors: RwLock::default(),
            lease_until_ms: AtomicI64::new(UNLEASED),
            base: Instant::now(),
            superseded: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Tunnels {
    pub fn new() -> Self {
        Self::default()
    }

    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.base.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// The node renewed the worker's lease with the api: traffic is admitted for `valid_for`.
    pub fn renew_lease(&self, valid_for: Duration) {
        let until = self
            .elapsed_ms()
            .saturating_add(i64::try_from(valid_for.as_millis()).unwrap_or(i64::MAX));
        self.lease_until_ms.store(until, Ordering::Release);
    }

    /// Whether the worker was ever leased (a node renews it).
    pub fn is_leased(&self) -> bool {
        self.lease_until_ms.load(Ordering::Acquire) != UNLEASED
    }

    /// False once the lease ran out: the api may release this worker's actors soon, so none of
    /// them may be served (the worker fences itself) until the node renews again.
    pub fn lease_valid(&self) -> bool {
        let until = self.lease_until_ms.load(Ordering::Acquire);
        until == UNLEASED || self.elapsed_ms() < until
    }

    /// Copies found superseded by a newer activation since the last call.
    pub fn take_superseded(&self) -> Vec<(String, u64)> {
        match self.superseded.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// A CONNECT named a newer activation than the copy here: ingress off at once, and the copy
    /// is queued for the worker to discard.
    fn supersede(&self, a: &Activation) {
        let removed = {
            let mut actors = self.write();
            match actors.get(&a.key) {
                Some(current) if current.token == a.token => actors.remove(&a.key),
                _ => None,
            }
        };
        if let Some(old) = removed {
            shut(&old);
            match self.superseded.lock() {
                Ok(mut v) => v.push((old.key.clone(), old.token)),
                Err(poisoned) => poisoned.into_inner().push((old.key.clone(), old.token)),
            }
        }
    }

    /// Ingress on: tunnels to `key` (activation `token`) are dialed through `dialer` from now on.
    pub fn activate(&self, key: &str, token: u64, dialer: NetnsDialer) -> Arc<Activation> {
        let (closed, _) = watch::channel(false);
        let a = Arc::new(Activation {
            key: key.to_string(),
            token,
            dialer,
            open: AtomicU32::new(0),
            uncounted: AtomicU32::new(0),
            last_activity_ms: AtomicI64::new(now_unix_ms()),
            closed,
            off: AtomicBool::new(false),
            pipes: std::sync::Mutex::new(Vec::new()),
        });
        let old = self.write().insert(key.to_string(), a.clone());
        if let Some(old) = old {
            shut(&old);
        }
        a
    }

    /// Ingress off (new CONNECTs get 421) and every open tunnel of `key` is closed. Returns the
    /// activation so the caller can wait for the tunnels to be gone.
    pub fn deactivate(&self, key: &str) -> Option<Arc<Activation>> {
        let a = self.write().remove(key)?;
        shut(&a);
        Some(a)
    }

    pub fn get(&self, key: &str) -> Option<Arc<Activation>> {
        self.read().get(key).cloned()
    }

    pub fn keys(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Activation>>> {
        match self.actors.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Activation>>> {
        match self.actors.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

fn shut(a: &Activation) {
    a.off.store(true, Ordering::Release);
    a.closed.send_replace(true);
}

/// Why an admitted tunnel was not opened.
pub enum Refusal {
    /// Ingress went off (a drain for a suspend): the CONNECT's 421.
    Stale,
    /// The dial into the actor's netns failed.
    Dial(std::io::Error),
}

/// The checks every tunnel request passes, CONNECT or handoff: the worker's lease, the actor
/// active here, and the fencing token (a newer one than the copy's supersedes this copy). The
/// error is the 421's body.
pub fn admit(tunnels: &Tunnels, key: &str, token: Option<u64>) -> Result<Arc<Activation>, String> {
    if !tunnels.lease_valid() {
        return Err(format!(
            "actor {key}: this worker lost contact with the control plane and serves no actor until it is back\n"
        ));
    }
    let Some(activation) = tunnels.get(key) else {
        return Err(format!("actor {key} is not active on this worker\n"));
    };
    // Fencing: only the copy holding exactly the router's token serves. A newer token means
    // the actor was activated elsewhere (or again here) since: this copy must go.
    if let Some(token) = token
        && token != activation.token
    {
        if token > activation.token {
            tracing::warn!(actor = %key, held = activation.token, asked = token, "a newer activation exists; this copy stops serving and is discarded");
            tunnels.supersede(&activation);
        }
        return Err(format!(
            "actor {key}: activation {token} is not the one held here ({})\n",
            activation.token
        ));
    }
    Ok(activation)
}

/// Dials the admitted actor's `port` and counts the tunnel as open (and as activity) for as
/// long as the returned guard lives; a [`Counted::BytesOnly`] tunnel is not counted as open.
pub async fn dial(
    activation: &Arc<Activation>,
    port: u16,
    counted: Counted,
) -> Result<(tokio::net::TcpStream, OpenGuard), Refusal> {
    if activation.off.load(Ordering::Acquire) {
        // Draining for a suspend: the router parks the request and resumes the actor after.
        return Err(Refusal::Stale);
    }
    let addr = SocketAddr::new(ACTOR_IP.into(), port);
    let upstream = activation
        .dialer
        .connect_timeout(addr, DIAL_TIMEOUT)
        .await
        .map_err(Refusal::Dial)?;
    let counted = counted == Counted::Open;
    let count = if counted {
        &activation.open
    } else {
        &activation.uncounted
    };
    count.fetch_add(1, Ordering::AcqRel);
    let guard = OpenGuard {
        activation: activation.clone(),
        counted,
    };
    // Re-check after counting: `deactivate` sets `off` before waiting for the count to drop,
    // so either it sees this tunnel or this tunnel sees ingress off.
    if activation.off.load(Ordering::Acquire) {
        return Err(Refusal::Stale);
    }
    activation.touch();
    Ok((upstream, guard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_fences_only_once_given() {
        let t = Tunnels::new();
        assert!(t.lease_valid() && !t.is_leased());
        t.renew_lease(Duration::from_secs(60));
        assert!(t.lease_valid() && t.is_leased());
        t.renew_lease(Duration::ZERO);
        assert!(!t.lease_valid());
    }
}
