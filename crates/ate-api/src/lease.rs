//! The per-actor lease that serialises mutating workflows (`lease:actor:{atespace}:{name}`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ate_core::ActorRef;
use ate_store::Store;

use crate::error::WorkflowError;
use ate_core::clock::now_ms;

/// A held lease. It is renewed in the background until [`Lease::release`]; if the holder crashes
/// the renewal stops and the lease expires after its TTL, freeing the actor for the next workflow.
pub struct Lease {
    store: Arc<dyn Store>,
    key: String,
    holder: String,
    renewal: tokio::task::JoinHandle<()>,
    /// Set once the workflow's last write also deleted the lease row
    /// ([`ate_store::Store::transition_releasing_lease`]): [`Lease::release`] has nothing left to do.
    released_in_store: AtomicBool,
}

impl Lease {
    /// Takes the actor's lease, or [`WorkflowError::LeaseHeld`] naming the actor.
    pub async fn acquire(
        store: &Arc<dyn Store>,
        actor: &ActorRef,
        holder: String,
        ttl: Duration,
    ) -> Result<Lease, WorkflowError> {
        let key = actor.lease_key();
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let taken = store
            .try_acquire_lease(&key, &holder, now_ms(), ttl_ms)
            .await?;
        if !taken {
            return Err(WorkflowError::LeaseHeld(actor.clone()));
        }
        let renewal = {
            let store = store.clone();
            let key = key.clone();
            let holder = holder.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    if !matches!(
                        store
                            .try_acquire_lease(&key, &holder, now_ms(), ttl_ms)
                            .await,
                        Ok(true)
                    ) {
                        tracing::warn!(lease = %key, "lease renewal failed");
                        return;
                    }
                }
            })
        };
        Ok(Lease {
            store: store.clone(),
            key,
            holder,
            renewal,
            released_in_store: AtomicBool::new(false),
        })
    }

    /// The lease's row key (`lease:actor:{atespace}:{name}`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Who holds it (this api instance and workflow).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Stops renewing, before a store write that releases the lease along with its own change
    /// (a renewal landing after that write would take the lease again).
    pub fn stop_renewal(&self) {
        self.renewal.abort();
    }

    /// Records that a store write released the lease (after [`Lease::stop_renewal`]):
    /// [`Lease::release`] has nothing to delete.
    pub fn released_in_store(&self) {
        self.released_in_store.store(true, Ordering::Release);
    }

    pub async fn release(self) {
        self.renewal.abort();
        if self.released_in_store.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.store.release_lease(&self.key, &self.holder).await {
            // Not fatal: the lease expires on its own.
            tracing::warn!(lease = %self.key, error = %e, "lease release failed");
        }
    }

    /// Simulates a crash of the holder: renewal stops, the row stays until it expires.
    pub fn abandon(self) {
        self.renewal.abort();
    }
}

impl Drop for Lease {
    /// A lease dropped without [`Lease::release`] (its workflow's future was dropped) behaves as
    /// an abandoned one: the renewal stops and the lease expires after its TTL, instead of being
    /// renewed forever by a task nobody owns.
    fn drop(&mut self) {
        self.renewal.abort();
    }
}
