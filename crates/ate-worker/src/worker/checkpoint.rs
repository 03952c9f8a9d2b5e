//! Checkpoint (suspend): requests in flight drained, ingress off, a memory dump (or the ROOTFS
//! fallback) of the frozen or stopped sandbox, the generation sealed; a failed write thaws the
//! actor and it runs on, a sealed memory dump may leave it frozen in place.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ate_core::clock::now_ms;
use ate_core::template::OnMemoryFailure;
use ate_core::{ActorRef, Fidelity};
use ate_snapshot::ParentGeneration;
use ate_snapshot::sealed::Scratch;
use tokio::sync::OwnedMutexGuard;

use super::adoption::ADOPTION_FILE;
use super::tcp_quiet::wait_tcp_quiet;
use super::{
    CheckpointReply, CheckpointRequest, Entry, Frozen, QUIESCE_TIMEOUT, VerbError, Worker,
    Workload, egress_identity, key_of, sandbox_error, snapshot_error,
};
use crate::lazy::Outcome;
use crate::runtime::ActorSandbox;
use ate_netns::NetnsDialer;

/// How long a checkpoint waits for a lazy restore to place every page.
const LAZY_COMPLETE_WAIT: Duration = Duration::from_secs(60);

/// What a checkpoint finds of the actor it names.
enum Target {
    /// Running here: to be checkpointed.
    Running(Box<Entry>),
    /// Gone, and an earlier attempt of this same call sealed its generation: the answer.
    Sealed(CheckpointReply),
}

/// Why no memory dump was written.
enum DumpFailure {
    /// Nothing may be written: the suspend fails and the actor runs on with its memory.
    Refused(VerbError),
    /// The dump failed (the text says why): the template decides between ROOTFS and refusing.
    Failed(String),
}

/// What the memory phase captured.
struct Capture {
    fidelity: Fidelity,
    /// Why the generation holds less than asked (empty: it holds what was asked).
    reason: String,
    /// A memory dump was written (and froze or stopped the sandbox).
    dumped: bool,
    /// The generation an incremental dump builds on (None: whole, or no dump).
    delta_of: Option<ParentGeneration>,
}

/// When each phase of a checkpoint ended, from its start.
struct Timeline {
    begun: Instant,
    quiesced: Duration,
    stopped_at: Duration,
    sealed_at: Duration,
}

impl Worker {
    pub async fn checkpoint(&self, req: CheckpointRequest) -> Result<CheckpointReply, VerbError> {
        self.check_addressed(&req.actor, &req.worker_id)?;
        let key = key_of(&req.actor.atespace, &req.actor.name);
        let gen_dir = &req.generation_dir;
        let lock = self.lock_for(&key);
        // Owned: a sandbox removed after the reply (below) keeps the actor locked until it is.
        let mut guard = Some(lock.lock_owned().await);

        let entry = match self.checkpoint_target(&req, &key).await? {
            Target::Running(entry) => *entry,
            Target::Sealed(reply) => return Ok(reply),
        };
        clear_interrupted_checkpoint(&key, gen_dir).await?;
        let (scratch, write_dir) = write_target(gen_dir)?;
        wait_lazy_restore_done(&key, &entry).await?;
        // The adoption record stays while the sandbox is frozen for the checkpoint: a worker
        // restarted in the middle thaws it and takes it back (the checkpoint was interrupted;
        // nothing may be lost). It goes once the sandbox is only a cache or gone.
        let asked = req.fidelity.unwrap_or(entry.spec.fidelity);
        let keep_frozen = asked == Fidelity::Memory && self.keeps_frozen();
        // Where the runtime can freeze, the sandbox is frozen (not stopped) while its generation
        // is written, so a generation that cannot be written (disk full) costs nothing: the
        // sandbox thaws and serves on. Only a sealed generation lets it go.
        let can_freeze = self.runtime.capabilities().can_keep_frozen;
        let begun = Instant::now();

        let mut dialer = self.quiesce(&key, &entry, req.grace).await;
        let quiesced = begun.elapsed();
        let capture = match self
            .capture_memory(&req, &key, &entry, &write_dir, asked, can_freeze)
            .await
        {
            Ok(capture) => capture,
            Err(why) => {
                remove_partial_generation(&key, gen_dir).await;
                return Err(self
                    .run_on_after_failed_checkpoint(&key, &entry, dialer, why)
                    .await);
            }
        };
        let (paused, stopped) = self
            .pause_or_stop(&key, &entry.sandbox, capture.dumped, can_freeze)
            .await;
        let stopped_at = begun.elapsed();
        let result = match stopped {
            Err(e) => Err(e),
            Ok(()) => {
                let at_rest = scratch.is_some();
                self.seal_generation(&req, &entry, &write_dir, at_rest, &capture)
                    .await
            }
        };
        let sealed_at = begun.elapsed();
        if let Err(e) = &result {
            // Nothing half written may look like a generation.
            remove_partial_generation(&key, gen_dir).await;
            if paused {
                return Err(self
                    .run_on_after_failed_checkpoint(&key, &entry, dialer, e.clone())
                    .await);
            }
        }
        let kept = keep_frozen && capture.dumped && result.is_ok();
        self.keep_frozen_or_remove(&key, &entry.sandbox, gen_dir, kept, &mut dialer, &mut guard)
            .await;
        let manifest = result.map_err(|e| {
            VerbError::SandboxLost(format!(
                "checkpoint of {key} failed after its sandbox was stopped: {}",
                e.message()
            ))
        })?;
        if manifest.parent.is_some() {
            flatten_in_background(gen_dir);
        }
        let timeline = Timeline {
            begun,
            quiesced,
            stopped_at,
            sealed_at,
        };
        report_sealed(&key, &manifest, &timeline, scratch.is_some(), kept);
        drop(guard);
        if kept {
            self.trim_frozen().await;
        }
        let mut reply = self.checkpoint_reply(&manifest);
        reply.kept_frozen = kept && self.table().frozen.contains_key(&key);
        Ok(reply)
    }

