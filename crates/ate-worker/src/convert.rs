//! Every translation between the wire (`ate_proto::v1`, `tonic::Status`) and the worker's own
//! types (`worker::types`): WorkerService requests decoded (bad input rejected with the messages
//! callers know), replies encoded, [`VerbError`]s as status codes; and the adoption record file,
//! whose format is the wire message `v1::AdoptionRecord` (so it is written once, in
//! `worker.proto`, and read back by any later worker version). No other module names a wire
//! type but `service.rs`.

use std::path::PathBuf;
use std::time::Duration;

use ate_core::{ActorRef, Fidelity};
use ate_proto::v1;
use tonic::Status;

use crate::worker::{
    ActivityReport, ActorActivity, AdoptionRecord, CheckpointReply, CheckpointRequest, StartReply,
    StartRequest, StopReply, StopRequest, VerbError, Worker, Workload,
};

/// A verb's error as the status its caller sees: one code per variant, the message unchanged.
pub(crate) fn status(e: VerbError) -> Status {
    match e {
        VerbError::InvalidArgument(m) => Status::invalid_argument(m),
        VerbError::FailedPrecondition(m) => Status::failed_precondition(m),
        VerbError::ResourceExhausted(m) => Status::resource_exhausted(m),
        VerbError::Unavailable(m) => Status::unavailable(m),
        VerbError::Aborted(m) => Status::aborted(m),
        VerbError::Internal(m) => Status::internal(m),
    }
}

fn invalid(message: impl Into<String>) -> VerbError {
    VerbError::InvalidArgument(message.into())
}

/// A present ref whose two halves are DNS-1123 labels.
fn actor_ref(r: Option<&v1::ObjectRef>) -> Result<ActorRef, VerbError> {
    let r = r.ok_or_else(|| invalid("actor ref missing"))?;
    ate_core::validate_label("actor.atespace", &r.atespace).map_err(|e| invalid(e.to_string()))?;
    ate_core::validate_label("actor.name", &r.name).map_err(|e| invalid(e.to_string()))?;
    Ok(ActorRef::new(r.atespace.clone(), r.name.clone()))
}

fn object_ref(r: &ActorRef) -> v1::ObjectRef {
    v1::ObjectRef {
        atespace: r.atespace.clone(),
        name: r.name.clone(),
    }
}

/// FIDELITY_UNSPECIFIED (0) is `None`; an unknown number is refused.
fn fidelity(n: i32) -> Result<Option<Fidelity>, VerbError> {
    if n == 0 {
        return Ok(None);
    }
    Fidelity::from_wire(n)
        .map(Some)
        .ok_or_else(|| invalid(format!("unknown fidelity {n}")))
}

/// 0 on the wire means "none".
fn nonzero<T: Default + PartialEq>(n: T) -> Option<T> {
    (n != T::default()).then_some(n)
}

pub(crate) fn start_request(req: v1::WorkerStartRequest) -> Result<StartRequest, VerbError> {
    let w = req.workload.ok_or_else(|| invalid("workload missing"))?;
    let actor = actor_ref(w.actor.as_ref())?;
    let wire_spec = w
        .spec
        .as_ref()
        .ok_or_else(|| invalid("workload.spec missing"))?;
    let spec =
        ate_proto::spec_from_wire(wire_spec).map_err(|e| invalid(format!("workload.spec: {e}")))?;
    let fidelity = fidelity(req.fidelity)?;
    let generation_dir =
        (!req.generation_dir.is_empty()).then(|| PathBuf::from(req.generation_dir));
    if fidelity.is_some() && generation_dir.is_none() {
        return Err(invalid("a fidelity was given without a generation_dir"));
    }
    Ok(StartRequest {
        workload: Workload {
            actor,
            uid: w.uid,
            template: w.template,
            spec,
            worker_id: w.worker_id,
            activation: w.activation,
        },
        generation_dir,
        fidelity,
    })
}

