//! The frozen-in-place tier: a sandbox kept frozen after a memory checkpoint is thawed by a
//! resume of exactly that generation, and dropped by `trim_frozen` when over the policy.

use std::path::PathBuf;
use std::time::Instant;

use ate_core::TemplateSpec;

use super::{Entry, Frozen, VerbError, Worker, Workload, egress_identity, sandbox_error};
use ate_netns::NetnsDialer;

impl Worker {
    /// Thaws a sandbox kept frozen since its checkpoint: the dumped processes continue with
    /// their netns, mounts and files as they were, so nothing is extracted or verified. On
    /// failure the sandbox is discarded (the caller restores the generation instead).
    pub(super) async fn thaw(
        &self,
        key: &str,
        frozen: Frozen,
        spec: &TemplateSpec,
        workload: &Workload,
    ) -> Result<(), VerbError> {
        let sandbox = frozen.entry.sandbox.clone();
        let begun = Instant::now();
        let thawed = async {
            // The egress proxy first (the netns kept its nftables redirect; only the proxy was
            // stopped at checkpoint): the thawed processes' first connect finds it listening.
            let netns = sandbox.netns();
            self.egress
                .restart(
                    egress_identity(&sandbox, workload.activation),
                    &netns,
                    &spec.egress,
                )
                .await
                .map_err(|e| VerbError::Internal(format!("egress for {key}: {e}")))?;
            self.runtime
                .thaw(&sandbox)
                .await
                .map_err(|e| sandbox_error("thaw", e))?;
            let resumed = begun.elapsed();
            // Independent of each other, so at once: the wakeup probe and the socket factory
            // for ingress.
            let kept = frozen.dialer.clone();
            let (probe, dialer) = tokio::join!(
                self.wait_probe(&sandbox, spec),
                async {
                    match kept {
                        Some(d) => Ok(d),
                        None => NetnsDialer::new(&netns).await,
                    }
                },
            );
            probe?;
            let dialer = dialer.map_err(|e| {
                VerbError::Internal(format!("socket factory for netns {netns}: {e}"))
            })?;
            tracing::debug!(actor = %key, runc_resume_ms = resumed.as_millis() as u64, total_ms = begun.elapsed().as_millis() as u64, "thawed");
            Ok(dialer)
        }
        .await;
        let dialer = match thawed {
            Ok(d) => d,
            Err(e) => {
                self.discard_quietly(&sandbox).await;
                return Err(e);
            }
        };
        self.write_adoption(&sandbox, workload, frozen.entry.pid, None)
            .await;
        self.table().actors.insert(
            key.to_string(),
            Entry {
                sandbox,
                spec: spec.clone(),
                template: workload.template.clone(),
                pid: frozen.entry.pid,
                activation: workload.activation,
                // A frozen copy was dumped only once all its pages were in.
                page_source: None,
                // Re-armed while frozen (see `checkpoint`): what it writes from now on is
                // relative to the generation it was frozen with.
                tracker: frozen.entry.tracker.clone(),
                memory_parent: frozen
                    .entry
                    .tracker
                    .as_ref()
                    .map(|_| frozen.gen_dir.clone()),
            },
        );
        self.tunnels.activate(key, workload.activation, dialer);
        Ok(())
    }

    /// Drops frozen actors, oldest first, until at most the policy's `max` remain, none is older
    /// than the policy's TTL or has lost its generation directory (deleted or detached), and
    /// the host has the policy's share of memory available. Each drop takes that actor's lock;
    /// one busy with another operation is skipped.
    pub async fn trim_frozen(&self) {
        let policy = self.frozen_policy;
        let mut frozen: Vec<(String, Instant, PathBuf)> = self
            .table()
            .frozen
            .iter()
            .map(|(k, f)| (k.clone(), f.since, f.gen_dir.clone()))
            .collect();
        if frozen.is_empty() {
            return;
        }
        frozen.sort_by_key(|(_, since, _)| *since);
        let mut excess = frozen.len().saturating_sub(policy.max);
        let mut low_memory = memory_low(policy.min_available_percent);
        for (key, since, gen_dir) in frozen {
            let stale = since.elapsed() >= policy.ttl
                || !gen_dir.join(ate_snapshot::MANIFEST_FILE).exists();
            if excess == 0 && !low_memory && !stale {
                continue;
            }
            let lock = self.lock_for(&key);
            let Ok(_guard) = lock.try_lock() else {
                continue;
            };
            let Some(f) = self.table().frozen.remove(&key) else {
                continue;
            };
            let why = if excess > 0 {
                "over the frozen limit"
            } else if low_memory {
                "host memory low"
            } else {
                "expired or its generation is gone"
            };
            tracing::info!(actor = %key, frozen_s = f.since.elapsed().as_secs(), why, "dropping frozen actor (its generation remains)");
            self.discard_quietly(&f.entry.sandbox).await;
            excess = excess.saturating_sub(1);
            if low_memory {
                low_memory = memory_low(policy.min_available_percent);
            }
        }
    }
}

/// Whether the host's MemAvailable is below `min_percent` of its memory.
fn memory_low(min_percent: u8) -> bool {
    ate_worker_client::host_memory_available_percent().is_some_and(|p| p < min_percent)
}
