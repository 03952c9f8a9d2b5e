//! The control plane under test: the real [`Api`] over a real SQLite store (a file in a
//! temporary directory), its node calls answered by [`FakeNodes`]; workers are registered as
//! FleetService does it (the store's registration, then the api's reconciliation).

use std::sync::Arc;
use std::time::Duration;

use ate_api::workflows::ActorView;
use ate_api::{Api, ApiConfig};
use ate_core::clock::now_ms;
use ate_core::template::{Container, EgressPolicy, Resources};
use ate_core::{ActorRef, Fidelity, TemplateRef, TemplateSpec};
use ate_store::{ActorRecord, Capacity, SnapshotRecord, Store, WorkerRecord, WorkerStatus};

use super::fake_node::{Answer, FakeNodes, Gate, Op};

/// The api's configuration for these tests: the fleet read afresh on every placement.
pub fn cfg() -> ApiConfig {
    ApiConfig {
        fleet_max_age: Duration::ZERO,
        instance_id: "api-test".into(),
        ..Default::default()
    }
}

/// What a worker with CRIU advertises.
pub const WITH_CRIU: &[&str] = &["memory:criu", "userns:off"];
/// What a worker without CRIU advertises.
pub const WITHOUT_CRIU: &[&str] = &["userns:off"];

pub struct Plane {
    pub api: Arc<Api>,
    pub nodes: Arc<FakeNodes>,
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

/// The NodeService address of node `node` (never dialled: the fake answers).
pub fn address(node: &str) -> String {
    format!("{node}.test:7000")
}

pub fn actor(ns: &str, name: &str) -> ActorRef {
    ActorRef::new(ns, name)
}

impl Plane {
    pub async fn new(cfg: ApiConfig) -> Plane {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("ate.db").display());
        let store = ate_store::open(&url).await.expect("open sqlite");
        let nodes = Arc::new(FakeNodes::default());
        let api = Arc::new(Api::with_node_calls(store.clone(), cfg, nodes.clone()));
        Plane {
            api,
            nodes,
            store,
            _dir: dir,
        }
    }

    /// The usual start: atespace `ns` seeded and one worker `w1` of `slots` on node `n1`, able to
    /// restore memory.
    pub async fn one_worker(cfg: ApiConfig, slots: u64) -> Plane {
        let p = Plane::new(cfg).await;
        p.seed("ns").await;
        p.register("n1", "w1", slots, WITH_CRIU).await;
        p
    }

    /// [`Plane::one_worker`] under the tests' [`cfg`] as `change` changes it.
    pub async fn one_worker_with(slots: u64, change: impl FnOnce(&mut ApiConfig)) -> Plane {
        let mut cfg = cfg();
        change(&mut cfg);
        Plane::one_worker(cfg, slots).await
    }

    /// Atespace `ns` with template `ns/t` (250m, 64Mi, MEMORY fidelity).
    pub async fn seed(&self, ns: &str) {
        self.store
            .create_atespace(ns, now_ms())
            .await
            .expect("atespace");
        self.store
            .apply_template(ns, "t", &spec(), now_ms())
            .await
            .expect("template");
    }

    /// A SUSPENDED actor `ns/name` of template `ns/t` that never ran.
    pub async fn create_actor(&self, ns: &str, name: &str) -> ActorRef {
        self.create_actor_of(ns, name, "t").await
    }

    /// A SUSPENDED actor `ns/name` of template `ns/template` that never ran.
    pub async fn create_actor_of(&self, ns: &str, name: &str, template: &str) -> ActorRef {
        let record = ActorRecord::new(
            ns,
            name,
            format!("uid-{ns}-{name}"),
            TemplateRef::new(ns, template),
            Default::default(),
            now_ms(),
        );
        self.store.create_actor(&record).await.expect("actor");
        actor(ns, name)
    }

