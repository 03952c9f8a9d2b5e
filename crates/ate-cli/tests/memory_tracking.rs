//! Memory tracking for incremental dumps (issue 32), on real runc + CRIU (patch 0003) + the
//! real page source (`ate page-source --write-protect`): a lazily restored sleeper writes 1 %
//! of its memory, and the next dump holds about that much, leaving the rest to the images it
//! was restored from; a restore of that dump (CRIU follows its `parent` link) has every byte.
//! When tracking is lost (the page source gone) the dump is whole, and still restores. Real
//! runtimes too: Python (obmalloc arenas, threads) and Node (V8's moving GC, its own mmap,
//! madvise and mremap), whose state hashes the same after a restore of an incremental dump.

// The worker's own sandbox-test harness (temp state, actors cleaned up even on a panic).
#[path = "../../ate-worker/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ate_core::template::Resources;
use ate_worker::lazy::{Outcome, Tracking};
use ate_worker::{
    ActorSandbox, ImageCache, RunMode, RuncConfig, RuncRuntime, SandboxRuntime, SandboxSpec,
};
use common::{Env, get, images_dir};

/// The sleeper's memory; `ATE_TRACKING_TEST_MIB` makes it larger for a measurement by hand
/// (docs/benchmarks.md, "Incremental dumps").
fn mib() -> u64 {
    std::env::var("ATE_TRACKING_TEST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

fn page_source() -> Vec<String> {
    vec![env!("CARGO_BIN_EXE_ate").to_string(), "page-source".into()]
}

async fn sleeper_spec(env: &Env) -> SandboxSpec {
    let reference = format!("oci-layout:{}", images_dir().join("sleeper").display());
    let image = ImageCache::new(env.path().join("images"))
        .ensure(&reference)
        .await
        .expect("unpack sleeper");
    SandboxSpec {
        image,
        command: vec![],
        env: vec![("SLEEPER_MEMORY_MIB".into(), mib().to_string())],
        port: 80,
        volumes: vec![],
        mounts: vec![],
        resources: Resources {
            cpu_millis: 1000,
            memory_bytes: (2 * mib() + 256) << 20,
        },
        name: "sleeper".into(),
        exit_policy: Default::default(),
        sidecars: vec![],
    }
}

/// A generation of `images` (a `criu/` dir under `gen`) with chunk digests, as the page source
/// needs (plaintext: these tests run no snapshot keys).
async fn seal(gen_dir: &Path, actor: &ActorSandbox) {
    let meta = ate_snapshot::GenerationMeta {
        atespace: actor.atespace.clone(),
        name: actor.name.clone(),
        generation: 1,
        uuid: "u-1".into(),
        fidelity: ate_core::Fidelity::Memory,
        template: "test/sleeper".into(),
        sandbox_class: "runc".into(),
        node: "n".into(),
        boot_id: "b".into(),
        created_unix_ms: 1,
        reason: String::new(),
        parent: None,
    };
    ate_snapshot::seal_generation(gen_dir, meta, Some(&actor.upper_dir()), &[])
        .await
        .expect("seal the generation");
}

/// Bytes of the memory images (`pages-*.img`) in a CRIU images dir.
fn pages_bytes(images: &Path) -> u64 {
    std::fs::read_dir(images)
        .expect("list images")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum()
}

async fn checksum(actor: &ActorSandbox) -> String {
    let (status, body) = get(actor, "/").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("holding {} MiB", mib())), "{body}");
    body
}

/// Waits until the actor answers `/healthz`.
async fn ready(actor: &ActorSandbox) {
    ate_worker::probe::wait_ready(&actor.netns(), 80, "/healthz", PROBE_TIMEOUT)
        .await
        .expect("the actor answers /healthz");
}

/// A lazy restore of `gen_dir` with tracking, once the actor answers and every page is in.
async fn restore_tracked(
    runtime: &RuncRuntime,
    actor: &ActorSandbox,
    spec: &SandboxSpec,
    gen_dir: &Path,
) -> ate_worker::lazy::PageSource {
    let (_, source) = runtime
        .restore_lazily(actor, spec, gen_dir, &page_source())
        .await
        .expect("lazy restore with tracking");
    assert!(source.tracks_memory());
    ready(actor).await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), source.finished())
        .await
        .expect("every page in within a minute");
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    source
}

