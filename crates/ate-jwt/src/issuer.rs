//! Identity tokens the api signs for actors (`GET /v1/identity?audience=…` inside an actor):
//! short-lived EdDSA (Ed25519) JWTs that an outside service verifies against the JWKS the api
//! publishes at `/.well-known/jwks.json` on its HTTP listener.
//!
//! The signing key is one PKCS#8 PEM file (`ate api --identity-key`), created 0600 on first use.
//! A previous key kept beside it as `<file>.previous` stays in the JWKS (not used to sign), so
//! tokens signed before a rotation verify until they expire.
//!
//! Claims: `iss` (`--identity-issuer`), `sub` = `<atespace>/<name>`, `aud` (the caller's),
//! `iat`, `nbf`, `exp`, `jti`, and `ate_role: "actor"`, `ate_atespace`, `ate_actor`,
//! `ate_activation`. `ate_role: "actor"` is not a role the api's or the router's bearer-token
//! verifier accepts, so an actor's token never passes as a client's.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use jsonwebtoken::jwk::{
    AlgorithmParameters, CommonParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm,
    OctetKeyPairParameters, OctetKeyPairType, PublicKeyUse, ThumbprintHash,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

/// The shortest and longest token lifetime a caller may ask for.
pub const MIN_TOKEN_TTL: Duration = Duration::from_secs(60);
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// The lifetime of a token when the caller names none.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(600);
/// The longest audience accepted.
pub const MAX_AUDIENCE: usize = 256;

/// Why the signing key could not be loaded or a token not signed.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("identity key {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("identity key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("invalid audience {0:?}: must be 1 to 256 printable characters")]
    Audience(String),
    #[error("invalid ttl {0}s: must be between 60s and 3600s")]
    Ttl(u64),
    #[error("cannot sign the token: {0}")]
    Sign(String),
}

/// Whom a token is for and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorTokenRequest<'a> {
    pub atespace: &'a str,
    pub name: &'a str,
    /// The activation the actor runs at (the worker's view, checked by the api).
    pub activation: u64,
    pub audience: &'a str,
    pub ttl: Duration,
}

/// A signed token and its expiry (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedToken {
    pub token: String,
    pub expires_unix: u64,
}

#[derive(Serialize)]
struct ActorClaims<'a> {
    iss: &'a str,
    sub: String,
    aud: &'a str,
    iat: u64,
    nbf: u64,
    exp: u64,
    jti: String,
    ate_role: &'static str,
    ate_atespace: &'a str,
    ate_actor: &'a str,
    ate_activation: u64,
}

