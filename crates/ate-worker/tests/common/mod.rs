//! Shared fixture for the sandbox tests: built demo images, a per-test temp dir and runc root,
//! and a Drop guard that removes every host-side trace (containers, mounts, netns, cgroups) even
//! when the test panics.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub use ate_test_support::fs::unique_name;
use ate_worker::ActorSandbox;

/// Directory with `counter/` and `sleeper/` OCI layouts: `$ATE_TEST_IMAGES`, or built once per
/// test process with `workloads/build-images.sh` into a temp dir (panics with the reason if that fails).
pub fn images_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("ATE_TEST_IMAGES").filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("counter/index.json").is_file(),
                "ATE_TEST_IMAGES={} has no counter/index.json; run workloads/build-images.sh into it",
                dir.display()
            );
            return dir;
        }
        // Shared by all test processes of this target dir; the flock keeps parallel test
        // processes from running the (incremental, idempotent) build script at the same time.
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/build-images.sh");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ate-test-images");
        let lock_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ate-test-images.lock");
        let lock_file = std::fs::File::create(&lock_path).expect("create image build lock");
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("lock image build");
        let status = Command::new("bash").arg(&script).arg(&out).status();
        match status {
            Ok(s) if s.success() => out,
            other => panic!(
                "ATE_TEST_IMAGES is unset and `{} {}` failed ({other:?}); build the images or set ATE_TEST_IMAGES",
                script.display(),
                out.display()
            ),
        }
    })
    .clone()
}

pub fn counter_ref() -> String {
    format!("oci-layout:{}", images_dir().join("counter").display())
}

/// Per-test root; cleans up on drop.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub actors: Vec<ActorSandbox>,
    pub extra_netns: Vec<String>,
    /// runc `--root` dirs besides [`Env::runc_root`] (workers keep theirs under their own dir).
    pub runc_roots: Vec<PathBuf>,
}

impl Env {
    pub fn new() -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "sandbox tests need root (runc, netns, mounts)"
        );
        let dir = tempfile::Builder::new()
            .prefix("ate-worker-test-")
            .tempdir()
            .expect("temp dir");
        Env {
            dir,
            actors: Vec::new(),
            extra_netns: Vec::new(),
            runc_roots: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path().join("state")
    }

    pub fn runc_root(&self) -> PathBuf {
        self.state_dir().join("runc")
    }

    pub fn actor(&mut self, prefix: &str, uid: &str) -> ActorSandbox {
        let name = unique_name(prefix);
        let a = ActorSandbox::new(
            "test",
            name.clone(),
            uid,
            self.path().join("actors").join(name),
        );
        self.actors.push(a.clone());
        a
    }

    fn all_runc_roots(&self) -> Vec<PathBuf> {
        let mut roots = vec![self.runc_root()];
        roots.extend(self.runc_roots.iter().cloned());
        roots
    }

    /// Asserts nothing of ours is left on the host (call at the end of a passing test).
    pub fn assert_clean(&self) {
        for root in self.all_runc_roots() {
            if !root.exists() {
                continue;
            }
            let out = Command::new("runc")
                .arg("--root")
                .arg(&root)
                .args(["list", "-q"])
                .output()
                .expect("runc list");
            let list = String::from_utf8_lossy(&out.stdout);
            assert!(list.trim().is_empty(), "runc containers left: {list}");
        }
        let netns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        let netns = String::from_utf8_lossy(&netns.stdout);
        for a in &self.actors {
            assert!(!netns.contains(&a.netns()), "netns {} left", a.netns());
        }
        for n in &self.extra_netns {
            assert!(!netns.contains(n.as_str()), "netns {n} left");
        }
        let mounts = std::fs::read_to_string("/proc/mounts").expect("read /proc/mounts");
        let here = self.path().to_string_lossy().into_owned();
        assert!(!mounts.contains(&here), "mounts left under {here}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Synchronous on purpose: it must also run while a panicking test unwinds.
        for a in &self.actors {
            let id = a.container_id();
            for root in self.all_runc_roots().iter().filter(|r| r.exists()) {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(root)
                    .args(["kill", &id, "KILL"])
                    .output();
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(root)
                    .args(["delete", "-f", &id])
                    .output();
            }
            let _ = nix::mount::umount2(&a.rootfs_dir(), nix::mount::MntFlags::MNT_DETACH);
            let _ = Command::new("ip")
                .args(["netns", "delete", &a.netns()])
                .output();
            if let Ok(hs) = std::fs::read_dir("/sys/fs/cgroup") {
                for h in hs.flatten() {
                    let _ = std::fs::remove_dir(h.path().join("ate").join(a.short_id()));
                }
            }
        }
        for n in &self.extra_netns {
            if ate_netns::exists(n) {
                let _ = Command::new("ip").args(["netns", "delete", n]).output();
            }
        }
        // Whatever is still mounted under the test dir (idmapped clones, sidecar overlays),
        // deepest first.
        let here = self.path().to_path_buf();
        let mut points: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(&here))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
        // User namespace range claims held by this test's actors (node-wide claims dir).
        if let Ok(claims) = std::fs::read_dir(ate_worker::runc::userns::DEFAULT_CLAIMS_DIR) {
            for c in claims.flatten() {
                if std::fs::read_to_string(c.path()).is_ok_and(|o| Path::new(&o).starts_with(&here))
                {
                    let _ = std::fs::remove_file(c.path());
                }
            }
        }
    }
}

