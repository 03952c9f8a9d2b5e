//! Atomic, permission-aware file writes: readers (other components, the CLI, a file-watching
//! `CertSource`) must never see a half-written certificate or a briefly world-readable key.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::TlsError;

/// Mode for private keys.
pub const KEY_MODE: u32 = 0o600;
/// Mode for certificates.
pub const CERT_MODE: u32 = 0o644;

/// Writes `data` to a temporary sibling created with `mode`, syncs it and renames it over `path`.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), TlsError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| TlsError::io("create", &tmp, e))?;
        // The umask may have narrowed the mode; certificates must stay readable by peers.
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| TlsError::io("chmod", &tmp, e))?;
        f.write_all(data)
            .map_err(|e| TlsError::io("write", &tmp, e))?;
        f.sync_all().map_err(|e| TlsError::io("fsync", &tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| TlsError::io("rename", path, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Refuses a private key its group may write or others may touch at all (group read allowed).
pub fn check_key_permissions_group_read(path: &Path) -> Result<(), TlsError> {
    check_key_mode(path, 0o027)
}

/// Refuses a private key readable or writable by group/other.
pub fn check_key_permissions(path: &Path) -> Result<(), TlsError> {
    check_key_mode(path, 0o077)
}

/// Refuses a private key with any of the `forbidden` permission bits.
fn check_key_mode(path: &Path, forbidden: u32) -> Result<(), TlsError> {
    let meta = fs::metadata(path).map_err(|e| TlsError::io("stat", path, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(TlsError::InsecureKeyPermissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}