    /// The actor's entry here, once the activation the call names is the one running; with no
    /// entry, a retried call whose first attempt finished is answered from the sealed generation.
    async fn checkpoint_target(
        &self,
        req: &CheckpointRequest,
        key: &str,
    ) -> Result<Target, VerbError> {
        let asked_activation = req.activation;
        let entry = self.table().actors.get(key).cloned();
        if let Some(e) = &entry
            && asked_activation != 0
            && e.activation != asked_activation
        {
            return Err(VerbError::FailedPrecondition(format!(
                "worker {} holds activation {} of {key}, not the {asked_activation} the checkpoint names",
                self.ident.id, e.activation
            )));
        }
        if let Some(entry) = entry {
            return Ok(Target::Running(Box::new(entry)));
        }
        // A retried call whose first attempt finished: answer from the sealed generation.
        let gen_dir = &req.generation_dir;
        if ate_snapshot::is_sealed(gen_dir) {
            let m = ate_snapshot::verify(gen_dir)
                .await
                .map_err(|e| snapshot_error("sealed generation", e))?;
            if m.atespace == req.actor.atespace && m.name == req.actor.name {
                return Ok(Target::Sealed(self.checkpoint_reply(&m)));
            }
        }
        // Nothing to checkpoint: its previous generation is what remains.
        Err(VerbError::SandboxLost(format!(
            "actor {key} is not running on worker {}",
            self.ident.id
        )))
    }

    /// Requests in flight finish first (new ones are refused with 421: the router parks them
    /// and resumes the actor after the suspend); then everything left is cut: ingress off (its
    /// dialer returned, to serve again if nothing is written).
    async fn quiesce(
        &self,
        key: &str,
        entry: &Entry,
        grace: Option<Duration>,
    ) -> Option<NetnsDialer> {
        let grace = grace.unwrap_or(self.suspend_grace);
        if let Some(a) = self.tunnels.get(key) {
            let left = a.drain(grace).await;
            if left > 0 {
                tracing::info!(actor = %key, open = left, grace_ms = grace.as_millis() as u64, "requests still in flight after the suspend grace; cutting them");
            }
        }
        let dialer = self.ingress_off(key).await;
        if let Some(pid) = entry.pid
            && entry.spec.containers.len() > 1
        {
            // With sidecars CRIU keeps the connections between the containers (TCP repair,
            // `CRIU_OPTIONS_SIDECARS`), and would restore any other one with a peer that is
            // gone: give those a moment to close. A single container's connections are all
            // restored closed (`tcp-close`), so nothing needs to wait for them.
            wait_tcp_quiet(pid, QUIESCE_TIMEOUT).await;
        }
        dialer
    }

