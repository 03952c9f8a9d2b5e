//! The rest of an actor's and its generations' life on this node: Detach (upload what has no
//! durable copy, then drop the local copies), Stop, ForgetActor (a deleted actor's log),
//! DeleteSnapshots (local directories, their quarantined copies, durable copies), and the stop
//! of a stale frozen-in-place copy when the actor starts or stops elsewhere.

use std::path::{Path, PathBuf};

use ate_core::{ActorRef, DurableStatus};

use super::logs::actor_log_path;
use super::types::{OnWorker, StopRequest};
use super::{AgentError, NodeAgent};
use crate::types::Snapshot;
use crate::worker_client::ActorActivity;

impl NodeAgent {
    /// Detach: uploads the actor's generations that have no durable copy yet, then drops the
    /// node-local copies of the durable ones; returns the generations as they are now.
    pub(super) async fn detach_inner(
        &self,
        actor: &ActorRef,
        snapshots: Vec<Snapshot>,
    ) -> Result<Vec<Snapshot>, AgentError> {
        let mut out = Vec::new();
        let parents = self
            .inner
            .recent_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&format!("{}/{}", actor.atespace, actor.name))
            .cloned()
            .unwrap_or_default();
        for mut snap in snapshots {
            if snap.durable_status != Some(DurableStatus::Completed)
                && !self
                    .upload_now(&actor.atespace, &actor.name, &mut snap, &parents)
                    .await
            {
                out.push(snap);
                continue;
            }
            if !snap.local_path.is_empty() && snap.node == self.inner.cfg.name {
                // A later generation may still build on this one.
                if let Err(e) = ate_generation::flatten_children(Path::new(&snap.local_path)).await
                {
                    tracing::warn!(generation = snap.generation, error = %e, "an incremental generation builds on this one and cannot be made whole; keeping it");
                    out.push(snap);
                    continue;
                }
                let _ = tokio::fs::remove_dir_all(&snap.local_path).await;
                remove_quarantined(Path::new(&snap.local_path)).await;
            }
            snap.local_path.clear();
            out.push(snap);
        }
        Ok(out)
    }

    pub(super) async fn stop_inner(&self, req: StopRequest) -> Result<OnWorker, AgentError> {
        let worker = self.worker(&req.worker_id)?;
        if let Some(actor) = &req.actor {
            self.forget_frozen(actor, &req.worker_id).await;
        }
        let epoch = worker.client.clone().stop(req.actor.as_ref(), 0).await?;
        Ok(Self::reply(&worker, epoch))
    }

    /// ActorActivity: the live actors of `worker_id` with what they are doing (exited ones and
    /// those asking to be suspended are left out: neither is a candidate to make room).
    pub(super) async fn actor_activity_inner(
        &self,
        worker_id: &str,
    ) -> Result<Vec<ActorActivity>, AgentError> {
        let worker = self.worker(worker_id)?;
        let activity = worker.client.clone().activity(true).await?;
        Ok(activity
            .actors
            .into_iter()
            .filter(|a| !a.exited && !a.suspend_requested && a.actor.is_some())
            .collect())
    }

    /// ForgetActor: removes the deleted actor's log and the external volume directories asked
    /// for (`purge_dirs`, each only under `--external-volume-roots`) unless a sandbox of that
    /// name still runs on this node; returns whether the log was removed and how many
    /// directories were.
    pub(super) async fn forget_actor_inner(
        &self,
        actor: &ActorRef,
        purge_dirs: &[String],
    ) -> Result<(bool, u32), AgentError> {
        let (atespace, name) = (actor.atespace.as_str(), actor.name.as_str());
        let state = &self.inner.cfg.state_dir;
        // A sandbox of that name still running here (a re-created actor, or a copy the api
        // gave up on) keeps writing the log: it stays.
        let workers = std::fs::read_dir(state.join("workers"))
            .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        if workers
            .iter()
            .any(|w| ate_worker_client::sandbox_alive(&w.join("actors"), atespace, name))
        {
            return Ok((false, 0));
        }
        let mut dirs_removed = 0;
        for dir in purge_dirs {
            if purge_volume_dir(&self.inner.cfg.external_volume_roots, Path::new(dir)).await? {
                dirs_removed += 1;
            }
        }
        let path = actor_log_path(state, atespace, name);
        let removed = match tokio::fs::remove_file(&path).await {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                return Err(AgentError::LocalFile {
                    verb: "remove",
                    path: path.display().to_string(),
                    source: e,
                });
            }
        };
        tracing::info!(actor = %actor, log_removed = removed, dirs_removed, "deleted actor forgotten");
        Ok((removed, dirs_removed))
    }

    /// DeleteSnapshots: this node's directories of the generations (under its own snapshot
    /// root), their quarantined copies, and their durable copies.
    pub(super) async fn delete_snapshots_inner(
        &self,
        snapshots: Vec<Snapshot>,
    ) -> Result<(), AgentError> {
        // Deleted together: none needs to be made whole for another.
        let going: Vec<PathBuf> = snapshots
            .iter()
            .filter(|s| !s.local_path.is_empty())
            .map(|s| PathBuf::from(&s.local_path))
            .collect();
        for snap in snapshots {
            let root = self.inner.cfg.snapshots_dir();
            // Only directories this node wrote, under its own snapshot root.
            let ours = !snap.local_path.is_empty()
                && snap.node == self.inner.cfg.name
                && Path::new(&snap.local_path).starts_with(&root);
            // A later generation that builds on this one is made whole first.
            if ours {
                ate_generation::flatten_children_except(Path::new(&snap.local_path), &going)
                    .await
                    .map_err(|e| AgentError::LocalFile {
                        verb: "delete",
                        path: snap.local_path.clone(),
                        source: std::io::Error::other(format!(
                            "a later incremental generation builds on it and cannot be made whole: {e}"
                        )),
                    })?;
            }
            if ours
                && let Err(e) = tokio::fs::remove_dir_all(&snap.local_path).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(AgentError::LocalFile {
                    verb: "delete",
                    path: snap.local_path,
                    source: e,
                });
            }
            if !snap.local_path.is_empty()
                && snap.node == self.inner.cfg.name
                && Path::new(&snap.local_path).starts_with(&root)
            {
                remove_quarantined(Path::new(&snap.local_path)).await;
            }
            if !snap.durable_uri.is_empty() {
                self.inner
                    .durable
                    .delete(&snap.durable_uri)
                    .await
                    .map_err(|e| AgentError::DeleteDurable {
                        uri: snap.durable_uri.clone(),
                        error: e.to_string(),
                    })?;
            }
        }
        tracing::debug!(store = %self.inner.durable_url, "snapshots deleted");
        Ok(())
    }

    /// The actor is starting on `worker_id`: a frozen copy of it on another worker of this node
    /// is stale now and is stopped first (it holds the actor's netns and cgroup names, which
    /// the new sandbox takes).
    pub(super) async fn forget_frozen(&self, actor: &ActorRef, worker_id: &str) {
        let key = actor.to_string();
        let Some(holder) = self.frozen_on().remove(&key) else {
            return;
        };
        if holder == worker_id {
            return;
        }
        let Some(worker) = self.inner.fleet.worker(&holder) else {
            return;
        };
        if let Err(e) = worker.client.clone().stop(Some(actor), 0).await {
            tracing::warn!(actor = %key, worker = %holder, error = %e.message, "stopping a stale frozen copy");
        }
    }
}

