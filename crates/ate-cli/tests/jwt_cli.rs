//! `ate api --auth-mode=jwt` as a process, and the CLI's `--token` / `ATE_TOKEN` against it.

use std::process::{Command, Output};

mod support;

use ate_test_support::jwt::{Signer, merged, now};
use serde_json::json;
use support::ATE;
use support::api_process::ApiProcess;

fn ok(out: Output) -> String {
    support::stdout_of_success(out, "ate")
}

const TD: &str = "ate.local";
const ISS: &str = "https://issuer.test";
const AUD: &str = "ate-api";

struct JwtApi {
    api: ApiProcess,
    ca_file: std::path::PathBuf,
    signer: Signer,
}

impl JwtApi {
    fn start() -> JwtApi {
        ate_tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = ate_tls::LocalCa::open_or_create(&dir.path().join("ca"), TD).unwrap();
        let svid = ca
            .issue(&ate_tls::SvidRequest::new(
                ate_tls::SpiffeId::api(TD).unwrap(),
            ))
            .unwrap();
        let (cert, key_file) = (dir.path().join("api.crt"), dir.path().join("api.key"));
        svid.write_pem(&cert, &key_file).unwrap();
        let ca_file = dir.path().join("ca").join(ate_tls::CA_CERT_FILE);

        let signer = Signer::ec("k1");
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, json!({ "keys": [signer.jwk()] }).to_string()).unwrap();

        let api = ApiProcess::start_in(dir, |cmd| {
            cmd.args([
                "--auth-mode",
                "jwt",
                "--jwt-issuer",
                ISS,
                "--jwt-audience",
                AUD,
            ])
            .arg("--jwt-jwks-file")
            .arg(&jwks)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key_file)
            .arg("--tls-ca")
            .arg(&ca_file);
        });
        JwtApi {
            api,
            ca_file,
            signer,
        }
    }

    fn token(&self, sub: &str, extra: serde_json::Value) -> String {
        let valid = json!({"iss": ISS, "aud": AUD, "sub": sub, "exp": now() + 600});
        self.signer.sign(&merged(valid, extra))
    }

    /// `ate --api <addr> <args>` with no discoverable `ate up` configuration around it.
    fn ate(&self, envs: &[(&str, &str)], args: &[&str]) -> Output {
        let empty = self.api.dir.path().join("home");
        std::fs::create_dir_all(&empty).unwrap();
        let mut cmd = Command::new(ATE);
        cmd.env_clear()
            .env("HOME", &empty)
            .env("ATE_STATE_DIR", &empty)
            .arg("--api")
            .arg(&self.api.addr)
            .args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }
}

fn err(out: Output) -> String {
    assert!(!out.status.success(), "unexpected success");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn cli_sends_bearer_tokens_to_a_jwt_api() {
    let api = JwtApi::start();
    let ca = api.ca_file.to_str().unwrap().to_string();
    let admin = api.token("root", json!({"ate_role": "admin"}));
    for ns in ["team-a", "team-b"] {
        ok(api.ate(
            &[],
            &["--ca", &ca, "--token", &admin, "create", "atespace", ns],
        ));
    }
    // ATE_TOKEN works like --token; a client token sees only its atespaces.
    let alice = api.token("alice", json!({"ate_atespaces": ["team-a"]}));
    let listed = ok(api.ate(
        &[("ATE_TOKEN", &alice), ("ATE_CA", &ca)],
        &["get", "atespaces", "-o", "json"],
    ));
    assert!(
        listed.contains("team-a") && !listed.contains("team-b"),
        "{listed}"
    );
    let denied = err(api.ate(
        &[("ATE_TOKEN", &alice), ("ATE_CA", &ca)],
        &["delete", "atespace", "team-b"],
    ));
    assert!(denied.contains("jwt:alice"), "{denied}");

    // Refusals name the problem.
    let expired = api.token("alice", json!({"exp": 1_000_000}));
    let e = err(api.ate(&[], &["--ca", &ca, "--token", &expired, "get", "atespaces"]));
    assert!(e.contains("expired"), "{e}");
    // A forged token (right kid, another key) is refused by the api.
    let forger = Signer::ec("k1");
    let forged =
        forger.sign(&json!({"iss": ISS, "aud": AUD, "sub": "mallory", "exp": 4_000_000_000u64}));
    let e = err(api.ate(&[], &["--ca", &ca, "--token", &forged, "get", "atespaces"]));
    assert!(e.contains("signature"), "{e}");
    // A token is never sent without TLS.
    let e = err(api.ate(&[], &["--token", &admin, "get", "atespaces"]));
    assert!(e.contains("only over TLS"), "{e}");
}
