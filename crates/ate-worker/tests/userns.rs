//! Actors in their own user namespace (issue 30), probed as a hostile actor would: real runc +
//! CRIU, root; images as in sandbox.rs.
//!
//! From the host: every process of an actor has an unprivileged Uid/Gid inside its own range,
//! and the files it writes show that range. A process holding one actor's host ids (what a
//! runc or kernel escape would land as) cannot read or write another actor's upper dir or
//! volume, reach its processes (`/proc/<pid>/root`, `mem`, signals), create devices or mount.
//! From inside: mount/ptrace/unshare are refused, host loopback and the metadata address are
//! unreachable. A memory snapshot restores on another range with its memory and files intact.

mod common;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ate_worker::runc::userns::{self, RANGE_SIZE};
use ate_worker::{RunMode, RuncConfig, RuncRuntime, SandboxRuntime};
use common::{Env, counter_spec, get, run_until_healthy, wait_healthy};

/// Pids in the actor's `pids` cgroup (every process of the sandbox).
fn actor_pids(init: u32) -> Vec<u32> {
    let cgroups = std::fs::read_to_string(format!("/proc/{init}/cgroup")).expect("read cgroup");
    let path = cgroups
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "pids")
                .then(|| path.to_string())
        })
        .expect("pids cgroup");
    let procs = std::fs::read_to_string(format!("/sys/fs/cgroup/pids{path}/cgroup.procs"))
        .expect("read cgroup.procs");
    let pids: Vec<u32> = procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(
        pids.contains(&init),
        "init {init} not in its cgroup: {pids:?}"
    );
    pids
}

/// Asserts every id of `Uid:`/`Gid:` in `/proc/<pid>/status` is in `[base, base + 65536)`.
fn assert_ids_in_range(pid: u32, base: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    for field in ["Uid:", "Gid:"] {
        let ids: Vec<u32> = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .expect("field")
            .split_whitespace()
            .map(|v| v.parse().expect("id"))
            .collect();
        assert_eq!(ids.len(), 4, "{field} {ids:?}");
        for id in ids {
            assert!(
                id != 0 && (base..base + RANGE_SIZE).contains(&id),
                "pid {pid} {field} {id} outside its range {base}"
            );
        }
    }
}

/// Runs `program args` on the host with the uid/gid `id` (no supplementary groups): what an
/// escape from an actor of that range would run as. Returns (success, stderr).
fn run_as(id: u32, program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .uid(id)
        .gid(id)
        .output()
        .expect("spawn");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_refused(id: u32, program: &str, args: &[&str], what: &str) {
    let (ok, err) = run_as(id, program, args);
    assert!(!ok, "{what}: allowed for host id {id}");
    eprintln!("{what}: refused ({})", err.trim());
}

fn owner(path: &Path) -> (u32, u32) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    (m.uid(), m.gid())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actors_are_unprivileged_on_the_host_and_apart_from_each_other() {
    let mut env = Env::new();
    let claims = env.path().join("userns-ranges");
    let runtime = RuncRuntime::new(RuncConfig {
        userns: true,
        userns_claims_dir: claims.clone(),
        ..RuncConfig::new(env.state_dir())
    })
    .await
    .expect("runc runtime");
    let spec = counter_spec(&env).await;
    let a = env.actor("una", "uid-a");
    let b = env.actor("unb", "uid-b");
    let mut inits = Vec::new();
    for actor in [&a, &b] {
        let started = runtime
            .run(actor, &spec, RunMode::KeepRootfs)
            .await
            .expect("run counter");
        wait_healthy(actor, "counter ready (port 80 binds inside)").await;
        let (status, body) = get(actor, "/").await;
        assert_eq!(status, 200, "{body}");
        inits.push(started.pid.expect("init pid"));
    }
    let base_a = userns::recorded_base(&a.dir).expect("a's range");
    let base_b = userns::recorded_base(&b.dir).expect("b's range");
    assert!(
        base_a.abs_diff(base_b) >= RANGE_SIZE,
        "ranges overlap: {base_a} {base_b}"
    );

    // From the host: every process unprivileged, in its own range; its files show that range
    // through its root, and stay canonical on disk (0 = the actor's root), see runc/userns.rs.
    for (actor, init, base) in [(&a, inits[0], base_a), (&b, inits[1], base_b)] {
        let pids = actor_pids(init);
        for pid in &pids {
            assert_ids_in_range(*pid, base);
        }
        let root = PathBuf::from(format!("/proc/{init}/root"));
        assert_eq!(owner(&root.join("var/lib/counter/count")), (base, base));
        assert_eq!(owner(&root.join("data/counter")), (base, base));
        assert_eq!(
            owner(&actor.upper_dir().join("var/lib/counter/count")),
            (0, 0)
        );
        eprintln!("{}: pids {pids:?} in range {base}", actor.name);
    }

    // A process with a's host ids (an escape from a) against b.
    let b_upper_file = b.upper_dir().join("var/lib/counter/count");
    let b_volume_file = b.volume_dir("data").join("counter");
    let b_root_file = format!("/proc/{}/root/var/lib/counter/count", inits[1]);
    let s = |p: &Path| p.to_string_lossy().into_owned();
    assert_refused(base_a, "cat", &[&s(&b_upper_file)], "read b's upper dir");
    assert_refused(base_a, "cat", &[&s(&b_volume_file)], "read b's volume");
    assert_refused(
        base_a,
        "sh",
        &["-c", &format!("echo x >> {}", s(&b_upper_file))],
        "write b's upper dir",
    );
    assert_refused(
        base_a,
        "sh",
        &["-c", &format!("echo x >> {}", s(&b_volume_file))],
        "write b's volume",
    );
    assert_refused(base_a, "cat", &[&b_root_file], "read b's rootfs via /proc");
    assert_refused(
        base_a,
        "cat",
        &[&format!("/proc/{}/environ", inits[1])],
        "read b's environ",
    );
    assert_refused(
        base_a,
        "dd",
        &[&format!("if=/proc/{}/mem", inits[1]), "bs=1", "count=1"],
        "read b's memory",
    );
    assert_refused(
        base_a,
        "kill",
        &["-0", &inits[1].to_string()],
        "signal b's init",
    );
    let scratch = env.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    std::fs::set_permissions(
        &scratch,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod scratch");
    assert_refused(
        base_a,
        "mknod",
        &[&s(&scratch.join("mem")), "c", "1", "1"],
        "create a device node",
    );
    assert_refused(
        base_a,
        "mount",
        &["-t", "tmpfs", "none", &s(&scratch)],
        "mount",
    );
    // The refusals above are the ranges' doing: the same path in a's own dir lets a's ids
    // through (its actor dir's ACL), b's does not.
    let (own, err) = run_as(
        base_a,
        "cat",
        &[&s(&a.upper_dir().join("var/lib/counter/count"))],
    );
    assert!(own, "a reads its own upper dir: {err}");

    // From inside: privileged syscalls refused, no way to the host's loopback or metadata.
    let (_, report) = get(&a, "/sandbox").await;
    for name in ["mount", "ptrace", "unshare", "setns"] {
        assert!(
            report.contains(&format!("syscall {name}: errno 1")),
            "{name}: {report}"
        );
    }
    let host = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("host listener");
    let port = host.local_addr().expect("addr").port();
    for target in [
        format!("127.0.0.1:{port}"),
        "169.254.169.254:80".to_string(),
    ] {
        let (status, body) = get(&a, &format!("/connect?addr={target}")).await;
        assert_ne!(status, 200, "{target} reachable from inside: {body}");
    }

    // A memory snapshot of a restored on another range: a's old range is taken meanwhile.
    let images = env.path().join("checkpoint-a");
    runtime.checkpoint(&a, &images).await.expect("checkpoint a");
    assert!(userns::recorded_base(&a.dir).is_none(), "range kept");
    let old_index = (base_a - userns::FIRST_BASE) / RANGE_SIZE;
    std::fs::write(claims.join(old_index.to_string()), s(env.path())).expect("occupy");
    let restored = runtime.restore(&a, &spec, &images).await.expect("restore");
    wait_healthy(&a, "restored ready").await;
    let new_base = userns::recorded_base(&a.dir).expect("range after restore");
    assert_ne!(new_base, base_a, "restored on the same range");
    let (status, body) = get(&a, "/").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("preserved memory count: 2")
            && body.contains("preserved file counter: 2")
            && body.contains("preserved rootfs counter: 2"),
        "memory or files lost across ranges: {body}"
    );
    let init = restored.pid.expect("restored pid");
    let mut seen = HashSet::new();
    for pid in actor_pids(init) {
        assert_ids_in_range(pid, new_base);
        seen.insert(pid);
    }
    assert!(!seen.is_empty());
    let root = PathBuf::from(format!("/proc/{init}/root"));
    assert_eq!(
        owner(&root.join("var/lib/counter/count")),
        (new_base, new_base)
    );

    for actor in [&a, &b] {
        runtime.stop(actor).await.expect("stop");
    }
    let left: Vec<_> = std::fs::read_dir(&claims)
        .expect("claims")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec![old_index.to_string()],
        "claims left besides the test's"
    );
    env.assert_clean();
}

