//! The key hierarchy: a key-encryption key (KEK) wraps the data key; the data key seals objects.
//!
//! - [`KeyEncryptionKey`] is the interface a cloud KMS can implement later (wrap and unwrap a
//!   few bytes, nothing else); [`FileKek`] is the one built in: 32 random bytes in
//!   `<keys dir>/kek-<uuid>.key`, mode 0600, created by `ate up` (or `ate keys init`).
//! - The data key (32 random bytes) lives only wrapped, in `<keys dir>/data-key.json`, which
//!   names the KEK that wraps it. [`SnapshotKeys::load`] unwraps it once per process.
//! - [`rotate`] makes a new KEK, re-wraps the data key under it (tmp + rename) and removes the
//!   old KEK files. The data key itself does not change, so nothing stored is re-encrypted and
//!   content-addressed dedupe keeps working across the rotation.

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Data key file inside a keys directory.
pub const DATA_KEY_FILE: &str = "data-key.json";
/// Bytes of every key (AES-256).
pub const KEY_BYTES: usize = 32;
/// Bound into every wrap as associated data, with the data key's id.
const WRAP_CONTEXT: &[u8] = b"ate snapshot data key v1\0";

/// A key-encryption key: wraps and unwraps data keys. A KMS-backed implementation calls the
/// KMS's Encrypt/Decrypt with `aad` as the encryption context.
pub trait KeyEncryptionKey: Send + Sync + fmt::Debug {
    /// Stable id, recorded beside every key it wraps.
    fn id(&self) -> &str;
    fn wrap(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>>;
    fn unwrap(&self, wrapped: &[u8], aad: &[u8]) -> Result<Vec<u8>>;
}

/// A KEK held in a local file (hex, 0600).
pub struct FileKek {
    id: String,
    key: LessSafeKey,
}

impl fmt::Debug for FileKek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileKek").field("id", &self.id).finish()
    }
}

fn key_error(message: impl Into<String>) -> Error {
    Error::Keys(message.into())
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    aws_lc_rs::rand::fill(&mut out).map_err(|_| key_error("no random bytes from aws-lc"))?;
    Ok(out)
}

fn aes_key(bytes: &[u8]) -> Result<LessSafeKey> {
    UnboundKey::new(&AES_256_GCM, bytes)
        .map(LessSafeKey::new)
        .map_err(|_| key_error("not an AES-256 key"))
}

/// `<dir>/<id>.key`; KEK ids start with `kek-`.
fn kek_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.key"))
}

fn check_id(id: &str) -> Result<()> {
    if !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Ok(())
    } else {
        Err(key_error(format!(
            "key id {id:?} is not 1-64 of [A-Za-z0-9_-]"
        )))
    }
}

/// Writes `bytes` to `path` with mode 0600 (tmp + fsync + rename; never world-readable).
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("write", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| Error::io("rename", &tmp, e))?;
    if let Some(dir) = path.parent() {
        crate::generation::fsync_dir(dir)?;
    }
    Ok(())
}

impl FileKek {
    /// A new random KEK written to `<dir>/<id>.key` (0600; ids are `kek-<uuid>`).
    pub fn create(dir: &Path) -> Result<Self> {
        let id = format!("kek-{}", uuid::Uuid::new_v4().simple());
        let key = random::<KEY_BYTES>()?;
        write_private(
            &kek_path(dir, &id),
            format!("{}\n", hex::encode(key)).as_bytes(),
        )?;
        Ok(Self {
            key: aes_key(&key)?,
            id,
        })
    }

    /// The KEK `id` from `dir`; refused when the file is readable by group or others.
    pub fn load(dir: &Path, id: &str) -> Result<Self> {
        check_id(id)?;
        if !id.starts_with("kek-") {
            return Err(key_error(format!("KEK id {id:?} does not start with kek-")));
        }
        let path = kek_path(dir, id);
        let meta = fs::metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(key_error(format!(
                "{}: mode {:o} lets others read the key-encryption key; chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            )));
        }
        let text = fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
        let bytes = hex::decode(text.trim())
            .map_err(|e| key_error(format!("{}: not hex: {e}", path.display())))?;
        if bytes.len() != KEY_BYTES {
            return Err(key_error(format!(
                "{}: {} bytes, expected {KEY_BYTES}",
                path.display(),
                bytes.len()
            )));
        }
        Ok(Self {
            key: aes_key(&bytes)?,
            id: id.to_string(),
        })
    }
}

impl KeyEncryptionKey for FileKek {
    fn id(&self) -> &str {
        &self.id
    }

    fn wrap(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
        let nonce = random::<NONCE_LEN>()?;
        let mut out = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out,
            )
            .map_err(|_| key_error("wrap failed"))?;
        let mut wrapped = nonce.to_vec();
        wrapped.extend_from_slice(&out);
        Ok(wrapped)
    }

    fn unwrap(&self, wrapped: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
        let (nonce, sealed) = wrapped
            .split_at_checked(NONCE_LEN)
            .ok_or_else(|| key_error("wrapped key too short"))?;
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| key_error("wrapped key: bad nonce"))?;
        let mut buf = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad), &mut buf)
            .map_err(|_| {
                key_error(format!(
                    "key-encryption key {} does not unwrap this data key (wrong KEK or a tampered key file)",
                    self.id
                ))
            })?;
        Ok(plain.to_vec())
    }
}

