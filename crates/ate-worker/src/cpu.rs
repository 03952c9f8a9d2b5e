//! CPU is shared, not reserved (issue 38): each actor's cgroup gets a CPU weight proportional
//! to its template's `cpu` (the quota that caps it is runc's, unchanged), and the worker measures
//! what its actors really use, from their cgroups, for the scheduler.
//!
//! One pass every [`SAMPLE_PERIOD`] ([`CpuMeter::pass`]) over the sandboxes under the worker's
//! actors dir (`<atespace>/<name>`, each named by its cgroup, `ActorSandbox::short_id`): the
//! weight is made to match the cgroup's CPU quota, which is the template's `cpu`
//! (`runc::cgroup::cpu_quota_us`): v1 `cpu.shares`, v2 `cpu.weight`, written only when it
//! differs, so a sandbox restored into a new cgroup gets it back at the next pass; and the
//! cumulative usage is read (v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`). The rate since the
//! previous pass, summed over the sandboxes seen in both, is the worker's recent use, reported
//! in Info (the node passes it on with each heartbeat).
//!
//! Why the quota and not the worker's table: the meter then needs nothing from the verbs (no
//! hook in start or restore), and a sandbox whose quota is lifted (a CRIU restore or dump runs
//! without it, docs/decisions.md "CRIU runs without the actor's CPU quota") keeps its weight, or
//! the default one, until the quota is back: a restore is never slowed by the share of the
//! actor it restores. Frozen-in-place copies are metered too; they use nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How often the worker sets weights and samples its actors' usage.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(2);

/// Parent of every actor cgroup: the same directory as `runc::cgroup::CGROUP_PARENT`.
const CGROUP_PARENT: &str = "ate";

/// cgroup v1 `cpu.shares` for a template's `cpu` (Kubernetes' conversion: 1024 per core, at
/// least 2, at most 262144).
pub fn shares(millis: u32) -> u64 {
    (u64::from(millis) * 1024 / 1000).clamp(2, 262_144)
}

/// cgroup v2 `cpu.weight` for a template's `cpu` (the shares mapped onto 1..=10000 the way runc
/// and the kubelet map them).
pub fn weight(millis: u32) -> u64 {
    1 + (shares(millis) - 2) * 9999 / 262_142
}

/// The v1 `cpu.shares` of an actor whose template books `millis` on a machine of
/// `physical_millis`: its template's, capped at the machine's (no actor can use more), or
/// [`crate::wakeup::BOOST`] times the machine's while it is boosted (`crate::wakeup`).
pub fn actor_shares(millis: u32, physical_millis: u32, boosted: bool) -> u64 {
    if boosted {
        (shares(physical_millis) * crate::wakeup::BOOST).min(262_144)
    } else {
        shares(millis.min(physical_millis))
    }
}

/// The v2 `cpu.weight` counterpart of [`actor_shares`].
pub fn actor_weight(millis: u32, physical_millis: u32, boosted: bool) -> u64 {
    if boosted {
        (weight(physical_millis) * crate::wakeup::BOOST).min(10_000)
    } else {
        weight(millis.min(physical_millis))
    }
}

/// The worker's CPU: what the machine offers and what its actors used lately.
#[derive(Debug)]
pub struct CpuMeter {
    /// `<state>/workers/<id>/actors`.
    actors_dir: PathBuf,
    physical_millis: u32,
    usage_millis: AtomicU32,
    last: Mutex<Option<Sample>>,
    /// Each sandbox's share of `usage_millis` (short id → millicores), for `ate top actors`.
    per_sandbox: Mutex<HashMap<String, u32>>,
}

#[derive(Debug)]
struct Sample {
    at: Instant,
    /// Cumulative usage (ns) per sandbox short id.
    usage_ns: HashMap<String, u64>,
}

impl CpuMeter {
    pub fn new(actors_dir: PathBuf, physical_millis: u32) -> Self {
        Self {
            actors_dir,
            physical_millis,
            usage_millis: AtomicU32::new(0),
            last: Mutex::new(None),
            per_sandbox: Mutex::new(HashMap::new()),
        }
    }

