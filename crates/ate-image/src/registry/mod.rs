//! Registry references → the node image cache, pulled with `oci-client`.
//!
//! A reference is `host[:port]/repo[:tag]` or `host[:port]/repo[:tag]@sha256:<hex>` (Docker's
//! short forms work too: `busybox` is `docker.io/library/busybox:latest`). HTTPS always, except
//! for the loopback registries named in [`RegistryConfig::insecure`], which are spoken to over
//! plain HTTP.
//!
//! Nothing unverified is unpacked: the manifest's sha256 is computed here (and must equal the
//! reference's digest when it names one), every descriptor must carry its size, each blob
//! (config, layers) is streamed into the entry's temporary directory while being hashed and is
//! refused unless its sha256 and size are the descriptor's — oci-client checks the same digests
//! on its side; this check does not rely on it. Only then are the layers applied, with the same
//! code as OCI layouts, into `<cache>/<manifest-hex>/`.
//!
//! A tag is resolved to its manifest digest (logged) and the resolution is recorded in
//! `<cache>/refs/`; while that entry is in the cache the tag keeps meaning that digest on this
//! node, without contacting the registry again — the rootfs under a suspended actor never changes
//! behind it. A new build is picked up through a new tag or a digest reference.
//!
//! Concurrent pulls are single-flighted: per reference inside the process, and per manifest
//! digest across the node's worker processes (the cache's `flock`).

mod client;
mod fetch;
mod record;

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use futures::{StreamExt, TryStreamExt};
use nix::fcntl::Flock;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::{
    Descriptor, EntryBuild, UnpackedImage, apply_verified_layer, cached, cached_locked, digest_hex,
    lock_entry, parse_config,
};
use crate::error::{ImageError, IoContext, Result};
use client::{build_client, registry_auth};
use fetch::{Resolved, check_descriptors, download, parse_reference, resolve};
use record::{read_record, write_record};

/// Comma-separated `host:port` list of loopback registries spoken to over plain HTTP.
pub const ENV_INSECURE: &str = "ATE_INSECURE_REGISTRIES";
/// A Docker-style `config.json` (`{"auths": {"host:port": {"auth": "<base64 user:pass>"}}}`).
pub const ENV_AUTH_FILE: &str = "ATE_REGISTRY_AUTH_FILE";
/// PEM certificates trusted for registries in addition to the system's roots.
pub const ENV_CA_FILE: &str = "ATE_REGISTRY_CA_FILE";
const PARALLEL_LAYERS: usize = 3;

/// How the worker reaches registries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Registries, exactly as written in references (`127.0.0.1:5000`), spoken to over plain
    /// HTTP. Loopback hosts only (`localhost`, `127.0.0.0/8`, `[::1]`); anything else makes every
    /// registry pull fail with a message naming the entry.
    pub insecure: Vec<String>,
    /// Docker-style `config.json` with basic-auth credentials per registry (`auths.<host>.auth`
    /// or `username`/`password`; credential helpers are not supported). oci-client keeps the
    /// credentials it was first given for a registry, so a changed file takes effect when the
    /// worker restarts. Absent: anonymous.
    pub auth_file: Option<PathBuf>,
    /// Extra PEM root certificates for registries' TLS.
    pub ca_file: Option<PathBuf>,
}

impl RegistryConfig {
    /// From `ATE_INSECURE_REGISTRIES` (comma-separated), `ATE_REGISTRY_AUTH_FILE` and
    /// `ATE_REGISTRY_CA_FILE`; all unset: HTTPS, anonymous, system roots.
    pub fn from_env() -> Self {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        RegistryConfig {
            insecure: std::env::var(ENV_INSECURE)
                .map(|v| Self::parse_list(&v))
                .unwrap_or_default(),
            auth_file: path(ENV_AUTH_FILE),
            ca_file: path(ENV_CA_FILE),
        }
    }

    /// `a:1, b:2` → `["a:1", "b:2"]`.
    pub fn parse_list(text: &str) -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Why this config cannot be used, if it cannot.
    fn problem(&self) -> Option<String> {
        let bad: Vec<&str> = self
            .insecure
            .iter()
            .map(String::as_str)
            .filter(|e| !is_loopback_registry(e))
            .collect();
        (!bad.is_empty()).then(|| {
            format!(
                "{ENV_INSECURE}: {} not a loopback registry (host:port); plain HTTP is allowed only to 127.0.0.0/8, [::1] or localhost",
                bad.join(", ")
            )
        })
    }
}

