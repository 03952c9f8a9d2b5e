//! NodeService on top of the node's workers and its snapshot store.
//!
//! This file holds [`NodeAgent`] (its state, construction, `serve`) and what the verbs share
//! (the worker lookup, the generation directories and delta parents, the frozen-copy map);
//! `service` is the `NodeService` impl and the gRPC server, a thin adapter over the verbs (with
//! `convert`, the only code here that sees wire messages), each family in a file of its own:
//! `start` (Run, Restore and the downloads they need), `checkpoint` (Checkpoint, durable
//! uploads and their reports), `lifecycle` (Detach, Stop, ForgetActor, DeleteSnapshots, stale
//! frozen copies) and `logs` (ReadLog). The verbs take and return the node's own types
//! (`types`) and fail with an [`AgentError`].

mod checkpoint;
mod convert;
mod error;
mod exec;
mod lifecycle;
mod logs;
mod service;
mod start;
pub mod types;

pub use error::AgentError;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ate_snapshot::DurableStore;
use tokio::sync::Mutex as AsyncMutex;

use crate::api_client::ApiClient;
use crate::fleet::{Fleet, WorkerHandle};
use crate::{NodeConfig, NodeError};
use types::OnWorker;

#[derive(Clone)]
pub struct NodeAgent {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: NodeConfig,
    fleet: Arc<Fleet>,
    durable: DurableStore,
    durable_url: String,
    /// The node's identity (`--tls-*`); None: plaintext.
    tls: Option<ate_tls::CertSource>,
    /// One download at a time per generation uuid (tag snapshots are shared by many actors).
    downloads: std::sync::Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// Background (ASYNC suspend) uploads run at most this many at a time: hashing and
    /// compressing a burst of generations at once would take the cores that resumes need.
    background_uploads: Arc<tokio::sync::Semaphore>,
    /// Actor (`atespace/name`) → the worker that keeps it frozen in place after its last
    /// checkpoint. When the actor starts on another worker, that copy is stopped.
    frozen_on: std::sync::Mutex<HashMap<String, String>>,
    /// Actor (`atespace/name`) → the generation directories it last ran from or was
    /// checkpointed into on this node, newest last: the parents its next upload sends deltas
    /// against (`DurableStore::upload_with_parents`). Lost on restart: the first upload after
    /// one sends whole chunks.
    recent_dirs: std::sync::Mutex<HashMap<String, Vec<PathBuf>>>,
    /// With snapshot keys: where lazy restores' downloads (`<uuid>.lazy`: the small files and
    /// the chunks CRIU reads itself, plaintext) are cached, a scratch dir on a tmpfs instead of
    /// `STATE_DIR/snapshot-cache` (removed with this agent, or by the next one's sweep).
    lazy_cache: Option<ate_snapshot::sealed::Scratch>,
}

/// Generation directories remembered per actor as delta parents.
const RECENT_DIRS: usize = 2;
/// Actors whose directories are remembered at most (a bound on the map's memory).
const MAX_ACTORS_REMEMBERED: usize = 100_000;

/// Concurrent background uploads per node.
const BACKGROUND_UPLOADS: usize = 2;

