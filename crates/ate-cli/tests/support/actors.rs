//! Actors through the CLI and the router: templates as YAML, `ate create`, state polling, and
//! where their generations live. Shared by the end-to-end tests that drive one `ate up`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{System, create_actor_args, get, images_dir};

pub fn counts(body: &str) -> (u64, u64, u64) {
    let nums: Vec<u64> = body
        .split('|')
        .filter_map(|part| part.rsplit(':').next()?.trim().parse().ok())
        .collect();
    assert_eq!(nums.len(), 3, "unexpected body {body:?}");
    (nums[0], nums[1], nums[2])
}

/// A template (and its atespace) as YAML for `ate apply -f`.
#[derive(Clone)]
pub struct Tpl {
    pub image: &'static str,
    pub fidelity: &'static str,
    pub probe_port: u16,
    pub probe_timeout: u32,
    pub memory: &'static str,
    pub env: Vec<(String, String)>,
    pub golden_tag: Option<String>,
    /// `spec.snapshots.onMemoryFailure` (None: the default, `fail`).
    pub on_memory_failure: Option<&'static str>,
    /// `spec.egress` as YAML lines indented under `spec` (None: the default, allow-all).
    pub egress: Option<String>,
    /// The `data` volume is external, at this hostPath (None: kept in snapshots).
    pub external_host_path: Option<String>,
    /// `spec.idleTimeout`.
    pub idle_timeout: &'static str,
    /// `spec.webSockets` (None: the default, `close`).
    pub web_sockets: Option<&'static str>,
    /// The container's whole image reference (None: `image`'s OCI layout in [`images_dir`]).
    pub image_ref: Option<String>,
}

impl Tpl {
    pub fn counter() -> Tpl {
        Tpl {
            image: "counter",
            fidelity: "memory",
            probe_port: 80,
            probe_timeout: 10,
            memory: "64Mi",
            env: Vec::new(),
            golden_tag: None,
            on_memory_failure: None,
            egress: None,
            external_host_path: None,
            idle_timeout: "5m",
            web_sockets: None,
            image_ref: None,
        }
    }

    pub fn sleeper(mib: u32) -> Tpl {
        Tpl {
            image: "sleeper",
            memory: "256Mi",
            env: vec![("SLEEPER_MEMORY_MIB".into(), mib.to_string())],
            ..Tpl::counter()
        }
    }

