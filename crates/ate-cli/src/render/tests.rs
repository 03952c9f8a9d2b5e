//! Golden tests of the tables and views `ate get` prints.

use super::*;

fn actors() -> Vec<ActorView> {
    let running = v1::Actor {
        atespace: "ate-demo".into(),
        name: "counter-1".into(),
        uid: "u-1".into(),
        template: "ate-demo/counter".into(),
        state: ActorState::Running.wire(),
        worker_assignment: Some(v1::WorkerAssignment {
            worker_id: "worker-1".into(),
            addresses: vec!["127.0.0.2:8443".into()],
            ..Default::default()
        }),
        generation: 3,
        ..Default::default()
    };
    let suspended = v1::Actor {
        atespace: "ate-demo".into(),
        name: "c2".into(),
        uid: "u-2".into(),
        template: "ate-demo/counter".into(),
        state: ActorState::Suspended.wire(),
        ..Default::default()
    };
    vec![(&running).into(), (&suspended).into()]
}

#[test]
fn actor_table_golden() {
    let out = render_list(&actors(), actors_table, Format::Table).unwrap();
    let expected = "\
ATESPACE   NAME        STATE       TEMPLATE           WORKER     GENERATION
ate-demo   counter-1   RUNNING     ate-demo/counter   worker-1   3
ate-demo   c2          SUSPENDED   ate-demo/counter   -          0
";
    assert_eq!(out, expected);
}

#[test]
fn actor_json_golden() {
    let out = render_list(&actors()[..1], actors_table, Format::Json).unwrap();
    let expected = r#"[
  {
    "atespace": "ate-demo",
    "name": "counter-1",
    "uid": "u-1",
    "template": "ate-demo/counter",
    "state": "ACTOR_STATE_RUNNING",
    "worker": "worker-1",
    "addresses": [
      "127.0.0.2:8443"
    ],
    "generation": 3
  }
]
"#;
    assert_eq!(out, expected);
}

#[test]
fn actor_wide_table_has_a_short_last_error() {
    let mut views = actors();
    views[1].last_error = "all processes exited (code 3) on worker worker-1; last log lines:\n\
                               exiting with code 3 as asked\n"
        .into();
    let out = render_list(&views, actors_wide_table, Format::Wide).unwrap();
    let expected = "\
ATESPACE   NAME        STATE       TEMPLATE           WORKER     GENERATION   LAST ERROR
ate-demo   counter-1   RUNNING     ate-demo/counter   worker-1   3            -
ate-demo   c2          SUSPENDED   ate-demo/counter   -          0            all processes exited (code 3) on worker worker-1; last log lines:…
";
    assert_eq!(out, expected);
}

#[test]
fn short_error_is_one_bounded_line() {
    assert_eq!(short_error(""), "-");
    assert_eq!(short_error("  \n "), "-");
    assert_eq!(short_error("probe   failed"), "probe failed");
    let long = "é".repeat(200);
    let s = short_error(&long);
    assert_eq!(s.chars().count(), LAST_ERROR_CHARS);
    assert!(s.ends_with('…') && !s.contains('\n'));
}

fn generations() -> Vec<GenerationView> {
    let snapshot = |generation: u64, durable: DurableStatus| v1::Snapshot {
        generation,
        uuid: format!("u-{generation}"),
        fidelity: Fidelity::Memory.wire(),
        node: "node-1".into(),
        local_path: format!("/var/lib/ate/snapshots/ns/c/{generation}-u-{generation}"),
        durable_uri: format!("file:///d/ns/c/{generation}-u-{generation}"),
        durable_status: durable.wire(),
        size_bytes: 1 << 20,
        // 2025-06-02T09:14:31Z
        create_time_unix_ms: 1_748_855_671_000 + generation as i64,
        ..Default::default()
    };
    let damaged = v1::Generation {
        snapshot: Some(snapshot(3, DurableStatus::Completed)),
        local_damage: "rootfs.tar: sha256 aa, manifest says bb".into(),
        durable_damage: "rootfs.tar: size 10 bytes, manifest says 20".into(),
        skipped: true,
        local_usable: true,
        next: false,
    };
    let durable_left = v1::Generation {
        snapshot: Some(snapshot(2, DurableStatus::Completed)),
        local_damage: "criu/pages-1.img chunk 3 is damaged".into(),
        local_usable: true,
        next: true,
        ..Default::default()
    };
    let pending = v1::Generation {
        snapshot: Some(v1::Snapshot {
            durable_uri: String::new(),
            ..snapshot(1, DurableStatus::Pending)
        }),
        local_usable: false,
        ..Default::default()
    };
    [damaged, durable_left, pending]
        .iter()
        .map(GenerationView::from)
        .collect()
}

