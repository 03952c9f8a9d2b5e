//! Bearer tokens for callers outside the mesh: the api's `--auth-mode=jwt` and the router's
//! `--ingress-auth-mode=jwt` verify them with this one verifier (and the same error texts).
//! The other direction, tokens the api signs for actors, is [`issuer`].
//!
//! A token is a JWS-signed JWT whose key is in a JWKS file (`--jwt-jwks-file`, re-read when it
//! changes). Accepted algorithms: RS256/384/512, PS256/384/512 (RSA keys), ES256 (P-256),
//! ES384 (P-384) and EdDSA (Ed25519). Refused: `alg: none` and any token without a signature,
//! HMAC algorithms (a JWKS is public), a `kid` that is not in the JWKS, an algorithm that does
//! not match the key, a bad signature, and claims that fail: `exp` (required, expired = refused),
//! `nbf` (if present), `iss` = `--jwt-issuer`, `aud` contains `--jwt-audience`, `sub` (required:
//! it names the caller in audit logs). Clock leeway: [`LEEWAY_SECONDS`].
//!
//! Authorization claims: `ate_role` = `admin` | `client` (default) | `ingress_router` |
//! `node_agent`; `ate_atespaces` = the atespaces of a client (`["*"]` = all; none if absent);
//! `ate_node` = the node a `node_agent` token speaks for (without it the token may not suspend).

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod issuer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;

/// Seconds of clock difference tolerated on `exp` and `nbf`.
pub const LEEWAY_SECONDS: u64 = 30;
/// How often the JWKS file's modification time is checked.
const JWKS_RECHECK: Duration = Duration::from_secs(5);

/// Where tokens come from and whom they are for.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// Required `iss`.
    pub issuer: String,
    /// `aud` must contain this.
    pub audience: String,
    /// JSON Web Key Set (`{"keys":[…]}`) with the issuer's public keys.
    pub jwks_file: PathBuf,
}

/// Why a JWKS could not be loaded or a token was refused. The token variants' messages are
/// what the caller sees in `Unauthenticated`.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("cannot read JWKS file {path}: {source}")]
    ReadJwks {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid JWKS file {path}: {reason}")]
    Jwks { path: PathBuf, reason: String },
    #[error("malformed bearer token: {0}")]
    Malformed(String),
    #[error("unsigned bearer token (alg none) refused")]
    Unsigned,
    #[error(
        "bearer token algorithm {0} is not accepted (RS256/384/512, PS256/384/512, ES256, ES384, EdDSA)"
    )]
    Algorithm(String),
    #[error("bearer token key id {0:?} is not in the JWKS")]
    UnknownKid(String),
    #[error("bearer token has no kid and {0} JWKS keys fit its algorithm {1:?}")]
    NoKid(usize, Algorithm),
    #[error("bearer token algorithm {alg:?} does not match JWKS key {kid:?}")]
    KeyMismatch { alg: Algorithm, kid: String },
    #[error("bearer token has a bad signature")]
    BadSignature,
    #[error("bearer token expired")]
    Expired,
    #[error("bearer token is not valid yet (nbf)")]
    NotYetValid,
    #[error("bearer token has the wrong audience (expected {0:?})")]
    Audience(String),
    #[error("bearer token has the wrong issuer (expected {0:?})")]
    Issuer(String),
    #[error("bearer token lacks the {0:?} claim")]
    MissingClaim(String),
    #[error("bearer token claim {claim}: {reason}")]
    Claim { claim: &'static str, reason: String },
}

/// The role a token asks for (`ate_role`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRole {
    Admin,
    Client,
    IngressRouter,
    NodeAgent,
}

/// A verified token's caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    pub issuer: String,
    pub subject: String,
    pub role: TokenRole,
    /// `ate_atespaces`: None = `["*"]` (all); Some(list) otherwise (empty when absent).
    pub atespaces: Option<Vec<String>>,
    /// `ate_node`: the node a node-agent token is bound to.
    pub node: Option<String>,
}

#[derive(Deserialize)]
struct RawClaims {
    iss: String,
    sub: String,
    #[serde(default)]
    ate_role: Option<String>,
    #[serde(default)]
    ate_atespaces: Option<Vec<String>>,
    #[serde(default)]
    ate_node: Option<String>,
}

