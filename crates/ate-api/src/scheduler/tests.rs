//! Unit tests of placement: which worker an actor goes to, and when none can take it.

use super::*;

fn worker(id: &str, node: &str, slots: u64, used: u64) -> WorkerRecord {
    WorkerRecord {
        id: id.into(),
        node: node.into(),
        addresses: vec![],
        identity: String::new(),
        labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        sandbox_class: "runc".into(),
        can_restore_memory: true,
        capabilities: vec!["memory:criu".into(), "userns:off".into()],
        capacity: Capacity {
            cpu_millis: 4000,
            memory_bytes: 8 << 30,
            slots,
        },
        used: Capacity {
            cpu_millis: 0,
            memory_bytes: 0,
            slots: used,
        },
        cpu_physical_millis: 0,
        cpu_usage_millis: 0,
        epoch: 1,
        status: WorkerStatus::Active,
        last_heartbeat_ms: 0,
        node_address: String::new(),
        boot_id: String::new(),
    }
}

#[test]
fn filters_and_two_choices() {
    let mut gone = worker("gone", "n1", 8, 0);
    gone.status = WorkerStatus::Gone;
    let workers = vec![
        worker("full", "n1", 2, 2),
        worker("busy", "n1", 8, 6),
        worker("idle", "n2", 8, 0),
        gone,
    ];
    let req = Requirements {
        selector: BTreeMap::new(),
        sandbox_class: "runc",
        node: None,
        demand: Capacity {
            cpu_millis: 100,
            memory_bytes: 1 << 20,
            slots: 1,
        },
        exclude: &[],
        capabilities: &[],
    };
    let ids: Vec<&str> = eligible(&workers, &req)
        .iter()
        .map(|w| w.id.as_str())
        .collect();
    assert_eq!(ids, ["busy", "idle"]);
    // With exactly two candidates both are sampled, so the less loaded always wins.
    for _ in 0..20 {
        assert_eq!(
            pick(&eligible(&workers, &req)).map(|w| w.id.as_str()),
            Some("idle")
        );
    }
    let on_n1 = Requirements {
        node: Some("n1"),
        ..req
    };
    assert_eq!(eligible(&workers, &on_n1).len(), 1);
    let sel = Requirements {
        selector: BTreeMap::from([("zone".into(), "b".into())]),
        node: None,
        ..on_n1
    };
    assert!(eligible(&workers, &sel).is_empty());
    assert!(pick(&[]).is_none());
}

#[test]
fn frozen_hint_wins_only_when_eligible() {
    let workers = [worker("a", "n1", 8, 0), worker("b", "n1", 8, 7)];
    let all: Vec<&WorkerRecord> = workers.iter().collect();
    // The fuller worker still wins when it holds the frozen copy.
    for _ in 0..20 {
        assert_eq!(
            pick_preferring(&all, Some("b")).map(|w| w.id.as_str()),
            Some("b")
        );
    }
    // Not a candidate (full, excluded, gone): ordinary choice.
    let only_a: Vec<&WorkerRecord> = workers.iter().filter(|w| w.id == "a").collect();
    assert_eq!(
        pick_preferring(&only_a, Some("b")).map(|w| w.id.as_str()),
        Some("a")
    );
}

fn one_slot() -> Capacity {
    Capacity {
        cpu_millis: 100,
        memory_bytes: 1 << 20,
        slots: 1,
    }
}

fn needs(class: &str) -> Needs {
    Needs {
        selector: BTreeMap::new(),
        sandbox_class: class.into(),
        demand: one_slot(),
        capabilities: Vec::new(),
    }
}

fn req(class: &str) -> Requirements<'_> {
    Requirements {
        selector: BTreeMap::new(),
        sandbox_class: class,
        node: None,
        demand: one_slot(),
        exclude: &[],
        capabilities: &[],
    }
}