    /// The machine CPU offered before overcommit (millicores).
    pub fn physical_millis(&self) -> u32 {
        self.physical_millis
    }

    /// CPU the actors used over the last sampling window (millicores; 0 before two passes).
    pub fn usage_millis(&self) -> u32 {
        self.usage_millis.load(Ordering::Acquire)
    }

    /// CPU the sandbox `short_id` used over the last sampling window (millicores; None before
    /// it was seen in two passes).
    pub fn sandbox_usage_millis(&self, short_id: &str) -> Option<u32> {
        match self.per_sandbox.lock() {
            Ok(m) => m.get(short_id).copied(),
            Err(poisoned) => poisoned.into_inner().get(short_id).copied(),
        }
    }

    /// One pass over the worker's sandboxes: usage read from their cgroups, the recent use
    /// recomputed, then weights set from their quotas and that use (`crate::wakeup`). Blocking
    /// file I/O (a few sysfs reads each).
    pub fn pass(&self) -> u32 {
        let ids = sandbox_ids(&self.actors_dir);
        let readings: Vec<(String, u64)> = ids
            .iter()
            .filter_map(|id| usage_ns(id).map(|u| (id.clone(), u)))
            .collect();
        let used = self.record(readings, Instant::now());
        for id in &ids {
            let used = self.sandbox_usage_millis(id);
            ensure_weight(id, self.physical_millis, |share| {
                crate::wakeup::boosted(used, share, self.physical_millis)
            });
        }
        used
    }

    /// Records cumulative usages read at `now` and returns the rate since the previous
    /// record, in millicores: the sum of each actor's growth (an actor first seen now counts
    /// from the next record; a counter that went down belongs to a new cgroup of that name and
    /// counts whole) over the time between the two.
    pub fn record(&self, readings: Vec<(String, u64)>, now: Instant) -> u32 {
        let usage_ns: HashMap<String, u64> = readings.into_iter().collect();
        let mut last = match self.last.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        let millis = match last.as_ref() {
            Some(prev) if now > prev.at => {
                let elapsed_ns = now.duration_since(prev.at).as_nanos().max(1);
                let rate = |grown: u64| {
                    u32::try_from(u128::from(grown) * 1000 / elapsed_ns).unwrap_or(u32::MAX)
                };
                let grown: HashMap<String, u64> = usage_ns
                    .iter()
                    .filter_map(|(id, &now_ns)| {
                        prev.usage_ns.get(id).map(|&before| {
                            let g = if now_ns >= before {
                                now_ns - before
                            } else {
                                now_ns
                            };
                            (id.clone(), g)
                        })
                    })
                    .collect();
                let per: HashMap<String, u32> =
                    grown.iter().map(|(id, &g)| (id.clone(), rate(g))).collect();
                if let Ok(mut m) = self.per_sandbox.lock() {
                    *m = per;
                }
                rate(grown.values().sum())
            }
            _ => self.usage_millis(),
        };
        *last = Some(Sample { at: now, usage_ns });
        self.usage_millis.store(millis, Ordering::Release);
        metrics::gauge!(crate::metrics::CPU_USAGE).set(f64::from(millis));
        millis
    }
}

/// `<hierarchy>/ate/<short id>` where `hierarchy` is a v1 controller's mount or the v2 root.
fn cgroup_dir(hierarchy: &str, short_id: &str) -> PathBuf {
    Path::new(hierarchy).join(CGROUP_PARENT).join(short_id)
}

/// The actor's cgroup in the unified (v2) hierarchy: `/sys/fs/cgroup` on a v2 host,
/// `/sys/fs/cgroup/unified` on a hybrid one.
fn v2_dir(short_id: &str) -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(|h| cgroup_dir(h, short_id))
        .find(|d| d.join("cgroup.controllers").is_file())
}

