//! `ate bench warm --generator h2load`: nghttp2's load generator (Debian `nghttp2-client`) as a
//! separate process, so that the load costs the same for every path and does not share the
//! bench's runtime. Latencies come from its per-request log (`--log-file`), req/s and failures
//! from its summary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::warm::Load;

/// One h2load run against one URL.
pub struct Run<'a> {
    pub url: &'a str,
    /// `ate-target-actor` for the router's paths.
    pub actor: Option<&'a str>,
    pub connections: usize,
    pub seconds: u64,
    /// HTTP/1.1 (`--h1`); otherwise HTTP/2 (prior knowledge in the clear, ALPN over TLS).
    pub http1: bool,
    /// Where the per-request log goes (removed first: h2load appends).
    pub log: &'a Path,
}

/// h2load on PATH, or a clear error naming the package.
pub fn binary() -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("h2load"))
        .find(|p| p.is_file())
        .context(
            "--generator h2load: h2load is not installed (Debian: apt-get install nghttp2-client)",
        )
}

impl Run<'_> {
    /// One second of warm-up (connections open, caches fill), then `seconds` measured.
    pub async fn measure(&self, h2load: &Path) -> anyhow::Result<Load> {
        match std::fs::remove_file(self.log) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!("cannot remove h2load's old log {}: {e}", self.log.display()),
        }
        let mut cmd = tokio::process::Command::new(h2load);
        if self.http1 {
            cmd.arg("--h1");
        }
        cmd.args(["-t", "1", "--warm-up-time", "1"])
            .arg("-D")
            .arg(self.seconds.to_string())
            .arg("-c")
            .arg(self.connections.to_string())
            .arg("--log-file")
            .arg(self.log);
        if let Some(actor) = self.actor {
            cmd.arg("-H")
                .arg(format!("{}: {actor}", ate_core::TARGET_ACTOR_HEADER));
        }
        cmd.arg(self.url).kill_on_drop(true);
        let limit = Duration::from_secs(self.seconds + 60);
        let out = tokio::time::timeout(limit, cmd.output())
            .await
            .with_context(|| format!("h2load on {} ran over {limit:?}", self.url))?
            .context("cannot run h2load")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.success(),
            "h2load on {} failed ({}): {}{}",
            self.url,
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let summary = Summary::parse(&stdout)
            .with_context(|| format!("h2load's summary for {}: {}", self.url, stdout.trim()))?;
        let log = std::fs::read_to_string(self.log)
            .with_context(|| format!("cannot read h2load's log {}", self.log.display()))?;
        let latencies = ok_latencies_ms(&log);
        Ok(Load::from_latencies(
            latencies,
            summary.total.saturating_sub(summary.ok) as usize,
            summary.rps,
        ))
    }
}

/// What the load run's summary says.
#[derive(Debug, PartialEq)]
struct Summary {
    rps: f64,
    /// Requests of the measured period.
    total: u64,
    /// Of those, answered 2xx.
    ok: u64,
}

impl Summary {
    /// `finished in 6.00s, 28821.80 req/s, …`, `requests: N total, …` and `status codes: N 2xx, …`.
    fn parse(text: &str) -> Option<Summary> {
        let mut rps = None;
        let mut total = None;
        let mut ok = None;
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("finished in ") {
                rps = rest
                    .split(", ")
                    .find_map(|part| part.strip_suffix(" req/s"))
                    .and_then(|n| n.trim().parse().ok());
            } else if let Some(rest) = line.strip_prefix("requests: ") {
                total = rest.split(' ').next().and_then(|n| n.parse().ok());
            } else if let Some(rest) = line.strip_prefix("status codes: ") {
                ok = rest
                    .split(", ")
                    .find_map(|part| part.strip_suffix(" 2xx"))
                    .and_then(|n| n.trim().parse().ok());
            }
        }
        Some(Summary {
            rps: rps?,
            total: total?,
            ok: ok?,
        })
    }
}

/// Latencies (ms) of the 2xx answers in h2load's log: `<start µs>\t<status>\t<duration µs>`.
fn ok_latencies_ms(log: &str) -> Vec<f64> {
    log.lines()
        .filter_map(|line| {
            let mut cols = line.split('\t');
            let _start = cols.next()?;
            let status: u16 = cols.next()?.trim().parse().ok()?;
            let micros: f64 = cols.next()?.trim().parse().ok()?;
            (200..300).contains(&status).then_some(micros / 1000.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "starting benchmark...
spawning thread #0: 16 total client(s). Timing-based test with 1s of warm-up time and 5s of main duration for measurements.
Warm-up started for thread #0.
progress: 10% of clients started
Warm-up phase is over for thread #0.
Main benchmark duration is started for thread #0.
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 6.00s, 28821.80 req/s, 4.50MB/s
requests: 144109 total, 144109 started, 144109 done, 144100 succeeded, 9 failed, 0 errored, 0 timeout
status codes: 144100 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 22.49MB (23582412) total, 15.26MB (16003329) headers (space savings 0.00%), 281.46KB (288218) data
                     min         max         mean         sd        +/- sd
time for request:       43us    300.47ms       529us      3.17ms    99.83%
";

    #[test]
    fn summary_of_a_run() {
        assert_eq!(
            Summary::parse(OUTPUT),
            Some(Summary {
                rps: 28821.80,
                total: 144109,
                ok: 144100
            })
        );
        assert_eq!(Summary::parse("finished in 1s, 3 req/s"), None);
    }

    #[test]
    fn latencies_of_2xx_answers_only() {
        let log = "1700000000000000\t200\t530\n1700000000000100\t502\t100\n\
                   1700000000000200\t200\t1500\nbroken line\n";
        assert_eq!(ok_latencies_ms(log), vec![0.53, 1.5]);
    }
}