    /// The memory phase: with memory asked for, the dump (which freezes or stops the sandbox),
    /// or the ROOTFS fallback where the template allows it. `Err`: nothing may be written; the
    /// suspend fails and the actor runs on with its memory.
    async fn capture_memory(
        &self,
        req: &CheckpointRequest,
        key: &str,
        entry: &Entry,
        write_dir: &Path,
        asked: Fidelity,
        can_freeze: bool,
    ) -> Result<Capture, VerbError> {
        let mut capture = Capture {
            fidelity: asked,
            reason: String::new(),
            dumped: false,
            delta_of: None,
        };
        if asked != Fidelity::Memory {
            return Ok(capture);
        }
        let gen_dir = &req.generation_dir;
        let why = match self
            .try_dump_memory(key, entry, gen_dir, write_dir, can_freeze)
            .await
        {
            Ok(parent) => {
                capture.dumped = true;
                capture.delta_of = parent;
                return Ok(capture);
            }
            Err(DumpFailure::Refused(e)) => return Err(e),
            Err(DumpFailure::Failed(why)) => why,
        };
        // Never a quiet downgrade: less than the memory asked for is written only where
        // the template says so, and then the generation's reason says it.
        let fall_back = req
            .on_memory_failure
            .unwrap_or(entry.spec.on_memory_failure)
            == OnMemoryFailure::Rootfs;
        crate::metrics::memory_dump_failed(fall_back);
        if !fall_back {
            return Err(VerbError::Aborted(format!("memory dump failed: {why}")));
        }
        capture.fidelity = Fidelity::Rootfs;
        capture.reason = format!(
            "memory dump failed, captured FIDELITY_ROOTFS as the template allows (snapshots.onMemoryFailure: rootfs); the process memory is lost: {why}"
        );
        tracing::warn!(actor = %key, reason = %capture.reason, "falling back to ROOTFS fidelity");
        Ok(capture)
    }

    /// Dumps the actor's memory into `write_dir`'s CRIU dir; `Ok`: the generation the dump
    /// builds on (None: whole).
    async fn try_dump_memory(
        &self,
        key: &str,
        entry: &Entry,
        gen_dir: &Path,
        write_dir: &Path,
        can_freeze: bool,
    ) -> Result<Option<ParentGeneration>, DumpFailure> {
        if !self.can_restore_memory() {
            return Err(DumpFailure::Failed(
                "this worker cannot dump memory (no CRIU ≥ 4.2)".to_string(),
            ));
        }
        if self.faults.criu_dump_fails() {
            return Err(DumpFailure::Failed(
                "injected fault (ATE_FAULT_CRIU_DUMP=fail)".to_string(),
            ));
        }
        let criu = write_dir.join(ate_snapshot::CRIU_DIR);
        match self
            .dump_memory(key, entry, gen_dir, &criu, can_freeze)
            .await
        {
            Ok((stats, parent)) => {
                tracing::info!(actor = %key, dump_ms = stats.dump.as_millis() as u64, image_bytes = stats.image_bytes, incremental = parent.is_some(), "memory dumped");
                carry_working_set(&entry.sandbox, &criu).await;
                Ok(parent)
            }
            Err(e) => {
                // A partial image must not be mistaken for a dump.
                let _ = tokio::fs::remove_dir_all(&criu).await;
                let full = e.to_string();
                if full.contains("No space left on device") {
                    // Not a limit of CRIU but of the disk: a passing condition.
                    let refused = VerbError::ResourceExhausted(format!(
                        "memory dump: no space left on device for {}",
                        write_dir.display()
                    ));
                    crate::metrics::memory_dump_failed(false);
                    return Err(DumpFailure::Refused(refused));
                }
                Err(DumpFailure::Failed(ate_cmd::tail(&full, 1500).to_string()))
            }
        }
    }

