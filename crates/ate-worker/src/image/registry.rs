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

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use nix::fcntl::Flock;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use super::{
    Descriptor, EntryBuild, MEDIA_DOCKER_LIST, MEDIA_INDEX, Manifest, UnpackedImage,
    apply_verified_layer, cached, cached_locked, digest_hex, lock_entry, parse_config,
    select_platform,
};
use crate::error::{IoContext, Result, SandboxError};

/// Comma-separated `host:port` list of loopback registries spoken to over plain HTTP.
pub const ENV_INSECURE: &str = "ATE_INSECURE_REGISTRIES";
/// A Docker-style `config.json` (`{"auths": {"host:port": {"auth": "<base64 user:pass>"}}}`).
pub const ENV_AUTH_FILE: &str = "ATE_REGISTRY_AUTH_FILE";
/// PEM certificates trusted for registries in addition to the system's roots.
pub const ENV_CA_FILE: &str = "ATE_REGISTRY_CA_FILE";

const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const ACCEPTED_MANIFESTS: &[&str] = &[
    MEDIA_OCI_MANIFEST,
    MEDIA_DOCKER_MANIFEST,
    MEDIA_INDEX,
    MEDIA_DOCKER_LIST,
];
const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
/// Layer types `apply_layer` reads (plain or gzip tar; it sniffs the gzip magic itself).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];
const MAX_MANIFEST_BYTES: usize = 4 << 20;
const MAX_CONFIG_BYTES: u64 = 8 << 20;
const PARALLEL_LAYERS: usize = 3;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

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

/// A tag (or index digest) resolved on this node: `<cache>/refs/<sha256 of the reference>`.
#[derive(Serialize, Deserialize)]
struct Record {
    reference: String,
    digest: String,
}

/// What a reference resolved to.
struct Resolved {
    digest: String,
    manifest: Manifest,
    index_digest: Option<String>,
}

/// The fields of any manifest or index needed to tell them apart.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

