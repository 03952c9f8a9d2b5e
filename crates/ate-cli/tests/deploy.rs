//! The deployment artifacts under `deploy/` (docs/deploy.md): no cluster and no systemd host run
//! them here, so this checks what can be checked on one machine.
//!
//! - Every Kubernetes resource document under `deploy/kubernetes/` (base, overlays' resources
//!   and patches — each patch is written as a complete object —, examples) validates against the
//!   Kubernetes OpenAPI schemas with `kubernetes-validate --strict` (PyPI, installed by
//!   `scripts/setup.sh`; it ships the schemas, so it works offline), and every document is
//!   reported as passed (an unknown kind is only a warning there, so warnings fail here).
//! - The kustomizations reference only files that exist, every resource file is deployed by
//!   some kustomization, and the overlays have the replica counts docs/deploy.md promises.
//! - Where `kubectl` is installed (it is not required), both overlays are rendered with
//!   `kubectl kustomize` and the rendered output is validated too.
//! - Every systemd unit passes `systemd-analyze verify` (a copy whose ExecStart names the `ate`
//!   cargo built, since verify requires the binary to exist), and the units keep the properties
//!   the design relies on (worker KillMode, stop ordering, env files).
//! - The worker container's entry point restarts an exited worker, passes SIGTERM on and waits
//!   for the worker, and gives up after too many exits.
//!
//! A missing tool fails the test with its name and how to install it: it never passes silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Kubernetes version whose schemas the manifests are validated against (the oldest the
/// manifests target: the router's `preStop.sleep` needs 1.30+).
const KUBERNETES_VERSION: &str = "1.31.0";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

fn kubernetes_dir() -> PathBuf {
    deploy().join("kubernetes")
}

/// `name` on PATH, if it is there.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `name` on PATH, or a failure naming the tool and how CI installs it.
fn require_tool(name: &str, install: &str) -> PathBuf {
    on_path(name).unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH, so the deployment artifacts cannot be validated. \
             Install it: {install}"
        )
    })
}

fn kubernetes_validate() -> PathBuf {
    require_tool(
        "kubernetes-validate",
        "scripts/setup.sh does (`pip install kubernetes-validate==1.37.0`, with the pip that \
         installs moto)",
    )
}

/// Every file under `dir` (recursively) whose name ends in one of `exts`, sorted.
fn files_under(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if exts.iter().any(|ext| {
                path.extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case(ext))
            }) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "kustomization.yaml" || n == "kustomization.yml")
}

/// The Kubernetes resource files: every YAML file under deploy/kubernetes but the kustomizations.
fn resource_files() -> Vec<PathBuf> {
    files_under(&kubernetes_dir(), &["yaml", "yml"])
        .into_iter()
        .filter(|p| !is_kustomization(p))
        .collect()
}

fn kustomizations() -> Vec<PathBuf> {
    files_under(&kubernetes_dir(), &["yaml", "yml"])
        .into_iter()
        .filter(|p| is_kustomization(p))
        .collect()
}

/// The non-empty YAML documents of a file.
fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs kubernetes-validate on `files` and checks that each of the `expected` documents passed
/// and nothing was only warned about (an unknown apiVersion/kind is a warning with exit 0).
fn validate(files: &[PathBuf], expected: usize) {
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .args(files)
        .output()
        .expect("run kubernetes-validate");
    let report = text(&out);
    println!("{report}");
    assert!(
        out.status.success(),
        "kubernetes-validate --strict -k {KUBERNETES_VERSION} failed ({}):\n{report}",
        out.status
    );
    let problems: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("WARN") || l.starts_with("ERROR") || l.starts_with("FATAL"))
        .collect();
    assert!(
        problems.is_empty(),
        "kubernetes-validate reported problems:\n{}",
        problems.join("\n")
    );
    let passed = report
        .lines()
        .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
        .count();
    assert_eq!(
        passed, expected,
        "expected {expected} resources to pass validation, kubernetes-validate reported {passed}:\n{report}"
    );
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let files = resource_files();
    assert!(
        files.len() >= 10,
        "expected the base, overlay and example manifests under deploy/kubernetes, found {files:?}"
    );
    let mut expected = 0;
    for f in &files {
        let docs = documents(f);
        assert!(!docs.is_empty(), "{} has no YAML document", rel(f));
        for d in &docs {
            for field in ["apiVersion", "kind"] {
                assert!(
                    d.get(field).and_then(Value::as_str).is_some(),
                    "a document in {} has no {field}",
                    rel(f)
                );
            }
            // Everything lives in ate-system (the Namespace itself has none).
            if d["kind"] != "Namespace" {
                assert_eq!(
                    d["metadata"]["namespace"],
                    "ate-system",
                    "{} {:?} in {}: metadata.namespace must be ate-system",
                    d["kind"],
                    d["metadata"]["name"],
                    rel(f)
                );
            }
        }
        expected += docs.len();
    }
    validate(&files, expected);
}

