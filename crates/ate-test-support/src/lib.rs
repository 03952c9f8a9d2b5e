//! Helpers shared by the workspace's test binaries, written once instead of copied into each
//! crate's `tests/common`: free ports, polling until a condition holds, ready files, the test
//! services (PostgreSQL, moto), plain HTTP/1.1 probes, and — behind features — scripted gRPC
//! servers standing in for the api (`scripted-api`) and a node agent (`test-node`), a real
//! OCI registry process (`registry`), a bearer-token signer (`jwt`), and an HTTP/2 client of a
//! worker's atunnel (`h2-client`).
//!
//! Test code: a failed step panics with what was being done, as a test assertion would.

pub mod fs;
pub mod hold_server;
pub mod http;
pub mod oracles;
pub mod ports;
pub mod services;
pub mod wait;

#[cfg(feature = "h2-client")]
pub mod h2_client;
#[cfg(feature = "jwt")]
pub mod jwt;
#[cfg(feature = "registry")]
pub mod registry;
#[cfg(feature = "scripted-api")]
pub mod scripted_api;
#[cfg(feature = "test-node")]
pub mod test_node;

/// Runs `f` to completion on a new current-thread runtime (for async helpers in sync tests).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt")
        .block_on(f)
}