#[test]
fn generations_table_golden() {
    let out = render_list(&generations(), generations_table, Format::Table).unwrap();
    let expected = "\
GENERATION   CREATED                FIDELITY   LOCAL                  DURABLE               STATUS                          NEXT   REASON
3            2025-06-02T09:14:31Z   memory     node-1 (damaged)       COMPLETED (damaged)   damaged, skipped                       node-local: rootfs.tar: sha256 aa, manifest says bb; durable: rootfs.tar: size …
2            2025-06-02T09:14:31Z   memory     node-1 (damaged)       COMPLETED             damaged (durable copy intact)   *      node-local: criu/pages-1.img chunk 3 is damaged
1            2025-06-02T09:14:31Z   memory     node-1 (unreachable)   PENDING               intact                                 -
";
    assert_eq!(out, expected);
}

#[test]
fn generations_json_names_every_copy() {
    let out = render_list(&generations()[..1], generations_table, Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!([{
            "generation": 3,
            "created": "2025-06-02T09:14:31Z",
            "fidelity": "memory",
            "uuid": "u-3",
            "node": "node-1",
            "localPath": "/var/lib/ate/snapshots/ns/c/3-u-3",
            "localUsable": true,
            "durable": "COMPLETED",
            "durableUri": "file:///d/ns/c/3-u-3",
            "sizeBytes": 1048576,
            "status": "damaged",
            "localDamage": "rootfs.tar: sha256 aa, manifest says bb",
            "durableDamage": "rootfs.tar: size 10 bytes, manifest says 20",
            "skipped": true,
            "next": false
        }])
    );
}

#[test]
fn worker_table_golden() {
    let w = v1::Worker {
        id: "worker-1".into(),
        node: "node-1".into(),
        status: "ACTIVE".into(),
        addresses: vec!["127.0.0.2:8443".into()],
        capacity: Some(v1::Capacity {
            cpu_millis: 2000,
            memory_bytes: 4 << 30,
            actor_slots: 8,
        }),
        used: Some(v1::Capacity {
            cpu_millis: 250,
            memory_bytes: 64 << 20,
            actor_slots: 1,
        }),
        epoch: 7,
        ..Default::default()
    };
    let out = render_list(&[WorkerView::from(&w)], workers_table, Format::Table).unwrap();
    let expected = "\
ID         NODE     STATUS   ADDRESS          SLOTS   CPU REQ   CPU USED   CPU CAP   MEMORY     EPOCH
worker-1   node-1   ACTIVE   127.0.0.2:8443   1/8     250m      0          2         64Mi/4Gi   7
";
    assert_eq!(out, expected);
    // Overcommitted: requested, used and capacity (the machine's CPU × the factor).
    let w = v1::Worker {
        capacity: Some(v1::Capacity {
            cpu_millis: 64_000,
            memory_bytes: 12 << 30,
            actor_slots: 256,
        }),
        used: Some(v1::Capacity {
            cpu_millis: 25_000,
            memory_bytes: 6400 << 20,
            actor_slots: 100,
        }),
        cpu_physical_millis: 2000,
        cpu_usage_millis: 40,
        ..w
    };
    let out = render_list(&[WorkerView::from(&w)], workers_table, Format::Table).unwrap();
    let expected = "\
ID         NODE     STATUS   ADDRESS          SLOTS     CPU REQ   CPU USED   CPU CAP     MEMORY        EPOCH
worker-1   node-1   ACTIVE   127.0.0.2:8443   100/256   25        40m        64 (2×32)   6400Mi/12Gi   7
";
    assert_eq!(out, expected);
    assert_eq!(cpu_capacity(3000, 2000), "3 (2×1.5)");
    assert_eq!(cpu_capacity(2000, 0), "2");
}
