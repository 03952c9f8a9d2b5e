//! One error type naming what failed: the file, the object key, the checksums.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Local file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The generation directory has no `manifest.json`: it was never sealed (or is being written).
    #[error("generation {} is incomplete: no manifest.json", dir.display())]
    Incomplete { dir: PathBuf },
    /// The durable copy has no `manifest.json`: the upload never finished (or was deleted).
    #[error("not a complete generation: {uri} has no manifest.json")]
    NotComplete { uri: String },
    /// `supported` is the newest version this build reads (it reads every one from 1 on).
    #[error(
        "manifest.json: unsupported format_version {found} (this build reads {} to {supported})",
        crate::manifest::OLDEST_FORMAT_VERSION
    )]
    UnsupportedFormat { found: u64, supported: u32 },
    #[error("manifest.json is invalid: {0}")]
    InvalidManifest(String),
    #[error("generation {} is already sealed (manifest.json exists)", dir.display())]
    AlreadySealed { dir: PathBuf },
    /// A file the manifest lists is absent.
    #[error("{file}: listed in the manifest but missing")]
    MissingFile { file: String },
    #[error("{file}: size {actual} bytes, manifest says {expected}")]
    SizeMismatch {
        file: String,
        expected: u64,
        actual: u64,
    },
    #[error("{file}: sha256 {actual}, manifest says {expected}")]
    ChecksumMismatch {
        file: String,
        expected: String,
        actual: String,
    },
    /// A chunk of a memory image does not match its BLAKE3 digest in the manifest (found when
    /// the chunk was read, or by a full verification).
    #[error(
        "memory image {file} chunk {chunk} (bytes {start}..{end}) is damaged (checksum mismatch): blake3 {actual}, \
         manifest says {expected}"
    )]
    ChunkMismatch {
        file: String,
        chunk: u64,
        start: u64,
        end: u64,
        expected: String,
        actual: String,
    },
    /// An object-store call failed.
    #[error("object {key}: {source}")]
    Object {
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// A compressed object could not be decoded.
    /// A stored object that does not open under this node's data key: tampered with, moved from
    /// another path (another actor's or generation's), sealed under another key, or plaintext.
    #[error("object {key} refused: {message}")]
    Unauthentic { key: String, message: String },
    /// A stored object sealed under a data key this node does not hold (its keys directory is
    /// not the store's): not counted as damage, the copy may be intact.
    #[error("object {key} cannot be opened with this node's snapshot keys: {message}")]
    ForeignKey { key: String, message: String },
    /// The snapshot keys (KEK, data key) could not be created, read or used.
    #[error("snapshot keys: {0}")]
    Keys(String),
    #[error("object {key}: zstd stream: {source}")]
    Decompress {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("store url {url:?}: {message}")]
    StoreUrl { url: String, message: String },
    /// A key or uri that does not name a generation of this store.
    #[error("{what} {value:?}: {message}")]
    InvalidName {
        what: &'static str,
        value: String,
        message: String,
    },
    #[error("archive {}: entry {entry:?}: {message}", archive.display())]
    Archive {
        archive: PathBuf,
        entry: String,
        message: String,
    },
    /// The arguments do not fit the fidelity (e.g. ROOTFS without an upper dir).
    #[error("{0}")]
    InvalidInput(String),
    #[error("{what}: background task failed: {message}")]
    Task { what: String, message: String },
    /// An upload ran longer than half the store's partial-upload grace age: a sweep may already
    /// have deleted its objects, so its `manifest.json` was not written (and what it wrote was
    /// removed). Retrying starts a fresh upload.
    #[error(
        "upload to {uri} still unfinished after {elapsed:?}, past its limit of {limit:?} (half the \
         partial-upload grace age): manifest.json not written, a sweep may already have removed \
         its objects"
    )]
    UploadTooSlow {
        uri: String,
        elapsed: std::time::Duration,
        limit: std::time::Duration,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn object(key: impl std::fmt::Display, source: object_store::Error) -> Self {
        match crate::crypto::open_error(&source) {
            Some((message, true)) => {
                return Self::Unauthentic {
                    key: key.to_string(),
                    message,
                };
            }
            Some((message, false)) => {
                return Self::ForeignKey {
                    key: key.to_string(),
                    message,
                };
            }
            None => {}
        }
        Self::Object {
            key: key.to_string(),
            source,
        }
    }

    pub(crate) fn task(what: impl Into<String>, e: tokio::task::JoinError) -> Self {
        Self::Task {
            what: what.into(),
            message: e.to_string(),
        }
    }

    /// True when a generation's own content is wrong, as [`crate::verify`] found it: the manifest
    /// does not parse, or a file it lists is missing, has another size, another sha256 or a chunk
    /// whose BLAKE3 differs ([`crate::read_verified_chunk`] finds that too). Such a
    /// copy never verifies again, unlike one behind an I/O error (retry), without a manifest
    /// (never sealed) or in a format this build does not read (not damaged).
    pub fn is_corrupt(&self) -> bool {
        matches!(
            self,
            Self::InvalidManifest(_)
                | Self::MissingFile { .. }
                | Self::SizeMismatch { .. }
                | Self::ChecksumMismatch { .. }
                | Self::ChunkMismatch { .. }
                | Self::Unauthentic { .. }
        )
    }

    /// The file (relative to the generation directory) a corruption error is about.
    pub fn corrupt_file(&self) -> Option<&str> {
        match self {
            Self::InvalidManifest(_) => Some(crate::MANIFEST_FILE),
            Self::MissingFile { file }
            | Self::SizeMismatch { file, .. }
            | Self::ChecksumMismatch { file, .. }
            | Self::ChunkMismatch { file, .. } => Some(file),
            Self::Unauthentic { key, .. } => Some(key),
            _ => None,
        }
    }

    /// True when the cause is a full disk (ENOSPC), anywhere in the source chain.
    pub fn is_no_space(&self) -> bool {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && (io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error() == Some(28))
            {
                return true;
            }
            cur = e.source();
        }
        // object_store's local backend flattens some I/O errors into text.
        self.to_string().contains("No space left on device")
    }
}
