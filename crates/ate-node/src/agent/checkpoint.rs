//! Checkpoint: the worker's checkpoint into a new generation directory, the frozen-copy and
//! delta-parent bookkeeping, the durable upload (in the call, or queued in the background for an
//! ASYNC suspend) and the report of a background upload's outcome to the api.

use std::path::{Path, PathBuf};

use ate_core::{ActorRef, DurableStatus};
use ate_snapshot::UploadPriority;

use super::types::{CheckpointRequest, Checkpointed};
use super::{AgentError, NodeAgent};
use crate::types::Snapshot;
use crate::worker_client::Checkpoint;

impl NodeAgent {
    pub(super) async fn checkpoint_inner(
        &self,
        req: CheckpointRequest,
    ) -> Result<Checkpointed, AgentError> {
        let workload = req.workload;
        let actor = workload.actor.clone();
        let (atespace, name) = (actor.atespace.clone(), actor.name.clone());
        let worker = self.worker(&workload.worker_id)?;
        let dir = self.generation_dir(&atespace, &name, req.generation, &req.uuid);
        let template = workload.template.clone();
        let sandbox_class = worker.info.sandbox_class.clone();
        let reply = worker
            .client
            .checkpoint(Checkpoint {
                workload,
                generation_dir: dir.display().to_string(),
                fidelity: req.fidelity,
                generation: req.generation,
                uuid: req.uuid.clone(),
                node: self.inner.cfg.name.clone(),
                boot_id: self.inner.fleet.boot_id.clone(),
                grace_ms: req.grace_ms,
            })
            .await?;
        let kept_frozen = reply.kept_frozen;
        {
            let key = format!("{atespace}/{name}");
            let mut frozen_on = self.frozen_on();
            if kept_frozen {
                frozen_on.insert(key, worker.info.worker_id.clone());
            } else {
                frozen_on.remove(&key);
            }
        }
        let parents = self.remember_dir(&format!("{atespace}/{name}"), dir.clone());
        let mut snapshot = Snapshot {
            actor: Some(actor.clone()),
            generation: req.generation,
            uuid: req.uuid,
            fidelity: reply.fidelity,
            template,
            sandbox_class,
            node: self.inner.cfg.name.clone(),
            boot_id: self.inner.fleet.boot_id.clone(),
            local_path: dir.display().to_string(),
            durable_uri: String::new(),
            durable_status: Some(DurableStatus::Pending),
            size_bytes: reply.size_bytes,
            checksum: reply.checksum,
            reason: reply.reason,
            create_time_unix_ms: 0,
        };
        if req.durable {
            // On failure the local generation is kept and usable; only the durable copy failed.
            self.upload_now(&atespace, &name, &mut snapshot, &parents)
                .await;
        } else {
            let agent = self.clone();
            let snap = snapshot.clone();
            let queue = self.inner.background_uploads.clone();
            let mut queued = crate::metrics::BackgroundUpload::queued();
            tokio::spawn(async move {
                // Closed only if the agent is dropping; upload anyway then.
                let _permit = queue.acquire_owned().await.ok();
                queued.running();
                // Detached or deleted while queued: whoever did that owns its durable status.
                if !ate_snapshot::is_sealed(Path::new(&snap.local_path)) {
                    return;
                }
                let uploaded = agent
                    .upload(
                        &atespace,
                        &name,
                        &snap,
                        UploadPriority::Background,
                        &parents,
                    )
                    .await;
                let (status, uri, reason) = match uploaded {
                    Ok(uri) => (DurableStatus::Completed, uri, String::new()),
                    // Pruned (a newer generation replaced it) while it was being read: routine,
                    // and not "kept". Still reported, in case something else removed it.
                    Err(e) if !ate_snapshot::is_sealed(Path::new(&snap.local_path)) => {
                        tracing::debug!(actor = %format!("{atespace}/{name}"), generation = snap.generation, error = %e, "generation removed during its background upload");
                        (
                            DurableStatus::Failed,
                            String::new(),
                            format!(
                                "durable upload failed: the local copy was removed during the upload ({e})"
                            ),
                        )
                    }
                    Err(e) => {
                        tracing::warn!(actor = %format!("{atespace}/{name}"), generation = snap.generation, error = %e, "background upload failed; local copy kept");
                        (
                            DurableStatus::Failed,
                            String::new(),
                            format!("durable upload failed: {e}"),
                        )
                    }
                };
                agent
                    .report(&actor, snap.generation, status, uri, reason)
                    .await;
            });
        }
        Ok(Checkpointed {
            snapshot,
            epoch: reply.epoch,
            kept_frozen,
        })
    }