fn ids(ws: &[&WorkerRecord]) -> Vec<String> {
    ws.iter().map(|w| w.id.clone()).collect()
}

#[test]
fn waiters_are_served_oldest_first() {
    let q = Waiters::new(Duration::from_secs(1), Duration::from_secs(6));
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    q.no_room("ns/b", needs("runc"), t0);
    q.no_room("ns/c", needs("runc"), t0 + ms(100));
    q.no_room("ns/d", needs("runc"), t0 + ms(200));
    // A later failure keeps the waiter's place.
    q.no_room("ns/b", needs("runc"), t0 + ms(300));
    assert_eq!(q.queued(t0 + ms(300)), ["ns/b", "ns/c", "ns/d"]);

    // One free slot: only the oldest waiter may take it.
    let workers = [worker("w1", "n1", 2, 1)];
    let now = t0 + ms(400);
    assert!(
        q.admissible("ns/new", &req("runc"), &workers, now)
            .is_empty()
    );
    assert!(q.admissible("ns/d", &req("runc"), &workers, now).is_empty());
    assert!(q.admissible("ns/c", &req("runc"), &workers, now).is_empty());
    assert_eq!(
        ids(&q.admissible("ns/b", &req("runc"), &workers, now)),
        ["w1"]
    );
    // b is bound: c is next.
    q.remove("ns/b");
    assert_eq!(
        ids(&q.admissible("ns/c", &req("runc"), &workers, now)),
        ["w1"]
    );
    assert!(q.admissible("ns/d", &req("runc"), &workers, now).is_empty());
    // Two free slots: the oldest waiter's room is set aside, the second is free.
    let two = [worker("w1", "n1", 3, 1)];
    assert_eq!(ids(&q.admissible("ns/d", &req("runc"), &two, now)), ["w1"]);
    assert!(q.admissible("ns/new", &req("runc"), &two, now).is_empty());
    // No waiters, no free room: nothing changes.
    let full = [worker("w1", "n1", 1, 1)];
    assert!(q.admissible("ns/c", &req("runc"), &full, now).is_empty());
    let empty = Waiters::default();
    assert_eq!(
        ids(&empty.admissible("ns/x", &req("runc"), &workers, now)),
        ["w1"]
    );
}

#[test]
fn a_silent_waiter_stops_holding_room_and_expires() {
    let q = Waiters::new(Duration::from_secs(1), Duration::from_secs(6));
    let t0 = Instant::now();
    let s = Duration::from_millis;
    q.no_room("ns/b", needs("runc"), t0);
    let workers = [worker("w1", "n1", 1, 0)];
    // Within the hold the room is b's.
    assert!(
        q.admissible("ns/c", &req("runc"), &workers, t0 + s(900))
            .is_empty()
    );
    // b did not try again within the hold: a newcomer gets the room, b keeps its place.
    assert_eq!(
        ids(&q.admissible("ns/c", &req("runc"), &workers, t0 + s(1100))),
        ["w1"]
    );
    assert_eq!(q.queued(t0 + s(1100)), ["ns/b"]);
    // b asks again (its client came back): it holds the room again, still first.
    q.no_room("ns/c", needs("runc"), t0 + s(1200));
    q.no_room("ns/b", needs("runc"), t0 + s(1300));
    assert_eq!(q.queued(t0 + s(1300)), ["ns/b", "ns/c"]);
    assert!(
        q.admissible("ns/c", &req("runc"), &workers, t0 + s(1400))
            .is_empty()
    );
    // Six seconds after its last attempt b is forgotten; c (last seen at 1.2 s) too.
    assert_eq!(q.queued(t0 + s(7250)), ["ns/b"]);
    assert!(q.queued(t0 + s(7400)).is_empty());
    assert_eq!(
        ids(&q.admissible("ns/new", &req("runc"), &workers, t0 + s(7400))),
        ["w1"]
    );
}

