//! What a machine needs to join a fleet without anyone making a certificate by hand: a join
//! token that carries the CA's fingerprint (so the first contact with the api can be checked
//! before any secret is sent), a fresh key and certificate signing request per identity, and a
//! TLS client config for that first contact.
//!
//! The flow (`ate up --role node --join …`): fetch the api's CA bundle over an unauthenticated
//! TLS connection, accept it only if its SHA-256 equals the token's pin, then connect again
//! verifying the api against that CA and send the token with one CSR per identity (the node and
//! each of its workers). The api signs them with its CA; keys never leave the machine.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use rustls::ClientConfig;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

use crate::config::{client_config_with, provider_signature_checks};
use crate::error::TlsError;
use crate::id::SpiffeId;

/// Prefix (and format version) of a join token.
const TOKEN_PREFIX: &str = "atejoin1";
/// Length of a token's public id and of its secret (lowercase letters and digits).
pub const TOKEN_ID_LEN: usize = 8;
pub const TOKEN_SECRET_LEN: usize = 32;
const TOKEN_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A join token: `atejoin1.<id>.<secret>.<sha256 of the CA certificate, hex>`. The id names the
/// token in listings and revocation; the api keeps only a hash of the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
    /// SHA-256 of the CA certificate (DER), lowercase hex.
    pub ca_pin: String,
}

impl JoinToken {
    /// A new random token for the CA with fingerprint `ca_pin`.
    pub fn generate(ca_pin: &str) -> Result<Self, TlsError> {
        Ok(JoinToken {
            id: random_string(TOKEN_ID_LEN)?,
            secret: random_string(TOKEN_SECRET_LEN)?,
            ca_pin: ca_pin.to_ascii_lowercase(),
        })
    }

    /// SHA-256 of the secret (hex): what the api stores and compares.
    pub fn secret_hash(&self) -> String {
        hash_secret(&self.secret)
    }
}

/// SHA-256 of a token secret, lowercase hex.
pub fn hash_secret(secret: &str) -> String {
    hex_lower(&Sha256::digest(secret.as_bytes()))
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TOKEN_PREFIX}.{}.{}.{}",
            self.id, self.secret, self.ca_pin
        )
    }
}

// Never print the secret by accident.
impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .field("ca_pin", &self.ca_pin)
            .finish_non_exhaustive()
    }
}

impl FromStr for JoinToken {
    type Err = TlsError;

    fn from_str(s: &str) -> Result<Self, TlsError> {
        let bad = |reason: &str| TlsError::BadJoinToken(reason.to_string());
        let parts: Vec<&str> = s.trim().split('.').collect();
        let [prefix, id, secret, pin] = parts.as_slice() else {
            return Err(bad(
                "expected atejoin1.<id>.<secret>.<ca sha256> (as printed by `ate token create`)",
            ));
        };
        if *prefix != TOKEN_PREFIX {
            return Err(bad("it does not start with atejoin1."));
        }
        let alnum = |v: &str| v.bytes().all(|b| TOKEN_ALPHABET.contains(&b));
        if id.len() != TOKEN_ID_LEN || !alnum(id) {
            return Err(bad("its id is not 8 lowercase letters or digits"));
        }
        if secret.len() != TOKEN_SECRET_LEN || !alnum(secret) {
            return Err(bad("its secret is not 32 lowercase letters or digits"));
        }
        if pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("its CA fingerprint is not 64 hex digits"));
        }
        Ok(JoinToken {
            id: id.to_string(),
            secret: secret.to_string(),
            ca_pin: pin.to_ascii_lowercase(),
        })
    }
}

/// SHA-256 of a certificate (DER), lowercase hex: the pin a join token carries.
pub fn fingerprint(der: &CertificateDer<'_>) -> String {
    hex_lower(&Sha256::digest(der.as_ref()))
}

/// The certificates of a PEM bundle whose fingerprint is `pin`, or an error naming the mismatch.
/// This is what makes the unauthenticated first contact safe: a bundle from anyone but the
/// api that issued the token does not match.
pub fn check_bundle(bundle_pem: &str, pin: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(bundle_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::CertParse(format!("CA bundle from the api: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::CertParse(
            "the api sent an empty CA bundle".into(),
        ));
    }
    if !certs
        .iter()
        .any(|c| fingerprint(c).eq_ignore_ascii_case(pin))
    {
        let got: Vec<String> = certs.iter().map(fingerprint).collect();
        return Err(TlsError::CaPinMismatch {
            expected: pin.to_string(),
            presented: got.join(", "),
        });
    }
    Ok(certs)
}