/// The incremental dump `delta` (a CRIU images dir) flattened onto the generation `parent`
/// into the generation `next`, sealed.
async fn flatten_into(delta: &Path, parent: &Path, next: &Path, actor: &ActorSandbox) {
    let flat = ate_generation::images::flatten::flatten(
        delta,
        &parent.join(ate_snapshot::CRIU_DIR),
        &next.join(ate_snapshot::CRIU_DIR),
    )
    .expect("flatten");
    assert!(flat.parent_pages > 0 && flat.own_pages > 0, "{flat:?}");
    seal(next, actor).await;
}

/// Runs the sleeper, dumps it whole into `gen1`, restores it lazily with tracking and waits
/// until every page is in.
async fn tracked_sleeper(
    env: &mut Env,
    runtime: &RuncRuntime,
    spec: &SandboxSpec,
) -> (
    ActorSandbox,
    PathBuf,
    ate_worker::lazy::PageSource,
    Duration,
) {
    let actor = env.actor("track", "uid-1");
    runtime
        .run(&actor, spec, RunMode::KeepRootfs)
        .await
        .expect("run sleeper");
    ready(&actor).await;
    let gen1 = env.path().join("gen1");
    let whole = runtime
        .checkpoint(&actor, &gen1.join(ate_snapshot::CRIU_DIR))
        .await
        .expect("whole dump");
    seal(&gen1, &actor).await;
    let source = restore_tracked(runtime, &actor, spec, &gen1).await;
    // What a tracked restore costs while its actor lives: the page source stays.
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", source.pid()))
        .expect("the page source stays once every page is in");
    let private: Vec<&str> = rollup
        .lines()
        .filter(|l| l.starts_with("Rss:") || l.starts_with("Private_Dirty:"))
        .collect();
    eprintln!("page source after every page is in: {private:?}");
    (actor, gen1, source, whole.dump)
}

