//! The registry client: TLS roots, plain HTTP for loopback registries, Docker-style credentials.

use std::collections::HashMap;
use std::time::Duration;

use oci_client::Client;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use super::fetch::chain;
use super::{ENV_CA_FILE, RegistryConfig};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) fn build_client(config: &RegistryConfig) -> std::result::Result<Client, String> {
    let mut extra_root_certificates = Vec::new();
    if let Some(path) = &config.ca_file {
        let pem = std::fs::read_to_string(path)
            .map_err(|e| format!("{ENV_CA_FILE} {}: {e}", path.display()))?;
        for block in pem_certificates(&pem) {
            extra_root_certificates.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data: block.into_bytes(),
            });
        }
        if extra_root_certificates.is_empty() {
            return Err(format!(
                "{ENV_CA_FILE} {}: no PEM certificate in it",
                path.display()
            ));
        }
    }
    let client_config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(config.insecure.clone()),
        extra_root_certificates,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        user_agent: concat!("ate-worker/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(client_config).map_err(|e| format!("registry client: {}", chain(&e)))
}

/// Each `-----BEGIN CERTIFICATE-----` block of a PEM file.
fn pem_certificates(pem: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

const DOCKER_HUB: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

/// `https://host:port/v1/` → `host:port`.
fn auth_key(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// Basic-auth credentials for `registry` from a Docker-style config file's bytes.
pub(super) fn registry_auth(
    config: &[u8],
    registry: &str,
) -> std::result::Result<RegistryAuth, String> {
    let config: DockerConfig =
        serde_json::from_slice(config).map_err(|e| format!("not a Docker config.json: {e}"))?;
    let same =
        |k: &str| k == registry || (DOCKER_HUB.contains(&k) && DOCKER_HUB.contains(&registry));
    let Some((key, entry)) = config.auths.iter().find(|(k, _)| same(auth_key(k))) else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    let Some(encoded) = &entry.auth else {
        return Err(format!(
            "auths.{key:?} has neither `auth` nor `username`/`password`"
        ));
    };
    let decoded = base64_decode(encoded.trim())
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| format!("auths.{key:?}.auth is not base64 of user:password"))?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| format!("auths.{key:?}.auth is not base64 of user:password"))?;
    Ok(RegistryAuth::Basic(user.to_string(), password.to_string()))
}

/// Standard base64 with optional padding (the `auth` field of a Docker config).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let body = text.trim_end_matches('=');
    if text.len() - body.len() > 2 || body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.as_bytes().chunks(4) {
        let mut n: u32 = 0;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_docker_auth() {
        assert_eq!(base64_decode("dXNlcjpwYXNz"), Some(b"user:pass".to_vec()));
        assert_eq!(base64_decode("YQ=="), Some(b"a".to_vec()));
        assert_eq!(base64_decode("YWI="), Some(b"ab".to_vec()));
        assert_eq!(base64_decode("YWJj"), Some(b"abc".to_vec()));
        assert_eq!(base64_decode("Y"), None);
        assert_eq!(base64_decode("!!!!"), None);
        let file = br#"{"auths": {
            "https://127.0.0.1:5000/v1/": {"auth": "dXNlcjpwYXNz"},
            "other.example": {"username": "u", "password": "p"},
            "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="},
            "broken.example": {}
        }}"#;
        let basic = |a: RegistryAuth| match a {
            RegistryAuth::Basic(u, p) => Some((u, p)),
            _ => None,
        };
        assert_eq!(
            registry_auth(file, "127.0.0.1:5000").ok().and_then(basic),
            Some(("user".into(), "pass".into()))
        );
        assert_eq!(
            registry_auth(file, "other.example").ok().and_then(basic),
            Some(("u".into(), "p".into()))
        );
        assert_eq!(
            registry_auth(file, "docker.io").ok().and_then(basic),
            Some(("hub".into(), "secret".into()))
        );
        assert!(matches!(
            registry_auth(file, "elsewhere.example"),
            Ok(RegistryAuth::Anonymous)
        ));
        assert!(registry_auth(file, "broken.example").is_err());
        assert!(registry_auth(b"not json", "x").is_err());
    }

    #[test]
    fn splits_pem_bundles() {
        let pem = "junk\n-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n";
        let certs = pem_certificates(pem);
        assert_eq!(certs.len(), 2);
        assert!(certs[1].contains("BBB") && !certs[1].contains("AAA"));
    }
}