/// `data-key.json`: the data key wrapped by one KEK.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WrappedDataKey {
    /// The data key's id, written into the header of every object it seals.
    id: String,
    kek_id: String,
    /// hex of nonce ‖ ciphertext ‖ tag.
    wrapped: String,
    created_unix_ms: i64,
}

fn wrap_aad(data_key_id: &str) -> Vec<u8> {
    let mut aad = WRAP_CONTEXT.to_vec();
    aad.extend_from_slice(data_key_id.as_bytes());
    aad
}

fn read_wrapped(dir: &Path) -> Result<WrappedDataKey> {
    let path = dir.join(DATA_KEY_FILE);
    let bytes = fs::read(&path).map_err(|e| Error::io("read", &path, e))?;
    let w: WrappedDataKey = serde_json::from_slice(&bytes)
        .map_err(|e| key_error(format!("{}: {e}", path.display())))?;
    check_id(&w.id)?;
    check_id(&w.kek_id)?;
    Ok(w)
}

fn write_wrapped(dir: &Path, w: &WrappedDataKey) -> Result<()> {
    let bytes =
        serde_json::to_vec_pretty(w).map_err(|e| key_error(format!("serialize data key: {e}")))?;
    write_private(&dir.join(DATA_KEY_FILE), &bytes)
}

/// The unwrapped data key of a keys directory, ready to seal and open objects.
#[derive(Clone)]
pub struct SnapshotKeys {
    pub(crate) data_key_id: String,
    pub(crate) data_key: [u8; KEY_BYTES],
    /// Keys the names of content-addressed chunks (see `crate::crypto::chunk_name`).
    pub(crate) name_key: [u8; KEY_BYTES],
    /// The keys directory, handed to page sources (they load the keys themselves).
    pub(crate) dir: Option<PathBuf>,
    /// Whether objects written before encryption (no header) are read as they are.
    pub(crate) legacy_plaintext: bool,
}

impl fmt::Debug for SnapshotKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotKeys")
            .field("data_key_id", &self.data_key_id)
            .field("dir", &self.dir)
            .field("legacy_plaintext", &self.legacy_plaintext)
            .finish_non_exhaustive()
    }
}

impl SnapshotKeys {
    /// Creates `dir` (0700) with a new KEK and a new data key wrapped by it, unless
    /// `data-key.json` is already there; then loads it. What `ate up` calls at every start.
    pub fn init(dir: &Path) -> Result<Self> {
        if !dir.join(DATA_KEY_FILE).exists() {
            fs::create_dir_all(dir).map_err(|e| Error::io("create dir", dir, e))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io("chmod", dir, e))?;
            let kek = FileKek::create(dir)?;
            let id = format!("dk-{}", uuid::Uuid::new_v4().simple());
            let key = random::<KEY_BYTES>()?;
            let wrapped = kek.wrap(&key, &wrap_aad(&id))?;
            write_wrapped(
                dir,
                &WrappedDataKey {
                    id,
                    kek_id: kek.id().to_string(),
                    wrapped: hex::encode(wrapped),
                    created_unix_ms: now_ms(),
                },
            )?;
        }
        Self::load(dir)
    }

    /// Loads `dir/data-key.json` and unwraps it with the KEK file it names.
    pub fn load(dir: &Path) -> Result<Self> {
        let w = read_wrapped(dir)?;
        let kek = FileKek::load(dir, &w.kek_id)?;
        let mut keys = Self::unwrap_with(&w, &kek)?;
        keys.dir = Some(dir.to_path_buf());
        Ok(keys)
    }

    fn unwrap_with(w: &WrappedDataKey, kek: &dyn KeyEncryptionKey) -> Result<Self> {
        let wrapped = hex::decode(&w.wrapped)
            .map_err(|e| key_error(format!("{DATA_KEY_FILE}: wrapped: not hex: {e}")))?;
        let key = kek.unwrap(&wrapped, &wrap_aad(&w.id))?;
        Self::from_data_key(&w.id, &key)
    }

    /// Keys from a raw data key (tests, and a KMS implementation that unwrapped it itself).
    pub fn from_data_key(id: &str, key: &[u8]) -> Result<Self> {
        check_id(id)?;
        let data_key: [u8; KEY_BYTES] = key
            .try_into()
            .map_err(|_| key_error(format!("data key is {} bytes, expected 32", key.len())))?;
        let name_key = super::derive(&data_key, b"", b"ate chunk names v1")?;
        Ok(Self {
            data_key_id: id.to_string(),
            data_key,
            name_key,
            dir: None,
            legacy_plaintext: false,
        })
    }

    /// Read objects written before encryption (no header) as plaintext. Off by default: a
    /// plaintext object is otherwise refused as unauthenticated (anyone who can write to the
    /// store could plant one).
    pub fn with_legacy_plaintext(mut self, allow: bool) -> Self {
        self.legacy_plaintext = allow;
        self
    }

    pub fn data_key_id(&self) -> &str {
        &self.data_key_id
    }

    /// The keys directory these keys were loaded from.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn legacy_plaintext(&self) -> bool {
        self.legacy_plaintext
    }
}

