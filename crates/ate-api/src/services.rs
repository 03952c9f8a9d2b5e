//! tonic service implementations: validation at the boundary, then the store or a workflow.

use std::collections::BTreeMap;
use std::sync::Arc;

use ate_core::names::parse_namespaced;
use ate_core::{ActorRef, ActorState, DurableStatus, SuspendMode, validate_label};
use ate_proto::v1::{self, *};
use ate_store::{ActorRecord, Capacity, TagRecord, WorkerRecord, WorkerStatus};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::authz::{Authz, Caller, Need};
use crate::convert::{self, invalid, store_status};
use crate::error::WorkflowError;
use crate::workflows::Api;
use ate_core::clock::now_ms;

const DEFAULT_PAGE_SIZE: u32 = 100;
/// Longest grace a suspend may give requests in flight.
const MAX_SUSPEND_GRACE_MS: u32 = 600_000;
const MAX_PAGE_SIZE: u32 = 1000;

/// A DNS-1123 label or InvalidArgument naming the field.
/// Longest wait for the store to record a heartbeat (the node waits 3 s for the answer).
const HEARTBEAT_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

fn label(field: &str, value: &str) -> Result<(), Status> {
    validate_label(field, value).map_err(invalid)
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
        let actor = self
            .api
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(store_status)?;
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

#[tonic::async_trait]
impl actor_service_server::ActorService for Services {
    async fn create_actor(
        &self,
        req: Request<CreateActorRequest>,
    ) -> Result<Response<Actor>, Status> {
        let _ = self.authorize(&req, "ActorService/CreateActor", |r| {
            Need::Atespace(&r.atespace)
        })?;
        let req = req.into_inner();
        label("atespace", &req.atespace)?;
        label("actor name", &req.name)?;
        let (tns, tname) = parse_namespaced("template", &req.template).map_err(invalid)?;
        let worker_selector = selector("worker_selector", req.worker_selector)?;
        let now = now_ms();
        let record = ActorRecord {
            atespace: req.atespace,
            name: req.name,
            uid: uuid::Uuid::new_v4().to_string(),
            template: format!("{tns}/{tname}"),
            state: ActorState::Suspended,
            worker_selector,
            worker_id: None,
            epoch: 0,
            generation: 0,
            attached_node: None,
            last_error: String::new(),
            created_ms: now,
            updated_ms: now,
            activation: 0,
        };
        let created = self
            .api
            .store
            .create_actor(&record)
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::actor(&created, None)))
    }

    async fn get_actor(&self, req: Request<GetActorRequest>) -> Result<Response<Actor>, Status> {
        let _ = self.authorize(&req, "ActorService/GetActor", |r| {
            Need::Atespace(ref_atespace(&r.actor))
        })?;
        let r = actor_ref(req.into_inner().actor)?;
        let a = self
            .api
            .store
            .get_actor(&r.atespace, &r.name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::actor_view(
            &self.api.actor_view(a).await,
        )))
    }

    async fn read_actor_log(
        &self,
        req: Request<ReadActorLogRequest>,
    ) -> Result<Response<ReadActorLogResponse>, Status> {
        let _ = self.authorize(&req, "ActorService/ReadActorLog", |r| {
            Need::Atespace(ref_atespace(&r.actor))
        })?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        let log = self.api.read_log(&r, req.offset).await?;
        Ok(Response::new(convert::actor_log(log)))
    }

    async fn list_actors(
        &self,
        req: Request<ListActorsRequest>,
    ) -> Result<Response<ListActorsResponse>, Status> {
        let caller = self.authorize(&req, "ActorService/ListActors", |r| {
            if r.atespace.is_empty() {
                Need::List
            } else {
                Need::Atespace(&r.atespace)
            }
        })?;
        let req = req.into_inner();
        if !req.atespace.is_empty() {
            label("atespace", &req.atespace)?;
        }
        let limit = match req.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let after = parse_page_token(&req.page_token)?;
        let atespace = Some(req.atespace.as_str()).filter(|a| !a.is_empty());
        let rows = self
            .api
            .store
            .list_actors(
                atespace,
                after.as_ref().map(|(a, n)| (a.as_str(), n.as_str())),
                limit,
            )
            .await
            .map_err(store_status)?;
        let next_page_token = if rows.len() as u32 == limit {
            rows.last()
                .map(|a| format!("{}/{}", a.atespace, a.name))
                .unwrap_or_default()
        } else {
            String::new()
        };
        let workers = self.api.fleet.workers().await.map_err(store_status)?;
        let actors = rows
            .iter()
            .filter(|a| caller.sees(&a.atespace))
            .map(|a| {
                convert::actor(
                    a,
                    a.worker_id
                        .as_ref()
                        .and_then(|id| workers.iter().find(|w| &w.id == id)),
                )
            })
            .collect();
        Ok(Response::new(ListActorsResponse {
            actors,
            next_page_token,
        }))
    }

    async fn update_actor(
        &self,
        req: Request<UpdateActorRequest>,
    ) -> Result<Response<Actor>, Status> {
        let _ = self.authorize(&req, "ActorService/UpdateActor", |r| {
            Need::Atespace(ref_atespace(&r.actor))
        })?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        let sel = selector("worker_selector", req.worker_selector)?;
        let a = self
            .api
            .store
            .update_actor_selector(&r.atespace, &r.name, &sel, now_ms())
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::actor_view(
            &self.api.actor_view(a).await,
        )))
    }

    async fn delete_actor(
        &self,
        req: Request<DeleteActorRequest>,
    ) -> Result<Response<DeleteActorResponse>, Status> {
        let _ = self.authorize(&req, "ActorService/DeleteActor", |r| {
            Need::Atespace(ref_atespace(&r.actor))
        })?;
        let req = req.into_inner();
        let force = req.force;
        let r = actor_ref(req.actor)?;
        let api = self.api.clone();
        let stopped = to_completion(async move { api.delete(&r, force).await }).await?;
        Ok(Response::new(DeleteActorResponse { stopped }))
    }

    async fn resume_actor(
        &self,
        req: Request<ResumeActorRequest>,
    ) -> Result<Response<ResumeActorResponse>, Status> {
        let _ = self.authorize(&req, "ActorService/ResumeActor", |r| {
            Need::Resume(ref_atespace(&r.actor))
        })?;
        // The router's request id (`x-request-id` metadata), or a new one for another caller:
        // every log line of the workflow carries it, and the node calls pass it on.
        let request_id = match ate_proto::request_id::of(&req) {
            Some(id) => id.to_string(),
            None => {
                String::from_utf8_lossy(&ate_core::request_id::hex_id(rand::random())).into_owned()
            }
        };
        let (metadata, _, message) = req.into_parts();
        let r = actor_ref(message.actor)?;
        let span = tracing::info_span!(
            "resume",
            request_id = %request_id,
            trace_id = tracing::field::Empty,
            actor = %r,
            atespace = tracing::field::Empty,
            name = tracing::field::Empty,
        );
        if ate_tls::trace_context::enabled() {
            // The spec's tags for following one resume: the actor's atespace and name (the log
            // lines have both in `actor` already).
            span.record("atespace", r.atespace.as_str());
            span.record("name", r.name.as_str());
        }
        ate_tls::trace_context::continue_metadata(&span, &metadata);
        let api = self.api.clone();
        let work = async move { api.resume(&r, Some(&request_id)).await };
        let (actor, resumed) = to_completion(work.instrument(span)).await?;
        Ok(Response::new(ResumeActorResponse {
            actor: Some(convert::actor_view(&actor)),
            resumed,
        }))
    }

    async fn suspend_actor(
        &self,
        req: Request<SuspendActorRequest>,
    ) -> Result<Response<Actor>, Status> {
        let caller = self.authorize(&req, "ActorService/SuspendActor", |r| {
            Need::Suspend(ref_atespace(&r.actor))
        })?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        if let Some(node) = caller.node_agent() {
            self.check_node_actor(&caller, node, &r).await?;
        }
        let durable = match req.mode {
            0 => false,
            n => match SuspendMode::from_wire(n) {
                Some(SuspendMode::Durable) => true,
                Some(SuspendMode::Async) => false,
                None => {
                    return Err(Status::invalid_argument(format!(
                        "invalid mode: unknown suspend mode {n}"
                    )));
                }
            },
        };
        if req.grace_ms > MAX_SUSPEND_GRACE_MS {
            return Err(Status::invalid_argument(format!(
                "invalid grace_ms: at most {MAX_SUSPEND_GRACE_MS} (10 minutes)"
            )));
        }
        let grace_ms = req.grace_ms;
        let api = self.api.clone();
        let suspended =
            to_completion(async move { api.suspend_with_grace(&r, durable, grace_ms).await })
                .await?;
        Ok(Response::new(convert::actor_view(&suspended)))
    }

    async fn revert_actor(
        &self,
        req: Request<RevertActorRequest>,
    ) -> Result<Response<Actor>, Status> {
        let _ = self.authorize(&req, "ActorService/RevertActor", |r| {
            Need::Atespace(ref_atespace(&r.actor))
        })?;
        let r = actor_ref(req.into_inner().actor)?;
        let api = self.api.clone();
        let reverted = to_completion(async move { api.revert(&r).await }).await?;
        Ok(Response::new(convert::actor_view(&reverted)))
    }
}

