//! `oci-layout:` references: index and manifest selection, every blob verified against its digest.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{
    Descriptor, EntryBuild, Index, LayoutRef, MEDIA_DOCKER_LIST, MEDIA_INDEX, Manifest,
    REF_NAME_ANNOTATION, UnpackedImage, apply_verified_layer, cached, cached_locked, digest_hex,
    image_err, lock_entry, parse_config,
};
use crate::error::{ImageError, IoContext, Result};

pub(super) fn ensure_blocking(cache: &Path, reference: &str) -> Result<UnpackedImage> {
    let layout = LayoutRef::parse(reference)?;
    let index_path = layout.dir.join("index.json");
    let index_bytes = fs::read(&index_path).ctx(|| format!("read {}", index_path.display()))?;
    let index: Index = serde_json::from_slice(&index_bytes)
        .map_err(|e| image_err(reference, format!("index.json: {e}")))?;
    let mut desc = select_tagged(&index.manifests, &layout.tag).ok_or_else(|| {
        image_err(
            reference,
            format!("no manifest tagged {:?} in index.json", layout.tag),
        )
    })?;
    // A nested index (multi-platform image): descend to the linux/amd64 manifest.
    for _ in 0..4 {
        if desc.media_type != MEDIA_INDEX && desc.media_type != MEDIA_DOCKER_LIST {
            break;
        }
        let bytes = read_verified(&layout.dir, &desc)?;
        let nested: Index = serde_json::from_slice(&bytes)
            .map_err(|e| image_err(reference, format!("nested index: {e}")))?;
        desc = select_platform(&nested.manifests)
            .ok_or_else(|| image_err(reference, "nested index has no linux/amd64 manifest"))?;
    }
    let manifest_bytes = read_verified(&layout.dir, &desc)?;
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| image_err(reference, format!("manifest: {e}")))?;
    let hex = digest_hex(&desc.digest)?.to_string();

    if let Some(img) = cached(cache, reference, &desc.digest)? {
        return Ok(img);
    }
    let _lock = lock_entry(cache, &hex)?;
    if let Some(img) = cached_locked(cache, reference, &desc.digest)? {
        return Ok(img);
    }

    let build = EntryBuild::start(cache, &hex)?;
    let config_bytes = read_verified(&layout.dir, &manifest.config)?;
    let config = parse_config(reference, &config_bytes)?;
    let rootfs = build.rootfs();
    for layer in &manifest.layers {
        let path = blob_path(&layout.dir, &layer.digest)?;
        verify_file(&path, layer)?;
        apply_verified_layer(&path, &layer.digest, &rootfs)?;
    }
    build.finish(reference, &config)?;
    cached_locked(cache, reference, &desc.digest)?
        .ok_or_else(|| image_err(reference, "cache entry vanished after unpacking"))
}

fn select_tagged(manifests: &[Descriptor], tag: &str) -> Option<Descriptor> {
    let by_name = manifests.iter().find(|d| {
        d.annotations.get(REF_NAME_ANNOTATION).is_some_and(|n| {
            n == tag
                || n.rsplit_once(':')
                    .is_some_and(|(_, t)| t == tag && !t.contains('/'))
        })
    });
    if let Some(d) = by_name {
        return Some(d.clone());
    }
    // An untagged single-image layout answers to the default tag only.
    if tag == "latest"
        && manifests.len() == 1
        && !manifests[0].annotations.contains_key(REF_NAME_ANNOTATION)
    {
        return Some(manifests[0].clone());
    }
    None
}

pub(crate) fn select_platform(manifests: &[Descriptor]) -> Option<Descriptor> {
    manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .or_else(|| manifests.iter().find(|d| d.platform.is_none()))
        .cloned()
}

fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    Ok(dir.join("blobs").join("sha256").join(digest_hex(digest)?))
}

