//! The worker process: the sandbox runtime (runc + CRIU), wakeup probes, the actor table and
//! WorkerService (the node agent's control API on a unix socket). [`run`] is the whole process;
//! it serves atunnel (`ate-atunnel`, the router's way in) and each actor's egress proxy
//! (`ate-egress`) in the actor's network namespace (`ate-netns`), from images in `ate-image`. The
//! node agent's client is `ate-worker-client`, the memory images and delta generations
//! `ate-generation`.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod actor_metrics;
pub mod config;
mod convert;
pub mod cpu;
pub mod error;
pub mod exec;
pub mod handoff;
pub mod hardening;
pub mod lazy;
pub mod metrics;
pub mod probe;
mod process;
pub mod procfs;
pub mod reaper;
pub mod runc;
pub mod runtime;
pub mod service;
pub mod sidecars;
mod socket;
pub mod wakeup;
mod worker;

pub use ate_image::{ImageCache, ImageConfig, ImageError, LayoutRef, UnpackedImage};
pub use config::{Faults, MemoryRestore, WorkerConfig};
pub use error::{Result, SandboxError};
pub use probe::wait_ready;
pub use procfs::process_running;
pub use runc::{RuncConfig, RuncRuntime};
pub use runtime::{
    ActorSandbox, Capabilities, CheckpointStats, ExitInfo, RunMode, SandboxRuntime, SandboxSpec,
    SidecarSpec, Started,
};
pub use service::{WorkerError, WorkerLock, lock_identity, run, run_locked};