/// Removes a deleted actor's external volume directory when it lies under one of `roots`
/// (symlinks resolved); true if it existed and is gone. A directory outside the roots is
/// refused: the api computed it from a template, and the node removes only what its workers
/// could have made.
async fn purge_volume_dir(roots: &[PathBuf], dir: &Path) -> Result<bool, AgentError> {
    let refused = |why: String| AgentError::LocalFile {
        verb: "purge",
        path: dir.display().to_string(),
        source: std::io::Error::other(why),
    };
    let real = match tokio::fs::canonicalize(dir).await {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(refused(e.to_string())),
    };
    let mut under_root = false;
    for root in roots {
        if let Ok(root) = tokio::fs::canonicalize(root).await
            && real.starts_with(&root)
            && real != root
        {
            under_root = true;
        }
    }
    if !under_root {
        return Err(refused(format!(
            "not under this node's --external-volume-roots ({})",
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    match tokio::fs::remove_dir_all(&real).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// Removes what [`ate_snapshot::quarantine`] set aside of a generation directory (its files
/// are kept for inspection until the generation itself is deleted).
async fn remove_quarantined(gen_dir: &Path) {
    let Ok(aside) = ate_snapshot::quarantine_path(gen_dir) else {
        return;
    };
    if let Err(e) = tokio::fs::remove_dir_all(&aside).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %aside.display(), error = %e, "cannot delete a quarantined generation");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::test_agent;

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    fn mkdir(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        std::fs::write(dir.join("f"), b"x").unwrap_or_else(|e| panic!("write: {e}"));
    }

    fn aside(dir: &Path) -> std::path::PathBuf {
        ate_snapshot::quarantine_path(dir).unwrap_or_else(|e| panic!("quarantine_path: {e}"))
    }

    fn snap(node: &str, local: &Path, status: DurableStatus) -> Snapshot {
        Snapshot {
            generation: 1,
            node: node.into(),
            local_path: local.display().to_string(),
            durable_status: Some(status),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn remove_quarantined_removes_only_the_set_aside_copy() {
        let dir = tempdir();
        let gen_dir = dir.path().join("1-abc");
        mkdir(&gen_dir);
        mkdir(&aside(&gen_dir));
        remove_quarantined(&gen_dir).await;
        assert!(!aside(&gen_dir).exists());
        assert!(gen_dir.join("f").is_file());
        // Nothing set aside: nothing to do, and nothing else touched.
        remove_quarantined(&gen_dir).await;
        assert!(gen_dir.join("f").is_file());
    }

    #[tokio::test]
    async fn a_volume_dir_is_purged_only_under_the_roots() {
        let dir = tempdir();
        let root = dir.path().join("volumes");
        let roots = [root.clone()];
        let ours = root.join("work").join("ns").join("a");
        let outside = dir.path().join("elsewhere").join("ns").join("a");
        for d in [&ours, &outside] {
            mkdir(d);
        }
        assert!(matches!(purge_volume_dir(&roots, &ours).await, Ok(true)));
        assert!(!ours.exists());
        assert!(matches!(purge_volume_dir(&roots, &ours).await, Ok(false)));
        let refused = purge_volume_dir(&roots, &outside).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("--external-volume-roots")),
            "{refused:?}"
        );
        assert!(outside.join("f").is_file());
        // The root itself is never removed, and nothing is without roots.
        assert!(purge_volume_dir(&roots, &root).await.is_err());
        assert!(purge_volume_dir(&[], &root.join("work")).await.is_err());
        assert!(root.join("work").is_dir());
    }

    #[tokio::test]
    async fn delete_snapshots_deletes_only_this_nodes_dirs_under_its_root() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let root = dir.path().join("snapshots").join("ns").join("a");
        let ours = root.join("1-aaa");
        let other_node = root.join("2-bbb");
        let outside = dir.path().join("elsewhere").join("3-ccc");
        for d in [&ours, &other_node, &outside] {
            mkdir(d);
        }
        mkdir(&aside(&ours));
        let gone = root.join("4-ddd");
        let req = vec![
            snap("node-t", &ours, DurableStatus::Pending),
            snap("node-2", &other_node, DurableStatus::Pending),
            snap("node-t", &outside, DurableStatus::Pending),
            // Already gone: not an error.
            snap("node-t", &gone, DurableStatus::Pending),
        ];
        let reply = agent.delete_snapshots_inner(req).await;
        assert!(reply.is_ok(), "{reply:?}");
        assert!(!ours.exists());
        assert!(!aside(&ours).exists());
        assert!(other_node.join("f").is_file());
        assert!(outside.join("f").is_file());
    }

    #[tokio::test]
    async fn detach_drops_the_local_copies_of_durable_generations() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let root = dir.path().join("snapshots").join("ns").join("a");
        let ours = root.join("1-aaa");
        let other_node = root.join("2-bbb");
        mkdir(&ours);
        mkdir(&aside(&ours));
        mkdir(&other_node);
        let mut theirs = snap("node-2", &other_node, DurableStatus::Completed);
        theirs.generation = 2;
        let snapshots = vec![snap("node-t", &ours, DurableStatus::Completed), theirs];
        let reply = agent
            .detach_inner(&ActorRef::new("ns", "a"), snapshots)
            .await
            .unwrap_or_else(|e| panic!("detach: {e}"));
        assert_eq!(reply.len(), 2);
        for s in &reply {
            assert!(s.local_path.is_empty(), "{s:?}");
            assert_eq!(s.durable_status, Some(DurableStatus::Completed));
        }
        assert!(!ours.exists());
        assert!(!aside(&ours).exists());
        // Another node's directory is that node's to delete.
        assert!(other_node.join("f").is_file());
    }

    #[tokio::test]
    async fn forget_actor_removes_the_log_once() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let log = actor_log_path(dir.path(), "ns", "a");
        mkdir(log.parent().unwrap_or(dir.path()));
        std::fs::write(&log, b"out\n").unwrap_or_else(|e| panic!("write: {e}"));
        let actor = ActorRef::new("ns", "a");
        let first = agent
            .forget_actor_inner(&actor, &[])
            .await
            .ok()
            .map(|r| r.0);
        assert_eq!(first, Some(true));
        assert!(!log.exists());
        let second = agent
            .forget_actor_inner(&actor, &[])
            .await
            .ok()
            .map(|r| r.0);
        assert_eq!(second, Some(false));
    }

    #[tokio::test]
    async fn stop_on_an_unknown_worker_is_unavailable() {
        let dir = tempdir();
        let agent = test_agent(dir.path()).await;
        let err = agent
            .stop_inner(StopRequest {
                actor: None,
                worker_id: "w-9".into(),
            })
            .await
            .err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("worker w-9 is not running on node node-t")
        );
    }
}