fn image_err(reference: &str, message: impl Into<String>) -> SandboxError {
    SandboxError::Image {
        reference: reference.to_string(),
        message: message.into(),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SandboxError::io("image cache task", std::io::Error::other(e)))?
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

fn build_client(config: &RegistryConfig) -> std::result::Result<Client, String> {
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

/// Parses a registry reference; only sha256 digests.
fn parse_reference(reference: &str) -> Result<Reference> {
    let parsed = Reference::try_from(reference).map_err(|e| {
        image_err(
            reference,
            format!(
                "not an image reference ({e}); use oci-layout:<dir>[:<tag>], host[:port]/repo[:tag] or host[:port]/repo@sha256:<hex>"
            ),
        )
    })?;
    if let Some(d) = parsed.digest() {
        digest_hex(d).map_err(|_| {
            image_err(
                reference,
                format!("digest {d} is not sha256:<64 lowercase hex>"),
            )
        })?;
    }
    Ok(parsed)
}

/// Fetches the manifest `parsed` names, descending through an index to the linux/amd64 manifest;
/// every manifest's sha256 is computed here and checked against the digest that named it.
async fn resolve(
    client: &Client,
    auth: &RegistryAuth,
    parsed: &Reference,
    reference: &str,
) -> Result<Resolved> {
    let mut target = parsed.clone();
    let mut expected_size: Option<u64> = None;
    let mut index_digest = None;
    for _ in 0..3 {
        let what = match target.digest() {
            Some(d) => format!("manifest {d}"),
            None => format!("manifest for tag {:?}", target.tag().unwrap_or("latest")),
        };
        let (body, _) = client
            .pull_manifest_raw(&target, auth, ACCEPTED_MANIFESTS)
            .await
            .map_err(|e| pull_err(reference, &what, e))?;
        if body.len() > MAX_MANIFEST_BYTES {
            return Err(image_err(
                reference,
                format!(
                    "{what} is {} bytes (limit {MAX_MANIFEST_BYTES})",
                    body.len()
                ),
            ));
        }
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if let Some(want) = target.digest()
            && want != digest
        {
            return Err(image_err(
                reference,
                format!("digest mismatch: {what} hashes to {digest}; refused"),
            ));
        }
        if let Some(size) = expected_size
            && size != body.len() as u64
        {
            return Err(image_err(
                reference,
                format!(
                    "digest mismatch: {what} is {} bytes, its descriptor says {size}; refused",
                    body.len()
                ),
            ));
        }
        let raw: RawManifest = serde_json::from_slice(&body)
            .map_err(|e| image_err(reference, format!("{what} is not a valid manifest: {e}")))?;
        if raw.schema_version != Some(2) {
            return Err(image_err(
                reference,
                format!(
                    "unsupported media type: {what} has schemaVersion {:?} (only 2)",
                    raw.schema_version
                ),
            ));
        }
        let media_type = raw.media_type.clone().unwrap_or_else(|| {
            if raw.manifests.is_some() {
                MEDIA_INDEX.to_string()
            } else {
                MEDIA_OCI_MANIFEST.to_string()
            }
        });
        match media_type.as_str() {
            MEDIA_INDEX | MEDIA_DOCKER_LIST => {
                index_digest.get_or_insert(digest);
                let entries = raw.manifests.unwrap_or_default();
                let entry = select_platform(&entries).ok_or_else(|| {
                    image_err(
                        reference,
                        format!("{what}: the index has no linux/amd64 image"),
                    )
                })?;
                digest_hex(&entry.digest)?;
                target = parsed.clone_with_digest(entry.digest.clone());
                expected_size = entry.size;
            }
            MEDIA_OCI_MANIFEST | MEDIA_DOCKER_MANIFEST => {
                let config = raw.config.ok_or_else(|| {
                    image_err(reference, format!("{what} has no config descriptor"))
                })?;
                return Ok(Resolved {
                    digest,
                    manifest: Manifest {
                        config,
                        layers: raw.layers,
                    },
                    index_digest,
                });
            }
            other => {
                return Err(image_err(
                    reference,
                    format!("unsupported media type {other:?} for {what} (not an image)"),
                ));
            }
        }
    }
    Err(image_err(reference, "indexes nested more than 2 deep"))
}

/// Refuses, before anything is downloaded, descriptors this cache cannot verify or unpack.
fn check_descriptors(reference: &str, manifest: &Manifest) -> Result<()> {
    let check = |what: &str, d: &Descriptor, types: &[&str], max: Option<u64>| -> Result<()> {
        digest_hex(&d.digest).map_err(|_| {
            image_err(
                reference,
                format!(
                    "{what} digest {:?} is not sha256:<64 lowercase hex>",
                    d.digest
                ),
            )
        })?;
        if !types.contains(&d.media_type.as_str()) {
            return Err(image_err(
                reference,
                format!(
                    "unsupported media type {:?} for {what} {} (supported: {})",
                    d.media_type,
                    d.digest,
                    types.join(", ")
                ),
            ));
        }
        let size = d
            .size
            .ok_or_else(|| image_err(reference, format!("{what} {} has no size", d.digest)))?;
        if let Some(max) = max
            && size > max
        {
            return Err(image_err(
                reference,
                format!("{what} {} is {size} bytes (limit {max})", d.digest),
            ));
        }
        Ok(())
    };
    check(
        "config",
        &manifest.config,
        CONFIG_TYPES,
        Some(MAX_CONFIG_BYTES),
    )?;
    for layer in &manifest.layers {
        check("layer", layer, LAYER_TYPES, None)?;
    }
    Ok(())
}

/// Streams one blob into `dest`, hashing it on the way; refused (and `dest` left for the
/// entry's cleanup) unless its sha256 and size are the descriptor's.
async fn download(
    client: &Client,
    parsed: &Reference,
    reference: &str,
    what: &str,
    desc: &Descriptor,
    dest: &Path,
) -> Result<()> {
    let label = format!("{what} {}", desc.digest);
    let size = desc
        .size
        .ok_or_else(|| image_err(reference, format!("{label} has no size")))?;
    let mut stream = client
        .pull_blob_stream(parsed, desc.digest.as_str())
        .await
        .map_err(|e| pull_err(reference, &label, e))?;
    let mut file = tokio::fs::File::create(dest)
        .await
        .ctx(|| format!("create {}", dest.display()))?;
    let mut hasher = Sha256::new();
    let mut len: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            // oci-client's own digest check fired at the end of the stream: every byte has been
            // seen; the check below says what they hash to.
            Err(e) if e.get_ref().is_some_and(|i| i.is::<DigestError>()) => break,
            Err(e) => {
                return Err(image_err(
                    reference,
                    format!("registry unreachable while reading {label}: {}", chain(&e)),
                ));
            }
        };
        len += chunk.len() as u64;
        if len > size {
            return Err(image_err(
                reference,
                format!(
                    "digest mismatch: {label} is longer than its descriptor's {size} bytes; refused"
                ),
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .ctx(|| format!("write {}", dest.display()))?;
    }
    file.flush()
        .await
        .ctx(|| format!("write {}", dest.display()))?;
    let actual = hex::encode(hasher.finalize());
    if actual != digest_hex(&desc.digest)? {
        return Err(image_err(
            reference,
            format!("digest mismatch: {label} hashes to sha256:{actual}; refused"),
        ));
    }
    if len != size {
        return Err(image_err(
            reference,
            format!("digest mismatch: {label} is {len} bytes, its descriptor says {size}; refused"),
        ));
    }
    Ok(())
}

/// A registry failure as "what failed" for the reference.
fn pull_err(reference: &str, what: &str, e: OciDistributionError) -> SandboxError {
    let message = match e {
        OciDistributionError::RegistryError { envelope, url } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            let detail: Vec<String> = envelope
                .errors
                .iter()
                .map(|e| format!("{:?}: {}", e.code, e.message))
                .collect();
            let detail = detail.join("; ");
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                format!("not found: {what} ({detail}; {url})")
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                format!("not authorized to pull {what} ({detail}; {url})")
            } else {
                format!("registry refused {what}: {detail} ({url})")
            }
        }
        OciDistributionError::ServerError { code: 404, url, .. }
        | OciDistributionError::ImageManifestNotFoundError(url) => {
            format!("not found: {what} ({url})")
        }
        OciDistributionError::ServerError { code, url, message } => {
            format!(
                "registry answered {code} for {what} ({url}): {}",
                message.trim()
            )
        }
        OciDistributionError::UnauthorizedError { url } => {
            format!("not authorized to pull {what} ({url}); check the registry auth file")
        }
        OciDistributionError::AuthenticationFailure(reason) => {
            format!(
                "registry authentication failed for {what}: {}",
                reason.trim()
            )
        }
        OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
            format!(
                "digest mismatch: {what} expected {expected}, content hashes to {actual}; refused"
            )
        }
        OciDistributionError::UnsupportedMediaTypeError(t) => {
            format!("unsupported media type {t:?} for {what}")
        }
        OciDistributionError::UnsupportedSchemaVersionError(v) => {
            format!("unsupported media type: {what} has schemaVersion {v} (only 2)")
        }
        OciDistributionError::RequestError(e) if e.is_connect() || e.is_timeout() => {
            let detail = chain(&e);
            let hint = if detail.contains("https://") && detail.contains("corrupt message") {
                format!(
                    " (a plain-HTTP registry? only loopback ones listed in {ENV_INSECURE} are spoken to without TLS)"
                )
            } else {
                String::new()
            };
            format!("registry unreachable fetching {what}: {detail}{hint}")
        }
        other => format!("fetching {what}: {}", chain(&other)),
    };
    image_err(reference, message)
}