/// Memory the actor's cgroup holds now (v1 `memory.usage_in_bytes`, v2 `memory.current`).
pub fn memory_bytes(short_id: &str) -> Option<u64> {
    let v1 = cgroup_dir("/sys/fs/cgroup/memory", short_id).join("memory.usage_in_bytes");
    if let Some(text) = read_trimmed(&v1) {
        return text.parse().ok();
    }
    read_trimmed(&v2_dir(short_id)?.join("memory.current"))?
        .parse()
        .ok()
}

/// Cumulative CPU time of the actor's cgroup in nanoseconds, if it has one.
pub fn usage_ns(short_id: &str) -> Option<u64> {
    let v1 = cgroup_dir("/sys/fs/cgroup/cpuacct", short_id).join("cpuacct.usage");
    if let Ok(text) = std::fs::read_to_string(&v1) {
        return text.trim().parse().ok();
    }
    let text = std::fs::read_to_string(v2_dir(short_id)?.join("cpu.stat")).ok()?;
    usage_usec(&text).map(|us| us.saturating_mul(1000))
}

/// `usage_usec` from a v2 `cpu.stat`.
fn usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// The cgroup names (short ids) of the sandboxes under an actors dir (`<atespace>/<name>`).
fn sandbox_ids(actors_dir: &Path) -> Vec<String> {
    let Ok(spaces) = std::fs::read_dir(actors_dir) else {
        return Vec::new();
    };
    spaces
        .flatten()
        .filter_map(|space| std::fs::read_dir(space.path()).ok())
        .flat_map(|actors| actors.flatten().map(|a| a.path()))
        .filter(|dir| dir.is_dir())
        .map(|dir| crate::runtime::ActorSandbox::new("", "", "", &dir).short_id())
        .collect()
}

/// The template's CPU (millicores) from a CFS quota and period (None: no quota).
fn millis_of_quota(quota_us: i64, period_us: u64) -> Option<u32> {
    let quota = u64::try_from(quota_us).ok().filter(|q| *q > 0)?;
    let period = Some(period_us).filter(|p| *p > 0)?;
    u32::try_from(quota * 1000 / period).ok()
}

/// The quota of a v2 `cpu.max` (`<quota> <period>`, or `max <period>`) as millicores.
fn millis_of_cpu_max(text: &str) -> Option<u32> {
    let mut parts = text.split_whitespace();
    let quota: i64 = parts.next()?.parse().ok()?;
    let period: u64 = parts.next()?.parse().ok()?;
    millis_of_quota(quota, period)
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
}

