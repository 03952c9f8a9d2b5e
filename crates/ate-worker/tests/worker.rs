//! The worker process end to end (root; real runc + CRIU + netns): WorkerService over its unix
//! socket via `connect_worker`, and atunnel over h2c the way the router uses it.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ate_proto::v1;
use ate_proto::v1::worker_service_client::WorkerServiceClient;
use ate_test_support::h2_client::{self, H2, body_text, h2_connect};
use ate_test_support::wait::{eventually, poll_until, wait_until};
use ate_worker::{ActorSandbox, WorkerConfig};
use ate_worker_client::connect_worker;
use bytes::Bytes;
use common::{Env, counter_ref, unique_name};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tonic::Code;
use tonic::transport::Channel;

const ATESPACE: &str = "test";

/// One running `run(config)` plus what the test needs to reach and stop it.
struct RunningWorker {
    client: WorkerServiceClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ate_worker::WorkerError>>,
    socket: PathBuf,
}

/// A client of the worker `task` serving on `socket` once it answers Info (within 30 s), and its
/// epoch; panics if the task ends first.
async fn serving(
    socket: &Path,
    task: &tokio::task::JoinHandle<Result<(), ate_worker::WorkerError>>,
) -> (WorkerServiceClient<Channel>, u64) {
    let answers = async || {
        assert!(!task.is_finished(), "the worker ended before it served");
        let c = connect_worker(socket).await.ok()?;
        let info = c.clone().info(v1::WorkerInfoRequest {}).await.ok()?;
        Some((c, info.into_inner().epoch))
    };
    poll_until(
        "the worker serving",
        Duration::from_secs(30),
        Duration::from_millis(20),
        answers,
    )
    .await
}

impl RunningWorker {
    async fn start(config: WorkerConfig) -> Self {
        let socket = config.socket_path();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(ate_worker::run(config, async move {
            let _ = rx.await;
        }));
        let (client, _) = serving(&socket, &task).await;
        RunningWorker {
            client,
            stop: Some(tx),
            task,
            socket,
        }
    }

    async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("worker shut down in time")
            .expect("worker task");
        result.expect("worker run result");
        assert!(!self.socket.exists(), "socket left after shutdown");
    }
}

fn worker_config(env: &mut Env, id: &str) -> WorkerConfig {
    // Worker logs on stderr (shown for failing tests; RUST_LOG overrides the level).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("ate_worker=info")),
        )
        .with_test_writer()
        .try_init();
    let state = env.path().join("state");
    let listen: SocketAddr = "127.0.0.2:0".parse().expect("addr");
    let mut config = WorkerConfig::new(id, state, listen);
    // These tests follow the dump → restore path; frozen-in-place copies (a cache in front of
    // it) are covered end to end in ate-cli's node_side tests.
    config.keep_frozen = Some(0);
    env.runc_roots.push(config.worker_dir().join("runc"));
    config
}

/// Registers an actor of worker `config` with the Drop guard and returns its sandbox view.
fn track(env: &mut Env, config: &WorkerConfig, name: &str) -> ActorSandbox {
    let a = ActorSandbox::new(
        ATESPACE,
        name,
        "",
        config.actors_dir().join(ATESPACE).join(name),
    );
    env.actors.push(a.clone());
    a
}

fn counter_spec(probe_port: u32, probe_timeout: u32) -> v1::TemplateSpec {
    v1::TemplateSpec {
        sandbox_class: "runc".into(),
        containers: vec![v1::Container {
            name: "main".into(),
            image: counter_ref(),
            command: vec![],
            env: vec![],
            wakeup_probe: Some(v1::WakeupProbe {
                http_get: Some(v1::HttpGetAction {
                    path: "/healthz".into(),
                    port: probe_port,
                }),
                timeout_seconds: probe_timeout,
            }),
            ..Default::default()
        }],
        resources: Some(v1::Resources {
            cpu_millis: 500,
            memory_bytes: 128 << 20,
        }),
        volumes: vec![v1::Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            external_host_path: String::new(),
            external_shared: false,
        }],
        fidelity: v1::Fidelity::Memory as i32,
        idle_timeout_seconds: 300,
        ..Default::default()
    }
}

fn workload(worker_id: &str, name: &str, spec: v1::TemplateSpec) -> v1::Workload {
    v1::Workload {
        actor: Some(v1::ObjectRef {
            atespace: ATESPACE.into(),
            name: name.into(),
        }),
        uid: format!("uid-{name}"),
        template: "test/counter".into(),
        spec: Some(spec),
        worker_id: worker_id.into(),
        activation: 0,
    }
}

fn start_req(
    w: &v1::Workload,
    gen_dir: Option<&Path>,
    fidelity: v1::Fidelity,
) -> v1::WorkerStartRequest {
    v1::WorkerStartRequest {
        workload: Some(w.clone()),
        generation_dir: gen_dir
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        fidelity: fidelity as i32,
    }
}