/// `host[:port]` whose host is loopback.
fn is_loopback_registry(entry: &str) -> bool {
    let host = if let Some(rest) = entry.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(is_port) => h,
            _ => return false,
        }
    } else {
        match entry.rsplit_once(':') {
            Some((h, port)) if is_port(port) => h,
            Some(_) => return false,
            None => entry,
        }
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// The registry side of one [`super::ImageCache`].
pub(crate) struct Puller {
    config: RegistryConfig,
    problem: Option<String>,
    client: OnceLock<std::result::Result<Client, String>>,
    flights: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("config", &self.config)
            .field("problem", &self.problem)
            .finish_non_exhaustive()
    }
}

fn image_err(reference: &str, message: impl Into<String>) -> ImageError {
    ImageError::Image {
        reference: reference.to_string(),
        message: message.into(),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::io("image cache task", std::io::Error::other(e)))?
}

impl Puller {
    pub(crate) fn new(config: RegistryConfig) -> Self {
        let problem = config.problem();
        if let Some(p) = &problem {
            tracing::error!(problem = %p, "registry settings refused; registry images will not be pulled");
        }
        Puller {
            config,
            problem,
            client: OnceLock::new(),
            flights: Mutex::new(HashMap::new()),
        }
    }

    /// Makes sure the image `reference` names is unpacked in `cache`.
    pub(crate) async fn ensure(&self, cache: &Path, reference: &str) -> Result<UnpackedImage> {
        let parsed = parse_reference(reference)?;
        let key = parsed.whole();
        let flight = self.flight(&key);
        let _one_at_a_time = flight.lock().await;

        // Known on this node: no network.
        let known = {
            let (cache, reference, key) = (cache.to_path_buf(), reference.to_string(), key.clone());
            let digest = parsed.digest().map(str::to_string);
            blocking(move || {
                if let Some(d) = &digest
                    && let Some(img) = cached(&cache, &reference, d)?
                {
                    return Ok(Some(img));
                }
                match read_record(&cache, &key) {
                    Some(d) => cached(&cache, &reference, &d),
                    None => Ok(None),
                }
            })
            .await?
        };
        if let Some(img) = known {
            return Ok(img);
        }

        if let Some(p) = &self.problem {
            return Err(image_err(reference, p.clone()));
        }
        let client = self.client(reference)?;
        let auth = self.auth(reference, parsed.resolve_registry())?;
        let resolved = resolve(&client, &auth, &parsed, reference).await?;
        match &resolved.index_digest {
            Some(index) => tracing::info!(
                reference, digest = %resolved.digest, index = %index,
                "image reference resolved (through its index)"
            ),
            None => {
                tracing::info!(reference, digest = %resolved.digest, "image reference resolved")
            }
        }
        check_descriptors(reference, &resolved.manifest)?;
        let record = (parsed.digest() != Some(resolved.digest.as_str()))
            .then(|| (key.clone(), resolved.digest.clone()));

        let hex = digest_hex(&resolved.digest)?.to_string();
        let lock = {
            let (cache, hex) = (cache.to_path_buf(), hex.clone());
            blocking(move || lock_entry(&cache, &hex)).await?
        };
        let done = {
            let (cache, reference, digest) = (
                cache.to_path_buf(),
                reference.to_string(),
                resolved.digest.clone(),
            );
            blocking(move || cached_locked(&cache, &reference, &digest)).await?
        };
        let img = match done {
            Some(img) => {
                drop(lock);
                img
            }
            None => {
                pull_into_cache(&client, &parsed, cache, reference, &hex, &resolved, lock).await?
            }
        };
        if let Some((key, digest)) = record {
            let cache = cache.to_path_buf();
            blocking(move || write_record(&cache, &key, &digest)).await?;
        }
        Ok(img)
    }

    fn flight(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(key).and_then(Weak::upgrade) {
            return f;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let f = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_string(), Arc::downgrade(&f));
        f
    }

    fn client(&self, reference: &str) -> Result<Client> {
        self.client
            .get_or_init(|| build_client(&self.config))
            .clone()
            .map_err(|e| image_err(reference, e))
    }

