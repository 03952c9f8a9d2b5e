//! External volumes in placement (issue 37), the api over loopback gRPC with scripted node
//! agents, on SQLite and PostgreSQL: an actor whose template has a node-local external
//! `hostPath` volume goes back to the node it last ran on — it waits for room there rather
//! than move away from its data — while one marked `shared` moves like any other.

mod common;

use std::sync::atomic::Ordering;

use ate_proto::v1::*;
use common::*;
use tonic::Code;

fn with_external_volume(ns: &str, shared: bool) -> ActorTemplate {
    let mut t = template(ns, "t");
    if let Some(spec) = t.spec.as_mut() {
        spec.volumes = vec![Volume {
            name: "work".into(),
            mount_path: "/work".into(),
            external_host_path: "/var/lib/ate/volumes/work".into(),
            external_shared: shared,
        }];
    }
    t
}

async fn apply(t: &TestApi, template: ActorTemplate) {
    t.templates()
        .apply_template(ApplyTemplateRequest {
            template: Some(template),
        })
        .await
        .expect("apply template");
}

async fn a_node_local_external_volume_keeps_the_actor_on_its_node(b: Backend) {
    let t = TestApi::start(b, cfg()).await;
    let n1 = t.one_worker(1).await;
    let n2 = TestNode::start("node-2").await;
    apply(&t, with_external_volume("ns", false)).await;
    t.create_actor("ns", "a").await;
    t.create_actor("ns", "b").await;
    t.resume("ns", "a").await.expect("resume a");
    t.suspend("ns", "a").await.expect("suspend a");
    // b fills node-1; another node has room.
    t.resume("ns", "b").await.expect("resume b");
    t.register(&n2, "w2", 4).await;
    let err = t.resume("ns", "a").await.err();
    assert_eq!(
        err.as_ref().map(|e| e.code()),
        Some(Code::ResourceExhausted),
        "{err:?}"
    );
    assert_eq!(n1.calls().detach.load(Ordering::SeqCst), 0);
    assert_eq!(n2.calls().restore.load(Ordering::SeqCst), 0);

    // On storage every node mounts: it moves to the room (its generation detached first).
    apply(&t, with_external_volume("ns", true)).await;
    let r = t.resume("ns", "a").await.expect("resume a elsewhere");
    assert_eq!(
        r.actor
            .and_then(|a| a.worker_assignment)
            .map(|w| w.worker_id),
        Some("w2".to_string())
    );
    assert_eq!(n1.calls().detach.load(Ordering::SeqCst), 1);

    // Node-local again, and node-2 is where it ran last: it goes back there, even when its
    // newest generation is durable and node-1 has room.
    apply(&t, with_external_volume("ns", false)).await;
    t.suspend("ns", "b").await.expect("suspend b");
    t.suspend("ns", "a").await.expect("suspend a on node-2");
    let r = t.resume("ns", "a").await.expect("resume a");
    assert_eq!(
        r.actor
            .and_then(|a| a.worker_assignment)
            .map(|w| w.worker_id),
        Some("w2".to_string())
    );
}
both_stores!(
    pinned_by_volume,
    a_node_local_external_volume_keeps_the_actor_on_its_node
);