#[tonic::async_trait]
impl atespace_service_server::AtespaceService for Services {
    async fn create_atespace(
        &self,
        req: Request<CreateAtespaceRequest>,
    ) -> Result<Response<Atespace>, Status> {
        let _ = self.authorize(&req, "AtespaceService/CreateAtespace", |r| {
            Need::Atespace(&r.name)
        })?;
        let name = req.into_inner().name;
        label("atespace", &name)?;
        let a = self
            .api
            .store
            .create_atespace(&name, now_ms())
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::atespace(&a)))
    }

    async fn get_atespace(
        &self,
        req: Request<GetAtespaceRequest>,
    ) -> Result<Response<Atespace>, Status> {
        let _ = self.authorize(&req, "AtespaceService/GetAtespace", |r| {
            Need::Atespace(&r.name)
        })?;
        let name = req.into_inner().name;
        label("atespace", &name)?;
        let a = self
            .api
            .store
            .get_atespace(&name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::atespace(&a)))
    }

    async fn list_atespaces(
        &self,
        _req: Request<ListAtespacesRequest>,
    ) -> Result<Response<ListAtespacesResponse>, Status> {
        let caller = self.authorize(&_req, "AtespaceService/ListAtespaces", |_| Need::List)?;
        let rows = self
            .api
            .store
            .list_atespaces()
            .await
            .map_err(store_status)?;
        Ok(Response::new(ListAtespacesResponse {
            atespaces: rows
                .iter()
                .filter(|a| caller.sees(&a.name))
                .map(convert::atespace)
                .collect(),
        }))
    }

    async fn delete_atespace(
        &self,
        req: Request<DeleteAtespaceRequest>,
    ) -> Result<Response<DeleteAtespaceResponse>, Status> {
        let _ = self.authorize(&req, "AtespaceService/DeleteAtespace", |r| {
            Need::Atespace(&r.name)
        })?;
        let name = req.into_inner().name;
        label("atespace", &name)?;
        self.api
            .store
            .delete_atespace(&name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(DeleteAtespaceResponse {}))
    }
}