fn checkpoint_req(
    w: &v1::Workload,
    gen_dir: &Path,
    generation: u64,
) -> v1::WorkerCheckpointRequest {
    v1::WorkerCheckpointRequest {
        workload: Some(w.clone()),
        generation_dir: gen_dir.to_string_lossy().into_owned(),
        fidelity: v1::Fidelity::Memory as i32,
        generation,
        uuid: format!("uuid-{generation}"),
        node: "node-1".into(),
        boot_id: "boot-1".into(),
        grace_ms: 0,
    }
}

fn counts(m: u32, f: u32, r: u32) -> String {
    format!(
        "preserved memory count: {m} | preserved file counter: {f} | preserved rootfs counter: {r}"
    )
}

// ---------------------------------------------------------------- h2c tunnel client

/// A CONNECT stream to the actor's port 80 with the given routing headers.
async fn connect_stream(
    h2: &mut H2,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    h2_client::connect_stream(h2, "actor.test:80", headers).await
}

/// HTTP/1.1 over an established tunnel.
type H1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn open_tunnel(h2: &mut H2, actor: &str) -> H1 {
    let resp = connect_stream(h2, &[("ate-target-actor", actor)]).await;
    assert_eq!(resp.status(), 200, "CONNECT {actor}");
    h2_client::http1_over(resp).await
}

async fn h1_get(h1: &mut H1, path: &str) -> (u16, String) {
    let req = http::Request::builder()
        .uri(path)
        .header("host", "actor.test")
        .body(Empty::<Bytes>::new())
        .expect("request");
    h1.ready().await.expect("h1 ready");
    let resp = h1.send_request(req).await.expect("GET");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).trim().to_string())
}

/// One tunnel per request, as a router without tunnel reuse would do it.
async fn get_via_tunnel(h2: &mut H2, actor: &str, path: &str) -> (u16, String) {
    let mut h1 = open_tunnel(h2, actor).await;
    h1_get(&mut h1, path).await
}

async fn activity_of(
    client: &mut WorkerServiceClient<Channel>,
    name: &str,
) -> Option<v1::ActorActivity> {
    client
        .activity(v1::WorkerActivityRequest { with_usage: false })
        .await
        .expect("Activity")
        .into_inner()
        .actors
        .into_iter()
        .find(|a| a.actor.as_ref().is_some_and(|r| r.name == name))
}

