//! Adoption: the record next to each active actor's sandbox, and a restarted worker taking back
//! the sandboxes its earlier process left running (ingress on again once the node renews the
//! lease). The node's liveness checks of a worker that does not answer read the same records
//! (`ate_worker_client::sandbox`).

use std::path::Path;
use std::time::{Duration, Instant};

pub(super) use ate_worker_client::sandbox::ADOPTION_FILE;
use ate_worker_client::sandbox::{actor_dirs, sandbox_alive};

use super::{AdoptionRecord, Entry, Worker, Workload, egress_identity, key_of};
use crate::procfs::process_running;
use crate::runtime::ActorSandbox;
use ate_netns::NetnsDialer;

/// How long a restarted worker waits for a lazy restore's page source to finish before it
/// gives up adopting the sandbox.
const ADOPT_PAGE_SOURCE_WAIT: Duration = Duration::from_secs(30);

impl Worker {
    /// The node renewed this worker's lease: atunnel admits traffic for `valid_for` more, and
    /// re-adopted actors (reconciled with the api by now) get their ingress back.
    pub fn renew_lease(&self, valid_for: Duration) {
        self.tunnels.renew_lease(valid_for);
        let adopted: Vec<(String, NetnsDialer)> = self.table().adopted.drain().collect();
        for (key, dialer) in adopted {
            let activation = self.table().actors.get(&key).map(|e| e.activation);
            if let Some(activation) = activation {
                self.tunnels.activate(&key, activation, dialer);
                tracing::info!(actor = %key, activation, "re-adopted actor; ingress on");
            }
        }
    }

    /// Records what a restarted worker needs to re-adopt the actor's sandbox. Best effort: a
    /// missing record only means the sandbox would be discarded (not adopted) after a crash.
    pub(super) async fn write_adoption(
        &self,
        sandbox: &ActorSandbox,
        workload: &Workload,
        pid: Option<u32>,
        page_source_pid: Option<u32>,
    ) {
        let record = AdoptionRecord {
            workload: workload.clone(),
            pid,
            page_source_pid,
        };
        let path = sandbox.dir.join(ADOPTION_FILE);
        let tmp = sandbox.dir.join(format!(".{ADOPTION_FILE}.tmp"));
        let bytes = crate::convert::adoption_to_bytes(&record);
        let written = async {
            tokio::fs::write(&tmp, &bytes).await?;
            tokio::fs::rename(&tmp, &path).await
        }
        .await;
        if let Err(e) = written {
            tracing::warn!(actor = %key_of(&sandbox.atespace, &sandbox.name), error = %e, "cannot write the adoption record; a worker restart would discard this sandbox");
        }
    }

    /// Re-adopts the sandboxes an earlier process of this worker id left running (a crash or a
    /// kill): each actor dir whose adoption record names a running container is taken back
    /// into the table with its activation; ingress stays off until the node has reconciled it
    /// with the api and renewed the lease ([`Worker::renew_lease`]), or a start names it.
    /// Anything else left behind (a sandbox being dumped, frozen, half started) is removed.
    pub async fn adopt_leftovers(&self) {
        self.end_earlier_commands().await;
        for (atespace, name) in self.leftover_actors() {
            let key = key_of(&atespace, &name);
            match self.adopt(&atespace, &name).await {
                Ok(activation) => {
                    self.inherited
                        .store(true, std::sync::atomic::Ordering::Release);
                    tracing::info!(actor = %key, activation, "re-adopted a running sandbox from an earlier worker process");
                }
                Err(why) => {
                    tracing::info!(actor = %key, %why, "removing leftover actor from an earlier run");
                    let sandbox = self.sandbox_for(&atespace, &name, "");
                    self.discard_quietly(&sandbox).await;
                }
            }
        }
    }

    /// Ends what the earlier process was doing when it died: a restore or checkpoint going on
    /// alone would change a sandbox under this process's feet (runc's cleanup of a failed
    /// restore removes the container's state, whoever made it by then).
    pub(super) async fn end_earlier_commands(&self) {
        for command in self.runtime.end_earlier_commands().await {
            tracing::warn!(%command, "ended a command an earlier process of this worker left running");
        }
    }

    pub(super) fn leftover_actors(&self) -> Vec<(String, String)> {
        actor_dirs(&self.actors_dir)
    }