/// Makes the sandbox's weight what its quota (the template's `cpu`) and `boosted` (asked with
/// that quota in millicores) call for where its cgroup has the files (v1 `cpu.shares` from
/// `cpu.cfs_quota_us`, else v2 `cpu.weight` from `cpu.max`). No quota (being restored or dumped,
/// or none asked): left as it is. No such cgroup (another runtime, a sandbox torn down): left
/// alone.
fn ensure_weight(short_id: &str, physical_millis: u32, boosted: impl Fn(u32) -> bool) {
    let v1 = cgroup_dir("/sys/fs/cgroup/cpu", short_id);
    let (file, want) = if v1.join("cpu.shares").is_file() {
        let quota = read_trimmed(&v1.join("cpu.cfs_quota_us")).and_then(|q| q.parse().ok());
        let period = read_trimmed(&v1.join("cpu.cfs_period_us")).and_then(|p| p.parse().ok());
        let Some(millis) = quota.zip(period).and_then(|(q, p)| millis_of_quota(q, p)) else {
            return;
        };
        let want = actor_shares(millis, physical_millis, boosted(millis));
        (v1.join("cpu.shares"), want)
    } else {
        let Some(dir) = v2_dir(short_id).filter(|d| d.join("cpu.weight").is_file()) else {
            return;
        };
        let Some(millis) = read_trimmed(&dir.join("cpu.max")).and_then(|t| millis_of_cpu_max(&t))
        else {
            return;
        };
        let want = actor_weight(millis, physical_millis, boosted(millis));
        (dir.join("cpu.weight"), want)
    };
    if read_trimmed(&file).as_deref() == Some(want.to_string().as_str()) {
        return;
    }
    if let Err(e) = std::fs::write(&file, want.to_string()) {
        tracing::debug!(cgroup = %short_id, file = %file.display(), error = %e, "cannot set the actor's CPU weight");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_proportional_to_the_template_cpu() {
        assert_eq!(shares(1000), 1024);
        assert_eq!(shares(250), 256);
        assert_eq!(shares(500) * 2, shares(1000));
        assert_eq!(shares(0), 2);
        assert_eq!(shares(u32::MAX), 262_144);
        assert_eq!(weight(0), 1);
        assert_eq!(weight(u32::MAX), 10_000);
        assert!(weight(250) < weight(1000));
        assert_eq!(weight(1000), 39);
    }

    #[test]
    fn a_boosted_actor_outweighs_the_whole_machine_and_no_actor_weighs_more_than_it() {
        // 2 cores: the machine weighs 2048; boosted, 4 times that.
        assert_eq!(actor_shares(250, 2000, false), 256);
        assert_eq!(actor_shares(250, 2000, true), 8192);
        assert_eq!(actor_shares(2000, 2000, false), 2048);
        // Booking more than the machine weighs as the machine.
        assert_eq!(actor_shares(64_000, 2000, false), 2048);
        assert_eq!(actor_shares(250, 128_000, true), 262_144);
        assert_eq!(actor_weight(250, 2000, false), weight(250));
        assert_eq!(actor_weight(250, 2000, true), weight(2000) * 4);
        assert_eq!(actor_weight(250, 128_000, true), 10_000);
    }

    #[test]
    fn usage_is_the_growth_between_two_passes() {
        let meter = CpuMeter::new(PathBuf::from("/nonexistent"), 2000);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // The first pass has nothing to compare with.
        assert_eq!(meter.record(vec![("a".into(), 5_000_000_000)], t0), 0);
        // `a` used 1 s of CPU in 2 s (500m); `b` is new: it counts from the next pass.
        let used = meter.record(
            vec![("a".into(), 6_000_000_000), ("b".into(), 9_000_000_000)],
            t0 + s(2),
        );
        assert_eq!(used, 500);
        assert_eq!(meter.usage_millis(), 500);
        // `a` is gone; `b` used 3 s in 2 s (1500m: several threads).
        let used = meter.record(vec![("b".into(), 12_000_000_000)], t0 + s(4));
        assert_eq!(used, 1500);
        // `b` came back in a new cgroup (its counter restarted): what it shows counts whole.
        let used = meter.record(vec![("b".into(), 200_000_000)], t0 + s(6));
        assert_eq!(used, 100);
        // No actors: nothing used.
        assert_eq!(meter.record(Vec::new(), t0 + s(8)), 0);
        assert_eq!(meter.physical_millis(), 2000);
    }

    #[test]
    fn v2_usage_is_read_from_cpu_stat() {
        let text = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n";
        assert_eq!(usage_usec(text), Some(1_234_567));
        assert_eq!(usage_usec("user_usec 5\n"), None);
    }

    #[test]
    fn the_weight_follows_the_quota() {
        assert_eq!(millis_of_quota(25_000, 100_000), Some(250));
        assert_eq!(millis_of_quota(-1, 100_000), None);
        assert_eq!(millis_of_quota(0, 100_000), None);
        assert_eq!(millis_of_quota(25_000, 0), None);
        assert_eq!(millis_of_cpu_max("50000 100000"), Some(500));
        assert_eq!(millis_of_cpu_max("max 100000"), None);
        assert_eq!(millis_of_cpu_max(""), None);
    }

    #[test]
    fn sandboxes_without_a_cgroup_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let actors = dir.path().join("actors");
        std::fs::create_dir_all(actors.join("ns").join("a")).expect("mkdir");
        std::fs::create_dir_all(actors.join("ns").join("b")).expect("mkdir");
        std::fs::write(actors.join("ns").join("not-a-dir"), "").expect("file");
        assert_eq!(sandbox_ids(&actors).len(), 2);
        let meter = CpuMeter::new(actors, 1000);
        assert_eq!(meter.pass(), 0);
        assert_eq!(meter.pass(), 0);
    }
}
