//! Scripted node agents in process: an [`ate_api::node_calls::NodeCalls`] that records every
//! call in order and answers from a script per node address and call (success by default; a
//! given [`NodeErrorKind`], a transport failure, another epoch, a degraded or damaged
//! generation, a delay, or a hold until the test opens a gate).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_api::error::WorkflowError;
use ate_api::node::{
    Checkpointed, Detached, LogChunk, NodeError, NodeErrorKind, RunningActivity, Started, Workload,
};
use ate_api::node_calls::{NodeAnswer, NodeCalls};
use ate_core::{ActorRef, DurableStatus, Fidelity};
use ate_store::SnapshotRecord;
use tokio::sync::{Notify, Semaphore};

/// A NodeService call, as the fake node tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Run,
    Restore,
    Checkpoint,
    Detach,
    Stop,
    ActorActivity,
    ForgetActor,
    DeleteSnapshots,
    ReadLog,
}

/// One call as the fake node received it.
#[derive(Debug, Clone)]
pub struct Call {
    pub address: String,
    pub op: Op,
    /// The actor named (None: ActorActivity, DeleteSnapshots).
    pub actor: Option<ActorRef>,
    pub worker_id: Option<String>,
    /// The generation restored or checkpointed.
    pub generation: Option<u64>,
    /// The fidelity a Restore or Checkpoint asked for.
    pub fidelity: Option<Fidelity>,
    /// The uuid a Checkpoint names its generation by.
    pub uuid: Option<String>,
    pub request_id: Option<String>,
}

/// How the fake node answers one call.
#[derive(Debug, Clone)]
pub enum Answer {
    /// What a healthy node answers.
    Ok,
    /// The node answered this error.
    Fail(NodeErrorKind, &'static str),
    /// The call never reached the node (refused, reset): transient and unreached.
    Unreached,
    /// Run/Restore succeed but with this epoch (the worker restarted).
    Epoch(u64),
    /// A Checkpoint writes a generation of this fidelity, with this reason.
    Degraded(Fidelity, &'static str),
    /// A Restore fails (FAILED) finding these copies of its generation damaged.
    Damaged { local: bool, durable: bool },
    /// `then`, after this long (the api's node call timeout may cut it short).
    After(Duration, Box<Answer>),
    /// `then`, once the test opens the gate.
    Held(Gate, Box<Answer>),
}

impl Answer {
    pub fn fail(kind: NodeErrorKind, message: &'static str) -> Self {
        Answer::Fail(kind, message)
    }

    pub fn after(self, delay: Duration) -> Self {
        Answer::After(delay, Box::new(self))
    }

    pub fn held(self, gate: &Gate) -> Self {
        Answer::Held(gate.clone(), Box::new(self))
    }
}

/// Holds calls scripted with [`Answer::held`] until [`Gate::open`].
#[derive(Debug, Clone)]
pub struct Gate(Arc<Semaphore>);

impl Default for Gate {
    fn default() -> Self {
        Gate(Arc::new(Semaphore::new(0)))
    }
}

impl Gate {
    pub fn open(&self) {
        self.0.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    async fn pass(&self) {
        let _ = self.0.acquire().await;
    }
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    scripts: HashMap<(String, Op), VecDeque<Answer>>,
    activity: HashMap<String, Vec<RunningActivity>>,
    /// Node name and boot id per address, for the generations a checkpoint writes.
    identity: HashMap<String, (String, String)>,
}

/// Scripted node agents, keyed by address. Unscripted calls succeed.
#[derive(Default)]
pub struct FakeNodes {
    state: Mutex<State>,
    called: Notify,
}

impl FakeNodes {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Names the node at `address` (what its checkpoints record as node and boot).
    pub fn add_node(&self, address: &str, node: &str, boot_id: &str) {
        self.state()
            .identity
            .insert(address.into(), (node.into(), boot_id.into()));
    }

    /// The next calls `op` to `address` answer `answers`, in order; later ones succeed.
    pub fn script(&self, address: &str, op: Op, answers: impl IntoIterator<Item = Answer>) {
        self.state()
            .scripts
            .entry((address.into(), op))
            .or_default()
            .extend(answers);
    }

    /// What ActorActivity answers at `address`.
    pub fn set_activity(&self, address: &str, actors: Vec<RunningActivity>) {
        self.state().activity.insert(address.into(), actors);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The calls `op` so far, in order.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.op == op).collect()
    }

    /// The ops called so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.calls().into_iter().map(|c| c.op).collect()
    }

    /// Waits until `n` calls `op` have been received.
    pub async fn wait_for(&self, op: Op, n: usize) {
        loop {
            let called = self.called.notified();
            if self.calls_of(op).len() >= n {
                return;
            }
            called.await;
        }
    }

    /// Records `call` and returns its scripted answer.
    fn receive(&self, call: Call) -> Answer {
        let mut s = self.state();
        let key = (call.address.clone(), call.op);
        s.calls.push(call);
        let answer = s
            .scripts
            .get_mut(&key)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Answer::Ok);
        drop(s);
        self.called.notify_waiters();
        answer
    }

