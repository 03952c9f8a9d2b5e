//! Unit tests of token verification and issuing.

use ate_test_support::jwt::{Signer, merged, now};
use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::json;

use super::*;

const ISS: &str = "https://issuer.test";
const AUD: &str = "ate-api";

fn claims(extra: serde_json::Value) -> serde_json::Value {
    merged(
        json!({"iss": ISS, "aud": AUD, "sub": "alice", "exp": now() + 600}),
        extra,
    )
}

fn write_jwks(dir: &Path, keys: &[serde_json::Value]) -> PathBuf {
    let path = dir.join("jwks.json");
    std::fs::write(&path, json!({ "keys": keys }).to_string()).unwrap();
    path
}

fn verifier(path: &Path) -> JwtVerifier {
    JwtVerifier::new(JwtConfig {
        issuer: ISS.into(),
        audience: AUD.into(),
        jwks_file: path.to_path_buf(),
    })
    .unwrap()
}

/// `header.payload.` with the given header and no signature.
fn unsigned(header: serde_json::Value, claims: &serde_json::Value) -> String {
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    format!("{}.{}.", b64(&header), b64(claims))
}

#[test]
fn accepts_es256_and_rs256_and_maps_claims() {
    let dir = tempfile::tempdir().unwrap();
    let (ec, rsa) = (Signer::ec("ec-1"), Signer::rsa("rsa-1"));
    let v = verifier(&write_jwks(dir.path(), &[ec.jwk(), rsa.jwk()]));
    let c = v.verify(&ec.sign(&claims(json!({})))).unwrap();
    assert_eq!(c.subject, "alice");
    assert_eq!(c.role, TokenRole::Client);
    assert_eq!(c.atespaces, Some(vec![]));
    let c = v
        .verify(&rsa.sign(&claims(json!({
            "ate_role": "client", "ate_atespaces": ["team-a", "team-b"]
        }))))
        .unwrap();
    assert_eq!(c.atespaces, Some(vec!["team-a".into(), "team-b".into()]));
    let c = v
        .verify(&rsa.sign(&claims(json!({"ate_atespaces": ["*"]}))))
        .unwrap();
    assert_eq!(c.atespaces, None);
    let c = v
        .verify(&ec.sign(&claims(
            json!({"ate_role": "node_agent", "ate_node": "node-2"}),
        )))
        .unwrap();
    assert_eq!(
        (c.role, c.node.as_deref()),
        (TokenRole::NodeAgent, Some("node-2"))
    );
    // An audience list containing ours is fine; nbf in the past is fine.
    v.verify(&ec.sign(&claims(
        json!({"aud": ["other", AUD], "nbf": now() - 10, "ate_role": "admin"}),
    )))
    .unwrap();
}

fn refused(v: &JwtVerifier, token: &str) -> JwtError {
    v.verify(token).expect_err("token must be refused")
}