    pub fn yaml(&self, ns: &str, name: &str) -> String {
        let mut env = String::new();
        if !self.env.is_empty() {
            env.push_str("      env:\n");
            for (k, v) in &self.env {
                env.push_str(&format!("        - {{name: {k}, value: \"{v}\"}}\n"));
            }
        }
        let golden = self
            .golden_tag
            .as_ref()
            .map(|t| format!("  goldenTag: {t}\n"))
            .unwrap_or_default();
        let image_ref = self.image_ref.clone().unwrap_or_else(|| {
            format!(
                "oci-layout:{}/{}:latest",
                images_dir().display(),
                self.image
            )
        });
        format!(
            "{head}spec:
  containers:
    - name: main
      image: {image_ref}
      command: [\"/{image}\"]
{env}      wakeupProbe:
        httpGet: {{path: /healthz, port: {port}}}
        timeoutSeconds: {timeout}
  resources: {{cpu: 250m, memory: {memory}}}
  volumes:
    - name: data
      mountPath: /data
{external}  snapshots: {{fidelity: {fidelity}{on_failure}}}
  idleTimeout: {idle}
{web_sockets}{golden}{egress}",
            head = template_head(ns, name),
            image = self.image,
            port = self.probe_port,
            timeout = self.probe_timeout,
            memory = self.memory,
            idle = self.idle_timeout,
            web_sockets = self
                .web_sockets
                .map(|w| format!("  webSockets: {w}\n"))
                .unwrap_or_default(),
            fidelity = self.fidelity,
            egress = self.egress.as_deref().unwrap_or_default(),
            external = self
                .external_host_path
                .as_ref()
                .map(|p| format!("      external: {{hostPath: {p}}}\n"))
                .unwrap_or_default(),
            on_failure = self
                .on_memory_failure
                .map(|f| format!(", onMemoryFailure: {f}"))
                .unwrap_or_default(),
        )
    }
}

/// The start of every template file here: atespace `ns` and the metadata of template `name` in
/// it; the caller goes on with `spec:`.
pub fn template_head(ns: &str, name: &str) -> String {
    format!("{}---\n{}", atespace_yaml(ns), template_metadata(ns, name))
}

/// Atespace `ns` as a YAML document.
pub fn atespace_yaml(ns: &str) -> String {
    format!("apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: {ns}\n")
}

/// The start of template `name` in atespace `ns`, up to (not with) its `spec:`.
pub fn template_metadata(ns: &str, name: &str) -> String {
    let kind = "apiVersion: ate.dev/v1alpha1\nkind: ActorTemplate\nmetadata:\n";
    format!("{kind}  namespace: {ns}\n  name: {name}\n")
}

/// Template `name` of two counters in one sandbox: `main` calling `side` on port 9000 over one
/// kept-alive connection (`side` with its own memory count, its files under `/side-data/side`).
/// `side`'s probe looks at `side_probe_port` for `side_probe_timeout` seconds; `side_exit` is
/// its `exitPolicy` (None: not set).
pub fn two_counters_template(
    ns: &str,
    name: &str,
    side_probe_port: u16,
    side_probe_timeout: u32,
    side_exit: Option<&str>,
) -> String {
    let images = images_dir();
    let side_exit = side_exit
        .map(|e| format!("      exitPolicy: {e}\n"))
        .unwrap_or_default();
    format!(
        "{head}spec:
  containers:
    - name: main
      image: oci-layout:{images}/counter:latest
      command: [\"/counter\"]
      env:
        - {{name: SIDECAR_ADDR, value: \"127.0.0.1:9000\"}}
        - {{name: PORT2, value: \"off\"}}
      ports:
        - containerPort: 80
      wakeupProbe:
        httpGet: {{path: /healthz, port: 80}}
        timeoutSeconds: 10
      resources: {{cpu: 150m, memory: 48Mi}}
    - name: side
      image: oci-layout:{images}/counter:latest
      command: [\"/counter\"]
{side_exit}      env:
        - {{name: PORT, value: \"9000\"}}
        - {{name: PORT2, value: \"off\"}}
        - {{name: ATE_DATA_DIR, value: /side-data/side}}
      volumeMounts:
        - {{name: data, mountPath: /side-data}}
      ports:
        - containerPort: 9000
      wakeupProbe:
        httpGet: {{path: /healthz, port: {side_probe_port}}}
        timeoutSeconds: {side_probe_timeout}
      resources: {{cpu: 100m, memory: 32Mi}}
  volumes:
    - name: data
      mountPath: /data
  snapshots: {{fidelity: memory}}
  idleTimeout: 5m
",
        head = template_metadata(ns, name),
        images = images.display(),
    )
}

/// The counter applied as template `template` in atespace `ns` (with the atespace), and actor
/// `name` of it created.
pub fn counter_actor(sys: &System, ns: &str, template: &str, name: &str) {
    sys_apply(sys, ns, template, &Tpl::counter());
    create_actor(sys, ns, name, template);
}

/// `ate create actor NAME -a NS -t NS/TEMPLATE`.
pub fn create_actor(sys: &System, ns: &str, name: &str, template: &str) {
    sys.ate_ok(&create_actor_args(name, ns, &format!("{ns}/{template}")));
}

/// Writes the template to the test's temp dir and applies it.
pub fn apply(api: &dyn Fn(&[&str]) -> String, dir: &Path, ns: &str, name: &str, t: &Tpl) {
    let path = dir.join(format!("{ns}-{name}-{}.yaml", std::process::id()));
    std::fs::write(&path, t.yaml(ns, name)).expect("write template");
    api(&["apply", "-f", path.to_str().expect("utf-8 path")]);
}

pub fn sys_apply(sys: &System, ns: &str, name: &str, t: &Tpl) {
    apply(&|a: &[&str]| sys.ate_ok(a), sys.dir.path(), ns, name, t);
}

pub fn actor_json(sys_ate: &dyn Fn(&[&str]) -> String, ns: &str, name: &str) -> Value {
    let json = sys_ate(&["get", "actors", name, "-a", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&json).expect("json");
    v[0].clone()
}

pub fn actor(sys: &System, ns: &str, name: &str) -> Value {
    actor_json(&|a: &[&str]| sys.ate_ok(a), ns, name)
}

/// The worker `ns/name` runs on ("" while it is not placed).
pub fn worker_of(sys: &System, ns: &str, name: &str) -> String {
    actor(sys, ns, name)["worker"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Pins `ns/name` to the one of two workers that is not `here` (its next resume goes there);
/// returns that worker.
pub fn pin_to_other_worker(sys: &System, ns: &str, name: &str, here: &str) -> &'static str {
    let other = if here == "worker-1" {
        "worker-2"
    } else {
        "worker-1"
    };
    sys.ate_ok(&[
        "update",
        "actor",
        name,
        "-a",
        ns,
        "--selector",
        &format!("ate.dev/worker={other}"),
    ]);
    other
}

pub fn state_of(v: &Value) -> String {
    v["state"].as_str().unwrap_or_default().to_string()
}

pub fn wait_state(sys: &System, ns: &str, name: &str, state: &str, within: Duration) -> Value {
    let start = Instant::now();
    loop {
        let v = actor(sys, ns, name);
        if state_of(&v) == state {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "{ns}/{name} not {state} within {within:?}: {v}\nnode log:\n{}",
            sys.log("node")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `ns/name` is in `state` (as [`wait_state`]): its `lastError` ("" when none).
pub fn last_error_in_state(
    sys: &System,
    ns: &str,
    name: &str,
    state: &str,
    within: Duration,
) -> String {
    let a = wait_state(sys, ns, name, state, within);
    a["lastError"].as_str().unwrap_or_default().to_string()
}

/// Waits (30 s) until `ns/name` has crashed: its `lastError`.
pub fn crash_reason(sys: &System, ns: &str, name: &str) -> String {
    last_error_in_state(
        sys,
        ns,
        name,
        "ACTOR_STATE_CRASHED",
        Duration::from_secs(30),
    )
}

/// GET through the router that must answer 200.
pub fn get_ok(sys: &System, target: &str, path: &str) -> String {
    let (status, head, body) = get(sys.router_addr, target, path);
    assert_eq!(
        status,
        200,
        "{target}{path}: {head}\n{body}\nnode log:\n{}\nworker logs:\n{}\n{}",
        sys.log("node"),
        sys.log("worker-1"),
        sys.log("worker-2")
    );
    body
}

pub fn generation_dir(state: &Path, ns: &str, name: &str, generation: u64) -> PathBuf {
    let dir = state.join("snapshots").join(ns).join(name);
    let prefix = format!("{generation}-");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .unwrap_or_else(|| panic!("no generation {generation} under {}", dir.display()))
}

/// The counter on its usual ports with a probe on 9999, where nothing listens. (The worker
/// exports the probe port as `PORT` unless the template sets it, so it is set here.)
pub fn probe_on_closed_port(timeout: u32) -> Tpl {
    Tpl {
        probe_port: 9999,
        probe_timeout: timeout,
        env: vec![("PORT".into(), "80".into())],
        ..Tpl::counter()
    }
}

/// The checksum in the sleeper's answer to `GET /` (`sleeper holding N MiB, checksum X`): the
/// same after a memory restore, another after a cold start.
pub fn sleeper_checksum(body: &str) -> String {
    body.rsplit("checksum ")
        .next()
        .map(|s| s.trim().to_string())
        .filter(|s| s.len() == 16)
        .unwrap_or_else(|| panic!("not a sleeper answer: {body:?}"))
}
