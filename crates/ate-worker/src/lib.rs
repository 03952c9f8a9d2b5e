//! Worker sandbox layer: node image cache, per-actor network namespaces, the sandbox runtime
//! (runc + CRIU) and wakeup probes. The worker's gRPC service and atunnel sit on top of this.

mod cmd;
pub mod error;
pub mod image;
pub mod netns;
pub mod probe;
pub mod runc;
pub mod runtime;

pub use error::{Result, SandboxError};
pub use image::{ImageCache, ImageConfig, LayoutRef, UnpackedImage};
pub use netns::{ACTOR_IP, connect_in_netns, connect_in_netns_timeout};
pub use probe::wait_ready;
pub use runc::{RuncConfig, RuncRuntime};
pub use runtime::{
    ActorSandbox, Capabilities, CheckpointStats, ExitInfo, RunMode, SandboxRuntime, SandboxSpec,
    Started,
};
