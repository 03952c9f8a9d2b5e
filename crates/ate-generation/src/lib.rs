//! A generation's memory on disk, as more than one process reads it: CRIU's memory images
//! ([`images`]: which pages a dump holds and where, and the flatten of a delta's images onto
//! its parent's) and delta generations made whole ([`delta`]). The worker restores and dumps
//! with these; the node agent flattens before it uploads, moves or removes a generation, and
//! reads the memory layout an upload matches pages by.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod delta;
pub mod images;

pub use delta::{FlattenError, ensure_flat, flatten_children, flatten_children_except};
pub use images::ImageError;