    /// Credentials for `registry` from the auth file, if one is configured and names it.
    fn auth(&self, reference: &str, registry: &str) -> Result<RegistryAuth> {
        let Some(path) = &self.config.auth_file else {
            return Ok(RegistryAuth::Anonymous);
        };
        let text = std::fs::read(path).map_err(|e| {
            image_err(
                reference,
                format!("registry auth file {}: {e}", path.display()),
            )
        })?;
        registry_auth(&text, registry).map_err(|e| {
            image_err(
                reference,
                format!("registry auth file {}: {e}", path.display()),
            )
        })
    }
}

/// Downloads config and layers into a fresh entry, verifies them, unpacks and renames the entry
/// into place. Called with the digest's `lock` held and no complete entry present; the lock is
/// released when the entry is in place or gone — also when this future is dropped midway (the
/// unpacking thread keeps it until it is done).
async fn pull_into_cache(
    client: &Client,
    parsed: &Reference,
    cache: &Path,
    reference: &str,
    hex: &str,
    resolved: &Resolved,
    lock: Flock<File>,
) -> Result<UnpackedImage> {
    let build = {
        let (cache, hex) = (cache.to_path_buf(), hex.to_string());
        blocking(move || EntryBuild::start(&cache, &hex)).await?
    };
    let blobs = build.dir().join("blobs");
    tokio::fs::create_dir_all(&blobs)
        .await
        .ctx(|| format!("create {}", blobs.display()))?;

    let manifest = &resolved.manifest;
    let config_path = blobs.join(digest_hex(&manifest.config.digest)?);
    download(
        client,
        parsed,
        reference,
        "config",
        &manifest.config,
        &config_path,
    )
    .await?;
    let config_bytes = tokio::fs::read(&config_path)
        .await
        .ctx(|| format!("read {}", config_path.display()))?;
    let config = parse_config(reference, &config_bytes)?;

    // Owned jobs: a stream over borrowed descriptors trips the Send check of the
    // WorkerService future (higher-ranked lifetimes).
    let mut jobs: Vec<(Descriptor, PathBuf)> = Vec::new();
    for layer in &manifest.layers {
        if !jobs.iter().any(|(d, _)| d.digest == layer.digest) {
            jobs.push((layer.clone(), blobs.join(digest_hex(&layer.digest)?)));
        }
    }
    futures::stream::iter(jobs)
        .map(|(layer, path)| async move {
            download(client, parsed, reference, "layer", &layer, &path).await
        })
        .buffer_unordered(PARALLEL_LAYERS)
        .try_collect::<Vec<()>>()
        .await?;

    let layers: Vec<(PathBuf, String)> = manifest
        .layers
        .iter()
        .map(|l| Ok((blobs.join(digest_hex(&l.digest)?), l.digest.clone())))
        .collect::<Result<_>>()?;
    let (cache, reference, digest) = (
        cache.to_path_buf(),
        reference.to_string(),
        resolved.digest.clone(),
    );
    blocking(move || {
        let _lock = lock;
        let rootfs = build.rootfs();
        for (path, digest) in &layers {
            apply_verified_layer(path, digest, &rootfs)?;
        }
        std::fs::remove_dir_all(&blobs).ctx(|| format!("remove {}", blobs.display()))?;
        build.finish(&reference, &config)?;
        cached_locked(&cache, &reference, &digest)?
            .ok_or_else(|| image_err(&reference, "cache entry vanished after unpacking"))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registries_only() {
        for ok in [
            "127.0.0.1:5000",
            "127.3.4.5",
            "localhost:5000",
            "[::1]:5000",
            "[::1]",
        ] {
            assert!(is_loopback_registry(ok), "{ok}");
        }
        for bad in [
            "10.0.0.1:5000",
            "registry.example:5000",
            "http://127.0.0.1:5000",
            "127.0.0.1:port",
            "[::2]:5000",
            "",
        ] {
            assert!(!is_loopback_registry(bad), "{bad}");
        }
        let cfg = RegistryConfig {
            insecure: RegistryConfig::parse_list("127.0.0.1:5000, 10.1.1.1:5000,"),
            ..RegistryConfig::default()
        };
        assert_eq!(cfg.insecure.len(), 2);
        let problem = cfg.problem().unwrap_or_default();
        assert!(problem.contains("10.1.1.1:5000"), "{problem}");
        assert!(!problem.contains("127.0.0.1:5000"), "{problem}");
    }
}