/// What a rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    pub old_kek: String,
    pub new_kek: String,
    pub data_key: String,
}

/// New KEK in `dir`; the data key re-wrapped under it (written atomically); every other KEK file
/// removed. Processes already running keep their unwrapped data key; new ones read the new files.
pub fn rotate(dir: &Path) -> Result<Rotation> {
    let w = read_wrapped(dir)?;
    let old = FileKek::load(dir, &w.kek_id)?;
    let wrapped = hex::decode(&w.wrapped)
        .map_err(|e| key_error(format!("{DATA_KEY_FILE}: wrapped: not hex: {e}")))?;
    let key = old.unwrap(&wrapped, &wrap_aad(&w.id))?;
    let new = FileKek::create(dir)?;
    let rewrapped = new.wrap(&key, &wrap_aad(&w.id))?;
    write_wrapped(
        dir,
        &WrappedDataKey {
            id: w.id.clone(),
            kek_id: new.id().to_string(),
            wrapped: hex::encode(rewrapped),
            created_unix_ms: w.created_unix_ms,
        },
    )?;
    // Only now is the old KEK unused; remove every KEK file but the new one.
    for entry in fs::read_dir(dir).map_err(|e| Error::io("read dir", dir, e))? {
        let entry = entry.map_err(|e| Error::io("read dir", dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("kek-") && name.ends_with(".key") && name != format!("{}.key", new.id())
        {
            fs::remove_file(entry.path()).map_err(|e| Error::io("remove", entry.path(), e))?;
        }
    }
    Ok(Rotation {
        old_kek: w.kek_id,
        new_kek: new.id().to_string(),
        data_key: w.id,
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_load_and_rotate_keep_the_data_key() {
        let dir = tempfile::tempdir().expect("tmp");
        let keys = dir.path().join("keys");
        let a = SnapshotKeys::init(&keys).expect("init");
        let mode = fs::metadata(&keys).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let kek_files: Vec<_> = fs::read_dir(&keys)
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("kek-"))
            .collect();
        assert_eq!(kek_files.len(), 1);
        let mode = kek_files[0].metadata().expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "KEK file mode");
        // The data key file holds no key in the clear.
        let text = fs::read_to_string(keys.join(DATA_KEY_FILE)).expect("read");
        assert!(!text.contains(&hex::encode(a.data_key)));

        let again = SnapshotKeys::init(&keys).expect("init again loads");
        assert_eq!(again.data_key, a.data_key);

        let r = rotate(&keys).expect("rotate");
        assert_ne!(r.old_kek, r.new_kek);
        assert!(!kek_path(&keys, &r.old_kek).exists(), "old KEK removed");
        let b = SnapshotKeys::load(&keys).expect("load after rotate");
        assert_eq!(b.data_key, a.data_key, "same data key, new wrapping");
        assert_eq!(b.data_key_id, a.data_key_id);
    }

    #[test]
    fn a_readable_kek_or_a_tampered_wrap_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let keys = dir.path().join("keys");
        SnapshotKeys::init(&keys).expect("init");
        let w = read_wrapped(&keys).expect("wrapped");
        let path = kek_path(&keys, &w.kek_id);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = SnapshotKeys::load(&keys).expect_err("world-readable KEK");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");

        let mut bad = w.clone();
        bad.id = "dk-other".into();
        write_wrapped(&keys, &bad).expect("write");
        let err = SnapshotKeys::load(&keys).expect_err("id swapped");
        assert!(err.to_string().contains("does not unwrap"), "{err}");
    }
}