#[test]
fn waiters_hold_only_room_they_can_use() {
    let q = Waiters::new(Duration::from_secs(1), Duration::from_secs(6));
    let t0 = Instant::now();
    // An older waiter of another sandbox class holds nothing on runc workers.
    q.no_room("ns/g", needs("gvisor"), t0);
    let workers = [worker("w1", "n1", 1, 0)];
    assert_eq!(
        ids(&q.admissible("ns/x", &req("runc"), &workers, t0)),
        ["w1"]
    );
    // A waiter that needs more than any free room sets nothing aside (no head-of-line
    // blocking).
    let mut big = needs("runc");
    big.demand.slots = 2;
    q.no_room("ns/big", big, t0);
    assert_eq!(
        ids(&q.admissible("ns/x", &req("runc"), &workers, t0)),
        ["w1"]
    );
    // An older waiter that can use either of two free workers is given the one the
    // newcomer cannot use (its selector matches only w1).
    q.no_room("ns/any", needs("runc"), t0);
    let mut w2 = worker("w2", "n1", 1, 0);
    w2.labels.insert("zone".into(), "b".into());
    let two = [worker("w1", "n1", 1, 0), w2];
    let zone_a = Requirements {
        selector: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        ..req("runc")
    };
    assert_eq!(ids(&q.admissible("ns/x", &zone_a, &two, t0)), ["w1"]);
    // With only w1 free, that is the older waiter's room: a newcomer is refused.
    assert!(
        q.admissible("ns/y", &req("runc"), &[worker("w1", "n1", 1, 0)], t0)
            .is_empty()
    );
}
#[test]
fn placement_prefers_the_worker_whose_actors_use_less_cpu() {
    // Two workers of 2 cores overcommitted 16×: both hold 10 actors of 250m (2500m booked of
    // 32000m), but the actors of one use 1.5 cores: the idle one wins every time.
    let overcommitted = |id: &str, usage: u64| WorkerRecord {
        capacity: Capacity {
            cpu_millis: 32_000,
            memory_bytes: 8 << 30,
            slots: 256,
        },
        used: Capacity {
            cpu_millis: 2500,
            memory_bytes: 640 << 20,
            slots: 10,
        },
        cpu_physical_millis: 2000,
        cpu_usage_millis: usage,
        ..worker(id, "n1", 256, 10)
    };
    let workers = [overcommitted("busy", 1500), overcommitted("quiet", 20)];
    let r = req("runc");
    for _ in 0..20 {
        assert_eq!(
            pick(&eligible(&workers, &r)).map(|w| w.id.as_str()),
            Some("quiet")
        );
    }
    // Usage is a preference, not admission: the busy worker still has room.
    assert_eq!(ids(&eligible(&workers, &r)), ["busy", "quiet"]);
    // A worker holding many more bookings is still the fuller one when nobody is busy.
    let fuller = WorkerRecord {
        used: Capacity {
            cpu_millis: 25_000,
            memory_bytes: 640 << 20,
            slots: 100,
        },
        ..overcommitted("fuller", 0)
    };
    let workers = [fuller, overcommitted("emptier", 100)];
    assert_eq!(
        pick(&eligible(&workers, &r)).map(|w| w.id.as_str()),
        Some("emptier")
    );
    // Without a reported machine CPU (an older worker), usage counts against its capacity.
    let legacy = WorkerRecord {
        cpu_physical_millis: 0,
        cpu_usage_millis: 3000,
        ..worker("legacy", "n1", 8, 0)
    };
    assert!((load(&legacy) - 0.75).abs() < 1e-9);
}

