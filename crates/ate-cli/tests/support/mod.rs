//! Harness for end-to-end tests: a whole system started with `ate up` (real api, node agent,
//! runc + CRIU workers, router) on private loopback addresses and ports, in a temp state dir, and
//! stopped (with everything it started) when the value is dropped, even if the test panics.

#![allow(dead_code)]

pub mod actors;
pub mod api_process;
pub mod atunnel;
pub mod generations;
pub mod manual;
pub mod runc;
pub mod test_host;
pub mod websocket;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use ate_test_support::ports::{free_port, free_ports};

pub const ATE: &str = env!("CARGO_BIN_EXE_ate");

/// A loopback /24 nobody else in this test process uses: 127.<pid-derived>.<n>.x.
fn private_ip_block() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    // Different test processes (nextest runs one per test) get different second octets.
    let second = 1 + (std::process::id() % 200) as u8;
    Ipv4Addr::new(127, second, (10 + n % 240) as u8, 2)
}

/// Directory of the demo images (OCI layouts): `ATE_TEST_IMAGES`, else built once under target/.
pub fn images_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ATE_TEST_IMAGES") {
        return PathBuf::from(dir);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = root.join("target/tmp/ate-test-images");
    let status = Command::new("bash")
        .arg(root.join("workloads/build-images.sh"))
        .arg(&out)
        .stdout(Stdio::null())
        .status()
        .expect("run workloads/build-images.sh");
    assert!(
        status.success(),
        "workloads/build-images.sh failed; set ATE_TEST_IMAGES to prebuilt images"
    );
    out
}

pub struct UpOptions {
    pub workers: u32,
    /// `--worker-slots` (0: not passed, `ate up`'s default).
    pub slots: u32,
    pub durable_store: Option<String>,
    pub router_args: Vec<String>,
    pub demo: bool,
    /// Extra flags for `ate up` itself (e.g. `--cert-lifetime 6s`).
    pub up_args: Vec<String>,
}

impl Default for UpOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            slots: 4,
            durable_store: None,
            router_args: Vec::new(),
            demo: true,
            up_args: Vec::new(),
        }
    }
}

impl UpOptions {
    /// `workers` workers of `slots` slots each, the demo templates and actors.
    pub fn with_slots(workers: u32, slots: u32) -> UpOptions {
        UpOptions {
            workers,
            slots,
            ..Default::default()
        }
    }

    /// `workers` workers (4 slots each), the demo templates and actors.
    pub fn with_workers(workers: u32) -> UpOptions {
        UpOptions {
            workers,
            ..Default::default()
        }
    }

    /// `workers` workers (4 slots each) and no demo actors or templates.
    pub fn bare(workers: u32) -> UpOptions {
        UpOptions {
            workers,
            demo: false,
            ..Default::default()
        }
    }
}

pub struct System {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub router: String,
    pub router_addr: SocketAddr,
    pub router_metrics: SocketAddr,
    pub api: String,
    /// The api's health/metrics address (`/metrics`), from the ready file.
    pub api_http: String,
    /// The node agent's `/metrics` address, from the ready file (empty if absent).
    pub node_metrics: String,
    /// Each worker's `/metrics` address, from the ready file.
    pub worker_metrics: Vec<String>,
    pub worker_ips: Vec<Ipv4Addr>,
    pub worker_port: u16,
}

impl System {
    pub fn up(opts: UpOptions) -> System {
        Self::up_with_env(opts, &[])
    }