    /// A successful dump already froze (or stopped) the sandbox; otherwise it is frozen now,
    /// or stopped where the runtime cannot freeze. The files stay for archiving. Returns
    /// whether it is frozen, and whether it could be stopped.
    async fn pause_or_stop(
        &self,
        key: &str,
        sandbox: &ActorSandbox,
        dumped: bool,
        can_freeze: bool,
    ) -> (bool, Result<(), VerbError>) {
        let paused = if dumped {
            can_freeze
        } else if can_freeze {
            match self.runtime.freeze(sandbox).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(actor = %key, error = %e, "cannot freeze for the checkpoint; stopping instead");
                    false
                }
            }
        } else {
            false
        };
        let stopped = if dumped || paused {
            Ok(())
        } else {
            self.runtime.stop(sandbox).await
        };
        let stopped = stopped.map_err(|e| {
            VerbError::Internal(format!(
                "stop sandbox {} for checkpoint: {e}",
                sandbox.container_id()
            ))
        });
        (paused, stopped)
    }

    /// Seals what was captured (in `write_dir`) as the generation `req` names, with the
    /// sandbox's upper dirs and volumes.
    async fn seal_generation(
        &self,
        req: &CheckpointRequest,
        entry: &Entry,
        write_dir: &Path,
        at_rest: bool,
        capture: &Capture,
    ) -> Result<ate_snapshot::Manifest, VerbError> {
        let gen_dir = &req.generation_dir;
        let sandbox = &entry.sandbox;
        let meta = ate_snapshot::GenerationMeta {
            atespace: req.actor.atespace.clone(),
            name: req.actor.name.clone(),
            generation: req.generation,
            uuid: req.uuid.clone(),
            fidelity: capture.fidelity,
            template: entry.template.clone(),
            sandbox_class: self.sandbox_class(),
            node: req.node.clone(),
            boot_id: req.boot_id.clone(),
            created_unix_ms: now_ms(),
            reason: capture.reason.clone(),
            parent: capture.delta_of.clone(),
        };
        let upper = sandbox.upper_dir();
        let upper = (capture.fidelity != Fidelity::Volumes).then_some(upper.as_path());
        let volumes: Vec<(String, PathBuf)> = entry
            .spec
            .volumes
            .iter()
            // External volumes live outside the actor's snapshots.
            .filter(|v| v.external.is_none())
            .map(|v| (v.name.clone(), sandbox.volume_dir(&v.name)))
            .collect();
        let sidecar_uppers: Vec<(String, PathBuf)> = entry
            .spec
            .containers
            .iter()
            .skip(1)
            .map(|c| (c.name.clone(), sandbox.container_upper_dir(&c.name)))
            .collect();
        let sealed = if at_rest {
            // Hashed and sealed at rest in one read of the dump.
            ate_snapshot::sealed::seal_actor_generation_into(
                write_dir,
                gen_dir,
                meta,
                upper,
                &sidecar_uppers,
                &volumes,
            )
            .await
        } else {
            ate_snapshot::seal_actor_generation(write_dir, meta, upper, &sidecar_uppers, &volumes)
                .await
        };
        sealed.map_err(|e| VerbError::Internal(format!("seal {}: {e}", gen_dir.display())))
    }

    /// Checkpointed or not, the actor no longer runs here. A sealed memory dump of a frozen
    /// sandbox (`kept`) leaves the sandbox frozen in place as a cache of that generation (it
    /// takes the dialer); any other is removed after the reply, holding the actor's lock.
    async fn keep_frozen_or_remove(
        &self,
        key: &str,
        sandbox: &ActorSandbox,
        gen_dir: &Path,
        kept: bool,
        dialer: &mut Option<NetnsDialer>,
        guard: &mut Option<OwnedMutexGuard<()>>,
    ) {
        let entry = self.table().actors.remove(key);
        match entry {
            Some(mut entry) if kept => {
                remove_file_quietly(&entry.sandbox.dir.join(ADOPTION_FILE)).await;
                self.rearm_frozen(key, &mut entry, gen_dir).await;
                self.table().frozen.insert(
                    key.to_string(),
                    Frozen {
                        entry,
                        gen_dir: gen_dir.to_path_buf(),
                        since: Instant::now(),
                        dialer: dialer.take(),
                    },
                );
            }
            _ => {
                // Frozen or stopped, and nothing may adopt it again once its record is gone
                // (now). Removing it (runc delete, netns, cgroup, files: ~0.2 s) is no part of
                // the suspend: done after the reply, holding the actor's lock, so a start of this
                // actor here waits for it. Egress went with ingress, before the dump.
                remove_file_quietly(&sandbox.dir.join(ADOPTION_FILE)).await;
                let runtime = self.runtime.clone();
                let (sandbox, key, held) = (sandbox.clone(), key.to_string(), guard.take());
                tokio::spawn(async move {
                    if let Err(e) = super::remove_sandbox(runtime.as_ref(), &sandbox).await {
                        tracing::warn!(actor = %key, error = %e.message(), "cleanup after checkpoint");
                    }
                    drop(held);
                });
            }
        }
    }

    /// After a checkpoint that wrote nothing: the sandbox thaws (if it is frozen), its egress
    /// proxy comes back, its wakeup probe must pass, and ingress goes on again: the actor runs
    /// on with its memory and the answer is Aborted with `why`. A sandbox that does not come
    /// back (a dump killed inside the actor's processes) is removed, and the answer says the
    /// actor is no longer here: its previous generation is what remains.
    async fn run_on_after_failed_checkpoint(
        &self,
        key: &str,
        entry: &Entry,
        dialer: Option<NetnsDialer>,
        why: VerbError,
    ) -> VerbError {
        let sandbox = &entry.sandbox;
        let back = async {
            if let Some(remnant) = self.runtime.dump_remnants(sandbox).await {
                return Err(VerbError::Internal(format!(
                    "CRIU's parasite code is still in the actor's processes ({remnant}): CRIU was ended inside them"
                )));
            }
            if self
                .runtime
                .is_paused(sandbox)
                .await
                .map_err(|e| sandbox_error("freezer state after a failed checkpoint", e))?
            {
                self.runtime
                    .thaw(sandbox)
                    .await
                    .map_err(|e| sandbox_error("thaw after a failed checkpoint", e))?;
            }
            let netns = sandbox.netns();
            let (egress, probe, dialer) = tokio::join!(
                self.egress.restart(egress_identity(sandbox, entry.activation), &netns, &entry.spec.egress),
                self.wait_probe(sandbox, &entry.spec),
                async {
                    match dialer {
                        Some(d) => Ok(d),
                        None => NetnsDialer::new(&netns).await,
                    }
                },
            );
            egress.map_err(|e| VerbError::Internal(format!("egress for {key}: {e}")))?;
            probe.map_err(|e| {
                VerbError::Internal(format!("the actor does not answer: {}", e.message()))
            })?;
            dialer
                .map_err(|e| VerbError::Internal(format!("socket factory for netns {netns}: {e}")))
        }
        .await;
        match back {
            Ok(dialer) => {
                let record = Workload {
                    actor: ActorRef::new(sandbox.atespace.clone(), sandbox.name.clone()),
                    uid: sandbox.uid.clone(),
                    template: entry.template.clone(),
                    spec: entry.spec.clone(),
                    worker_id: self.ident.id.clone(),
                    activation: entry.activation,
                };
                self.write_adoption(sandbox, &record, entry.pid, None).await;
                self.tunnels.activate(key, entry.activation, dialer);
                tracing::warn!(actor = %key, error = %why.message(), "checkpoint failed; nothing written, the actor runs on");
                VerbError::Aborted(format!(
                    "suspend of {key} failed, nothing was written and the actor runs on: {}",
                    why.message()
                ))
            }
            Err(again) => {
                tracing::error!(actor = %key, error = %why.message(), sandbox = %again.message(), "checkpoint failed and the sandbox did not survive it; removing it");
                self.table().actors.remove(key);
                self.discard_quietly(sandbox).await;
                VerbError::SandboxLost(format!(
                    "checkpoint of {key} failed ({}) and its sandbox did not survive it ({}); nothing was written",
                    why.message(),
                    again.message()
                ))
            }
        }
    }

    fn checkpoint_reply(&self, m: &ate_snapshot::Manifest) -> CheckpointReply {
        CheckpointReply {
            epoch: self.ident.epoch,
            fidelity: m.fidelity,
            reason: m.reason.clone(),
            size_bytes: m.total_size(),
            checksum: m.checksum(),
            kept_frozen: false,
        }
    }
}