/// The paths a kustomization refers to, as (field, path relative to its directory).
fn kustomization_refs(k: &Value) -> Vec<(String, String)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut refs = Vec::new();
    for key in ["resources", "components", "crds", "patchesStrategicMerge"] {
        refs.extend(strings(&k[key]).into_iter().map(|r| (key.to_string(), r)));
    }
    for p in k["patches"].as_array().into_iter().flatten() {
        if let Some(path) = p["path"].as_str() {
            refs.push(("patches".to_string(), path.to_string()));
        }
    }
    for generator in ["configMapGenerator", "secretGenerator"] {
        for g in k[generator].as_array().into_iter().flatten() {
            for key in ["files", "envs"] {
                for f in strings(&g[key]) {
                    // `files` entries may be `key=path`.
                    let path = f.split_once('=').map_or(f.as_str(), |(_, p)| p);
                    refs.push((format!("{generator}.{key}"), path.to_string()));
                }
            }
        }
    }
    refs
}

#[test]
fn kustomizations_reference_only_existing_files() {
    let known: BTreeSet<&str> = [
        "apiVersion",
        "kind",
        "resources",
        "components",
        "crds",
        "patches",
        "patchesStrategicMerge",
        "configMapGenerator",
        "secretGenerator",
        "generatorOptions",
        "images",
        "replicas",
        "namespace",
        "labels",
        "commonAnnotations",
        "namePrefix",
        "nameSuffix",
    ]
    .into();
    let ks = kustomizations();
    let names: Vec<String> = ks.iter().map(|p| rel(p)).collect();
    for want in [
        "deploy/kubernetes/base/kustomization.yaml",
        "deploy/kubernetes/overlays/dev/kustomization.yaml",
        "deploy/kubernetes/overlays/production/kustomization.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    let mut used: BTreeSet<PathBuf> = BTreeSet::new();
    for path in &ks {
        let docs = documents(path);
        assert_eq!(docs.len(), 1, "{} must be one YAML document", rel(path));
        let k = &docs[0];
        assert_eq!(k["kind"], "Kustomization", "{}", rel(path));
        assert_eq!(
            k["apiVersion"],
            "kustomize.config.k8s.io/v1beta1",
            "{}",
            rel(path)
        );
        let obj = k.as_object().expect("a mapping");
        for key in obj.keys() {
            assert!(
                known.contains(key.as_str()),
                "{}: unexpected field {key:?}",
                rel(path)
            );
        }
        let dir = path.parent().expect("kustomization dir");
        for (what, r) in kustomization_refs(k) {
            assert!(
                !r.contains("://"),
                "{}: {what} {r:?} is remote; everything must be in the tree",
                rel(path)
            );
            let target = dir.join(&r);
            assert!(
                target.exists(),
                "{}: {what} {r:?} does not exist ({})",
                rel(path),
                target.display()
            );
            if target.is_dir() {
                assert!(
                    target.join("kustomization.yaml").is_file(),
                    "{}: {what} {r:?} is a directory without kustomization.yaml",
                    rel(path)
                );
            } else {
                used.insert(target.canonicalize().expect("canonical path"));
            }
        }
    }
    // Every manifest outside examples/ is deployed by some kustomization.
    let examples = kubernetes_dir().join("examples");
    for f in resource_files() {
        if f.starts_with(&examples) {
            continue;
        }
        assert!(
            used.contains(&f.canonicalize().expect("canonical path")),
            "{} is not referenced by any kustomization.yaml",
            rel(&f)
        );
    }
}

/// `replicas:` of an overlay's kustomization, by name.
fn overlay_replicas(overlay: &str) -> BTreeMap<String, i64> {
    let path = kubernetes_dir().join(format!("overlays/{overlay}/kustomization.yaml"));
    let k = documents(&path).remove(0);
    k["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no replicas", rel(&path)))
        .iter()
        .map(|r| {
            (
                r["name"].as_str().expect("replicas[].name").to_string(),
                r["count"].as_i64().expect("replicas[].count"),
            )
        })
        .collect()
}

