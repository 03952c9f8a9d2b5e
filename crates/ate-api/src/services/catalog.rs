//! AtespaceService, TemplateService and TagService: the store's catalog, no workflow.

use ate_core::clock::now_ms;
use ate_proto::v1::*;
use ate_store::TagRecord;
use tonic::{Request, Response, Status};

use super::{Services, actor_ref, label};
use crate::authz::Need;
use crate::convert::{self, invalid, store_status};

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
