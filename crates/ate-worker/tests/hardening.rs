//! The sandbox hardening (src/hardening.rs) is in force inside a real runc sandbox, on a cold
//! start and after a CRIU memory restore (root; images as in sandbox.rs).
//!
//! Two views: the host reads `/proc/<init pid>/status` (what the kernel enforces, whatever the
//! workload says), and the counter's `GET /sandbox` reports what refused syscalls and masked or
//! read-only paths answer from inside.

mod common;

use std::collections::HashMap;
use std::path::Path;

use ate_worker::{ActorSandbox, SandboxRuntime, hardening};
use common::{Env, counter_spec, criu_runtime, get, run_until_healthy, wait_healthy};

const EPERM: &str = "errno 1";
const ENOSYS: &str = "errno 38";
const EROFS: &str = "errno 30";
const EACCES: &str = "errno 13";
const ENOENT: &str = "errno 2";

/// `key: value` lines → map.
fn fields(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The container's init process as the host kernel sees it.
fn host_status(pid: u32) -> HashMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read host status");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn hex_mask(v: &str) -> u64 {
    u64::from_str_radix(v, 16).unwrap_or_else(|e| panic!("capability mask {v:?}: {e}"))
}

/// Asserts the kernel-side facts for `pid` and the in-sandbox report of the actor.
async fn assert_hardened(actor: &ActorSandbox, pid: u32, when: &str) {
    let caps = hardening::capability_mask().expect("known capability names");
    let st = host_status(pid);
    assert_eq!(st["NoNewPrivs"], "1", "{when}: no_new_privs");
    assert_eq!(st["Seccomp"], "2", "{when}: seccomp filter mode");
    assert!(
        st.get("Seccomp_filters")
            .is_none_or(|n| n.parse::<u32>().is_ok_and(|n| n >= 1)),
        "{when}: Seccomp_filters {:?}",
        st.get("Seccomp_filters")
    );
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(hex_mask(&st[set]), caps, "{when}: {set} = {}", st[set]);
    }
    for set in ["CapInh", "CapAmb"] {
        assert_eq!(hex_mask(&st[set]), 0, "{when}: {set} = {}", st[set]);
    }
    // The pids limit of the actor's cgroup (v1 `pids` controller, or the unified hierarchy).
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read cgroup");
    let pids_max = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let dir = if controllers.split(',').any(|c| c == "pids") {
            format!("/sys/fs/cgroup/pids{path}")
        } else if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}")
        } else {
            return None;
        };
        std::fs::read_to_string(format!("{dir}/pids.max")).ok()
    });
    assert_eq!(
        pids_max.as_deref().map(str::trim),
        Some(hardening::PIDS_LIMIT.to_string().as_str()),
        "{when}: pids.max ({cgroups})"
    );

    let (status, body) = get(actor, "/sandbox").await;
    assert_eq!(status, 200, "{when}: {body}");
    assert!(
        body.contains("Seccomp:"),
        "the counter image predates GET /sandbox (it answered {body:?}): rebuild it with \
         workloads/build-images.sh into $ATE_TEST_IMAGES"
    );
    eprintln!("{when}: /sandbox\n{body}");
    let inside = fields(&body);
    assert_eq!(inside["NoNewPrivs"], "1", "{when}: {body}");
    assert_eq!(inside["Seccomp"], "2", "{when}: {body}");
    assert_eq!(hex_mask(&inside["CapEff"]), caps, "{when}: {body}");
    // The kernel alone would answer EINVAL/EBADF/ESRCH/EFAULT/a keyring id to these probes
    // (see workloads/counter/src/sandbox.rs): EPERM / ENOSYS means the filter answered.
    for name in [
        "unshare",
        "setns",
        "ptrace",
        "keyctl",
        "userfaultfd",
        "bpf",
        "io_uring_setup",
        "clone(CLONE_NEWUSER)",
        "mount",
    ] {
        assert_eq!(
            inside[&format!("syscall {name}")],
            EPERM,
            "{when}: {name}: {body}"
        );
    }
    assert_eq!(inside["syscall clone3"], ENOSYS, "{when}: {body}");
    // Masked: bound to /dev/null. Read-only: EROFS. (A path this kernel lacks, e.g. /proc/kcore
    // without CONFIG_PROC_KCORE, is absent inside too: ENOENT.)
    let absent_on_host = |path: &str| !Path::new(path).exists();
    for path in ["/proc/kcore", "/proc/keys", "/proc/timer_list"] {
        let want = if absent_on_host(path) {
            ENOENT
        } else {
            "0 bytes"
        };
        assert_eq!(inside[&format!("read {path}")], want, "{when}: {body}");
    }
    // In its own user namespace the write is refused earlier still: the file's owner (host
    // root) is not mapped there (EACCES before the read-only mount's EROFS).
    for path in ["/proc/sys/kernel/domainname", "/proc/sysrq-trigger"] {
        let got = &inside[&format!("write {path}")];
        if absent_on_host(path) {
            assert_eq!(got, ENOENT, "{when}: {body}");
        } else {
            assert!(got == EROFS || got == EACCES, "{when}: {path}: {body}");
        }
    }
    // Threads still start (clone3 → ENOSYS → clone fallback): the counter serves each
    // connection on a new thread, and this is a new connection.
    let (status, _) = get(actor, "/healthz").await;
    assert_eq!(status, 200);
}

