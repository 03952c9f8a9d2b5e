//! Lazy memory restore's page source (`ate page-source`, one process per lazy restore): the
//! actor runs as soon as CRIU has restored its state, and its memory pages arrive as it touches
//! them (userfaultfd), the rest pushed in the background. The worker's side (starting it,
//! holding the userfaultfds, its outcome) is `ate_worker::lazy`; CRIU's images are read by
//! `ate_generation::images`.
//!
//! - [`ranges`]: the set of pages a task still lacks, kept exact across mremap/munmap/madvise.
//! - [`uffd`]: the userfaultfd ABI (events, COPY, ZEROPAGE, WAKE, WRITEPROTECT).
//! - [`written`]: memory tracking's kernel features, and which pages a tracked restore's
//!   tasks wrote since (PAGEMAP_SCAN).
//! - [`source`]: the page source process, in place of `criu lazy-pages`, verifying each 2 MiB
//!   chunk against the manifest's BLAKE3 digest as it first reads it.
//! - [`remote`]: chunks fetched from the durable store when only part of the generation is
//!   local (a restore from the durable copy), the fault's chunk at once, the push's ahead.
//! - [`working_set`]: the chunks an actor faulted first after a restore, recorded by the page
//!   source and carried by the next generation, so its restore brings them in first.
//! - [`report`]: how the page source tells the worker about itself.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod ranges;
pub mod remote;
pub mod report;
pub mod source;
pub mod uffd;
pub mod working_set;
pub mod written;

pub use source::{SOCKET_NAME, SourceError, Stats};

/// Left by the page source in the restore's work dir when it ends: `done` or `failed: …`.
pub const STATUS_FILE: &str = "page-source.status";
/// The page source's descriptor for the report socket.
pub const REPORT_FD: i32 = 3;
