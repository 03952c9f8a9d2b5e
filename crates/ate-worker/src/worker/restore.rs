//! Boot: a cold run, or a generation restored at its fidelity (memory eager or lazy, rootfs,
//! volumes), its files checked while the sandbox is built from them.

use std::path::Path;
use std::time::Instant;

use ate_core::Fidelity;
use ate_core::template::MemoryRestore;

use super::{VerbError, Worker, key_of, sandbox_error, snapshot_error};
use crate::lazy::PageSource;
use crate::runtime::{ActorSandbox, RunMode, SandboxSpec};

impl Worker {
    /// Extracts what the fidelity keeps and starts the sandbox; returns the init pid and, for a
    /// lazy memory restore, the page source serving the actor's memory.
    pub(super) async fn boot(
        &self,
        sandbox: &ActorSandbox,
        spec: &SandboxSpec,
        generation_dir: Option<&Path>,
        requested: Option<Fidelity>,
        memory_restore: MemoryRestore,
    ) -> Result<Booted, VerbError> {
        let Some(gen_dir) = generation_dir else {
            // Egress is set up by `start` once this returns (the netns is made by the runtime).
            let started = self
                .runtime
                .run(sandbox, spec, RunMode::KeepRootfs)
                .await
                .map_err(|e| sandbox_error("cold boot", e))?;
            return Ok(Booted {
                pid: started.pid,
                page_source: None,
                opened: None,
            });
        };
        let begun = Instant::now();
        // The manifest first (a sealed one opens in place): the fidelity and whether the
        // restore is lazy decide how much of a sealed generation is opened. An incremental
        // generation is made whole first (usually its background flatten has done so already):
        // a restore never follows a parent.
        let manifest = ate_generation::delta::ensure_flat(gen_dir)
            .await
            .map_err(|e| match e {
                ate_generation::delta::FlattenError::Snapshot(e) => {
                    snapshot_error(&format!("generation {}", gen_dir.display()), e)
                }
                e => VerbError::FailedPrecondition(format!(
                    "generation {} cannot be made whole: {e}",
                    gen_dir.display()
                )),
            })?;
        let fidelity = requested.unwrap_or(manifest.fidelity);
        if fidelity.rank() > manifest.fidelity.rank() {
            return Err(VerbError::FailedPrecondition(format!(
                "generation {} holds {} and cannot be restored at {fidelity}",
                gen_dir.display(),
                manifest.fidelity
            )));
        }
        if fidelity == Fidelity::Memory && manifest.sandbox_class != self.sandbox_class() {
            return Err(VerbError::FailedPrecondition(format!(
                "generation {} was captured by sandbox class {:?}; its memory cannot restore on {:?}",
                gen_dir.display(),
                manifest.sandbox_class,
                self.sandbox_class()
            )));
        }
        if fidelity == Fidelity::Memory && !self.can_restore_memory() {
            return Err(VerbError::FailedPrecondition(format!(
                "worker {} cannot restore memory (no CRIU ≥ 4.2: it offers no memory:criu, so the api does not place memory generations here)",
                self.ident.id
            )));
        }
        // Lazy when this worker has a page source, the template does not ask for eager
        // restores, and every memory image carries chunk digests (generations written before
        // them restore eagerly).
        let lazy = match &self.page_source {
            Some(command)
                if fidelity == Fidelity::Memory
                    && memory_restore == MemoryRestore::Lazy
                    && self.runtime.capabilities().can_restore_lazily
                    && lazy_restorable(&manifest) =>
            {
                Some(command.clone())
            }
            _ => None,
        };
        // A sealed generation is opened into a scratch dir on a tmpfs, and everything below
        // reads that: for a lazy restore only the small files and the chunks CRIU reads itself
        // (the page source opens the other chunks from the sealed images as the actor needs
        // them); for an eager one the small files, when CRIU reads the memory images through
        // the runtime's image streamer (which opens them as CRIU reads), else everything; for
        // a restore without memory the small files. Every frame opened was authenticated on
        // the way and every file's size checked against the (authenticated) manifest, so what
        // was opened needs no second hashing pass.
        let on_disk = gen_dir;
        let opened = if ate_snapshot::sealed::is_encrypted(gen_dir) {
            use ate_snapshot::sealed;
            let scratch = sealed::Scratch::new("restore")
                .map_err(|e| VerbError::Internal(format!("snapshot scratch dir: {e}")))?;
            let opening = if lazy.is_some() && sealed::can_open_lazily() {
                sealed::open_for_lazy_restore(gen_dir, scratch.path(), |dir| {
                    ate_generation::images::eager_chunk_files(&dir.join(ate_snapshot::CRIU_DIR))
                        .map_err(|e| {
                            ate_snapshot::Error::InvalidInput(format!("memory images: {e}"))
                        })
                })
                .await
            } else {
                let which = if fidelity != Fidelity::Memory
                    || self.runtime.capabilities().can_stream_images
                {
                    sealed::Opening::Small
                } else {
                    sealed::Opening::All
                };
                sealed::open_into(gen_dir, scratch.path(), which).await
            };
            opening.map_err(|e| snapshot_error(&format!("generation {}", gen_dir.display()), e))?;
            crate::metrics::start_phase("restore", "open_sealed", begun.elapsed());
            Some(scratch)
        } else {
            None
        };
        let gen_dir = opened.as_ref().map_or(gen_dir, |s| s.path());
        // A generation downloaded for a lazy restore holds only part of its memory (the rest is
        // in the durable store): it cannot be restored eagerly. The node then fetches it whole.
        let partial = ate_snapshot::durable_source(gen_dir)
            .map_err(|e| snapshot_error(&format!("generation {}", gen_dir.display()), e))?;
        if partial.is_some() && fidelity == Fidelity::Memory && lazy.is_none() {
            return Err(VerbError::FailedPrecondition(format!(
                "generation {} holds only part of its memory (the rest is in the durable store) and worker {} restores memory eagerly; fetch the whole generation",
                gen_dir.display(),
                self.ident.id
            )));
        }
        // The files' checksums are checked while the sandbox is built from them (hashing a
        // 50 MiB generation takes ~35 ms, a third of a restore): the restored processes sit in
        // a netns with no way out and get no ingress until this returns, and a mismatch fails
        // the start (the caller discards the sandbox and everything extracted), reported as the
        // checksum error whatever the restore itself made of the damaged files. A lazy restore
        // checks here only the files CRIU reads itself and the chunks of the memory images that
        // hold pages the restorer loads; the page source checks every other chunk as it reads it.
        let verify = async {
            let checked = if opened.is_some() {
                Ok(())
            } else if lazy.is_some() {
                verify_for_lazy_restore(gen_dir, &manifest).await
            } else {
                ate_snapshot::verify_files(gen_dir, &manifest).await
            };
            (checked, begun.elapsed())
        };
        let build = async {
            if fidelity != Fidelity::Volumes && manifest.has_rootfs() {
                ate_snapshot::extract_rootfs(gen_dir, &sandbox.upper_dir())
                    .await
                    .map_err(|e| snapshot_error("extract rootfs", e))?;
            }
            for c in &spec.sidecars {
                // A container the generation does not hold (template change) starts afresh.
                if fidelity != Fidelity::Volumes && manifest.has_container_rootfs(&c.name) {
                    ate_snapshot::extract_container_rootfs(
                        gen_dir,
                        &c.name,
                        &sandbox.container_upper_dir(&c.name),
                    )
                    .await
                    .map_err(|e| snapshot_error(&format!("extract rootfs of {}", c.name), e))?;
                }
            }
            let archived = manifest.volumes();
            for v in &spec.volumes {
                // A volume the generation does not hold (template change) starts empty; an
                // external one is attached as it is (a generation never holds one: a volume
                // made external since keeps its old contents only in the generation).
                if archived.contains(&v.name) && v.external.is_none() {
                    ate_snapshot::extract_volume(gen_dir, &v.name, &sandbox.volume_dir(&v.name))
                        .await
                        .map_err(|e| snapshot_error(&format!("extract volume {}", v.name), e))?;
                }
            }
            let extracted = begun.elapsed();
            // Egress (nftables redirect in the actor netns to the worker's egress listener) is
            // set up by `start` right after this returns: the runtime creates the netns.
            let mut page_source = None;
            let started = match fidelity {
                Fidelity::Memory => match &lazy {
                    Some(command) => {
                        let (started, mut source) = self
                            .runtime
                            .restore_lazily(sandbox, spec, gen_dir, command)
                            .await
                            .map_err(|e| restore_error("lazy memory restore", e))?;
                        if opened.is_some() {
                            source.serves_generation(on_disk);
                        }
                        page_source = Some(source);
                        started
                    }
                    None => self
                        .runtime
                        .restore(sandbox, spec, &gen_dir.join(ate_snapshot::CRIU_DIR))
                        .await
                        .map_err(|e| restore_error("memory restore", e))?,
                },
                Fidelity::Rootfs => self
                    .runtime
                    .run(sandbox, spec, RunMode::KeepRootfs)
                    .await
                    .map_err(|e| sandbox_error("rootfs restart", e))?,
                Fidelity::Volumes => self
                    .runtime
                    .run(sandbox, spec, RunMode::FreshRootfs)
                    .await
                    .map_err(|e| sandbox_error("volumes restart", e))?,
            };
            Ok::<_, VerbError>((started, extracted, page_source))
        };
        let ((checked, verified), built) = tokio::join!(verify, build);
        // On a failed check a page source must not be released before its sandbox is gone:
        // stop the sandbox here, then drop the handle (the caller removes the rest).
        if let Err(e) = checked {
            if let Ok((_, _, Some(source))) = &built {
                source.kill();
                if let Err(stop) = self.runtime.stop(sandbox).await {
                    tracing::warn!(container = %sandbox.container_id(), error = %stop, "stop after a failed generation check");
                }
            }
            drop(built);
            return Err(snapshot_error(
                &format!("generation {}", on_disk.display()),
                e,
            ));
        }
        let (started, extracted, page_source) = built?;
        crate::metrics::start_phase("restore", "verify", verified);
        crate::metrics::start_phase("restore", "extract", extracted);
        crate::metrics::start_phase("restore", "runtime", begun.elapsed() - extracted);
        tracing::debug!(
            actor = %key_of(&sandbox.atespace, &sandbox.name),
            fidelity = ?fidelity,
            verify_ms = verified.as_millis() as u64,
            extract_ms = extracted.as_millis() as u64,
            runtime_ms = (begun.elapsed() - extracted).as_millis() as u64,
            lazy = page_source.is_some(),
            "generation restored"
        );
        Ok(Booted {
            pid: started.pid,
            page_source,
            opened,
        })
    }
}