/// Every container of every workload document in `docs`: (workload name, container).
fn containers(docs: &[Value]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for d in docs {
        if let Some(cs) = d["spec"]["template"]["spec"]["containers"].as_array() {
            let name = d["metadata"]["name"].as_str().unwrap_or("?").to_string();
            out.extend(cs.iter().map(|c| (name.clone(), c.clone())));
        }
    }
    out
}

#[test]
fn overlays_and_workloads_keep_the_documented_shape() {
    let dev = overlay_replicas("dev");
    assert_eq!(dev.get("ate-api"), Some(&1), "dev runs one api replica");
    let prod = overlay_replicas("production");
    assert!(
        prod.get("ate-api").is_some_and(|n| *n >= 2),
        "production runs at least two api replicas: {prod:?}"
    );
    assert!(
        prod.get("ate-router").is_some_and(|n| *n >= 2),
        "production runs at least two routers: {prod:?}"
    );

    let base: Vec<Value> = files_under(&kubernetes_dir().join("base"), &["yaml"])
        .into_iter()
        .filter(|p| !is_kustomization(p))
        .flat_map(|p| documents(&p))
        .collect();
    let all = containers(&base);
    for (workload, c) in &all {
        let args: Vec<&str> = c["args"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(
            !args.contains(&"--sole-replica"),
            "{workload}: --sole-replica must never be set with several replicas"
        );
        assert!(
            c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("ghcr.io/example/ate:")),
            "{workload}: the image is the placeholder the overlays' `images:` rewrite"
        );
    }
    let find = |name: &str| -> &Value {
        &base
            .iter()
            .find(|d| d["metadata"]["name"] == name && d["spec"]["template"].is_object())
            .unwrap_or_else(|| panic!("workload {name} missing from base"))["spec"]["template"]["spec"]
    };
    // Node agent and worker share the hostPath state dir; only the worker is privileged.
    for ds in ["ate-node", "ate-worker"] {
        let spec = find(ds);
        let has_state = spec["volumes"]
            .as_array()
            .is_some_and(|vs| vs.iter().any(|v| v["hostPath"]["path"] == "/var/lib/ate"));
        assert!(has_state, "{ds} mounts the hostPath /var/lib/ate");
    }
    let worker = find("ate-worker");
    assert_eq!(
        worker["containers"][0]["securityContext"]["privileged"],
        true
    );
    assert_eq!(worker["hostPID"], true, "sandboxes must outlive the worker");
    assert!(
        worker["terminationGracePeriodSeconds"]
            .as_i64()
            .is_some_and(|s| s > 20),
        "a stopping worker may take 20 s to have its actors suspended"
    );
    let node = find("ate-node");
    assert_ne!(
        node["containers"][0]["securityContext"]["privileged"], true,
        "the node agent needs no privileges"
    );
    // The api is probed on its http port.
    let api = find("ate-api");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(api["containers"][0][probe]["httpGet"]["path"], "/healthz");
    }
    // The router's ingress is TLS with the spec's client allow-list (issue 30, item 5); its
    // plain listener stays on the pod's loopback, and the Service exposes only the TLS port.
    let router = &find("ate-router")["containers"][0];
    let args: Vec<&str> = router["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        args.contains(
            &"--ingress-allowed-spiffe-ids=spiffe://cluster.local/ns/ate-system/sa/atenet-client"
        ) && args.iter().any(|a| a.starts_with("--tls-listen=")),
        "router args: {args:?}"
    );
    assert!(
        args.iter()
            .filter(|a| a.starts_with("--listen="))
            .all(|a| a.starts_with("--listen=127.0.0.1:")),
        "the plain listener stays on loopback: {args:?}"
    );
    let service = base
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "ate-router")
        .expect("Service ate-router");
    let targets: Vec<&str> = service["spec"]["ports"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["targetPort"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(targets, ["https", "metrics"], "{service}");
}

/// Renders both overlays with `kubectl kustomize` (when kubectl is installed) and validates the
/// output, so the patches are checked as applied, not only on their own.
#[test]
fn rendered_overlays_validate_where_kubectl_is_installed() {
    let Some(kubectl) = on_path("kubectl") else {
        eprintln!(
            "NOTE: kubectl is not installed; overlays not rendered (every file is still validated \
             on its own by kubernetes_manifests_validate_against_the_schemas)"
        );
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    for overlay in ["dev", "production"] {
        let out = Command::new(&kubectl)
            .arg("kustomize")
            .arg(kubernetes_dir().join("overlays").join(overlay))
            .output()
            .expect("run kubectl kustomize");
        assert!(
            out.status.success(),
            "kubectl kustomize overlays/{overlay}: {}",
            text(&out)
        );
        let file = tmp.path().join(format!("{overlay}.yaml"));
        std::fs::write(&file, &out.stdout).expect("write rendered overlay");
        let docs = documents(&file);
        let api = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ate-api")
            .expect("ate-api Deployment rendered");
        let replicas = api["spec"]["replicas"].as_i64().expect("replicas");
        if overlay == "dev" {
            assert_eq!(replicas, 1);
        } else {
            assert!(replicas >= 2, "production api replicas: {replicas}");
            for (name, c) in containers(&docs) {
                assert!(
                    c["resources"]["limits"]["memory"].is_string(),
                    "production {name}/{}: no memory limit",
                    c["name"]
                );
            }
        }
        validate(&[file], docs.len());
    }
}

const UNITS: [&str; 6] = [
    "ate.target",
    "ate-api.service",
    "ate-router.service",
    "ate-node.service",
    "ate-join.service",
    "ate-worker@.service",
];

/// `key=value` settings of a unit file by section (a key may repeat).
fn unit_settings(path: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = section.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}: not key=value: {line}", path.display()));
        sections
            .entry(current.clone())
            .or_default()
            .push((k.trim().to_string(), v.trim().to_string()));
    }
    sections
}