async fn tracking_runtime(env: &Env) -> RuncRuntime {
    let mut config = RuncConfig::new(env.state_dir());
    config.track_memory = true;
    let runtime = RuncRuntime::new(config).await.expect("runc runtime");
    assert!(
        runtime.tracks_memory(),
        "this machine must track memory: CRIU with patch 0003 (scripts/setup.sh), Linux 6.7+"
    );
    runtime
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_dump_holds_what_changed_and_restores_every_byte() {
    let mut env = Env::new();
    let runtime = tracking_runtime(&env).await;
    let spec = sleeper_spec(&env).await;
    let (actor, gen1, source, whole_dump) = tracked_sleeper(&mut env, &runtime, &spec).await;
    let whole = pages_bytes(&gen1.join(ate_snapshot::CRIU_DIR));
    assert!(whole >= mib() << 20, "a whole dump of {whole} bytes");

    let (status, body) = get(&actor, "/dirty?percent=1").await;
    assert_eq!(status, 200, "{body}");
    let before = checksum(&actor).await;

    let images = env.path().join("gen2").join(ate_snapshot::CRIU_DIR);
    let parent = Path::new("../../gen1").join(ate_snapshot::CRIU_DIR);
    let (stats, tracking) = runtime
        .checkpoint_incremental(&actor, &images, &parent, &source, false)
        .await
        .expect("incremental dump");
    assert!(
        matches!(tracking, Tracking::Holds { .. }),
        "tracking lost: {tracking:?}"
    );
    let delta = pages_bytes(&images);
    eprintln!(
        "{} MiB sleeper, 1 % dirtied: whole dump {} KiB in {whole_dump:?}, incremental {} KiB in {:?}",
        mib(),
        whole >> 10,
        delta >> 10,
        stats.dump
    );
    assert!(
        delta * 10 < whole,
        "the incremental dump holds {delta} of {whole} bytes"
    );
    assert!(
        std::fs::symlink_metadata(images.join("parent")).is_ok_and(|m| m.is_symlink()),
        "no parent link in the incremental dump"
    );
    // The sandbox is gone (dumped without keep_frozen): the page source may go too.
    drop(source);

    runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("restore of the incremental dump");
    ready(&actor).await;
    assert_eq!(
        checksum(&actor).await,
        before,
        "memory changed across the incremental dump"
    );

    // Flattened, with the parent gone: a whole dump that restores lazily to the same memory.
    let gen3 = env.path().join("gen3");
    flatten_into(&images, &gen1, &gen3, &actor).await;
    std::fs::remove_dir_all(&gen1).expect("remove the parent");
    let source = restore_tracked(&runtime, &actor, &spec, &gen3).await;
    assert_eq!(
        checksum(&actor).await,
        before,
        "memory changed across flattening"
    );
    runtime.stop(&actor).await.expect("stop");
    drop(source);
    env.assert_clean();
}

/// Tracking lost (the page source killed after every page was in): the dump is whole, with no
/// parent link, and restores every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracking_lost_the_dump_is_whole() {
    let mut env = Env::new();
    let runtime = tracking_runtime(&env).await;
    let spec = sleeper_spec(&env).await;
    let (actor, gen1, source, _) = tracked_sleeper(&mut env, &runtime, &spec).await;
    let whole = pages_bytes(&gen1.join(ate_snapshot::CRIU_DIR));
    let (status, body) = get(&actor, "/dirty?percent=1").await;
    assert_eq!(status, 200, "{body}");
    let before = checksum(&actor).await;

    // Killed: its descriptors close with it, and every protection goes.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(source.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the page source");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let images = env.path().join("gen2").join(ate_snapshot::CRIU_DIR);
    let parent = Path::new("../../gen1").join(ate_snapshot::CRIU_DIR);
    let (_, tracking) = runtime
        .checkpoint_incremental(&actor, &images, &parent, &source, false)
        .await
        .expect("dump");
    assert!(
        matches!(tracking, Tracking::Lost(_)),
        "tracking held after its page source died: {tracking:?}"
    );
    assert!(
        std::fs::symlink_metadata(images.join("parent")).is_err(),
        "a whole dump links a parent"
    );
    let dumped = pages_bytes(&images);
    assert!(
        dumped * 10 >= whole * 9,
        "a whole dump of {dumped} bytes, the first was {whole}"
    );
    drop(source);
    runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("restore of the whole dump");
    ready(&actor).await;
    assert_eq!(checksum(&actor).await, before);
    runtime.stop(&actor).await.expect("stop");
    env.assert_clean();
}

/// A Python program holding ~40 MiB of objects: `/mutate` rewrites 1 % of them, `/` answers the
/// mutation count and a hash over all of them.
const PY_STATE: &str = r#"
import hashlib, http.server, os, random
random.seed(1)
state = {i: os.urandom(96) for i in range(200000)}
floats = [random.random() for _ in range(400000)]
gen = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global gen
        if self.path == "/mutate":
            gen += 1
            for i in range(gen, len(state), 100):
                state[i] = os.urandom(96)
            for i in range(gen, len(floats), 100):
                floats[i] = random.random()
            body = b"ok"
        elif self.path == "/healthz":
            body = b"ok"
        else:
            h = hashlib.sha256()
            for k in sorted(state):
                h.update(state[k])
            h.update(repr(floats).encode())
            body = ("%d %s" % (gen, h.hexdigest())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 80), H).serve_forever()
"#;

/// The same in Node: JS objects on V8's heap and a 32 MiB Buffer outside it.
const NODE_STATE: &str = r#"
const http = require('http'), crypto = require('crypto');
let gen = 0;
const objs = [];
for (let i = 0; i < 200000; i++) objs.push({ i, s: crypto.randomBytes(32).toString('hex') });
const big = Buffer.alloc(32 << 20);
crypto.randomFillSync(big);
http.createServer((req, res) => {
  if (req.url === '/mutate') {
    gen++;
    for (let i = gen; i < objs.length; i += 100) objs[i] = { i, s: crypto.randomBytes(32).toString('hex') };
    for (let o = gen * 4096; o < big.length; o += 409600) big[o] ^= 0xff;
    res.end('ok');
    return;
  }
  if (req.url === '/healthz') { res.end('ok'); return; }
  const h = crypto.createHash('sha256');
  for (const o of objs) h.update(o.s);
  h.update(big);
  res.end(gen + ' ' + h.digest('hex'));
}).listen(80, '0.0.0.0');
"#;

