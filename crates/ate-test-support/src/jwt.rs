//! Bearer tokens for tests: a signer with a freshly generated EC (P-256) or RSA key, its JWK for
//! the JWKS file a verifier reads, and claims with test values merged in.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::Value;

/// Signs tokens with its own key, naming it `kid`.
pub struct Signer {
    pub kid: String,
    pub alg: Algorithm,
    pub key: EncodingKey,
}

impl Signer {
    /// A P-256 key (ES256).
    pub fn ec(kid: &str) -> Signer {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("EC key");
        Signer {
            kid: kid.to_string(),
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(&kp.serialize_der()),
        }
    }

    /// An RSA key (RS256).
    pub fn rsa(kid: &str) -> Signer {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("RSA key");
        let key = EncodingKey::from_rsa_pem(kp.serialize_pem().as_bytes()).expect("RSA PEM");
        Signer {
            kid: kid.to_string(),
            alg: Algorithm::RS256,
            key,
        }
    }

    /// The public key as a JWK with its `kid`, for a JWKS file.
    pub fn jwk(&self) -> Value {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).expect("JWK");
        jwk.common.key_id = Some(self.kid.clone());
        serde_json::to_value(jwk).expect("JWK as JSON")
    }

    /// A token of `claims` whose header names `kid` (None: no `kid`).
    pub fn sign_with(&self, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = kid.map(String::from);
        encode(&header, claims, &self.key).expect("sign")
    }

    /// A token of `claims` naming this signer's key.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with(Some(&self.kid), claims)
    }
}

/// Seconds since the Unix epoch, as `exp` and `nbf` count them.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// `base` (an object) with every field of `extra` (an object) set over it.
pub fn merged(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}