/// A fresh key pair and a CSR for `id` (PEM). The CSR names the identity only as a courtesy:
/// the signer decides what goes into the certificate.
pub fn key_and_csr(id: &SpiffeId) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, id.service_account());
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// A client config for the first contact of a join: it accepts any server certificate (the
/// handshake signature is still checked) and presents none. Use it only to fetch the public CA
/// bundle, then check that with [`check_bundle`]; never send a secret over it.
pub fn first_contact_client_config() -> Result<ClientConfig, TlsError> {
    let provider = crate::crypto_provider();
    let verifier = AnyServer {
        provider: provider.clone(),
    };
    client_config_with(provider, Arc::new(verifier), |b| b.with_no_client_auth())
}

#[derive(Debug)]
struct AnyServer {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    provider_signature_checks!();
}

fn random_string(len: usize) -> Result<String, TlsError> {
    let mut bytes = vec![0u8; len];
    rustls::crypto::aws_lc_rs::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::CertParse("no secure random numbers".into()))?;
    // 256 % 36 != 0 biases a few characters slightly; irrelevant at 32 characters of secret.
    Ok(bytes
        .iter()
        .map(|b| TOKEN_ALPHABET[*b as usize % TOKEN_ALPHABET.len()] as char)
        .collect())
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{LocalCa, SvidRequest};

    #[test]
    fn token_round_trips_and_rejects_bad_forms() {
        let pin = "ab".repeat(32);
        let t = JoinToken::generate(&pin).unwrap();
        let parsed: JoinToken = t.to_string().parse().unwrap();
        assert_eq!(parsed, t);
        assert!(
            !format!("{t:?}").contains(&t.secret),
            "Debug leaks the secret"
        );
        for bad in [
            "",
            "atejoin1.abc",
            &format!("atejoin2.{}.{}.{pin}", t.id, t.secret),
            &format!("atejoin1.{}.short.{pin}", t.id),
            &format!("atejoin1.{}.{}.nothex", t.id, t.secret),
            &format!("atejoin1.ABCDEFGH.{}.{pin}", t.secret),
        ] {
            assert!(bad.parse::<JoinToken>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(t.secret_hash(), hash_secret(&t.secret));
        assert_ne!(t.secret_hash(), t.secret);
    }

    #[test]
    fn csr_is_signed_with_the_signers_identity_not_the_requested_one() {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::open_or_create(dir.path(), "example.org").unwrap();
        let asked = SpiffeId::admin("example.org").unwrap();
        let (key_pem, csr_pem) = key_and_csr(&asked).unwrap();
        let given = SpiffeId::node_instance("example.org", "n1").unwrap();
        let signed = ca
            .sign_csr(&SvidRequest::new(given.clone()), &csr_pem)
            .unwrap();
        let der = CertificateDer::from_pem_slice(signed.cert_pem.as_bytes()).unwrap();
        assert_eq!(crate::spiffe_id_from_der(&der).unwrap(), given);
        // The certificate carries the CSR's key.
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        rustls::sign::CertifiedKey::from_der(vec![der], key, &crate::crypto_provider()).unwrap();
        // A tampered CSR is refused.
        let tampered = csr_pem.replacen('A', "B", 1);
        assert!(ca.sign_csr(&SvidRequest::new(given), &tampered).is_err());
    }

    #[test]
    fn bundle_must_match_the_pin() {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::open_or_create(dir.path(), "example.org").unwrap();
        let pin = fingerprint(ca.cert_der());
        assert_eq!(check_bundle(ca.cert_pem(), &pin).unwrap().len(), 1);
        let other = tempfile::tempdir().unwrap();
        let other = LocalCa::open_or_create(other.path(), "example.org").unwrap();
        let err = check_bundle(other.cert_pem(), &pin).unwrap_err();
        assert!(err.to_string().contains(&pin), "{err}");
        assert!(check_bundle("", &pin).is_err());
    }
}
