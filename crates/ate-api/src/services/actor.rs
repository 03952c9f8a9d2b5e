//! ActorService: create, read, list, update and delete actors, list their generations, and the
//! verbs that run a workflow to its end (resume, suspend, revert, delete).

use ate_core::TemplateRef;
use ate_core::clock::now_ms;
use ate_core::{ActorRef, SuspendMode};
use ate_proto::v1::*;
use ate_store::ActorRecord;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{
    DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, Services, actor_ref, atespace_filter, label,
    parse_page_token, ref_atespace, selector, to_completion,
};
use crate::authz::Need;
use crate::convert::{self, invalid, store_status};

/// Longest reason a SuspendActor may give (it goes into an event's message).
const MAX_SUSPEND_REASON: usize = 256;
/// Longest grace a suspend may give requests in flight.
const MAX_SUSPEND_GRACE_MS: u32 = 600_000;

#[tonic::async_trait]
impl actor_service_server::ActorService for Services {
    type ExecActorStream = super::exec::ExecStream;
    type WatchEventsStream = super::events::WatchEventsStream;
    type WatchActorsStream = super::events::WatchActorsStream;

    async fn list_events(
        &self,
        req: Request<ListEventsRequest>,
    ) -> Result<Response<ListEventsResponse>, Status> {
        self.list_events_rpc(req).await
    }

    async fn watch_events(
        &self,
        req: Request<WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        self.watch_events_rpc(req).await
    }

    async fn watch_actors(
        &self,
        req: Request<WatchActorsRequest>,
    ) -> Result<Response<Self::WatchActorsStream>, Status> {
        self.watch_actors_rpc(req).await
    }

    async fn exec_actor(
        &self,
        req: Request<tonic::Streaming<ExecActorRequest>>,
    ) -> Result<Response<Self::ExecActorStream>, Status> {
        self.exec(req).await
    }

    async fn top_actors(
        &self,
        req: Request<TopActorsRequest>,
    ) -> Result<Response<TopActorsResponse>, Status> {
        let caller = self.authorize(&req, "ActorService/TopActors", |r| {
            Need::atespace_or_list(&r.atespace)
        })?;
        let req = req.into_inner();
        let atespace = atespace_filter(&req.atespace)?;
        let (usage, unreachable_workers) = self.api.top(atespace).await.map_err(convert::status)?;
        let actors = usage
            .into_iter()
            .filter(|u| caller.sees(&u.actor.atespace))
            .map(|u| ActorUsage {
                actor: Some(ObjectRef {
                    atespace: u.actor.atespace,
                    name: u.actor.name,
                }),
                worker_id: u.worker_id,
                cpu_millis: u.cpu_millis,
                memory_bytes: u.memory_bytes,
                active_since_unix_ms: u.active_since_unix_ms,
                open_streams: u.open_streams,
                last_activity_unix_ms: u.last_activity_unix_ms,
            })
            .collect();
        Ok(Response::new(TopActorsResponse {
            actors,
            unreachable_workers,
        }))
    }

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
        let template = TemplateRef::parse("template", &req.template).map_err(invalid)?;
        let worker_selector = selector("worker_selector", req.worker_selector)?;
        let record = ActorRecord::new(
            req.atespace,
            req.name,
            uuid::Uuid::new_v4().to_string(),
            template,
            worker_selector,
            now_ms(),
        );
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
        let a = self.api.store.get_actor(&r).await.map_err(store_status)?;
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
            Need::atespace_or_list(&r.atespace)
        })?;
        let req = req.into_inner();
        let atespace = atespace_filter(&req.atespace)?;
        let limit = match req.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let after = parse_page_token(&req.page_token)?.map(|(a, n)| ActorRef::new(a, n));
        let rows = self
            .api
            .store
            .list_actors(atespace, after.as_ref(), limit)
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
            .update_actor_selector(&r, &sel, now_ms())
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
        let (force, purge) = (req.force, req.purge_volumes);
        let r = actor_ref(req.actor)?;
        let api = self.api.clone();
        let (stopped, volumes_purged) =
            to_completion(async move { api.delete(&r, force, purge).await }).await?;
        Ok(Response::new(DeleteActorResponse {
            stopped,
            volumes_purged,
        }))
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
        if ate_telemetry::trace_context::enabled() {
            // The spec's tags for following one resume: the actor's atespace and name (the log
            // lines have both in `actor` already).
            span.record("atespace", r.atespace.as_str());
            span.record("name", r.name.as_str());
        }
        ate_telemetry::trace_context::continue_metadata(&span, &metadata);
        let api = self.api.clone();
        let work = async move {
            let (actor, resumed) = api.resume(&r, Some(&request_id)).await?;
            let hibernate = api.hibernates_web_sockets(&actor).await?;
            Ok((actor, resumed, hibernate))
        };
        let (actor, resumed, hibernate_web_sockets) = to_completion(work.instrument(span)).await?;
        Ok(Response::new(ResumeActorResponse {
            actor: Some(convert::actor_view(&actor)),
            resumed,
            hibernate_web_sockets,
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
        if req.reason.len() > MAX_SUSPEND_REASON {
            return Err(Status::invalid_argument(format!(
                "invalid reason: at most {MAX_SUSPEND_REASON} bytes"
            )));
        }
        // A node agent's reason is the cause (idle, draining); anyone else's is what they say
        // after their name.
        let cause = match (caller.node_agent(), req.reason.as_str()) {
            (Some(_), why) if !why.is_empty() => why.to_string(),
            (_, "") => format!("requested by {}", caller.identity),
            (_, why) => format!("requested by {}: {why}", caller.identity),
        };
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
            to_completion(
                async move { api.suspend_with_grace(&r, durable, grace_ms, &cause).await },
            )
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
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        // 0: no generation chosen (generations are numbered from 1).
        let generation = Some(req.generation).filter(|g| *g > 0);
        let api = self.api.clone();
        let reverted = to_completion(async move { api.revert(&r, generation).await }).await?;
        Ok(Response::new(convert::actor_view(&reverted)))
    }

    async fn list_generations(
        &self,
        req: Request<ListGenerationsRequest>,
    ) -> Result<Response<ListGenerationsResponse>, Status> {
        let _ = self.authorize(&req, "ActorService/ListGenerations", |r| {
            Need::Atespace(ref_atespace(&r.actor))
        })?;
        let r = actor_ref(req.into_inner().actor)?;
        let generations = self.api.generations(&r).await?;
        Ok(Response::new(ListGenerationsResponse {
            generations: generations.iter().map(convert::generation).collect(),
        }))
    }
}
