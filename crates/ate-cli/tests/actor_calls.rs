//! Calls between actors, end to end on real runc workers under `ate up` (issue 31): an actor
//! calls another by name through the platform address (the counter's `/call`), the callee is
//! resumed on the way if suspended and sees the caller in `ate-caller-actor`, which nobody else
//! can set; a call across atespaces is refused before it wakes anyone.

mod support;

use std::io::Write;
use std::time::Duration;

use support::actors::*;
use support::*;

/// `GET path` through the router to `actor` with extra request headers.
fn get_with(sys: &System, actor: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(sys.router_addr).expect("connect router");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: test.local\r\nate-target-actor: {actor}\r\n{extra}Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("write");
    let (status, _, body) = ate_test_support::http::read_response(&mut s);
    (status, body)
}

fn suspended(sys: &System, ns: &str, name: &str) {
    sys.ate_ok(&["suspend", "actor", name, "-a", ns]);
    wait_state(
        sys,
        ns,
        name,
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(30),
    );
}

#[test]
fn an_actor_calls_a_suspended_actor_by_name_and_only_the_platform_names_the_caller() {
    let sys = System::up(UpOptions::default());
    counter_actor(&sys, "n1", "counter", "a");
    create_actor(&sys, "n1", "b", "counter");
    get_ok(&sys, "n1/b", "/");
    suspended(&sys, "n1", "b");

    // A calls B by name from inside: B is resumed on the way and sees who called.
    let body = get_ok(&sys, "n1/a", "/call?actor=n1/b&path=/caller");
    assert!(body.contains("status: 200"), "{body}");
    assert!(body.contains("caller: n1/a"), "{body}");
    assert_eq!(state_of(&actor(&sys, "n1", "b")), "ACTOR_STATE_RUNNING");

    // The same header from anyone else is not believed: from a client outside…
    let (status, body) = get_with(&sys, "n1/b", "/caller", &[("ate-caller-actor", "n1/evil")]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("caller: none"), "{body}");
    // …and from inside an actor, whose own value is replaced by the platform's.
    let body = get_ok(&sys, "n1/a", "/call?actor=n1/b&path=/caller&forge=1");
    assert!(
        body.contains("caller: n1/a") && !body.contains("forged"),
        "{body}"
    );

    // The local actor API answers the actor's identity.
    let body = get_ok(&sys, "n1/a", "/call?path=/v1/identity");
    assert!(
        body.contains("\"name\":\"a\"") || body.contains("\"name\": \"a\""),
        "{body}"
    );
}

#[test]
fn a_call_across_atespaces_is_refused_with_the_rule_and_wakes_nobody() {
    let sys = System::up(UpOptions::default());
    sys_apply(&sys, "n1", "counter", &Tpl::counter());
    sys_apply(&sys, "n2", "counter", &Tpl::counter());
    create_actor(&sys, "n1", "b", "counter");
    create_actor(&sys, "n2", "c", "counter");
    get_ok(&sys, "n1/b", "/");
    suspended(&sys, "n1", "b");

    // The counter answers with the callee's status.
    let (status, _, body) = get(sys.router_addr, "n2/c", "/call?actor=n1/b&path=/");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("status: 403"), "{body}");
    assert!(
        body.contains("n2/c") && body.contains("atespace"),
        "the body names the rule: {body}"
    );
    assert_eq!(state_of(&actor(&sys, "n1", "b")), "ACTOR_STATE_SUSPENDED");
}

/// `ate apply` of an Atespace document allowing calls from `allow`.
fn allow_callers(sys: &System, ns: &str, allow: &[&str]) -> String {
    let list: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
    let yaml = format!(
        "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: {ns}\nspec:\n  callers:\n    allow: [{}]\n",
        list.join(", ")
    );
    let path = sys.dir.path().join(format!("{ns}-atespace.yaml"));
    std::fs::write(&path, yaml).expect("write atespace document");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")])
}