    /// Uploads the generation to the durable store now and records the outcome on it: its
    /// durable URI and `Completed`, or `Failed` and why. False when the upload failed.
    pub(super) async fn upload_now(
        &self,
        atespace: &str,
        name: &str,
        snap: &mut Snapshot,
        parents: &[PathBuf],
    ) -> bool {
        let uploaded = self
            .upload(atespace, name, snap, UploadPriority::Normal, parents)
            .await;
        match uploaded {
            Ok(uri) => {
                snap.durable_uri = uri;
                snap.durable_status = Some(DurableStatus::Completed);
                true
            }
            Err(e) => {
                snap.durable_status = Some(DurableStatus::Failed);
                snap.reason = format!("durable upload failed: {e}");
                false
            }
        }
    }

    /// Uploads the generation to the durable store. `Background` for an ASYNC suspend's copy:
    /// nobody waits for it, so its hashing and compression leave the cores to resumes.
    pub(super) async fn upload(
        &self,
        atespace: &str,
        name: &str,
        snap: &Snapshot,
        priority: UploadPriority,
        parents: &[PathBuf],
    ) -> Result<String, String> {
        let key = crate::sweep::durable_key(atespace, name, snap.generation, &snap.uuid);
        let begun = std::time::Instant::now();
        let uploaded = async {
            // An incremental generation is made whole first: a durable copy stands alone.
            ate_generation::ensure_flat(Path::new(&snap.local_path))
                .await
                .map_err(|e| format!("making the incremental generation whole: {e}"))?;
            let (local, parents, _opened) = open_for_upload(Path::new(&snap.local_path), parents)
                .await
                .map_err(|e| e.to_string())?;
            self.inner
                .durable
                .upload_with_parents(&local, &key, priority, &parents, &|dir: &Path| {
                    ate_generation::images::memory_layout(dir).ok()
                })
                .await
                .map(|(uri, _)| uri)
                .map_err(|e| e.to_string())
        }
        .await;
        crate::metrics::uploaded(priority, &uploaded, snap.size_bytes, begun);
        uploaded
    }

    async fn report(
        &self,
        actor: &ActorRef,
        generation: u64,
        status: DurableStatus,
        uri: String,
        reason: String,
    ) {
        if let Err(e) = self
            .inner
            .fleet
            .api
            .report_snapshot(actor, generation, status, uri, reason)
            .await
        {
            tracing::warn!(generation, error = %e.message, "snapshot report to the api failed");
        }
    }
}

/// What an upload reads: a sealed generation (and each sealed parent, which deltas are made
/// against) opened into scratch dirs on a tmpfs without their memory images, kept until the
/// upload ends; the memory images' chunks are opened from the sealed files as the upload reads
/// them (`ate_snapshot::MemoryFile`). Plaintext generations as they are. A parent that does not
/// open only costs deltas.
async fn open_for_upload(
    local: &Path,
    parents: &[PathBuf],
) -> Result<(PathBuf, Vec<PathBuf>, Vec<ate_snapshot::sealed::Scratch>), ate_snapshot::Error> {
    use ate_snapshot::sealed::{Opening, Scratch, is_encrypted, open_into};
    let mut opened = Vec::new();
    let dir = if is_encrypted(local) {
        let scratch = Scratch::new("upload")?;
        open_into(local, scratch.path(), Opening::Small).await?;
        let dir = scratch.path().to_path_buf();
        opened.push(scratch);
        dir
    } else {
        local.to_path_buf()
    };
    let mut plain_parents = Vec::new();
    for parent in parents {
        if !is_encrypted(parent) {
            plain_parents.push(parent.clone());
            continue;
        }
        let scratch = Scratch::new("upload-parent")?;
        match open_into(parent, scratch.path(), Opening::Small).await {
            Ok(_) => {
                plain_parents.push(scratch.path().to_path_buf());
                opened.push(scratch);
            }
            Err(e) => {
                tracing::debug!(parent = %parent.display(), error = %e, "not a parent for deltas")
            }
        }
    }
    Ok((dir, plain_parents, opened))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{test_agent, test_workload};
    use ate_core::Fidelity;

    #[tokio::test]
    async fn checkpoint_needs_a_running_worker() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let agent = test_agent(dir.path()).await;
        let req = CheckpointRequest {
            workload: test_workload(),
            generation: 1,
            uuid: "u-1".into(),
            fidelity: Fidelity::Memory,
            durable: false,
            grace_ms: 0,
        };
        let err = agent.checkpoint_inner(req).await.err();
        assert!(
            matches!(&err, Some(AgentError::WorkerNotRunning { worker, node }) if worker == "w-1" && node == "node-t"),
            "{err:?}"
        );
        // Nothing was remembered or written for a refused checkpoint.
        assert!(agent.inner.recent_dirs.lock().is_ok_and(|m| m.is_empty()));
        assert!(!dir.path().join("snapshots").join("ns").exists());
    }
}
