//! Start: a workload placed on this worker runs cold or from a generation (or thaws a
//! frozen-in-place copy of exactly that generation), then egress, the wakeup probe, the adoption
//! record and ingress on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

use ate_core::Fidelity;

use super::{
    Entry, StartReply, StartRequest, VerbError, Worker, egress_identity, key_of, sandbox_error,
};
use crate::egress::gate::Gate;
use crate::lazy::PageSource;
use crate::netns::NetnsDialer;
use crate::runtime::SandboxSpec;

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
        if spec.sandbox_class != self.sandbox_class() {
            return Err(VerbError::FailedPrecondition(format!(
                "template wants sandbox class {:?}; worker {} runs {:?}",
                spec.sandbox_class,
                self.ident.id,
                self.sandbox_class()
            )));
        }
        let key = key_of(&atespace, &name);
        let lock = self.lock_for(&key);
        let _guard = lock.lock().await;
        self.check_running()?;
        // An exit of an earlier run that was never collected is about a sandbox that is gone.
        self.table()
            .exits
            .retain(|x| !(x.atespace == atespace && x.name == name));
        let activation = workload.activation;
        let held = self
            .table()
            .actors
            .get(&key)
            .map(|e| (e.sandbox.uid.clone(), e.activation));
        if let Some((uid, held)) = held {
            let same = uid == workload.uid;
            if same && (activation == 0 || held == activation) {
                // A retried start of the copy that runs here (or a re-adopted one the api
                // still names): nothing to do but make sure ingress is on.
                if self.tunnels.get(&key).is_none()
                    && let Some(dialer) = self.table().adopted.remove(&key)
                {
                    self.tunnels.activate(&key, held, dialer);
                    tracing::info!(actor = %key, activation = held, "re-adopted actor named by a start; ingress on");
                }
                if self.tunnels.get(&key).is_some() {
                    return Ok(StartReply {
                        epoch: self.ident.epoch,
                        ready_ms: 0,
                    });
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
            self.ingress_off(&key).await;
            let mut t = self.table();
            t.adopted.remove(&key);
            t.actors.remove(&key);
        }
        let in_use = self.table().actors.len();
        if in_use >= self.ident.slots as usize {
            return Err(VerbError::ResourceExhausted(format!(
                "worker {} has all {} actor slots in use",
                self.ident.id, self.ident.slots
            )));
        }
        // Whatever happens next, a frozen copy of this actor stops being a cache: it is thawed
        // now (a resume of exactly its generation) or discarded with the rest below.
        let frozen = self.table().frozen.remove(&key);
        if let (Some(f), Some(gen_dir)) = (frozen, generation_dir.as_deref()) {
            let memory = matches!(requested, None | Some(Fidelity::Memory));
            if memory && f.gen_dir == gen_dir {
                match self
                    .thaw(&key, f, &spec, &workload)
                    .instrument(ate_tls::trace_span!("thaw"))
                    .await
                {
                    Ok(()) => {
                        crate::metrics::thawed(true);
                        let ready_ms =
                            u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
                        tracing::info!(actor = %key, ready_ms, restore = restore.as_str(), "actor thawed in place; ingress on");
                        return Ok(StartReply {
                            epoch: self.ident.epoch,
                            ready_ms,
                        });
                    }
                    // The generation on disk is intact: restore it the ordinary way.
                    Err(e) => {
                        crate::metrics::thawed(false);
                        tracing::warn!(actor = %key, error = %e.message(), "thaw failed; restoring the generation instead")
                    }
                }
            }
        }
        self.trim_frozen().await;
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
                .map_err(|e| sandbox_error(&format!("image {}", c.image), e))?;
            images.push(image);
        }
        let first_image = images.remove(0);
        let sandbox_spec = SandboxSpec::from_template(&spec, first_image, images)
            .map_err(|e| sandbox_error("sandbox spec", e))?;
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
        // Trace spans of the phases (disabled when traces are off): the sandbox with its netns
        // (a CRIU restore or a run), egress, the wakeup probe, activation.
        let boot_span = if generation_dir.is_some() {
            ate_tls::trace_span!("restore")
        } else {
            ate_tls::trace_span!("run")
        };
        // Egress is on before the sandbox's first instruction: the runtime's hook waits at the
        // gate while the proxy and redirect start in the new netns (see `egress::gate`).
        let mut gate = match Gate::open(&sandbox.egress_gate_dir()) {
            Ok(g) => g,
            Err(e) => {
                self.discard_quietly(&sandbox).await;
                return Err(VerbError::Internal(format!(
                    "egress gate for {key} in {}: {e}",
                    sandbox.egress_gate_dir().display()
                )));
            }
        };
        let identity = egress_identity(&sandbox, activation);
        let netns = sandbox.netns();
        let (booted, egress_on) = {
            let boot = self
                .boot(
                    &sandbox,
                    &sandbox_spec,
                    generation_dir.as_deref(),
                    requested,
                    spec.memory_restore,
                )
                .instrument(boot_span);
            let serve = gate.serve(|| {
                self.egress
                    .start(identity.clone(), &netns, &spec.egress)
                    .instrument(ate_tls::trace_span!("egress"))
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
        // Declared after the sandbox is discarded on every error path below: a page source is
        // released only once its sandbox is gone.
        let super::restore::Booted {
            pid,
            page_source,
            opened,
        } = match booted {
            Ok(booted) => booted,
            Err(e) => {
                // The caller (the node) may recover (a damaged node-local copy is replaced by
                // the durable one) without quoting this: the reason is kept here.
                tracing::warn!(actor = %key, restore = restore.as_str(), error = %e.message(), "sandbox not started");
                self.discard_quietly(&sandbox).await;
                return Err(e);
            }
        };
        // A runtime that ran no hook (none but runc's does): egress right after the start.
        // Nothing leaks before: the netns has no way out (its only link leads nowhere), so an
        // early connect just times out or is refused.
        if egress_on != Some(true) {
            tracing::debug!(actor = %key, "no egress gate was passed: egress starts after the boot");
            if let Err(e) = self
                .egress
                .start(identity, &netns, &spec.egress)
                .instrument(ate_tls::trace_span!("egress"))
                .await
            {
                self.discard_quietly(&sandbox).await;
                return Err(VerbError::Internal(format!("egress for {key}: {e}")));
            }
        }
        let egress_at = begun.elapsed();
        if let Err(e) = self
            .wait_ready(
                &sandbox,
                &spec,
                &sandbox_spec,
                log_from,
                page_source.as_ref(),
            )
            .instrument(ate_tls::trace_span!("probe"))
            .await
        {
            self.discard_quietly(&sandbox).await;
            return Err(e);
        }
        let probed_at = begun.elapsed();
        let _activate = ate_tls::trace_span!("activate");
        let dialer = match NetnsDialer::new(&sandbox.netns()).await {
            Ok(d) => d,
            Err(e) => {
                self.discard_quietly(&sandbox).await;
                return Err(VerbError::Internal(format!(
                    "socket factory for netns {}: {e}",
                    sandbox.netns()
                )));
            }
        };
        self.write_adoption(
            &sandbox,
            &workload,
            pid,
            page_source.as_ref().map(PageSource::pid),
        )
        .await;
        // A tracked restore's memory is relative to the generation it came from.
        let memory_parent = generation_dir
            .as_ref()
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
        self.table().actors.insert(
            key.clone(),
            Entry {
                sandbox,
                spec,
                template: workload.template.clone(),
                pid,
                activation,
                page_source,
                tracker: None,
                memory_parent,
            },
        );
        self.tunnels.activate(&key, activation, dialer);
        let ready_ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
        let kind = if generation_dir.is_some() {
            "restore"
        } else {
            "cold"
        };
        crate::metrics::start_phase(kind, "boot_and_egress", egress_at);
        crate::metrics::start_phase(kind, "probe", probed_at - egress_at);
        tracing::info!(
            actor = %key,
            ready_ms,
            boot_and_egress_ms = egress_at.as_millis() as u64,
            probe_ms = (probed_at - egress_at).as_millis() as u64,
            restore = restore.as_str(),
            "actor started; ingress on"
        );
        Ok(StartReply {
            epoch: self.ident.epoch,
            ready_ms,
        })
    }
}