/// Hashes a blob file and checks digest (and size, when the descriptor gives one).
fn verify_file(path: &Path, desc: &Descriptor) -> Result<()> {
    let expected = digest_hex(&desc.digest)?;
    let mut file = File::open(path).ctx(|| format!("open blob {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut len: u64 = 0;
    loop {
        let n = file
            .read(&mut buf)
            .ctx(|| format!("read blob {}", path.display()))?;
        if n == 0 {
            break;
        }
        len += n as u64;
        hasher.update(&buf[..n]);
    }
    let actual = hex::encode(hasher.finalize());
    if actual != expected {
        return Err(ImageError::Checksum {
            digest: desc.digest.clone(),
            actual,
        });
    }
    if let Some(size) = desc.size
        && size != len
    {
        return Err(ImageError::Checksum {
            digest: desc.digest.clone(),
            actual: format!("{actual} (size {len}, descriptor says {size})"),
        });
    }
    Ok(())
}

/// Reads a small blob (index, manifest, config) and verifies it.
fn read_verified(dir: &Path, desc: &Descriptor) -> Result<Vec<u8>> {
    let path = blob_path(dir, &desc.digest)?;
    let bytes = fs::read(&path).ctx(|| format!("read blob {}", path.display()))?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != digest_hex(&desc.digest)? {
        return Err(ImageError::Checksum {
            digest: desc.digest.clone(),
            actual,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_blob(layout: &Path, bytes: &[u8]) -> serde_json::Value {
        let hex = hex::encode(Sha256::digest(bytes));
        let dir = layout.join("blobs/sha256");
        fs::create_dir_all(&dir).expect("blob dir");
        fs::write(dir.join(&hex), bytes).expect("write blob");
        serde_json::json!({"digest": format!("sha256:{hex}"), "size": bytes.len()})
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_data(&mut h, path, data).expect("append");
    }

    /// Two layers (gzip, then plain tar) with a whiteout, an opaque dir and a `..` entry.
    #[test]
    fn applies_whiteouts_and_refuses_traversal() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = tmp.path().join("layout");

        let mut l1 = tar::Builder::new(Vec::new());
        file(&mut l1, "a/f1", b"1");
        file(&mut l1, "a/f2", b"2");
        file(&mut l1, "b/x", b"x");
        let l1 = l1.into_inner().expect("tar");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &l1).expect("gzip");
        let l1 = gz.finish().expect("gzip");

        let mut l2 = tar::Builder::new(Vec::new());
        file(&mut l2, "a/.wh.f1", b"");
        file(&mut l2, "b/.wh..wh..opq", b"");
        file(&mut l2, "b/y", b"y");
        // A raw header naming `../evil` (the builder's path setters refuse it).
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..7].copy_from_slice(b"../evil");
        h.set_size(4);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        l2.append(&h, &b"evil"[..]).expect("append raw");
        let l2 = l2.into_inner().expect("tar");

        let config = serde_json::json!({"config": {"Cmd": ["/bin/app"], "Env": ["A=1"], "WorkingDir": "/w"}});
        let cfg = write_blob(&layout, &serde_json::to_vec(&config).expect("json"));
        let d1 = write_blob(&layout, &l1);
        let d2 = write_blob(&layout, &l2);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg["digest"], "size": cfg["size"]},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d1["digest"], "size": d1["size"]},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d2["digest"], "size": d2["size"]}
            ]
        });
        let m = write_blob(&layout, &serde_json::to_vec(&manifest).expect("json"));
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m["digest"], "size": m["size"],
            "annotations": {REF_NAME_ANNOTATION: "v1"}
        }]});
        fs::write(
            layout.join("index.json"),
            serde_json::to_vec(&index).expect("json"),
        )
        .expect("index");

        let cache = tmp.path().join("cache");
        let reference = format!("oci-layout:{}:v1", layout.display());
        let img = ensure_blocking(&cache, &reference).expect("unpack");
        assert_eq!(img.config.cmd, vec!["/bin/app".to_string()]);
        assert_eq!(img.config.working_dir, "/w");
        assert!(!img.rootfs.join("a/f1").exists(), "whiteout ignored");
        assert!(img.rootfs.join("a/f2").is_file());
        assert!(
            !img.rootfs.join("b/x").exists(),
            "opaque dir kept lower content"
        );
        assert!(img.rootfs.join("b/y").is_file());
        assert!(
            !img.rootfs
                .parent()
                .map(|p| p.join("evil").exists())
                .unwrap_or(true),
            "traversal entry escaped"
        );
        assert!(!tmp.path().join("evil").exists());
        // Second call: served from the cache.
        assert_eq!(ensure_blocking(&cache, &reference).expect("cached"), img);
        assert!(
            ensure_blocking(&cache, &format!("oci-layout:{}", layout.display())).is_err(),
            "no latest tag"
        );
    }
}
