//! AtespaceService, TemplateService and TagService: the store's catalog, no workflow.

use ate_core::clock::now_ms;
use ate_proto::v1::*;
use ate_store::TagRecord;
use tonic::{Request, Response, Status};

use super::{Services, actor_ref, label, reply};
use crate::authz::Need;
use crate::convert::{self, invalid, store_status};

/// What the two parts of a template's or a tag's key are called in errors: templates live in a
/// namespace, tags in an atespace.
struct Key {
    scope: &'static str,
    name: &'static str,
}

const TEMPLATE_KEY: Key = Key {
    scope: "template namespace",
    name: "template name",
};

const TAG_KEY: Key = Key {
    scope: "atespace",
    name: "tag name",
};

impl Key {
    /// Both parts, each a DNS-1123 label.
    fn check(&self, scope: &str, name: &str) -> Result<(), Status> {
        label(self.scope, scope)?;
        label(self.name, name)
    }

    /// A list call's scope: empty lists all of them.
    fn scope_filter<'a>(&self, scope: &'a str) -> Result<Option<&'a str>, Status> {
        if scope.is_empty() {
            return Ok(None);
        }
        label(self.scope, scope)?;
        Ok(Some(scope))
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
        let req = req.into_inner();
        let name = req.name;
        label("atespace", &name)?;
        ate_core::validate_callers_allow(&req.callers_allow).map_err(invalid)?;
        let created = self
            .api
            .store
            .create_atespace(&name, now_ms())
            .await
            .map_err(store_status)?;
        if req.callers_allow.is_empty() {
            return Ok(Response::new(convert::atespace(&created)));
        }
        reply(
            self.api
                .store
                .set_atespace_callers(&name, &req.callers_allow),
            convert::atespace,
        )
        .await
    }

    async fn update_atespace(
        &self,
        req: Request<UpdateAtespaceRequest>,
    ) -> Result<Response<Atespace>, Status> {
        let _ = self.authorize(&req, "AtespaceService/UpdateAtespace", |r| {
            Need::Atespace(&r.name)
        })?;
        let req = req.into_inner();
        label("atespace", &req.name)?;
        ate_core::validate_callers_allow(&req.callers_allow).map_err(invalid)?;
        let updated = self
            .api
            .store
            .set_atespace_callers(&req.name, &req.callers_allow)
            .await
            .map_err(store_status)?;
        tracing::info!(atespace = %req.name, callers_allow = ?updated.callers_allow, "atespace callers allow list set");
        Ok(Response::new(convert::atespace(&updated)))
    }

    async fn set_atespace_quota(
        &self,
        req: Request<SetAtespaceQuotaRequest>,
    ) -> Result<Response<Atespace>, Status> {
        let caller = self.authorize(&req, "AtespaceService/SetAtespaceQuota", |_| Need::Admin)?;
        let req = req.into_inner();
        label("atespace", &req.name)?;
        let quota = convert::quota_from_wire(req.quota.as_ref());
        let updated = self
            .api
            .store
            .set_atespace_quota(&req.name, &quota)
            .await
            .map_err(store_status)?;
        tracing::info!(target: "audit", identity = %caller.identity, atespace = %req.name, running_actors = quota.slots, cpu_millis = quota.cpu_millis, memory_bytes = quota.memory_bytes, "atespace quota set");
        Ok(Response::new(convert::atespace(&updated)))
    }

    async fn get_atespace(
        &self,
        req: Request<GetAtespaceRequest>,
    ) -> Result<Response<Atespace>, Status> {
        let _ = self.authorize(&req, "AtespaceService/GetAtespace", |r| {
            Need::ReadAtespace(&r.name)
        })?;
        let name = req.into_inner().name;
        label("atespace", &name)?;
        reply(self.api.store.get_atespace(&name), convert::atespace).await
    }

    async fn list_atespaces(
        &self,
        _req: Request<ListAtespacesRequest>,
    ) -> Result<Response<ListAtespacesResponse>, Status> {
        let caller = self.authorize(&_req, "AtespaceService/ListAtespaces", |_| Need::List)?;
        reply(self.api.store.list_atespaces(), |rows| {
            ListAtespacesResponse {
                atespaces: rows
                    .iter()
                    .filter(|a| caller.sees(&a.name))
                    .map(convert::atespace)
                    .collect(),
            }
        })
        .await
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
        reply(self.api.store.delete_atespace(&name), |_| {
            DeleteAtespaceResponse {}
        })
        .await
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
        TEMPLATE_KEY.check(&t.namespace, &t.name)?;
        let wire = t
            .spec
            .ok_or_else(|| Status::invalid_argument("invalid spec: missing"))?;
        let spec = ate_proto::spec_from_wire(&wire).map_err(invalid)?;
        let store = &self.api.store;
        reply(
            store.apply_template(&t.namespace, &t.name, &spec, now_ms()),
            convert::template,
        )
        .await
    }

    async fn get_template(
        &self,
        req: Request<GetTemplateRequest>,
    ) -> Result<Response<ActorTemplate>, Status> {
        let _ = self.authorize(&req, "TemplateService/GetTemplate", |_| Need::Admin)?;
        let req = req.into_inner();
        TEMPLATE_KEY.check(&req.namespace, &req.name)?;
        let store = &self.api.store;
        reply(
            store.get_template(&req.namespace, &req.name),
            convert::template,
        )
        .await
    }

    async fn list_templates(
        &self,
        req: Request<ListTemplatesRequest>,
    ) -> Result<Response<ListTemplatesResponse>, Status> {
        let _ = self.authorize(&req, "TemplateService/ListTemplates", |_| Need::Admin)?;
        let ns = req.into_inner().namespace;
        let rows = self
            .api
            .store
            .list_templates(TEMPLATE_KEY.scope_filter(&ns)?);
        reply(rows, |rows| ListTemplatesResponse {
            templates: rows.iter().map(convert::template).collect(),
        })
        .await
    }

    async fn delete_template(
        &self,
        req: Request<DeleteTemplateRequest>,
    ) -> Result<Response<DeleteTemplateResponse>, Status> {
        let _ = self.authorize(&req, "TemplateService/DeleteTemplate", |_| Need::Admin)?;
        let req = req.into_inner();
        TEMPLATE_KEY.check(&req.namespace, &req.name)?;
        let gone = self.api.store.delete_template(&req.namespace, &req.name);
        reply(gone, |_| DeleteTemplateResponse {}).await
    }
}