/// The counter demo as a sandbox spec: its image unpacked under the test dir, a `data` volume,
/// 0.5 CPU and 128 MiB.
/// The runc runtime on `env`'s state dir.
pub async fn runc_runtime(env: &Env) -> ate_worker::RuncRuntime {
    ate_worker::RuncRuntime::new(ate_worker::RuncConfig::new(env.state_dir()))
        .await
        .expect("runc runtime")
}

/// [`runc_runtime`], which must be able to restore memory (CRIU).
pub async fn criu_runtime(env: &Env) -> ate_worker::RuncRuntime {
    use ate_worker::SandboxRuntime as _;
    let runtime = runc_runtime(env).await;
    assert!(
        runtime.capabilities().can_restore_memory,
        "CRIU ≥ 4.2 must be installed for this test"
    );
    runtime
}

/// How long an actor may take to answer its wakeup probe.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Waits until `actor` answers `/healthz` on port 80: how long that took; panics with `what`
/// otherwise.
pub async fn wait_healthy(actor: &ActorSandbox, what: &str) -> std::time::Duration {
    ate_worker::probe::wait_ready(&actor.netns(), 80, "/healthz", PROBE_TIMEOUT)
        .await
        .expect(what)
}

/// Runs `actor` from `spec` (keeping its rootfs) and waits until it answers its probe; panics
/// naming `what` otherwise.
pub async fn run_until_healthy(
    runtime: &impl ate_worker::SandboxRuntime,
    actor: &ActorSandbox,
    spec: &ate_worker::SandboxSpec,
    what: &str,
) -> ate_worker::Started {
    let started = runtime
        .run(actor, spec, ate_worker::RunMode::KeepRootfs)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    wait_healthy(actor, &format!("{what}: ready")).await;
    started
}

pub async fn counter_spec(env: &Env) -> ate_worker::SandboxSpec {
    let image = ate_worker::ImageCache::new(env.path().join("images"))
        .ensure(&counter_ref())
        .await
        .expect("unpack counter");
    ate_worker::SandboxSpec {
        image,
        command: vec![],
        env: vec![],
        port: 80,
        volumes: vec![ate_core::template::Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            external: None,
        }],
        mounts: vec![ate_core::template::Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            external: None,
        }],
        resources: ate_core::template::Resources {
            cpu_millis: 500,
            memory_bytes: 128 << 20,
        },
        name: "counter".into(),
        exit_policy: Default::default(),
        sidecars: vec![],
    }
}

/// `GET path` on the actor's port 80 from inside its netns: (status, body).
pub async fn get(actor: &ActorSandbox, path: &str) -> (u16, String) {
    let addr = std::net::SocketAddr::new(ate_netns::ACTOR_IP.into(), 80);
    ate_worker::probe::get(
        &actor.netns(),
        addr,
        path,
        std::time::Duration::from_secs(5),
    )
    .await
    .expect("GET in actor netns")
}
