//! Start: a workload placed on this worker runs cold or from a generation (or thaws a
//! frozen-in-place copy of exactly that generation), then egress, the wakeup probe, the adoption
//! record and ingress on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

use ate_core::Fidelity;
use ate_core::TemplateSpec;

use super::{
    Entry, StartReply, StartRequest, VerbError, Worker, Workload, egress_identity, key_of,
    sandbox_error,
};
use crate::lazy::PageSource;
use crate::runtime::{ActorSandbox, SandboxSpec};
use ate_egress::ActorIdentity;
use ate_egress::gate::Gate;
use ate_netns::NetnsDialer;

impl Worker {
    pub async fn start(&self, req: StartRequest) -> Result<StartReply, VerbError> {
        let begun = Instant::now();
        let StartRequest {
            workload,
            generation_dir,
            fidelity: requested,
        } = req;
        self.check_addressed(&workload.actor, &workload.worker_id)?;
        let (atespace, name) = (workload.actor.atespace.clone(), workload.actor.name.clone());
        let spec = workload.spec.clone();
        // For the log lines: the generation restored, empty for a cold boot.
        let restore = generation_dir
            .as_deref()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        self.check_sandbox_class(&spec)?;
        let key = key_of(&atespace, &name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;
        self.check_running()?;
        // An exit of an earlier run that was never collected is about a sandbox that is gone.
        self.table()
            .exits
            .retain(|x| !(x.atespace == atespace && x.name == name));
        let activation = workload.activation;
        if let Some(reply) = self.settle_held_copy(&key, &workload).await? {
            return Ok(reply);
        }
        self.check_free_slot()?;
        if let Some(reply) = self
            .thaw_frozen_copy(
                &key,
                &workload,
                generation_dir.as_deref(),
                requested,
                begun,
                &restore,
            )
            .await
        {
            return Ok(reply);
        }
        self.trim_frozen().await;
        let sandbox_spec = self.sandbox_spec_of(&spec).await?;
        let sandbox = self.sandbox_for(&atespace, &name, &workload.uid);
        // External volumes can be attached here, or nothing starts.
        self.prepare_external_volumes(&atespace, &name, &spec)
            .await?;

        // Nothing of an earlier life of this actor on this worker carries over: the generation
        // (or nothing, for a cold boot) is the whole truth.
        self.discard(&sandbox).await?;
        // The log is appended across lives: a failed start quotes only what this one wrote.
        let log_from = tokio::fs::metadata(sandbox.log_path())
            .await
            .map_or(0, |m| m.len());
        let identity = egress_identity(&sandbox, activation);
        let boot = Boot {
            key: &key,
            sandbox,
            sandbox_spec: &sandbox_spec,
            spec,
            generation_dir: generation_dir.as_deref(),
            requested,
            restore: &restore,
            log_from,
            begun,
        };
        let (booted, egress_on) = self.boot_behind_egress_gate(&boot, &identity).await?;
        // The `activate` span runs to the end of the start.
        let (egress_at, probed_at, _activate) = self
            .go_live(boot, &workload, booted, egress_on, identity)
            .await?;
        let ready_ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
        report_started(
            &key,
            generation_dir.is_some(),
            ready_ms,
            egress_at,
            probed_at,
            &restore,
        );
        Ok(StartReply {
            epoch: self.ident.epoch,
            ready_ms,
        })
    }

    fn check_sandbox_class(&self, spec: &TemplateSpec) -> Result<(), VerbError> {
        if spec.sandbox_class != self.sandbox_class() {
            return Err(VerbError::FailedPrecondition(format!(
                "template wants sandbox class {:?}; worker {} runs {:?}",
                spec.sandbox_class,
                self.ident.id,
                self.sandbox_class()
            )));
        }
        Ok(())
    }

    /// A copy of the actor already held here: a retried start of it is answered at once (`Some`);
    /// a newer one refuses the start; an older one (or one of a deleted actor of the same name)
    /// is taken out of the table, its sandbox to go with the discard of the start.
    async fn settle_held_copy(
        &self,
        key: &str,
        workload: &Workload,
    ) -> Result<Option<StartReply>, VerbError> {
        let activation = workload.activation;
        let held = self
            .table()
            .actors
            .get(key)
            .map(|e| (e.sandbox.uid.clone(), e.activation));
        let Some((uid, held)) = held else {
            return Ok(None);
        };
        let same = uid == workload.uid;
        if same && (activation == 0 || held == activation) {
            // A retried start of the copy that runs here (or a re-adopted one the api
            // still names): nothing to do but make sure ingress is on.
            if self.tunnels.get(key).is_none()
                && let Some(dialer) = self.table().adopted.remove(key)
            {
                self.tunnels.activate(key, held, dialer);
                tracing::info!(actor = %key, activation = held, "re-adopted actor named by a start; ingress on");
            }
            if self.tunnels.get(key).is_some() {
                return Ok(Some(StartReply {
                    epoch: self.ident.epoch,
                    ready_ms: 0,
                }));
            }
        }
        if same && activation != 0 && held > activation {
            return Err(VerbError::FailedPrecondition(format!(
                "worker {} holds activation {held} of {key}; this start names the older {activation}",
                self.ident.id
            )));
        }
        // An older copy (or one of a deleted actor of the same name) stops serving before
        // the new activation exists; its sandbox goes with the discard below.
        tracing::info!(actor = %key, held, activation, "replacing an older copy of the actor");
        self.ingress_off(key).await;
        let mut t = self.table();
        t.adopted.remove(key);
        t.actors.remove(key);
        Ok(None)
    }

    fn check_free_slot(&self) -> Result<(), VerbError> {
        let in_use = self.table().actors.len();
        if in_use >= self.ident.slots as usize {
            return Err(VerbError::ResourceExhausted(format!(
                "worker {} has all {} actor slots in use",
                self.ident.id, self.ident.slots
            )));
        }
        Ok(())
    }

    /// Whatever happens next, a frozen copy of this actor stops being a cache: it is thawed
    /// now (a resume of exactly its generation: `Some`) or discarded with the rest of the start.
    async fn thaw_frozen_copy(
        &self,
        key: &str,
        workload: &Workload,
        generation_dir: Option<&Path>,
        requested: Option<Fidelity>,
        begun: Instant,
        restore: &str,
    ) -> Option<StartReply> {
        let frozen = self.table().frozen.remove(key);
        let (Some(f), Some(gen_dir)) = (frozen, generation_dir) else {
            return None;
        };
        let memory = matches!(requested, None | Some(Fidelity::Memory));
        if !(memory && f.gen_dir == gen_dir) {
            return None;
        }
        match self
            .thaw(key, f, &workload.spec, workload)
            .instrument(ate_telemetry::trace_span!("thaw"))
            .await
        {
            Ok(()) => {
                crate::metrics::thawed(true);
                let ready_ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
                tracing::info!(actor = %key, ready_ms, restore, "actor thawed in place; ingress on");
                Some(StartReply {
                    epoch: self.ident.epoch,
                    ready_ms,
                })
            }
            // The generation on disk is intact: restore it the ordinary way.
            Err(e) => {
                crate::metrics::thawed(false);
                tracing::warn!(actor = %key, error = %e.message(), "thaw failed; restoring the generation instead");
                None
            }
        }
    }

    /// The runtime's spec of the sandbox: the template's containers with their images pulled.
    async fn sandbox_spec_of(&self, spec: &TemplateSpec) -> Result<SandboxSpec, VerbError> {
        if spec.containers.is_empty() {
            return Err(VerbError::InvalidArgument(
                "workload.spec has no containers".to_string(),
            ));
        }
        let mut images = Vec::with_capacity(spec.containers.len());
        for c in &spec.containers {
            let image = self
                .images
                .ensure(&c.image)
                .await
                .map_err(|e| sandbox_error(&format!("image {}", c.image), e.into()))?;
            images.push(image);
        }
        let first_image = images.remove(0);
        SandboxSpec::from_template(spec, first_image, images)
            .map_err(|e| sandbox_error("sandbox spec", e))
    }

    /// The sandbox booted (a CRIU restore or a run) while egress starts behind its gate; on a
    /// failure the sandbox is discarded. `Some(true)`: egress started at the gate.
    async fn boot_behind_egress_gate(
        &self,
        b: &Boot<'_>,
        identity: &ActorIdentity,
    ) -> Result<(super::restore::Booted, Option<bool>), VerbError> {
        let (key, sandbox) = (b.key, &b.sandbox);
        // Trace spans of the phases (disabled when traces are off): the sandbox with its netns
        // (a CRIU restore or a run), egress, the wakeup probe, activation.
        let boot_span = if b.generation_dir.is_some() {
            ate_telemetry::trace_span!("restore")
        } else {
            ate_telemetry::trace_span!("run")
        };
        // Egress is on before the sandbox's first instruction: the runtime's hook waits at the
        // gate while the proxy and redirect start in the new netns (see `ate_egress::gate`).
        let mut gate = match Gate::open(&sandbox.egress_gate_dir()) {
            Ok(g) => g,
            Err(e) => {
                self.discard_quietly(sandbox).await;
                return Err(VerbError::Internal(format!(
                    "egress gate for {key} in {}: {e}",
                    sandbox.egress_gate_dir().display()
                )));
            }
        };
        let netns = sandbox.netns();
        let (booted, egress_on) = {
            let boot = self
                .boot(
                    sandbox,
                    b.sandbox_spec,
                    b.generation_dir,
                    b.requested,
                    b.spec.memory_restore,
                )
                .instrument(boot_span);
            let serve = gate.serve(|| {
                self.egress
                    .start(identity.clone(), &netns, &b.spec.egress)
                    .instrument(ate_telemetry::trace_span!("egress"))
            });
            tokio::pin!(boot, serve);
            let mut egress_on = None;
            let booted = loop {
                tokio::select! {
                    booted = &mut boot => break booted,
                    served = &mut serve, if egress_on.is_none() => egress_on = Some(served.is_ok()),
                }
            };
            (booted, egress_on)
        };
        drop(gate);
        match booted {
            Ok(booted) => Ok((booted, egress_on)),
            Err(e) => {
                // The caller (the node) may recover (a damaged node-local copy is replaced by
                // the durable one) without quoting this: the reason is kept here.
                tracing::warn!(actor = %key, restore = b.restore, error = %e.message(), "sandbox not started");
                self.discard_quietly(sandbox).await;
                Err(e)
            }
        }
    }

    /// Egress (where the gate was not passed) and the wakeup probe, then the actor goes live:
    /// its adoption record, its entry in the table and ingress on. On a failure the sandbox is
    /// discarded. Returns when egress was on and the probe passed, and the `activate` span.
    async fn go_live(
        &self,
        b: Boot<'_>,
        workload: &Workload,
        booted: super::restore::Booted,
        egress_on: Option<bool>,
        identity: ActorIdentity,
    ) -> Result<(Duration, Duration, tracing::Span), VerbError> {
        // Declared after the sandbox is discarded on every error path below: a page source is
        // released only once its sandbox is gone.
        let super::restore::Booted {
            pid,
            page_source,
            opened,
        } = booted;
        if egress_on != Some(true) {
            self.egress_after_boot(b.key, &b.sandbox, identity, &b.spec)
                .await?;
        }
        let egress_at = b.begun.elapsed();
        self.probe_or_discard(&b, page_source.as_ref()).await?;
        let probed_at = b.begun.elapsed();
        let activate = ate_telemetry::trace_span!("activate");
        let dialer = self.dialer_or_discard(&b.sandbox).await?;
        self.write_adoption(
            &b.sandbox,
            workload,
            pid,
            page_source.as_ref().map(PageSource::pid),
        )
        .await;
        let (page_source, memory_parent) = keep_page_source(page_source, opened, b.generation_dir);
        self.table().actors.insert(
            b.key.to_string(),
            Entry {
                sandbox: b.sandbox,
                spec: b.spec,
                template: workload.template.clone(),
                pid,
                activation: workload.activation,
                page_source,
                tracker: None,
                memory_parent,
            },
        );
        self.tunnels.activate(b.key, workload.activation, dialer);
        Ok((egress_at, probed_at, activate))
    }

    /// A runtime that ran no hook (none but runc's does): egress right after the start.
    /// Nothing leaks before: the netns has no way out (its only link leads nowhere), so an
    /// early connect just times out or is refused. On a failure the sandbox is discarded.
    async fn egress_after_boot(
        &self,
        key: &str,
        sandbox: &ActorSandbox,
        identity: ActorIdentity,
        spec: &TemplateSpec,
    ) -> Result<(), VerbError> {
        tracing::debug!(actor = %key, "no egress gate was passed: egress starts after the boot");
        if let Err(e) = self
            .egress
            .start(identity, &sandbox.netns(), &spec.egress)
            .instrument(ate_telemetry::trace_span!("egress"))
            .await
        {
            self.discard_quietly(sandbox).await;
            return Err(VerbError::Internal(format!("egress for {key}: {e}")));
        }
        Ok(())
    }

    /// The wakeup probe; on a failure the sandbox is discarded.
    async fn probe_or_discard(
        &self,
        b: &Boot<'_>,
        page_source: Option<&PageSource>,
    ) -> Result<(), VerbError> {
        if let Err(e) = self
            .wait_ready(&b.sandbox, &b.spec, b.sandbox_spec, b.log_from, page_source)
            .instrument(ate_telemetry::trace_span!("probe"))
            .await
        {
            self.discard_quietly(&b.sandbox).await;
            return Err(e);
        }
        Ok(())
    }

    /// The socket factory of the sandbox's netns, for ingress; on a failure the sandbox is
    /// discarded.
    async fn dialer_or_discard(&self, sandbox: &ActorSandbox) -> Result<NetnsDialer, VerbError> {
        match NetnsDialer::new(&sandbox.netns()).await {
            Ok(d) => Ok(d),
            Err(e) => {
                self.discard_quietly(sandbox).await;
                Err(VerbError::Internal(format!(
                    "socket factory for netns {}: {e}",
                    sandbox.netns()
                )))
            }
        }
    }
}

/// What a start boots, for its phases (the sandbox and spec go into the actor's entry).
struct Boot<'a> {
    key: &'a str,
    sandbox: ActorSandbox,
    sandbox_spec: &'a SandboxSpec,
    spec: TemplateSpec,
    generation_dir: Option<&'a Path>,
    requested: Option<Fidelity>,
    /// For the log lines: the generation restored, empty for a cold boot.
    restore: &'a str,
    /// Where this start's part of the actor's log begins (a failed start quotes only it).
    log_from: u64,
    begun: Instant,
}