    fn identity(&self, address: &str) -> (String, String) {
        self.state()
            .identity
            .get(address)
            .cloned()
            .unwrap_or_else(|| (address.to_string(), format!("boot-{address}")))
    }
}

/// Waits out delays and gates, then answers the node's error, or the answer (`Ok`, `Epoch`,
/// `Degraded`, `Damaged`) the caller shapes its reply from.
async fn settle(mut answer: Answer) -> Result<Answer, NodeError> {
    loop {
        answer = match answer {
            Answer::After(delay, then) => {
                tokio::time::sleep(delay).await;
                *then
            }
            Answer::Held(gate, then) => {
                gate.pass().await;
                *then
            }
            Answer::Fail(kind, message) => {
                return Err(NodeError {
                    kind,
                    unreached: false,
                    message: message.into(),
                    damage: None,
                });
            }
            Answer::Unreached => {
                return Err(NodeError {
                    kind: NodeErrorKind::Transient,
                    unreached: true,
                    message: "tcp connect error: connection refused".into(),
                    damage: None,
                });
            }
            done => return Ok(done),
        }
    }
}

fn call(address: &str, op: Op) -> Call {
    Call {
        address: address.into(),
        op,
        actor: None,
        worker_id: None,
        generation: None,
        fidelity: None,
        uuid: None,
        request_id: None,
    }
}

impl FakeNodes {
    async fn start(
        &self,
        address: &str,
        op: Op,
        workload: &Workload<'_>,
        snapshot: Option<(&SnapshotRecord, Fidelity)>,
        request_id: Option<&str>,
    ) -> NodeAnswer<Started> {
        let answer = self.receive(Call {
            actor: Some(workload.actor.actor_ref()),
            worker_id: Some(workload.worker_id.into()),
            generation: snapshot.map(|(s, _)| s.generation),
            fidelity: snapshot.map(|(_, f)| f),
            request_id: request_id.map(str::to_string),
            ..call(address, op)
        });
        match settle(answer).await? {
            Answer::Epoch(epoch) => Ok(Started { epoch }),
            Answer::Damaged { local, durable } => {
                let (s, _) = snapshot.expect("a scripted damage answers a Restore");
                let why = |damaged: bool| damaged.then(|| "rootfs.tar: sha256 00".to_string());
                Err(NodeError {
                    kind: NodeErrorKind::Failed,
                    unreached: false,
                    message: format!("generation {} is damaged", s.generation),
                    damage: Some(ate_api::workflows::Damage {
                        generation: s.generation,
                        uuid: s.uuid.clone(),
                        local: why(local),
                        durable: why(durable),
                    }),
                })
            }
            // The epoch every worker registers with in these tests.
            _ => Ok(Started { epoch: 1 }),
        }
    }
}

#[async_trait::async_trait]
impl NodeCalls for FakeNodes {
    async fn run(
        &self,
        address: &str,
        workload: &Workload<'_>,
        request_id: Option<&str>,
    ) -> Result<NodeAnswer<Started>, WorkflowError> {
        Ok(self
            .start(address, Op::Run, workload, None, request_id)
            .await)
    }

    async fn restore(
        &self,
        address: &str,
        workload: &Workload<'_>,
        snapshot: &SnapshotRecord,
        fidelity: Fidelity,
        request_id: Option<&str>,
    ) -> Result<NodeAnswer<Started>, WorkflowError> {
        let snapshot = Some((snapshot, fidelity));
        Ok(self
            .start(address, Op::Restore, workload, snapshot, request_id)
            .await)
    }

