//! The api's ResumeActor, behind a small trait so the resolution logic can be driven by anything.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ate_proto::v1::actor_service_client::ActorServiceClient;
use ate_proto::v1::atespace_service_client::AtespaceServiceClient;
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

/// An atespace's callers allow list (`Atespace.callers_allow`).
pub type CallersFuture = Pin<Box<dyn Future<Output = Result<Vec<String>, tonic::Status>> + Send>>;

/// One ResumeActor call, on behalf of the request with id `request_id` (sent to the api as
/// `x-request-id` metadata, so its logs of the resume carry it); and what the router reads of
/// atespaces (their callers allow lists, for calls between actors).
pub trait Resume: Send + Sync + 'static {
    fn resume(&self, actor: &ActorKey, request_id: Option<&str>) -> ResumeFuture;

    /// The atespaces whose actors may call `atespace`'s actors. By default none (an api that
    /// cannot tell: calls stay within an atespace).
    fn callers_allow(&self, atespace: &str) -> CallersFuture {
        let _ = atespace;
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// A call that failed in the transport (the api process died mid-call, its connection was
/// reset) carries the local error as its source and a code such as Unknown, Internal or
/// Cancelled. For the router that is the api being unavailable (spec: park and retry), never a
/// 500. A status the api itself sent has no source and keeps its code.
pub fn lost_api_is_unavailable(status: tonic::Status) -> tonic::Status {
    use std::error::Error as _;
    match status.code() {
        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
            if status.source().is_some() =>
        {
            tonic::Status::unavailable(format!("api connection lost: {}", status.message()))
        }
        _ => status,
    }
}

/// Per replica, how long connecting to an api may take before the next one is tried.
const API_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// ResumeActor over gRPC.
#[derive(Clone)]
pub struct GrpcResume {
    client: ActorServiceClient<Channel>,
    atespaces: AtespaceServiceClient<Channel>,
}

impl GrpcResume {
    /// Connects lazily: an api that is down shows up as Unavailable, which parks.
    pub fn new(api: &str) -> Result<Self, ate_tls::TlsError> {
        Self::with_tls(api, None)
    }

    /// Like `new`, over mTLS with `tls` (the router's certificate, the api's ID pinned) if given.
    pub fn with_tls(api: &str, tls: Option<Arc<ClientConfig>>) -> Result<Self, ate_tls::TlsError> {
        // `--api` may list several replicas (comma-separated): the router fails over.
        let channel =
            ate_tls::replicas_channel_lazy(api, tls, API_CONNECT_TIMEOUT, |e| e.tcp_nodelay(true))?;
        Ok(Self {
            client: ActorServiceClient::new(channel.clone()),
            atespaces: AtespaceServiceClient::new(channel),
        })
    }
}

impl Resume for GrpcResume {
    fn callers_allow(&self, atespace: &str) -> CallersFuture {
        let mut client = self.atespaces.clone();
        let name = atespace.to_string();
        Box::pin(async move {
            match client
                .get_atespace(ate_proto::v1::GetAtespaceRequest { name })
                .await
            {
                Ok(a) => Ok(a.into_inner().callers_allow),
                // A deleted atespace allows nobody; so does an api that will not say (an older
                // one: no GetAtespace for the router's identity) — calls stay within atespaces.
                Err(s)
                    if matches!(
                        s.code(),
                        tonic::Code::NotFound
                            | tonic::Code::PermissionDenied
                            | tonic::Code::Unimplemented
                    ) =>
                {
                    Ok(Vec::new())
                }
                Err(s) => Err(lost_api_is_unavailable(s)),
            }
        })
    }

    fn resume(&self, actor: &ActorKey, request_id: Option<&str>) -> ResumeFuture {
        let mut client = self.client.clone();
        let mut request = ate_proto::request_id::request(
            ResumeActorRequest {
                actor: Some(ObjectRef {
                    atespace: actor.atespace().to_string(),
                    name: actor.name().to_string(),
                }),
            },
            request_id,
        );
        ate_telemetry::trace_context::inject_grpc(&mut request);
        Box::pin(async move {
            let response = client
                .resume_actor(request)
                .await
                .map_err(lost_api_is_unavailable)?
                .into_inner();
            let resumed = response.resumed;
            let hibernate_web_sockets = response.hibernate_web_sockets;
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
                    activation: assignment.activation,
                    hibernate_web_sockets,
                }),
                resumed,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_unavailable_a_sent_status_is_not() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let lost = lost_api_is_unavailable(tonic::Status::from_error(Box::new(reset)));
        assert_eq!(lost.code(), tonic::Code::Unavailable);
        assert!(lost.message().contains("api connection lost"), "{lost:?}");
        // The api's own answers keep their meaning.
        for sent in [
            tonic::Status::internal("workflow task failed"),
            tonic::Status::unknown("x"),
            tonic::Status::not_found("actor a/b not found"),
        ] {
            let code = sent.code();
            assert_eq!(lost_api_is_unavailable(sent).code(), code);
        }
    }
}
