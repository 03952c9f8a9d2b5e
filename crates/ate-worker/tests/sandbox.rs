//! Real runc + CRIU + netns tests (root). Images: `$ATE_TEST_IMAGES` or built on the fly.

mod common;

use std::time::{Duration, Instant};

use ate_core::template::Resources;
use ate_test_support::wait::poll_until;
use ate_worker::{
    ActorSandbox, ImageCache, RunMode, SandboxError, SandboxRuntime, SandboxSpec, probe,
};
use common::{
    Env, counter_ref, counter_spec, criu_runtime, get, images_dir, run_until_healthy, runc_runtime,
    wait_healthy,
};

fn counts(m: u32, f: u32, r: u32) -> String {
    format!(
        "preserved memory count: {m} | preserved file counter: {f} | preserved rootfs counter: {r}"
    )
}

async fn assert_counts(actor: &ActorSandbox, m: u32, f: u32, r: u32) {
    let (status, body) = get(actor, "/").await;
    assert_eq!(status, 200, "body: {body}");
    assert_eq!(body.trim(), counts(m, f, r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_unpacks_and_caches() {
    let env = Env::new();
    let cache = ImageCache::new(env.path().join("images"));
    // Concurrent callers for one digest: one unpack, same result.
    let reference = counter_ref();
    let (a, b) = tokio::join!(cache.ensure(&reference), cache.ensure(&reference));
    let (a, b) = (a.expect("first ensure"), b.expect("second ensure"));
    assert_eq!(a, b);
    assert!(
        a.rootfs.join("counter").is_file(),
        "no /counter in {}",
        a.rootfs.display()
    );
    assert!(a.manifest_digest.starts_with("sha256:"));
    assert_eq!(
        a.rootfs
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str()),
        a.manifest_digest.strip_prefix("sha256:")
    );
    assert!(
        !a.config.entrypoint.is_empty() || !a.config.cmd.is_empty(),
        "image config has no command"
    );
    // No temp dirs left behind.
    let leftovers: Vec<_> = std::fs::read_dir(cache.root())
        .expect("list cache")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty());
    let missing_tag = cache.ensure(&format!("{}:nope", counter_ref())).await;
    assert!(
        matches!(missing_tag, Err(ate_worker::ImageError::Image { .. })),
        "{missing_tag:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_with_flipped_layer_byte_is_refused() {
    let env = Env::new();
    let layout = env.path().join("counter-layout");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(images_dir().join("counter"))
        .arg(&layout)
        .status();
    assert!(status.is_ok_and(|s| s.success()), "copy layout");
    // The biggest blob is the layer.
    let blobs = layout.join("blobs/sha256");
    let layer = std::fs::read_dir(&blobs)
        .expect("list blobs")
        .flatten()
        .max_by_key(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .expect("a blob")
        .path();
    let mut bytes = std::fs::read(&layer).expect("read layer");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&layer, bytes).expect("write layer");

    let cache = ImageCache::new(env.path().join("images"));
    let result = cache
        .ensure(&format!("oci-layout:{}", layout.display()))
        .await;
    match result {
        Err(ate_worker::ImageError::Checksum { digest, .. }) => {
            assert!(
                digest.ends_with(
                    &layer
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                )
            )
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    // Nothing half-unpacked in the cache.
    let entries: Vec<_> = std::fs::read_dir(cache.root())
        .expect("list cache")
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
        .collect();
    assert!(entries.is_empty(), "cache has {entries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_memory_rootfs_and_volumes_fidelity() {
    let mut env = Env::new();
    let runtime = criu_runtime(&env).await;
    let spec = counter_spec(&env).await;
    let actor = env.actor("ctr", "uid-1");

    let started = runtime
        .run(&actor, &spec, RunMode::KeepRootfs)
        .await
        .expect("run counter");
    eprintln!("run -d: {:?}", started.elapsed);
    let ready = wait_healthy(&actor, "counter ready").await;
    eprintln!("cold start → probe ok: {:?}", started.elapsed + ready);
    for i in 1..=3 {
        assert_counts(&actor, i, i, i).await;
    }
    assert!(runtime.exited(&actor).await.expect("state").is_none());

    // MEMORY: dump, everything host-side goes, restore in place.
    let images = env.path().join("checkpoint-1");
    let stats = runtime
        .checkpoint(&actor, &images)
        .await
        .expect("checkpoint");
    eprintln!(
        "checkpoint (dump): {:?}, image {} KiB",
        stats.dump,
        stats.image_bytes / 1024
    );
    assert!(
        !ate_netns::exists(&actor.netns()),
        "netns kept after checkpoint"
    );
    assert!(runtime.exited(&actor).await.expect("state").is_some());

    // A different uid: the identity files are rewritten on restore, not taken from the dump.
    let restored_actor = ActorSandbox {
        uid: "uid-2".into(),
        ..actor.clone()
    };
    let t0 = Instant::now();
    let restored = runtime
        .restore(&restored_actor, &spec, &images)
        .await
        .expect("restore");
    let ready = wait_healthy(&actor, "restored counter ready").await;
    let first = t0.elapsed();
    assert_counts(&actor, 4, 4, 4).await;
    eprintln!(
        "restore: runc restore -d {:?}, probe {:?}, restore → first response {:?}, → first counter reply {:?}",
        restored.elapsed,
        ready,
        first,
        t0.elapsed()
    );
    let (_, who) = get(&actor, "/whoami").await;
    assert_eq!(who.trim(), format!("test/{} uid-2", actor.name));

    // Restoring the same image a second time works too (a snapshot is reusable).
    runtime.stop(&actor).await.expect("stop after restore");
    let t0 = Instant::now();
    runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("second restore");
    wait_healthy(&actor, "second restore ready").await;
    eprintln!("second restore → first response {:?}", t0.elapsed());
    // Memory is back at 3 (the dump); the files moved on to 4, so they read 5.
    assert_counts(&actor, 4, 5, 5).await;

    // ROOTFS: restart from the kept upper dir and volumes; memory starts over.
    runtime.stop(&actor).await.expect("stop");
    let t0 = Instant::now();
    run_until_healthy(&runtime, &actor, &spec, "rootfs restart").await;
    eprintln!("rootfs restart → first response {:?}", t0.elapsed());
    assert_counts(&actor, 1, 6, 6).await;

    // VOLUMES: fresh upper dir; only the volume file continues.
    runtime.stop(&actor).await.expect("stop");
    runtime
        .run(&actor, &spec, RunMode::FreshRootfs)
        .await
        .expect("volumes restart");
    wait_healthy(&actor, "volumes restart ready").await;
    assert_counts(&actor, 1, 7, 1).await;

    runtime.stop(&actor).await.expect("stop");
    runtime.stop(&actor).await.expect("second stop is a no-op");
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exited_actor_is_noticed_and_stop_is_idempotent() {
    let mut env = Env::new();
    let runtime = runc_runtime(&env).await;
    let spec = counter_spec(&env).await;
    let actor = env.actor("exit", "uid-1");
    // Stopping an actor the runtime never saw is fine.
    runtime.stop(&actor).await.expect("stop unknown actor");

    let started = run_until_healthy(&runtime, &actor, &spec, "run").await;
    let pid = started.pid.expect("init pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill init");
    let noticed = "the exit noticed";
    let info = poll_until(
        noticed,
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || runtime.exited(&actor).await.expect("state"),
    )
    .await;
    // The runtime made this process the init's subreaper: the exit is collected with its
    // status (SIGKILL → 128 + 9).
    assert_eq!(info.status, "exited");
    assert_eq!(info.code, Some(137));
    runtime.stop(&actor).await.expect("stop exited actor");
    runtime.stop(&actor).await.expect("stop again");
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_times_out_on_a_silent_port() {
    let mut env = Env::new();
    let ns = format!("ate-p{:x}", std::process::id());
    env.extra_netns.push(ns.clone());
    ate_netns::create(&ns).await.expect("create netns");
    let timeout = Duration::from_millis(800);
    let t0 = Instant::now();
    let r = probe::wait_ready(&ns, 9999, "/healthz", timeout).await;
    let took = t0.elapsed();
    assert!(matches!(r, Err(SandboxError::ProbeTimeout { .. })), "{r:?}");
    // Gives up within the limit (at most one poll interval early), never long after it.
    assert!(
        took + Duration::from_millis(50) >= timeout && took < timeout + Duration::from_millis(300),
        "took {took:?}"
    );
    ate_netns::delete(&ns).await.expect("delete netns");
    ate_netns::delete(&ns).await.expect("delete is idempotent");
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_snapshot_restores_as_another_actor() {
    let mut env = Env::new();
    let runtime = criu_runtime(&env).await;
    let spec = counter_spec(&env).await;
    let golden = env.actor("gold", "uid-golden");
    run_until_healthy(&runtime, &golden, &spec, "run golden").await;
    assert_counts(&golden, 1, 1, 1).await;
    let images = env.path().join("golden-checkpoint");
    runtime
        .checkpoint(&golden, &images)
        .await
        .expect("checkpoint golden");

    // The node would unpack the snapshot's upper dir and volumes into the new actor's dir.
    let borrower = env.actor("borrow", "uid-new");
    std::fs::create_dir_all(&borrower.dir).expect("actor dir");
    for sub in ["upper", "volumes"] {
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(golden.dir.join(sub))
            .arg(borrower.dir.join(sub))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "copy {sub}");
    }
    runtime
        .restore(&borrower, &spec, &images)
        .await
        .expect("restore golden as another actor");
    wait_healthy(&borrower, "borrower ready").await;
    assert_counts(&borrower, 2, 2, 2).await;
    let (_, who) = get(&borrower, "/whoami").await;
    assert_eq!(who.trim(), format!("test/{} uid-new", borrower.name));
    let log = std::fs::read(borrower.log_path())
        .map(|l| l.len())
        .unwrap_or(0);
    eprintln!("borrower log: {log} bytes");

    runtime.stop(&borrower).await.expect("stop borrower");
    runtime
        .stop(&golden)
        .await
        .expect("stop golden (already checkpointed)");
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_run_reports_runc_error_and_cleans_up() {
    let mut env = Env::new();
    let runtime = runc_runtime(&env).await;
    let mut spec = counter_spec(&env).await;
    spec.command = vec!["/does-not-exist".into()];
    let actor = env.actor("fail", "uid-1");
    let err = runtime
        .run(&actor, &spec, RunMode::KeepRootfs)
        .await
        .expect_err("run must fail");
    let text = err.to_string();
    assert!(matches!(err, SandboxError::Command { .. }), "{text}");
    // runc's message travelled through the container stdio pipe into the actor log and the error.
    assert!(text.contains("does-not-exist"), "{text}");
    let log = std::fs::read_to_string(actor.log_path()).unwrap_or_default();
    assert!(log.contains("does-not-exist"), "log: {log}");
    // The failed run released everything (netns, overlay, container).
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeper_memory_survives_restore_with_timings() {
    const MIB: u32 = 64;
    let mut env = Env::new();
    let runtime = criu_runtime(&env).await;
    let reference = format!("oci-layout:{}", images_dir().join("sleeper").display());
    let image = ImageCache::new(env.path().join("images"))
        .ensure(&reference)
        .await
        .expect("unpack sleeper");
    let spec = SandboxSpec {
        image,
        command: vec![],
        env: vec![("SLEEPER_MEMORY_MIB".into(), MIB.to_string())],
        port: 80,
        volumes: vec![],
        mounts: vec![],
        resources: Resources {
            cpu_millis: 1000,
            memory_bytes: 256 << 20,
        },
        name: "sleeper".into(),
        exit_policy: Default::default(),
        sidecars: vec![],
    };
    let actor = env.actor("sleep", "uid-1");
    run_until_healthy(&runtime, &actor, &spec, "run sleeper").await;
    let (status, before) = get(&actor, "/").await;
    assert_eq!(status, 200);
    assert!(before.contains(&format!("holding {MIB} MiB")), "{before}");

    let images = env.path().join("checkpoint");
    let stats = runtime
        .checkpoint(&actor, &images)
        .await
        .expect("checkpoint sleeper");
    let t0 = Instant::now();
    let restored = runtime
        .restore(&actor, &spec, &images)
        .await
        .expect("restore sleeper");
    wait_healthy(&actor, "restored sleeper ready").await;
    let first = t0.elapsed();
    let (_, after) = get(&actor, "/").await;
    assert_eq!(after, before, "memory checksum changed across restore");
    eprintln!(
        "sleeper {MIB} MiB: checkpoint {:?} ({} MiB image), runc restore -d {:?}, restore → first response {first:?}",
        stats.dump,
        stats.image_bytes >> 20,
        restored.elapsed
    );
    runtime.stop(&actor).await.expect("stop");
    env.assert_clean();
}