#[tonic::async_trait]
impl tag_service_server::TagService for Services {
    async fn create_tag(&self, req: Request<CreateTagRequest>) -> Result<Response<Tag>, Status> {
        let _ = self.authorize(&req, "TagService/CreateTag", |_| Need::Admin)?;
        let req = req.into_inner();
        TAG_KEY.check(&req.atespace, &req.name)?;
        let source = actor_ref(req.actor)?;
        let snapshots = self
            .api
            .store
            .list_snapshots(&source)
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
        reply(self.api.store.create_tag(&tag), convert::tag).await
    }

    async fn get_tag(&self, req: Request<GetTagRequest>) -> Result<Response<Tag>, Status> {
        let _ = self.authorize(&req, "TagService/GetTag", |_| Need::Admin)?;
        let req = req.into_inner();
        TAG_KEY.check(&req.atespace, &req.name)?;
        reply(
            self.api.store.get_tag(&req.atespace, &req.name),
            convert::tag,
        )
        .await
    }

    async fn list_tags(
        &self,
        req: Request<ListTagsRequest>,
    ) -> Result<Response<ListTagsResponse>, Status> {
        let _ = self.authorize(&req, "TagService/ListTags", |_| Need::Admin)?;
        let atespace = req.into_inner().atespace;
        let rows = self.api.store.list_tags(TAG_KEY.scope_filter(&atespace)?);
        reply(rows, |rows| ListTagsResponse {
            tags: rows.iter().map(convert::tag).collect(),
        })
        .await
    }

    async fn delete_tag(
        &self,
        req: Request<DeleteTagRequest>,
    ) -> Result<Response<DeleteTagResponse>, Status> {
        let _ = self.authorize(&req, "TagService/DeleteTag", |_| Need::Admin)?;
        let req = req.into_inner();
        TAG_KEY.check(&req.atespace, &req.name)?;
        let gone = self.api.store.delete_tag(&req.atespace, &req.name);
        reply(gone, |_| DeleteTagResponse {}).await
    }
}