    async fn checkpoint(
        &self,
        address: &str,
        workload: &Workload<'_>,
        generation: u64,
        uuid: String,
        fidelity: Fidelity,
        durable: bool,
        _grace_ms: u32,
    ) -> Result<NodeAnswer<Checkpointed>, WorkflowError> {
        let actor = workload.actor;
        let answer = self.receive(Call {
            actor: Some(actor.actor_ref()),
            worker_id: Some(workload.worker_id.into()),
            generation: Some(generation),
            fidelity: Some(fidelity),
            uuid: Some(uuid.clone()),
            ..call(address, Op::Checkpoint)
        });
        let (fidelity, reason) = match settle(answer).await {
            Ok(Answer::Degraded(f, why)) => (f, Some(why.to_string())),
            Ok(_) => (fidelity, None),
            Err(e) => return Ok(Err(e)),
        };
        let (node, boot_id) = self.identity(address);
        let path = format!("{}/{}/{generation}", actor.atespace, actor.name);
        Ok(Ok(Checkpointed {
            snapshot: Some(SnapshotRecord {
                atespace: actor.atespace.clone(),
                name: actor.name.clone(),
                generation,
                uuid,
                fidelity,
                template: actor.template.clone(),
                sandbox_class: workload.template.spec.sandbox_class.clone(),
                node,
                boot_id,
                local_path: Some(format!("/var/lib/ate/snapshots/{path}")),
                durable_uri: durable.then(|| format!("file:///durable/{path}")),
                durable_status: Some(if durable {
                    DurableStatus::Completed
                } else {
                    DurableStatus::Pending
                }),
                size_bytes: 1234,
                checksum: "sha256:00".into(),
                reason,
                created_ms: ate_core::clock::now_ms(),
                local_damage: None,
                durable_damage: None,
                skipped: false,
                requires: Vec::new(),
            }),
            // Like a real worker with frozen copies on.
            kept_frozen: true,
        }))
    }

    async fn detach(
        &self,
        address: &str,
        actor: &ActorRef,
        snapshots: &[SnapshotRecord],
    ) -> Result<NodeAnswer<Vec<Detached>>, WorkflowError> {
        let answer = self.receive(Call {
            actor: Some(actor.clone()),
            generation: snapshots.first().map(|s| s.generation),
            ..call(address, Op::Detach)
        });
        Ok(settle(answer).await.map(|_| {
            snapshots
                .iter()
                .map(|s| Detached {
                    generation: s.generation,
                    durable_status: DurableStatus::Completed,
                    durable_uri: format!("file:///durable/{}", s.uuid),
                    reason: String::new(),
                })
                .collect()
        }))
    }

    async fn stop(
        &self,
        address: &str,
        actor: &ActorRef,
        worker_id: &str,
    ) -> Result<NodeAnswer<()>, WorkflowError> {
        let answer = self.receive(Call {
            actor: Some(actor.clone()),
            worker_id: Some(worker_id.into()),
            ..call(address, Op::Stop)
        });
        Ok(settle(answer).await.map(|_| ()))
    }

    async fn actor_activity(
        &self,
        address: &str,
        worker_id: &str,
    ) -> Result<NodeAnswer<Vec<RunningActivity>>, WorkflowError> {
        let answer = self.receive(Call {
            worker_id: Some(worker_id.into()),
            ..call(address, Op::ActorActivity)
        });
        let activity = self.state().activity.get(address).cloned();
        Ok(settle(answer).await.map(|_| activity.unwrap_or_default()))
    }

    async fn forget_actor(
        &self,
        address: &str,
        actor: &ActorRef,
        purge_dirs: Vec<String>,
    ) -> Result<NodeAnswer<u32>, WorkflowError> {
        let answer = self.receive(Call {
            actor: Some(actor.clone()),
            ..call(address, Op::ForgetActor)
        });
        let removed = u32::try_from(purge_dirs.len()).unwrap_or(u32::MAX);
        Ok(settle(answer).await.map(|_| removed))
    }

    async fn delete_snapshots(
        &self,
        address: &str,
        snapshots: &[SnapshotRecord],
    ) -> Result<NodeAnswer<()>, WorkflowError> {
        let answer = self.receive(Call {
            generation: snapshots.first().map(|s| s.generation),
            ..call(address, Op::DeleteSnapshots)
        });
        Ok(settle(answer).await.map(|_| ()))
    }

    async fn read_log(
        &self,
        address: &str,
        actor: &ActorRef,
        offset: u64,
        _max_bytes: u32,
    ) -> Result<NodeAnswer<LogChunk>, WorkflowError> {
        let answer = self.receive(Call {
            actor: Some(actor.clone()),
            ..call(address, Op::ReadLog)
        });
        let text = format!("log of {}/{}\n", actor.atespace, actor.name).into_bytes();
        let from = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(text.len());
        Ok(settle(answer).await.map(|_| LogChunk {
            found: true,
            data: text[from..].to_vec(),
            next_offset: text.len() as u64,
        }))
    }
}