/// What [`Worker::boot`] started.
pub(super) struct Booted {
    /// The init pid.
    pub(super) pid: Option<u32>,
    /// A lazy memory restore's page source.
    pub(super) page_source: Option<PageSource>,
    /// The plaintext of a sealed generation, opened for this restore: the page source reads it
    /// until every page is in (without one, it may go at once).
    pub(super) opened: Option<ate_snapshot::sealed::Scratch>,
}

/// Every memory image of the generation carries chunk digests (a page source can check each
/// chunk as it reads it).
fn lazy_restorable(manifest: &ate_snapshot::Manifest) -> bool {
    let mut pages = manifest
        .files
        .iter()
        .filter(|f| ate_snapshot::is_memory_pages_file(&f.path))
        .peekable();
    pages.peek().is_some() && pages.all(|f| f.size == 0 || f.chunk_count() > 0)
}

/// What a lazy restore checks before the actor gets ingress: every file but the memory images
/// in full, and of the memory images the chunks holding pages CRIU's restorer loads itself
/// (stacks and other pages it does not leave to the page source).
async fn verify_for_lazy_restore(
    gen_dir: &Path,
    manifest: &ate_snapshot::Manifest,
) -> ate_snapshot::Result<()> {
    ate_snapshot::verify_files_except_chunked(gen_dir, manifest).await?;
    let criu_dir = gen_dir.join(ate_snapshot::CRIU_DIR);
    let dir = gen_dir.to_path_buf();
    let m = manifest.clone();
    tokio::task::spawn_blocking(move || {
        let which = ate_generation::images::eager_chunk_files(&criu_dir)
            .map_err(|e| ate_snapshot::Error::InvalidInput(format!("memory images: {e}")))?;
        ate_snapshot::verify_chunks(&dir, &m, &which)
    })
    .await
    .map_err(|e| ate_snapshot::Error::InvalidInput(format!("chunk check task: {e}")))?
}

/// A failed memory restore as a verb error: one that was interrupted (a process of it killed)
/// is UNAVAILABLE, so the api keeps the actor RESUMING and tries the same generation again;
/// any other is the generation's or the runtime's fault (see [`sandbox_error`]).
fn restore_error(what: &str, e: crate::error::SandboxError) -> VerbError {
    if e.interrupted() {
        VerbError::Unavailable(format!(
            "{what} interrupted, the generation is intact; try again: {e}"
        ))
    } else {
        sandbox_error(what, e)
    }
}
