//! The multi-node test bed on one machine: two node hosts, each a network namespace with its own
//! addresses on a bridge, joined with one command and a token (`ate up --role node --join …`);
//! two control hosts (`ate up --role control`, api + router each) sharing one PostgreSQL
//! database and one CA; moto as the object store. Under a sequential client load on every
//! actor (alternating between the two routers) it runs placement across the nodes, a move
//! through a durable copy, and the loss of an api replica, of a router and of a whole node,
//! and checks what must hold: no state lost (an actor's count never goes back, except to its
//! newest durable generation after its node is lost, the documented recovery point), no double
//! activation, every worker's used slots equal to its running containers, every actor answering
//! at the end. The figures are printed as a table (copied into docs/reliability.md).

mod support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{ATE, free_port, images_dir, on_path};

const NS: &str = "mn";
const ACTORS: usize = 6;
/// How long a lost part stays lost.
const OUTAGE: Duration = Duration::from_secs(8);
/// Longest wait for an affected actor to answer 200 again.
const RECOVERY: Duration = Duration::from_secs(60);

fn cannot_run() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (network namespaces, runc)".into());
    }
    for t in ["runc", "criu", "nsenter", "ip", "moto_server", "psql"] {
        if !on_path(t) {
            return Some(format!("{t} is not installed"));
        }
    }
    if std::env::var("ATE_TEST_POSTGRES_URL").is_err() {
        return Some(
            "ATE_TEST_POSTGRES_URL is not set (eval \"$(scripts/test-services.sh)\")".into(),
        );
    }
    None
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// A bridge in the root namespace and two node hosts (netns), removed on drop.
struct Net {
    bridge: String,
    gateway: Ipv4Addr,
    hosts: Vec<NodeHost>,
}

struct NodeHost {
    name: String,
    netns: String,
    veth: String,
    ips: [Ipv4Addr; 2],
}

impl Net {
    fn create() -> Net {
        let n = (std::process::id() % 200) as u8 + 20;
        let tag = format!("m{n}");
        let bridge = format!("atebr{tag}");
        let gateway = Ipv4Addr::new(10, 213, n, 1);
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let mut net = Net {
            bridge,
            gateway,
            hosts: Vec::new(),
        };
        for (i, name) in ["node-a", "node-b"].into_iter().enumerate() {
            let netns = format!("ate{tag}-{name}");
            let veth = format!("atv{tag}{i}");
            let _ = Command::new("ip").args(["netns", "del", &netns]).output();
            ip(&["netns", "add", &netns]);
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ]);
            ip(&["link", "set", &veth, "master", &net.bridge, "up"]);
            let base = 11 + 10 * i as u8;
            let ips = [
                Ipv4Addr::new(10, 213, n, base),
                Ipv4Addr::new(10, 213, n, base + 1),
            ];
            for a in ips {
                ip(&[
                    "-n",
                    &netns,
                    "addr",
                    "add",
                    &format!("{a}/24"),
                    "dev",
                    "eth0",
                ]);
            }
            ip(&["-n", &netns, "link", "set", "eth0", "up"]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                &netns,
                "route",
                "add",
                "default",
                "via",
                &gateway.to_string(),
            ]);
            net.hosts.push(NodeHost {
                name: name.to_string(),
                netns,
                veth,
                ips,
            });
        }
        net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = Command::new("ip").args(["netns", "del", &h.netns]).output();
            let _ = Command::new("ip").args(["link", "del", &h.veth]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

/// A process tree we started, killed (with every descendant) on drop.
struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, then SIGKILL of the whole tree after `grace`.
    fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        signal(self.pid(), "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        kill_tree(self.pid());
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(30));
    }
}

fn signal(pid: i32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Every descendant of `pid` (children first found through /proc).
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            break;
        };
        for e in entries.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // pid (comm) state ppid …: comm may hold spaces, so split after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|s| s.parse::<i32>().ok());
            if ppid == Some(p) {
                out.push(child);
                todo.push(child);
            }
        }
    }
    out
}