#[tonic::async_trait]
impl template_service_server::TemplateService for Services {
    async fn apply_template(
        &self,
        req: Request<ApplyTemplateRequest>,
    ) -> Result<Response<ActorTemplate>, Status> {
        let _ = self.authorize(&req, "TemplateService/ApplyTemplate", |_| Need::Admin)?;
        let t = req
            .into_inner()
            .template
            .ok_or_else(|| Status::invalid_argument("invalid template: missing"))?;
        label("template namespace", &t.namespace)?;
        label("template name", &t.name)?;
        let wire = t
            .spec
            .ok_or_else(|| Status::invalid_argument("invalid spec: missing"))?;
        let spec = ate_proto::spec_from_wire(&wire).map_err(invalid)?;
        let rec = self
            .api
            .store
            .apply_template(&t.namespace, &t.name, &spec, now_ms())
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::template(&rec)))
    }

    async fn get_template(
        &self,
        req: Request<GetTemplateRequest>,
    ) -> Result<Response<ActorTemplate>, Status> {
        let _ = self.authorize(&req, "TemplateService/GetTemplate", |_| Need::Admin)?;
        let req = req.into_inner();
        label("template namespace", &req.namespace)?;
        label("template name", &req.name)?;
        let rec = self
            .api
            .store
            .get_template(&req.namespace, &req.name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::template(&rec)))
    }

    async fn list_templates(
        &self,
        req: Request<ListTemplatesRequest>,
    ) -> Result<Response<ListTemplatesResponse>, Status> {
        let _ = self.authorize(&req, "TemplateService/ListTemplates", |_| Need::Admin)?;
        let ns = req.into_inner().namespace;
        if !ns.is_empty() {
            label("template namespace", &ns)?;
        }
        let rows = self
            .api
            .store
            .list_templates(Some(ns.as_str()).filter(|n| !n.is_empty()))
            .await
            .map_err(store_status)?;
        Ok(Response::new(ListTemplatesResponse {
            templates: rows.iter().map(convert::template).collect(),
        }))
    }

    async fn delete_template(
        &self,
        req: Request<DeleteTemplateRequest>,
    ) -> Result<Response<DeleteTemplateResponse>, Status> {
        let _ = self.authorize(&req, "TemplateService/DeleteTemplate", |_| Need::Admin)?;
        let req = req.into_inner();
        label("template namespace", &req.namespace)?;
        label("template name", &req.name)?;
        self.api
            .store
            .delete_template(&req.namespace, &req.name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(DeleteTemplateResponse {}))
    }
}