/// A generation written before user namespaces (no `userns-*.img`) is restored without one by a
/// worker in user-namespace mode (memory and files intact, as before), and the next fresh run
/// of that actor gets its own user namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_dumped_without_a_user_namespace_restores_without_one() {
    let mut env = Env::new();
    let claims = env.path().join("userns-ranges");
    let state = env.state_dir();
    let config = |userns| RuncConfig {
        userns,
        userns_claims_dir: claims.clone(),
        ..RuncConfig::new(&state)
    };
    let before = RuncRuntime::new(config(false)).await.expect("runtime");
    let spec = counter_spec(&env).await;
    let a = env.actor("unold", "uid-a");
    let started = run_until_healthy(&before, &a, &spec, "run without a user namespace").await;
    let (_, body) = get(&a, "/").await;
    assert!(body.contains("preserved memory count: 1"), "{body}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", started.pid.expect("pid")))
        .expect("status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")),
        "without a user namespace the actor's root is host root"
    );
    let images = env.path().join("checkpoint-old");
    before.checkpoint(&a, &images).await.expect("checkpoint");
    assert!(!userns::image_has_userns(&images));
    drop(before);

    let after = RuncRuntime::new(config(true)).await.expect("runtime");
    let restored = after.restore(&a, &spec, &images).await.expect("restore");
    wait_healthy(&a, "restored ready").await;
    let (_, body) = get(&a, "/").await;
    assert!(
        body.contains("preserved memory count: 2") && body.contains("preserved file counter: 2"),
        "{body}"
    );
    assert!(
        userns::recorded_base(&a.dir).is_none(),
        "restored in a userns"
    );
    let _ = restored;
    // A fresh run now: its own user namespace, the files written without one still readable.
    after.stop(&a).await.expect("stop");
    let fresh = run_until_healthy(&after, &a, &spec, "run in a user namespace").await;
    let base = userns::recorded_base(&a.dir).expect("range");
    assert_ids_in_range(fresh.pid.expect("pid"), base);
    let (_, body) = get(&a, "/").await;
    assert!(
        body.contains("preserved memory count: 1") && body.contains("preserved file counter: 3"),
        "{body}"
    );
    after.stop(&a).await.expect("stop");
    env.assert_clean();
}