#[test]
fn overcommitted_cpu_admits_by_bookings_against_the_larger_capacity() {
    // 2 cores × 16: 128 actors of 250m fit, the 129th does not (slots aside).
    let w = WorkerRecord {
        capacity: Capacity {
            cpu_millis: 32_000,
            memory_bytes: 64 << 30,
            slots: 1000,
        },
        used: Capacity {
            cpu_millis: 127 * 250,
            memory_bytes: 127 << 26,
            slots: 127,
        },
        cpu_physical_millis: 2000,
        ..worker("w", "n1", 1000, 127)
    };
    let mut r = req("runc");
    r.demand.cpu_millis = 250;
    assert_eq!(ids(&eligible(std::slice::from_ref(&w), &r)), ["w"]);
    let full = WorkerRecord {
        used: Capacity {
            cpu_millis: 128 * 250,
            ..w.used
        },
        ..w
    };
    assert!(eligible(&[full], &r).is_empty());
}

// ------------------------------------------------------------------ restore capabilities

fn memory_snapshot_needs() -> Vec<String> {
    vec!["memory:criu".to_string(), "userns:off".to_string()]
}

/// A worker without CRIU (it advertises only its user-namespace mode).
fn no_criu(id: &str, slots: u64, used: u64) -> WorkerRecord {
    WorkerRecord {
        can_restore_memory: false,
        capabilities: vec!["userns:off".into()],
        ..worker(id, "n1", slots, used)
    }
}

#[test]
fn memory_snapshots_go_only_to_workers_that_can_restore_them() {
    let need = memory_snapshot_needs();
    let r = Requirements {
        capabilities: &need,
        ..req("runc")
    };
    let workers = [no_criu("plain", 8, 0), worker("criu", "n1", 8, 7)];
    // The fuller worker is the only candidate: the idle one cannot restore the memory.
    assert_eq!(ids(&eligible(&workers, &r)), ["criu"]);
    assert!(missing_everywhere(&workers, &r).is_empty());
    // A cold boot or a file-only restore goes anywhere.
    assert_eq!(ids(&eligible(&workers, &req("runc"))), ["plain", "criu"]);

    // Only workers without CRIU: none eligible, and the reason names the capability.
    let plain = [no_criu("p1", 8, 0), no_criu("p2", 8, 0)];
    assert!(eligible(&plain, &r).is_empty());
    assert_eq!(missing_everywhere(&plain, &r), ["memory:criu"]);

    // A capable worker that is full: the reason is room, not capability.
    let full = [no_criu("p1", 8, 0), worker("criu", "n1", 2, 2)];
    assert!(eligible(&full, &r).is_empty());
    assert!(missing_everywhere(&full, &r).is_empty());

    // No worker passes the other filters (another sandbox class): not a capability problem.
    let gvisor = Requirements {
        sandbox_class: "gvisor",
        ..r
    };
    assert!(missing_everywhere(&plain, &gvisor).is_empty());
}

#[test]
fn user_namespace_mode_must_match() {
    let dumped_in_userns = vec!["memory:criu".to_string(), "userns:on".to_string()];
    let r = Requirements {
        capabilities: &dumped_in_userns,
        ..req("runc")
    };
    let userns = WorkerRecord {
        capabilities: vec![
            "memory:criu".into(),
            "memory:lazy".into(),
            "userns:on".into(),
        ],
        ..worker("userns", "n1", 8, 0)
    };
    let workers = [worker("host-root", "n1", 8, 0), userns];
    assert_eq!(ids(&eligible(&workers, &r)), ["userns"]);
    let without = [worker("host-root", "n1", 8, 0)];
    assert_eq!(missing_everywhere(&without, &r), ["userns:on"]);
    // Each capability offered somewhere, never together: both named.
    let split = [
        WorkerRecord {
            capabilities: vec!["userns:on".into()],
            ..worker("a", "n1", 8, 0)
        },
        worker("b", "n1", 8, 0),
    ];
    assert_eq!(missing_everywhere(&split, &r), ["memory:criu", "userns:on"]);
}