impl NodeAgent {
    pub async fn new(cfg: NodeConfig, bound: SocketAddr) -> Result<Self, NodeError> {
        let durable_url = cfg.durable_url();
        // With `--durable-gc-age 0` this node does not sweep, but other nodes of the store may
        // (with the default age), so its uploads keep the default's time limit.
        let gc_age = match cfg.durable_gc_age() {
            age if age.is_zero() => ate_snapshot::DEFAULT_PARTIAL_GRACE,
            age => age,
        };
        let mut durable = DurableStore::from_url(&durable_url)
            .map_err(|e| NodeError::Durable(e.to_string()))?
            .with_partial_grace(gc_age);
        let keys = match cfg.snapshot_keys_dir() {
            Some(dir) => {
                let keys = ate_snapshot::SnapshotKeys::load(&dir)
                    .map_err(|e| NodeError::Durable(format!("snapshot keys: {e}")))?
                    .with_legacy_plaintext(cfg.snapshot_legacy_plaintext);
                tracing::info!(keys = %dir.display(), data_key = keys.data_key_id(), "durable snapshots encrypted");
                durable = durable.with_keys(keys.clone());
                Some(keys)
            }
            None => {
                tracing::warn!(
                    "no snapshot keys (--snapshot-keys): durable snapshots are stored unencrypted"
                );
                None
            }
        };
        // Node-local generations sealed by the workers are opened with the same keys (an upload
        // reads them through `--snapshot-scratch`).
        ate_snapshot::sealed::configure(keys, cfg.snapshot_scratch.clone());
        ate_snapshot::sealed::sweep_scratch();
        let lazy_cache = match ate_snapshot::sealed::keys() {
            Some(_) => Some(
                ate_snapshot::sealed::Scratch::new("lazycache")
                    .map_err(|e| NodeError::Durable(format!("snapshot scratch dir: {e}")))?,
            ),
            None => None,
        };
        let tls = cfg.tls.load("node")?;
        let client_tls = match &tls {
            Some(src) => {
                let api = ate_tls::SpiffeId::api(cfg.tls.trust_domain())?;
                Some(Arc::new(ate_tls::client_config(
                    src,
                    ate_tls::ServerCheck::Pin(api),
                )?))
            }
            None => None,
        };
        // `--api` may list several replicas: the node fails over between them.
        let api = ApiClient::connect_lazy(&cfg.api, client_tls)
            .map_err(|e| NodeError::Config(format!("bad --api {:?}: {e}", cfg.api)))?;
        let advertise = cfg.advertise.clone().unwrap_or_else(|| bound.to_string());
        let fleet = Arc::new(
            Fleet::new(
                cfg.name.clone(),
                advertise,
                crate::boot_id(),
                cfg.workers_dir(),
                cfg.snapshots_dir(),
                api,
            )
            .with_memory_low_percent(cfg.memory_low_percent),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                fleet,
                durable,
                durable_url,
                tls,
                downloads: Default::default(),
                lazy_cache,
                background_uploads: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_UPLOADS)),
                frozen_on: std::sync::Mutex::new(HashMap::new()),
                recent_dirs: std::sync::Mutex::new(HashMap::new()),
            }),
        })
    }

    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let loops = tokio::spawn(self.inner.fleet.clone().run_loops(stop_rx.clone()));
        let sweeper = if self.inner.cfg.durable_gc_age().is_zero() {
            tracing::info!(
                "durable store: no sweep of partial uploads on this node (--durable-gc-age 0)"
            );
            None
        } else {
            Some(tokio::spawn(crate::sweep::run(
                self.inner.durable.clone(),
                self.inner.cfg.name.clone(),
                self.inner.cfg.durable_sweep_every.map_or(
                    crate::sweep::Schedule::DEFAULT,
                    crate::sweep::Schedule::every,
                ),
                stop_rx.clone(),
            )))
        };
        let ttl = self.inner.cfg.snapshot_cache_ttl();
        let evictor = (!ttl.is_zero()).then(|| {
            let inner = self.inner.clone();
            let lock_of: crate::cache::LockOf = Arc::new(move |name: &str| {
                inner
                    .downloads
                    .lock()
                    .ok()
                    .map(|mut m| m.entry(name.to_string()).or_default().clone())
            });
            let mut dirs = vec![self.inner.cfg.cache_dir()];
            dirs.extend(
                self.inner
                    .lazy_cache
                    .as_ref()
                    .map(|s| s.path().to_path_buf()),
            );
            tokio::spawn(crate::cache::run(dirs, ttl, lock_of, stop_rx.clone()))
        });
        let mut stop = stop_rx;
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let stopped = async move {
            let _ = stop.changed().await;
        };
        // Only the api may call NodeService.
        let server_tls = match &self.inner.tls {
            Some(src) => {
                let api = ate_tls::SpiffeId::api(self.inner.cfg.tls.trust_domain())?;
                let mut server = ate_tls::server_config(
                    src,
                    ate_tls::ClientAuth::Required {
                        allowed: ate_tls::AllowList::only([api]),
                    },
                )?;
                ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2]);
                Some(Arc::new(server))
            }
            None => None,
        };
        let result = service::serve_grpc(self, listener, server_tls, stopped).await;
        loops.abort();
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
        if let Some(evictor) = evictor {
            evictor.abort();
        }
        result
    }

    fn worker(&self, id: &str) -> Result<WorkerHandle, AgentError> {
        self.inner
            .fleet
            .worker(id)
            .ok_or_else(|| AgentError::WorkerNotRunning {
                worker: id.to_string(),
                node: self.inner.cfg.name.clone(),
            })
    }

    /// Records `dir` as the actor's newest generation directory on this node and returns the
    /// ones before it (newest first): the delta parents of an upload of `dir`.
    fn remember_dir(&self, actor: &str, dir: PathBuf) -> Vec<PathBuf> {
        let mut recent = self
            .inner
            .recent_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if recent.len() >= MAX_ACTORS_REMEMBERED && !recent.contains_key(actor) {
            // A hint, not state: forgetting only costs whole chunks on some uploads.
            recent.clear();
        }
        let dirs = recent.entry(actor.to_string()).or_default();
        let parents: Vec<PathBuf> = dirs.iter().rev().filter(|d| **d != dir).cloned().collect();
        dirs.retain(|d| *d != dir);
        dirs.push(dir);
        if dirs.len() > RECENT_DIRS {
            dirs.remove(0);
        }
        parents
    }

    /// Where this node keeps an actor's generation.
    fn generation_dir(&self, atespace: &str, name: &str, generation: u64, uuid: &str) -> PathBuf {
        let short: String = uuid
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
        self.inner
            .cfg
            .snapshots_dir()
            .join(atespace)
            .join(name)
            .join(format!("{generation}-{short}"))
    }

    /// Keeps `ate_node_frozen_copies` current at every scrape while this agent lives.
    pub fn export_gauges(&self) {
        let inner = Arc::downgrade(&self.inner);
        ate_telemetry::on_scrape(move || {
            let Some(inner) = inner.upgrade() else {
                return false;
            };
            let n = match inner.frozen_on.lock() {
                Ok(m) => m.len(),
                Err(poisoned) => poisoned.into_inner().len(),
            };
            crate::metrics::frozen_copies(n);
            true
        });
    }

    fn frozen_on(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        match self.inner.frozen_on.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn reply(worker: &WorkerHandle, epoch: u64) -> OnWorker {
        OnWorker {
            worker_id: worker.info.worker_id.clone(),
            epoch,
            addresses: worker.info.addresses.clone(),
        }
    }
}