    /// [`System::up`] with extra environment variables for `ate up`, which its components
    /// (api, node, workers, router) inherit: S3 settings, fault injection.
    pub fn up_with_env(opts: UpOptions, env: &[(&str, &str)]) -> System {
        // Ports are picked free and bound later by the children, so a test running in parallel
        // can take one in between: start again on new ports when that is why `ate up` stopped.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_up(&opts, env) {
                Ok(sys) => return sys,
                Err(log) if attempt < 4 && log.contains("in use") => continue,
                Err(log) => panic!("ate up exited:\n{log}"),
            }
        }
    }

    /// Stops `ate up` (its workers suspend their actors) and starts it again on the same state
    /// directory (store, generations, CA) with `opts` and `env`, on new ports.
    pub fn restart_with_env(mut self, opts: UpOptions, env: &[(&str, &str)]) -> System {
        self.stop();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
        drop(self);
        let _ = std::fs::remove_file(dir.path().join("ready.json"));
        match Self::try_up_in(&opts, env, dir) {
            Ok(sys) => sys,
            Err(log) => panic!("ate up (restart) exited:\n{log}"),
        }
    }

    fn try_up(opts: &UpOptions, env: &[(&str, &str)]) -> Result<System, String> {
        Self::try_up_in(opts, env, tempfile::tempdir().expect("tempdir"))
    }

    fn try_up_in(
        opts: &UpOptions,
        env: &[(&str, &str)],
        dir: tempfile::TempDir,
    ) -> Result<System, String> {
        let first_ip = private_ip_block();
        let [router_port, router_metrics_port, worker_port, node_port] = free_ports();
        let ready = dir.path().join("ready.json");
        let mut cmd = Command::new(ATE);
        cmd.arg("up")
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--images-dir")
            .arg(images_dir())
            .args(["--workers", &opts.workers.to_string()])
            .args([
                "--api-listen",
                "127.0.0.1:0",
                "--api-http-listen",
                "127.0.0.1:0",
            ])
            .args(["--node-listen", &format!("127.0.0.1:{node_port}")])
            .args(["--router-listen", &format!("127.0.0.1:{router_port}")])
            .args([
                "--router-metrics-listen",
                &format!("127.0.0.1:{router_metrics_port}"),
            ])
            .args([
                "--worker-first-ip",
                &first_ip.to_string(),
                "--worker-port",
                &worker_port.to_string(),
            ])
            .arg("--ready-file")
            .arg(&ready)
            // Keep `ate up` from writing the tester's ~/.config.
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("up.log")).expect("up.log"));
        cmd.envs(env.iter().copied());
        if opts.slots > 0 {
            cmd.args(["--worker-slots", &opts.slots.to_string()]);
        }
        if let Some(url) = &opts.durable_store {
            cmd.args(["--durable-store", url]);
        }
        if !opts.demo {
            cmd.arg("--no-demo");
        }
        for a in &opts.router_args {
            cmd.arg(format!("--router-arg={a}"));
        }
        cmd.args(&opts.up_args);
        let mut child = cmd.spawn().expect("spawn ate up");
        let start = Instant::now();
        let v: serde_json::Value = loop {
            if let Some(v) = ate_test_support::wait::read_json(&ready) {
                break v;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut log =
                    std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default();
                for c in ["api", "node", "router", "worker-1", "worker-2"] {
                    let l = dir.path().join("state/logs").join(format!("{c}.log"));
                    log.push_str(&std::fs::read_to_string(l).unwrap_or_default());
                }
                return Err(format!("({status}) {log}"));
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "ate up not ready in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let worker_ips = (0..opts.workers)
            .map(|i| Ipv4Addr::from(u32::from(first_ip) + i))
            .collect();
        Ok(System {
            child,
            router: v["router"].as_str().expect("router").to_string(),
            router_addr: SocketAddr::from(([127, 0, 0, 1], router_port)),
            router_metrics: SocketAddr::from(([127, 0, 0, 1], router_metrics_port)),
            api: v["api"].as_str().expect("api").to_string(),
            api_http: v["api_http"].as_str().unwrap_or_default().to_string(),
            node_metrics: v["node_metrics"].as_str().unwrap_or_default().to_string(),
            worker_metrics: v["worker_metrics"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|w| w.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            dir,
            worker_ips,
            worker_port,
        })
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Runs `ate --api <this system> ARGS` (as admin: `ATE_STATE_DIR` points the CLI at the
    /// certificate `ate up` wrote in `<state>/tls`).
    pub fn ate(&self, args: &[&str]) -> Output {
        Command::new(ATE)
            .arg("--api")
            .arg(&self.api)
            .env("ATE_STATE_DIR", self.state_dir())
            .args(args)
            .output()
            .expect("run ate")
    }

    /// Runs `ate …` and returns stdout, panicking with stderr on failure.
    pub fn ate_ok(&self, args: &[&str]) -> String {
        stdout_of_success(self.ate(args), &format!("ate {args:?}"))
    }

    /// `GET path` of `actor` through the router, which must answer 200: (head, body); a
    /// failure shows both and the router's log.
    pub fn get_200(&self, actor: &str, path: &str) -> (String, String) {
        let (status, head, body) = get(self.router_addr, actor, path);
        assert_eq!(
            status,
            200,
            "{head}\n{body}\nrouter log:\n{}",
            self.log("router")
        );
        (head, body)
    }

    /// Runs `ate bench ARGS` against this system with its JSON written to `out_name` in the
    /// test's temp dir; panics with stdout and stderr unless it succeeded: (stdout, that JSON).
    pub fn bench(&self, args: &[&str], out_name: &str) -> (String, serde_json::Value) {
        let out_file = self.dir.path().join(out_name);
        let out = Command::new(ATE)
            .arg("bench")
            .args(args)
            .arg("--out")
            .arg(&out_file)
            .arg("--images-dir")
            .arg(images_dir())
            .env("ATE_API", &self.api)
            .env("ATE_ROUTER", &self.router)
            .env("ATE_STATE_DIR", self.state_dir())
            .output()
            .expect("run ate bench");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let json = std::fs::read_to_string(&out_file).expect("bench JSON");
        (
            stdout,
            serde_json::from_str(&json).expect("bench JSON parses"),
        )
    }

    /// Log of one component (`api`, `node`, `worker-1`, `router`).
    pub fn log(&self, component: &str) -> String {
        std::fs::read_to_string(
            self.state_dir()
                .join("logs")
                .join(format!("{component}.log")),
        )
        .unwrap_or_default()
    }

    /// PID of a component, from `ate up`'s children.
    pub fn pid_of(&self, component_args_contain: &str) -> Option<u32> {
        pgrep_first(&[
            "-P",
            &self.child.id().to_string(),
            "-f",
            component_args_contain,
        ])
    }
}

impl System {
    /// The series `needle` (name and labels as rendered) summed over the system's workers.
    pub fn worker_metric(&self, needle: &str) -> u64 {
        self.worker_metrics
            .iter()
            .map(|addr| metric_at(addr, needle))
            .sum()
    }

    /// The series `needle` (name and labels as rendered) of the api's `/metrics`.
    pub fn api_metric(&self, needle: &str) -> u64 {
        metric_at(&self.api_http, needle)
    }

    /// The series `needle` (name and labels as rendered) of the node agent's `/metrics`.
    pub fn node_metric(&self, needle: &str) -> u64 {
        metric_at(&self.node_metrics, needle)
    }

    /// Stops the system like drop does, but keeps the temp dir, so a test can inspect what was
    /// left behind. Idempotent.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SIGTERM: `ate up` stops its children (sandboxes included) and exits.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        // `ate up` stops router, workers (which have their actors suspended), node and api in
        // that order, each with a grace period.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut stopped = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                stopped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        remove_leftover_sandboxes(&self.state_dir());
    }
}

/// Sandboxes outlive their workers on purpose (a restarted worker re-adopts them). A test that
/// ends with some left (a worker killed, a drain that could not finish) removes them here with
/// `ate worker --remove-leftovers`, one run per worker id under `<state>/workers`.
pub fn remove_leftover_sandboxes(state: &Path) {
    for id in ate_bench::workers_with_leftovers(state) {
        let _ = Command::new(ATE)
            .args(ate_bench::remove_leftovers_args(state, &id))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for System {
    fn drop(&mut self) {
        // A failing test shows what `ate up` and each component said last (a component that
        // died and was restarted shows up in up.log), before the temp dir goes.
        if std::thread::panicking() {
            let tail = |text: &str| {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            };
            let up = std::fs::read_to_string(self.dir.path().join("up.log")).unwrap_or_default();
            eprintln!("--- up.log (last 40 lines) ---\n{}", tail(&up));
            if let Ok(dir) = std::fs::read_dir(self.state_dir().join("logs")) {
                let mut logs: Vec<_> = dir.flatten().map(|e| e.path()).collect();
                logs.sort();
                for path in logs.into_iter().filter(|p| p.is_file()) {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    eprintln!(
                        "--- {} (last 40 lines) ---\n{}",
                        path.display(),
                        tail(&text)
                    );
                }
            }
        }
        self.stop();
    }
}

/// The stdout of a command that succeeded; panics, naming `what` and with its stderr, otherwise.
pub fn stdout_of_success(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` to its end: its stdout when it succeeded; panics, naming `what`, otherwise.
pub fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    stdout_of_success(out, what)
}

/// Waits until the cgroup file `file` reads `want` (a CPU weight), until `deadline`.
pub fn wait_for_weight(file: &Path, want: u64, deadline: Instant) {
    loop {
        let now = std::fs::read_to_string(file).unwrap_or_default();
        if now.trim() == want.to_string() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} reads {now:?}, not {want}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends SIGKILL to `pid`, which must succeed.
pub fn kill_9(pid: impl std::fmt::Display) {
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -9 {pid}");
}

/// True when `program` is in a `PATH` directory.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

/// The first PID `pgrep ARGS` prints, if any.
pub fn pgrep_first(args: &[&str]) -> Option<u32> {
    let out = Command::new("pgrep").args(args).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Waits (up to 10 s: components write their logs as they go) until `text()` has a line
/// containing `needle`; returns those lines (`what` names the log in a failure).
pub fn lines_with(what: &str, needle: &str, text: impl Fn() -> String) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<String> = text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect();
        if !found.is_empty() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no line with {needle:?} in the {what} log:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The arguments of `ate create actor NAME -a ATESPACE -t TEMPLATE` (TEMPLATE as `atespace/name`).
pub fn create_actor_args<'a>(name: &'a str, atespace: &'a str, template: &'a str) -> [&'a str; 7] {
    ["create", "actor", name, "-a", atespace, "-t", template]
}

/// A minimal HTTP/1.1 GET through the router with the actor header; returns (status, headers, body).
pub fn get(router: SocketAddr, actor: &str, path: &str) -> (u16, String, String) {
    request(router, "GET", actor, path, "")
}

pub fn request(
    router: SocketAddr,
    method: &str,
    actor: &str,
    path: &str,
    body: &str,
) -> (u16, String, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(router).expect("connect router");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test.local\r\nate-target-actor: {actor}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    ate_test_support::http::read_response(&mut s)
}

/// One worker with frozen copies off (`ATE_KEEP_FROZEN=0`), so every resume restores, and so
/// verifies, the generation on disk; optionally a durable store.
pub fn one_worker_restoring(durable_store: Option<String>) -> System {
    System::up_with_env(
        UpOptions {
            workers: 1,
            durable_store,
            ..Default::default()
        },
        &[("ATE_KEEP_FROZEN", "0")],
    )
}

/// A fresh PostgreSQL database on the test server (`ATE_TEST_POSTGRES_URL`).
pub fn fresh_postgres() -> String {
    let db = format!(
        "ate_e2e_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    ate_test_support::services::create_postgres_database(&db)
}

/// Milliseconds of `d`, for printed timings.
pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// A process under `root` (its child, grandchild, … up to 8 levels) whose arguments satisfy
/// `matches`: a runc or CRIU run by one of `ate up`'s components, for a fault test to kill.
pub fn descendant_matching(root: u32, matches: impl Fn(&[String]) -> bool) -> Option<i32> {
    let procs: Vec<(i32, i32, Vec<String>)> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat
                .get(stat.rfind(')')? + 1..)?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, ppid, args))
        })
        .collect();
    let descends = |mut pid: i32| {
        for _ in 0..8 {
            let Some((_, ppid, _)) = procs.iter().find(|(p, _, _)| *p == pid) else {
                return false;
            };
            if *ppid == root as i32 {
                return true;
            }
            pid = *ppid;
        }
        false
    };
    procs
        .iter()
        .find(|(pid, _, args)| matches(args) && descends(*pid))
        .map(|(pid, _, _)| *pid)
}

/// The value of the series `needle` (name and labels as rendered) on the `/metrics` page at
/// `addr`, 0 when absent.
fn metric_at(addr: &str, needle: &str) -> u64 {
    let (_, text) = ate_test_support::http::http_get(addr, "/metrics");
    text.lines()
        .find(|l| l.starts_with(needle))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
