//! The decoding of NodeService requests, the replies, and the status of each error.

use super::*;
use crate::types::{CallCode, CallError};
use tonic::Code;

fn obj(atespace: &str, name: &str) -> v1::ObjectRef {
    v1::ObjectRef {
        atespace: atespace.into(),
        name: name.into(),
    }
}

/// The code and message the api would get for a refused request.
fn refused<T>(r: Result<T, AgentError>) -> Option<(Code, String)> {
    r.err().map(|e| {
        let s = status(&e);
        (s.code(), s.message().to_string())
    })
}

fn spec() -> v1::TemplateSpec {
    v1::TemplateSpec {
        containers: vec![v1::Container {
            name: "c".into(),
            image: "oci-layout:/x".into(),
            ..Default::default()
        }],
        resources: Some(v1::Resources {
            cpu_millis: 100,
            memory_bytes: 64 << 20,
        }),
        ..Default::default()
    }
}

fn wire_workload() -> v1::Workload {
    v1::Workload {
        actor: Some(obj("ns", "a")),
        uid: "uid-1".into(),
        template: "ns/t".into(),
        spec: Some(spec()),
        worker_id: "w-1".into(),
        activation: 7,
    }
}

#[test]
fn actor_validates_the_actor() {
    assert_eq!(
        actor(Some(obj("ns-1", "counter-1"))).ok(),
        Some(ActorRef::new("ns-1", "counter-1"))
    );
    assert_eq!(
        refused(actor(None)),
        Some((Code::InvalidArgument, "invalid actor: missing".to_string()))
    );
    for (atespace, name, field) in [
        ("", "a", "actor.atespace"),
        ("Bad_Space", "a", "actor.atespace"),
        ("ns", "", "actor.name"),
        ("ns", "../etc", "actor.name"),
    ] {
        let (code, message) = refused(actor(Some(obj(atespace, name))))
            .unwrap_or_else(|| panic!("{atespace:?}/{name:?} accepted"));
        assert_eq!(code, Code::InvalidArgument, "{atespace:?}/{name:?}");
        assert!(message.contains(field), "{atespace:?}/{name:?}: {message}");
    }
}

#[test]
fn workload_validates_the_workloads_actor() {
    let mut w = v1::Workload {
        actor: Some(obj("ns", "a-1")),
        ..Default::default()
    };
    assert_eq!(
        workload(Some(w.clone()), SpecUse::Start)
            .ok()
            .map(|w| w.actor),
        Some(ActorRef::new("ns", "a-1"))
    );
    w.actor = Some(obj("ns", "A/1"));
    let err = refused(workload(Some(w.clone()), SpecUse::Start));
    assert!(
        matches!(&err, Some((Code::InvalidArgument, m)) if m.contains("workload.actor.name")),
        "{err:?}"
    );
    w.actor = Some(obj("NS", "a"));
    let err = refused(workload(Some(w.clone()), SpecUse::Start));
    assert!(
        matches!(&err, Some((Code::InvalidArgument, m)) if m.contains("workload.actor.atespace")),
        "{err:?}"
    );
    w.actor = None;
    assert_eq!(
        refused(workload(Some(w), SpecUse::Start)),
        Some((
            Code::InvalidArgument,
            "invalid workload.actor: missing".to_string()
        ))
    );
    assert_eq!(
        refused(workload(None, SpecUse::Start)),
        Some((
            Code::InvalidArgument,
            "invalid workload: missing".to_string()
        ))
    );
}