async fn agent_spec(env: &Env, image: &str, command: Vec<String>) -> SandboxSpec {
    let reference = format!("oci-layout:{}", images_dir().join(image).display());
    let image = ImageCache::new(env.path().join("images"))
        .ensure(&reference)
        .await
        .expect("unpack the agent image");
    SandboxSpec {
        image,
        command,
        env: vec![],
        port: 80,
        volumes: vec![],
        mounts: vec![],
        resources: Resources {
            cpu_millis: 1000,
            memory_bytes: 512 << 20,
        },
        name: "agent".into(),
        exit_policy: Default::default(),
        sidecars: vec![],
    }
}

async fn state_of(actor: &ActorSandbox) -> String {
    let (status, body) = get(actor, "/").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Restore with tracking, two mutations, an incremental dump, a restore of it: the same state,
/// and the program goes on mutating.
async fn a_real_runtime_survives_an_incremental_dump(image: &str, command: Vec<String>) {
    let mut env = Env::new();
    let runtime = tracking_runtime(&env).await;
    let spec = agent_spec(&env, image, command).await;
    let actor = env.actor(image, "uid-1");
    runtime
        .run(&actor, &spec, RunMode::KeepRootfs)
        .await
        .expect("run the agent");
    ready(&actor).await;
    let first = state_of(&actor).await;
    let gen1 = env.path().join("gen1");
    runtime
        .checkpoint(&actor, &gen1.join(ate_snapshot::CRIU_DIR))
        .await
        .expect("whole dump");
    seal(&gen1, &actor).await;
    let source = restore_tracked(&runtime, &actor, &spec, &gen1).await;
    assert_eq!(
        state_of(&actor).await,
        first,
        "state changed across the restore"
    );
    for _ in 0..2 {
        let (status, body) = get(&actor, "/mutate").await;
        assert_eq!(status, 200, "{body}");
    }
    let before = state_of(&actor).await;
    assert!(before.starts_with("2 "), "{before}");

    let images = env.path().join("gen2").join(ate_snapshot::CRIU_DIR);
    let parent = Path::new("../../gen1").join(ate_snapshot::CRIU_DIR);
    let (stats, tracking) = runtime
        .checkpoint_incremental(&actor, &images, &parent, &source, false)
        .await
        .expect("incremental dump");
    assert!(
        matches!(tracking, Tracking::Holds { .. }),
        "tracking lost: {tracking:?}"
    );
    let (whole, delta) = (
        pages_bytes(&gen1.join(ate_snapshot::CRIU_DIR)),
        pages_bytes(&images),
    );
    eprintln!(
        "{image}: whole dump {} KiB, incremental after 2 % rewritten {} KiB in {:?}",
        whole >> 10,
        delta >> 10,
        stats.dump
    );
    assert!(delta < whole, "{delta} of {whole} bytes");
    drop(source);

    runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("restore of the incremental dump");
    ready(&actor).await;
    assert_eq!(
        state_of(&actor).await,
        before,
        "state changed across the incremental dump"
    );
    let (status, _) = get(&actor, "/mutate").await;
    assert_eq!(status, 200);
    assert!(state_of(&actor).await.starts_with("3 "));
    runtime.stop(&actor).await.expect("stop");
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_state_survives_an_incremental_dump() {
    a_real_runtime_survives_an_incremental_dump(
        "py-agent",
        vec!["/usr/bin/python3".into(), "-c".into(), PY_STATE.into()],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_state_survives_an_incremental_dump() {
    a_real_runtime_survives_an_incremental_dump(
        "node-agent",
        vec!["/usr/bin/node".into(), "-e".into(), NODE_STATE.into()],
    )
    .await;
}

/// Ten suspends in a row, as the worker will make them: each restore lazy and tracked from the
/// last generation, 1 % of the memory rewritten, an incremental dump against that generation,
/// flattened into the next one (the parent then removed). The sleeper's checksum over all its
/// memory is the same after every restore, and every dump holds only what changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_incremental_generations_in_a_row_keep_every_byte() {
    let mut env = Env::new();
    let runtime = tracking_runtime(&env).await;
    let spec = sleeper_spec(&env).await;
    let (actor, gen1, mut source, _) = tracked_sleeper(&mut env, &runtime, &spec).await;
    let whole = pages_bytes(&gen1.join(ate_snapshot::CRIU_DIR));
    let mut parent = gen1;
    for round in 2..=11 {
        let (status, body) = get(&actor, "/dirty?percent=1").await;
        assert_eq!(status, 200, "{body}");
        let before = checksum(&actor).await;
        let delta = env.path().join(format!("delta{round}"));
        let rel = Path::new("..")
            .join(parent.file_name().expect("a generation dir"))
            .join(ate_snapshot::CRIU_DIR);
        let (_, tracking) = runtime
            .checkpoint_incremental(&actor, &delta, &rel, &source, false)
            .await
            .expect("incremental dump");
        assert!(
            matches!(tracking, Tracking::Holds { .. }),
            "round {round}: tracking lost: {tracking:?}"
        );
        let dumped = pages_bytes(&delta);
        assert!(
            dumped * 10 < whole,
            "round {round}: the incremental dump holds {dumped} of {whole} bytes"
        );
        drop(source);
        let next = env.path().join(format!("gen{round}"));
        flatten_into(&delta, &parent, &next, &actor).await;
        std::fs::remove_dir_all(&delta).expect("remove the delta");
        std::fs::remove_dir_all(&parent).expect("remove the parent");
        source = restore_tracked(&runtime, &actor, &spec, &next).await;
        assert_eq!(
            checksum(&actor).await,
            before,
            "round {round}: memory changed"
        );
        parent = next;
    }
    runtime.stop(&actor).await.expect("stop");
    drop(source);
    env.assert_clean();
}

/// A sandbox kept frozen after its dump (a frozen-in-place copy) and thawed again: re-armed
/// while frozen, the next dump against that dump holds only what was written after the thaw,
/// and a restore through both links (the second dump's parent is the first) has every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rearmed_frozen_copy_dumps_only_what_changed_after_its_thaw() {
    let mut env = Env::new();
    let runtime = tracking_runtime(&env).await;
    let spec = sleeper_spec(&env).await;
    let (actor, _gen1, source, _) = tracked_sleeper(&mut env, &runtime, &spec).await;
    let dirty = |percent: u32| {
        let actor = actor.clone();
        async move {
            let (status, body) = get(&actor, &format!("/dirty?percent={percent}")).await;
            assert_eq!(status, 200, "{body}");
        }
    };
    let dump = |name: &'static str, parent: &'static str, keep_frozen: bool| {
        let (runtime, actor, source, env_path) =
            (&runtime, actor.clone(), &source, env.path().to_path_buf());
        async move {
            let images = env_path.join(name).join(ate_snapshot::CRIU_DIR);
            let parent = Path::new("../..").join(parent).join(ate_snapshot::CRIU_DIR);
            let (_, tracking) = runtime
                .checkpoint_incremental(&actor, &images, &parent, source, keep_frozen)
                .await
                .expect("incremental dump");
            assert!(
                matches!(tracking, Tracking::Holds { .. }),
                "{name}: tracking lost: {tracking:?}"
            );
            (images.clone(), pages_bytes(&images))
        }
    };

    dirty(5).await;
    let (_, first) = dump("gen2", "gen1", true).await;
    let rearmed = runtime
        .rearm_tracking(&actor)
        .await
        .expect("re-arm while frozen");
    assert!(rearmed > 0, "nothing was re-armed");
    runtime.thaw(&actor).await.expect("thaw");
    dirty(1).await;
    let before = checksum(&actor).await;
    let (images, second) = dump("gen3", "gen2", false).await;
    eprintln!(
        "frozen copy: 5 % rewritten, dump {} KiB, re-armed {rearmed} pages; thawed, 1 % rewritten, dump {} KiB",
        first >> 10,
        second >> 10
    );
    assert!(
        second * 3 < first,
        "the dump after the thaw holds {second} bytes, the one before {first}: pages written before the first dump were not re-armed"
    );
    drop(source);
    runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("restore through two parent links");
    ready(&actor).await;
    assert_eq!(checksum(&actor).await, before);
    runtime.stop(&actor).await.expect("stop");
    env.assert_clean();
}
