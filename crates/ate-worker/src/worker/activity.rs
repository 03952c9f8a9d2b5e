//! Activity (what the node polls: open tunnels and connections, last activity, exits) and the
//! exit watcher: superseded copies discarded, exited actors and failed lazy restores collected.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ate_core::ActorRef;
use ate_core::clock::now_ms;

use super::logs::{LOG_TAIL_LINES, log_tail};
use super::{ActivityReport, ActorActivity, Entry, ExitReport, Worker};
use crate::lazy::Outcome;

impl Worker {
    /// Each running actor's cgroup name (`ActorSandbox::short_id`) and since when it is active
    /// here (its adoption record, written once it went active; 0 when unreadable).
    pub fn running_sandboxes(&self) -> Vec<(ActorRef, String, i64)> {
        let sandboxes: Vec<_> = self
            .table()
            .actors
            .values()
            .map(|e| e.sandbox.clone())
            .collect();
        sandboxes
            .into_iter()
            .map(|s| {
                let since = std::fs::metadata(s.dir.join(super::adoption::ADOPTION_FILE))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                (
                    ActorRef::new(s.atespace.clone(), s.name.clone()),
                    s.short_id(),
                    since,
                )
            })
            .collect()
    }

    pub fn activity(&self) -> ActivityReport {
        let now = now_ms();
        self.last_poll_ms.store(now, Ordering::Release);
        let mut table = self.table();
        // Asks of actors no longer here end with their sandbox (a resumed actor asks again).
        self.local_asks.retain(|key| table.actors.contains_key(key));
        let mut actors: Vec<ActorActivity> = table
            .actors
            .iter()
            .map(|(key, e)| {
                // Ingress off (a checkpoint, stop or start is deciding the actor's fate): not
                // idle. A last activity of 0 here made the node ask for an idle suspend of
                // every actor in the middle of a suspend.
                let (open, last) = match self.tunnels.get(key) {
                    Some(a) => (a.open_tunnels(), a.last_activity_unix_ms()),
                    None => (0, now),
                };
                // Outbound connections count as activity too: open ones keep the actor busy.
                let out = self.egress.activity(key);
                let open =
                    open.saturating_add(u32::try_from(out.open_connections).unwrap_or(u32::MAX));
                let last = last.max(out.last_activity_unix_ms);
                // A keep-awake asked through the local API counts as a stream in flight.
                let (awake, suspend_requested) = self.local_asks.take(key, now);
                let (open, last) = if awake {
                    (open.saturating_add(1), now)
                } else {
                    (open, last)
                };
                // So does an open exec session (`ate exec`).
                let (open, last) = match self.execs.count(key) {
                    0 => (open, last),
                    n => (
                        open.saturating_add(u32::try_from(n).unwrap_or(u32::MAX)),
                        now,
                    ),
                };
                ActorActivity {
                    actor: ActorRef::new(e.sandbox.atespace.clone(), e.sandbox.name.clone()),
                    open_streams: open,
                    last_activity_unix_ms: last,
                    exited: false,
                    exit_code: 0,
                    last_log_lines: String::new(),
                    idle_timeout_seconds: e.spec.idle_timeout_seconds,
                    activation: e.activation,
                    crash_reason: String::new(),
                    damaged_generation: None,
                    suspend_requested,
                }
            })
            .collect();
        // Exits are reported once.
        for x in table.exits.drain(..) {
            actors.push(ActorActivity {
                actor: ActorRef::new(x.atespace, x.name),
                open_streams: 0,
                last_activity_unix_ms: x.at_ms,
                exited: true,
                exit_code: x.exit_code,
                last_log_lines: x.log,
                idle_timeout_seconds: x.idle_timeout_seconds,
                activation: x.activation,
                crash_reason: x.crash,
                damaged_generation: x.damaged_generation,
                suspend_requested: false,
            });
        }
        // By atespace, then name (a stable sort: an exit after the running copy of the same key).
        actors.sort_by(|a, b| a.actor.cmp(&b.actor));
        ActivityReport {
            epoch: self.ident.epoch,
            actors,
            draining: self.draining(),
            frozen: u32::try_from(table.frozen.len()).unwrap_or(u32::MAX),
        }
    }

    /// One pass of the exit watcher: an actor whose processes all exited is deactivated, its
    /// sandbox removed, and its exit queued for Activity.
    pub async fn reap_exited(&self) {
        self.trim_frozen().await;
        self.discard_superseded().await;
        self.collect_exits().await;
    }