pub(crate) fn start_reply(r: StartReply) -> v1::WorkerStartReply {
    v1::WorkerStartReply {
        epoch: r.epoch,
        ready_ms: r.ready_ms,
    }
}

/// The workload of a checkpoint needs only its ref, worker and activation (no spec).
pub(crate) fn checkpoint_request(
    req: v1::WorkerCheckpointRequest,
) -> Result<CheckpointRequest, VerbError> {
    let w = req.workload.ok_or_else(|| invalid("workload missing"))?;
    let actor = actor_ref(w.actor.as_ref())?;
    if req.generation_dir.is_empty() {
        return Err(invalid("generation_dir missing"));
    }
    let generation_dir = PathBuf::from(req.generation_dir);
    if !generation_dir.is_absolute() {
        return Err(invalid("generation_dir must be absolute"));
    }
    Ok(CheckpointRequest {
        actor,
        worker_id: w.worker_id,
        activation: w.activation,
        generation_dir,
        fidelity: fidelity(req.fidelity)?,
        generation: req.generation,
        uuid: req.uuid,
        node: req.node,
        boot_id: req.boot_id,
        grace: nonzero(req.grace_ms).map(|ms| Duration::from_millis(u64::from(ms))),
    })
}

pub(crate) fn checkpoint_reply(r: CheckpointReply) -> v1::WorkerCheckpointReply {
    v1::WorkerCheckpointReply {
        epoch: r.epoch,
        fidelity: r.fidelity.wire(),
        reason: r.reason,
        size_bytes: r.size_bytes,
        checksum: r.checksum,
        kept_frozen: r.kept_frozen,
    }
}

pub(crate) fn stop_request(req: v1::WorkerStopRequest) -> Result<StopRequest, VerbError> {
    Ok(StopRequest {
        actor: actor_ref(req.actor.as_ref())?,
        activation_at_most: nonzero(req.activation_at_most),
    })
}

pub(crate) fn stop_reply(r: StopReply) -> v1::WorkerStopReply {
    v1::WorkerStopReply { epoch: r.epoch }
}

fn actor_activity(a: ActorActivity) -> v1::ActorActivity {
    v1::ActorActivity {
        actor: Some(object_ref(&a.actor)),
        open_streams: a.open_streams,
        last_activity_unix_ms: a.last_activity_unix_ms,
        exited: a.exited,
        exit_code: a.exit_code,
        last_log_lines: a.last_log_lines,
        idle_timeout_seconds: a.idle_timeout_seconds,
        activation: a.activation,
        crash_reason: a.crash_reason,
    }
}

pub(crate) fn activity_reply(r: ActivityReport) -> v1::WorkerActivityReply {
    v1::WorkerActivityReply {
        epoch: r.epoch,
        actors: r.actors.into_iter().map(actor_activity).collect(),
        draining: r.draining,
    }
}

/// Info: the worker's identity, capacity and capabilities.
pub(crate) fn worker_info(w: &Worker) -> v1::WorkerInfo {
    let id = &w.ident;
    v1::WorkerInfo {
        worker_id: id.id.clone(),
        epoch: id.epoch,
        addresses: id.addresses.clone(),
        capacity: Some(v1::Capacity {
            cpu_millis: id.cpu_millis,
            memory_bytes: id.memory_bytes,
            actor_slots: id.slots,
        }),
        labels: id.labels.clone().into_iter().collect(),
        sandbox_class: w.sandbox_class(),
        can_restore_memory: w.can_restore_memory(),
        identity: id.spiffe_id.clone(),
        can_restore_lazily: w.can_restore_lazily(),
    }
}

fn workload_to_wire(w: &Workload) -> v1::Workload {
    v1::Workload {
        actor: Some(object_ref(&w.actor)),
        uid: w.uid.clone(),
        template: w.template.clone(),
        spec: Some(ate_proto::spec_to_wire(&w.spec)),
        worker_id: w.worker_id.clone(),
        activation: w.activation,
    }
}