#[test]
fn workers_registered_before_capabilities_are_derived_from_their_memory_flag() {
    let need = memory_snapshot_needs();
    let legacy_generation = ate_core::capability::required(&[], ate_core::Fidelity::Memory);
    let legacy = |id: &str, memory: bool| WorkerRecord {
        can_restore_memory: memory,
        capabilities: Vec::new(),
        ..worker(id, "n1", 8, 0)
    };
    let workers = [legacy("old-criu", true), legacy("old-plain", false)];
    for required in [&need, &legacy_generation] {
        let r = Requirements {
            capabilities: required,
            ..req("runc")
        };
        assert_eq!(ids(&eligible(&workers, &r)), ["old-criu"]);
    }
}

#[test]
fn waiting_memory_resumes_hold_room_only_on_capable_workers() {
    let q = Waiters::default();
    let t0 = Instant::now();
    // An older resume of a memory snapshot waits; the only free room is on a worker without
    // CRIU, which it cannot use: a newcomer with a cold boot may take it.
    q.no_room(
        "ns/memory",
        Needs {
            capabilities: memory_snapshot_needs(),
            ..needs("runc")
        },
        t0,
    );
    let workers = [no_criu("plain", 1, 0)];
    assert_eq!(
        ids(&q.admissible("ns/cold", &req("runc"), &workers, t0)),
        ["plain"]
    );
}

#[test]
fn room_goes_round_the_atespaces_that_wait() {
    let q = Waiters::new(Duration::from_secs(1), Duration::from_secs(6));
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // A flood of "big" first, then two of "small" and one of "third".
    for i in 0..5 {
        q.no_room(&format!("big/a{i}"), needs("runc"), t0 + ms(i));
    }
    q.no_room("small/x", needs("runc"), t0 + ms(10));
    q.no_room("small/y", needs("runc"), t0 + ms(11));
    q.no_room("third/z", needs("runc"), t0 + ms(12));
    let now = t0 + ms(100);
    // The oldest of each atespace, then the second of each, …; oldest first within one.
    assert_eq!(
        q.queued(now),
        [
            "big/a0", "small/x", "third/z", "big/a1", "small/y", "big/a2", "big/a3", "big/a4"
        ]
    );
    // One free slot: the oldest of all may take it, and so may no one else.
    let one = [worker("w1", "n1", 2, 1)];
    assert_eq!(
        ids(&q.admissible("big/a0", &req("runc"), &one, now)),
        ["w1"]
    );
    assert!(q.admissible("big/a1", &req("runc"), &one, now).is_empty());
    assert!(q.admissible("small/x", &req("runc"), &one, now).is_empty());
    q.remove("big/a0");
    // Then small's oldest, though four of big waited longer.
    assert!(q.admissible("big/a1", &req("runc"), &one, now).is_empty());
    assert_eq!(
        ids(&q.admissible("small/x", &req("runc"), &one, now)),
        ["w1"]
    );
    q.remove("small/x");
    assert_eq!(
        ids(&q.admissible("third/z", &req("runc"), &one, now)),
        ["w1"]
    );
    q.remove("third/z");
    // Now big's second (rank 1, older than small/y).
    assert_eq!(
        ids(&q.admissible("big/a1", &req("runc"), &one, now)),
        ["w1"]
    );
    assert!(q.admissible("small/y", &req("runc"), &one, now).is_empty());
    q.remove("big/a1");
    // big has had two turns, small one: small/y, though big/a2 waited longer.
    assert!(q.admissible("big/a2", &req("runc"), &one, now).is_empty());
    assert_eq!(
        ids(&q.admissible("small/y", &req("runc"), &one, now)),
        ["w1"]
    );
    q.remove("small/y");
    // Only big waits now: its waiters oldest first.
    assert_eq!(q.queued(now), ["big/a2", "big/a3", "big/a4"]);
    assert_eq!(
        ids(&q.admissible("big/a2", &req("runc"), &one, now)),
        ["w1"]
    );
    // A newcomer of a fresh atespace waits behind everyone who waits (it is not queued).
    assert!(q.admissible("new/n", &req("runc"), &one, now).is_empty());
}
