//! One `ate api` process on loopback with its own SQLite store, for the tests that need only the
//! api (no `ate up`); killed when the value is dropped.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::ATE;

pub struct ApiProcess {
    pub child: Child,
    /// The api's gRPC address, from its ready file.
    pub addr: String,
    /// The store and the ready file, and whatever the caller put there before the start.
    pub dir: tempfile::TempDir,
}

impl ApiProcess {
    /// `ate api` on loopback ports with its store in a fresh temp dir.
    pub fn start() -> ApiProcess {
        Self::start_in(tempfile::tempdir().expect("tempdir"), |_| {})
    }

    /// `ate api` with its store in `dir`; `configure` adds flags (after the listen addresses)
    /// and environment.
    pub fn start_in(dir: tempfile::TempDir, configure: impl FnOnce(&mut Command)) -> ApiProcess {
        let ready = dir.path().join("ready.json");
        let mut cmd = Command::new(ATE);
        cmd.args([
            "api",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ]);
        configure(&mut cmd);
        let mut child = cmd
            .arg("--ready-file")
            .arg(&ready)
            .arg("--store")
            .arg(format!("sqlite://{}", dir.path().join("ate.db").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ate api");
        let v = ate_test_support::wait::wait_for_ready_file(
            &ready,
            &mut child,
            "ate api",
            Duration::from_secs(20),
        );
        ApiProcess {
            addr: v["grpc"].as_str().expect("grpc address").to_string(),
            child,
            dir,
        }
    }
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