/// Files under `dir` with their contents (the image's rootfs: small).
fn snapshot_tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("list image dir").flatten() {
            let p = e.path();
            let ft = e.file_type().expect("file type");
            let rel = p
                .strip_prefix(dir)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_default();
            if ft.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                stack.push(p);
            } else if ft.is_file() {
                out.push((rel, std::fs::read(&p).expect("read image file")));
            } else {
                out.push((rel, Vec::new()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardening_holds_on_cold_start_and_after_memory_restore() {
    let mut env = Env::new();
    let runtime = criu_runtime(&env).await;
    let spec = counter_spec(&env).await;
    let image_before = snapshot_tree(&spec.image.rootfs);
    let actor = env.actor("hard", "uid-1");

    let started = run_until_healthy(&runtime, &actor, &spec, "run counter").await;
    let (status, body) = get(&actor, "/").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("preserved memory count: 1"), "{body}");
    assert_hardened(&actor, started.pid.expect("init pid"), "cold start").await;

    // Writes land in the actor's upper dir; the shared image layer (overlay lower) is untouched.
    assert!(
        actor.upper_dir().join("var/lib/counter/count").is_file(),
        "rootfs counter not in the upper dir"
    );
    let mounts = std::fs::read_to_string("/proc/mounts").expect("read /proc/mounts");
    let overlay = mounts
        .lines()
        .find(|l| l.contains(&*actor.rootfs_dir().to_string_lossy()))
        .expect("actor overlay mount");
    // The image layer itself, or (user namespaces) its idmapped clone under the actor dir.
    let idmapped_lower = actor.dir.join("idmap").join("lower-");
    assert!(
        overlay.contains(&format!("lowerdir={}", spec.image.rootfs.display()))
            || overlay.contains(&format!("lowerdir={}", idmapped_lower.display())),
        "{overlay}"
    );

    // Memory checkpoint and restore: CRIU puts the filter, no_new_privs and the capability sets
    // back; the memory counter proves it is the same process image.
    let images = env.path().join("checkpoint");
    runtime
        .checkpoint(&actor, &images)
        .await
        .expect("checkpoint a hardened actor");
    let restored = runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("restore a hardened actor");
    wait_healthy(&actor, "restored counter ready").await;
    let (status, body) = get(&actor, "/").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("preserved memory count: 2"), "{body}");
    assert_hardened(&actor, restored.pid.expect("restored init pid"), "restore").await;

    // A ROOTFS restart gets the same config again.
    runtime.stop(&actor).await.expect("stop");
    let again = run_until_healthy(&runtime, &actor, &spec, "rootfs restart").await;
    assert_hardened(&actor, again.pid.expect("init pid"), "rootfs restart").await;

    runtime.stop(&actor).await.expect("stop");
    assert_eq!(
        snapshot_tree(&spec.image.rootfs),
        image_before,
        "the image layer changed"
    );
    env.assert_clean();
}