/// An earlier attempt of this same suspend (the caller names the same directory on every
/// attempt) that ended in the middle left files in `gen_dir`, and the sandbox is here again
/// (re-adopted by a restarted worker, which may have served since): what it wrote is not this
/// sandbox's state any more. Removed, to be written again from the start.
async fn clear_interrupted_checkpoint(key: &str, gen_dir: &Path) -> Result<(), VerbError> {
    if dir_has_entries(gen_dir).await? {
        tracing::warn!(actor = %key, dir = %gen_dir.display(), "removing what an interrupted checkpoint wrote; dumping again");
        tokio::fs::remove_dir_all(gen_dir)
            .await
            .map_err(|e| VerbError::Internal(format!("remove {}: {e}", gen_dir.display())))?;
    }
    Ok(())
}

/// Where the generation is written: with snapshot keys in plaintext only to a scratch dir on a
/// tmpfs, every file sealed into `gen_dir` at the end (memory reaches the node's disk only
/// sealed); else `gen_dir` itself. Made before anything changes, so failing here costs nothing.
fn write_target(gen_dir: &Path) -> Result<(Option<Scratch>, PathBuf), VerbError> {
    let scratch = match ate_snapshot::sealed::keys() {
        Some(_) => Some(
            Scratch::new("dump")
                .map_err(|e| VerbError::Internal(format!("snapshot scratch dir: {e}")))?,
        ),
        None => None,
    };
    let write_dir = scratch
        .as_ref()
        .map_or_else(|| gen_dir.to_path_buf(), |s| s.path().to_path_buf());
    Ok((scratch, write_dir))
}