/// The adoption record file's bytes.
pub(crate) fn adoption_to_bytes(r: &AdoptionRecord) -> Vec<u8> {
    prost::Message::encode_to_vec(&v1::AdoptionRecord {
        workload: Some(workload_to_wire(&r.workload)),
        pid: r.pid.unwrap_or(0),
        page_source_pid: r.page_source_pid.unwrap_or(0),
    })
}

fn adoption_message(bytes: &[u8]) -> Result<v1::AdoptionRecord, String> {
    prost::Message::decode(bytes).map_err(|e| format!("adoption record unreadable: {e}"))
}

/// An adoption record file read back, or why it cannot be used.
pub(crate) fn adoption_from_bytes(bytes: &[u8]) -> Result<AdoptionRecord, String> {
    let record = adoption_message(bytes)?;
    let w = record.workload.unwrap_or_default();
    let actor = actor_ref(w.actor.as_ref()).map_err(|e| e.message().to_string())?;
    let spec = w
        .spec
        .as_ref()
        .ok_or("adoption record has no spec")
        .and_then(|s| ate_proto::spec_from_wire(s).map_err(|_| "adoption record spec invalid"))
        .map_err(str::to_string)?;
    Ok(AdoptionRecord {
        workload: Workload {
            actor,
            uid: w.uid,
            template: w.template,
            spec,
            worker_id: w.worker_id,
            activation: w.activation,
        },
        pid: nonzero(record.pid),
        page_source_pid: nonzero(record.page_source_pid),
    })
}

