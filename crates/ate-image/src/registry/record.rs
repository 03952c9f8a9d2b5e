//! Tags resolved on this node, recorded under `<cache>/refs/` so they keep their digest.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::image_err;
use crate::digest_hex;
use crate::error::{IoContext, Result};

/// A tag (or index digest) resolved on this node: `<cache>/refs/<sha256 of the reference>`.
#[derive(Serialize, Deserialize)]
struct Record {
    reference: String,
    digest: String,
}

fn record_path(cache: &Path, key: &str) -> PathBuf {
    cache
        .join("refs")
        .join(hex::encode(Sha256::digest(key.as_bytes())))
}

/// The digest recorded for `key` on this node, if any (an unreadable record is ignored).
pub(super) fn read_record(cache: &Path, key: &str) -> Option<String> {
    let bytes = std::fs::read(record_path(cache, key)).ok()?;
    let record: Record = serde_json::from_slice(&bytes).ok()?;
    (record.reference == key && digest_hex(&record.digest).is_ok()).then_some(record.digest)
}

pub(super) fn write_record(cache: &Path, key: &str, digest: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