fn values<'a>(
    s: &'a BTreeMap<String, Vec<(String, String)>>,
    section: &str,
    key: &str,
) -> Vec<&'a str> {
    s.get(section)
        .map(|kv| {
            kv.iter()
                .filter(|(k, _)| k == key)
                .flat_map(|(_, v)| v.split_whitespace())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let analyze = require_tool(
        "systemd-analyze",
        "it comes with Debian's `systemd` package (`apt-get install systemd`)",
    );
    let dir = deploy().join("systemd");
    let ate = env!("CARGO_BIN_EXE_ate");
    let tmp = tempfile::tempdir().expect("tempdir");
    for unit in UNITS {
        let text = std::fs::read_to_string(dir.join(unit))
            .unwrap_or_else(|e| panic!("deploy/systemd/{unit}: {e}"));
        if unit.ends_with(".service") {
            assert!(
                text.contains("ExecStart=/usr/local/bin/ate "),
                "{unit}: the installed units run /usr/local/bin/ate"
            );
        }
        // verify requires ExecStart's binary to exist: point the copy at the one cargo built.
        let copy = text.replace("=/usr/local/bin/ate ", &format!("={ate} "));
        std::fs::write(tmp.path().join(unit), copy).expect("write unit copy");
    }
    // The template is verified through an instance (verify refuses a bare template name).
    let args: Vec<PathBuf> = [
        "ate.target",
        "ate-api.service",
        "ate-router.service",
        "ate-node.service",
        "ate-join.service",
        "ate-worker@node-a-w0.service",
    ]
    .iter()
    .map(|u| tmp.path().join(u))
    .collect();
    let out = Command::new(&analyze)
        .args(["verify", "--man=no"])
        .args(&args)
        .output()
        .expect("run systemd-analyze verify");
    let report = text(&out);
    println!("systemd-analyze verify:\n{report}");
    assert!(
        out.status.success(),
        "systemd-analyze verify failed ({}):\n{report}",
        out.status
    );
    // Unknown keys and unparsable values are only warnings with exit 0: fail on any line about
    // our units (lines about other units of this host are not ours to fix).
    let ours: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("ate-") || l.contains("ate.target") || l.contains(ate))
        .collect();
    assert!(
        ours.is_empty(),
        "systemd-analyze verify complained about the units:\n{}",
        ours.join("\n")
    );

    // What the design relies on.
    let unit = |name: &str| unit_settings(&dir.join(name));
    let worker = unit("ate-worker@.service");
    assert_eq!(
        values(&worker, "Service", "KillMode"),
        ["process"],
        "the sandboxes and log relays must outlive the worker process"
    );
    let stop = values(&worker, "Service", "TimeoutStopSec");
    let secs: u64 = stop
        .first()
        .and_then(|s| s.trim_end_matches('s').parse().ok())
        .expect("worker TimeoutStopSec in seconds");
    assert!(
        secs > 20,
        "a stopping worker waits up to 20 s for its actors' suspends: TimeoutStopSec={secs}"
    );
    assert!(values(&worker, "Unit", "After").contains(&"ate-node.service"));
    assert!(values(&worker, "Unit", "Before").contains(&"ate-router.service"));
    assert!(values(&unit("ate-node.service"), "Unit", "After").contains(&"ate-api.service"));
    for (name, env) in [
        ("ate-api.service", "api"),
        ("ate-router.service", "router"),
        ("ate-node.service", "node"),
        ("ate-worker@.service", "worker"),
    ] {
        let s = unit(name);
        assert!(
            values(&s, "Service", "EnvironmentFile")
                .contains(&format!("-/etc/ate/{env}.env").as_str()),
            "{name}: EnvironmentFile=-/etc/ate/{env}.env"
        );
        assert!(
            values(&s, "Service", "Restart").contains(&"always"),
            "{name}: Restart=always"
        );
        assert!(
            values(&s, "Unit", "PartOf").contains(&"ate.target"),
            "{name}"
        );
        assert!(
            values(&s, "Install", "WantedBy").contains(&"ate.target"),
            "{name}"
        );
        let exec = values(&s, "Service", "ExecStart").join(" ");
        assert!(
            !exec.contains("--sole-replica"),
            "{name}: --sole-replica must never be set by default"
        );
    }
}