fn runc_list(root: &Path) -> String {
    let out = std::process::Command::new("runc")
        .arg("--root")
        .arg(root)
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_end_to_end_counter() {
    let mut env = Env::new();
    let id = unique_name("w");
    let config = worker_config(&mut env, &id);
    let faults = config.faults.clone();

    // A new epoch every process start.
    let first = RunningWorker::start(config.clone()).await;
    let mut c = first.client.clone();
    let info1 = c
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner();
    first.shutdown().await;
    let worker = RunningWorker::start(config.clone()).await;
    let mut c = worker.client.clone();
    let info = c
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner();
    assert_ne!(info.epoch, 0);
    assert_ne!(info1.epoch, 0);
    assert_ne!(info.epoch, info1.epoch, "a restart must get a new epoch");
    assert_eq!(info.worker_id, id);
    assert_eq!(info.sandbox_class, "runc");
    assert!(info.can_restore_memory, "CRIU ≥ 4.2 must be installed");
    // Restore capabilities the scheduler matches generations against (actors run without a
    // user namespace of their own today).
    assert!(
        info.capabilities.iter().any(|c| c == "memory:criu")
            && info.capabilities.iter().any(|c| c == "userns:off"),
        "{:?}",
        info.capabilities
    );
    assert_eq!(info.capacity.map(|c| c.actor_slots), Some(8));
    assert!(info.identity.ends_with(&format!("worker-{id}")));
    let addr = info.addresses.first().expect("an atunnel address").clone();
    assert!(addr.starts_with("127.0.0.2:"), "{addr}");
    let epoch = info.epoch;

    let name = unique_name("ctr");
    let sandbox = track(&mut env, &config, &name);
    let target = format!("{ATESPACE}/{name}");
    let w = workload(&id, &name, counter_spec(80, 15));

    // Wrong worker → FAILED_PRECONDITION.
    let mut wrong = w.clone();
    wrong.worker_id = "someone-else".into();
    let err = c
        .start(start_req(&wrong, None, v1::Fidelity::Unspecified))
        .await
        .expect_err("start on the wrong worker");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // Cold start.
    let t0 = Instant::now();
    let reply = c
        .start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("cold Start")
        .into_inner();
    eprintln!(
        "cold Start → ready: {:?} (ready_ms {})",
        t0.elapsed(),
        reply.ready_ms
    );
    assert_eq!(reply.epoch, epoch);
    // Idempotent.
    let again = c
        .start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("repeated Start")
        .into_inner();
    assert_eq!(again.epoch, epoch);

    let mut h2 = h2_connect(&addr).await;
    for i in 1..=3 {
        let (status, body) = get_via_tunnel(&mut h2, &target, "/").await;
        assert_eq!(status, 200);
        assert_eq!(body, counts(i, i, i));
    }

    // Activity: the actor, its idle timeout and a recent last activity; one open tunnel.
    let mut held = open_tunnel(&mut h2, &target).await;
    // The per-request tunnels above close asynchronously once their client side is dropped.
    let one = "one open stream";
    let act = poll_until(
        one,
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || {
            let act = activity_of(&mut c, &name).await.expect("actor in Activity");
            (act.open_streams == 1).then_some(act)
        },
    )
    .await;
    assert_eq!(act.open_streams, 1);
    assert_eq!(act.idle_timeout_seconds, 300);
    assert!(!act.exited);
    let now_ms = ate_atunnel::now_unix_ms();
    assert!(
        act.last_activity_unix_ms > now_ms - 10_000 && act.last_activity_unix_ms <= now_ms,
        "last activity {} vs now {now_ms}",
        act.last_activity_unix_ms
    );
    let (s, _) = h1_get(&mut held, "/healthz").await;
    assert_eq!(s, 200);

    // Tunnel throughput (debug build, same 2 cores as the actor): a new tunnel per request, and
    // requests over kept tunnels.
    measure_throughput(&addr, &target).await;
    measure_dialers(&sandbox.netns()).await;

    // Malformed target → 400 naming the problem; unknown actor → 421 stale.
    let resp = connect_stream(&mut h2, &[("ate-target-actor", "Not_Valid")]).await;
    assert_eq!(resp.status(), 400);
    assert!(body_text(resp).await.contains("ate-target-actor"));
    let resp = connect_stream(
        &mut h2,
        &[("ate-target-actor", &target), ("ate-target-port", "0")],
    )
    .await;
    assert_eq!(resp.status(), 400);
    let resp = connect_stream(&mut h2, &[]).await;
    assert_eq!(resp.status(), 400);
    let resp = connect_stream(&mut h2, &[("ate-target-actor", "test/nobody-here")]).await;
    assert_eq!(resp.status(), 421);
    assert_eq!(
        resp.headers()
            .get("x-ate-assignment-stale")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    // Active actor, closed port → 502.
    let resp = connect_stream(
        &mut h2,
        &[("ate-target-actor", &target), ("ate-target-port", "9")],
    )
    .await;
    assert_eq!(resp.status(), 502);

    // Isolation: from inside the actor's netns the worker's atunnel address is unreachable.
    let atunnel_addr: SocketAddr = addr.parse().expect("addr");
    let inside =
        ate_netns::connect_in_netns_timeout(&sandbox.netns(), atunnel_addr, Duration::from_secs(2))
            .await;
    assert!(inside.is_err(), "actor reached atunnel from its netns");

    // MEMORY checkpoint (with a tunnel still open: the worker closes it first).
    let gen1 = env.path().join("generations/1");
    let t0 = Instant::now();
    let cp = c
        .checkpoint(checkpoint_req(&w, &gen1, 1))
        .await
        .expect("Checkpoint MEMORY")
        .into_inner();
    eprintln!(
        "Checkpoint MEMORY: {:?}, {} KiB",
        t0.elapsed(),
        cp.size_bytes / 1024
    );
    assert_eq!(
        cp.fidelity,
        v1::Fidelity::Memory as i32,
        "reason: {}",
        cp.reason
    );
    assert!(cp.reason.is_empty());
    assert_eq!(cp.epoch, epoch);
    assert_eq!(cp.checksum.len(), 64);
    assert!(gen1.join("manifest.json").is_file());
    assert!(!cp.kept_frozen, "frozen copies are off in this test");
    // Removed right after the reply (the suspend does not wait for it).
    let gone = || !sandbox.dir.exists();
    let removed = eventually(Duration::from_secs(10), Duration::from_millis(20), gone).await;
    assert!(removed, "actor dir left after checkpoint");
    let (s, _) = h1_get_status(&mut held).await;
    assert_ne!(s, 200, "held tunnel still served after checkpoint");
    // Retried checkpoint: same answer from the sealed generation.
    let cp_again = c
        .checkpoint(checkpoint_req(&w, &gen1, 1))
        .await
        .expect("repeated Checkpoint")
        .into_inner();
    assert_eq!(cp_again.checksum, cp.checksum);

    // Ingress is off: 421.
    let resp = connect_stream(&mut h2, &[("ate-target-actor", &target)]).await;
    assert_eq!(resp.status(), 421);
    assert!(activity_of(&mut c, &name).await.is_none());

    // Restore MEMORY.
    let t0 = Instant::now();
    let reply = c
        .start(start_req(&w, Some(&gen1), v1::Fidelity::Memory))
        .await
        .expect("restore MEMORY")
        .into_inner();
    let (status, body) = get_via_tunnel(&mut h2, &target, "/").await;
    eprintln!(
        "restore MEMORY → first response through atunnel: {:?} (ready_ms {})",
        t0.elapsed(),
        reply.ready_ms
    );
    assert_eq!(status, 200);
    assert_eq!(body, counts(4, 4, 4));
    let (_, who) = get_via_tunnel(&mut h2, &target, "/whoami").await;
    assert_eq!(who, format!("{ATESPACE}/{name} uid-{name}"));

    // A failing memory dump fails the checkpoint: nothing is written and the actor runs on
    // with its memory (never a quiet ROOTFS generation).
    faults.set_criu_dump_fail(true);
    let gen2 = env.path().join("generations/2");
    let refused = c
        .checkpoint(checkpoint_req(&w, &gen2, 2))
        .await
        .expect_err("a checkpoint whose memory dump fails");
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    assert!(
        refused.message().contains("memory dump failed")
            && refused.message().contains("the actor runs on"),
        "{}",
        refused.message()
    );
    assert!(!gen2.exists(), "nothing of the generation is left");
    let (status, body) = get_via_tunnel(&mut h2, &target, "/").await;
    assert_eq!((status, body), (200, counts(5, 5, 5)));

    // Where the template allows it (snapshots.onMemoryFailure: rootfs), a ROOTFS generation
    // instead, which says why.
    let mut fallback = w.clone();
    if let Some(spec) = fallback.spec.as_mut() {
        spec.rootfs_on_memory_failure = true;
    }
    let cp = c
        .checkpoint(checkpoint_req(&fallback, &gen2, 2))
        .await
        .expect("Checkpoint with failing dump, ROOTFS allowed")
        .into_inner();
    faults.set_criu_dump_fail(false);
    assert_eq!(cp.fidelity, v1::Fidelity::Rootfs as i32);
    assert!(
        cp.reason.contains("memory dump failed") && cp.reason.contains("onMemoryFailure"),
        "{}",
        cp.reason
    );
    assert!(!gen2.join("criu").exists());

    // Restore from it: memory starts over, file and rootfs counters continue.
    let t0 = Instant::now();
    c.start(start_req(&w, Some(&gen2), v1::Fidelity::Unspecified))
        .await
        .expect("restore ROOTFS");
    let (_, body) = get_via_tunnel(&mut h2, &target, "/").await;
    eprintln!("restore ROOTFS → first response: {:?}", t0.elapsed());
    assert_eq!(body, counts(1, 6, 6));

    // Stop: ingress off, sandbox gone; idempotent.
    let stop = v1::WorkerStopRequest {
        actor: w.actor.clone(),
        activation_at_most: 0,
    };
    c.stop(stop.clone()).await.expect("Stop");
    c.stop(stop).await.expect("repeated Stop");
    let resp = connect_stream(&mut h2, &[("ate-target-actor", &target)]).await;
    assert_eq!(resp.status(), 421);
    assert!(!sandbox.dir.exists());

    // A cold start again, then shutdown must stop it.
    c.start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("cold Start before shutdown");
    let root = config.worker_dir().join("runc");
    assert!(!runc_list(&root).is_empty());
    worker.shutdown().await;
    assert!(
        runc_list(&root).is_empty(),
        "containers left after shutdown"
    );
    env.assert_clean();
}

async fn h1_get_status(h1: &mut H1) -> (u16, String) {
    // The tunnel was cut: either the send fails or the connection reports closed.
    let req = http::Request::builder()
        .uri("/healthz")
        .header("host", "actor.test")
        .body(Empty::<Bytes>::new())
        .expect("request");
    match tokio::time::timeout(Duration::from_secs(5), async {
        h1.ready().await?;
        h1.send_request(req).await
    })
    .await
    {
        Ok(Ok(resp)) => (resp.status().as_u16(), String::new()),
        Ok(Err(e)) => (0, e.to_string()),
        Err(_) => (0, "timed out".into()),
    }
}

/// Sequential connects into the actor netns: the long-lived socket factory against the old
/// thread-per-connect path. Medians: the counter's accept backlog occasionally drops a SYN (a
/// 1 s retransmit) when connects outpace it, which would swamp a mean.
async fn measure_dialers(netns_name: &str) {
    const N: usize = 300;
    let addr = SocketAddr::new(ate_netns::ACTOR_IP.into(), 80);
    let dialer = ate_netns::NetnsDialer::new(netns_name)
        .await
        .expect("dialer");
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut factory = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        drop(dialer.connect(addr).await.expect("factory connect"));
        factory.push(t.elapsed());
    }
    let mut threaded = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        drop(
            ate_netns::connect_in_netns(netns_name, addr)
                .await
                .expect("thread connect"),
        );
        threaded.push(t.elapsed());
    }
    eprintln!(
        "connect into actor netns (median): socket factory {:?}, thread per connect {:?} (debug build)",
        median(factory),
        median(threaded)
    );
}