/// Only the init pid of an adoption record file (its workload unchecked).
pub(crate) fn adoption_pid_from_bytes(bytes: &[u8]) -> Result<Option<u32>, String> {
    Ok(nonzero(adoption_message(bytes)?.pid))
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn wire_spec() -> v1::TemplateSpec {
        let probe = |port| v1::WakeupProbe {
            http_get: Some(v1::HttpGetAction {
                path: "/healthz".into(),
                port,
            }),
            timeout_seconds: 10,
        };
        v1::TemplateSpec {
            containers: vec![
                v1::Container {
                    name: "app".into(),
                    image: "oci-layout:/images/app:latest".into(),
                    command: vec!["/app".into(), "-v".into()],
                    env: vec![v1::EnvVar {
                        name: "PORT".into(),
                        value: "80".into(),
                    }],
                    wakeup_probe: Some(probe(80)),
                    ..Default::default()
                },
                v1::Container {
                    name: "side".into(),
                    image: "oci-layout:/images/side:latest".into(),
                    ports: vec![9000],
                    ignore_exit: true,
                    wakeup_probe: Some(probe(9000)),
                    ..Default::default()
                },
            ],
            resources: Some(v1::Resources {
                cpu_millis: 250,
                memory_bytes: 64 << 20,
            }),
            volumes: vec![v1::Volume {
                name: "data".into(),
                mount_path: "/data".into(),
            }],
            fidelity: Fidelity::Rootfs.wire(),
            idle_timeout_seconds: 300,
            egress: Some(v1::EgressPolicy {
                default_action: "deny-all".into(),
                allow: vec!["example.com:443".into()],
            }),
            eager_memory_restore: true,
            ..Default::default()
        }
    }

    fn wire_workload() -> v1::Workload {
        v1::Workload {
            actor: Some(v1::ObjectRef {
                atespace: "ns".into(),
                name: "a-1".into(),
            }),
            uid: "uid-1".into(),
            template: "tpl".into(),
            spec: Some(wire_spec()),
            worker_id: "w-1".into(),
            activation: 7,
        }
    }

    fn start(f: impl FnOnce(&mut v1::WorkerStartRequest)) -> Result<StartRequest, VerbError> {
        let mut req = v1::WorkerStartRequest {
            workload: Some(wire_workload()),
            generation_dir: "/gens/1".into(),
            fidelity: Fidelity::Memory.wire(),
        };
        f(&mut req);
        start_request(req)
    }

    fn checkpoint(
        f: impl FnOnce(&mut v1::WorkerCheckpointRequest),
    ) -> Result<CheckpointRequest, VerbError> {
        let mut req = v1::WorkerCheckpointRequest {
            workload: Some(wire_workload()),
            generation_dir: "/gens/2".into(),
            fidelity: 0,
            generation: 2,
            uuid: "u-2".into(),
            node: "n-1".into(),
            boot_id: "b-1".into(),
            grace_ms: 0,
        };
        f(&mut req);
        checkpoint_request(req)
    }

    /// The code and message the caller would see.
    fn seen<T: std::fmt::Debug>(r: Result<T, VerbError>) -> (Code, String) {
        let s = status(r.expect_err("must be refused"));
        (s.code(), s.message().to_string())
    }

    fn refused(message: &str) -> (Code, String) {
        (Code::InvalidArgument, message.to_string())
    }

    #[test]
    fn each_error_keeps_its_code_message_and_metrics_label() {
        let cases = [
            (
                VerbError::InvalidArgument("a".into()),
                Code::InvalidArgument,
            ),
            (
                VerbError::FailedPrecondition("b".into()),
                Code::FailedPrecondition,
            ),
            (
                VerbError::ResourceExhausted("c".into()),
                Code::ResourceExhausted,
            ),
            (VerbError::Unavailable("d".into()), Code::Unavailable),
            (VerbError::Aborted("e".into()), Code::Aborted),
            (VerbError::Internal("f\nsecond line".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let message = e.message().to_string();
            assert_eq!(e.to_string(), message);
            // The metrics label is the one the gRPC code had.
            assert_eq!(e.outcome(), ate_tls::telemetry::code_label(code));
            let s = status(e);
            assert_eq!(s.code(), code);
            assert_eq!(s.message(), message);
        }
    }

    #[test]
    fn a_start_request_decodes_whole() {
        let req = start(|_| {}).unwrap();
        assert_eq!(req.workload.actor, ActorRef::new("ns", "a-1"));
        assert_eq!(req.workload.uid, "uid-1");
        assert_eq!(req.workload.template, "tpl");
        assert_eq!(req.workload.worker_id, "w-1");
        assert_eq!(req.workload.activation, 7);
        assert_eq!(
            req.workload.spec,
            ate_proto::spec_from_wire(&wire_spec()).unwrap()
        );
        assert_eq!(req.generation_dir, Some(PathBuf::from("/gens/1")));
        assert_eq!(req.fidelity, Some(Fidelity::Memory));
        // A cold boot: no generation, no fidelity.
        let cold = start(|r| {
            r.generation_dir.clear();
            r.fidelity = 0;
        })
        .unwrap();
        assert_eq!((cold.generation_dir, cold.fidelity), (None, None));
    }

    #[test]
    fn a_bad_start_request_is_refused_as_before() {
        assert_eq!(
            seen(start(|r| r.workload = None)),
            refused("workload missing")
        );
        assert_eq!(
            seen(start(|r| r.workload.as_mut().unwrap().actor = None)),
            refused("actor ref missing")
        );
        let bad_name = seen(start(|r| {
            r.workload.as_mut().unwrap().actor.as_mut().unwrap().name = "A_1".into()
        }));
        assert_eq!(bad_name.0, Code::InvalidArgument);
        assert!(bad_name.1.contains("actor.name"), "{}", bad_name.1);
        let bad_space = seen(start(|r| {
            r.workload
                .as_mut()
                .unwrap()
                .actor
                .as_mut()
                .unwrap()
                .atespace = String::new()
        }));
        assert!(bad_space.1.contains("actor.atespace"), "{}", bad_space.1);
        assert_eq!(
            seen(start(|r| r.workload.as_mut().unwrap().spec = None)),
            refused("workload.spec missing")
        );
        let mut no_resources = wire_spec();
        no_resources.resources = None;
        let why = ate_proto::spec_from_wire(&no_resources).unwrap_err();
        assert_eq!(
            seen(start(
                |r| r.workload.as_mut().unwrap().spec = Some(no_resources)
            )),
            refused(&format!("workload.spec: {why}"))
        );
        assert_eq!(
            seen(start(|r| r.fidelity = 9)),
            refused("unknown fidelity 9")
        );
        assert_eq!(
            seen(start(|r| r.generation_dir.clear())),
            refused("a fidelity was given without a generation_dir")
        );
    }

    #[test]
    fn a_checkpoint_request_decodes_and_needs_no_spec() {
        let req = checkpoint(|r| r.workload.as_mut().unwrap().spec = None).unwrap();
        assert_eq!(req.actor, ActorRef::new("ns", "a-1"));
        assert_eq!((req.worker_id.as_str(), req.activation), ("w-1", 7));
        assert_eq!(req.generation_dir, PathBuf::from("/gens/2"));
        assert_eq!(req.fidelity, None);
        assert_eq!(
            (req.generation, req.uuid.as_str(), req.node.as_str()),
            (2, "u-2", "n-1")
        );
        assert_eq!(req.boot_id, "b-1");
        // 0: the worker's own grace.
        assert_eq!(req.grace, None);
        let req = checkpoint(|r| {
            r.grace_ms = 1500;
            r.fidelity = Fidelity::Volumes.wire();
        })
        .unwrap();
        assert_eq!(req.grace, Some(Duration::from_millis(1500)));
        assert_eq!(req.fidelity, Some(Fidelity::Volumes));
    }

    #[test]
    fn a_bad_checkpoint_request_is_refused_as_before() {
        assert_eq!(
            seen(checkpoint(|r| r.workload = None)),
            refused("workload missing")
        );
        assert_eq!(
            seen(checkpoint(|r| r.workload.as_mut().unwrap().actor = None)),
            refused("actor ref missing")
        );
        assert_eq!(
            seen(checkpoint(|r| r.generation_dir.clear())),
            refused("generation_dir missing")
        );
        assert_eq!(
            seen(checkpoint(|r| r.generation_dir = "gens/2".into())),
            refused("generation_dir must be absolute")
        );
        assert_eq!(
            seen(checkpoint(|r| r.fidelity = -1)),
            refused("unknown fidelity -1")
        );
    }

    #[test]
    fn a_stop_request_decodes_its_activation_bound() {
        let stop = |activation_at_most| {
            stop_request(v1::WorkerStopRequest {
                actor: Some(v1::ObjectRef {
                    atespace: "ns".into(),
                    name: "a-1".into(),
                }),
                activation_at_most,
            })
        };
        assert_eq!(
            stop(0).unwrap(),
            StopRequest {
                actor: ActorRef::new("ns", "a-1"),
                activation_at_most: None
            }
        );
        assert_eq!(stop(5).unwrap().activation_at_most, Some(5));
        assert_eq!(
            seen(stop_request(v1::WorkerStopRequest::default())),
            refused("actor ref missing")
        );
    }

    #[test]
    fn replies_carry_every_field() {
        let r = checkpoint_reply(CheckpointReply {
            epoch: 3,
            fidelity: Fidelity::Rootfs,
            reason: "why".into(),
            size_bytes: 42,
            checksum: "sum".into(),
            kept_frozen: true,
        });
        assert_eq!(
            r,
            v1::WorkerCheckpointReply {
                epoch: 3,
                fidelity: Fidelity::Rootfs.wire(),
                reason: "why".into(),
                size_bytes: 42,
                checksum: "sum".into(),
                kept_frozen: true,
            }
        );
        assert_eq!(
            start_reply(StartReply {
                epoch: 3,
                ready_ms: 9
            }),
            v1::WorkerStartReply {
                epoch: 3,
                ready_ms: 9
            }
        );
        assert_eq!(
            stop_reply(StopReply { epoch: 3 }),
            v1::WorkerStopReply { epoch: 3 }
        );
        let exited = ActorActivity {
            actor: ActorRef::new("ns", "a-1"),
            open_streams: 0,
            last_activity_unix_ms: 1000,
            exited: true,
            exit_code: 137,
            last_log_lines: "bye".into(),
            idle_timeout_seconds: 60,
            activation: 0,
            crash_reason: "lazy memory restore failed: x".into(),
        };
        let r = activity_reply(ActivityReport {
            epoch: 3,
            actors: vec![exited],
            draining: true,
        });
        assert_eq!(
            r,
            v1::WorkerActivityReply {
                epoch: 3,
                actors: vec![v1::ActorActivity {
                    actor: Some(v1::ObjectRef {
                        atespace: "ns".into(),
                        name: "a-1".into()
                    }),
                    open_streams: 0,
                    last_activity_unix_ms: 1000,
                    exited: true,
                    exit_code: 137,
                    last_log_lines: "bye".into(),
                    idle_timeout_seconds: 60,
                    activation: 0,
                    crash_reason: "lazy memory restore failed: x".into(),
                }],
                draining: true,
            }
        );
    }

    #[test]
    fn an_adoption_record_round_trips() {
        let workload = start(|_| {}).unwrap().workload;
        for (pid, page_source_pid) in [(Some(41), Some(42)), (None, None)] {
            let record = AdoptionRecord {
                workload: workload.clone(),
                pid,
                page_source_pid,
            };
            let bytes = adoption_to_bytes(&record);
            assert_eq!(adoption_from_bytes(&bytes).unwrap(), record);
            assert_eq!(adoption_pid_from_bytes(&bytes).unwrap(), pid);
        }
    }

    #[test]
    fn an_adoption_record_written_from_the_wire_reads_the_same() {
        // What earlier workers wrote: the workload as the node sent it.
        let bytes = prost::Message::encode_to_vec(&v1::AdoptionRecord {
            workload: Some(wire_workload()),
            pid: 41,
            page_source_pid: 0,
        });
        let record = adoption_from_bytes(&bytes).unwrap();
        assert_eq!(record.workload, start(|_| {}).unwrap().workload);
        assert_eq!((record.pid, record.page_source_pid), (Some(41), None));
    }

    #[test]
    fn an_unusable_adoption_record_says_why() {
        let encode = |workload: Option<v1::Workload>| {
            prost::Message::encode_to_vec(&v1::AdoptionRecord {
                workload,
                pid: 41,
                page_source_pid: 0,
            })
        };
        let garbage = adoption_from_bytes(b"\xff\xff\xff").unwrap_err();
        assert!(
            garbage.starts_with("adoption record unreadable: "),
            "{garbage}"
        );
        assert!(adoption_pid_from_bytes(b"\xff\xff\xff").is_err());
        assert_eq!(
            adoption_from_bytes(&encode(None)).unwrap_err(),
            "actor ref missing"
        );
        let mut no_spec = wire_workload();
        no_spec.spec = None;
        assert_eq!(
            adoption_from_bytes(&encode(Some(no_spec.clone()))).unwrap_err(),
            "adoption record has no spec"
        );
        // The pid alone is still read (the node's liveness check needs no spec).
        assert_eq!(
            adoption_pid_from_bytes(&encode(Some(no_spec))).unwrap(),
            Some(41)
        );
        let mut bad_spec = wire_workload();
        if let Some(s) = bad_spec.spec.as_mut() {
            s.resources = None;
        }
        assert_eq!(
            adoption_from_bytes(&encode(Some(bad_spec))).unwrap_err(),
            "adoption record spec invalid"
        );
    }
}