#[tonic::async_trait]
impl tag_service_server::TagService for Services {
    async fn create_tag(&self, req: Request<CreateTagRequest>) -> Result<Response<Tag>, Status> {
        let _ = self.authorize(&req, "TagService/CreateTag", |_| Need::Admin)?;
        let req = req.into_inner();
        label("atespace", &req.atespace)?;
        label("tag name", &req.name)?;
        let source = actor_ref(req.actor)?;
        let snapshots = self
            .api
            .store
            .list_snapshots(&source.atespace, &source.name)
            .await
            .map_err(store_status)?;
        let snap = match req.generation {
            0 => snapshots.into_iter().next(),
            g => snapshots.into_iter().find(|s| s.generation == g),
        }
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "actor {source} has no snapshot generation {} to tag",
                if req.generation == 0 {
                    "yet".to_string()
                } else {
                    req.generation.to_string()
                }
            ))
        })?;
        let tag = TagRecord {
            atespace: req.atespace,
            name: req.name,
            snapshot: snap,
            created_ms: now_ms(),
        };
        let created = self
            .api
            .store
            .create_tag(&tag)
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::tag(&created)))
    }

    async fn get_tag(&self, req: Request<GetTagRequest>) -> Result<Response<Tag>, Status> {
        let _ = self.authorize(&req, "TagService/GetTag", |_| Need::Admin)?;
        let req = req.into_inner();
        label("atespace", &req.atespace)?;
        label("tag name", &req.name)?;
        let t = self
            .api
            .store
            .get_tag(&req.atespace, &req.name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(convert::tag(&t)))
    }

    async fn list_tags(
        &self,
        req: Request<ListTagsRequest>,
    ) -> Result<Response<ListTagsResponse>, Status> {
        let _ = self.authorize(&req, "TagService/ListTags", |_| Need::Admin)?;
        let ns = req.into_inner().atespace;
        if !ns.is_empty() {
            label("atespace", &ns)?;
        }
        let rows = self
            .api
            .store
            .list_tags(Some(ns.as_str()).filter(|n| !n.is_empty()))
            .await
            .map_err(store_status)?;
        Ok(Response::new(ListTagsResponse {
            tags: rows.iter().map(convert::tag).collect(),
        }))
    }

    async fn delete_tag(
        &self,
        req: Request<DeleteTagRequest>,
    ) -> Result<Response<DeleteTagResponse>, Status> {
        let _ = self.authorize(&req, "TagService/DeleteTag", |_| Need::Admin)?;
        let req = req.into_inner();
        label("atespace", &req.atespace)?;
        label("tag name", &req.name)?;
        self.api
            .store
            .delete_tag(&req.atespace, &req.name)
            .await
            .map_err(store_status)?;
        Ok(Response::new(DeleteTagResponse {}))
    }
}