async fn measure_throughput(addr: &str, target: &str) {
    const TASKS: usize = 32;
    const WINDOW: Duration = Duration::from_secs(2);
    for kept in [false, true] {
        let h2 = h2_connect(addr).await;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let mut h2 = h2.clone();
            let target = target.to_string();
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                let mut tunnel = if kept {
                    Some(open_tunnel(&mut h2, &target).await)
                } else {
                    None
                };
                while start.elapsed() < WINDOW {
                    let (s, _) = match tunnel.as_mut() {
                        Some(t) => h1_get(t, "/healthz").await,
                        None => get_via_tunnel(&mut h2, &target, "/healthz").await,
                    };
                    assert_eq!(s, 200);
                    n += 1;
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("load task");
        }
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "atunnel {}: {total} requests in {secs:.2}s = {:.0} req/s ({TASKS} concurrent, one h2 connection, debug build)",
            if kept {
                "kept tunnels"
            } else {
                "new tunnel per request"
            },
            total as f64 / secs
        );
    }
}

/// `--advertise` is the address Info reports (what routers dial); a wildcard `--listen` without
/// it is refused before the worker creates anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advertised_address_is_reported() {
    let mut env = Env::new();
    let id = unique_name("w");
    let mut config = worker_config(&mut env, &id);
    config.listen = "0.0.0.0:0".parse().expect("addr");
    let err = ate_worker::run(config.clone(), std::future::pending())
        .await
        .expect_err("a wildcard --listen without --advertise must not start");
    assert!(
        matches!(err, ate_worker::WorkerError::Config(_)),
        "wrong error: {err}"
    );
    assert!(
        err.to_string().contains(
            "--listen 0.0.0.0:0 binds every address: say which one routers reach with --advertise"
        ),
        "{err}"
    );
    assert!(!config.worker_dir().exists(), "created before refusing");

    config.listen = "127.0.0.2:0".parse().expect("addr");
    config.advertise = Some("192.0.2.7:8443".parse().expect("addr"));
    let worker = RunningWorker::start(config).await;
    let info = worker
        .client
        .clone()
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner();
    assert_eq!(info.addresses, ["192.0.2.7:8443"]);
    worker.shutdown().await;
    env.assert_clean();
}