/// The page source kept in the actor's entry, and the generation a tracked restore's memory is
/// relative to; the opened generation stays until the page source has every page in.
fn keep_page_source(
    page_source: Option<PageSource>,
    opened: Option<ate_snapshot::sealed::Scratch>,
    generation_dir: Option<&Path>,
) -> (Option<Arc<PageSource>>, Option<PathBuf>) {
    // A tracked restore's memory is relative to the generation it came from.
    let memory_parent = generation_dir
        .filter(|_| page_source.as_ref().is_some_and(PageSource::tracks_memory))
        .map(PathBuf::from);
    let page_source = page_source.map(Arc::new);
    if let (Some(source), Some(opened)) = (page_source.clone(), opened) {
        // The page source reads the opened generation until every page is in.
        tokio::spawn(async move {
            source.finished().await;
            drop(opened);
        });
    }
    (page_source, memory_parent)
}

/// The phase metrics and the log line of an actor started.
fn report_started(
    key: &str,
    restored: bool,
    ready_ms: u64,
    egress_at: Duration,
    probed_at: Duration,
    restore: &str,
) {
    let kind = if restored { "restore" } else { "cold" };
    crate::metrics::start_phase(kind, "boot_and_egress", egress_at);
    crate::metrics::start_phase(kind, "probe", probed_at - egress_at);
    tracing::info!(
        actor = %key,
        ready_ms,
        boot_and_egress_ms = egress_at.as_millis() as u64,
        probe_ms = (probed_at - egress_at).as_millis() as u64,
        restore,
        "actor started; ingress on"
    );
}
