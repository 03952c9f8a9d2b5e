//! External volumes end to end (issue 37, item 1), through `ate up` on real runc + CRIU workers
//! in their own user namespaces: a counter whose `/data` is an external `hostPath` volume
//! keeps its file count across a suspend, a move to the other worker, a revert (which rolls
//! memory and rootfs back, not the volume) and its deletion; the files sit on the node in
//! canonical form (`<hostPath>/<atespace>/<actor>/counter`) until `ate delete actor
//! --purge-volumes`; a volume outside the workers' allowed roots fails the start with a clear
//! `lastError`.

mod support;

use support::actors::*;
use support::*;

fn apply(sys: &System, ns: &str, name: &str, host_path: &str) {
    let tpl = Tpl {
        external_host_path: Some(host_path.to_string()),
        ..Tpl::counter()
    };
    sys_apply(sys, ns, name, &tpl);
}

#[test]
fn an_external_volume_outlives_suspends_moves_reverts_and_deletes() {
    let ns = "ns-extvol";
    let sys = System::up(UpOptions::default());
    // `ate up` lets external volumes live under STATE_DIR/volumes.
    let host = sys.state_dir().join("volumes").join("work");
    apply(&sys, ns, "ext", &host.display().to_string());
    create_actor(&sys, ns, "c", "ext");
    let target = format!("{ns}/c");
    let on_node = host.join(ns).join("c").join("counter");

    get_ok(&sys, &target, "/");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (2, 2, 2));
    assert_eq!(
        std::fs::read_to_string(&on_node)
            .expect("the counter's file is on the node")
            .trim(),
        "2"
    );

    // Suspend and resume (a thaw of the frozen copy): everything continues.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (3, 3, 3));

    // Generation 2 holds 3. Moved to the other worker of the node: restored there from it,
    // with the same external directory attached.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    let here = worker_of(&sys, ns, "c");
    let there = pin_to_other_worker(&sys, ns, "c", &here);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 4, 4));
    assert_eq!(worker_of(&sys, ns, "c"), there);

    // A revert to generation 2 rolls memory and rootfs back to 3, not the volume (at 4).
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    sys.ate_ok(&["revert", "actor", "c", "-a", ns, "--generation", "2"]);
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (4, 5, 4));
    assert_eq!(std::fs::read_to_string(&on_node).expect("read").trim(), "5");

    // Deleted: the directory stays; an actor of the same name finds it again.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    sys.ate_ok(&["delete", "actor", "c", "-a", ns]);
    assert!(
        on_node.exists(),
        "deleting the actor kept its external volume"
    );
    create_actor(&sys, ns, "c", "ext");
    assert_eq!(counts(&get_ok(&sys, &target, "/")), (1, 6, 1));

    // Deleted with --purge-volumes: the directory goes too.
    sys.ate_ok(&["suspend", "actor", "c", "-a", ns]);
    let out = sys.ate_ok(&["delete", "actor", "c", "-a", ns, "--purge-volumes"]);
    assert!(
        out.contains("external volume directories purged: 1"),
        "{out}"
    );
    assert!(!host.join(ns).join("c").exists(), "the volume was purged");
    assert!(host.is_dir(), "the hostPath itself stays");
}

#[test]
fn an_external_volume_outside_the_allowed_roots_fails_the_start_clearly() {
    let ns = "ns-extvol-bad";
    let sys = System::up(UpOptions::default());
    // Under the test's own dir, not under STATE_DIR/volumes.
    let outside = sys.dir.path().join("elsewhere");
    apply(&sys, ns, "bad", &outside.display().to_string());
    create_actor(&sys, ns, "b", "bad");
    let (status, _, body) = get(sys.router_addr, &format!("{ns}/b"), "/");
    assert_ne!(status, 200, "{body}");
    let a = actor(&sys, ns, "b");
    let why = a["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("external volume \"data\"") && why.contains("not under an allowed root"),
        "lastError: {a}"
    );
    assert!(!outside.exists(), "nothing was made outside the roots");
    assert_ne!(state_of(&a), "ACTOR_STATE_RUNNING", "{a}");
}