    /// Registers worker `id` of `node` with `slots` slots (ample CPU and memory), advertising
    /// `capabilities`, holding no actor, as FleetService registers one (a return from GONE
    /// counts as a restart).
    pub async fn register(&self, node: &str, id: &str, slots: u64, capabilities: &[&str]) {
        let address = address(node);
        self.nodes.add_node(&address, node, &format!("boot-{node}"));
        let restarted = match self.store.get_worker(id).await {
            Ok(p) => p.status == WorkerStatus::Gone,
            Err(_) => false,
        };
        let worker = WorkerRecord {
            id: id.into(),
            node: node.into(),
            addresses: vec!["127.0.0.2:8443".into()],
            identity: format!("spiffe://ate.local/ns/ate-system/sa/worker-{id}"),
            labels: Default::default(),
            sandbox_class: "runc".into(),
            can_restore_memory: capabilities.contains(&"memory:criu"),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            capacity: Capacity {
                cpu_millis: 4_000_000,
                memory_bytes: 1 << 50,
                slots,
            },
            used: Capacity::default(),
            cpu_physical_millis: 0,
            cpu_usage_millis: 0,
            epoch: 1,
            status: WorkerStatus::Active,
            last_heartbeat_ms: 0,
            node_address: address,
            boot_id: format!("boot-{node}"),
        };
        self.store
            .register_worker(&worker, now_ms())
            .await
            .expect("register worker");
        self.api
            .reconcile_worker(id, &[], restarted)
            .await
            .expect("reconcile");
    }

    pub async fn get(&self, r: &ActorRef) -> ActorRecord {
        self.store.get_actor(r).await.expect("get actor")
    }

    pub async fn snapshots(&self, r: &ActorRef) -> Vec<SnapshotRecord> {
        self.store.list_snapshots(r).await.expect("snapshots")
    }

    /// Resumes `r`, which must succeed; its view.
    pub async fn resume(&self, r: &ActorRef) -> ActorView {
        self.api.resume(r, None).await.expect("resume").0
    }

    /// Suspends `r` (ASYNC), which must succeed.
    pub async fn suspend(&self, r: &ActorRef) -> ActorView {
        self.api.suspend(r, false, "test").await.expect("suspend")
    }

    /// A RUNNING actor `ns/name` (created, then resumed).
    pub async fn running(&self, name: &str) -> ActorRef {
        let a = self.create_actor("ns", name).await;
        self.resume(&a).await;
        a
    }

    /// Suspends `r` while node `n1` never answers the checkpoint, so the call times out and the
    /// actor stays SUSPENDING; the gate holding the answer back is returned to be kept.
    pub async fn suspend_cut_off(&self, r: &ActorRef) -> Gate {
        let never = Gate::default();
        self.nodes
            .script(&address("n1"), Op::Checkpoint, [Answer::Ok.held(&never)]);
        self.api.suspend(r, false, "").await.expect_err("timed out");
        never
    }

    /// The generation of the last Restore call the nodes got.
    pub fn last_restored_generation(&self) -> Option<u64> {
        self.nodes
            .calls_of(Op::Restore)
            .pop()
            .expect("a restore")
            .generation
    }
}

/// The template every test actor runs: one container, 250m and 64Mi, MEMORY snapshots.
pub fn spec() -> TemplateSpec {
    TemplateSpec {
        sandbox_class: "runc".into(),
        containers: vec![Container {
            name: "main".into(),
            image: "oci-layout:/images/counter:latest".into(),
            command: Vec::new(),
            env: Vec::new(),
            wakeup_probe: None,
            ports: Vec::new(),
            exit_policy: Default::default(),
            volume_mounts: None,
        }],
        resources: Resources {
            cpu_millis: 250,
            memory_bytes: 64 << 20,
        },
        volumes: Vec::new(),
        fidelity: Fidelity::Memory,
        memory_restore: Default::default(),
        on_memory_failure: Default::default(),
        idle_timeout_seconds: 0,
        worker_selector: Default::default(),
        egress: EgressPolicy::default(),
        golden_tag: None,
        web_sockets: Default::default(),
    }
}
