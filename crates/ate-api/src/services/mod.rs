//! tonic service implementations: validation at the boundary, then the store or a workflow.
//! This file holds what the services share (the request checks, [`Services`], `to_completion`);
//! each service has a file of its own: `actor` (ActorService), `alarms` (AlarmService),
//! `catalog` (AtespaceService, TemplateService, TagService), `events` (ActorService's
//! ListEvents and watches), `exec` (ActorService.ExecActor),
//! `fleet` (FleetService),
//! `identity` (IdentityService).

mod actor;
mod alarms;
mod catalog;
mod events;
mod exec;
mod fleet;
mod identity;

use std::collections::BTreeMap;
use std::sync::Arc;

use ate_core::{ActorRef, ActorState, validate_label};
use ate_proto::v1;
use tonic::{Request, Response, Status};

use crate::authz::{Authz, Caller, Need};
use crate::convert::{self, invalid, store_status};
use crate::error::WorkflowError;
use crate::workflows::Api;

const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;

/// A DNS-1123 label or InvalidArgument naming the field.
fn label(field: &str, value: &str) -> Result<(), Status> {
    validate_label(field, value).map_err(invalid)
}

/// A request's optional atespace filter: None when empty (every atespace), else the validated
/// label.
fn atespace_filter(atespace: &str) -> Result<Option<&str>, Status> {
    if atespace.is_empty() {
        return Ok(None);
    }
    label("atespace", atespace)?;
    Ok(Some(atespace))
}

fn actor_ref(r: Option<v1::ObjectRef>) -> Result<ActorRef, Status> {
    let r = r.ok_or_else(|| Status::invalid_argument("invalid actor: missing"))?;
    let a = ActorRef::new(r.atespace, r.name);
    a.validate().map_err(invalid)?;
    Ok(a)
}

fn selector(
    field: &str,
    map: std::collections::HashMap<String, String>,
) -> Result<BTreeMap<String, String>, Status> {
    let sel: BTreeMap<String, String> = map.into_iter().collect();
    ate_core::selector::validate(field, &sel).map_err(invalid)?;
    Ok(sel)
}

/// The answer to a call that is one store call: `to_wire` of what the store returns, or the
/// store's error as its status.
async fn reply<T, W>(
    call: impl Future<Output = Result<T, ate_store::StoreError>>,
    to_wire: impl FnOnce(&T) -> W,
) -> Result<Response<W>, Status> {
    Ok(Response::new(to_wire(&call.await.map_err(store_status)?)))
}

/// Page tokens are the last (atespace, name) of the previous page, `atespace/name`.
fn parse_page_token(token: &str) -> Result<Option<(String, String)>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    let r = ActorRef::parse(token)
        .map_err(|_| Status::invalid_argument(format!("invalid page_token: {token:?}")))?;
    Ok(Some((r.atespace, r.name)))
}

/// The atespace named by an actor reference (empty if missing; validation reports that).
fn ref_atespace(r: &Option<v1::ObjectRef>) -> &str {
    r.as_ref().map(|r| r.atespace.as_str()).unwrap_or_default()
}

#[derive(Clone)]
pub struct Services {
    pub api: Arc<Api>,
    pub authz: Arc<Authz>,
}

impl Services {
    /// A node agent bound to a node may touch only workers of that node: Ok if `caller` is not
    /// such a node agent or worker `worker_id` is unknown or belongs to its node.
    async fn check_node_worker(
        &self,
        caller: &Caller,
        rpc: &str,
        worker_id: &str,
    ) -> Result<(), Status> {
        let Some(Some(node)) = caller.node_agent() else {
            return Ok(());
        };
        match self.api.store.get_worker(worker_id).await {
            Ok(w) if w.node != node => Err(caller.deny(
                rpc,
                &format!("worker {worker_id}"),
                &format!("the worker belongs to node {}", w.node),
            )),
            Ok(_) | Err(ate_store::StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(store_status(e)),
        }
    }

    /// SuspendActor by a node agent (idle suspend): only an actor bound to a worker of the
    /// caller's own node. The shared node identity names no node and may not suspend.
    async fn check_node_actor(
        &self,
        caller: &Caller,
        node: Option<&str>,
        r: &ActorRef,
    ) -> Result<(), Status> {
        const RPC: &str = "ActorService/SuspendActor";
        let target = format!("actor {r}");
        let Some(node) = node else {
            return Err(caller.deny(
                RPC,
                &target,
                "this node identity names no node (use a per-node identity \
                 …/sa/ate-node-<node> or a token with ate_node)",
            ));
        };
        let actor = self.api.store.get_actor(r).await.map_err(store_status)?;
        let Some(worker_id) = actor.worker_id.as_deref() else {
            return Err(caller.deny(
                RPC,
                &target,
                &format!("the actor is not on a worker of node {node}"),
            ));
        };
        let owner = match self.api.store.get_worker(worker_id).await {
            Ok(w) => w.node,
            Err(ate_store::StoreError::NotFound(_)) => String::from("(unknown)"),
            Err(e) => return Err(store_status(e)),
        };
        if owner != node {
            return Err(caller.deny(
                RPC,
                &target,
                &format!("the actor is on worker {worker_id} of node {owner}, not node {node}"),
            ));
        }
        Ok(())
    }

    /// A worker may touch only the alarm or token of an actor that runs on it now: the actor bound to
    /// that worker (any worker for the shared identity) at the activation the worker names.
    async fn check_worker_actor(
        &self,
        caller: &Caller,
        rpc: &str,
        r: &ActorRef,
        activation: u64,
    ) -> Result<(), Status> {
        let Some(worker) = caller.worker() else {
            return Ok(());
        };
        let target = format!("actor {r}");
        let actor = self.api.store.get_actor(r).await.map_err(store_status)?;
        let live = matches!(
            actor.state,
            ActorState::Resuming | ActorState::Running | ActorState::Suspending
        );
        let here = match worker {
            Some(w) => actor.worker_id.as_deref() == Some(w),
            None => actor.worker_id.is_some(),
        };
        if !live || !here || activation == 0 || actor.activation != activation {
            return Err(caller.deny(
                rpc,
                &target,
                &format!(
                    "the actor does not run on this worker at activation {activation} (it is {:?} at activation {})",
                    actor.state, actor.activation
                ),
            ));
        }
        Ok(())
    }

    /// The caller of `req`, if its role allows `rpc` with what `need` reads from the message.
    fn authorize<T>(
        &self,
        req: &Request<T>,
        rpc: &str,
        need: fn(&T) -> Need<'_>,
    ) -> Result<Caller, Status> {
        let caller = self.authz.caller(req)?;
        caller.check(rpc, need(req.get_ref()))?;
        Ok(caller)
    }
}

/// Runs a mutating workflow as its own task, so it reaches its end even when the caller goes
/// away: tonic drops a handler's future when the client disconnects or its deadline passes, which
/// would stop a workflow between two steps (an actor left SUSPENDING or RESUMING, its lease held
/// until the renewal task noticed nothing). A started resume is never cancelled (spec).
async fn to_completion<T: Send + 'static>(
    work: impl Future<Output = Result<T, WorkflowError>> + Send + 'static,
) -> Result<T, Status> {
    tokio::spawn(work)
        .await
        .map_err(|e| Status::internal(format!("workflow task failed: {e}")))?
        .map_err(convert::status)
}
