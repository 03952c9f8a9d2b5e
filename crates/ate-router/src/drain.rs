//! What the graceful drain waits for besides client connections: relayed long-lived streams
//! (client CONNECT tunnels, WebSocket upgrades over HTTP/1.1, WebSocket streams over HTTP/2).
//!
//! Once hyper hands a connection's bytes to an upgrade, the connection no longer counts for
//! hyper's graceful shutdown, so each relay holds a [`Relay`] guard for its whole life. The drain
//! ([`Drain::begin`]) lets open relays run until the last one ends or the drain deadline passes;
//! then [`Drain::cut`] closes whatever is left (and the listener closes every client connection).

use std::sync::Arc;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// Where the router is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// Shutdown began: no new connections; relays and requests still run.
    Draining,
    /// The drain deadline passed: everything still open is closed.
    Cut,
}

/// Open relays and the router's phase, shared by the proxy and the listener.
#[derive(Debug)]
pub struct Drain {
    open: watch::Sender<usize>,
    phase: watch::Sender<Phase>,
}

impl Drain {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            open: watch::Sender::new(0),
            phase: watch::Sender::new(Phase::Serving),
        })
    }

    /// Registers one relay; the drain waits for it until the guard is dropped.
    pub fn relay(self: &Arc<Self>) -> Relay {
        self.open.send_modify(|n| *n += 1);
        Relay {
            drain: self.clone(),
            phase: self.phase.subscribe(),
        }
    }

    /// Relays open now.
    pub fn open(&self) -> usize {
        *self.open.borrow()
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// A receiver of the phase (connections watch it for the cut).
    pub fn watch(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Shutdown began: client CONNECT tunnels are asked to close after their current request.
    pub fn begin(&self) {
        self.phase.send_if_modified(|p| {
            let changed = *p == Phase::Serving;
            if changed {
                *p = Phase::Draining;
            }
            changed
        });
    }

    /// The drain deadline passed: every relay still open closes now.
    pub fn cut(&self) {
        self.phase.send_replace(Phase::Cut);
    }

    /// Returns once no relay is open.
    pub async fn idle(&self) {
        let mut open = self.open.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = open.wait_for(|n| *n == 0).await;
    }
}

/// One open relay. Dropping it tells the drain the relay is gone.
#[derive(Debug)]
pub struct Relay {
    drain: Arc<Drain>,
    phase: watch::Receiver<Phase>,
}

impl Relay {
    /// Resolves once the drain began (at once if it already has).
    pub async fn draining(&mut self) {
        let _ = self.phase.wait_for(|p| *p != Phase::Serving).await;
    }

    /// Resolves once the drain deadline passed (at once if it already has).
    pub async fn cut(&mut self) {
        let _ = self.phase.wait_for(|p| *p == Phase::Cut).await;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.drain.open.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Spawns the byte relay between an upgraded client stream and an upgraded actor stream (either
/// may be HTTP/1.1 or an HTTP/2 stream); it ends when both sides are done, or at the drain
/// deadline, when both streams are closed.
pub fn spawn_pipe(mut relay: Relay, client: OnUpgrade, actor: OnUpgrade, what: &'static str) {
    tokio::spawn(async move {
        let work = async move {
            match tokio::join!(client, actor) {
                (Ok(client), Ok(actor)) => {
                    let mut client = TokioIo::new(client);
                    let mut actor = TokioIo::new(actor);
                    match tokio::io::copy_bidirectional(&mut client, &mut actor).await {
                        Ok((up, down)) => tracing::debug!(what, up, down, "relay ended"),
                        Err(e) => tracing::debug!(what, error = %e, "relay ended"),
                    }
                }
                (c, a) => {
                    tracing::debug!(what, client = ?c.err(), actor = ?a.err(), "upgrade failed")
                }
            }
        };
        tokio::select! {
            () = work => {}
            () = relay.cut() => tracing::info!(what, "drain deadline passed: relay closed"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_waits_for_every_relay() {
        let drain = Drain::new();
        drain.idle().await;
        let a = drain.relay();
        let b = drain.relay();
        assert_eq!(drain.open(), 2);
        let waiter = {
            let drain = drain.clone();
            tokio::spawn(async move { drain.idle().await })
        };
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one relay is still open");
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(drain.open(), 0);
    }

    #[tokio::test]
    async fn phases_reach_every_relay_even_late_ones() {
        let drain = Drain::new();
        let mut early = drain.relay();
        drain.begin();
        tokio::time::timeout(Duration::from_secs(1), early.draining())
            .await
            .unwrap();
        assert_eq!(drain.phase(), Phase::Draining);
        drain.cut();
        drain.begin(); // no way back from the cut
        assert_eq!(drain.phase(), Phase::Cut);
        let mut late = drain.relay();
        tokio::time::timeout(Duration::from_secs(1), late.cut())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), early.cut())
            .await
            .unwrap();
    }
}