    /// Discards copies that atunnel found superseded by a newer activation (a CONNECT carried a
    /// newer token): the actor runs elsewhere now, or is about to start again here.
    pub async fn discard_superseded(&self) {
        for (key, token) in self.tunnels.take_superseded() {
            let lock = self.lock_for(&key);
            let _guard = lock.lock().await;
            let entry = {
                let mut t = self.table();
                match t.actors.get(&key) {
                    Some(e) if e.activation == token => t.actors.remove(&key),
                    _ => None,
                }
            };
            if let Some(e) = entry {
                tracing::warn!(actor = %key, activation = token, "discarding a superseded copy");
                self.discard_quietly(&e.sandbox).await;
            }
        }
    }

    /// The exit half of [`Worker::reap_exited`] (what a SIGCHLD asks for).
    pub async fn collect_exits(&self) {
        let keys: Vec<String> = self.table().actors.keys().cloned().collect();
        for key in keys {
            let lock = self.lock_for(&key);
            // Busy actors are in the middle of an operation that decides their fate itself.
            let Ok(_guard) = lock.try_lock() else {
                continue;
            };
            let Some(entry) = self.table().actors.get(&key).cloned() else {
                continue;
            };
            match entry.page_source.as_ref().map(|p| p.outcome()) {
                Some(Outcome::Failed(why)) => {
                    self.end_incomplete(&key, entry, why).await;
                    continue;
                }
                Some(Outcome::Done(summary)) => {
                    tracing::info!(actor = %key, %summary, "lazy restore: every page is in");
                    if let Some(e) = self.table().actors.get_mut(&key) {
                        // A tracking page source stays for the actor's life (its descriptors
                        // are the tracking); any other goes now.
                        e.tracker = e.page_source.take().filter(|p| p.tracks_memory());
                    }
                }
                Some(Outcome::Running) | None => {}
            }
            let exited = match self.runtime.exited(&entry.sandbox).await {
                Ok(Some(info)) => info,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(actor = %key, error = %e, "exit check");
                    continue;
                }
            };
            self.ingress_off(&key).await;
            // The last lines the actor wrote may still be in its log relay's pipe.
            self.runtime
                .output_flushed(&entry.sandbox, Duration::from_millis(500))
                .await;
            let log = log_tail(&entry.sandbox.log_path(), LOG_TAIL_LINES).await;
            let exit_code = exited.code.unwrap_or(-1);
            tracing::warn!(actor = %key, status = %exited.status, exit_code, "actor exited while active");
            self.table().actors.remove(&key);
            if let Err(e) = self.discard(&entry.sandbox).await {
                tracing::warn!(actor = %key, error = %e.message(), "cleanup after exit");
            }
            // exit_code -1: unknown (the init was not the worker's child; runc keeps no exit
            // status).
            let report = ExitReport::of(&entry, exit_code, log);
            self.table().exits.push(report);
        }
    }

    /// Ends an actor whose lazily restored memory cannot be completed (its page source failed:
    /// a damaged chunk, or it died): the processes wait on pages that will never come and must
    /// not run on. The sandbox is stopped before the page source's descriptors are released
    /// (dropping `entry` last), and the api is told to mark the actor CRASHED with `why` for a
    /// damaged chunk, or that its processes ended (SUSPENDED at its generation) for a page
    /// source that died.
    async fn end_incomplete(&self, key: &str, entry: Entry, why: String) {
        tracing::error!(actor = %key, error = %why, "lazy restore failed; stopping the actor");
        // A chunk that does not match its digest is the generation's fault (not the page
        // source's): the node tells the api which copy of the generation that directory is.
        let damaged_generation = entry
            .page_source
            .as_ref()
            .filter(|p| p.found_damage())
            .map(|p| p.generation().to_path_buf());
        crate::metrics::lazy_restore_failed();
        self.ingress_off(key).await;
        self.table().actors.remove(key);
        if let Err(e) = self.discard(&entry.sandbox).await {
            tracing::warn!(actor = %key, error = %e.message(), "cleanup after a failed lazy restore");
        }
        // A page source that died says nothing against the generation: the actor goes back to it
        // (SUSPENDED; what it did since this restore is lost). A damaged chunk makes it CRASHED,
        // for an operator to look at.
        let (log, crash) = if why == crate::lazy::SOURCE_DIED {
            let log = format!(
                "ate: the lazy memory restore was interrupted ({why}); the actor was stopped and goes back to its generation"
            );
            (log, String::new())
        } else {
            (String::new(), format!("lazy memory restore failed: {why}"))
        };
        self.table().exits.push(ExitReport {
            crash,
            damaged_generation,
            ..ExitReport::of(&entry, -1, log)
        });
        drop(entry);
    }
}
