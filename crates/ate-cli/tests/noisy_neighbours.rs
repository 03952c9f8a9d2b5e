//! Issue 38, item 4: noisy neighbours are bounded by weights. On one worker, a quiet counter
//! (250m) and a hog counter whose template books every core (so its quota caps nothing) spinning
//! on all of them (`/spin`). The test asserts the mechanism, which does not depend on how busy
//! the machine is: an actor that uses less than half its share weighs 4 times the machine
//! (`ate_worker::wakeup`), and one that spins goes back to its template's `cpu` at the worker's
//! next CPU pass, while the quiet one keeps its boost. And one generous bound on the quiet
//! actor's warm latency under the hog (a debug build on a loaded 2-core machine): the ratio the
//! issue asks for (p99 ≤ 2×) is measured by `ate bench noisy` on a release build
//! (docs/benchmarks.md), not asserted here, where timing alone would make the test flaky.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::{System, UpOptions, create_actor_args, images_dir, wait_for_weight};

const NS: &str = "noisy";
const REQUESTS: usize = 300;

fn template(name: &str, cpu: &str) -> String {
    let images = images_dir().display().to_string();
    format!(
        r#"apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {{name: {NS}}}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {{namespace: {NS}, name: {name}}}
spec:
  containers:
    - name: counter
      image: "oci-layout:{images}/counter:latest"
      command: ["/counter"]
      wakeupProbe: {{httpGet: {{path: /healthz, port: 80}}, timeoutSeconds: 10}}
  resources: {{cpu: {cpu}, memory: 64Mi}}
  snapshots: {{fidelity: memory}}
  idleTimeout: 5m
"#
    )
}

/// A kept-alive HTTP/1.1 connection to the router for one actor.
struct KeepAlive {
    reader: BufReader<TcpStream>,
    actor: String,
}

impl KeepAlive {
    fn new(router: SocketAddr, actor: &str) -> Self {
        let s = TcpStream::connect(router).expect("connect router");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Self {
            reader: BufReader::new(s),
            actor: actor.to_string(),
        }
    }

    /// GET `path`: status and body.
    fn get(&mut self, path: &str) -> (u16, String) {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: test.local\r\nate-target-actor: {}\r\n\r\n",
            self.actor
        );
        self.reader
            .get_mut()
            .write_all(req.as_bytes())
            .expect("write");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut len = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().expect("content-length");
            }
        }
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

/// `REQUESTS` sequential `GET /healthz`, 2 ms apart: sorted latencies in ms.
fn measure(conn: &mut KeepAlive) -> Vec<f64> {
    let mut ms = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let (status, body) = conn.get("/healthz");
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(status, 200, "{body}");
        std::thread::sleep(Duration::from_millis(2));
    }
    ms.sort_by(f64::total_cmp);
    ms
}

fn p(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// How a weight file's value follows a template's `cpu`, the machine's and the boost.
type WeightOf = fn(u32, u32, bool) -> u64;

/// The CPU weight file (v1 `cpu.shares`, v2 `cpu.weight`) of the actor's sandbox cgroup and
/// how its value is computed.
fn weight_file(sys: &System, name: &str) -> (std::path::PathBuf, WeightOf) {
    let workers = sys.state_dir().join("workers");
    for worker in std::fs::read_dir(&workers).expect("workers dir").flatten() {
        let dir = worker.path().join("actors").join(NS).join(name);
        if !dir.is_dir() {
            continue;
        }
        let id = ate_worker::ActorSandbox::new("", "", "", &dir).short_id();
        let v1 = std::path::Path::new("/sys/fs/cgroup/cpu/ate")
            .join(&id)
            .join("cpu.shares");
        if v1.is_file() {
            return (v1, ate_worker::cpu::actor_shares);
        }
        for root in ["/sys/fs/cgroup/ate", "/sys/fs/cgroup/unified/ate"] {
            let v2 = std::path::Path::new(root).join(&id).join("cpu.weight");
            if v2.is_file() {
                return (v2, ate_worker::cpu::actor_weight);
            }
        }
    }
    panic!("no CPU weight file for {NS}/{name}");
}

#[test]
fn a_spinning_neighbour_is_held_to_its_weight() {
    let sys = System::up(UpOptions::with_slots(1, 4));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let hog_millis = 1000 * cores as u32;
    for (name, cpu) in [("quiet", "250m".to_string()), ("hog", cores.to_string())] {
        let path = sys.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, template(name, &cpu)).expect("write template");
        sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8")]);
        sys.ate_ok(&create_actor_args(name, NS, &format!("{NS}/{name}")));
    }
    let mut quiet = KeepAlive::new(sys.router_addr, &format!("{NS}/quiet"));
    let mut hog = KeepAlive::new(sys.router_addr, &format!("{NS}/hog"));
    assert_eq!(quiet.get("/healthz").0, 200);
    assert_eq!(hog.get("/healthz").0, 200);

    // The mechanism (set by the worker's CPU pass, every 2 s): both idle, both boosted.
    let (quiet_file, quiet_weight) = weight_file(&sys, "quiet");
    let (hog_file, hog_weight) = weight_file(&sys, "hog");
    let boosted = quiet_weight(250, hog_millis, true);
    let within = || Instant::now() + Duration::from_secs(10);
    wait_for_weight(&quiet_file, boosted, within());
    wait_for_weight(
        &hog_file,
        hog_weight(hog_millis, hog_millis, true),
        within(),
    );

    // Warm-up, then the quiet actor alone, then beside the spinning hog.
    measure(&mut quiet);
    let alone = measure(&mut quiet);
    let (status, body) = hog.get(&format!("/spin?seconds=60&threads={cores}"));
    assert_eq!(status, 200, "{body}");
    // The spinning hog loses its boost at the next pass and weighs its template's cpu (the
    // machine's); the quiet actor keeps its boost.
    let template_weight = hog_weight(hog_millis, hog_millis, false);
    wait_for_weight(&hog_file, template_weight, within());
    let quiet_now = std::fs::read_to_string(&quiet_file).expect("quiet weight");
    assert_eq!(
        quiet_now.trim(),
        boosted.to_string(),
        "the quiet actor's weight"
    );
    assert!(
        boosted >= 4 * template_weight,
        "{boosted} vs {template_weight}"
    );
    let beside = measure(&mut quiet);
    let (status, body) = hog.get("/spin?seconds=0");
    assert_eq!(status, 200, "{body}");
    println!(
        "quiet actor, GET /healthz: alone p50 {:.2} / p99 {:.2} ms; beside the hog p50 {:.2} / p99 {:.2} ms (×{:.2} at p99)",
        p(&alone, 0.5),
        p(&alone, 0.99),
        p(&beside, 0.5),
        p(&beside, 0.99),
        p(&beside, 0.99) / p(&alone, 0.99)
    );
    // Generous: a debug build on 2 busy cores. What it catches is starvation (a quiet actor
    // waiting behind the hog's whole scheduling periods, tens of ms per request), not the 2×.
    let bound = (p(&alone, 0.99) * 10.0).max(40.0);
    assert!(
        p(&beside, 0.5) <= bound,
        "the quiet actor's median under the hog is {:.2} ms (bound {bound:.1} ms)",
        p(&beside, 0.5)
    );
}
