//! One test suite, run against both stores: every case in `cases` becomes `sqlite::<case>` (a fresh
//! database file in a temp dir) and `postgres::<case>` (a fresh schema in the server named by
//! `ATE_TEST_POSTGRES_URL`, dropped afterwards). The PostgreSQL cases fail when that variable is unset.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ate_core::template::{Container, EgressPolicy, Resources};
use ate_core::{ActorRef, ActorState, DurableStatus, Fidelity, TemplateRef, TemplateSpec};
use ate_store::{
    ActorRecord, ActorUpdate, Alarm, Capacity, EventKind, EventQuery, FrozenCopy, JoinTokenRecord,
    SnapshotCopy, SnapshotRecord, Store, StoreError, TagRecord, Transition, WorkerRecord,
    WorkerStatus, actor_lease_key,
};
use futures::FutureExt;
use sqlx::Connection;

/// What a case gets: the store and the URL it was opened with (to open it again).
struct Env {
    store: Arc<dyn Store>,
    url: String,
}

async fn with_sqlite<F, Fut>(case: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    // A directory that does not exist yet: open() creates it and the file.
    let url = format!("sqlite://{}/state/ate.db", dir.path().display());
    let store = ate_store::open(&url).await.unwrap();
    case(Env { store, url }).await;
}

fn postgres_base_url() -> String {
    std::env::var("ATE_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "ATE_TEST_POSTGRES_URL is not set: the PostgreSQL store tests need a server, e.g. \
             ATE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:55432/postgres (CI starts one)"
        )
    })
}

async fn with_postgres<F, Fut>(case: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let base = postgres_base_url();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!(
        "ate_test_{}_{}_{}",
        std::process::id(),
        nanos,
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let mut admin = sqlx::PgConnection::connect(&base).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{separator}options=-c%20search_path%3D{schema}");
    let outcome = AssertUnwindSafe(async {
        let store = ate_store::open(&url).await.unwrap();
        case(Env {
            store,
            url: url.clone(),
        })
        .await;
    })
    .catch_unwind()
    .await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut admin)
        .await
        .unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

macro_rules! both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::with_sqlite(super::cases::$case).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::with_postgres(super::cases::$case).await;
                }
            )*
        }
    };
}

both_backends!(
    atespace_crud,
    atespace_delete_refused_while_not_empty,
    atespace_callers_allow,
    template_crud,
    actor_crud,
    list_actors_pages_in_order,
    transition_is_compare_and_set,
    transition_releasing_lease_is_one_write,
    delete_actor_returns_untagged_snapshots,
    prune_keeps_newest_completed_and_tagged,
    prune_falls_back_only_to_a_choosable_durable_copy,
    damage_is_marked_per_copy_and_in_tags,
    revert_to_a_generation_skips_the_newer_ones,
    revert_refuses_what_it_cannot_restore_and_changes_nothing,
    revert_without_a_generation_skips_the_damaged_newest,
    lease_semantics,
    bind_checks_worker_and_capacity,
    bind_is_idempotent_and_moves,
    concurrent_binds_respect_slots,
    concurrent_binds_respect_memory,
    release_records_snapshot,
    snapshot_durable_and_local_updates,
    tag_crud,
    join_tokens_and_frozen_copies,
    worker_lifecycle,
    counters_count_operations,
    reopen_keeps_data,
    alarm_set_get_and_replace,
    alarm_claim_takes_due_alarms_in_order_under_a_lease,
    alarm_concurrent_claims_never_overlap,
    alarm_failures_are_per_seq_and_give_up_stops_claims,
    alarm_delete_is_per_seq,
    alarm_goes_with_its_actor,
    alarm_list_filters_by_atespace,
    events_record_each_change_once,
    events_filter_page_and_prune,
    atespace_quota_is_checked_in_the_bind,
);

// ---------------------------------------------------------------- fixtures

const NOW: i64 = 1_000_000;
const MIB: u64 = 1 << 20;

fn spec(cpu_millis: u32, memory_bytes: u64) -> TemplateSpec {
    TemplateSpec {
        sandbox_class: "runc".into(),
        containers: vec![Container {
            name: "main".into(),
            image: "counter:latest".into(),
            command: vec!["/bin/counter".into()],
            env: vec![],
            wakeup_probe: None,
            ports: vec![],
            exit_policy: Default::default(),
            volume_mounts: None,
        }],
        resources: Resources {
            cpu_millis,
            memory_bytes,
        },
        volumes: vec![],
        fidelity: Fidelity::Memory,
        memory_restore: Default::default(),
        on_memory_failure: Default::default(),
        idle_timeout_seconds: 300,
        worker_selector: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        egress: EgressPolicy {
            default_action: "allow-all".into(),
            allow: vec![],
        },
        golden_tag: None,
        web_sockets: Default::default(),
    }
}

fn actor(atespace: &str, name: &str, template: &str) -> ActorRecord {
    ActorRecord::new(
        atespace,
        name,
        format!("uid-{atespace}-{name}"),
        TemplateRef::parse("template", template).unwrap(),
        BTreeMap::new(),
        NOW,
    )
}

fn worker(id: &str, capacity: Capacity, epoch: u64) -> WorkerRecord {
    WorkerRecord {
        id: id.into(),
        node: format!("node-{id}"),
        addresses: vec![format!("{id}.local:7000"), "10.0.0.1:7000".into()],
        identity: format!("spiffe://ate/worker/{id}"),
        labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        sandbox_class: "runc".into(),
        can_restore_memory: true,
        capabilities: vec!["memory:criu".into(), "userns:off".into()],
        capacity,
        used: Capacity::default(),
        cpu_physical_millis: capacity.cpu_millis / 4,
        cpu_usage_millis: 0,
        epoch,
        status: WorkerStatus::Active,
        last_heartbeat_ms: 0,
        node_address: "127.0.0.1:7100".into(),
        boot_id: "boot-1".into(),
    }
}

fn snapshot(atespace: &str, name: &str, generation: u64, node: &str) -> SnapshotRecord {
    SnapshotRecord {
        atespace: atespace.into(),
        name: name.into(),
        generation,
        uuid: format!("uuid-{atespace}-{name}-{generation}"),
        fidelity: Fidelity::Memory,
        template: TemplateRef::new("ns", "t"),
        sandbox_class: "runc".into(),
        node: node.into(),
        boot_id: "boot-1".into(),
        local_path: Some(format!("/var/lib/ate/snapshots/{name}/{generation}")),
        durable_uri: None,
        durable_status: None,
        size_bytes: 123_456,
        checksum: "sha256:abc".into(),
        reason: None,
        created_ms: NOW + generation as i64,
        local_damage: None,
        durable_damage: None,
        skipped: false,
        requires: vec!["memory:criu".into(), "userns:off".into()],
    }
}

fn cap(cpu_millis: u64, memory_bytes: u64, slots: u64) -> Capacity {
    Capacity {
        cpu_millis,
        memory_bytes,
        slots,
    }
}

fn demand(cpu_millis: u64, memory_bytes: u64) -> Capacity {
    Capacity {
        cpu_millis,
        memory_bytes,
        slots: 1,
    }
}

/// One suspend cycle of `ns/<name>` on worker `w1` as the api records it: bind, then release to
/// SUSPENDED with `snap` as the new generation.
async fn record_generation(store: &dyn Store, name: &str, snap: &SnapshotRecord) {
    store
        .bind_actor(
            &ActorRef::new("ns", name),
            &[ActorState::Suspended],
            "w1",
            demand(1, 1),
            NOW,
        )
        .await
        .unwrap();
    store
        .release_actor(
            &ActorRef::new("ns", name),
            Transition::new(&[ActorState::Resuming], ActorState::Suspended),
            Some(snap),
            NOW,
        )
        .await
        .unwrap();
}

/// Atespace `ns` with template `ns/t`.
async fn seed(store: &dyn Store) {
    store.create_atespace("ns", NOW).await.unwrap();
    store
        .apply_template("ns", "t", &spec(250, 128 * MIB), NOW)
        .await
        .unwrap();
}

/// Atespace `ns`, template `ns/t` and an actor `ns/<name>` for each of `names`.
async fn seed_actors(store: &dyn Store, names: &[&str]) {
    seed(store).await;
    for name in names {
        store
            .create_actor(&actor("ns", name, "ns/t"))
            .await
            .unwrap();
    }
}

/// `(name, next_attempt_ms)` of claimed alarms, in the order returned.
fn claimed(alarms: &[Alarm]) -> Vec<(String, i64)> {
    alarms
        .iter()
        .map(|a| (a.actor.name.clone(), a.next_attempt_ms))
        .collect()
}

fn message(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    result.unwrap_err().to_string()
}

macro_rules! assert_err {
    ($result:expr, $pattern:pat) => {
        match $result {
            Err(e @ $pattern) => e,
            other => panic!("expected {}, got {other:?}", stringify!($pattern)),
        }
    };
}

mod cases {
    use super::*;

    pub async fn atespace_crud(env: Env) {
        let s = env.store.as_ref();
        let created = s.create_atespace("x", NOW).await.unwrap();
        assert_eq!(
            (
                created.name.as_str(),
                created.created_ms,
                created.actor_count
            ),
            ("x", NOW, 0)
        );
        let e = assert_err!(
            s.create_atespace("x", NOW).await,
            StoreError::AlreadyExists(_)
        );
        assert_eq!(e.to_string(), r#"atespace "x" already exists"#);
        s.create_atespace("a", NOW + 1).await.unwrap();
        let got = s.get_atespace("x").await.unwrap();
        assert_eq!(got, created);
        let names: Vec<_> = s
            .list_atespaces()
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(names, ["a", "x"]);
        let e = assert_err!(s.get_atespace("nope").await, StoreError::NotFound(_));
        assert_eq!(e.to_string(), r#"atespace "nope" not found"#);
        assert_err!(s.delete_atespace("nope").await, StoreError::NotFound(_));

        s.apply_template("x", "t", &spec(100, MIB), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("x", "a1", "x/t")).await.unwrap();
        s.create_actor(&actor("x", "a2", "x/t")).await.unwrap();
        assert_eq!(s.get_atespace("x").await.unwrap().actor_count, 2);
        assert_eq!(s.list_atespaces().await.unwrap()[1].actor_count, 2);

        s.delete_atespace("a").await.unwrap();
        assert_err!(s.get_atespace("a").await, StoreError::NotFound(_));
    }

    pub async fn atespace_callers_allow(env: Env) {
        let s = env.store.as_ref();
        let created = s.create_atespace("x", NOW).await.unwrap();
        assert_eq!(created.callers_allow, Vec::<String>::new());
        s.create_atespace("a", NOW).await.unwrap();
        assert_eq!(
            s.get_atespace("x").await.unwrap().callers_allow,
            Vec::<String>::new(),
            "a new atespace allows no other atespace"
        );
        s.apply_template("x", "t", &spec(100, MIB), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("x", "a1", "x/t")).await.unwrap();

        // Set: kept in the order given, returned as get_atespace returns it.
        let allow: Vec<String> = vec!["team-b".into(), "*".into(), "a".into()];
        let before = s.counters().snapshot();
        let set = s.set_atespace_callers("x", &allow).await.unwrap();
        let after = s.counters().snapshot();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (0, 1, 0),
            "set_atespace_callers is one write"
        );
        assert_eq!(set.callers_allow, allow);
        assert_eq!(set.actor_count, 1);
        assert_eq!(set.created_ms, NOW);
        assert_eq!(s.get_atespace("x").await.unwrap(), set);
        let listed = s.list_atespaces().await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|a| (a.name.as_str(), a.callers_allow.clone()))
                .collect::<Vec<_>>(),
            [("a", vec![]), ("x", allow.clone())],
            "only x's list changed"
        );

        // Replace, then clear.
        let one = vec!["a".to_string()];
        assert_eq!(
            s.set_atespace_callers("x", &one)
                .await
                .unwrap()
                .callers_allow,
            one
        );
        assert_eq!(s.get_atespace("x").await.unwrap().callers_allow, one);
        let cleared = s.set_atespace_callers("x", &[]).await.unwrap();
        assert_eq!(cleared.callers_allow, Vec::<String>::new());
        assert_eq!(s.get_atespace("x").await.unwrap(), cleared);
        // Setting the same list again is fine.
        assert_eq!(s.set_atespace_callers("x", &[]).await.unwrap(), cleared);

        // A missing atespace.
        let e = assert_err!(
            s.set_atespace_callers("nope", &one).await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"atespace "nope" not found"#);
        assert_err!(s.get_atespace("nope").await, StoreError::NotFound(_));

        // An entry the stored form cannot keep is refused, the list left as it was.
        for bad in [vec!["a,b".to_string()], vec![String::new()]] {
            assert_err!(
                s.set_atespace_callers("x", &bad).await,
                StoreError::Database(_)
            );
        }
        assert_eq!(s.get_atespace("x").await.unwrap(), cleared);

        // The list survives a reopen.
        s.set_atespace_callers("a", &allow).await.unwrap();
        let again = ate_store::open(&env.url).await.unwrap();
        assert_eq!(again.get_atespace("a").await.unwrap().callers_allow, allow);
    }