/// Signs actors' identity tokens with one Ed25519 key and serves its JWKS.
pub struct TokenIssuer {
    issuer: String,
    kid: String,
    key: EncodingKey,
    jwks: String,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("issuer", &self.issuer)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl TokenIssuer {
    /// Loads the key at `path`, creating it (0600, its directory 0700) when it does not exist;
    /// `<path>.previous`, when present, is published in the JWKS too.
    pub fn load_or_create(path: &Path, issuer: &str) -> Result<Self, IssuerError> {
        let io = |source| IssuerError::Io {
            path: path.to_path_buf(),
            source,
        };
        let pem = match std::fs::read_to_string(path) {
            Ok(pem) => pem,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_key(path)?,
            Err(e) => return Err(io(e)),
        };
        let (key, jwk) = parse_key(path, &pem)?;
        let kid = jwk.common.key_id.clone().unwrap_or_default();
        let mut keys = vec![jwk];
        let previous = previous_path(path);
        match std::fs::read_to_string(&previous) {
            Ok(pem) => {
                let (_, old) = parse_key(&previous, &pem)?;
                if old.common.key_id.as_deref() != Some(kid.as_str()) {
                    keys.push(old);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(IssuerError::Io {
                    path: previous,
                    source,
                });
            }
        }
        let jwks =
            serde_json::to_string_pretty(&JwkSet { keys }).map_err(|e| IssuerError::Key {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        Ok(TokenIssuer {
            issuer: issuer.to_string(),
            kid,
            key,
            jwks,
        })
    }

    /// Moves the key at `path` to `<path>.previous` and creates a new one (the api signs with
    /// it after its next start; tokens of the old key verify until they expire). Without a key
    /// at `path`, only creates one.
    pub fn rotate(path: &Path) -> Result<(), IssuerError> {
        let previous = previous_path(path);
        match std::fs::rename(path, &previous) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(IssuerError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        create_key(path).map(|_| ())
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key id (RFC 7638 thumbprint) tokens are signed with.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The JWKS (`{"keys": [...]}`) that verifies the tokens.
    pub fn jwks_json(&self) -> &str {
        &self.jwks
    }

    /// The OpenID discovery document for an issuer that is an http(s) URL (what cloud workload
    /// identity federation reads); None otherwise.
    pub fn openid_configuration(&self) -> Option<String> {
        if !(self.issuer.starts_with("https://") || self.issuer.starts_with("http://")) {
            return None;
        }
        let base = self.issuer.trim_end_matches('/');
        Some(
            serde_json::json!({
                "issuer": self.issuer,
                "jwks_uri": format!("{base}/.well-known/jwks.json"),
                "id_token_signing_alg_values_supported": ["EdDSA"],
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "claims_supported": ["sub", "aud", "exp", "iat", "nbf", "iss", "jti", "ate_atespace", "ate_actor", "ate_activation"],
            })
            .to_string(),
        )
    }

    /// Signs a token for `req` issued at `now_unix` (seconds).
    pub fn sign(
        &self,
        req: &ActorTokenRequest<'_>,
        now_unix: u64,
    ) -> Result<SignedToken, IssuerError> {
        check_audience(req.audience)?;
        if req.ttl < MIN_TOKEN_TTL || req.ttl > MAX_TOKEN_TTL {
            return Err(IssuerError::Ttl(req.ttl.as_secs()));
        }
        let exp = now_unix.saturating_add(req.ttl.as_secs());
        let claims = ActorClaims {
            iss: &self.issuer,
            sub: format!("{}/{}", req.atespace, req.name),
            aud: req.audience,
            iat: now_unix,
            nbf: now_unix,
            exp,
            jti: uuid::Uuid::new_v4().to_string(),
            ate_role: "actor",
            ate_atespace: req.atespace,
            ate_actor: req.name,
            ate_activation: req.activation,
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| IssuerError::Sign(e.to_string()))?;
        Ok(SignedToken {
            token,
            expires_unix: exp,
        })
    }
}

/// An audience is 1–256 printable ASCII characters without spaces.
pub fn check_audience(audience: &str) -> Result<(), IssuerError> {
    if audience.is_empty()
        || audience.len() > MAX_AUDIENCE
        || !audience.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(IssuerError::Audience(audience.to_string()));
    }
    Ok(())
}

fn previous_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".previous");
    PathBuf::from(p)
}

/// A new Ed25519 key written to `path` (created exclusively, 0600); its PEM.
fn create_key(path: &Path) -> Result<String, IssuerError> {
    let io = |source| IssuerError::Io {
        path: path.to_path_buf(),
        source,
    };
    let pair =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(|e| IssuerError::Key {
            path: path.to_path_buf(),
            reason: format!("cannot generate an Ed25519 key: {e}"),
        })?;
    let pem = pair.serialize_pem();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    // Written under a temporary name and hard-linked into place: a crash leaves no
    // half-written key, and of two processes creating it at once the second keeps the first's
    // (both read the file back below).
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    file.write_all(pem.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::hard_link(&tmp, path)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(io)?;
    std::fs::remove_file(&tmp).map_err(io)?;
    std::fs::read_to_string(path).map_err(io)
}

/// The signing key and its public JWK (kid = RFC 7638 thumbprint) from a PKCS#8 PEM.
fn parse_key(path: &Path, pem: &str) -> Result<(EncodingKey, Jwk), IssuerError> {
    let bad = |reason: String| IssuerError::Key {
        path: path.to_path_buf(),
        reason,
    };
    let pair = rcgen::KeyPair::from_pem(pem)
        .map_err(|e| bad(format!("not a PKCS#8 PEM private key: {e}")))?;
    if !pair.is_compatible(&rcgen::PKCS_ED25519) {
        return Err(bad("not an Ed25519 key".into()));
    }
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key_raw());
    let mut jwk = Jwk {
        common: CommonParameters {
            public_key_use: Some(PublicKeyUse::Signature),
            key_algorithm: Some(KeyAlgorithm::EdDSA),
            ..Default::default()
        },
        algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
            key_type: OctetKeyPairType::OctetKeyPair,
            curve: EllipticCurve::Ed25519,
            x,
        }),
    };
    let kid = jwk
        .thumbprint(ThumbprintHash::SHA256)
        .map_err(|e| bad(format!("cannot compute the key id: {e}")))?;
    jwk.common.key_id = Some(kid);
    Ok((EncodingKey::from_ed_der(&pair.serialize_der()), jwk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JwtConfig, JwtError, JwtVerifier};

    fn request(audience: &str) -> ActorTokenRequest<'_> {
        ActorTokenRequest {
            atespace: "team-a",
            name: "agent-1",
            activation: 7,
            audience,
            ttl: DEFAULT_TOKEN_TTL,
        }
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    /// Decodes a token's payload without checking it.
    fn payload(token: &str) -> serde_json::Value {
        let part = token.split('.').nth(1).unwrap_or_default();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .unwrap_or_default();
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    #[test]
    fn a_created_key_signs_tokens_its_jwks_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/identity.pem");
        let issuer = TokenIssuer::load_or_create(&path, "https://ate.example").unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let signed = issuer.sign(&request("vault"), now()).unwrap();
        let claims = payload(&signed.token);
        assert_eq!(claims["sub"], "team-a/agent-1");
        assert_eq!(claims["aud"], "vault");
        assert_eq!(claims["ate_activation"], 7);
        assert_eq!(claims["exp"].as_u64(), Some(signed.expires_unix));

        // The same key after a restart; the JWKS verifies with the verifier the api uses.
        let again = TokenIssuer::load_or_create(&path, "https://ate.example").unwrap();
        assert_eq!(again.kid(), issuer.kid());
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, again.jwks_json()).unwrap();
        let verifier = JwtVerifier::new(JwtConfig {
            issuer: "https://ate.example".into(),
            audience: "vault".into(),
            jwks_file: jwks.clone(),
        })
        .unwrap();
        // The api's and router's verifier refuse it as a bearer token: actors are not clients.
        match verifier.verify(&signed.token) {
            Err(JwtError::Claim {
                claim: "ate_role", ..
            }) => {}
            other => panic!("expected the ate_role refusal, got {other:?}"),
        }
        // Another audience: refused on the audience.
        let other = JwtVerifier::new(JwtConfig {
            issuer: "https://ate.example".into(),
            audience: "billing".into(),
            jwks_file: jwks,
        })
        .unwrap();
        assert!(matches!(
            other.verify(&signed.token),
            Err(JwtError::Audience(_))
        ));
        let discovery: serde_json::Value =
            serde_json::from_str(&issuer.openid_configuration().unwrap()).unwrap();
        assert_eq!(
            discovery["jwks_uri"],
            "https://ate.example/.well-known/jwks.json"
        );
    }

    #[test]
    fn the_signature_verifies_against_the_published_key_and_a_changed_token_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let issuer = TokenIssuer::load_or_create(&dir.path().join("k.pem"), "ate").unwrap();
        assert!(issuer.openid_configuration().is_none());
        let signed = issuer.sign(&request("svc"), now()).unwrap();
        let set: JwkSet = serde_json::from_str(issuer.jwks_json()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(&set.keys[0]).unwrap();
        let mut validation = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        validation.set_audience(&["svc"]);
        validation.set_issuer(&["ate"]);
        let ok = jsonwebtoken::decode::<serde_json::Value>(&signed.token, &key, &validation);
        assert!(ok.is_ok(), "{ok:?}");
        let forged = issuer
            .sign(
                &ActorTokenRequest {
                    name: "agent-2",
                    ..request("svc")
                },
                now(),
            )
            .unwrap();
        let mut parts: Vec<&str> = signed.token.split('.').collect();
        let forged_payload = forged.token.split('.').nth(1).unwrap().to_string();
        parts[1] = &forged_payload;
        let spliced = parts.join(".");
        assert!(jsonwebtoken::decode::<serde_json::Value>(&spliced, &key, &validation).is_err());
    }

    #[test]
    fn a_rotated_key_signs_and_the_previous_one_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity.pem");
        let old = TokenIssuer::load_or_create(&path, "ate").unwrap();
        let old_token = old.sign(&request("svc"), now()).unwrap();
        // No key yet: rotate creates one.
        let fresh = dir.path().join("fresh.pem");
        TokenIssuer::rotate(&fresh).unwrap();
        assert!(fresh.exists() && !dir.path().join("fresh.pem.previous").exists());
        TokenIssuer::rotate(&path).unwrap();
        let new = TokenIssuer::load_or_create(&path, "ate").unwrap();
        assert_ne!(new.kid(), old.kid());
        let set: JwkSet = serde_json::from_str(new.jwks_json()).unwrap();
        assert_eq!(set.keys.len(), 2);
        let header = jsonwebtoken::decode_header(&old_token.token).unwrap();
        let jwk = set.find(header.kid.as_deref().unwrap()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap();
        let mut validation = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        validation.set_audience(&["svc"]);
        assert!(
            jsonwebtoken::decode::<serde_json::Value>(&old_token.token, &key, &validation).is_ok()
        );
    }

    #[test]
    fn bad_requests_and_bad_keys_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let issuer = TokenIssuer::load_or_create(&dir.path().join("k.pem"), "ate").unwrap();
        for aud in ["", "has space", &"a".repeat(257)] {
            assert!(matches!(
                issuer.sign(&request(aud), now()),
                Err(IssuerError::Audience(_))
            ));
        }
        let short = ActorTokenRequest {
            ttl: Duration::from_secs(5),
            ..request("svc")
        };
        assert!(matches!(
            issuer.sign(&short, now()),
            Err(IssuerError::Ttl(5))
        ));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a key").unwrap();
        let err = TokenIssuer::load_or_create(&junk, "ate").unwrap_err();
        assert!(err.to_string().contains("junk.pem"), "{err}");
        let p256 = dir.path().join("p256.pem");
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        std::fs::write(&p256, pair.serialize_pem()).unwrap();
        let err = TokenIssuer::load_or_create(&p256, "ate").unwrap_err();
        assert!(err.to_string().contains("not an Ed25519 key"), "{err}");
    }
}