fn kill_tree(pid: i32) {
    let all = descendants(pid);
    signal(pid, "KILL");
    for p in all {
        signal(p, "KILL");
    }
}

/// The child of `parent` whose command line contains `needle`.
fn child_with(parent: i32, needle: &str) -> Option<i32> {
    descendants(parent).into_iter().find(|p| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
            .unwrap_or(false)
    })
}

fn spawn(cmd: &mut Command, what: &str, log: &Path) -> Proc {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    Proc {
        child,
        what: what.to_string(),
    }
}

fn wait_file(p: &mut Proc, file: &Path, log: &Path) -> Value {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(v) = serde_json::from_str(&text)
        {
            return v;
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!(
                "{} exited ({status}):\n{}",
                p.what,
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "{} not ready in 90 s:\n{}",
            p.what,
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One answer seen by a client.
#[derive(Clone, Debug)]
struct Sample {
    /// When the request was sent and when its answer came (s since the load started).
    sent: f64,
    t: f64,
    actor: usize,
    status: u16,
    count: Option<u64>,
}

fn memory_count(body: &str) -> Option<u64> {
    let rest = body.split("preserved memory count:").nth(1)?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// GET / through `router` with a short timeout; status 0 = no answer.
fn get(router: SocketAddr, actor: &str) -> (u16, String) {
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&router, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
    let req = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nate-target-actor: {actor}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let (status, _, body) = ate_test_support::http::read_response(&mut s);
    (status, body)
}

/// `mn/open`: the counter with an allow-all egress policy and explicit allow entries.
fn egress_template(allow: &[String]) -> String {
    let images = images_dir();
    let allow: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata:
  namespace: {NS}
  name: open
spec:
  containers:
    - name: main
      image: oci-layout:{images}/counter:latest
      command: [\"/counter\"]
      wakeupProbe:
        httpGet: {{path: /healthz, port: 80}}
        timeoutSeconds: 10
  resources: {{cpu: 250m, memory: 64Mi}}
  snapshots: {{fidelity: memory}}
  idleTimeout: 5m
  egress:
    defaultAction: allow-all
    allow: [{}]
",
        allow.join(", "),
        images = images.display(),
    )
}

/// GET `path` of `actor` through `router`: (status, body).
fn get_path(router: SocketAddr, actor: &str, path: &str) -> (u16, String) {
    let (status, _, body) = support::get(router, actor, path);
    (status, body)
}

struct Bed {
    tmp: PathBuf,
    ctl_api: [String; 2],
    ctl: Vec<Proc>,
    nodes: Vec<Proc>,
    node_states: Vec<PathBuf>,
    admin_state: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop(Duration::from_secs(60));
        }
        // A lost node's containers still run (as on a machine that is gone, but this one is not).
        for state in &self.node_states {
            kill_containers(state);
            support::remove_leftover_sandboxes(state);
        }
        for c in &mut self.ctl {
            c.stop(Duration::from_secs(30));
        }
    }
}

/// A database of our own on the test PostgreSQL, dropped with the guard.
struct Database {
    base: String,
    name: String,
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &self.base,
                "-qc",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .output();
    }
}

impl Bed {
    fn ate(&self, api: usize, args: &[&str]) -> Output {
        Command::new(ATE)
            .args(["--api", &self.ctl_api[api]])
            .env("ATE_STATE_DIR", &self.admin_state)
            .env("HOME", &self.tmp)
            .env("XDG_CONFIG_HOME", self.tmp.join("config"))
            .args(args)
            .output()
            .expect("run ate")
    }

    fn ate_ok(&self, api: usize, args: &[&str]) -> String {
        let out = self.ate(api, args);
        assert!(
            out.status.success(),
            "ate {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn actors(&self, api: usize) -> Vec<Value> {
        let json = self.ate_ok(api, &["get", "actors", "-a", NS, "-o", "json"]);
        serde_json::from_str::<Vec<Value>>(&json).expect("actors json")
    }

    fn worker_of(&self, api: usize, actor: &str) -> Option<String> {
        self.actors(api)
            .into_iter()
            .find(|a| a["name"] == actor)
            .and_then(|a| a["worker"].as_str().map(str::to_string))
    }

    fn workers(&self, api: usize) -> Vec<Value> {
        let json = self.ate_ok(api, &["get", "workers", "-o", "json"]);
        serde_json::from_str::<Vec<Value>>(&json).expect("workers json")
    }
}

/// Running containers per worker of `state` (runc list of each worker's root).
fn containers(state: &Path) -> BTreeMap<String, Vec<String>> {
    support::runc::runc_lists(state)
        .into_iter()
        .map(|(worker, list)| {
            let running = list
                .into_iter()
                .filter(|c| c["status"] == "running")
                .filter_map(|c| c["id"].as_str().map(str::to_string))
                .collect();
            (worker, running)
        })
        .collect()
}

/// The actor whose sandbox on `worker` of `state` is container `id`.
fn actor_of(state: &Path, worker: &str, id: &str) -> Option<String> {
    (0..ACTORS).map(|i| format!("c{i}")).find(|a| {
        let dir = state
            .join("workers")
            .join(worker)
            .join("actors")
            .join(NS)
            .join(a);
        ate_worker::ActorSandbox::new("", "", "", &dir).container_id() == id
    })
}

/// Kills every container of a node's state dir (a machine that lost power takes them along).
fn kill_containers(state: &Path) {
    let Ok(workers) = std::fs::read_dir(state.join("workers")) else {
        return;
    };
    for w in workers.flatten() {
        let root = w.path().join("runc");
        for id in containers(state)
            .get(&w.file_name().to_string_lossy().into_owned())
            .cloned()
            .unwrap_or_default()
        {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&root)
                .args(["kill", &id, "KILL"])
                .output();
        }
    }
}

#[derive(Default)]
struct Fault {
    name: String,
    affected: Vec<usize>,
    start: f64,
    end: f64,
    first_ok_after: Option<f64>,
    statuses: BTreeMap<u16, usize>,
    lost: usize,
    note: String,
}

#[test]
fn multi_node_test_bed() {
    if let Some(why) = cannot_run() {
        eprintln!("skipping multi_node_test_bed: {why}");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().to_path_buf();
    // ATE_KEEP_TEST_DIR=1 keeps the logs of every component for a look after the run.
    let _tmp = if std::env::var_os("ATE_KEEP_TEST_DIR").is_some() {
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    let net = Net::create();
    let gw = net.gateway;

    // Shared services: a database of our own on the test PostgreSQL, moto on the bridge.
    let pg_base = std::env::var("ATE_TEST_POSTGRES_URL").expect("pg url");
    let db = format!("ate_mn_{}", std::process::id());
    let _ = Command::new("psql")
        .args([&pg_base, "-qc", &format!("DROP DATABASE IF EXISTS {db}")])
        .output();
    run(Command::new("psql").args([&pg_base, "-qc", &format!("CREATE DATABASE {db}")]));
    let _db = Database {
        base: pg_base.clone(),
        name: db.clone(),
    };
    let (pg_prefix, _) = pg_base.rsplit_once('/').expect("pg url has a database");
    let store = format!("{pg_prefix}/{db}");
    let moto_port = free_port();
    let moto_log = root.join("moto.log");
    let mut moto = spawn(
        Command::new("moto_server").args(["-H", &gw.to_string(), "-p", &moto_port.to_string()]),
        "moto",
        &moto_log,
    );
    let s3 = format!("http://{gw}:{moto_port}");
    let bucket = format!("ate-mn-{}", std::process::id());
    let start = Instant::now();
    loop {
        let o = Command::new("curl")
            .args(["-fsS", "-X", "PUT", &format!("{s3}/{bucket}")])
            .output()
            .expect("curl");
        if o.status.success() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "moto not up");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Two control hosts: api + router each, one store, one CA.
    let api_ports = [free_port(), free_port()];
    let ctl_api = api_ports.map(|p| format!("{gw}:{p}"));
    let routers = [free_port(), free_port()].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    // Each router's internal listener (mTLS), where joined nodes' workers send their actors'
    // calls to other actors.
    let router_internal = [free_port(), free_port()].map(|p| format!("{gw}:{p}"));
    let mut ctl = Vec::new();
    for i in 0..2 {
        let state = root.join(format!("ctl{}", i + 1));
        let ready = root.join(format!("ctl{}.json", i + 1));
        let log = root.join(format!("ctl{}.log", i + 1));
        let mut cmd = Command::new(ATE);
        cmd.args(["up", "--role", "control", "--store", &store])
            .arg("--state-dir")
            .arg(&state)
            .arg("--images-dir")
            .arg(images_dir())
            .args([
                "--api-listen",
                &ctl_api[i],
                "--api-http-listen",
                "127.0.0.1:0",
            ])
            .args(["--router-listen", &routers[i].to_string()])
            .arg(format!(
                "--router-arg=--internal-listen={}",
                router_internal[i]
            ))
            .args([
                "--router-metrics-listen",
                &format!("127.0.0.1:{}", free_port()),
            ])
            .args(["--peer-api", &ctl_api[1 - i]])
            .arg("--ready-file")
            .arg(&ready)
            .env("HOME", &root)
            .env("XDG_CONFIG_HOME", root.join("config"));
        if i == 1 {
            cmd.arg("--ca-dir")
                .arg(root.join("ctl1/ca"))
                .arg("--no-demo");
        }
        let mut p = spawn(&mut cmd, &format!("control host {}", i + 1), &log);
        wait_file(&mut p, &ready, &log);
        ctl.push(p);
    }
    let mut bed = Bed {
        tmp: root.clone(),
        ctl_api: ctl_api.clone(),
        ctl,
        nodes: Vec::new(),
        node_states: Vec::new(),
        admin_state: root.join("ctl1"),
    };

    // Two node hosts join with one token.
    let token = bed
        .ate_ok(
            0,
            &[
                "token",
                "create",
                "--ttl",
                "15m",
                "--description",
                "test bed",
            ],
        )
        .trim()
        .to_string();
    let join = ctl_api.join(",");
    for h in &net.hosts {
        let state = root.join(&h.name);
        let ready = root.join(format!("{}.json", h.name));
        let log = root.join(format!("{}.log", h.name));
        // The fleet's snapshot keys, copied from the control host as docs/deploy.md says.
        std::fs::create_dir_all(&state).expect("node state dir");
        run(Command::new("cp")
            .arg("-rp")
            .arg(root.join("ctl1/keys"))
            .arg(state.join("keys")));
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/var/run/netns/{}", h.netns))
            .arg(ATE)
            .args([
                "up",
                "--role",
                "node",
                "--join",
                &join,
                "--join-token",
                &token,
            ])
            .args(["--node-name", &h.name])
            .args(["--router-internal", &router_internal[0]])
            .arg("--state-dir")
            .arg(&state)
            .args(["--node-listen", &format!("{}:8085", h.ips[0])])
            .args(["--workers", "2", "--worker-slots", "4"])
            .args([
                "--worker-first-ip",
                &h.ips[0].to_string(),
                "--worker-port",
                "8443",
            ])
            .args(["--durable-store", &format!("s3://{bucket}/gens")])
            .arg("--ready-file")
            .arg(&ready)
            .env("AWS_ENDPOINT_URL", &s3)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("HOME", &root);
        let mut p = spawn(&mut cmd, &h.name, &log);
        wait_file(&mut p, &ready, &log);
        bed.nodes.push(p);
        bed.node_states.push(state);
    }
    let workers = bed.workers(1);
    assert_eq!(
        workers.iter().filter(|w| w["status"] == "ACTIVE").count(),
        4,
        "both replicas see all four workers: {workers:?}"
    );

    // Placement across the nodes: half the actors pinned to each node for their first start.
    bed.ate_ok(0, &["create", "atespace", NS]);
    for i in 0..ACTORS {
        let node = if i < ACTORS / 2 { "node-a" } else { "node-b" };
        bed.ate_ok(
            i % 2,
            &[
                "create",
                "actor",
                &format!("c{i}"),
                "-a",
                NS,
                "-t",
                "ate-demo/counter",
                "--selector",
                &format!("ate.dev/node={node}"),
            ],
        );
    }
    for i in 0..ACTORS {
        let (status, body) = get(routers[i % 2], &format!("{NS}/c{i}"));
        assert_eq!(status, 200, "first request to c{i}: {body}");
    }
    let placed: Vec<String> = (0..ACTORS)
        .map(|i| bed.worker_of(0, &format!("c{i}")).expect("placed"))
        .collect();
    for (i, w) in placed.iter().enumerate() {
        let node = if i < ACTORS / 2 { "node-a" } else { "node-b" };
        assert!(w.starts_with(node), "c{i} on {w}, pinned to {node}");
    }
    // Egress on the cluster network: an actor on node-a with an allow-all policy reaches
    // node-b's address only through an explicit allow entry, and never the api or the object
    // store, even though its template names them explicitly.
    let node_b = net.hosts[1].ips[0];
    let api_addr = ctl_api[0].clone();
    let moto_addr = format!("{gw}:{moto_port}");
    let tpl = root.join("egress.yaml");
    std::fs::write(
        &tpl,
        egress_template(&[
            format!("{node_b}:8443"),
            api_addr.clone(),
            moto_addr.clone(),
        ]),
    )
    .expect("write template");
    bed.ate_ok(0, &["apply", "-f", tpl.to_str().expect("utf-8 path")]);
    bed.ate_ok(
        0,
        &[
            "create",
            "actor",
            "out",
            "-a",
            NS,
            "-t",
            "mn/open",
            "--selector",
            "ate.dev/node=node-a",
        ],
    );
    let connect = |addr: &str| {
        get_path(
            routers[0],
            &format!("{NS}/out"),
            &format!("/connect?addr={addr}"),
        )
    };
    let reached = connect(&format!("{node_b}:8443"));
    assert_eq!(
        reached,
        (200, "ok".to_string()),
        "explicitly allowed cluster address"
    );
    let unlisted = connect(&format!("{}:8443", net.hosts[1].ips[1]));
    assert_eq!(
        unlisted.0, 502,
        "a cluster address without an allow entry: {unlisted:?}"
    );
    for addr in [&api_addr, &moto_addr] {
        let denied = connect(addr);
        assert_eq!(denied.0, 502, "control-plane address {addr}: {denied:?}");
    }
    let worker_logs: String = ["node-a-worker-1", "node-a-worker-2"]
        .iter()
        .map(|w| {
            std::fs::read_to_string(root.join("node-a/logs").join(format!("{w}.log")))
                .unwrap_or_default()
        })
        .collect();
    assert!(
        worker_logs.contains("control-plane address"),
        "the denial names the control plane:\n{worker_logs}"
    );
    bed.ate_ok(0, &["suspend", "actor", "out", "-a", NS]);
    bed.ate_ok(0, &["delete", "actor", "out", "-a", NS]);

    // Calls between actors on different nodes, by name from inside: through the router's
    // internal listener on the control host, which names the caller to the callee.
    let (first, last) = (format!("{NS}/c0"), format!("{NS}/c{}", ACTORS - 1));
    for (from, to) in [(&first, &last), (&last, &first)] {
        let (status, body) = get_path(routers[0], from, &format!("/call?actor={to}&path=/caller"));
        assert_eq!(status, 200, "{from} calls {to}: {body}");
        assert!(
            body.contains("status: 200") && body.contains(&format!("caller: {from}")),
            "{to} answered {from}'s call and was told who called: {body}"
        );
    }

    // From now on any node may host any actor.
    for i in 0..ACTORS {
        bed.ate_ok(
            0,
            &[
                "update",
                "actor",
                &format!("c{i}"),
                "-a",
                NS,
                "--selector",
                "",
            ],
        );
    }

    // The load: one sequential client per actor, alternating routers (a client of a lost
    // router retries on the other at once, as behind a load balancer).
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..ACTORS)
        .map(|i| {
            let samples = samples.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let target = format!("{NS}/c{i}");
                let mut n = i;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let sent = t0.elapsed().as_secs_f64();
                    let mut answer = get(routers[n % 2], &target);
                    if answer.0 == 0 {
                        answer = get(routers[(n + 1) % 2], &target);
                    }
                    let s = Sample {
                        sent,
                        t: t0.elapsed().as_secs_f64(),
                        actor: i,
                        status: answer.0,
                        count: memory_count(&answer.1),
                    };
                    samples.lock().expect("samples").push(s);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    let now = || t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));

    // The recovery point of a node loss: a durable suspend of every actor (the load resumes
    // each at once). Counts served before the suspend began are in the durable generation.
    let mut floor = [0u64; ACTORS];
    for (i, f) in floor.iter_mut().enumerate() {
        let before = now();
        *f = samples
            .lock()
            .expect("samples")
            .iter()
            .filter(|s| s.actor == i && s.t < before)
            .filter_map(|s| s.count)
            .max()
            .unwrap_or(0);
        bed.ate_ok(
            i % 2,
            &["suspend", "actor", &format!("c{i}"), "-a", NS, "--durable"],
        );
    }
    std::thread::sleep(Duration::from_secs(2));

    let mut faults: Vec<Fault> = Vec::new();
    let first_ok = |samples: &[Sample], actors: &[usize], from: f64| -> Option<f64> {
        actors
            .iter()
            .map(|a| {
                samples
                    .iter()
                    .filter(|s| s.actor == *a && s.sent >= from && s.status == 200)
                    .map(|s| s.t - from)
                    .fold(f64::INFINITY, f64::min)
            })
            .fold(None, |acc: Option<f64>, t| {
                if t.is_finite() {
                    Some(acc.map_or(t, |a| a.max(t)))
                } else {
                    Some(f64::INFINITY)
                }
            })
    };
    let wait_ok = |samples: &Arc<Mutex<Vec<Sample>>>, actors: &[usize], from: f64| {
        let deadline = Instant::now() + RECOVERY;
        while Instant::now() < deadline {
            let s = samples.lock().expect("samples").clone();
            if first_ok(&s, actors, from).is_some_and(f64::is_finite) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    // 1. A move through the durable copy: c0 (node-a) pinned to node-b, suspended durably.
    bed.ate_ok(
        0,
        &[
            "update",
            "actor",
            "c0",
            "-a",
            NS,
            "--selector",
            "ate.dev/node=node-b",
        ],
    );
    bed.ate_ok(0, &["suspend", "actor", "c0", "-a", NS, "--durable"]);
    // Measured from the suspend's return: the next request resumes c0 on node-b.
    let f_start = now();
    wait_ok(&samples, &[0], f_start);
    std::thread::sleep(Duration::from_secs(1));
    let moved_to = bed.worker_of(1, "c0").unwrap_or_default();
    faults.push(Fault {
        name: "move node-a → node-b (durable copy)".into(),
        affected: vec![0],
        start: f_start,
        end: now(),
        note: format!("c0 now on {moved_to}"),
        ..Default::default()
    });
    assert!(moved_to.starts_with("node-b"), "c0 moved to {moved_to}");
    bed.ate_ok(0, &["update", "actor", "c0", "-a", NS, "--selector", ""]);

    // 2. An api replica lost (its supervisor stopped so nothing restarts it); resumes meanwhile
    //    go through the other replica.
    let sup = bed.ctl[0].pid();
    signal(sup, "STOP");
    let api1 = child_with(sup, " api ").expect("api of control host 1");
    let f_start = now();
    signal(api1, "KILL");
    std::thread::sleep(Duration::from_secs(1));
    for i in [1usize, 4] {
        bed.ate_ok(1, &["suspend", "actor", &format!("c{i}"), "-a", NS]);
    }
    std::thread::sleep(OUTAGE);
    let gone: Vec<String> = bed
        .workers(1)
        .into_iter()
        .filter(|w| w["status"] != "ACTIVE")
        .filter_map(|w| w["id"].as_str().map(str::to_string))
        .collect();
    faults.push(Fault {
        name: "api replica 1 killed".into(),
        affected: vec![1, 4],
        start: f_start,
        end: now(),
        note: if gone.is_empty() {
            "no worker marked gone".into()
        } else {
            format!("workers marked gone: {gone:?}")
        },
        ..Default::default()
    });
    assert!(
        gone.is_empty(),
        "workers lost with one api replica: {gone:?}"
    );
    signal(sup, "CONT");
    std::thread::sleep(Duration::from_secs(3));

    // 3. A router lost: its clients go to the other one.
    signal(sup, "STOP");
    let router1 = child_with(sup, " router ").expect("router of control host 1");
    let f_start = now();
    signal(router1, "KILL");
    std::thread::sleep(OUTAGE);
    faults.push(Fault {
        name: "router 1 killed".into(),
        affected: (0..ACTORS).collect(),
        start: f_start,
        end: now(),
        ..Default::default()
    });
    signal(sup, "CONT");
    std::thread::sleep(Duration::from_secs(3));

    // 4. A whole node lost: node-b's agent, workers and containers killed, its network cut.
    let on_b: Vec<usize> = (0..ACTORS)
        .filter(|i| {
            bed.worker_of(0, &format!("c{i}"))
                .is_some_and(|w| w.starts_with("node-b"))
        })
        .collect();
    assert!(!on_b.is_empty(), "node-b hosts actors before its loss");
    // Their recovery point: the newest durable generation, at least the durable suspend above.
    kill_tree(bed.nodes[1].pid());
    kill_containers(&bed.node_states[1]);
    ip(&["link", "set", &net.hosts[1].veth, "down"]);
    // From here on nothing on node-b can answer.
    let f_start = now();
    wait_ok(&samples, &on_b, f_start);
    std::thread::sleep(Duration::from_secs(2));
    faults.push(Fault {
        name: "node-b lost (agent, workers, containers, network)".into(),
        affected: on_b.clone(),
        start: f_start,
        end: now(),
        ..Default::default()
    });

    // Every actor answers at the end.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let samples = samples.lock().expect("samples").clone();
    for i in 0..ACTORS {
        let last = samples
            .iter()
            .rev()
            .find(|s| s.actor == i)
            .expect("samples");
        if last.status != 200 {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.actor == i).collect();
            let timeline: Vec<String> = faults
                .iter()
                .map(|f| format!("{} at {:.1}s", f.name, f.start))
                .collect();
            panic!(
                "c{i} does not answer at the end: {last:?}\nfaults: {timeline:?}\nits last answers: {:?}\nlogs in {}",
                &mine[mine.len().saturating_sub(15)..],
                root.display()
            );
        }
    }

    // No state lost: counts never go back, except for node-b's actors at its loss, and then
    // never below their recovery point.
    let node_loss_start = faults.last().map(|f| f.start).unwrap_or(f64::MAX);
    let mut lost_outside = Vec::new();
    let mut below_recovery = Vec::new();
    for (i, recovery_point) in floor.iter().enumerate() {
        let mut prev: Option<u64> = None;
        for s in samples.iter().filter(|s| s.actor == i) {
            let Some(c) = s.count else { continue };
            if let Some(p) = prev
                && c <= p
            {
                if on_b.contains(&i) && s.t >= node_loss_start {
                    if c < *recovery_point {
                        below_recovery
                            .push(format!("c{i}: {p} → {c} (recovery point {recovery_point})"));
                    }
                } else {
                    lost_outside.push(format!("c{i} at {:.1}s: {p} → {c}", s.t));
                }
            }
            prev = Some(c);
        }
    }
    for f in &mut faults {
        let window: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.t >= f.start && s.t <= f.end)
            .collect();
        for s in &window {
            *f.statuses.entry(s.status).or_default() += 1;
        }
        let owned: Vec<Sample> = window.iter().map(|s| (*s).clone()).collect();
        f.first_ok_after = first_ok(&owned, &f.affected, f.start);
        f.lost = lost_outside
            .iter()
            .filter(|l| {
                l.split(" at ")
                    .nth(1)
                    .and_then(|r| r.split('s').next())
                    .and_then(|t| t.parse::<f64>().ok())
                    .is_some_and(|t| t >= f.start && t <= f.end)
            })
            .count();
    }

    // No double activation, slots equal to containers (on the surviving node).
    let mut running: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut container_count: BTreeMap<String, usize> = BTreeMap::new();
    let state_a = &bed.node_states[0];
    for (w, ids) in containers(state_a) {
        container_count.insert(w.clone(), ids.len());
        for id in ids {
            if let Some(a) = actor_of(state_a, &w, &id) {
                running.entry(a).or_default().push(w.clone());
            }
        }
    }
    let double: Vec<_> = running.iter().filter(|(_, ws)| ws.len() > 1).collect();
    let mut slot_mismatch = Vec::new();
    for w in bed.workers(1) {
        let id = w["id"].as_str().unwrap_or_default().to_string();
        if !id.starts_with("node-a") {
            continue;
        }
        let used = w["slotsUsed"]
            .as_u64()
            .unwrap_or_else(|| panic!("worker {id} has no slotsUsed: {w}"));
        let real = container_count.get(&id).copied().unwrap_or(0) as u64;
        if used != real {
            slot_mismatch.push(format!("{id}: api says {used} used, runc runs {real}"));
        }
    }

    println!(
        "\nmulti-node test bed: 2 control hosts (api + router), 2 node hosts (2 workers each), {ACTORS} actors"
    );
    println!(
        "{:<48} {:>14} {:>28} {:>6}  note",
        "fault", "first 200 (s)", "answers by status", "lost"
    );
    for f in &faults {
        let statuses: Vec<String> = f
            .statuses
            .iter()
            .map(|(s, n)| {
                format!(
                    "{}:{n}",
                    if *s == 0 {
                        "none".to_string()
                    } else {
                        s.to_string()
                    }
                )
            })
            .collect();
        println!(
            "{:<48} {:>14} {:>28} {:>6}  {}",
            f.name,
            f.first_ok_after
                .map(|t| if t.is_finite() {
                    format!("{t:.2}")
                } else {
                    "never".into()
                })
                .unwrap_or_else(|| "-".into()),
            statuses.join(" "),
            f.lost,
            f.note
        );
    }
    println!(
        "node-b's actors {:?}: recovery points {:?}",
        on_b.iter().map(|i| format!("c{i}")).collect::<Vec<_>>(),
        on_b.iter().map(|i| floor[*i]).collect::<Vec<_>>()
    );
    let rollback: Vec<String> = on_b
        .iter()
        .map(|i| {
            let mine = samples.iter().filter(|s| s.actor == *i);
            let before = mine
                .clone()
                .filter(|s| s.t < node_loss_start)
                .filter_map(|s| s.count)
                .max()
                .unwrap_or(0);
            let after = mine
                .filter(|s| s.sent >= node_loss_start)
                .find_map(|s| s.count)
                .unwrap_or(0);
            format!("c{i}: {before} → {after}")
        })
        .collect();
    println!(
        "node-b's actors after its loss (last count before → first count after): {rollback:?}"
    );
    println!("double activations: {double:?}; slot mismatches: {slot_mismatch:?}");

    for f in &faults {
        assert!(
            f.first_ok_after
                .is_some_and(|t| t.is_finite() && t < RECOVERY.as_secs_f64()),
            "{}: affected actors did not answer 200 again",
            f.name
        );
    }
    assert!(lost_outside.is_empty(), "state lost: {lost_outside:?}");
    assert!(
        below_recovery.is_empty(),
        "rolled back past the recovery point: {below_recovery:?}"
    );
    assert!(double.is_empty(), "double activations: {double:?}");
    assert!(slot_mismatch.is_empty(), "slots: {slot_mismatch:?}");

    // Teardown (also on panic): `bed`'s drop stops the nodes and removes what their sandboxes
    // left, then the control hosts; then moto, the database and the network go.
    drop(bed);
    moto.stop(Duration::from_secs(5));
}