    async fn adopt(&self, atespace: &str, name: &str) -> Result<u64, String> {
        let record = read_adoption(&self.actors_dir.join(atespace).join(name))?;
        let workload = record.workload;
        let (ns, n) = (&workload.actor.atespace, &workload.actor.name);
        if ns != atespace || n != name {
            return Err(format!("adoption record names {ns}/{n}"));
        }
        let sandbox = self.sandbox_for(atespace, name, &workload.uid);
        if let Some(page_source_pid) = record.page_source_pid {
            wait_page_source(&sandbox, page_source_pid).await?;
        }
        match self.runtime.is_running(&sandbox).await {
            Ok(true) => {}
            // Frozen with its record still there: a checkpoint this worker's previous process
            // did not finish. The actor runs on.
            Ok(false) if matches!(self.runtime.is_paused(&sandbox).await, Ok(true)) => {
                self.runtime
                    .thaw(&sandbox)
                    .await
                    .map_err(|e| format!("thaw after an interrupted checkpoint: {e}"))?;
                tracing::warn!(actor = %key_of(atespace, name), "a checkpoint was interrupted by the worker's restart; the actor runs on");
            }
            // runc lost the container while its init still runs (what the earlier commands
            // ended above used to cause): nothing can dump it any more, and its memory since
            // its last generation goes with it. Said loudly; the api's lastError says it too.
            Ok(false) if sandbox_alive(&self.actors_dir, atespace, name) => {
                tracing::error!(actor = %key_of(atespace, name), "runc no longer knows the container of a sandbox that still runs; removed, the actor resumes from its last generation");
                return Err("runc no longer knows its container".to_string());
            }
            Ok(false) => return Err("its container is not running".to_string()),
            Err(e) => return Err(format!("container state: {e}")),
        }
        let key = key_of(atespace, name);
        // The egress listener died with the old process; the netns keeps its redirect.
        self.egress
            .restart(
                egress_identity(&sandbox, workload.activation),
                &sandbox.netns(),
                &workload.spec.egress,
            )
            .await
            .map_err(|e| format!("egress: {e}"))?;
        let dialer = match NetnsDialer::new(&sandbox.netns()).await {
            Ok(d) => d,
            Err(e) => {
                self.egress.stop(&key).await;
                return Err(format!("socket factory: {e}"));
            }
        };
        let activation = workload.activation;
        let mut t = self.table();
        t.actors.insert(
            key.clone(),
            Entry {
                sandbox,
                spec: workload.spec,
                template: workload.template,
                pid: record.pid,
                activation,
                page_source: None,
                // A page source outlives its worker only until every page is in; the tracking
                // of a restore by an earlier process is not trusted: the next dump is whole.
                tracker: None,
                memory_parent: None,
            },
        );
        t.adopted.insert(key, dialer);
        Ok(activation)
    }
}

/// The adoption record next to an actor's sandbox, or why there is none to use.
fn read_adoption(dir: &Path) -> Result<AdoptionRecord, String> {
    crate::convert::adoption_from_bytes(&read_adoption_file(dir)?)
}

fn read_adoption_file(dir: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(dir.join(ADOPTION_FILE)).map_err(|e| format!("no adoption record: {e}"))
}

/// A sandbox left by an earlier worker process was restored lazily: adopt it only once its page
/// source (which outlives the worker) has placed every page. A page source that died first, or
/// is not done in time, leaves memory that cannot be trusted: the sandbox is removed.
async fn wait_page_source(sandbox: &ActorSandbox, pid: u32) -> Result<(), String> {
    let status_file = sandbox
        .dir
        .join("criu-restore")
        .join(ate_page_source::STATUS_FILE);
    let begun = Instant::now();
    loop {
        let status = tokio::fs::read_to_string(&status_file)
            .await
            .unwrap_or_default();
        if status.trim() == "done" {
            return Ok(());
        }
        if !status.is_empty() {
            return Err(format!("its lazy restore failed: {}", status.trim()));
        }
        if !process_running(pid) {
            return Err(format!(
                "the page source of its lazy restore (pid {pid}) ended without placing every page"
            ));
        }
        if begun.elapsed() > ADOPT_PAGE_SOURCE_WAIT {
            return Err(format!(
                "the page source of its lazy restore (pid {pid}) is not done after {ADOPT_PAGE_SOURCE_WAIT:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