/// A dump reads memory through the page tables: pages a lazy restore has not placed yet would
/// be missing from it. Waits until every page is in (the background push takes about a second
/// per GiB here).
async fn wait_lazy_restore_done(key: &str, entry: &Entry) -> Result<(), VerbError> {
    let Some(source) = &entry.page_source else {
        return Ok(());
    };
    match tokio::time::timeout(LAZY_COMPLETE_WAIT, source.finished()).await {
        Ok(Outcome::Done(_)) => Ok(()),
        Ok(Outcome::Failed(why)) => Err(VerbError::FailedPrecondition(format!(
            "actor {key} cannot be checkpointed: its lazy memory restore failed: {why}"
        ))),
        Ok(Outcome::Running) | Err(_) => Err(VerbError::Unavailable(format!(
            "actor {key} is still receiving its memory from a lazy restore after {LAZY_COMPLETE_WAIT:?}; suspend it again later"
        ))),
    }
}

/// An incremental generation is made whole in the background: until then it needs its parent,
/// and whatever reads it first (a restore, an upload) waits for this or does it.
fn flatten_in_background(gen_dir: &Path) {
    let dir = gen_dir.to_path_buf();
    tokio::spawn(async move {
        if let Err(e) = ate_generation::delta::ensure_flat(&dir).await {
            tracing::warn!(generation = %dir.display(), error = %e, "cannot make an incremental generation whole; the next reader tries again");
        }
    });
}

/// The phase metrics and the log line of a sealed generation.
fn report_sealed(
    key: &str,
    manifest: &ate_snapshot::Manifest,
    t: &Timeline,
    at_rest: bool,
    kept: bool,
) {
    crate::metrics::checkpoint_phase("quiesce", t.quiesced);
    crate::metrics::checkpoint_phase("dump_or_stop", t.stopped_at - t.quiesced);
    crate::metrics::checkpoint_phase("seal", t.sealed_at - t.stopped_at);
    tracing::info!(
        actor = %key,
        fidelity = %manifest.fidelity,
        size = manifest.total_size(),
        quiesce_ms = t.quiesced.as_millis() as u64,
        dump_or_stop_ms = (t.stopped_at - t.quiesced).as_millis() as u64,
        seal_ms = (t.sealed_at - t.stopped_at).as_millis() as u64,
        // With snapshot keys the seal hashes and encrypts the dump in one read.
        at_rest = if at_rest { "sealed" } else { "plaintext" },
        total_ms = t.begun.elapsed().as_millis() as u64,
        kept_frozen = kept,
        incremental = manifest.parent.is_some(),
        "generation sealed"
    );
}

/// Copies the working set the page source recorded at the actor's last lazy restore into the
/// new dump (`criu/working-set.json`), so the next restore brings that memory in first. Best
/// effort: without it the next restore only does no prefetch.
async fn carry_working_set(sandbox: &ActorSandbox, criu: &Path) {
    let file = ate_page_source::working_set::FILE;
    let recorded = sandbox.dir.join("criu-restore").join(file);
    match tokio::fs::copy(&recorded, criu.join(file)).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(actor = %key_of(&sandbox.atespace, &sandbox.name), error = %e, "cannot carry the working set into the new generation; its restore will not prefetch");
        }
    }
}

/// Removes what a failed checkpoint wrote of `gen_dir` (nothing half written may look like a
/// generation).
async fn remove_partial_generation(key: &str, gen_dir: &Path) {
    if let Err(rm) = tokio::fs::remove_dir_all(gen_dir).await
        && rm.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(actor = %key, dir = %gen_dir.display(), error = %rm, "cannot remove a partial generation");
    }
}

async fn remove_file_quietly(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %path.display(), error = %e, "cannot remove");
    }
}

async fn dir_has_entries(dir: &Path) -> Result<bool, VerbError> {
    match tokio::fs::read_dir(dir).await {
        Ok(mut rd) => Ok(rd
            .next_entry()
            .await
            .map_err(|e| VerbError::Internal(format!("list {}: {e}", dir.display())))?
            .is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(VerbError::Internal(format!("list {}: {e}", dir.display()))),
    }
}