#[test]
fn a_workload_reaches_the_worker_as_the_api_sent_it() {
    // The api sends `spec_to_wire` of a validated spec: decoded and encoded again, the
    // worker gets the same message.
    let sent = v1::Workload {
        spec: ate_proto::spec_from_wire(&spec())
            .ok()
            .map(|s| ate_proto::spec_to_wire(&s)),
        ..wire_workload()
    };
    let decoded = run(v1::RunRequest {
        workload: Some(sent.clone()),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(decoded.actor, ActorRef::new("ns", "a"));
    assert_eq!((decoded.uid.as_str(), decoded.activation), ("uid-1", 7));
    assert_eq!(wire::workload_to_wire(&decoded), sent);
    // No spec: passed on as none (the worker refuses that start itself).
    let bare = v1::Workload {
        spec: None,
        ..wire_workload()
    };
    let decoded = run(v1::RunRequest {
        workload: Some(bare.clone()),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(wire::workload_to_wire(&decoded), bare);
}

#[test]
fn an_invalid_spec_is_refused_with_the_workers_message_unless_only_named() {
    let mut bad = spec();
    bad.resources = None;
    // What the worker's Start answers for it (`workload.spec: {e}`).
    let workers_answer = ate_proto::spec_from_wire(&bad)
        .err()
        .map(|e| (Code::InvalidArgument, format!("workload.spec: {e}")));
    assert!(workers_answer.is_some());
    let w = v1::Workload {
        spec: Some(bad),
        ..wire_workload()
    };
    assert_eq!(
        refused(run(v1::RunRequest {
            workload: Some(w.clone()),
        })),
        workers_answer
    );
    let snapshot = Some(v1::Snapshot::default());
    assert_eq!(
        refused(restore(v1::RestoreRequest {
            workload: Some(w.clone()),
            snapshot,
            fidelity: Fidelity::Memory.wire(),
        })),
        workers_answer
    );
    // A checkpoint does not need the spec: the suspend goes on, without it.
    let c = checkpoint(v1::CheckpointRequest {
        workload: Some(w),
        generation: 1,
        uuid: "u-1".into(),
        fidelity: Fidelity::Memory.wire(),
        durable: false,
        grace_ms: 0,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.workload.spec, None);
}

#[test]
fn restore_and_checkpoint_refuse_bad_input_in_the_verbs_order() {
    let restore_of = |workload, snapshot, fidelity| {
        restore(v1::RestoreRequest {
            workload,
            snapshot,
            fidelity,
        })
    };
    let memory = Fidelity::Memory.wire();
    let some_snap = Some(v1::Snapshot::default());
    assert_eq!(
        refused(restore_of(None, None, 999)),
        Some((
            Code::InvalidArgument,
            "invalid workload: missing".to_string()
        ))
    );
    assert_eq!(
        refused(restore_of(Some(wire_workload()), None, 999)),
        Some((
            Code::InvalidArgument,
            "invalid snapshot: missing".to_string()
        ))
    );
    assert_eq!(
        refused(restore_of(Some(wire_workload()), some_snap.clone(), 999)),
        Some((Code::InvalidArgument, "invalid fidelity: 999".to_string()))
    );
    assert_eq!(
        refused(restore_of(Some(wire_workload()), some_snap, 0)),
        Some((Code::InvalidArgument, "invalid fidelity: 0".to_string()))
    );
    let ok = restore_of(
        Some(wire_workload()),
        Some(v1::Snapshot {
            generation: 3,
            ..Default::default()
        }),
        memory,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((ok.snapshot.generation, ok.fidelity), (3, Fidelity::Memory));

    let checkpoint_of = |workload, fidelity| {
        checkpoint(v1::CheckpointRequest {
            workload,
            generation: 1,
            uuid: "u-1".into(),
            fidelity,
            durable: true,
            grace_ms: 250,
        })
    };
    assert_eq!(
        refused(checkpoint_of(None, 999)),
        Some((
            Code::InvalidArgument,
            "invalid workload: missing".to_string()
        ))
    );
    assert_eq!(
        refused(checkpoint_of(Some(wire_workload()), 999)),
        Some((Code::InvalidArgument, "invalid fidelity: 999".to_string()))
    );
    let ok = checkpoint_of(Some(wire_workload()), memory).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (ok.generation, ok.uuid.as_str(), ok.durable, ok.grace_ms),
        (1, "u-1", true, 250)
    );
}

#[test]
fn detach_needs_an_actor_and_keeps_the_snapshots() {
    assert_eq!(
        refused(detach(v1::DetachRequest::default())),
        Some((Code::InvalidArgument, "invalid actor: missing".to_string()))
    );
    let snap = v1::Snapshot {
        generation: 2,
        durable_status: ate_core::DurableStatus::Completed.wire(),
        ..Default::default()
    };
    // Not validated: Detach only keys and names with it.
    let (actor, snapshots) = detach(v1::DetachRequest {
        actor: Some(obj("NS", "a")),
        snapshots: vec![snap.clone()],
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(actor, ActorRef::new("NS", "a"));
    assert_eq!(detach_reply(snapshots).snapshots, vec![snap]);
}

#[test]
fn each_error_gets_the_status_code_the_api_depends_on() {
    let io = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    let cases = [
        (
            AgentError::Invalid("invalid fidelity: 9".into()),
            Code::InvalidArgument,
        ),
        (
            AgentError::WorkerNotRunning {
                worker: "w-1".into(),
                node: "n".into(),
            },
            Code::Unavailable,
        ),
        (
            AgentError::NoDurableCopy {
                generation: 3,
                uuid: "u".into(),
                node: "n".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            AgentError::Fetch {
                generation: 3,
                uri: "s3://b/k".into(),
                for_what: " for a lazy restore",
                error: "gone".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            AgentError::NotReplaced {
                refused: "bad".into(),
                error: "gone".into(),
            },
            Code::FailedPrecondition,
        ),
        (
            AgentError::LocalFile {
                verb: "read",
                path: "/l".into(),
                source: io(),
            },
            Code::Internal,
        ),
        (AgentError::DownloadLockPoisoned, Code::Internal),
        (
            AgentError::DeleteDurable {
                uri: "s3://b/k".into(),
                error: "denied".into(),
            },
            Code::Unavailable,
        ),
        (
            AgentError::Worker(CallError::new(CallCode::ResourceExhausted, "no slot")),
            Code::ResourceExhausted,
        ),
        (
            AgentError::Worker(CallError::new(CallCode::DataLoss, "checksum")),
            Code::DataLoss,
        ),
    ];
    for (e, code) in cases {
        let s = status(&e);
        assert_eq!(s.code(), code, "{e:?}");
        assert_eq!(s.message(), e.to_string(), "{e:?}");
        assert_eq!(ate_proto::damage::damage_of(&s), None, "{e:?}");
    }
    // An error caused by damaged copies: the same code and text, the damage as the details.
    let snap = crate::types::Snapshot {
        generation: 3,
        uuid: "u-3".into(),
        ..Default::default()
    };
    let refused = AgentError::Worker(CallError::new(
        CallCode::FailedPrecondition,
        "generation /g: rootfs.tar: sha256 a, manifest says b",
    ));
    let damaged = refused.with_damage(
        &snap,
        Some("rootfs.tar: sha256 a, manifest says b".into()),
        None,
    );
    // A second finding adds the other copy and keeps the first.
    let damaged = damaged.with_damage(
        &snap,
        None,
        Some("rootfs.tar: size 1, manifest says 2".into()),
    );
    let s = status(&damaged);
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert_eq!(
        s.message(),
        "generation /g: rootfs.tar: sha256 a, manifest says b"
    );
    assert_eq!(s.message(), damaged.to_string());
    assert_eq!(
        ate_proto::damage::damage_of(&s),
        Some(ate_proto::v1::GenerationDamage {
            generation: 3,
            uuid: "u-3".into(),
            local: "rootfs.tar: sha256 a, manifest says b".into(),
            durable: "rootfs.tar: size 1, manifest says 2".into(),
        })
    );
    // The messages the api and the tests match on.
    let messages = [
        (
            AgentError::WorkerNotRunning {
                worker: "w-1".into(),
                node: "node-t".into(),
            },
            "worker w-1 is not running on node node-t",
        ),
        (
            AgentError::NoDurableCopy {
                generation: 3,
                uuid: "u-1".into(),
                node: "node-t".into(),
            },
            "generation 3 (u-1) is not on node node-t and has no durable copy",
        ),
        (
            AgentError::Fetch {
                generation: 3,
                uri: "file:///d".into(),
                for_what: "",
                error: "gone".into(),
            },
            "cannot fetch generation 3 from file:///d: gone",
        ),
        (
            AgentError::Fetch {
                generation: 3,
                uri: "file:///d".into(),
                for_what: " for a lazy restore",
                error: "gone".into(),
            },
            "cannot fetch generation 3 from file:///d for a lazy restore: gone",
        ),
        (
            AgentError::NotReplaced {
                refused: "checksum mismatch".into(),
                error: "gone".into(),
            },
            "checksum mismatch; its durable copy could not replace it: gone",
        ),
        (
            AgentError::LocalFile {
                verb: "remove",
                path: "/l/a.log".into(),
                source: std::io::Error::other("busy"),
            },
            "cannot remove /l/a.log: busy",
        ),
        (
            AgentError::DeleteDurable {
                uri: "s3://b/k".into(),
                error: "denied".into(),
            },
            "cannot delete s3://b/k: denied",
        ),
        (
            AgentError::Worker(CallError::new(CallCode::Aborted, "busy")),
            "busy",
        ),
    ];
    for (e, message) in messages {
        assert_eq!(status(&e).message(), message);
    }
}

#[test]
fn replies_carry_every_field() {
    assert_eq!(
        node_reply(OnWorker {
            worker_id: "w-1".into(),
            epoch: 4,
            addresses: vec!["127.0.0.1:1".into()],
        }),
        v1::NodeReply {
            worker_id: "w-1".into(),
            epoch: 4,
            addresses: vec!["127.0.0.1:1".into()],
        }
    );
    assert_eq!(
        read_log_reply(LogPart {
            data: b"x".to_vec(),
            next_offset: 1,
            found: true,
        }),
        v1::ReadLogReply {
            data: b"x".to_vec(),
            next_offset: 1,
            found: true,
        }
    );
    let reply = checkpoint_reply(Checkpointed {
        snapshot: Snapshot {
            generation: 5,
            ..Default::default()
        },
        epoch: 2,
        kept_frozen: true,
    });
    assert_eq!(
        (
            reply.snapshot.map(|s| s.generation),
            reply.epoch,
            reply.kept_frozen
        ),
        (Some(5), 2, true)
    );
    let stop = stop(v1::StopRequest {
        actor: None,
        worker_id: "w-9".into(),
    });
    assert_eq!((stop.actor, stop.worker_id.as_str()), (None, "w-9"));
}
