//! Stop of one actor, and the worker's own stop: drain (the node has the actors suspended),
//! shutdown, removal of leftover sandboxes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use futures::StreamExt as _;

use super::{Frozen, StopReply, StopRequest, VerbError, Worker, key_of};

/// Sandboxes stopped at once when the worker shuts down.
const SHUTDOWN_PARALLELISM: usize = 16;
/// A drain gives up when the node has not polled Activity for this long.
const NODE_SILENCE: Duration = Duration::from_secs(2);

impl Worker {
    pub async fn stop(&self, req: StopRequest) -> Result<StopReply, VerbError> {
        let (atespace, name) = (req.actor.atespace, req.actor.name);
        let key = key_of(&atespace, &name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;
        if let Some(at_most) = req.activation_at_most {
            let held = self.table().actors.get(&key).map(|e| e.activation);
            if let Some(held) = held
                && held > at_most
            {
                // A newer activation started here since the caller looked: not its business.
                return Ok(StopReply {
                    epoch: self.ident.epoch,
                });
            }
        }
        self.ingress_off(&key).await;
        self.table().adopted.remove(&key);
        let entry = self.table().actors.remove(&key);
        let frozen = self.table().frozen.remove(&key).map(|f| f.entry);
        let sandbox = entry
            .or(frozen)
            .map(|e| e.sandbox)
            .unwrap_or_else(|| self.sandbox_for(&atespace, &name, ""));
        self.discard(&sandbox).await?;
        self.table()
            .exits
            .retain(|x| !(x.atespace == atespace && x.name == name));
        Ok(StopReply {
            epoch: self.ident.epoch,
        })
    }

    /// Stops and removes every sandbox left under this worker's actors dir (no snapshot).
    pub async fn remove_leftovers(&self) {
        self.end_earlier_commands().await;
        for (atespace, name) in self.leftover_actors() {
            tracing::info!(actor = %key_of(&atespace, &name), "removing a leftover sandbox");
            let sandbox = self.sandbox_for(&atespace, &name, "");
            self.discard_quietly(&sandbox).await;
        }
    }

    /// Marks the worker as stopping: starts are refused, and Activity tells the node, which
    /// asks the api to suspend every actor here. Returns when none is left or `timeout` passed.
    pub async fn drain(&self, timeout: Duration) {
        self.shutting_down.store(true, Ordering::Release);
        if !self.tunnels.is_leased() {
            return; // No node drives this worker: nobody could suspend its actors.
        }
        let n = self.table().actors.len();
        if n == 0 {
            return;
        }
        tracing::info!(
            actors = n,
            timeout_s = timeout.as_secs(),
            "stopping: asking for every actor to be suspended"
        );
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.table().actors.is_empty() {
                tracing::info!("every actor suspended");
                return;
            }
            // The node polls Activity twice a second: silence means no node is there to ask
            // the api for the suspends, and waiting longer would change nothing.
            let silent_ms = now_ms().saturating_sub(self.last_poll_ms.load(Ordering::Acquire));
            if silent_ms > NODE_SILENCE.as_millis() as i64 || !self.tunnels.lease_valid() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let left: Vec<String> = self.table().actors.keys().cloned().collect();
        tracing::warn!(
            ?left,
            "actors not suspended within the stop timeout; their sandboxes keep running for the next worker process to re-adopt"
        );
    }

    /// Shutdown after [`Worker::drain`]: frozen copies (caches of sealed generations) are
    /// dropped. Running sandboxes of a worker under a node's lease are left running, never
    /// killed without a snapshot: the next process of this worker re-adopts them. A worker no
    /// node ever leased (driven directly, as in tests) stops them — unless it re-adopted
    /// sandboxes of an earlier process: that one is stopped before its node got to lease it (its
    /// supervisor killed again during the start), and what it adopted is actors' only state.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        let keep = self.tunnels.is_leased() || self.inherited.load(Ordering::Acquire);
        let keys: Vec<String> = if keep {
            for key in self.table().actors.keys() {
                self.tunnels.deactivate(key);
            }
            Vec::new()
        } else {
            self.table().actors.keys().cloned().collect()
        };
        // Several at a time: each stop is mostly waiting on runc and the kernel (~40 ms), and a
        // worker with hundreds of actors must be done well within its supervisor's grace period
        // (one by one, 256 actors took ~10 s and `ate up` killed the worker, leaking them).
        futures::stream::iter(keys)
            .for_each_concurrent(SHUTDOWN_PARALLELISM, |key| async move {
                let lock = self.lock_for(&key);
                let _guard = lock.lock().await;
                self.ingress_off(&key).await;
                let entry = self.table().actors.remove(&key);
                if let Some(e) = entry {
                    self.discard_quietly(&e.sandbox).await;
                }
            })
            .await;
        let frozen: Vec<Frozen> = self.table().frozen.drain().map(|(_, f)| f).collect();
        futures::stream::iter(frozen)
            .for_each_concurrent(SHUTDOWN_PARALLELISM, |f| async move {
                self.discard_quietly(&f.entry.sandbox).await;
            })
            .await;
    }
}