struct Key {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

struct Loaded {
    keys: Arc<Vec<Key>>,
    modified: Option<SystemTime>,
    checked: Instant,
}

/// Verifies bearer tokens against one issuer's JWKS file.
pub struct JwtVerifier {
    config: JwtConfig,
    loaded: Mutex<Loaded>,
    recheck: Duration,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// Loads the JWKS; fails if it cannot be read or has no usable signing key.
    pub fn new(config: JwtConfig) -> Result<Self, JwtError> {
        let (keys, modified) = load_jwks(&config.jwks_file)?;
        Ok(JwtVerifier {
            config,
            loaded: Mutex::new(Loaded {
                keys: Arc::new(keys),
                modified,
                checked: Instant::now(),
            }),
            recheck: JWKS_RECHECK,
        })
    }

    /// How often the JWKS file is checked for changes (default 5 s).
    pub fn with_recheck_interval(mut self, every: Duration) -> Self {
        self.recheck = every;
        self
    }

    pub fn config(&self) -> &JwtConfig {
        &self.config
    }

    /// The current keys; the file is re-read (at most every few seconds) when its modification
    /// time changed. A file that became unreadable or invalid keeps the previous keys.
    fn keys(&self) -> Arc<Vec<Key>> {
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if loaded.checked.elapsed() >= self.recheck {
            loaded.checked = Instant::now();
            let path = &self.config.jwks_file;
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            if modified != loaded.modified {
                match load_jwks(path) {
                    Ok((keys, modified)) => {
                        tracing::info!(jwks = %path.display(), keys = keys.len(), "JWKS reloaded");
                        loaded.keys = Arc::new(keys);
                        loaded.modified = modified;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "JWKS not reloaded; keeping the previous keys");
                        loaded.modified = modified;
                    }
                }
            }
        }
        loaded.keys.clone()
    }

    /// Verifies `token` (the part after `Bearer `) and returns its caller.
    pub fn verify(&self, token: &str) -> Result<TokenClaims, JwtError> {
        let alg = alg_from_name(&header_alg(token)?)?;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| JwtError::Malformed(format!("header: {e}")))?;
        if header.alg != alg {
            return Err(JwtError::Malformed("inconsistent header".into()));
        }
        let keys = self.keys();
        let key = match &header.kid {
            Some(kid) => {
                let key = keys
                    .iter()
                    .find(|k| k.kid.as_deref() == Some(kid.as_str()))
                    .ok_or_else(|| JwtError::UnknownKid(kid.clone()))?;
                if !key.algorithms.contains(&header.alg) {
                    return Err(JwtError::KeyMismatch {
                        alg: header.alg,
                        kid: kid.clone(),
                    });
                }
                key
            }
            None => {
                let fitting: Vec<&Key> = keys
                    .iter()
                    .filter(|k| k.algorithms.contains(&header.alg))
                    .collect();
                match fitting.as_slice() {
                    [one] => *one,
                    other => return Err(JwtError::NoKid(other.len(), header.alg)),
                }
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<RawClaims>(token, &key.key, &validation)
            .map_err(|e| self.refusal(e))?;
        claims(data.claims)
    }

    fn refusal(&self, e: jsonwebtoken::errors::Error) -> JwtError {
        match e.kind() {
            ErrorKind::InvalidSignature => JwtError::BadSignature,
            ErrorKind::ExpiredSignature => JwtError::Expired,
            ErrorKind::ImmatureSignature => JwtError::NotYetValid,
            ErrorKind::InvalidAudience => JwtError::Audience(self.config.audience.clone()),
            ErrorKind::InvalidIssuer => JwtError::Issuer(self.config.issuer.clone()),
            ErrorKind::MissingRequiredClaim(c) => JwtError::MissingClaim(c.clone()),
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat => {
                JwtError::Malformed(format!("key does not fit the algorithm: {e}"))
            }
            _ => JwtError::Malformed(e.to_string()),
        }
    }
}

/// The `alg` of the token's header, read before anything else so `none` is named as such
/// (jsonwebtoken has no `none` algorithm and would only say the header does not parse).
fn header_alg(token: &str) -> Result<String, JwtError> {
    let mut parts = token.split('.');
    let (Some(header), Some(_payload), signature, None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed(
            "expected <header>.<payload>.<signature>".into(),
        ));
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.trim_end_matches('='))
        .map_err(|e| JwtError::Malformed(format!("header is not base64url: {e}")))?;
    #[derive(Deserialize)]
    struct Alg {
        alg: Option<String>,
    }
    let parsed: Alg = serde_json::from_slice(&bytes)
        .map_err(|e| JwtError::Malformed(format!("header is not JSON: {e}")))?;
    let alg = parsed.alg.unwrap_or_default();
    if alg.is_empty() || alg.eq_ignore_ascii_case("none") || signature.is_none_or(str::is_empty) {
        return Err(JwtError::Unsigned);
    }
    Ok(alg)
}

