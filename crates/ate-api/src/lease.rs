//! The per-actor lease that serialises mutating workflows (`lease:actor:{atespace}:{name}`).

use std::sync::Arc;
use std::time::Duration;

use ate_core::ActorRef;
use ate_store::Store;
use tonic::Status;

use crate::error;
use crate::now_ms;

/// A held lease. It is renewed in the background until [`Lease::release`]; if the holder crashes
/// the renewal stops and the lease expires after its TTL, freeing the actor for the next workflow.
pub struct Lease {
    store: Arc<dyn Store>,
    key: String,
    holder: String,
    renewal: tokio::task::JoinHandle<()>,
}

impl Lease {
    /// Takes the actor's lease or answers Aborted naming the actor.
    pub async fn acquire(
        store: &Arc<dyn Store>,
        actor: &ActorRef,
        holder: String,
        ttl: Duration,
    ) -> Result<Lease, Status> {
        let key = actor.lease_key();
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let taken = store
            .try_acquire_lease(&key, &holder, now_ms(), ttl_ms)
            .await
            .map_err(error::store)?;
        if !taken {
            return Err(Status::aborted(format!(
                "another operation holds actor {actor}"
            )));
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
        })
    }

    pub async fn release(self) {
        self.renewal.abort();
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