/// A workload for actor `ns/a` placed on worker `w-1`, with no spec: what the verbs' tests
/// send to a [`test_agent`] that has no worker.
#[cfg(test)]
pub(super) fn test_workload() -> crate::types::Workload {
    crate::types::Workload {
        actor: ate_core::ActorRef::new("ns", "a"),
        uid: String::new(),
        template: String::new(),
        spec: None,
        worker_id: "w-1".into(),
        activation: 0,
    }
}

/// A [`NodeAgent`] on a temporary state directory, with no worker and an api it never reaches
/// (the channel is lazy): enough for the verbs' validation and their files.
#[cfg(test)]
pub(super) async fn test_agent(state: &std::path::Path) -> NodeAgent {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeConfig,
    }
    let durable = format!("file://{}", state.join("durable").display());
    let state = state.display().to_string();
    let args = [
        "node",
        "--name",
        "node-t",
        "--api",
        "127.0.0.1:1",
        "--state-dir",
        &state,
        "--durable-store",
        &durable,
    ];
    let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let bound: SocketAddr = ([127, 0, 0, 1], 0).into();
    NodeAgent::new(cli.node, bound)
        .await
        .unwrap_or_else(|e| panic!("test agent: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn generation_dir_keeps_twelve_alphanumerics_of_the_uuid() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let agent = test_agent(tmp.path()).await;
        let snapshots = tmp.path().join("snapshots");
        assert_eq!(
            agent.generation_dir("ns", "a", 7, "0123abcd-ef45-6789-aaaa-bbbbccccdddd"),
            snapshots.join("ns").join("a").join("7-0123abcdef45")
        );
        // Nothing of the uuid leaves the actor's directory.
        assert_eq!(
            agent.generation_dir("ns", "a", 3, "../../x"),
            snapshots.join("ns").join("a").join("3-x")
        );
        assert_eq!(
            agent.generation_dir("ns", "a", 0, ""),
            snapshots.join("ns").join("a").join("0-")
        );
    }

    #[tokio::test]
    async fn remember_dir_returns_the_previous_dirs_newest_first() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let agent = test_agent(tmp.path()).await;
        let d = |n: &str| PathBuf::from(format!("/s/{n}"));
        assert!(agent.remember_dir("ns/a", d("1")).is_empty());
        assert_eq!(agent.remember_dir("ns/a", d("2")), vec![d("1")]);
        // RECENT_DIRS (2) are kept: the third forgets the first.
        assert_eq!(agent.remember_dir("ns/a", d("3")), vec![d("2"), d("1")]);
        assert_eq!(agent.remember_dir("ns/a", d("4")), vec![d("3"), d("2")]);
        // A directory is never its own parent, and remembering it again makes it the newest.
        assert_eq!(agent.remember_dir("ns/a", d("3")), vec![d("4")]);
        assert_eq!(agent.remember_dir("ns/a", d("5")), vec![d("3"), d("4")]);
        // Per actor.
        assert!(agent.remember_dir("ns/b", d("1")).is_empty());
    }

    #[tokio::test]
    async fn worker_unknown_to_the_fleet_is_unavailable() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let agent = test_agent(tmp.path()).await;
        let err = agent.worker("w-1").err();
        assert!(
            matches!(&err, Some(AgentError::WorkerNotRunning { worker, node }) if worker == "w-1" && node == "node-t"),
            "{err:?}"
        );
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("worker w-1 is not running on node node-t")
        );
    }
}