/// A netns reached from the host over a veth (host side 10.254.X.1/29, which becomes a node
/// address) holding two addresses, 10.254.X.2 and .3, with a holding server; removed on drop.
struct TestHost {
    netns: String,
    host_link: String,
    peers: [std::net::Ipv4Addr; 2],
    port: u16,
    server: Option<std::process::Child>,
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestHost {
    fn new() -> TestHost {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        let tag = format!("{:06x}", seed & 0xff_ffff);
        let third = (seed % 250 + 1) as u8;
        let peer_link = format!("wdep{tag}");
        let mut h = TestHost {
            netns: format!("wde-{tag}"),
            host_link: format!("wdeh{tag}"),
            peers: [
                std::net::Ipv4Addr::new(10, 254, third, 2),
                std::net::Ipv4Addr::new(10, 254, third, 3),
            ],
            port: 20000 + (seed % 20000) as u16,
            server: None,
        };
        let (ns, host_link) = (h.netns.clone(), h.host_link.clone());
        ip(&["netns", "add", &ns]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", &peer_link,
        ]);
        ip(&["link", "set", &peer_link, "netns", &ns]);
        ip(&[
            "addr",
            "add",
            &format!("10.254.{third}.1/29"),
            "dev",
            &host_link,
        ]);
        ip(&["link", "set", &host_link, "up"]);
        for peer in h.peers {
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{peer}/29"),
                "dev",
                &peer_link,
            ]);
        }
        ip(&["-n", &ns, "link", "set", &peer_link, "up"]);
        h.server = Some(
            std::process::Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-c"])
                .arg(ate_test_support::hold_server::SCRIPT)
                // Every address of the namespace.
                .arg("")
                .arg(h.port.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn the test host's server"),
        );
        let start = Instant::now();
        for peer in h.peers {
            let addr = SocketAddr::new(peer.into(), h.port);
            let up =
                || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
            let left = Duration::from_secs(10).saturating_sub(start.elapsed());
            let what = format!("the test host server on {addr}");
            wait_until(&what, left, Duration::from_millis(50), up);
        }
        h
    }

    fn addr(&self, i: usize) -> String {
        format!("{}:{}", self.peers[i], self.port)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .output();
    }
}

/// `--deny-egress` denies an address even to a template whose allow entry names it; an
/// allowed address outside the list is still reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_egress_beats_an_allow_entry() {
    let mut env = Env::new();
    let host = TestHost::new();
    let id = unique_name("w");
    let mut config = worker_config(&mut env, &id);
    config.deny_egress = vec![format!("{}/32", host.peers[0]).parse().expect("cidr")];
    let worker = RunningWorker::start(config.clone()).await;
    let mut c = worker.client.clone();
    let info = c
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner();
    let addr = info.addresses[0].clone();

    let name = unique_name("eg");
    let _sandbox = track(&mut env, &config, &name);
    let target = format!("{ATESPACE}/{name}");
    let mut spec = counter_spec(80, 15);
    spec.egress = Some(v1::EgressPolicy {
        default_action: "deny-all".into(),
        allow: vec![host.addr(0), host.addr(1)],
    });
    let w = workload(&id, &name, spec);
    c.start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("Start");
    let mut h2 = h2_connect(&addr).await;
    let connect = |i: usize| format!("/connect?addr={}", host.addr(i));
    let (status, body) = get_via_tunnel(&mut h2, &target, &connect(1)).await;
    assert_eq!(status, 200, "allowed, not listed: {body}");
    let (status, body) = get_via_tunnel(&mut h2, &target, &connect(0)).await;
    assert_eq!(status, 502, "listed in --deny-egress: {body}");

    c.stop(v1::WorkerStopRequest {
        actor: w.actor.clone(),
        activation_at_most: 0,
    })
    .await
    .expect("Stop");
    worker.shutdown().await;
    drop(host);
    env.assert_clean();
}

