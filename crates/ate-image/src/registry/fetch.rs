//! Resolving a reference to its manifest and streaming blobs, each verified against its digest.

use std::path::Path;

use futures::StreamExt;
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use super::{ENV_INSECURE, image_err};
use crate::error::{ImageError, IoContext, Result};
use crate::{Descriptor, MEDIA_DOCKER_LIST, MEDIA_INDEX, Manifest, digest_hex, select_platform};

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

/// What a reference resolved to.
pub(super) struct Resolved {
    pub(super) digest: String,
    pub(super) manifest: Manifest,
    pub(super) index_digest: Option<String>,
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

/// Parses a registry reference; only sha256 digests.
pub(super) fn parse_reference(reference: &str) -> Result<Reference> {
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
pub(super) async fn resolve(
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
pub(super) fn check_descriptors(reference: &str, manifest: &Manifest) -> Result<()> {
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
pub(super) async fn download(
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
fn pull_err(reference: &str, what: &str, e: OciDistributionError) -> ImageError {
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
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(matches!(e, Err(ImageError::Image { .. })), "{e:?}");
    }
}
