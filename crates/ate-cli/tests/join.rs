//! A machine joins with one command and a token: `ate token create` on the control host, then
//! `ate up --role node --join … --join-token …` gets the node's certificate from the api's CA
//! (CSR signed by the api), a restarted node renews with the certificate it holds, and bad,
//! deleted or foreign tokens are refused with a message naming the problem. Workers are left out
//! (no root needed); the multi-node fault suite joins real workers.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{ATE, System, UpOptions, free_port, run_ok};

/// `ate up --role node` for node `name` in `state`, joined to `api`, with `keys` (the fleet's
/// snapshot keys directory) copied into its state dir.
fn node_up(api: &str, token: Option<&str>, name: &str, state: &Path, keys: &Path) -> Child {
    let ready = state.join("ready.json");
    let _ = std::fs::remove_file(&ready);
    std::fs::create_dir_all(state).expect("state dir");
    if !state.join("keys").exists() {
        let copied = Command::new("cp")
            .arg("-rp")
            .arg(keys)
            .arg(state.join("keys"))
            .status()
            .expect("cp");
        assert!(copied.success(), "copy the fleet's keys");
    }
    let mut cmd = Command::new(ATE);
    cmd.args(["up", "--role", "node", "--workers", "0", "--join", api])
        .args(["--node-name", name])
        .arg("--state-dir")
        .arg(state)
        .args(["--node-listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--ready-file")
        .arg(&ready)
        .env_remove("ATE_JOIN_TOKEN")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(state.join("up.log")).expect("up.log"));
    if let Some(t) = token {
        cmd.args(["--join-token", t]);
    }
    cmd.spawn().expect("spawn ate up --role node")
}