/// A stand-in for the router's internal socket: answers every request with the routing headers
/// it got (every `ate-caller-actor` value, comma-joined) and counts connections.
async fn stub_router(
    path: &Path,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    let listener = tokio::net::UnixListener::bind(path).expect("bind the stub router");
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = conns.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let all = |name: &str| {
                            req.headers()
                                .get_all(name)
                                .iter()
                                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                                .collect::<Vec<_>>()
                                .join(",")
                        };
                        let body = format!(
                            "caller={}\ntarget={}\nport={}\npath={}\n",
                            all("ate-caller-actor"),
                            all("ate-target-actor"),
                            all("ate-target-port"),
                            req.uri().path()
                        );
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(Bytes::from(body)),
                        ))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (task, conns)
}

/// An actor reaches the platform address 169.254.17.1:80: the local actor API answers its
/// identity, and a call naming another actor reaches the router (`--router unix:…`) with the
/// caller set by the platform (a forged one removed) over one pooled connection; an idle actor
/// that keeps its platform connection open is not busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_address_serves_identity_and_calls() {
    let mut env = Env::new();
    let router_sock = env.path().join("router.sock");
    let (router_task, router_conns) = stub_router(&router_sock).await;
    let id = unique_name("w");
    let mut config = worker_config(&mut env, &id);
    config.router = Some(ate_egress::RouterAddr::Unix(router_sock.clone()));
    let worker = RunningWorker::start(config.clone()).await;
    let mut c = worker.client.clone();
    let info = c
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner();
    let addr = info.addresses[0].clone();

    let name = unique_name("pl");
    let _sandbox = track(&mut env, &config, &name);
    let target = format!("{ATESPACE}/{name}");
    let w = workload(&id, &name, counter_spec(80, 15));
    c.start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("Start");
    let mut h2 = h2_connect(&addr).await;

    // The local actor API.
    let (status, body) = get_via_tunnel(&mut h2, &target, "/call?path=/v1/identity").await;
    assert_eq!(status, 200, "{body}");
    let json = body
        .strip_prefix("status: 200\n")
        .unwrap_or_else(|| panic!("{body}"));
    let identity: serde_json::Value = serde_json::from_str(json).expect("identity JSON");
    assert_eq!(identity["atespace"], ATESPACE);
    assert_eq!(identity["name"], name.as_str());
    assert_eq!(identity["uid"], format!("uid-{name}"));
    assert!(identity["activation"].as_u64().is_some(), "{identity}");
    // A token needs the api: a worker without --api says so.
    let (status, body) =
        get_via_tunnel(&mut h2, &target, "/call?path=/v1/identity?audience=svc").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--api"), "{body}");
    // A worker without --api keeps no alarms, and says so.
    let (status, body) = get_via_tunnel(&mut h2, &target, "/call?path=/v1/alarm").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--api"), "{body}");
    let (status, body) = get_via_tunnel(&mut h2, &target, "/call?path=/v9/nothing").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("/v9/nothing"), "{body}");

    // A call: the forged caller is replaced by the platform's.
    let (status, body) = get_via_tunnel(
        &mut h2,
        &target,
        "/call?actor=billing/ledger&path=/hello&forge=1",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        format!("status: 200\ncaller={target}\ntarget=billing/ledger\nport=\npath=/hello")
    );
    // Several calls on the counter's kept connection: one pooled router connection.
    let (status, body) =
        get_via_tunnel(&mut h2, &target, "/call?actor=billing/ledger&path=/x&n=20").await;
    assert_eq!(status, 200, "{body}");
    // Sequential calls reuse a pooled connection (a returning connection can race the next
    // checkout, so allow a few; without pooling there would be 21).
    let conns = router_conns.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=3).contains(&conns),
        "21 calls took {conns} router connections"
    );

    // The counter keeps its platform connection; with no request in flight it is not activity.
    let idle = "no open stream (an idle platform connection must not keep the actor busy)";
    poll_until(
        idle,
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let a = activity_of(&mut c, &name).await.expect("activity");
            (a.open_streams == 0).then_some(())
        },
    )
    .await;

    c.stop(v1::WorkerStopRequest {
        actor: w.actor.clone(),
        activation_at_most: 0,
    })
    .await
    .expect("Stop");
    worker.shutdown().await;
    router_task.abort();
    env.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_probe_timeout_and_exit() {
    let mut env = Env::new();
    let id = unique_name("w");
    let config = worker_config(&mut env, &id);
    let worker = RunningWorker::start(config.clone()).await;
    let mut c = worker.client.clone();
    let root = config.worker_dir().join("runc");

    // A probe on a port nothing listens on: FAILED_PRECONDITION, nothing left running.
    let name = unique_name("noprobe");
    let sandbox = track(&mut env, &config, &name);
    let mut spec = counter_spec(9999, 2);
    // The probe port would otherwise become the workload's PORT.
    spec.containers[0].env.push(v1::EnvVar {
        name: "PORT".into(),
        value: "80".into(),
    });
    let w = workload(&id, &name, spec);
    let t0 = Instant::now();
    let err = c
        .start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect_err("probe never answers");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("wakeup probe") && err.message().contains("within 2s"),
        "{}",
        err.message()
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(
        runc_list(&root).is_empty(),
        "container left after probe timeout"
    );
    assert!(!ate_netns::exists(&sandbox.netns()), "netns left");
    assert!(!sandbox.dir.exists(), "actor dir left");
    assert!(activity_of(&mut c, &name).await.is_none());

    // An actor whose init is killed shows up as exited within ~1 s, once.
    let name = unique_name("killed");
    let sandbox = track(&mut env, &config, &name);
    let w = workload(&id, &name, counter_spec(80, 15));
    c.start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("start");
    let out = std::process::Command::new("runc")
        .arg("--root")
        .arg(&root)
        .args(["state", &sandbox.container_id()])
        .output()
        .expect("runc state");
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).expect("state json");
    let pid = state["pid"].as_i64().expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill init");
    let killed = Instant::now();
    let reported = "the exit reported";
    let exited = poll_until(
        reported,
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || activity_of(&mut c, &name).await.filter(|a| a.exited),
    )
    .await;
    eprintln!("exit reported after {:?}", killed.elapsed());
    // Polled every 500 ms; the margin is for a loaded CI machine.
    assert!(killed.elapsed() < Duration::from_secs(2));
    assert!(exited.last_log_lines.len() < 64 * 1024);
    assert!(
        activity_of(&mut c, &name).await.is_none(),
        "exit reported twice"
    );
    assert!(runc_list(&root).is_empty());
    assert!(!ate_netns::exists(&sandbox.netns()));

    worker.shutdown().await;
    env.assert_clean();
}

