//! Snapshot generations of an actor: the on-disk layout, `manifest.json`, archives of the overlay
//! upper dir and volumes, verification, and durable copies in an object store, see docs/snapshots.md.
//!
//! A generation directory looks like
//!
//! ```text
//! <gen>/criu/…               CRIU images (MEMORY fidelity only), written by `runc checkpoint`
//! <gen>/rootfs.tar           the overlay upper dir (absent for VOLUMES fidelity)
//! <gen>/volumes/<name>.tar   one archive per volume
//! <gen>/manifest.json        written last: a generation without it is incomplete
//! ```
//!
//! The manifest pins every file by size and sha256; the memory images (`criu/pages-<N>.img`)
//! also by a BLAKE3 digest per 2 MiB chunk, so a lazy restore checks each chunk as it first reads
//! it ([`read_verified_chunk_at`], [`verify_files_except_chunked`]) instead of hashing the whole
//! image first.
//!
//! The durable copy mirrors it under `<store url>/<key>/`: every file zstd-compressed as
//! `<path>.zst`, except the memory images, whose chunks are shared content-addressed objects
//! under `<store url>/_chunks/` (see `chunks/`), plus the plain `manifest.json`, again uploaded
//! last. Object sets an upload cut
//! off for good left without a manifest are removed by `DurableStore::sweep_partial_uploads`.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod archive;
mod chunk_delta;
mod chunks;
mod crypto;
mod delta_upload;
mod durable;
mod error;
mod generation;
mod layout;
mod manifest;

pub use chunks::{DURABLE_SOURCE_FILE, DurableSource, durable_source};
pub use crypto::{
    DATA_KEY_FILE, FileKek, KeyEncryptionKey, Rotation, SnapshotKeys, rotate as rotate_keys,
};
pub use durable::{
    BACKGROUND_NICE, DEFAULT_PARTIAL_GRACE, DurableStore, SweepStats, TransferStats,
    UploadPriority, lower_this_thread_priority,
};
pub use error::{Error, Result};
pub use generation::sealed;
pub use generation::{
    CONTAINERS_DIR, CRIU_DIR, ChunkSink, GenerationMeta, MemoryFile, PipeSink, ROOTFS_ARCHIVE,
    SEALED_SOURCE_FILE, SealedSource, VOLUMES_DIR, container_rootfs_path, extract_container_rootfs,
    extract_rootfs, extract_volume, is_sealed, quarantine, quarantine_path, read_manifest,
    read_verified_chunk, read_verified_chunk_at, remove_leftovers, replace_memory,
    seal_actor_generation, seal_generation, sealed_source, verify, verify_chunk_bytes,
    verify_chunks, verify_files, verify_files_except_chunked,
};
pub use layout::{MemoryLayout, PageRun};
pub use manifest::{
    CHUNK_BYTES, FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest, ParentGeneration,
    is_memory_pages_file,
};