/// Waits for the node's ready file (Ok) or its exit (Err with its log).
fn wait_node(child: &mut Child, state: &Path) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if state.join("ready.json").exists() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(state.join("up.log")).unwrap_or_default();
            return Err(format!("({status}) {log}"));
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "node not ready in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// SPIFFE ID and serial of a PEM certificate file.
fn cert_facts(path: &Path) -> (String, String) {
    let certs = ate_tls::read_certs(path).expect("read certificate");
    let id = ate_tls::spiffe_id_from_der(&certs[0]).expect("SPIFFE ID");
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(path)
        .output()
        .expect("openssl");
    (
        id.to_string(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

#[test]
fn a_node_joins_with_a_token_and_renews_without_one() {
    let sys = System::up(UpOptions::bare(0));
    let token = sys
        .ate_ok(&["token", "create", "--ttl", "10m", "--description", "test"])
        .trim()
        .to_string();
    assert!(token.starts_with("atejoin1."), "{token}");

    let tmp = tempfile::tempdir().expect("tempdir");
    let keys = sys.state_dir().join("keys");
    // Without the fleet's snapshot keys a node refuses to start (before joining), naming the
    // directory and the way out.
    let keyless = tmp.path().join("keyless");
    std::fs::create_dir_all(&keyless).expect("state dir");
    let out = Command::new(ATE)
        .args(["up", "--role", "node", "--workers", "0", "--join", &sys.api])
        .args([
            "--join-token",
            &token,
            "--node-name",
            "edge-0",
            "--state-dir",
        ])
        .arg(&keyless)
        .output()
        .expect("ate up --role node");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no snapshot keys in") && err.contains("--no-snapshot-encryption"),
        "{err}"
    );
    assert!(!keyless.join("tls").exists(), "refused before joining");
    let state = tmp.path().join("edge");
    let mut node = node_up(&sys.api, Some(&token), "edge-1", &state, &keys);
    let joined = wait_node(&mut node, &state);
    let crt = state.join("tls/node.crt");
    let first = cert_facts(&crt);
    stop(&mut node);
    joined.expect("node joins");
    assert_eq!(
        first.0,
        "spiffe://ate.local/ns/ate-system/sa/ate-node-edge-1"
    );
    // The key was made on the node and is private.
    let mode = std::fs::metadata(state.join("tls/node.key"))
        .expect("node key")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let list = sys.ate_ok(&["token", "list"]);
    assert!(list.contains("edge-1"), "token list names the node: {list}");
    assert!(
        !list.contains(token.split('.').nth(2).expect("secret")),
        "the secret is never listed: {list}"
    );

    // A restart needs no token: the node renews with the certificate it holds.
    let mut again = node_up(&sys.api, None, "edge-1", &state, &keys);
    let renewed = wait_node(&mut again, &state);
    let second = cert_facts(&crt);
    stop(&mut again);
    renewed.expect("node restarts without a token");
    assert_eq!(second.0, first.0);
    assert_ne!(second.1, first.1, "a new certificate was issued");

    // A deleted token is refused, naming it; so is a malformed one.
    let id = token.split('.').nth(1).expect("id").to_string();
    sys.ate_ok(&["token", "delete", &id]);
    let other = tmp.path().join("other");
    let mut refused = node_up(&sys.api, Some(&token), "edge-2", &other, &keys);
    let err = wait_node(&mut refused, &other).expect_err("deleted token refused");
    assert!(err.contains("not recognised"), "{err}");
    assert!(!other.join("tls/node.crt").exists());
    let mut bad = node_up(&sys.api, Some("atejoin1.nope"), "edge-2", &other, &keys);
    let err = wait_node(&mut bad, &other).expect_err("malformed token refused");
    assert!(err.contains("invalid join token"), "{err}");

    // A token pinned to another CA never sends its secret to this api.
    let pin = "0".repeat(64);
    let foreign = format!("atejoin1.{id}.{}.{pin}", "a".repeat(32));
    let mut wrong_ca = node_up(&sys.api, Some(&foreign), "edge-2", &other, &keys);
    let err = wait_node(&mut wrong_ca, &other).expect_err("foreign CA refused");
    assert!(err.contains("is not the one the join token names"), "{err}");

    // `ate join` (for node agents under systemd or Kubernetes) gets the node's and its workers'
    // certificates; a worker id outside the node's name is refused.
    let token = sys.ate_ok(&["token", "create"]).trim().to_string();
    let dir = tmp.path().join("joined");
    let join = |workers: &str| {
        Command::new(ATE)
            .args(["join", "--once", "--join", &sys.api, "--join-token", &token])
            .args(["--node-name", "edge-3", "--workers", workers, "--dir"])
            .arg(&dir)
            .output()
            .expect("ate join")
    };
    let out = join("edge-3-w0,edge-3-w1");
    assert!(
        out.status.success(),
        "ate join: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        cert_facts(&dir.join("edge-3-w1.crt")).0,
        "spiffe://ate.local/ns/ate-system/sa/ate-worker-edge-3-w1"
    );
    let out = join("edge-4-w0");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must start with \"edge-3-\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `ate ca issue` makes the control plane's own certificates from the same CA.
    let issued = tmp.path().join("issued");
    let mut issue = Command::new(ATE);
    issue
        .args([
            "ca",
            "issue",
            "--identity",
            "router",
            "--san",
            "ingress.example",
        ])
        .arg("--dir")
        .arg(sys.state_dir().join("ca"))
        .arg("--out")
        .arg(&issued);
    run_ok(&mut issue, "ate ca issue");
    assert_eq!(
        cert_facts(&issued.join("atenet-router.crt")).0,
        "spiffe://ate.local/ns/ate-system/sa/atenet-router"
    );

    // Without a certificate, nothing but JoinService answers.
    let out = Command::new(ATE)
        .args(["--api", &sys.api, "--ca"])
        .arg(sys.state_dir().join("tls/ca.crt"))
        .env("HOME", tmp.path())
        .env("XDG_CONFIG_HOME", tmp.path().join("config"))
        .env_remove("ATE_STATE_DIR")
        .args(["get", "actors", "-A"])
        .output()
        .expect("ate get actors");
    assert!(!out.status.success(), "an anonymous caller listed actors");
}