/// A generation written by one worker restores at MEMORY fidelity on another worker of the node
/// (its actor dirs, hence the overlay mount point, live under another path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_restore_on_another_worker() {
    let mut env = Env::new();
    let id_a = unique_name("wa");
    let id_b = unique_name("wb");
    let config_a = worker_config(&mut env, &id_a);
    let config_b = worker_config(&mut env, &id_b);
    let a = RunningWorker::start(config_a.clone()).await;
    let b = RunningWorker::start(config_b.clone()).await;
    let (mut ca, mut cb) = (a.client.clone(), b.client.clone());
    let addr_b = cb
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner()
        .addresses
        .remove(0);
    let addr_a = ca
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner()
        .addresses
        .remove(0);

    let name = unique_name("mover");
    track(&mut env, &config_a, &name);
    track(&mut env, &config_b, &name);
    let target = format!("{ATESPACE}/{name}");
    let wa = workload(&id_a, &name, counter_spec(80, 15));
    ca.start(start_req(&wa, None, v1::Fidelity::Unspecified))
        .await
        .expect("start on A");
    let mut h2a = h2_connect(&addr_a).await;
    let (_, body) = get_via_tunnel(&mut h2a, &target, "/").await;
    assert_eq!(body, counts(1, 1, 1));
    let gen_dir = env.path().join("generations/1");
    let cp = ca
        .checkpoint(checkpoint_req(&wa, &gen_dir, 1))
        .await
        .expect("checkpoint on A")
        .into_inner();
    assert_eq!(cp.fidelity, v1::Fidelity::Memory as i32, "{}", cp.reason);

    let wb = workload(&id_b, &name, counter_spec(80, 15));
    cb.start(start_req(&wb, Some(&gen_dir), v1::Fidelity::Memory))
        .await
        .expect("memory restore on B");
    let mut h2b = h2_connect(&addr_b).await;
    let (_, body) = get_via_tunnel(&mut h2b, &target, "/").await;
    assert_eq!(body, counts(2, 2, 2));
    // A no longer serves it.
    let resp = connect_stream(&mut h2a, &[("ate-target-actor", &target)]).await;
    assert_eq!(resp.status(), 421);

    a.shutdown().await;
    b.shutdown().await;
    env.assert_clean();
}