fn worker_record(w: v1::Worker) -> Result<WorkerRecord, Status> {
    label("worker.id", &w.id)?;
    label("worker.node", &w.node)?;
    label("worker.sandbox_class", &w.sandbox_class)?;
    if w.addresses.is_empty()
        || w.addresses
            .iter()
            .any(|a| a.parse::<std::net::SocketAddr>().is_err())
    {
        return Err(Status::invalid_argument(format!(
            "invalid worker.addresses: {:?} must be one or more ip:port",
            w.addresses
        )));
    }
    if w.node_address.is_empty() {
        return Err(Status::invalid_argument(
            "invalid worker.node_address: must not be empty",
        ));
    }
    let cap = w
        .capacity
        .ok_or_else(|| Status::invalid_argument("invalid worker.capacity: missing"))?;
    if cap.actor_slots == 0 || cap.cpu_millis == 0 || cap.memory_bytes == 0 {
        return Err(Status::invalid_argument(
            "invalid worker.capacity: cpu, memory and actor slots must be positive",
        ));
    }
    if w.epoch == 0 || i64::try_from(w.epoch).is_err() {
        return Err(Status::invalid_argument(format!(
            "invalid worker.epoch: {} must be between 1 and 2^63-1",
            w.epoch
        )));
    }
    let labels: BTreeMap<String, String> = w.labels.into_iter().collect();
    ate_core::selector::validate("worker.labels", &labels).map_err(invalid)?;
    Ok(WorkerRecord {
        id: w.id,
        node: w.node,
        addresses: w.addresses,
        identity: w.identity,
        labels,
        sandbox_class: w.sandbox_class,
        can_restore_memory: w.can_restore_memory,
        capacity: Capacity {
            cpu_millis: u64::from(cap.cpu_millis),
            memory_bytes: cap.memory_bytes,
            slots: u64::from(cap.actor_slots),
        },
        used: Capacity::default(),
        epoch: w.epoch,
        status: WorkerStatus::Active,
        last_heartbeat_ms: 0,
        node_address: w.node_address,
        boot_id: w.boot_id,
    })
}