fn alg_from_name(name: &str) -> Result<Algorithm, JwtError> {
    let alg: Algorithm = name
        .parse()
        .map_err(|_| JwtError::Algorithm(name.to_string()))?;
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            Err(JwtError::Algorithm(name.to_string()))
        }
        other => Ok(other),
    }
}

fn claims(raw: RawClaims) -> Result<TokenClaims, JwtError> {
    let role = match raw.ate_role.as_deref() {
        None | Some("client") => TokenRole::Client,
        Some("admin") => TokenRole::Admin,
        Some("ingress_router") => TokenRole::IngressRouter,
        Some("node_agent") => TokenRole::NodeAgent,
        Some(other) => {
            return Err(JwtError::Claim {
                claim: "ate_role",
                reason: format!(
                    "{other:?} is not one of admin, client, ingress_router, node_agent"
                ),
            });
        }
    };
    let atespaces = match raw.ate_atespaces {
        Some(list) if list.iter().any(|a| a == "*") => {
            if list.len() != 1 {
                return Err(JwtError::Claim {
                    claim: "ate_atespaces",
                    reason: "\"*\" must be the only entry".into(),
                });
            }
            None
        }
        Some(list) => {
            for a in &list {
                ate_core::validate_label("atespace", a).map_err(|e| JwtError::Claim {
                    claim: "ate_atespaces",
                    reason: e.to_string(),
                })?;
            }
            Some(list)
        }
        None => Some(Vec::new()),
    };
    if let Some(node) = &raw.ate_node {
        ate_core::validate_label("node", node).map_err(|e| JwtError::Claim {
            claim: "ate_node",
            reason: e.to_string(),
        })?;
    }
    if raw.sub.is_empty() {
        return Err(JwtError::MissingClaim("sub".into()));
    }
    Ok(TokenClaims {
        issuer: raw.iss,
        subject: raw.sub,
        role,
        atespaces,
        node: raw.ate_node,
    })
}

fn load_jwks(path: &Path) -> Result<(Vec<Key>, Option<SystemTime>), JwtError> {
    let bad = |reason: String| JwtError::Jwks {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read(path).map_err(|source| JwtError::ReadJwks {
        path: path.to_path_buf(),
        source,
    })?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let set: JwkSet =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a JWK set: {e}")))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        match key_of(jwk) {
            Ok(k) => keys.push(k),
            Err(reason) => tracing::warn!(
                jwks = %path.display(),
                kid = ?jwk.common.key_id,
                reason,
                "JWKS key skipped"
            ),
        }
    }
    if keys.is_empty() {
        return Err(bad(format!(
            "none of its {} keys is a usable signature key",
            set.keys.len()
        )));
    }
    Ok((keys, modified))
}

/// One JWK as a verification key with the algorithms it may verify.
fn key_of(jwk: &Jwk) -> Result<Key, String> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return Err("not a signature key (use)".into());
    }
    let family: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return Err(format!("unsupported curve {:?}", p.curve)),
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        AlgorithmParameters::OctetKey(_) => {
            return Err("symmetric (oct) keys are not accepted".into());
        }
        _ => return Err("unsupported key type".into()),
    };
    let algorithms = match jwk.common.key_algorithm {
        None => family,
        Some(ka) => {
            let alg = key_algorithm(ka).ok_or_else(|| format!("unsupported alg {ka:?}"))?;
            if !family.contains(&alg) {
                return Err(format!("alg {ka:?} does not fit the key type"));
            }
            vec![alg]
        }
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| e.to_string())?;
    Ok(Key {
        kid: jwk.common.key_id.clone(),
        algorithms,
        key,
    })
}

fn key_algorithm(ka: KeyAlgorithm) -> Option<Algorithm> {
    Some(match ka {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