#[test]
fn refuses_bad_tokens_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let ec = Signer::ec("ec-1");
    let v = verifier(&write_jwks(dir.path(), &[ec.jwk()]));

    let e = refused(&v, &ec.sign(&claims(json!({"exp": now() - 3600}))));
    assert!(matches!(e, JwtError::Expired), "{e}");
    assert!(e.to_string().contains("expired"));
    let e = refused(&v, &ec.sign(&claims(json!({"nbf": now() + 3600}))));
    assert!(matches!(e, JwtError::NotYetValid), "{e}");
    let e = refused(&v, &ec.sign(&claims(json!({"aud": "someone-else"}))));
    assert!(matches!(e, JwtError::Audience(_)), "{e}");
    assert!(e.to_string().contains("audience"));
    let e = refused(&v, &ec.sign(&claims(json!({"iss": "https://evil"}))));
    assert!(matches!(e, JwtError::Issuer(_)), "{e}");

    // Signed by another key under our kid.
    let forger = Signer::ec("ec-1");
    let e = refused(&v, &forger.sign(&claims(json!({}))));
    assert!(matches!(e, JwtError::BadSignature), "{e}");
    assert!(e.to_string().contains("signature"));
    // Tampered payload.
    let good = ec.sign(&claims(json!({})));
    let parts: Vec<&str> = good.split('.').collect();
    let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(claims(json!({"ate_role": "admin"})).to_string());
    let e = refused(&v, &format!("{}.{forged}.{}", parts[0], parts[2]));
    assert!(matches!(e, JwtError::BadSignature), "{e}");

    // alg none, with and without a signature part, and `nOnE`.
    let e = refused(
        &v,
        &unsigned(json!({"alg": "none", "typ": "JWT"}), &claims(json!({}))),
    );
    assert!(matches!(e, JwtError::Unsigned), "{e}");
    assert!(e.to_string().contains("unsigned"));
    let token = unsigned(json!({"alg": "nOnE"}), &claims(json!({})));
    assert!(matches!(refused(&v, &token), JwtError::Unsigned));
    let token = unsigned(json!({"alg": "ES256", "kid": "ec-1"}), &claims(json!({})));
    assert!(matches!(refused(&v, &token), JwtError::Unsigned));
    let token = token.trim_end_matches('.').to_string();
    assert!(matches!(refused(&v, &token), JwtError::Unsigned));

    // HMAC (a public JWKS must never become a shared secret).
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &claims(json!({})),
        &EncodingKey::from_secret(b"secret").unwrap(),
    )
    .unwrap();
    assert!(matches!(refused(&v, &hs), JwtError::Algorithm(_)));

    // Unknown kid; no kid is fine with one fitting key.
    let e = refused(&v, &ec.sign_with(Some("nope"), &claims(json!({}))));
    assert!(matches!(e, JwtError::UnknownKid(_)), "{e}");
    v.verify(&ec.sign_with(None, &claims(json!({})))).unwrap();

    // Claims.
    let mut no_exp = claims(json!({}));
    no_exp.as_object_mut().unwrap().remove("exp");
    let e = refused(&v, &ec.sign(&no_exp));
    assert!(
        matches!(e, JwtError::MissingClaim(ref c) if c == "exp"),
        "{e}"
    );
    let mut no_sub = claims(json!({}));
    no_sub.as_object_mut().unwrap().remove("sub");
    assert!(matches!(
        refused(&v, &ec.sign(&no_sub)),
        JwtError::MissingClaim(_) | JwtError::Malformed(_)
    ));
    for bad in [
        json!({"ate_role": "root"}),
        json!({"ate_atespaces": ["Bad_Name"]}),
        json!({"ate_atespaces": ["*", "team-a"]}),
        json!({"ate_node": "no/de"}),
    ] {
        let e = refused(&v, &ec.sign(&claims(bad.clone())));
        assert!(matches!(e, JwtError::Claim { .. }), "{bad}: {e}");
    }
    assert!(matches!(refused(&v, "garbage"), JwtError::Malformed(_)));
    assert!(matches!(refused(&v, "a.b.c"), JwtError::Malformed(_)));
}

#[test]
fn key_must_fit_the_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let (ec, rsa) = (Signer::ec("ec-1"), Signer::rsa("rsa-1"));
    let v = verifier(&write_jwks(dir.path(), &[ec.jwk(), rsa.jwk()]));
    // An RSA-signed token naming the EC key.
    let e = refused(&v, &rsa.sign_with(Some("ec-1"), &claims(json!({}))));
    assert!(matches!(e, JwtError::KeyMismatch { .. }), "{e}");
    // Without kid, exactly one key must fit.
    v.verify(&rsa.sign_with(None, &claims(json!({})))).unwrap();
    let rsa2 = Signer::rsa("rsa-2");
    let v = verifier(&write_jwks(dir.path(), &[rsa.jwk(), rsa2.jwk()]));
    let e = refused(&v, &rsa.sign_with(None, &claims(json!({}))));
    assert!(matches!(e, JwtError::NoKid(2, _)), "{e}");
}

#[test]
fn jwks_loading_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    let config = || JwtConfig {
        issuer: ISS.into(),
        audience: AUD.into(),
        jwks_file: path.clone(),
    };
    assert!(matches!(
        JwtVerifier::new(config()),
        Err(JwtError::ReadJwks { .. })
    ));
    std::fs::write(&path, "{").unwrap();
    assert!(matches!(
        JwtVerifier::new(config()),
        Err(JwtError::Jwks { .. })
    ));
    // Only a symmetric key: nothing usable.
    std::fs::write(
        &path,
        r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}"#,
    )
    .unwrap();
    assert!(matches!(
        JwtVerifier::new(config()),
        Err(JwtError::Jwks { .. })
    ));

    let (old, new) = (Signer::ec("old"), Signer::ec("new"));
    write_jwks(dir.path(), &[old.jwk()]);
    let v = JwtVerifier::new(config())
        .unwrap()
        .with_recheck_interval(Duration::ZERO);
    v.verify(&old.sign(&claims(json!({})))).unwrap();
    assert!(matches!(
        refused(&v, &new.sign(&claims(json!({})))),
        JwtError::UnknownKid(_)
    ));
    // Rotation: the file changes, the next check reads it (mtime granularity: set it).
    write_jwks(dir.path(), &[new.jwk()]);
    let later = SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    v.verify(&new.sign(&claims(json!({})))).unwrap();
    assert!(matches!(
        refused(&v, &old.sign(&claims(json!({})))),
        JwtError::UnknownKid(_)
    ));
    // A broken file keeps the previous keys.
    std::fs::write(&path, "not json").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later + Duration::from_secs(5))
        .unwrap();
    v.verify(&new.sign(&claims(json!({})))).unwrap();
}