#[test]
fn an_atespace_allow_list_admits_the_atespaces_it_names() {
    let sys = System::up(UpOptions::default());
    for ns in ["n4", "n5", "n6"] {
        sys_apply(&sys, ns, "counter", &Tpl::counter());
    }
    create_actor(&sys, "n4", "a", "counter");
    create_actor(&sys, "n5", "b", "counter");
    create_actor(&sys, "n6", "c", "counter");
    let applied = allow_callers(&sys, "n5", &["n4"]);
    assert!(applied.contains("atespace/n5 configured"), "{applied}");
    let listed = sys.ate_ok(&["get", "atespaces"]);
    assert!(listed.contains("CALLERS ALLOWED"), "{listed}");

    // n4 is on n5's list: its call goes through and the callee sees the caller.
    let body = get_ok(&sys, "n4/a", "/call?actor=n5/b&path=/caller");
    assert!(
        body.contains("status: 200") && body.contains("caller: n4/a"),
        "{body}"
    );
    // n6 is not: 403 naming the list.
    let (status, _, body) = get(sys.router_addr, "n6/c", "/call?actor=n5/b&path=/caller");
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("atespace n5 does not allow calls from atespace n6")
            && body.contains("spec.callers.allow: [n4]"),
        "{body}"
    );
    // A bad list is refused naming the field, and changes nothing.
    let path = sys.dir.path().join("bad-atespace.yaml");
    std::fs::write(
        &path,
        "apiVersion: ate.dev/v1alpha1\nkind: Atespace\nmetadata:\n  name: n5\nspec:\n  callers:\n    allow: [\"Not_A_Name\"]\n",
    )
    .expect("write");
    let out = sys.ate(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("spec.callers.allow"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Opened to every atespace: n6 gets through once the router's cached list expires (5 s).
    allow_callers(&sys, "n5", &["*"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _, body) = get(sys.router_addr, "n6/c", "/call?actor=n5/b&path=/caller");
        if status == 200 {
            assert!(body.contains("caller: n6/c"), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still refused: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The template with a short idle timeout, so idle suspends happen within the test.
fn short_idle(ns: &str) -> String {
    Tpl::counter()
        .yaml(ns, "counter")
        .replace("idleTimeout: 5m", "idleTimeout: 2s")
}

#[test]
fn an_actor_keeps_itself_awake_and_asks_to_be_suspended() {
    let sys = System::up(UpOptions::default());
    let path = sys.dir.path().join("short-idle.yaml");
    std::fs::write(&path, short_idle("n3")).expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    create_actor(&sys, "n3", "k", "counter");
    // Kept awake for 8 s: not suspended after 4 s although idle for 2 s.
    let body = get_ok(
        &sys,
        "n3/k",
        "/call?path=/v1/keep-awake&method=POST&body=%7B%22for%22%3A%228s%22%7D",
    );
    assert!(
        body.contains("status: 200") && body.contains("until_unix_ms"),
        "{body}"
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(state_of(&actor(&sys, "n3", "k")), "ACTOR_STATE_RUNNING");
    // Bad input names the field.
    let (status, _, body) = get(
        sys.router_addr,
        "n3/k",
        "/call?path=/v1/keep-awake&method=POST&body=%7B%7D",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid for"), "{body}");
    // Asked to be suspended now: suspended within a few seconds (keep-awake ended too).
    let (status, _, body) = get(
        sys.router_addr,
        "n3/k",
        "/call?path=/v1/suspend&method=POST",
    );
    assert_eq!(status, 202, "{body}");
    assert!(body.contains("requested"), "{body}");
    wait_state(
        &sys,
        "n3",
        "k",
        "ACTOR_STATE_SUSPENDED",
        Duration::from_secs(10),
    );
    // Its memory came back with it.
    let body = get_ok(&sys, "n3/k", "/");
    assert!(!body.is_empty());
}

/// `GET /v1/identity?audience=…` inside an actor: a token the api signs, which an outside
/// service verifies against the JWKS on the api's HTTP listener, naming the actor and its
/// activation; the identity alone without an audience.
#[test]
fn an_actor_gets_an_identity_token_that_the_api_jwks_verifies() {
    let sys = System::up(UpOptions::default());
    counter_actor(&sys, "n1", "counter", "a");
    let json = |body: &str| -> serde_json::Value {
        let start = body
            .find('{')
            .unwrap_or_else(|| panic!("no JSON in {body}"));
        serde_json::from_str(body[start..].trim()).unwrap_or_else(|e| panic!("{e}: {body}"))
    };

    let plain = json(&get_ok(&sys, "n1/a", "/call?path=/v1/identity"));
    assert_eq!(plain["name"], "a");
    assert!(plain.get("token").is_none(), "{plain}");

    let body = get_ok(
        &sys,
        "n1/a",
        "/call?path=/v1/identity?audience=vault.example",
    );
    assert!(body.contains("status: 200"), "{body}");
    let id = json(&body);
    let token = id["token"].as_str().unwrap_or_else(|| panic!("{id}"));
    assert_eq!(id["issuer"], "ate-api");

    let (status, jwks) = ate_test_support::http::http_get(&sys.api_http, "/.well-known/jwks.json");
    assert_eq!(status, 200, "{jwks}");
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&jwks).expect("a JWK set");
    let header = jsonwebtoken::decode_header(token).expect("a JWT");
    assert_eq!(header.kid.as_deref(), id["key_id"].as_str());
    let jwk = set
        .find(header.kid.as_deref().unwrap_or_default())
        .expect("the token's key is published");
    let key = jsonwebtoken::DecodingKey::from_jwk(jwk).expect("an Ed25519 key");
    let mut check = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
    check.set_issuer(&["ate-api"]);
    check.set_audience(&["vault.example"]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &check)
        .expect("the token verifies")
        .claims;
    assert_eq!(claims["sub"], "n1/a");
    assert_eq!(claims["ate_activation"], id["activation"]);
    // Meant for another service: refused there.
    check.set_audience(&["billing"]);
    assert!(jsonwebtoken::decode::<serde_json::Value>(token, &key, &check).is_err());

    // Bad input is the local API's 400 naming the field, relayed by the counter.
    let (_, _, body) = get(sys.router_addr, "n1/a", "/call?path=/v1/identity?audience=");
    assert!(
        body.contains("status: 400") && body.contains("audience"),
        "{body}"
    );

    // The signing key stays with the control plane: 0600, not under the nodes' keys.
    let key_file = sys.state_dir().join("identity/identity-key.pem");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file)
            .expect("identity key")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}