    pub async fn atespace_delete_refused_while_not_empty(env: Env) {
        let s = env.store.as_ref();
        s.create_atespace("x", NOW).await.unwrap();
        s.apply_template("x", "t", &spec(100, MIB), NOW)
            .await
            .unwrap();
        for name in ["a1", "a2", "a3"] {
            s.create_actor(&actor("x", name, "x/t")).await.unwrap();
        }
        let e = assert_err!(
            s.delete_atespace("x").await,
            StoreError::FailedPrecondition(_)
        );
        assert_eq!(
            e.to_string(),
            r#"atespace "x" still holds 3 actors, 1 template"#
        );
        for name in ["a1", "a2", "a3"] {
            s.delete_actor(&ActorRef::new("x", name), NOW)
                .await
                .unwrap();
        }
        let e = assert_err!(
            s.delete_atespace("x").await,
            StoreError::FailedPrecondition(_)
        );
        assert_eq!(e.to_string(), r#"atespace "x" still holds 1 template"#);
        s.delete_template("x", "t").await.unwrap();

        // Only actors.
        s.create_atespace("y", NOW).await.unwrap();
        s.apply_template("x", "t", &spec(100, MIB), NOW)
            .await
            .unwrap();
        for name in ["a1", "a2", "a3"] {
            s.create_actor(&actor("y", name, "x/t")).await.unwrap();
        }
        let e = assert_err!(
            s.delete_atespace("y").await,
            StoreError::FailedPrecondition(_)
        );
        assert_eq!(e.to_string(), r#"atespace "y" still holds 3 actors"#);

        // Only a tag.
        s.create_atespace("z", NOW).await.unwrap();
        let tag = TagRecord {
            atespace: "z".into(),
            name: "golden".into(),
            snapshot: snapshot("y", "a1", 1, "n1"),
            created_ms: NOW,
        };
        s.create_tag(&tag).await.unwrap();
        let e = assert_err!(
            s.delete_atespace("z").await,
            StoreError::FailedPrecondition(_)
        );
        assert_eq!(e.to_string(), r#"atespace "z" still holds 1 tag"#);
        s.delete_tag("z", "golden").await.unwrap();
        s.delete_atespace("z").await.unwrap();
        assert!(s.get_atespace("x").await.is_ok());
    }

    pub async fn template_crud(env: Env) {
        let s = env.store.as_ref();
        let e = assert_err!(
            s.apply_template("ns", "t", &spec(100, MIB), NOW).await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"atespace "ns" not found"#);
        s.create_atespace("ns", NOW).await.unwrap();
        s.create_atespace("other", NOW).await.unwrap();
        let t = s
            .apply_template("ns", "t", &spec(100, MIB), NOW)
            .await
            .unwrap();
        assert_eq!(
            (
                t.namespace.as_str(),
                t.name.as_str(),
                t.created_ms,
                t.updated_ms
            ),
            ("ns", "t", NOW, NOW)
        );
        assert_eq!(t.spec, spec(100, MIB));
        // Replace: new spec, created kept, updated moves.
        let t2 = s
            .apply_template("ns", "t", &spec(500, 2 * MIB), NOW + 5)
            .await
            .unwrap();
        assert_eq!((t2.created_ms, t2.updated_ms), (NOW, NOW + 5));
        assert_eq!(s.get_template("ns", "t").await.unwrap(), t2);
        s.apply_template("ns", "a", &spec(1, 1), NOW).await.unwrap();
        s.apply_template("other", "b", &spec(1, 1), NOW)
            .await
            .unwrap();
        let all: Vec<_> = s
            .list_templates(None)
            .await
            .unwrap()
            .into_iter()
            .map(|t| format!("{}/{}", t.namespace, t.name))
            .collect();
        assert_eq!(all, ["ns/a", "ns/t", "other/b"]);
        let in_ns: Vec<_> = s
            .list_templates(Some("ns"))
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(in_ns, ["a", "t"]);
        let e = assert_err!(
            s.get_template("ns", "missing").await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"template "ns/missing" not found"#);

        s.create_actor(&actor("other", "a1", "ns/t")).await.unwrap();
        s.create_actor(&actor("other", "a2", "ns/t")).await.unwrap();
        let e = assert_err!(
            s.delete_template("ns", "t").await,
            StoreError::FailedPrecondition(_)
        );
        assert_eq!(e.to_string(), r#"template "ns/t" is used by 2 actors"#);
        s.delete_actor(&ActorRef::new("other", "a1"), NOW)
            .await
            .unwrap();
        s.delete_actor(&ActorRef::new("other", "a2"), NOW)
            .await
            .unwrap();
        s.delete_template("ns", "t").await.unwrap();
        assert_err!(s.get_template("ns", "t").await, StoreError::NotFound(_));
        let e = assert_err!(s.delete_template("ns", "t").await, StoreError::NotFound(_));
        assert_eq!(e.to_string(), r#"template "ns/t" not found"#);
    }

    pub async fn actor_crud(env: Env) {
        let s = env.store.as_ref();
        let e = assert_err!(
            s.create_actor(&actor("ate-demo", "a1", "ns/t")).await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"atespace "ate-demo" not found"#);
        seed(s).await;
        s.create_atespace("ate-demo", NOW).await.unwrap();
        let e = assert_err!(
            s.create_actor(&actor("ate-demo", "a1", "ns/nope")).await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"template "ns/nope" not found"#);
        // A template reference without a '/' is no longer representable (`TemplateRef`).

        let mut record = actor("ate-demo", "a1", "ns/t");
        record.worker_selector = BTreeMap::from([("gpu".to_string(), "none".to_string())]);
        record.generation = 7;
        record.attached_node = Some("n1".into());
        record.last_error = Some("boom".into());
        let created = s.create_actor(&record).await.unwrap();
        assert_eq!(created, record);
        assert_eq!(
            s.get_actor(&ActorRef::new("ate-demo", "a1")).await.unwrap(),
            record
        );
        let e = assert_err!(s.create_actor(&record).await, StoreError::AlreadyExists(_));
        assert_eq!(e.to_string(), r#"actor "ate-demo/a1" already exists"#);

        let e = assert_err!(
            s.get_actor(&ActorRef::new("ate-demo", "a2")).await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"actor "ate-demo/a2" not found"#);

        let selector = BTreeMap::from([("zone".to_string(), "b".to_string())]);
        let updated = s
            .update_actor_selector(&ActorRef::new("ate-demo", "a1"), &selector, NOW + 9)
            .await
            .unwrap();
        assert_eq!(updated.worker_selector, selector);
        assert_eq!(updated.updated_ms, NOW + 9);
        assert_eq!(
            s.get_actor(&ActorRef::new("ate-demo", "a1")).await.unwrap(),
            updated
        );
        assert_err!(
            s.update_actor_selector(&ActorRef::new("ate-demo", "zz"), &selector, NOW)
                .await,
            StoreError::NotFound(_)
        );
        let e = assert_err!(
            s.delete_actor(&ActorRef::new("ate-demo", "zz"), NOW).await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"actor "ate-demo/zz" not found"#);
        // A u64 that does not fit BIGINT is refused, not wrapped.
        let mut huge = actor("ate-demo", "huge", "ns/t");
        huge.generation = u64::MAX;
        assert_err!(s.create_actor(&huge).await, StoreError::Database(_));
    }

    pub async fn list_actors_pages_in_order(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.create_atespace("b", NOW).await.unwrap();
        s.create_atespace("a", NOW).await.unwrap();
        for (space, name) in [
            ("b", "x"),
            ("a", "z"),
            ("b", "B"),
            ("a", "a"),
            ("b", "a"),
            ("a", "m"),
            ("a", "a-1"),
        ] {
            s.create_actor(&actor(space, name, "ns/t")).await.unwrap();
        }
        let key = |a: &ActorRecord| format!("{}/{}", a.atespace, a.name);
        let expected = ["a/a", "a/a-1", "a/m", "a/z", "b/B", "b/a", "b/x"];
        let all: Vec<_> = s
            .list_actors(None, None, 100)
            .await
            .unwrap()
            .iter()
            .map(key)
            .collect();
        assert_eq!(all, expected);

        let mut pages = Vec::new();
        let mut after: Option<ActorRef> = None;
        loop {
            let page = s.list_actors(None, after.as_ref(), 3).await.unwrap();
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 3);
            let last = page.last().unwrap();
            after = Some(last.actor_ref());
            pages.push(page.iter().map(key).collect::<Vec<_>>());
        }
        assert_eq!(
            pages,
            vec![
                vec!["a/a", "a/a-1", "a/m"],
                vec!["a/z", "b/B", "b/a"],
                vec!["b/x"]
            ]
        );

        let in_b: Vec<_> = s
            .list_actors(Some("b"), None, 10)
            .await
            .unwrap()
            .iter()
            .map(key)
            .collect();
        assert_eq!(in_b, ["b/B", "b/a", "b/x"]);
        let in_b: Vec<_> = s
            .list_actors(Some("b"), Some(&ActorRef::new("b", "B")), 1)
            .await
            .unwrap()
            .iter()
            .map(key)
            .collect();
        assert_eq!(in_b, ["b/a"]);
        // `after` in an earlier atespace than the filter: starts at the filter's first actor.
        let in_b: Vec<_> = s
            .list_actors(Some("b"), Some(&ActorRef::new("a", "zzz")), 10)
            .await
            .unwrap()
            .iter()
            .map(key)
            .collect();
        assert_eq!(in_b, ["b/B", "b/a", "b/x"]);
        assert!(
            s.list_actors(Some("nope"), None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(s.list_actors(None, None, 0).await.unwrap().is_empty());
    }

    pub async fn transition_releasing_lease_is_one_write(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let key = "lease:actor:ns:a1";
        assert!(s.try_acquire_lease(key, "h1", NOW, 10_000).await.unwrap());

        // A refused transition changes nothing: the lease is still h1's.
        assert_err!(
            s.transition_releasing_lease(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Running], ActorState::Suspending),
                NOW + 1,
                key,
                "h1"
            )
            .await,
            StoreError::StateConflict { .. }
        );
        assert_eq!(
            s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap().state,
            ActorState::Suspended
        );
        assert!(
            !s.try_acquire_lease(key, "h2", NOW + 2, 10_000)
                .await
                .unwrap()
        );

        // Another holder's name releases nothing, but the transition still happens.
        let update = ActorUpdate {
            last_error: Some(Some("x".into())),
            ..Default::default()
        };
        let a = s
            .transition_releasing_lease(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Suspended], ActorState::Resuming).with(update),
                NOW + 3,
                key,
                "h2",
            )
            .await
            .unwrap();
        assert_eq!(
            (a.state, a.last_error.as_deref(), a.updated_ms),
            (ActorState::Resuming, Some("x"), NOW + 3)
        );
        assert!(
            !s.try_acquire_lease(key, "h2", NOW + 4, 10_000)
                .await
                .unwrap()
        );

        // The holder's: state and lease in one commit.
        let a = s
            .transition_releasing_lease(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Resuming], ActorState::Running),
                NOW + 5,
                key,
                "h1",
            )
            .await
            .unwrap();
        assert_eq!(a.state, ActorState::Running);
        assert_eq!(
            s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap().state,
            ActorState::Running
        );
        assert!(
            s.try_acquire_lease(key, "h2", NOW + 6, 10_000)
                .await
                .unwrap()
        );
    }

    pub async fn transition_is_compare_and_set(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        let mut a = actor("ns", "a1", "ns/t");
        a.attached_node = Some("n1".into());
        s.create_actor(&a).await.unwrap();

        let e = assert_err!(
            s.transition(
                &ActorRef::new("ns", "a1"),
                Transition::new(
                    &[ActorState::Running, ActorState::Resuming],
                    ActorState::Suspending
                ),
                NOW
            )
            .await,
            StoreError::StateConflict { .. }
        );
        match &e {
            StoreError::StateConflict { actual, expected } => {
                assert_eq!(*actual, ActorState::Suspended);
                assert_eq!(expected, "ACTOR_STATE_RUNNING, ACTOR_STATE_RESUMING");
            }
            _ => unreachable!(),
        }
        assert_eq!(
            e.to_string(),
            "actor is ACTOR_STATE_SUSPENDED, expected one of ACTOR_STATE_RUNNING, ACTOR_STATE_RESUMING"
        );

        let update = ActorUpdate {
            last_error: Some(Some("it broke".into())),
            epoch: Some(42),
            clear_attached_node: true,
            note: None,
        };
        let t = s
            .transition(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Suspended], ActorState::Crashed).with(update),
                NOW + 3,
            )
            .await
            .unwrap();
        assert_eq!(t.state, ActorState::Crashed);
        assert_eq!(t.last_error.as_deref(), Some("it broke"));
        assert_eq!(t.epoch, 42);
        assert_eq!(t.attached_node, None);
        assert_eq!(t.updated_ms, NOW + 3);
        assert_eq!(s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap(), t);

        // Without an update, only the state (and updated_ms) changes.
        let t2 = s
            .transition(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Crashed], ActorState::Suspended),
                NOW + 4,
            )
            .await
            .unwrap();
        assert_eq!(
            (t2.state, t2.last_error.as_deref(), t2.epoch),
            (ActorState::Suspended, Some("it broke"), 42)
        );
        let clear = ActorUpdate {
            last_error: Some(None),
            ..Default::default()
        };
        let t3 = s
            .transition(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Suspended], ActorState::Suspended).with(clear),
                NOW + 5,
            )
            .await
            .unwrap();
        assert_eq!(t3.last_error, None);
        assert_err!(
            s.transition(
                &ActorRef::new("ns", "zz"),
                Transition::new(&[ActorState::Suspended], ActorState::Running),
                NOW
            )
            .await,
            StoreError::NotFound(_)
        );
    }

    pub async fn prune_keeps_newest_completed_and_tagged(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        for generation in 1..=6 {
            let mut snap = snapshot("ns", "a1", generation, "node-w1");
            // 2 and 4 got durable copies; 5 and 6 are local only (uploads pending).
            if generation == 2 || generation == 4 {
                snap.durable_status = Some(DurableStatus::Completed);
                snap.durable_uri = Some(format!("file:///d/{generation}"));
            }
            record_generation(s, "a1", &snap).await;
        }
        // Generation 1 is tagged.
        let tag = TagRecord {
            atespace: "ns".into(),
            name: "golden".into(),
            snapshot: snapshot("ns", "a1", 1, "node-w1"),
            created_ms: NOW,
        };
        s.create_tag(&tag).await.unwrap();

        let gone = s
            .prune_snapshots(&ActorRef::new("ns", "a1"), 1)
            .await
            .unwrap();
        let mut gone: Vec<u64> = gone.iter().map(|g| g.generation).collect();
        gone.sort();
        // Kept: 6 (newest), 4 (newest with a durable copy), 1 (tagged).
        assert_eq!(gone, [2, 3, 5]);
        let left: Vec<u64> = s
            .list_snapshots(&ActorRef::new("ns", "a1"))
            .await
            .unwrap()
            .iter()
            .map(|g| g.generation)
            .collect();
        assert_eq!(left, [6, 4, 1]);
        // Idempotent; keep_newest 0 still keeps the newest.
        assert!(
            s.prune_snapshots(&ActorRef::new("ns", "a1"), 0)
                .await
                .unwrap()
                .is_empty()
        );
        // Unknown actor: NotFound, nothing changed.
        assert_err!(
            s.prune_snapshots(&ActorRef::new("ns", "nobody"), 1).await,
            StoreError::NotFound(_)
        );
    }

    /// The retention fallback (the newest generation with a COMPLETED durable copy) is one a
    /// resume could choose: not skipped by a revert and whose durable copy was not found damaged.
    pub async fn prune_falls_back_only_to_a_choosable_durable_copy(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let a1 = ActorRef::new("ns", "a1");
        for generation in 1..=4 {
            let mut snap = snapshot("ns", "a1", generation, "node-w1");
            snap.durable_status = Some(DurableStatus::Completed);
            snap.durable_uri = Some(format!("file:///d/{generation}"));
            record_generation(s, "a1", &snap).await;
        }
        // 4's durable copy is damaged, 3 was skipped by a revert to 2 (done on a CRASHED actor).
        s.mark_snapshot_damaged(
            &a1,
            4,
            "uuid-ns-a1-4",
            SnapshotCopy::Durable,
            "rootfs.tar: x",
        )
        .await
        .unwrap();
        s.transition(
            &a1,
            Transition::new(&[ActorState::Suspended], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        s.revert_actor(&a1, &[ActorState::Crashed], Some(2), NOW)
            .await
            .unwrap();
        // The next suspend writes 5 (upload pending) and prunes.
        record_generation(s, "a1", &snapshot("ns", "a1", 5, "node-w1")).await;
        let mut gone: Vec<u64> = s
            .prune_snapshots(&a1, 1)
            .await
            .unwrap()
            .iter()
            .map(|g| g.generation)
            .collect();
        gone.sort();
        // Kept: 5 (newest) and 2 (newest COMPLETED a resume could take); 4 and 3 were no fallback.
        assert_eq!(gone, [1, 3, 4]);
        let left: Vec<u64> = s
            .list_snapshots(&a1)
            .await
            .unwrap()
            .iter()
            .map(|g| g.generation)
            .collect();
        assert_eq!(left, [5, 2]);
    }

    pub async fn damage_is_marked_per_copy_and_in_tags(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let a1 = ActorRef::new("ns", "a1");
        let mut snap = snapshot("ns", "a1", 1, "node-w1");
        snap.durable_status = Some(DurableStatus::Completed);
        snap.durable_uri = Some("file:///d/1".into());
        record_generation(s, "a1", &snap).await;
        record_generation(s, "a1", &snapshot("ns", "a1", 2, "node-w1")).await;
        s.create_tag(&TagRecord {
            atespace: "ns".into(),
            name: "golden".into(),
            snapshot: snap.clone(),
            created_ms: NOW,
        })
        .await
        .unwrap();
        let fresh = s.list_snapshots(&a1).await.unwrap();
        assert!(
            fresh.iter().all(|g| !g.damaged() && !g.skipped),
            "{fresh:?}"
        );
        assert!(fresh[1].local_intact() && fresh[1].durable_intact());

        let marked = s
            .mark_snapshot_damaged(
                &a1,
                1,
                "uuid-ns-a1-1",
                SnapshotCopy::Local,
                "criu/pages-1.img: bad",
            )
            .await
            .unwrap();
        assert_eq!(marked.generation, 1);
        assert_eq!(
            marked.local_damage.as_deref(),
            Some("criu/pages-1.img: bad")
        );
        assert_eq!(marked.durable_damage, None);
        assert!(!marked.local_intact() && marked.durable_intact() && marked.damaged());
        // The first finding stays; the other copy is marked on its own.
        s.mark_snapshot_damaged(&a1, 1, "uuid-ns-a1-1", SnapshotCopy::Local, "later")
            .await
            .unwrap();
        let both = s
            .mark_snapshot_damaged(
                &a1,
                1,
                "uuid-ns-a1-1",
                SnapshotCopy::Durable,
                "rootfs.tar: bad",
            )
            .await
            .unwrap();
        assert_eq!(both.local_damage.as_deref(), Some("criu/pages-1.img: bad"));
        assert_eq!(both.durable_damage.as_deref(), Some("rootfs.tar: bad"));
        assert!(!both.local_intact() && !both.durable_intact());
        let listed = s.list_snapshots(&a1).await.unwrap();
        assert_eq!(listed[1], both);
        // Generation 2 was not touched.
        assert!(!listed[0].damaged(), "{:?}", listed[0]);
        // The tag's copy follows (a golden tag must not seed from a damaged copy).
        let tag = s.get_tag("ns", "golden").await.unwrap();
        assert_eq!(
            tag.snapshot.local_damage.as_deref(),
            Some("criu/pages-1.img: bad")
        );
        assert_eq!(
            tag.snapshot.durable_damage.as_deref(),
            Some("rootfs.tar: bad")
        );
        // A generation the actor lacks, or another uuid (an earlier actor of that name): NotFound.
        assert_err!(
            s.mark_snapshot_damaged(&a1, 9, "uuid-ns-a1-9", SnapshotCopy::Local, "x")
                .await,
            StoreError::NotFound(_)
        );
        assert_err!(
            s.mark_snapshot_damaged(&a1, 2, "other-uuid", SnapshotCopy::Local, "x")
                .await,
            StoreError::NotFound(_)
        );
        assert!(!s.list_snapshots(&a1).await.unwrap()[0].damaged());
    }

    pub async fn revert_to_a_generation_skips_the_newer_ones(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let a1 = ActorRef::new("ns", "a1");
        for generation in 1..=3 {
            record_generation(s, "a1", &snapshot("ns", "a1", generation, "node-w1")).await;
        }
        let skipped = |list: Vec<SnapshotRecord>| -> Vec<(u64, bool)> {
            list.iter().map(|g| (g.generation, g.skipped)).collect()
        };
        s.transition(
            &a1,
            Transition::new(&[ActorState::Suspended], ActorState::Crashed)
                .with(ActorUpdate::with_error("restore failed: checksum")),
            NOW,
        )
        .await
        .unwrap();
        let reverted = s
            .revert_actor(&a1, &[ActorState::Crashed], Some(1), NOW + 5)
            .await
            .unwrap();
        assert_eq!(reverted.state, ActorState::Suspended);
        assert_eq!(reverted.worker_id, None);
        assert_eq!(reverted.updated_ms, NOW + 5);
        // The newest generation stays the actor's newest (the next suspend writes 4).
        assert_eq!(reverted.generation, 3);
        assert_eq!(
            reverted.last_error.as_deref(),
            Some("restore failed: checksum")
        );
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(3, true), (2, true), (1, false)]
        );
        // Idempotent; a SUSPENDED actor may choose again, a newer one un-skips what it covers.
        s.revert_actor(
            &a1,
            &[ActorState::Crashed, ActorState::Suspended],
            Some(1),
            NOW,
        )
        .await
        .unwrap();
        s.revert_actor(&a1, &[ActorState::Suspended], Some(2), NOW)
            .await
            .unwrap();
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(3, true), (2, false), (1, false)]
        );
        // A revert without a generation leaves the choice as it is.
        s.revert_actor(&a1, &[ActorState::Suspended], None, NOW)
            .await
            .unwrap();
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(3, true), (2, false), (1, false)]
        );
        // The next suspend's generation is not skipped.
        record_generation(s, "a1", &snapshot("ns", "a1", 4, "node-w1")).await;
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(4, false), (3, true), (2, false), (1, false)]
        );
        // A revert to the newest generation skips nothing new and keeps what an earlier revert
        // set aside (3 belongs to the abandoned line; it must never become a fallback).
        s.revert_actor(&a1, &[ActorState::Suspended], Some(4), NOW)
            .await
            .unwrap();
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(4, false), (3, true), (2, false), (1, false)]
        );
        // A revert to a skipped generation takes it back (and sets the newer ones aside).
        s.revert_actor(&a1, &[ActorState::Suspended], Some(3), NOW)
            .await
            .unwrap();
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(4, true), (3, false), (2, false), (1, false)]
        );
    }

    /// Without a generation, a revert goes back to the newest generation that is not skipped and
    /// has a copy not found damaged: the newer ones (damaged, or with no copy left) are skipped,
    /// so an upload that completes later never makes one of them a fallback again.
    pub async fn revert_without_a_generation_skips_the_damaged_newest(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let a1 = ActorRef::new("ns", "a1");
        for generation in 1..=3 {
            let mut snap = snapshot("ns", "a1", generation, "node-w1");
            if generation < 3 {
                snap.durable_status = Some(DurableStatus::Completed);
                snap.durable_uri = Some(format!("file:///d/{generation}"));
            } else {
                snap.durable_status = Some(DurableStatus::Pending);
            }
            record_generation(s, "a1", &snap).await;
        }
        let skipped = |list: Vec<SnapshotRecord>| -> Vec<(u64, bool)> {
            list.iter().map(|g| (g.generation, g.skipped)).collect()
        };
        s.transition(
            &a1,
            Transition::new(&[ActorState::Suspended], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        // Nothing damaged: a plain CRASHED → SUSPENDED, nothing skipped.
        s.revert_actor(&a1, &[ActorState::Crashed], None, NOW)
            .await
            .unwrap();
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(3, false), (2, false), (1, false)]
        );
        // 3's only copy so far (its upload is pending) is damaged; 2's local copy too, but its
        // durable copy is intact.
        s.mark_snapshot_damaged(
            &a1,
            3,
            "uuid-ns-a1-3",
            SnapshotCopy::Local,
            "rootfs.tar: bad",
        )
        .await
        .unwrap();
        s.mark_snapshot_damaged(
            &a1,
            2,
            "uuid-ns-a1-2",
            SnapshotCopy::Local,
            "rootfs.tar: bad",
        )
        .await
        .unwrap();
        s.transition(
            &a1,
            Transition::new(&[ActorState::Suspended], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        let a = s
            .revert_actor(&a1, &[ActorState::Crashed], None, NOW)
            .await
            .unwrap();
        assert_eq!(a.state, ActorState::Suspended);
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(3, true), (2, false), (1, false)]
        );
        // 3's upload completing does not bring it back.
        s.update_snapshot_durable(&a1, 3, DurableStatus::Completed, "file:///d/3", "")
            .await
            .unwrap();
        assert!(s.list_snapshots(&a1).await.unwrap()[0].skipped);
        // Every copy damaged: the revert still returns the actor to SUSPENDED (its next resume
        // boots it afresh), skipping them all.
        for (generation, copy) in [
            (2, SnapshotCopy::Durable),
            (1, SnapshotCopy::Local),
            (1, SnapshotCopy::Durable),
        ] {
            s.mark_snapshot_damaged(
                &a1,
                generation,
                &format!("uuid-ns-a1-{generation}"),
                copy,
                "bad",
            )
            .await
            .unwrap();
        }
        s.transition(
            &a1,
            Transition::new(&[ActorState::Suspended], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        s.revert_actor(&a1, &[ActorState::Crashed], None, NOW)
            .await
            .unwrap();
        assert_eq!(
            skipped(s.list_snapshots(&a1).await.unwrap()),
            [(3, true), (2, true), (1, true)]
        );
    }

    pub async fn revert_refuses_what_it_cannot_restore_and_changes_nothing(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let a1 = ActorRef::new("ns", "a1");
        let mut one = snapshot("ns", "a1", 1, "node-w1");
        one.durable_status = Some(DurableStatus::Completed);
        one.durable_uri = Some("file:///d/1".into());
        record_generation(s, "a1", &one).await;
        record_generation(s, "a1", &snapshot("ns", "a1", 2, "node-w1")).await;
        s.transition(
            &a1,
            Transition::new(&[ActorState::Suspended], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        let before = (
            s.get_actor(&a1).await.unwrap(),
            s.list_snapshots(&a1).await.unwrap(),
        );
        let unchanged = || async {
            (
                s.get_actor(&a1).await.unwrap(),
                s.list_snapshots(&a1).await.unwrap(),
            )
        };

        // No such generation.
        let e = assert_err!(
            s.revert_actor(&a1, &[ActorState::Crashed], Some(7), NOW + 1)
                .await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), "snapshot 7 of actor \"ns/a1\" not found");
        assert_eq!(unchanged().await, before);
        // Every copy found damaged (2 has only its local copy).
        s.mark_snapshot_damaged(
            &a1,
            2,
            "uuid-ns-a1-2",
            SnapshotCopy::Local,
            "rootfs.tar: bad",
        )
        .await
        .unwrap();
        let before = unchanged().await;
        let e = assert_err!(
            s.revert_actor(&a1, &[ActorState::Crashed], Some(2), NOW + 1)
                .await,
            StoreError::FailedPrecondition(_)
        );
        assert_eq!(
            e.to_string(),
            "generation 2 of actor \"ns/a1\" has no copy that was not found damaged"
        );
        assert_eq!(unchanged().await, before);
        // A damaged local copy with an intact durable one is still a copy to restore.
        s.mark_snapshot_damaged(
            &a1,
            1,
            "uuid-ns-a1-1",
            SnapshotCopy::Local,
            "manifest.json: bad",
        )
        .await
        .unwrap();
        let before = unchanged().await;
        // Not in an allowed state: StateConflict, nothing changed.
        assert_err!(
            s.revert_actor(&a1, &[ActorState::Suspended], Some(1), NOW + 1)
                .await,
            StoreError::StateConflict {
                actual: ActorState::Crashed,
                ..
            }
        );
        assert_eq!(unchanged().await, before);
        s.revert_actor(&a1, &[ActorState::Crashed], Some(1), NOW + 1)
            .await
            .unwrap();
        let skipped: Vec<(u64, bool)> = s
            .list_snapshots(&a1)
            .await
            .unwrap()
            .iter()
            .map(|g| (g.generation, g.skipped))
            .collect();
        assert_eq!(skipped, [(2, true), (1, false)]);
        // Unknown actor.
        assert_err!(
            s.revert_actor(
                &ActorRef::new("ns", "nobody"),
                &[ActorState::Crashed],
                None,
                NOW
            )
            .await,
            StoreError::NotFound(_)
        );
    }

    pub async fn delete_actor_returns_untagged_snapshots(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 10), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        s.create_actor(&actor("ns", "keep", "ns/t")).await.unwrap();

        // Three generations, each through a bind + release.
        for generation in 1..=3 {
            let snap = snapshot("ns", "a1", generation, "node-w1");
            record_generation(s, "a1", &snap).await;
        }
        // Generation 2 is tagged (the tag lives in another atespace's view of it, compared by uuid).
        let tag = TagRecord {
            atespace: "ns".into(),
            name: "golden".into(),
            snapshot: snapshot("ns", "a1", 2, "node-w1"),
            created_ms: NOW,
        };
        s.create_tag(&tag).await.unwrap();

        // Bound actor: refused.
        s.bind_actor(
            &ActorRef::new("ns", "a1"),
            &[ActorState::Suspended],
            "w1",
            demand(100, MIB),
            NOW,
        )
        .await
        .unwrap();
        let e = assert_err!(
            s.delete_actor(&ActorRef::new("ns", "a1"), NOW).await,
            StoreError::StateConflict { .. }
        );
        assert_eq!(
            e.to_string(),
            "actor is ACTOR_STATE_RESUMING, expected one of ACTOR_STATE_SUSPENDED, ACTOR_STATE_CRASHED"
        );
        s.transition(
            &ActorRef::new("ns", "a1"),
            Transition::new(&[ActorState::Resuming], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        assert!(
            s.try_acquire_lease(&actor_lease_key("ns", "a1"), "api-1", NOW, 1000)
                .await
                .unwrap()
        );
        assert!(
            s.try_acquire_lease(&actor_lease_key("ns", "keep"), "api-1", NOW, 1000)
                .await
                .unwrap()
        );

        // CRASHED (still assigned to w1): deletable; returns generations 3 and 1, newest first.
        let gc = s
            .delete_actor(&ActorRef::new("ns", "a1"), NOW)
            .await
            .unwrap();
        let generations: Vec<_> = gc.iter().map(|g| g.generation).collect();
        assert_eq!(generations, [3, 1]);
        assert_eq!(gc[0], snapshot("ns", "a1", 3, "node-w1"));
        assert_err!(
            s.get_actor(&ActorRef::new("ns", "a1")).await,
            StoreError::NotFound(_)
        );
        assert!(
            s.list_snapshots(&ActorRef::new("ns", "a1"))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.get_worker("w1").await.unwrap().used, Capacity::default());
        // Its lease is gone (another holder can take it at once); the other actor's is not.
        assert!(
            s.try_acquire_lease(&actor_lease_key("ns", "a1"), "api-2", NOW, 1000)
                .await
                .unwrap()
        );
        assert!(
            !s.try_acquire_lease(&actor_lease_key("ns", "keep"), "api-2", NOW, 1000)
                .await
                .unwrap()
        );
        // The tag survives with its copy.
        assert_eq!(
            s.get_tag("ns", "golden").await.unwrap().snapshot.generation,
            2
        );
        // An actor of the same name can be created again from scratch.
        let again = s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        assert_eq!(again.generation, 0);
        assert!(
            s.delete_actor(&ActorRef::new("ns", "a1"), NOW)
                .await
                .unwrap()
                .is_empty()
        );
    }

    pub async fn lease_semantics(env: Env) {
        let s = env.store.as_ref();
        let key = "lease:actor:ns:a1";
        // Free.
        assert!(s.try_acquire_lease(key, "h1", NOW, 100).await.unwrap());
        // Held by another, not expired.
        assert!(!s.try_acquire_lease(key, "h2", NOW + 50, 100).await.unwrap());
        assert!(!s.try_acquire_lease(key, "h2", NOW + 99, 100).await.unwrap());
        // Same holder re-acquires (extends to NOW + 90 + 100).
        assert!(s.try_acquire_lease(key, "h1", NOW + 90, 100).await.unwrap());
        assert!(
            !s.try_acquire_lease(key, "h2", NOW + 150, 100)
                .await
                .unwrap()
        );
        // Expired: taken over.
        assert!(
            s.try_acquire_lease(key, "h2", NOW + 190, 100)
                .await
                .unwrap()
        );
        assert!(
            !s.try_acquire_lease(key, "h1", NOW + 200, 100)
                .await
                .unwrap()
        );
        // Release by a non-holder does nothing.
        s.release_lease(key, "h1").await.unwrap();
        assert!(
            !s.try_acquire_lease(key, "h1", NOW + 200, 100)
                .await
                .unwrap()
        );
        // Release by the holder frees it.
        s.release_lease(key, "h2").await.unwrap();
        assert!(
            s.try_acquire_lease(key, "h1", NOW + 200, 100)
                .await
                .unwrap()
        );
        // Releasing an unknown key is fine; keys are independent.
        s.release_lease("lease:actor:ns:none", "h1").await.unwrap();
        assert!(
            s.try_acquire_lease("lease:actor:ns:a2", "h2", NOW + 200, 100)
                .await
                .unwrap()
        );

        // Many contenders at once: exactly one wins.
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let store = env.store.clone();
                tokio::spawn(async move {
                    store
                        .try_acquire_lease("lease:race", &format!("h{i}"), NOW, 1000)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let wins = futures::future::join_all(tasks)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        assert_eq!(wins, 1);
    }

    pub async fn bind_checks_worker_and_capacity(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        for name in ["a1", "a2", "a3"] {
            s.create_actor(&actor("ns", name, "ns/t")).await.unwrap();
        }
        let from = &[ActorState::Suspended];
        let e = assert_err!(
            s.bind_actor(
                &ActorRef::new("ns", "a1"),
                from,
                "w1",
                demand(100, MIB),
                NOW
            )
            .await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"worker "w1" not found"#);
        let e = assert_err!(
            s.bind_actor(
                &ActorRef::new("ns", "zz"),
                from,
                "w1",
                demand(100, MIB),
                NOW
            )
            .await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"actor "ns/zz" not found"#);

        let w = s
            .register_worker(&worker("w1", cap(1000, 1024 * MIB, 2), 7), NOW)
            .await
            .unwrap();
        assert_eq!(w.used, Capacity::default());
        let bound = s
            .bind_actor(
                &ActorRef::new("ns", "a1"),
                from,
                "w1",
                demand(600, 100 * MIB),
                NOW + 1,
            )
            .await
            .unwrap();
        assert_eq!(bound.state, ActorState::Resuming);
        assert_eq!(bound.worker_id.as_deref(), Some("w1"));
        assert_eq!(bound.epoch, 7);
        assert_eq!(bound.updated_ms, NOW + 1);
        assert_eq!(
            s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap(),
            bound
        );
        assert_eq!(
            s.get_worker("w1").await.unwrap().used,
            cap(600, 100 * MIB, 1)
        );

        // CPU: 600 + 500 > 1000.
        let e = assert_err!(
            s.bind_actor(
                &ActorRef::new("ns", "a2"),
                from,
                "w1",
                demand(500, MIB),
                NOW
            )
            .await,
            StoreError::NoRoom { .. }
        );
        assert_eq!(e.to_string(), "worker w1 has no room for the actor");
        // Memory: 100 MiB + 1000 MiB > 1024 MiB.
        assert_err!(
            s.bind_actor(
                &ActorRef::new("ns", "a2"),
                from,
                "w1",
                demand(100, 1000 * MIB),
                NOW
            )
            .await,
            StoreError::NoRoom { .. }
        );
        // A demand that would overflow never fits (and does not panic).
        assert_err!(
            s.bind_actor(
                &ActorRef::new("ns", "a2"),
                from,
                "w1",
                cap(100, MIB, u64::MAX),
                NOW
            )
            .await,
            StoreError::NoRoom { .. }
        );
        // Exactly full is fine.
        s.bind_actor(
            &ActorRef::new("ns", "a2"),
            from,
            "w1",
            demand(400, 924 * MIB),
            NOW,
        )
        .await
        .unwrap();
        assert_eq!(
            s.get_worker("w1").await.unwrap().used,
            cap(1000, 1024 * MIB, 2)
        );
        // Slots: 2 of 2 used even with no cpu/memory asked.
        assert_err!(
            s.bind_actor(&ActorRef::new("ns", "a3"), from, "w1", demand(0, 0), NOW)
                .await,
            StoreError::NoRoom { .. }
        );
        // The refused actor is untouched.
        let a3 = s.get_actor(&ActorRef::new("ns", "a3")).await.unwrap();
        assert_eq!((a3.state, a3.worker_id), (ActorState::Suspended, None));

        // State check.
        let e = assert_err!(
            s.bind_actor(&ActorRef::new("ns", "a1"), from, "w2", demand(1, 1), NOW)
                .await,
            StoreError::StateConflict {
                actual: ActorState::Resuming,
                ..
            }
        );
        assert!(
            e.to_string()
                .contains("expected one of ACTOR_STATE_SUSPENDED")
        );

        // GONE worker: no room, whatever its capacity.
        s.register_worker(&worker("w2", cap(10_000, 10_000 * MIB, 100), 1), NOW)
            .await
            .unwrap();
        s.deregister_worker("w2").await.unwrap();
        assert_err!(
            s.bind_actor(&ActorRef::new("ns", "a3"), from, "w2", demand(1, 1), NOW)
                .await,
            StoreError::NoRoom { .. }
        );
        assert_eq!(s.actors_on_worker("w2").await.unwrap(), vec![]);
        let on_w1: Vec<_> = s
            .actors_on_worker("w1")
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(on_w1, ["a1", "a2"]);
    }

    pub async fn bind_is_idempotent_and_moves(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        s.create_actor(&actor("ns", "a2", "ns/t")).await.unwrap();
        s.register_worker(&worker("w1", cap(1000, 1024 * MIB, 2), 1), NOW)
            .await
            .unwrap();
        s.register_worker(&worker("w2", cap(1000, 1024 * MIB, 1), 2), NOW)
            .await
            .unwrap();
        let from = &[ActorState::Suspended];

        let first = s
            .bind_actor(
                &ActorRef::new("ns", "a1"),
                from,
                "w1",
                demand(800, 800 * MIB),
                NOW,
            )
            .await
            .unwrap();
        // Retried bind to the same worker: succeeds again (no double count, even though a second
        // copy of the demand would not fit, and even though the actor is no longer SUSPENDED).
        let again = s
            .bind_actor(
                &ActorRef::new("ns", "a1"),
                from,
                "w1",
                demand(800, 800 * MIB),
                NOW,
            )
            .await
            .unwrap();
        assert_eq!(again, first);
        // The first bind took fencing token 1; its retry keeps it (same activation).
        assert_eq!(first.activation, 1);
        assert_eq!(
            s.get_worker("w1").await.unwrap().used,
            cap(800, 800 * MIB, 1)
        );

        // Bind to another worker (caller allows RESUMING): the assignment moves.
        let moved = s
            .bind_actor(
                &ActorRef::new("ns", "a1"),
                &[ActorState::Suspended, ActorState::Resuming],
                "w2",
                demand(300, 300 * MIB),
                NOW + 1,
            )
            .await
            .unwrap();
        assert_eq!((moved.worker_id.as_deref(), moved.epoch), (Some("w2"), 2));
        // Another worker is another activation: a new, larger token.
        assert_eq!(moved.activation, 2);
        assert_eq!(s.get_worker("w1").await.unwrap().used, Capacity::default());
        assert_eq!(
            s.get_worker("w2").await.unwrap().used,
            cap(300, 300 * MIB, 1)
        );
        let used: Vec<_> = s
            .list_workers()
            .await
            .unwrap()
            .into_iter()
            .map(|w| (w.id, w.used))
            .collect();
        assert_eq!(
            used,
            [
                ("w1".to_string(), Capacity::default()),
                ("w2".to_string(), cap(300, 300 * MIB, 1))
            ]
        );

        // w2 has one slot, held by a1.
        assert_err!(
            s.bind_actor(&ActorRef::new("ns", "a2"), from, "w2", demand(1, 1), NOW)
                .await,
            StoreError::NoRoom { .. }
        );
        // Re-binding a1 on w2 with a bigger demand is measured without its own old assignment.
        let rebound = s
            .bind_actor(
                &ActorRef::new("ns", "a1"),
                from,
                "w2",
                demand(1000, 1024 * MIB),
                NOW,
            )
            .await
            .unwrap();
        assert_eq!(rebound.activation, 2);
        assert_eq!(
            s.get_worker("w2").await.unwrap().used,
            cap(1000, 1024 * MIB, 1)
        );
        // Released and bound again (a suspend, then a resume): the next token.
        s.release_actor(
            &ActorRef::new("ns", "a1"),
            Transition::new(&[ActorState::Resuming], ActorState::Suspended),
            None,
            NOW + 2,
        )
        .await
        .unwrap();
        let next = s
            .bind_actor(
                &ActorRef::new("ns", "a1"),
                from,
                "w2",
                demand(1, 1),
                NOW + 3,
            )
            .await
            .unwrap();
        assert_eq!(next.activation, 3);
        assert_eq!(
            s.get_actor(&ActorRef::new("ns", "a1"))
                .await
                .unwrap()
                .activation,
            3
        );
    }

    async fn concurrent_binds(env: Env, capacity: Capacity, each: Capacity) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", capacity, 1), NOW)
            .await
            .unwrap();
        for i in 0..10 {
            s.create_actor(&actor("ns", &format!("a{i}"), "ns/t"))
                .await
                .unwrap();
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(10));
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let store = env.store.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .bind_actor(
                            &ActorRef::new("ns", format!("a{i}")),
                            &[ActorState::Suspended],
                            "w1",
                            each,
                            NOW,
                        )
                        .await
                })
            })
            .collect();
        let mut admitted = 0;
        for result in futures::future::join_all(tasks).await {
            match result.unwrap() {
                Ok(actor) => {
                    assert_eq!(actor.worker_id.as_deref(), Some("w1"));
                    admitted += 1;
                }
                Err(StoreError::NoRoom { worker_id }) => assert_eq!(worker_id, "w1"),
                Err(other) => panic!("unexpected bind error: {other}"),
            }
        }
        assert_eq!(admitted, 4);
        let w = s.get_worker("w1").await.unwrap();
        assert_eq!(
            w.used,
            Capacity {
                cpu_millis: 4 * each.cpu_millis,
                memory_bytes: 4 * each.memory_bytes,
                slots: 4
            }
        );
        assert_eq!(s.actors_on_worker("w1").await.unwrap().len(), 4);
        let resuming = s
            .list_actors(Some("ns"), None, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.state == ActorState::Resuming)
            .count();
        assert_eq!(resuming, 4);
    }

    pub async fn concurrent_binds_respect_slots(env: Env) {
        concurrent_binds(env, cap(1_000_000, 1 << 40, 4), demand(100, MIB)).await;
    }

    pub async fn concurrent_binds_respect_memory(env: Env) {
        concurrent_binds(
            env,
            cap(1_000_000, 4 * 256 * MIB + 1, 100),
            demand(100, 256 * MIB),
        )
        .await;
    }

    pub async fn release_records_snapshot(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(1000, 1024 * MIB, 4), 3), NOW)
            .await
            .unwrap();
        let mut a = actor("ns", "a1", "ns/t");
        a.attached_node = Some("old-node".into());
        s.create_actor(&a).await.unwrap();
        s.bind_actor(
            &ActorRef::new("ns", "a1"),
            &[ActorState::Suspended],
            "w1",
            demand(500, 512 * MIB),
            NOW,
        )
        .await
        .unwrap();
        s.transition(
            &ActorRef::new("ns", "a1"),
            Transition::new(&[ActorState::Resuming], ActorState::Running),
            NOW,
        )
        .await
        .unwrap();
        s.transition(
            &ActorRef::new("ns", "a1"),
            Transition::new(&[ActorState::Running], ActorState::Suspending),
            NOW,
        )
        .await
        .unwrap();

        // Wrong state: nothing happens.
        let snap = snapshot("ns", "a1", 1, "node-w1");
        assert_err!(
            s.release_actor(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Running], ActorState::Suspended),
                Some(&snap),
                NOW
            )
            .await,
            StoreError::StateConflict {
                actual: ActorState::Suspending,
                ..
            }
        );
        assert!(
            s.list_snapshots(&ActorRef::new("ns", "a1"))
                .await
                .unwrap()
                .is_empty()
        );
        // A snapshot of another actor is refused.
        let foreign = snapshot("ns", "other", 1, "node-w1");
        assert_err!(
            s.release_actor(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Suspending], ActorState::Suspended),
                Some(&foreign),
                NOW
            )
            .await,
            StoreError::FailedPrecondition(_)
        );

        let released = s
            .release_actor(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Suspending], ActorState::Suspended),
                Some(&snap),
                NOW + 7,
            )
            .await
            .unwrap();
        assert_eq!(released.state, ActorState::Suspended);
        assert_eq!(released.worker_id, None);
        assert_eq!(released.generation, 1);
        assert_eq!(released.attached_node.as_deref(), Some("node-w1"));
        assert_eq!(released.updated_ms, NOW + 7);
        assert_eq!(
            s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap(),
            released
        );
        assert_eq!(s.get_worker("w1").await.unwrap().used, Capacity::default());
        assert!(s.actors_on_worker("w1").await.unwrap().is_empty());
        assert_eq!(
            s.list_snapshots(&ActorRef::new("ns", "a1")).await.unwrap(),
            vec![snap.clone()]
        );

        // Second cycle: generation 2 on another node; the update's fields apply too.
        s.bind_actor(
            &ActorRef::new("ns", "a1"),
            &[ActorState::Suspended],
            "w1",
            demand(500, 512 * MIB),
            NOW,
        )
        .await
        .unwrap();
        let snap2 = SnapshotRecord {
            durable_status: Some(DurableStatus::Pending),
            ..snapshot("ns", "a1", 2, "node-b")
        };
        let update = ActorUpdate {
            last_error: Some(Some("note".into())),
            epoch: None,
            clear_attached_node: true,
            note: None,
        };
        let r2 = s
            .release_actor(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Resuming], ActorState::Suspended).with(update),
                Some(&snap2),
                NOW + 8,
            )
            .await
            .unwrap();
        assert_eq!(
            (
                r2.generation,
                r2.attached_node.as_deref(),
                r2.last_error.as_deref()
            ),
            (2, Some("node-b"), Some("note"))
        );
        let gens: Vec<_> = s
            .list_snapshots(&ActorRef::new("ns", "a1"))
            .await
            .unwrap()
            .into_iter()
            .map(|g| g.generation)
            .collect();
        assert_eq!(gens, [2, 1]);
        // The same generation twice is refused (and rolls back the whole release).
        s.bind_actor(
            &ActorRef::new("ns", "a1"),
            &[ActorState::Suspended],
            "w1",
            demand(500, 512 * MIB),
            NOW,
        )
        .await
        .unwrap();
        assert_err!(
            s.release_actor(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Resuming], ActorState::Suspended),
                Some(&snap2),
                NOW
            )
            .await,
            StoreError::AlreadyExists(_)
        );
        let still = s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap();
        assert_eq!(
            (still.state, still.worker_id.as_deref()),
            (ActorState::Resuming, Some("w1"))
        );
        assert_eq!(s.get_worker("w1").await.unwrap().used.slots, 1);

        // Release without a snapshot (crash path): capacity freed, generation kept.
        let crashed = s
            .release_actor(
                &ActorRef::new("ns", "a1"),
                Transition::new(&[ActorState::Resuming], ActorState::Crashed),
                None,
                NOW + 9,
            )
            .await
            .unwrap();
        assert_eq!(
            (crashed.state, crashed.worker_id, crashed.generation),
            (ActorState::Crashed, None, 2)
        );
        assert_eq!(crashed.attached_node.as_deref(), Some("node-b"));
        assert_eq!(s.get_worker("w1").await.unwrap().used, Capacity::default());
        assert_err!(
            s.release_actor(
                &ActorRef::new("ns", "zz"),
                Transition::new(&[ActorState::Resuming], ActorState::Crashed),
                None,
                NOW
            )
            .await,
            StoreError::NotFound(_)
        );
    }

    pub async fn snapshot_durable_and_local_updates(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.register_worker(&worker("w1", cap(1000, 1024 * MIB, 4), 1), NOW)
            .await
            .unwrap();
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        for generation in 1..=2 {
            let mut snap = snapshot("ns", "a1", generation, "n1");
            snap.reason = Some("memory checkpoint unsupported".into());
            record_generation(s, "a1", &snap).await;
        }
        let tag = TagRecord {
            atespace: "ns".into(),
            name: "t2".into(),
            snapshot: s.list_snapshots(&ActorRef::new("ns", "a1")).await.unwrap()[0].clone(),
            created_ms: NOW,
        };
        s.create_tag(&tag).await.unwrap();

        s.update_snapshot_durable(
            &ActorRef::new("ns", "a1"),
            2,
            DurableStatus::Pending,
            "",
            "",
        )
        .await
        .unwrap();
        s.update_snapshot_durable(
            &ActorRef::new("ns", "a1"),
            2,
            DurableStatus::Completed,
            "s3://bucket/ns/a1/2",
            "",
        )
        .await
        .unwrap();
        let g = s.list_snapshots(&ActorRef::new("ns", "a1")).await.unwrap();
        assert_eq!(g[0].durable_status, Some(DurableStatus::Completed));
        assert_eq!(g[0].durable_uri.as_deref(), Some("s3://bucket/ns/a1/2"));
        assert_eq!(
            g[0].reason.as_deref(),
            Some("memory checkpoint unsupported"),
            "an empty reason keeps the old one"
        );
        assert_eq!(g[1].durable_status, None);
        s.update_snapshot_durable(
            &ActorRef::new("ns", "a1"),
            1,
            DurableStatus::Failed,
            "",
            "upload failed: 503",
        )
        .await
        .unwrap();
        let g = s.list_snapshots(&ActorRef::new("ns", "a1")).await.unwrap();
        assert_eq!(
            (g[1].durable_status, g[1].reason.as_deref()),
            (Some(DurableStatus::Failed), Some("upload failed: 503"))
        );
        let e = assert_err!(
            s.update_snapshot_durable(
                &ActorRef::new("ns", "a1"),
                9,
                DurableStatus::Completed,
                "x",
                ""
            )
            .await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"snapshot 9 of actor "ns/a1" not found"#);

        s.clear_snapshot_local(&ActorRef::new("ns", "a1"), 2)
            .await
            .unwrap();
        let g = s.list_snapshots(&ActorRef::new("ns", "a1")).await.unwrap();
        assert_eq!(g[0].local_path, None);
        assert!(g[1].local_path.is_some());
        assert_err!(
            s.clear_snapshot_local(&ActorRef::new("ns", "a1"), 9).await,
            StoreError::NotFound(_)
        );

        // The tag's copy follows the generation it names.
        let t = s.get_tag("ns", "t2").await.unwrap();
        assert_eq!(t.snapshot, g[0]);
    }

    pub async fn join_tokens_and_frozen_copies(env: Env) {
        let s = env.store.as_ref();
        let token = JoinTokenRecord {
            id: "abcd1234".into(),
            secret_sha256: "f".repeat(64),
            description: "rack 3".into(),
            created_ms: NOW,
            expires_ms: NOW + 3_600_000,
            used_by: vec![],
        };
        s.create_join_token(&token).await.unwrap();
        let e = assert_err!(
            s.create_join_token(&token).await,
            StoreError::AlreadyExists(_)
        );
        assert_eq!(e.to_string(), r#"join token "abcd1234" already exists"#);
        assert_eq!(s.get_join_token("abcd1234").await.unwrap(), token);
        s.record_join_token_use("abcd1234", "node-a").await.unwrap();
        s.record_join_token_use("abcd1234", "node-b").await.unwrap();
        s.record_join_token_use("abcd1234", "node-a").await.unwrap();
        let got = s.get_join_token("abcd1234").await.unwrap();
        assert_eq!(
            got.used_by,
            vec!["node-b".to_string(), "node-a".to_string()]
        );
        assert_err!(
            s.record_join_token_use("zzzz0000", "x").await,
            StoreError::NotFound(_)
        );
        // A token expired for over a day goes when the next one is created.
        let old = JoinTokenRecord {
            id: "old00000".into(),
            created_ms: NOW - 3 * 86_400_000,
            expires_ms: NOW - 2 * 86_400_000,
            ..token.clone()
        };
        s.create_join_token(&old).await.unwrap();
        let newer = JoinTokenRecord {
            id: "new00000".into(),
            ..token.clone()
        };
        s.create_join_token(&newer).await.unwrap();
        let ids: Vec<String> = s
            .list_join_tokens()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(ids, vec!["abcd1234".to_string(), "new00000".to_string()]);
        assert!(s.delete_join_token("abcd1234").await.unwrap());
        assert!(!s.delete_join_token("abcd1234").await.unwrap());
        assert_err!(s.get_join_token("abcd1234").await, StoreError::NotFound(_));

        assert_eq!(
            s.get_frozen_copy(&ActorRef::new("ns", "a1")).await.unwrap(),
            None
        );
        let copy = FrozenCopy {
            worker_id: "w1".into(),
            generation: 4,
        };
        s.set_frozen_copy(&ActorRef::new("ns", "a1"), &copy)
            .await
            .unwrap();
        assert_eq!(
            s.get_frozen_copy(&ActorRef::new("ns", "a1")).await.unwrap(),
            Some(copy)
        );
        let moved = FrozenCopy {
            worker_id: "w2".into(),
            generation: 5,
        };
        s.set_frozen_copy(&ActorRef::new("ns", "a1"), &moved)
            .await
            .unwrap();
        assert_eq!(
            s.get_frozen_copy(&ActorRef::new("ns", "a1")).await.unwrap(),
            Some(moved)
        );
        s.clear_frozen_copy(&ActorRef::new("ns", "a1"))
            .await
            .unwrap();
        s.clear_frozen_copy(&ActorRef::new("ns", "a1"))
            .await
            .unwrap();
        assert_eq!(
            s.get_frozen_copy(&ActorRef::new("ns", "a1")).await.unwrap(),
            None
        );
    }

    pub async fn tag_crud(env: Env) {
        let s = env.store.as_ref();
        let tag = TagRecord {
            atespace: "ns".into(),
            name: "golden".into(),
            snapshot: snapshot("ns", "a1", 3, "n1"),
            created_ms: NOW,
        };
        let e = assert_err!(s.create_tag(&tag).await, StoreError::NotFound(_));
        assert_eq!(e.to_string(), r#"atespace "ns" not found"#);
        seed(s).await;
        s.create_atespace("other", NOW).await.unwrap();
        let mut full = tag.clone();
        full.snapshot.durable_status = Some(DurableStatus::Completed);
        full.snapshot.durable_uri = Some("s3://b/k".into());
        full.snapshot.fidelity = Fidelity::Rootfs;
        full.snapshot.reason = Some("criu missing".into());
        assert_eq!(s.create_tag(&full).await.unwrap(), full);
        let e = assert_err!(s.create_tag(&full).await, StoreError::AlreadyExists(_));
        assert_eq!(e.to_string(), r#"tag "ns/golden" already exists"#);
        assert_eq!(s.get_tag("ns", "golden").await.unwrap(), full);
        let other = TagRecord {
            atespace: "other".into(),
            name: "a".into(),
            ..tag.clone()
        };
        s.create_tag(&other).await.unwrap();
        let second = TagRecord {
            name: "base".into(),
            ..tag.clone()
        };
        s.create_tag(&second).await.unwrap();
        let names: Vec<_> = s
            .list_tags(None)
            .await
            .unwrap()
            .into_iter()
            .map(|t| format!("{}/{}", t.atespace, t.name))
            .collect();
        assert_eq!(names, ["ns/base", "ns/golden", "other/a"]);
        assert_eq!(s.list_tags(Some("other")).await.unwrap(), vec![other]);
        s.delete_tag("ns", "golden").await.unwrap();
        let e = assert_err!(s.get_tag("ns", "golden").await, StoreError::NotFound(_));
        assert_eq!(e.to_string(), r#"tag "ns/golden" not found"#);
        let e = assert_err!(s.delete_tag("ns", "golden").await, StoreError::NotFound(_));
        assert_eq!(e.to_string(), r#"tag "ns/golden" not found"#);
    }

    pub async fn worker_lifecycle(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        let mut w = worker("w1", cap(2000, 2048 * MIB, 8), 5);
        w.last_heartbeat_ms = 12; // ignored: register sets it to now
        w.status = WorkerStatus::Gone; // ignored: register makes it ACTIVE
        w.used = cap(1, 1, 1); // ignored: computed
        w.cpu_usage_millis = 99; // ignored: heartbeats report it
        let reg = s.register_worker(&w, NOW).await.unwrap();
        let expected = WorkerRecord {
            last_heartbeat_ms: NOW,
            status: WorkerStatus::Active,
            used: Capacity::default(),
            cpu_usage_millis: 0,
            ..w.clone()
        };
        assert_eq!(reg, expected);
        assert_eq!(reg.cpu_physical_millis, 500);
        assert_eq!(s.get_worker("w1").await.unwrap(), expected);
        let e = assert_err!(s.get_worker("w9").await, StoreError::NotFound(_));
        assert_eq!(e.to_string(), r#"worker "w9" not found"#);
        assert_err!(s.deregister_worker("w9").await, StoreError::NotFound(_));

        // Heartbeats, with the CPU the worker's actors used lately.
        assert!(s.heartbeat_worker("w1", 5, 120, NOW + 10).await.unwrap());
        let beat = s.get_worker("w1").await.unwrap();
        assert_eq!(
            (beat.last_heartbeat_ms, beat.cpu_usage_millis),
            (NOW + 10, 120)
        );
        assert!(
            !s.heartbeat_worker("w1", 4, 0, NOW + 11).await.unwrap(),
            "epoch mismatch"
        );
        assert!(
            !s.heartbeat_worker("w1", u64::MAX, 0, NOW + 11)
                .await
                .unwrap(),
            "epoch mismatch"
        );
        assert!(
            !s.heartbeat_worker("w9", 5, 0, NOW + 11).await.unwrap(),
            "unknown"
        );
        let unchanged = s.get_worker("w1").await.unwrap();
        assert_eq!(
            (unchanged.last_heartbeat_ms, unchanged.cpu_usage_millis),
            (NOW + 10, 120),
            "a refused heartbeat records nothing"
        );

        // An assignment survives re-registration (new epoch, new capacity).
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        s.bind_actor(
            &ActorRef::new("ns", "a1"),
            &[ActorState::Suspended],
            "w1",
            demand(100, MIB),
            NOW,
        )
        .await
        .unwrap();
        let w_next = WorkerRecord {
            epoch: 6,
            capacity: cap(4000, 4096 * MIB, 16),
            ..w.clone()
        };
        let reg = s.register_worker(&w_next, NOW + 20).await.unwrap();
        assert_eq!(
            (reg.epoch, reg.capacity, reg.used, reg.cpu_usage_millis),
            (6, cap(4000, 4096 * MIB, 16), cap(100, MIB, 1), 0),
            "a new process starts with no usage reported"
        );
        assert!(!s.heartbeat_worker("w1", 5, 0, NOW + 21).await.unwrap());
        assert!(s.heartbeat_worker("w1", 6, 0, NOW + 21).await.unwrap());

        // Expiry: only ACTIVE workers whose heartbeat is older than the cutoff.
        s.register_worker(&worker("w2", cap(1, 1, 1), 1), NOW)
            .await
            .unwrap();
        s.register_worker(&worker("w3", cap(1, 1, 1), 1), NOW)
            .await
            .unwrap();
        s.register_worker(&worker("w4", cap(1, 1, 1), 1), NOW + 100)
            .await
            .unwrap();
        s.deregister_worker("w3").await.unwrap();
        assert_eq!(
            s.expire_workers(NOW).await.unwrap(),
            Vec::<String>::new(),
            "strictly older"
        );
        assert_eq!(s.expire_workers(NOW + 50).await.unwrap(), ["w1", "w2"]);
        assert_eq!(
            s.expire_workers(NOW + 50).await.unwrap(),
            Vec::<String>::new(),
            "already GONE"
        );
        let statuses: Vec<_> = s
            .list_workers()
            .await
            .unwrap()
            .into_iter()
            .map(|w| (w.id, w.status))
            .collect();
        assert_eq!(
            statuses,
            [
                ("w1".to_string(), WorkerStatus::Gone),
                ("w2".to_string(), WorkerStatus::Gone),
                ("w3".to_string(), WorkerStatus::Gone),
                ("w4".to_string(), WorkerStatus::Active),
            ]
        );
        assert!(
            !s.heartbeat_worker("w1", 6, 0, NOW + 60).await.unwrap(),
            "GONE"
        );
        // The GONE worker keeps its assignment (the api cleans up) and shows it.
        assert_eq!(s.get_worker("w1").await.unwrap().used, cap(100, MIB, 1));
        let on_w1: Vec<_> = s
            .actors_on_worker("w1")
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(on_w1, ["a1"]);
        // Registering again revives it.
        let back = s
            .register_worker(&WorkerRecord { epoch: 7, ..w }, NOW + 70)
            .await
            .unwrap();
        assert_eq!(
            (back.status, back.last_heartbeat_ms),
            (WorkerStatus::Active, NOW + 70)
        );
        assert!(s.heartbeat_worker("w1", 7, 0, NOW + 71).await.unwrap());
    }

    pub async fn counters_count_operations(env: Env) {
        let s = env.store.as_ref();
        seed(s).await;
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        let before = s.counters().snapshot();
        s.get_actor(&ActorRef::new("ns", "a1")).await.unwrap();
        let after = s.counters().snapshot();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (1, 0, 0),
            "get_actor is one read"
        );

        let before = s.counters().snapshot();
        s.transition(
            &ActorRef::new("ns", "a1"),
            Transition::new(&[ActorState::Suspended], ActorState::Crashed),
            NOW,
        )
        .await
        .unwrap();
        let after = s.counters().snapshot();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (0, 1, 0),
            "transition is one write"
        );

        let before = s.counters().snapshot();
        s.try_acquire_lease("k", "h", NOW, 10).await.unwrap();
        s.release_lease("k", "h").await.unwrap();
        let after = s.counters().snapshot();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (0, 0, 2),
            "two lease ops"
        );

        // Failed operations count too.
        let before = s.counters().snapshot();
        s.get_actor(&ActorRef::new("ns", "missing"))
            .await
            .unwrap_err();
        s.list_actors(None, None, 10).await.unwrap();
        s.list_workers().await.unwrap();
        let after = s.counters().snapshot();
        assert_eq!((after.0 - before.0, after.1 - before.1), (3, 0));
    }

    pub async fn reopen_keeps_data(env: Env) {
        seed(env.store.as_ref()).await;
        env.store
            .create_actor(&actor("ns", "a1", "ns/t"))
            .await
            .unwrap();
        // Opening again applies no migration twice and sees the same data.
        let again = ate_store::open(&env.url).await.unwrap();
        assert_eq!(
            again.get_actor(&ActorRef::new("ns", "a1")).await.unwrap(),
            env.store
                .get_actor(&ActorRef::new("ns", "a1"))
                .await
                .unwrap()
        );
        assert_eq!(
            again.counters().snapshot(),
            (1, 0, 0),
            "counters are per store"
        );
        assert_eq!(
            message(again.create_atespace("ns", NOW).await),
            r#"atespace "ns" already exists"#
        );
    }

    pub async fn alarm_set_get_and_replace(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1"]).await;
        let a1 = ActorRef::new("ns", "a1");
        assert_eq!(s.get_alarm(&a1).await.unwrap(), None);

        let set = s.set_alarm(&a1, NOW + 1000, "/tick", NOW).await.unwrap();
        let expected = Alarm {
            actor: a1.clone(),
            due_ms: NOW + 1000,
            path: "/tick".into(),
            seq: 1,
            attempts: 0,
            next_attempt_ms: NOW + 1000,
            last_error: String::new(),
            failed: false,
            set_ms: NOW,
        };
        assert_eq!(set, expected);
        assert_eq!(s.get_alarm(&a1).await.unwrap(), Some(expected));

        // A failed attempt, then the actor sets it again: a new seq and a fresh delivery.
        assert!(
            s.alarm_attempt_failed(&a1, 1, NOW + 3000, "HTTP 500", false)
                .await
                .unwrap()
        );
        let replaced = s
            .set_alarm(&a1, NOW + 2000, "/tock", NOW + 5)
            .await
            .unwrap();
        let expected = Alarm {
            actor: a1.clone(),
            due_ms: NOW + 2000,
            path: "/tock".into(),
            seq: 2,
            attempts: 0,
            next_attempt_ms: NOW + 2000,
            last_error: String::new(),
            failed: false,
            set_ms: NOW + 5,
        };
        assert_eq!(replaced, expected);
        assert_eq!(s.get_alarm(&a1).await.unwrap(), Some(expected));

        // The seq is never reused, even after a delete: a delivery of seq 2 still in flight
        // must not take the next alarm for its own.
        assert!(s.delete_alarm(&a1, None).await.unwrap());
        assert_eq!(s.get_alarm(&a1).await.unwrap(), None);
        let again = s.set_alarm(&a1, NOW, "/again", NOW).await.unwrap();
        assert_eq!(again.seq, 3);

        let e = assert_err!(
            s.set_alarm(&ActorRef::new("ns", "nope"), NOW, "/tick", NOW)
                .await,
            StoreError::NotFound(_)
        );
        assert_eq!(e.to_string(), r#"actor "ns/nope" not found"#);
        assert_err!(
            s.set_alarm(&ActorRef::new("nowhere", "a1"), NOW, "/tick", NOW)
                .await,
            StoreError::NotFound(_)
        );
        assert_eq!(
            s.get_alarm(&ActorRef::new("ns", "nope")).await.unwrap(),
            None
        );
    }

    pub async fn alarm_claim_takes_due_alarms_in_order_under_a_lease(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1", "a2", "a3", "later", "gave-up"]).await;
        let set = |name: &'static str, due_ms: i64| async move {
            s.set_alarm(&ActorRef::new("ns", name), due_ms, "/alarm", NOW)
                .await
                .unwrap()
        };
        set("a1", NOW + 30).await;
        set("a2", NOW + 10).await;
        set("a3", NOW + 20).await;
        set("later", NOW + 1000).await;
        let gave_up = set("gave-up", NOW).await;
        assert!(
            s.alarm_attempt_failed(&gave_up.actor, gave_up.seq, NOW, "HTTP 503", true)
                .await
                .unwrap()
        );

        // Nothing is due yet.
        assert_eq!(s.claim_due_alarms(NOW + 5, 500, 10).await.unwrap(), vec![]);
        // Oldest first, at most `limit`, each leased until now + lease.
        let first = s.claim_due_alarms(NOW + 100, 500, 2).await.unwrap();
        assert_eq!(
            claimed(&first),
            vec![("a2".to_string(), NOW + 600), ("a3".to_string(), NOW + 600)]
        );
        assert_eq!(first[0].due_ms, NOW + 10, "due_ms stays as set");
        assert_eq!(
            s.get_alarm(&ActorRef::new("ns", "a2")).await.unwrap(),
            Some(first[0].clone()),
            "the claim is stored"
        );
        let second = s.claim_due_alarms(NOW + 100, 500, 10).await.unwrap();
        assert_eq!(claimed(&second), vec![("a1".to_string(), NOW + 600)]);
        // While the leases last, nobody claims them again.
        assert_eq!(
            s.claim_due_alarms(NOW + 599, 500, 10).await.unwrap(),
            vec![]
        );
        // A claim never completed: due again when its lease ends (ties by atespace, name).
        let retried = s.claim_due_alarms(NOW + 600, 500, 10).await.unwrap();
        assert_eq!(
            claimed(&retried),
            vec![
                ("a1".to_string(), NOW + 1100),
                ("a2".to_string(), NOW + 1100),
                ("a3".to_string(), NOW + 1100),
            ]
        );
        let at_due = s.claim_due_alarms(NOW + 1000, 500, 10).await.unwrap();
        assert_eq!(claimed(&at_due), vec![("later".to_string(), NOW + 1500)]);
        // The failed one is never claimed.
        assert_eq!(
            claimed(&s.claim_due_alarms(NOW + 100_000, 0, 10).await.unwrap()),
            vec![
                ("a1".to_string(), NOW + 100_000),
                ("a2".to_string(), NOW + 100_000),
                ("a3".to_string(), NOW + 100_000),
                ("later".to_string(), NOW + 100_000),
            ]
        );
        assert_eq!(
            s.claim_due_alarms(NOW + 100_000, 0, 0).await.unwrap(),
            vec![]
        );
    }

    pub async fn alarm_concurrent_claims_never_overlap(env: Env) {
        let s = env.store.as_ref();
        let names: Vec<String> = (0..24).map(|i| format!("a{i:02}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        seed_actors(s, &refs).await;
        for (i, name) in names.iter().enumerate() {
            s.set_alarm(
                &ActorRef::new("ns", name.as_str()),
                NOW + i as i64,
                "/a",
                NOW,
            )
            .await
            .unwrap();
        }
        // Each round every alarm is due again (the previous round's leases have ended); two
        // claimers share it without overlap, and together they take every alarm.
        for round in 0..5 {
            let now = NOW + 1000 + round * 1000;
            let (left, right) = tokio::join!(
                s.claim_due_alarms(now, 500, 16),
                s.claim_due_alarms(now, 500, 16)
            );
            let (left, right) = (left.unwrap(), right.unwrap());
            assert!(left.len() <= 16 && right.len() <= 16);
            let mut all: Vec<String> = left
                .iter()
                .chain(&right)
                .map(|a| a.actor.name.clone())
                .collect();
            all.sort();
            let total = all.len();
            all.dedup();
            assert_eq!(
                all.len(),
                total,
                "round {round}: an alarm was claimed twice"
            );
            assert_eq!(all, names, "round {round}: every due alarm is claimed");
        }
    }

    pub async fn alarm_failures_are_per_seq_and_give_up_stops_claims(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1"]).await;
        let a1 = ActorRef::new("ns", "a1");
        s.set_alarm(&a1, NOW, "/tick", NOW).await.unwrap();
        let current = s.set_alarm(&a1, NOW, "/tick", NOW).await.unwrap();
        assert_eq!(current.seq, 2);
        let claim = s.claim_due_alarms(NOW, 1000, 10).await.unwrap();
        assert_eq!(claim.len(), 1);

        // A report about the alarm that was replaced changes nothing.
        let before = s.get_alarm(&a1).await.unwrap();
        assert!(
            !s.alarm_attempt_failed(&a1, 1, NOW + 2000, "stale", true)
                .await
                .unwrap()
        );
        assert_eq!(s.get_alarm(&a1).await.unwrap(), before);

        // A retry: counted, with its error, at the time given.
        assert!(
            s.alarm_attempt_failed(&a1, 2, NOW + 2000, "HTTP 500", false)
                .await
                .unwrap()
        );
        let failed_once = s.get_alarm(&a1).await.unwrap().unwrap();
        assert_eq!(
            (
                failed_once.attempts,
                failed_once.last_error.as_str(),
                failed_once.next_attempt_ms,
                failed_once.failed
            ),
            (1, "HTTP 500", NOW + 2000, false)
        );
        assert_eq!(
            s.claim_due_alarms(NOW + 1999, 1000, 10).await.unwrap(),
            vec![]
        );
        let retry = s.claim_due_alarms(NOW + 2000, 1000, 10).await.unwrap();
        assert_eq!(claimed(&retry), vec![("a1".to_string(), NOW + 3000)]);
        assert_eq!(retry[0].attempts, 1);

        // Giving up: kept, marked failed, never claimed again.
        assert!(
            s.alarm_attempt_failed(&a1, 2, NOW + 3000, "connection refused", true)
                .await
                .unwrap()
        );
        let gave_up = s.get_alarm(&a1).await.unwrap().unwrap();
        assert_eq!(
            (
                gave_up.attempts,
                gave_up.last_error.as_str(),
                gave_up.failed
            ),
            (2, "connection refused", true)
        );
        assert_eq!(
            s.claim_due_alarms(i64::MAX, 1000, 10).await.unwrap(),
            vec![]
        );
        assert_eq!(s.list_alarms(None).await.unwrap(), vec![gave_up]);

        // Setting it again starts over.
        let fresh = s.set_alarm(&a1, NOW + 10, "/tick", NOW + 5).await.unwrap();
        assert_eq!(
            (
                fresh.seq,
                fresh.attempts,
                fresh.last_error.as_str(),
                fresh.failed
            ),
            (3, 0, "", false)
        );
        assert_eq!(
            claimed(&s.claim_due_alarms(NOW + 10, 1000, 10).await.unwrap()),
            vec![("a1".to_string(), NOW + 1010)]
        );
    }

    pub async fn alarm_delete_is_per_seq(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1"]).await;
        let a1 = ActorRef::new("ns", "a1");
        assert!(!s.delete_alarm(&a1, None).await.unwrap());
        assert!(!s.delete_alarm(&a1, Some(1)).await.unwrap());
        s.set_alarm(&a1, NOW, "/tick", NOW).await.unwrap();
        // Set again while a delivery of seq 1 ran: that delivery's delete keeps the new alarm.
        let current = s.set_alarm(&a1, NOW + 50, "/tick", NOW).await.unwrap();
        assert!(!s.delete_alarm(&a1, Some(1)).await.unwrap());
        assert_eq!(s.get_alarm(&a1).await.unwrap(), Some(current));
        assert!(s.delete_alarm(&a1, Some(2)).await.unwrap());
        assert_eq!(s.get_alarm(&a1).await.unwrap(), None);
        assert!(!s.delete_alarm(&a1, Some(2)).await.unwrap());
        // Without a seq (the actor's own DELETE), whatever alarm is there goes.
        s.set_alarm(&a1, NOW, "/tick", NOW).await.unwrap();
        assert!(s.delete_alarm(&a1, None).await.unwrap());
        assert_eq!(s.get_alarm(&a1).await.unwrap(), None);
        assert_eq!(
            s.claim_due_alarms(i64::MAX, 1000, 10).await.unwrap(),
            vec![]
        );
    }

    pub async fn alarm_goes_with_its_actor(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1", "a2"]).await;
        let a1 = ActorRef::new("ns", "a1");
        s.set_alarm(&a1, NOW, "/tick", NOW).await.unwrap();
        let kept = s
            .set_alarm(&ActorRef::new("ns", "a2"), NOW, "/tick", NOW)
            .await
            .unwrap();
        s.delete_actor(&a1, NOW).await.unwrap();
        assert_eq!(s.get_alarm(&a1).await.unwrap(), None);
        assert_eq!(s.list_alarms(None).await.unwrap(), vec![kept.clone()]);
        // An actor created again under the name has no alarm.
        s.create_actor(&actor("ns", "a1", "ns/t")).await.unwrap();
        assert_eq!(s.get_alarm(&a1).await.unwrap(), None);
        assert_eq!(
            claimed(&s.claim_due_alarms(NOW, 1000, 10).await.unwrap()),
            vec![("a2".to_string(), NOW + 1000)]
        );
        // The atespace empties as before: nothing of the alarms is left to hold it.
        s.delete_actor(&a1, NOW).await.unwrap();
        s.delete_actor(&ActorRef::new("ns", "a2"), NOW)
            .await
            .unwrap();
        assert_eq!(s.list_alarms(None).await.unwrap(), vec![]);
        s.delete_template("ns", "t").await.unwrap();
        s.delete_atespace("ns").await.unwrap();
    }

    pub async fn alarm_list_filters_by_atespace(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1", "a2"]).await;
        s.create_atespace("other", NOW).await.unwrap();
        s.create_actor(&actor("other", "a1", "ns/t")).await.unwrap();
        assert_eq!(s.list_alarms(None).await.unwrap(), vec![]);
        let ns_a1 = s
            .set_alarm(&ActorRef::new("ns", "a1"), NOW + 30, "/a", NOW)
            .await
            .unwrap();
        let ns_a2 = s
            .set_alarm(&ActorRef::new("ns", "a2"), NOW + 10, "/b", NOW)
            .await
            .unwrap();
        let other_a1 = s
            .set_alarm(&ActorRef::new("other", "a1"), NOW + 10, "/c", NOW)
            .await
            .unwrap();
        // By due time, then atespace, then name.
        assert_eq!(
            s.list_alarms(None).await.unwrap(),
            vec![ns_a2.clone(), other_a1.clone(), ns_a1.clone()]
        );
        assert_eq!(s.list_alarms(Some("ns")).await.unwrap(), vec![ns_a2, ns_a1]);
        assert_eq!(s.list_alarms(Some("other")).await.unwrap(), vec![other_a1]);
        assert_eq!(s.list_alarms(Some("none")).await.unwrap(), vec![]);
    }

    pub async fn atespace_quota_is_checked_in_the_bind(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1", "a2", "a3"]).await;
        s.create_atespace("other", NOW).await.unwrap();
        s.create_actor(&actor("other", "b1", "ns/t")).await.unwrap();
        s.register_worker(&worker("w1", cap(64_000, 64 << 30, 64), 1), NOW)
            .await
            .unwrap();
        let from = [ActorState::Suspended];
        let bind = |ns: &'static str, name: &'static str| async move {
            s.bind_actor(
                &ActorRef::new(ns, name),
                &from,
                "w1",
                demand(500, 128 * MIB),
                NOW,
            )
            .await
        };
        // No quota: no limit.
        bind("ns", "a1").await.unwrap();
        let quota = Capacity {
            slots: 2,
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
        };
        let ns = s.set_atespace_quota("ns", &quota).await.unwrap();
        assert_eq!(ns.quota, quota);
        assert_eq!(
            ns.usage,
            Capacity {
                slots: 1,
                cpu_millis: 500,
                memory_bytes: 128 * MIB
            }
        );
        bind("ns", "a2").await.unwrap();
        let used = Capacity {
            slots: 2,
            cpu_millis: 1000,
            memory_bytes: 256 * MIB,
        };
        assert_eq!(s.atespace_quota("ns").await.unwrap(), (quota, used));
        // No quota: zeros, and no usage read.
        assert_eq!(
            s.atespace_quota("other").await.unwrap(),
            (Capacity::default(), Capacity::default())
        );
        assert_err!(s.atespace_quota("nope").await, StoreError::NotFound(_));
        // The third would be over runningActors: refused, and nothing changed.
        let e = assert_err!(bind("ns", "a3").await, StoreError::QuotaExceeded { .. });
        assert_eq!(
            e.to_string(),
            r#"atespace "ns" has no quota left for the actor: runningActors 2 of 2 in use"#
        );
        let a3 = s.get_actor(&ActorRef::new("ns", "a3")).await.unwrap();
        assert_eq!((a3.state, a3.worker_id), (ActorState::Suspended, None));
        // A retried bind of an actor already counted passes.
        s.bind_actor(
            &ActorRef::new("ns", "a2"),
            &[ActorState::Resuming],
            "w1",
            demand(500, 128 * MIB),
            NOW,
        )
        .await
        .unwrap();
        // Another atespace is not limited by it.
        bind("other", "b1").await.unwrap();
        // CPU: 1000m in use of 1000m; memory is named when it is the one short.
        let release = Transition::new(&[ActorState::Resuming], ActorState::Suspended);
        s.release_actor(&ActorRef::new("ns", "a2"), release, None, NOW)
            .await
            .unwrap();
        let cpu = Capacity {
            slots: 0,
            cpu_millis: 700,
            memory_bytes: 0,
        };
        s.set_atespace_quota("ns", &cpu).await.unwrap();
        let e = assert_err!(bind("ns", "a3").await, StoreError::QuotaExceeded { .. });
        assert_eq!(
            e.to_string(),
            r#"atespace "ns" has no quota left for the actor: cpu 500m of 700m in use"#
        );
        let mem = Capacity {
            slots: 0,
            cpu_millis: 0,
            memory_bytes: 200 * MIB,
        };
        s.set_atespace_quota("ns", &mem).await.unwrap();
        let e = assert_err!(bind("ns", "a3").await, StoreError::QuotaExceeded { .. });
        assert_eq!(
            e.to_string(),
            r#"atespace "ns" has no quota left for the actor: memory 128Mi of 200Mi in use"#
        );
        // Cleared: no limit again; listed with its usage.
        s.set_atespace_quota("ns", &Capacity::default())
            .await
            .unwrap();
        bind("ns", "a3").await.unwrap();
        let listed = s.list_atespaces().await.unwrap();
        let ns = listed.iter().find(|a| a.name == "ns").unwrap();
        assert_eq!(ns.usage.slots, 2);
        assert_eq!(ns.quota, Capacity::default());
        assert_err!(
            s.set_atespace_quota("nope", &quota).await,
            StoreError::NotFound(_)
        );
    }

    /// `(reason, from, to, worker, message)` of every event of `ns/<name>`, oldest first.
    async fn events_of(s: &dyn Store, name: &str) -> Vec<(String, String, String, String, String)> {
        let query = EventQuery {
            atespace: Some("ns".into()),
            name: Some(name.into()),
            limit: 100,
            ..EventQuery::default()
        };
        let state = |s: Option<ActorState>| s.map_or(String::new(), |s| s.short().to_string());
        s.list_events(&query)
            .await
            .unwrap()
            .events
            .into_iter()
            .map(|e| {
                let worker = e.worker_id.unwrap_or_default();
                (
                    e.reason,
                    state(e.from_state),
                    state(e.to_state),
                    worker,
                    e.message,
                )
            })
            .collect()
    }

    pub async fn events_record_each_change_once(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1"]).await;
        s.register_worker(&worker("w1", cap(4000, 4096 * MIB, 8), 1), NOW)
            .await
            .unwrap();
        let a1 = ActorRef::new("ns", "a1");
        let from = [ActorState::Suspended];
        s.bind_actor(&a1, &from, "w1", demand(1, 1), NOW)
            .await
            .unwrap();
        // A retried bind changes nothing and records nothing.
        s.bind_actor(&a1, &from, "w1", demand(1, 1), NOW)
            .await
            .unwrap();
        let running = Transition::new(&[ActorState::Resuming], ActorState::Running)
            .with(ActorUpdate::with_note("for request r-1"));
        s.transition(&a1, running, NOW).await.unwrap();
        // A refused transition (compare-and-set failed) records nothing either.
        let refused = Transition::new(&[ActorState::Suspended], ActorState::Running);
        assert!(s.transition(&a1, refused, NOW).await.is_err());
        let suspending = Transition::new(&[ActorState::Running], ActorState::Suspending)
            .with(ActorUpdate::with_note("idle"));
        s.transition(&a1, suspending, NOW).await.unwrap();
        let done = Transition::new(&[ActorState::Suspending], ActorState::Suspended)
            .with(ActorUpdate::with_note("idle"));
        s.release_actor(&a1, done, Some(&snapshot("ns", "a1", 1, "n1")), NOW)
            .await
            .unwrap();
        s.revert_actor(&a1, &from, None, NOW).await.unwrap();
        s.delete_actor(&a1, NOW).await.unwrap();
        let row = |r: &str, f: &str, t: &str, w: &str, m: &str| {
            (r.to_string(), f.into(), t.into(), w.into(), m.to_string())
        };
        assert_eq!(
            events_of(s, "a1").await,
            vec![
                row("Created", "", "SUSPENDED", "", "from template ns/t"),
                row(
                    "Resuming",
                    "SUSPENDED",
                    "RESUMING",
                    "w1",
                    "placed on worker w1"
                ),
                row(
                    "Resumed",
                    "RESUMING",
                    "RUNNING",
                    "w1",
                    "for request r-1; running on worker w1"
                ),
                row("Suspending", "RUNNING", "SUSPENDING", "w1", "idle"),
                row(
                    "Suspended",
                    "SUSPENDING",
                    "SUSPENDED",
                    "w1",
                    "idle; generation 1 (memory) written on node n1"
                ),
                row(
                    "Reverted",
                    "SUSPENDED",
                    "SUSPENDED",
                    "",
                    "the next resume restores generation 1"
                ),
                row("Deleted", "SUSPENDED", "", "", ""),
            ]
        );
    }

    pub async fn events_filter_page_and_prune(env: Env) {
        let s = env.store.as_ref();
        seed_actors(s, &["a1", "a2"]).await;
        s.create_atespace("other", NOW).await.unwrap();
        let mut late = actor("other", "a1", "ns/t");
        late.created_ms = NOW + 10;
        s.create_actor(&late).await.unwrap();
        let all = s
            .list_events(&EventQuery {
                limit: 10,
                ..EventQuery::default()
            })
            .await
            .unwrap();
        let names: Vec<_> = all
            .events
            .iter()
            .map(|e| format!("{}/{}", e.atespace, e.name))
            .collect();
        assert_eq!(names, ["ns/a1", "ns/a2", "other/a1"]);
        assert!(all.events.windows(2).all(|w| w[0].id < w[1].id), "{all:?}");
        assert_eq!(all.newest_id, all.events[2].id);
        assert_eq!(all.events[2].time_ms, NOW + 10);
        assert_eq!(all.events[0].kind, EventKind::Normal);
        // Only the newest id.
        let head = s.list_events(&EventQuery::default()).await.unwrap();
        assert_eq!((head.events.len(), head.newest_id), (0, all.newest_id));
        // By atespace; after an id; the newest few, still oldest first.
        let ns = EventQuery {
            atespace: Some("ns".into()),
            limit: 10,
            ..EventQuery::default()
        };
        assert_eq!(
            s.list_events(&ns).await.unwrap().events,
            all.events[..2].to_vec()
        );
        let after = EventQuery {
            after_id: all.events[0].id,
            limit: 10,
            ..EventQuery::default()
        };
        assert_eq!(
            s.list_events(&after).await.unwrap().events,
            all.events[1..].to_vec()
        );
        let newest = EventQuery {
            limit: 2,
            newest: true,
            ..EventQuery::default()
        };
        assert_eq!(
            s.list_events(&newest).await.unwrap().events,
            all.events[1..].to_vec()
        );
        let oldest = EventQuery {
            limit: 2,
            ..EventQuery::default()
        };
        assert_eq!(
            s.list_events(&oldest).await.unwrap().events,
            all.events[..2].to_vec()
        );
        // Retention: older than NOW + 10 goes, in batches of the limit asked.
        assert_eq!(s.prune_events(NOW + 10, 1).await.unwrap(), 1);
        assert_eq!(s.prune_events(NOW + 10, 10).await.unwrap(), 1);
        assert_eq!(s.prune_events(NOW + 10, 10).await.unwrap(), 0);
        let left = s
            .list_events(&EventQuery {
                limit: 10,
                ..EventQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(left.events, all.events[2..].to_vec());
    }
}

// ---------------------------------------------------------------- open()

#[tokio::test]
async fn open_in_memory_sqlite() {
    let store = ate_store::open("sqlite::memory:").await.unwrap();
    seed(store.as_ref()).await;
    store
        .create_actor(&actor("ns", "a1", "ns/t"))
        .await
        .unwrap();
    assert_eq!(store.list_actors(None, None, 10).await.unwrap().len(), 1);
    // Each in-memory store is its own database.
    let other = ate_store::open("sqlite::memory:").await.unwrap();
    assert!(other.list_atespaces().await.unwrap().is_empty());
}

#[tokio::test]
async fn open_sqlite_plain_path_form() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ate.db");
    let store = ate_store::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    store.create_atespace("x", NOW).await.unwrap();
    assert!(path.exists());
}

#[tokio::test]
async fn open_rejects_unknown_scheme() {
    let e = assert_err!(
        ate_store::open("mysql://localhost/db").await.map(|_| ()),
        StoreError::Database(_)
    );
    assert!(e.to_string().contains("unsupported store URL"), "{e}");
}