#[tonic::async_trait]
impl fleet_service_server::FleetService for Services {
    async fn register_worker(
        &self,
        req: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let caller = self.authorize(&req, "FleetService/RegisterWorker", |_| Need::Fleet)?;
        let req = req.into_inner();
        let w = req
            .worker
            .ok_or_else(|| Status::invalid_argument("invalid worker: missing"))?;
        let record = worker_record(w)?;
        let held = req.held;
        for (i, h) in held.iter().enumerate() {
            let a = h.actor.as_ref().ok_or_else(|| {
                Status::invalid_argument(format!("invalid held[{i}].actor: missing"))
            })?;
            label(&format!("held[{i}].actor.atespace"), &a.atespace)?;
            label(&format!("held[{i}].actor.name"), &a.name)?;
        }
        let previous = match self.api.store.get_worker(&record.id).await {
            Ok(p) => Some(p),
            Err(ate_store::StoreError::NotFound(_)) => None,
            Err(e) => return Err(store_status(e)),
        };
        // A node bound to a name registers only its own workers, and cannot take over a live
        // worker of another node (that would move the other node's actors under it).
        if let Some(Some(node)) = caller.node_agent() {
            let target = format!("worker {}", record.id);
            if record.node != node {
                return Err(caller.deny(
                    "FleetService/RegisterWorker",
                    &target,
                    &format!("the worker names node {}", record.node),
                ));
            }
            if let Some(p) = &previous
                && p.node != node
                && p.status == WorkerStatus::Active
            {
                return Err(caller.deny(
                    "FleetService/RegisterWorker",
                    &target,
                    &format!("the worker is registered to node {}", p.node),
                ));
            }
        }
        // A new epoch (the worker process restarted) or a return from GONE: whatever the
        // worker does not hold any more is released; what it holds is kept or discarded.
        let restarted =
            previous.is_some_and(|p| p.epoch != record.epoch || p.status == WorkerStatus::Gone);
        self.api
            .store
            .register_worker(&record, now_ms())
            .await
            .map_err(store_status)?;
        // Every entry names its actor (checked above).
        let held: Vec<_> = held.iter().filter_map(convert::held_from_wire).collect();
        let discard = self
            .api
            .reconcile_worker(&record.id, &held, restarted)
            .await
            .map_err(store_status)?;
        self.api.fleet.refresh().await.map_err(store_status)?;
        tracing::info!(worker = %record.id, node = %record.node, epoch = record.epoch, held = held.len(), discard = discard.len(), "worker registered");
        let interval = (self.api.heartbeat_timeout().as_secs() / 3).max(1);
        Ok(Response::new(RegisterWorkerResponse {
            heartbeat_interval_seconds: u32::try_from(interval).unwrap_or(1),
            discard: discard.iter().map(convert::held).collect(),
            lease_seconds: u32::try_from(self.api.heartbeat_timeout().as_secs().max(1))
                .unwrap_or(u32::MAX),
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let _ = self.authorize(&req, "FleetService/Heartbeat", |_| Need::Fleet)?;
        let req = req.into_inner();
        label("worker_id", &req.worker_id)?;
        // A store that does not answer (its server gone, connections being retried) must not
        // hold the heartbeat past the node's patience: treat it as down.
        let recorded = tokio::time::timeout(
            HEARTBEAT_STORE_TIMEOUT,
            self.api
                .store
                .heartbeat_worker(&req.worker_id, req.epoch, now_ms()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ate_store::StoreError::Database(format!(
                "the store did not answer within {HEARTBEAT_STORE_TIMEOUT:?}"
            )))
        });
        let known = match recorded {
            Ok(known) => known,
            Err(e) => {
                // This heartbeat is lost: expiry must not count the time it covered.
                self.api.store_outage_seen();
                // The only replica cannot release anyone while its store is down (and waits a
                // whole lease after it is back), so the worker may go on serving.
                if self.api.sole_replica() && matches!(e, ate_store::StoreError::Database(_)) {
                    tracing::debug!(worker = %req.worker_id, error = %e, "store down; heartbeat acknowledged unrecorded (sole replica)");
                    return Ok(Response::new(HeartbeatResponse { known: true }));
                }
                return Err(store_status(e));
            }
        };
        Ok(Response::new(HeartbeatResponse { known }))
    }

    async fn deregister_worker(
        &self,
        req: Request<DeregisterWorkerRequest>,
    ) -> Result<Response<DeregisterWorkerResponse>, Status> {
        let caller = self.authorize(&req, "FleetService/DeregisterWorker", |_| Need::Fleet)?;
        let id = req.into_inner().worker_id;
        label("worker_id", &id)?;
        self.check_node_worker(&caller, "FleetService/DeregisterWorker", &id)
            .await?;
        self.api
            .store
            .deregister_worker(&id)
            .await
            .map_err(store_status)?;
        self.api
            .release_actors_of(&id)
            .await
            .map_err(store_status)?;
        self.api.fleet.refresh().await.map_err(store_status)?;
        Ok(Response::new(DeregisterWorkerResponse {}))
    }

    async fn list_workers(
        &self,
        _req: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        let _ = self.authorize(&_req, "FleetService/ListWorkers", |_| Need::Fleet)?;
        let rows = self.api.store.list_workers().await.map_err(store_status)?;
        Ok(Response::new(ListWorkersResponse {
            workers: rows.iter().map(convert::worker).collect(),
        }))
    }

    async fn report_snapshot(
        &self,
        req: Request<ReportSnapshotRequest>,
    ) -> Result<Response<ReportSnapshotResponse>, Status> {
        let _ = self.authorize(&req, "FleetService/ReportSnapshot", |_| Need::Fleet)?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        let status = DurableStatus::from_wire(req.durable_status).ok_or_else(|| {
            Status::invalid_argument(format!("invalid durable_status: {}", req.durable_status))
        })?;
        self.api
            .store
            .update_snapshot_durable(
                &r.atespace,
                &r.name,
                req.generation,
                status,
                &req.durable_uri,
                &req.reason,
            )
            .await
            .map_err(store_status)?;
        Ok(Response::new(ReportSnapshotResponse {}))
    }

    async fn report_actor_exit(
        &self,
        req: Request<ReportActorExitRequest>,
    ) -> Result<Response<ReportActorExitResponse>, Status> {
        let caller = self.authorize(&req, "FleetService/ReportActorExit", |_| Need::Fleet)?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        self.check_node_worker(&caller, "FleetService/ReportActorExit", &req.worker_id)
            .await?;
        self.api
            .actor_exited(
                &r,
                &req.worker_id,
                req.exit_code,
                &req.last_log_lines,
                &req.crash_reason,
            )
            .await?;
        Ok(Response::new(ReportActorExitResponse {}))
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