/// GET / through a CONNECT that carries the router's fencing token.
async fn get_with_token(h2: &mut H2, actor: &str, token: u64) -> (u16, String) {
    let t = token.to_string();
    let resp = connect_stream(
        h2,
        &[("ate-target-actor", actor), ("ate-activation", t.as_str())],
    )
    .await;
    let status = resp.status().as_u16();
    if status != 200 {
        return (status, body_text(resp).await);
    }
    let upgraded = hyper::upgrade::on(resp).await.expect("upgrade");
    let (mut send, conn) = hyper::client::conn::http1::handshake(upgraded)
        .await
        .expect("h1 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    h1_get(&mut send, "/").await
}

/// Unmounts a tmpfs when the test ends, however it ends.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Fencing tokens on the data path (only the copy holding the router's token serves; a newer
/// token makes the worker drop its copy; a start never goes back to an older activation) and a
/// checkpoint into a full disk (nothing written, the actor serves on with its memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_and_a_checkpoint_into_a_full_disk() {
    let mut env = Env::new();
    let id = unique_name("w");
    let config = worker_config(&mut env, &id);
    let worker = RunningWorker::start(config.clone()).await;
    let mut c = worker.client.clone();
    let info = c
        .info(v1::WorkerInfoRequest {})
        .await
        .expect("Info")
        .into_inner();
    let addr = info.addresses[0].clone();
    let name = unique_name("fence");
    let _sandbox = track(&mut env, &config, &name);
    let target = format!("{ATESPACE}/{name}");
    let mut w = workload(&id, &name, counter_spec(80, 15));
    w.activation = 1;
    c.start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect("Start activation 1");
    let mut h2 = h2_connect(&addr).await;
    assert_eq!(
        get_with_token(&mut h2, &target, 1).await,
        (200, counts(1, 1, 1))
    );
    assert_eq!(
        activity_of(&mut c, &name).await.map(|a| a.activation),
        Some(1)
    );

    // A checkpoint into a full disk writes nothing and the actor serves on, memory intact.
    let full = env.path().join("full");
    std::fs::create_dir_all(&full).expect("mkdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&full)
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount tmpfs");
    let _tmpfs = Tmpfs(full.clone());
    // Fill it to the last byte.
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(full.join("filler")).expect("filler");
        let chunk = vec![0u8; 4096];
        while filler.write_all(&chunk).is_ok() {}
        let _ = filler.write_all(&[0u8]);
    }
    let gen_dir = full.join("gen-1");
    let err = c
        .checkpoint(checkpoint_req(&w, &gen_dir, 1))
        .await
        .expect_err("a checkpoint into a full disk must fail");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    assert!(err.message().contains("runs on"), "{}", err.message());
    assert!(!gen_dir.exists(), "the partial generation is removed");
    assert_eq!(
        get_with_token(&mut h2, &target, 1).await,
        (200, counts(2, 2, 2))
    );

    // A checkpoint naming another activation is refused.
    let mut other = w.clone();
    other.activation = 5;
    let err = c
        .checkpoint(checkpoint_req(&other, &env.path().join("gen-x"), 1))
        .await
        .expect_err("another activation");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // A CONNECT with an older token is refused; one with a newer token is refused too, and the
    // worker drops this copy (the actor was activated again elsewhere).
    assert_eq!(get_with_token(&mut h2, &target, 0).await.0, 400);
    let mut w2 = w.clone();
    w2.activation = 2;
    assert_eq!(get_with_token(&mut h2, &target, 2).await.0, 421);
    let dropped = "the superseded copy dropped";
    poll_until(
        dropped,
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || activity_of(&mut c, &name).await.is_none().then_some(()),
    )
    .await;
    assert_eq!(get_with_token(&mut h2, &target, 1).await.0, 421);

    // Activation 2 starts here; a late start of activation 1 is refused, a retried one of 2
    // is a no-op.
    c.start(start_req(&w2, None, v1::Fidelity::Unspecified))
        .await
        .expect("Start activation 2");
    let err = c
        .start(start_req(&w, None, v1::Fidelity::Unspecified))
        .await
        .expect_err("an older activation");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    c.start(start_req(&w2, None, v1::Fidelity::Unspecified))
        .await
        .expect("retried Start activation 2");
    assert_eq!(get_with_token(&mut h2, &target, 2).await.0, 200);
    // Stop guarded by an older activation leaves the newer copy alone.
    c.stop(v1::WorkerStopRequest {
        actor: w.actor.clone(),
        activation_at_most: 1,
    })
    .await
    .expect("guarded Stop");
    assert_eq!(get_with_token(&mut h2, &target, 2).await.0, 200);
    worker.shutdown().await;
}

/// One worker id, one serving process: a second `run` of the same worker (a restart whose
/// predecessor is still stopping) waits for the first to exit — its identity lock — without
/// binding anything, then takes over; the first's exit leaves the second's socket alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_of_a_worker_waits_for_the_first() {
    let mut env = Env::new();
    let id = unique_name("w");
    let config = worker_config(&mut env, &id);
    let lock = config.lock_path();
    let first = RunningWorker::start(config.clone()).await;
    let epoch_of = |mut c: WorkerServiceClient<tonic::transport::Channel>| async move {
        c.info(v1::WorkerInfoRequest {})
            .await
            .expect("Info")
            .into_inner()
            .epoch
    };
    let first_epoch = epoch_of(first.client.clone()).await;

    let (stop_second, stopped) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn(ate_worker::run(config.clone(), async move {
        let _ = stopped.await;
    }));
    // The scenario: a while with the first still running, the second must keep waiting.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!second.is_finished(), "the second process gave up waiting");
    // The socket still leads to the first process, and the lock names it (this test process).
    assert_eq!(
        epoch_of(connect_worker(&first.socket).await.expect("connect")).await,
        first_epoch
    );
    assert_eq!(
        std::fs::read_to_string(&lock).expect("lock file").trim(),
        std::process::id().to_string()
    );

    // The first stops (not through `shutdown()`, which expects the socket gone: the second may
    // have bound it by then).
    let RunningWorker {
        stop, task, socket, ..
    } = first;
    if let Some(tx) = stop {
        let _ = tx.send(());
    }
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("first worker stopped in time")
        .expect("first worker task")
        .expect("first worker run");
    let (_, second_epoch) = serving(&socket, &second).await;
    assert_ne!(
        second_epoch, first_epoch,
        "the socket still leads to the first"
    );
    let _ = stop_second.send(());
    tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .expect("second worker stopped in time")
        .expect("second worker task")
        .expect("second worker run");
    assert!(!socket.exists(), "socket left after the second's shutdown");
}