/// An error and its sources, `: `-joined.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn record_path(cache: &Path, key: &str) -> PathBuf {
    cache
        .join("refs")
        .join(hex::encode(Sha256::digest(key.as_bytes())))
}

/// The digest recorded for `key` on this node, if any (an unreadable record is ignored).
fn read_record(cache: &Path, key: &str) -> Option<String> {
    let bytes = std::fs::read(record_path(cache, key)).ok()?;
    let record: Record = serde_json::from_slice(&bytes).ok()?;
    (record.reference == key && digest_hex(&record.digest).is_ok()).then_some(record.digest)
}

fn write_record(cache: &Path, key: &str, digest: &str) -> Result<()> {
    let path = record_path(cache, key);
    let dir = cache.join("refs");
    std::fs::create_dir_all(&dir).ctx(|| format!("create {}", dir.display()))?;
    let json = serde_json::to_vec_pretty(&Record {
        reference: key.to_string(),
        digest: digest.to_string(),
    })
    .map_err(|e| image_err(key, e.to_string()))?;
    // A temp name of its own per writer (process and call), so concurrent pulls of one tag —
    // from other workers or other caches in this process — never rename each other's file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
    std::fs::write(&tmp, json).ctx(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).ctx(|| format!("rename {}", path.display()))
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
fn registry_auth(config: &[u8], registry: &str) -> std::result::Result<RegistryAuth, String> {
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

    #[test]
    fn parses_registry_references() {
        let r = parse_reference("registry.example:5000/repo/name:v1").expect("tag ref");
        assert_eq!(r.registry(), "registry.example:5000");
        assert_eq!(r.repository(), "repo/name");
        assert_eq!(r.tag(), Some("v1"));
        let hex = "a".repeat(64);
        let r = parse_reference(&format!("127.0.0.1:5000/counter@sha256:{hex}")).expect("digest");
        assert_eq!(r.digest(), Some(format!("sha256:{hex}").as_str()));
        assert!(parse_reference("Not A Ref").is_err());
        let e = parse_reference(&format!("r.example/x@sha512:{}", "a".repeat(128)));
        assert!(matches!(e, Err(SandboxError::Image { .. })), "{e:?}");
    }

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

    #[test]
    fn records_round_trip() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let digest = format!("sha256:{}", "b".repeat(64));
        assert_eq!(read_record(tmp.path(), "r.example/x:v1"), None);
        write_record(tmp.path(), "r.example/x:v1", &digest).expect("write");
        assert_eq!(read_record(tmp.path(), "r.example/x:v1"), Some(digest));
        assert_eq!(read_record(tmp.path(), "r.example/x:v2"), None);
    }
}
