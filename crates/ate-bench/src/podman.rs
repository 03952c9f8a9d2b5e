//! The side-by-side baseline of `ate bench resume --baseline podman`: the same sleeper image
//! (the same memory) checkpointed and restored by Debian's podman, which drives the same CRIU
//! through runc. A round is `podman container checkpoint` (the suspend), then `podman container
//! restore` and the first answer to the same request (the resume).
//!
//! The container runs with `--network none`; its answer is read inside its network namespace,
//! named for the duration of the bench (`ip netns attach`), so no traffic leaves namespaces
//! this bench made (podman 4.3 restores it with the loopback down: this bench brings it up,
//! outside the timings). Its open-file and process limits are set low: podman's own defaults ask
//! for more than a sandboxed host may grant (runc fails with "error setting rlimits").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

/// The podman binary: `podman` on PATH, else Debian's `/usr/bin/podman`.
pub fn binary() -> anyhow::Result<PathBuf> {
    crate::find_program("podman", "/usr/bin/podman").ok_or_else(|| {
        anyhow::anyhow!(
            "--baseline podman: podman is not installed (Debian: apt-get install podman; it \
             uses the same CRIU as the workers)"
        )
    })
}

/// One podman round, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub checkpoint: f64,
    pub restore: f64,
    /// From the start of `podman container restore` to the first answer.
    pub first_answer: f64,
}

/// A sleeper container under podman; removed (with its network namespace name) when dropped.
pub struct Sleeper {
    bin: PathBuf,
    name: String,
    netns: String,
}

fn podman(bin: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "podman {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Sleeper {
    /// Loads `<images>/sleeper` (an OCI layout) into podman and starts it holding `mib` MiB,
    /// then waits for its first answer to `path`.
    pub async fn start(images: &Path, mib: u64, path: &str) -> anyhow::Result<Self> {
        let bin = binary()?;
        let layout = images.join("sleeper");
        anyhow::ensure!(
            layout.join("index.json").is_file(),
            "--baseline podman: no sleeper image at {} (pass --images-dir)",
            layout.display()
        );
        let image = podman(
            &bin,
            &["pull", "-q", &format!("oci:{}:latest", layout.display())],
        )?;
        let name = format!("ate-bench-sleeper-{}", std::process::id());
        let sleeper = Sleeper {
            bin,
            netns: name.clone(),
            name,
        };
        let _ = podman(&sleeper.bin, &["rm", "-f", &sleeper.name]);
        podman(
            &sleeper.bin,
            &[
                "run",
                "-d",
                "--name",
                &sleeper.name,
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "-e",
                &format!("SLEEPER_MEMORY_MIB={mib}"),
                &image,
            ],
        )?;
        sleeper.attach()?;
        sleeper.answer(path, Duration::from_secs(30)).await?;
        Ok(sleeper)
    }

    /// Names the container's network namespace (again: a restore makes a new process).
    fn attach(&self) -> anyhow::Result<()> {
        let pid = podman(&self.bin, &["inspect", "-f", "{{.State.Pid}}", &self.name])?;
        anyhow::ensure!(
            pid.parse::<u32>().is_ok_and(|p| p > 0),
            "podman container {} has no process (pid {pid:?})",
            self.name
        );
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .output();
        for args in [
            vec!["netns", "attach", &self.netns, &pid],
            // podman 4.3 restores a `--network none` container with its loopback down (the
            // restored process would be unreachable even from inside): brought up here, not
            // counted as podman's time either.
            vec!["-n", &self.netns, "link", "set", "lo", "up"],
        ] {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .context("cannot run ip")?;
            anyhow::ensure!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Waits until the sleeper answers `path` with 200 (it listens on port 80).
    async fn answer(&self, path: &str, within: Duration) -> anyhow::Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], 80));
        let deadline = Instant::now() + within;
        loop {
            match ate_worker::probe::get(&self.netns, addr, path, Duration::from_secs(5)).await {
                Ok((200, _)) => return Ok(()),
                other if Instant::now() > deadline => {
                    anyhow::bail!("podman sleeper did not answer {path} with 200: {other:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    /// Checkpoint (the container stops), then restore and the first answer to `path`.
    pub async fn round(&self, path: &str) -> anyhow::Result<Round> {
        let begun = Instant::now();
        podman(&self.bin, &["container", "checkpoint", &self.name])?;
        let checkpoint = begun.elapsed().as_secs_f64();
        let begun = Instant::now();
        podman(&self.bin, &["container", "restore", &self.name])?;
        let restore = begun.elapsed().as_secs_f64();
        // Naming the new process's namespace (and its loopback, see `attach`) is this bench's
        // cost, not podman's: not counted.
        self.attach()?;
        let asked = Instant::now();
        self.answer(path, Duration::from_secs(30)).await?;
        Ok(Round {
            checkpoint,
            restore,
            first_answer: restore + asked.elapsed().as_secs_f64(),
        })
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin)
            .args(["rm", "-f", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .output();
    }
}
