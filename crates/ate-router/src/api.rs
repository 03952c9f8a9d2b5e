//! The api's ResumeActor, behind a small trait so the resolution logic can be driven by anything.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ate_proto::v1::actor_service_client::ActorServiceClient;
use ate_proto::v1::{ObjectRef, ResumeActorRequest};
use ate_tls::rustls::ClientConfig;
use tonic::transport::Channel;

use crate::actor_ref::ActorKey;
use crate::cache::Route;

/// A successful ResumeActor: where the actor runs, and whether this call woke it.
#[derive(Debug, Clone)]
pub struct Resumed {
    pub route: Arc<Route>,
    /// False on the warm path (the actor was already RUNNING).
    pub resumed: bool,
}

pub type ResumeFuture = Pin<Box<dyn Future<Output = Result<Resumed, tonic::Status>> + Send>>;

/// One ResumeActor call.
pub trait Resume: Send + Sync + 'static {
    fn resume(&self, actor: &ActorKey) -> ResumeFuture;
}

/// ResumeActor over gRPC.
#[derive(Clone)]
pub struct GrpcResume {
    client: ActorServiceClient<Channel>,
}

impl GrpcResume {
    /// Connects lazily: an api that is down shows up as Unavailable, which parks.
    pub fn new(api: &str) -> Result<Self, ate_tls::TlsError> {
        Self::with_tls(api, None)
    }

    /// Like `new`, over mTLS with `tls` (the router's certificate, the api's ID pinned) if given.
    pub fn with_tls(api: &str, tls: Option<Arc<ClientConfig>>) -> Result<Self, ate_tls::TlsError> {
        let endpoint = ate_tls::endpoint(api)?.tcp_nodelay(true);
        let channel = match tls {
            Some(tls) => ate_tls::tls_channel_lazy(endpoint, tls),
            None => endpoint.connect_lazy(),
        };
        Ok(Self {
            client: ActorServiceClient::new(channel),
        })
    }
}

impl Resume for GrpcResume {
    fn resume(&self, actor: &ActorKey) -> ResumeFuture {
        let mut client = self.client.clone();
        let request = ResumeActorRequest {
            actor: Some(ObjectRef {
                atespace: actor.atespace().to_string(),
                name: actor.name().to_string(),
            }),
        };
        Box::pin(async move {
            let response = client.resume_actor(request).await?.into_inner();
            let resumed = response.resumed;
            let assignment = response
                .actor
                .and_then(|a| a.worker_assignment)
                .ok_or_else(|| {
                    tonic::Status::internal("ResumeActor returned no worker assignment")
                })?;
            let worker = assignment
                .addresses
                .first()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| tonic::Status::internal("worker assignment has no address"))?;
            Ok(Resumed {
                route: Arc::new(Route {
                    worker: Arc::from(worker.as_str()),
                    worker_id: assignment.worker_id,
                    epoch: assignment.epoch,
                    worker_identity: assignment.worker_identity,
                }),
                resumed,
            })
        })
    }
}
