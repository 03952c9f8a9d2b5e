//! The conversions against the messages and codes callers saw before they moved here.

use ate_worker_client::sandbox::adoption_pid_from_bytes;
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
            external_host_path: String::new(),
            external_shared: false,
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
        assert_eq!(e.outcome(), ate_telemetry::code_label(code));
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
    // (what is wrong with the request, why it is refused)
    type Change = fn(&mut v1::WorkerCheckpointRequest);
    let cases: [(Change, &str); 5] = [
        (|r| r.workload = None, "workload missing"),
        (
            |r| r.workload.as_mut().unwrap().actor = None,
            "actor ref missing",
        ),
        (|r| r.generation_dir.clear(), "generation_dir missing"),
        (
            |r| r.generation_dir = "gens/2".into(),
            "generation_dir must be absolute",
        ),
        (|r| r.fidelity = -1, "unknown fidelity -1"),
    ];
    for (change, why) in cases {
        assert_eq!(seen(checkpoint(change)), refused(why));
    }
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
        damaged_generation: Some("/state/snapshots/ns/a-1/3-u".into()),
        suspend_requested: true,
    };
    let r = activity_reply(ActivityReport {
        epoch: 3,
        actors: vec![exited],
        draining: true,
        frozen: 2,
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
                damaged_generation_dir: "/state/snapshots/ns/a-1/3-u".into(),
                suspend_requested: true,
                cpu_millis: 0,
                memory_bytes: 0,
                active_since_unix_ms: 0,
            }],
            draining: true,
            frozen_actors: 2,
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