/// Writes an executable stub for `ate` that logs its runs into `log`: the first run exits 3, the
/// next ones run until SIGTERM, then take 0.3 s to "drain" and exit 0. With `always_fail`, every
/// run exits 1 at once.
fn stub_ate(dir: &Path, log: &Path, always_fail: bool) -> PathBuf {
    let stub = dir.join("ate");
    let body = if always_fail {
        format!(
            "#!/bin/sh\necho \"start $*\" >> '{}'\nexit 1\n",
            log.display()
        )
    } else {
        format!(
            r#"#!/bin/sh
log='{log}'
echo "start $*" >> "$log"
if [ ! -e "$log.crashed" ]; then touch "$log.crashed"; exit 3; fi
trap 'echo term >> "$log"; sleep 0.3; echo drained >> "$log"; exit 0' TERM
while :; do sleep 0.05; done
"#,
            log = log.display()
        )
    };
    std::fs::write(&stub, body).expect("write stub");
    let status = Command::new("chmod")
        .arg("755")
        .arg(&stub)
        .status()
        .expect("chmod");
    assert!(status.success());
    stub
}

fn start_entrypoint(stub: &Path) -> Child {
    Command::new("/bin/sh")
        .arg(kubernetes_dir().join("base/worker-entrypoint.sh"))
        .env("ATE_BIN", stub)
        .env("ATE_WORKER_RESTART_DELAY", "0.1")
        .env("ATE_WORKER_ID", "node-a-w0")
        .env("POD_IP", "10.1.2.3")
        .env("ATE_WORKER_SLOTS", "4")
        .env("ATE_TRUST_DOMAIN", "example.test")
        .env("ATE_WORKER_ARGS", "--memory=1Gi --labels=pool=a")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start worker-entrypoint.sh")
}

fn wait_until(what: &str, timeout: Duration, done: impl FnMut() -> bool) {
    ate_test_support::wait::wait_until(what, timeout, Duration::from_millis(20), done)
}

fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            panic!("worker-entrypoint.sh did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn worker_entrypoint_restarts_the_worker_and_passes_sigterm_on() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = tmp.path().join("runs.log");
    let stub = stub_ate(tmp.path(), &log, false);
    let mut child = start_entrypoint(&stub);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // The first worker process exits 3; the entry point starts another.
    wait_until(
        "the worker to be started again",
        Duration::from_secs(10),
        || read().lines().filter(|l| l.starts_with("start ")).count() == 2,
    );
    let first = read().lines().next().unwrap_or_default().to_string();
    assert_eq!(
        first,
        "start worker --id=node-a-w0 --state-dir=/var/lib/ate --listen=10.1.2.3:8443 --slots=4 \
         --trust-domain=example.test --log-json --memory=1Gi --labels=pool=a"
    );
    std::thread::sleep(Duration::from_millis(200));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = wait_exit(&mut child, Duration::from_secs(10));
    // The worker got the TERM and had finished draining before the entry point exited.
    let runs = read();
    assert!(status.success(), "exit status {status}; runs:\n{runs}");
    assert!(runs.contains("term\ndrained\n"), "runs:\n{runs}");
    assert_eq!(
        runs.lines().filter(|l| l.starts_with("start ")).count(),
        2,
        "not started again after SIGTERM; runs:\n{runs}"
    );
}

#[test]
fn worker_entrypoint_gives_up_after_too_many_exits() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = tmp.path().join("runs.log");
    let stub = stub_ate(tmp.path(), &log, true);
    let mut child = start_entrypoint(&stub);
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let runs = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "runs:\n{runs}");
    assert_eq!(
        runs.lines().count(),
        11,
        "more than 10 exits within 5 minutes end the container; runs:\n{runs}"
    );
}
