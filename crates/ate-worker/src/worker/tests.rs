//! The verbs' own refusals, without gRPC and without runc: a runtime that runs nothing.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_core::template::{EgressPolicy, MemoryRestore, Resources};
use ate_core::{ActorRef, Fidelity, TemplateSpec};

use super::*;
use crate::error::Result as SandboxResult;
use crate::runtime::{Capabilities, CheckpointStats, ExitInfo, RunMode, SandboxSpec, Started};

/// Refuses to start anything; records the sandboxes it was asked to stop.
struct NoRuntime {
    class: &'static str,
    stopped: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl SandboxRuntime for NoRuntime {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            can_restore_memory: true,
            sandbox_class: self.class.to_string(),
            can_keep_frozen: false,
            can_restore_lazily: false,
            can_stream_images: false,
        }
    }
    async fn run(&self, _: &ActorSandbox, _: &SandboxSpec, _: RunMode) -> SandboxResult<Started> {
        Err(SandboxError::Unsupported("no runs here".into()))
    }
    async fn checkpoint(&self, _: &ActorSandbox, _: &Path) -> SandboxResult<CheckpointStats> {
        Err(SandboxError::Unsupported("no dumps here".into()))
    }
    async fn restore(&self, _: &ActorSandbox, _: &SandboxSpec, _: &Path) -> SandboxResult<Started> {
        Err(SandboxError::Unsupported("no restores here".into()))
    }
    async fn stop(&self, actor: &ActorSandbox) -> SandboxResult<()> {
        if let Ok(mut s) = self.stopped.lock() {
            s.push(actor.container_id());
        }
        Ok(())
    }
    async fn exited(&self, _: &ActorSandbox) -> SandboxResult<Option<ExitInfo>> {
        Ok(None)
    }
}

struct Fixture {
    worker: Worker,
    runtime: Arc<NoRuntime>,
    dir: tempfile::TempDir,
}

fn worker(slots: u32) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(NoRuntime {
        class: "runc",
        stopped: Mutex::new(Vec::new()),
    });
    let worker = Worker::new(
        Identity {
            id: "w-1".into(),
            spiffe_id: String::new(),
            epoch: 17,
            addresses: Vec::new(),
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            slots,
            labels: BTreeMap::new(),
        },
        runtime.clone(),
        ImageCache::new(dir.path().join("images")),
        dir.path().join("actors"),
        dir.path().join("logs"),
        Arc::new(Faults::default()),
    );
    Fixture {
        worker,
        runtime,
        dir,
    }
}

fn spec(class: &str) -> TemplateSpec {
    TemplateSpec {
        sandbox_class: class.into(),
        containers: Vec::new(),
        resources: Resources {
            cpu_millis: 100,
            memory_bytes: 64 << 20,
        },
        volumes: Vec::new(),
        fidelity: Fidelity::Memory,
        memory_restore: MemoryRestore::Lazy,
        on_memory_failure: Default::default(),
        idle_timeout_seconds: 60,
        worker_selector: BTreeMap::new(),
        egress: EgressPolicy::default(),
        golden_tag: None,
        web_sockets: Default::default(),
    }
}

fn start_request(worker_id: &str, class: &str) -> StartRequest {
    StartRequest {
        workload: Workload {
            actor: ActorRef::new("ns", "a"),
            uid: "uid-1".into(),
            template: "tpl".into(),
            spec: spec(class),
            worker_id: worker_id.into(),
            activation: 3,
        },
        generation_dir: None,
        fidelity: None,
    }
}

fn checkpoint_request(worker_id: &str, dir: &Path) -> CheckpointRequest {
    CheckpointRequest {
        actor: ActorRef::new("ns", "a"),
        worker_id: worker_id.into(),
        activation: 0,
        generation_dir: dir.join("gen-1"),
        fidelity: None,
        generation: 1,
        uuid: "u-1".into(),
        node: "n-1".into(),
        boot_id: "b-1".into(),
        grace: None,
        on_memory_failure: None,
    }
}

#[tokio::test]
async fn a_request_for_another_worker_is_refused() {
    let f = worker(4);
    let why = VerbError::FailedPrecondition(
        "workload for ns/a names worker \"w-2\", this is worker \"w-1\"".into(),
    );
    assert_eq!(
        f.worker.start(start_request("w-2", "runc")).await,
        Err(why.clone())
    );
    assert_eq!(
        f.worker
            .checkpoint(checkpoint_request("w-2", f.dir.path()))
            .await,
        Err(why)
    );
}

#[tokio::test]
async fn a_template_for_another_sandbox_class_is_refused() {
    let f = worker(4);
    assert_eq!(
        f.worker.start(start_request("w-1", "gvisor")).await,
        Err(VerbError::FailedPrecondition(
            "template wants sandbox class \"gvisor\"; worker w-1 runs \"runc\"".into()
        ))
    );
}

#[tokio::test]
async fn a_full_worker_refuses_a_start() {
    let f = worker(0);
    assert_eq!(
        f.worker.start(start_request("w-1", "runc")).await,
        Err(VerbError::ResourceExhausted(
            "worker w-1 has all 0 actor slots in use".into()
        ))
    );
}

#[tokio::test]
async fn a_draining_worker_refuses_starts_and_says_so_in_activity() {
    let f = worker(4);
    let idle = f.worker.activity();
    assert_eq!(
        idle,
        ActivityReport {
            epoch: 17,
            actors: Vec::new(),
            draining: false,
            frozen: 0,
        }
    );
    // No node ever leased this worker: the drain returns at once.
    f.worker.drain(Duration::from_secs(5)).await;
    assert!(f.worker.activity().draining);
    let refused = f.worker.start(start_request("w-1", "runc")).await;
    assert_eq!(
        refused,
        Err(VerbError::Unavailable("worker w-1 is shutting down".into()))
    );
}

#[tokio::test]
async fn a_checkpoint_of_an_actor_not_here_says_its_sandbox_is_lost() {
    let f = worker(4);
    // Nothing to checkpoint: the caller keeps the actor's previous generation.
    assert_eq!(
        f.worker
            .checkpoint(checkpoint_request("w-1", f.dir.path()))
            .await,
        Err(VerbError::SandboxLost(
            "actor ns/a is not running on worker w-1".into()
        ))
    );
}

#[tokio::test]
async fn a_stop_of_an_actor_not_here_still_cleans_up() {
    let f = worker(4);
    let left = f.dir.path().join("actors/ns/a/upper");
    std::fs::create_dir_all(&left).unwrap();
    let reply = f
        .worker
        .stop(StopRequest {
            actor: ActorRef::new("ns", "a"),
            activation_at_most: None,
        })
        .await;
    assert_eq!(reply, Ok(StopReply { epoch: 17 }));
    let expected = f.worker.sandbox_for("ns", "a", "").container_id();
    assert_eq!(*f.runtime.stopped.lock().unwrap(), vec![expected]);
    assert!(!f.dir.path().join("actors/ns/a").exists());
}

#[test]
fn host_failures_are_internal_and_the_rest_a_failed_precondition() {
    let io = SandboxError::Io {
        what: "mkdir /x".into(),
        source: std::io::Error::other("disk on fire"),
    };
    assert_eq!(
        sandbox_error("cold boot", io),
        VerbError::Internal("cold boot: mkdir /x: disk on fire".into())
    );
    let unsupported = SandboxError::Unsupported("no".into());
    let why = format!("rootfs restart: {unsupported}");
    assert_eq!(
        sandbox_error("rootfs restart", unsupported),
        VerbError::FailedPrecondition(why)
    );
}
