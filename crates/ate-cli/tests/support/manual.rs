//! A system started component by component (api replicas, node, one worker, router) instead of
//! by `ate up`, so a test can kill and restart one of them.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ate_test_support::http::healthz;
use ate_test_support::wait::{read_json, wait_for};
use serde_json::Value;

use super::{ATE, free_port, remove_leftover_sandboxes};

/// api, node, worker and router started one by one (not `ate up`, which stops everything when a
/// child dies), so a test can kill and restart a worker.
pub struct Manual {
    pub dir: tempfile::TempDir,
    pub api: String,
    pub router: SocketAddr,
    pub worker_listen: SocketAddr,
    pub children: Vec<(String, Child)>,
}

impl Manual {
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn spawn(&mut self, name: &str, args: &[String]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log");
        let child = Command::new(ATE)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn");
        self.children.push((name.to_string(), child));
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn ate_ok(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(ATE);
        cmd.arg("--api").arg(&self.api).args(args);
        super::run_ok(&mut cmd, &format!("ate {args:?}"))
    }

    pub fn wait_file(&self, path: &Path) -> Value {
        wait_for(
            &format!("{} to be written", path.display()),
            Duration::from_secs(30),
            Duration::from_millis(50),
            || read_json(path),
        )
    }

    pub fn start_worker(&mut self) {
        let args: Vec<String> = [
            "worker",
            "--id",
            "worker-1",
            "--state-dir",
            self.state().to_str().expect("utf-8"),
            "--listen",
            &self.worker_listen.to_string(),
            "--slots",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self.spawn("worker-1", &args);
    }

    /// The worker's epoch as the api has it, once ACTIVE.
    pub fn worker_epoch(&self) -> Option<u64> {
        let v: Value =
            serde_json::from_str(&self.ate_ok(&["get", "workers", "-o", "json"])).ok()?;
        let w = v.as_array()?.iter().find(|w| w["status"] == "ACTIVE")?;
        w["epoch"].as_u64()
    }

    pub fn up() -> Manual {
        Self::up_with(None, 1)
    }

    /// Like [`Manual::up`] with `apis` api replicas on `store` (default: SQLite in the state
    /// dir); node and router get every replica's address (`--api a,b`), and so does `ate_ok`.
    pub fn up_with(store: Option<String>, apis: usize) -> Manual {
        let dir = tempfile::tempdir().expect("tempdir");
        let ip = Ipv4Addr::new(127, 1 + (std::process::id() % 200) as u8, 252, 2);
        let mut m = Manual {
            api: String::new(),
            router: SocketAddr::from(([127, 0, 0, 1], free_port())),
            worker_listen: SocketAddr::new(ip.into(), free_port()),
            children: Vec::new(),
            dir,
        };
        std::fs::create_dir_all(m.state()).expect("state");
        let s = |x: &str| x.to_string();
        let store =
            store.unwrap_or_else(|| format!("sqlite://{}", m.state().join("ate.db").display()));
        let mut addresses = Vec::new();
        for i in 1..=apis {
            let name = if i == 1 { s("api") } else { format!("api-{i}") };
            addresses.push(m.spawn_api(&name, &store, &[]));
        }
        m.api = addresses.join(",");
        let node_ready = m.dir.path().join("node.json");
        let state = m.state().display().to_string();
        m.spawn(
            "node",
            &[
                s("node"),
                s("--listen"),
                format!("127.0.0.1:{}", free_port()),
                s("--api"),
                m.api.clone(),
                s("--state-dir"),
                state,
                s("--ready-file"),
                node_ready.display().to_string(),
            ],
        );
        m.wait_file(&node_ready);
        m.start_worker();
        let start = Instant::now();
        while m.worker_epoch().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "worker not registered:\n{}",
                m.log("worker-1")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Ports are picked free and then bound by the child, so another test may take one in
        // between: start the router again on new ports until it is ours that answers.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
            m.spawn_router(metrics);
            let start = Instant::now();
            let up = loop {
                let exited = m
                    .children
                    .last_mut()
                    .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(Some(_))));
                if exited {
                    break false;
                }
                if std::net::TcpStream::connect(m.router).is_ok() && healthz(metrics) {
                    break true;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "router not listening"
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            if up {
                break;
            }
            assert!(attempt < 5, "router failed to start:\n{}", m.log("router"));
            m.children.pop();
            m.router = SocketAddr::from(([127, 0, 0, 1], free_port()));
        }
        m
    }

    /// Starts `ate api` as `name` on loopback ports with `store` and `extra` flags; its gRPC
    /// address, once it is ready.
    pub fn spawn_api(&mut self, name: &str, store: &str, extra: &[&str]) -> String {
        let ready = self.dir.path().join(format!("{name}.json"));
        let mut args: Vec<String> = ["api", "--listen", "127.0.0.1:0", "--http-listen"]
            .into_iter()
            .chain(["127.0.0.1:0", "--store", store])
            .chain(extra.iter().copied())
            .map(str::to_string)
            .collect();
        args.push("--ready-file".to_string());
        args.push(ready.display().to_string());
        self.spawn(name, &args);
        let grpc = self.wait_file(&ready)["grpc"].as_str().map(str::to_string);
        grpc.expect("grpc")
    }

    /// Starts `ate router` on `self.router` for the api(s), its `/metrics` on `metrics`.
    pub fn spawn_router(&mut self, metrics: SocketAddr) {
        let args = [
            "router".to_string(),
            "--listen".to_string(),
            self.router.to_string(),
            "--metrics-listen".to_string(),
            metrics.to_string(),
            "--api".to_string(),
            self.api.clone(),
        ];
        self.spawn("router", &args);
    }

    pub fn kill_worker(&mut self) {
        let i = self
            .children
            .iter()
            .position(|(n, _)| n == "worker-1")
            .expect("worker");
        let (_, mut child) = self.children.remove(i);
        child.kill().expect("SIGKILL worker");
        let _ = child.wait();
    }
}

impl Drop for Manual {
    fn drop(&mut self) {
        // Reverse order, each stopped before the next: router, workers (the node and the api
        // suspend their actors meanwhile), node, api.
        for (_, c) in self.children.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(25);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_leftover_sandboxes(&self.state());
    }
}
