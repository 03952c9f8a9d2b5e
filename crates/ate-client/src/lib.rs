//! The api client shared by the `ate` binary and `ate bench`: one channel (plus an optional bearer
//! token) shared by every service client, and applying a YAML document stream (atespaces and
//! templates). Address resolution and the CLI's identity stay in ate-cli (`client.rs`).

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::time::Duration;

use ate_core::Document;
use ate_core::template::TemplateSpec;
use ate_proto::v1;
use ate_proto::v1::actor_service_client::ActorServiceClient;
use ate_proto::v1::alarm_service_client::AlarmServiceClient;
use ate_proto::v1::atespace_service_client::AtespaceServiceClient;
use ate_proto::v1::fleet_service_client::FleetServiceClient;
use ate_proto::v1::join_service_client::JoinServiceClient;
use ate_proto::v1::tag_service_client::TagServiceClient;
use ate_proto::v1::template_service_client::TemplateServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

pub const DEFAULT_STATE_DIR: &str = "/var/lib/ate";
/// Subdirectory of the state dir with every component's certificate (`ate up`).
pub const TLS_DIR: &str = "tls";
/// The admin certificate's name in the files `ate up` writes (`admin.crt`, `admin.key`).
pub const ADMIN_CERT_NAME: &str = "admin";

/// `--token` (`ATE_TOKEN`) that cannot go in a header.
#[derive(Debug, thiserror::Error)]
#[error("--token (ATE_TOKEN) is not a valid header value")]
pub struct InvalidToken;

/// Why [`endpoint`] or [`connect_to`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid api address {address:?}")]
    Address {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error(transparent)]
    Tls(#[from] ate_tls::TlsError),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// A document stream that cannot be applied as it is.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("invalid YAML document")]
    Yaml(#[source] serde_saphyr::Error),
    /// A template's spec is invalid.
    #[error(transparent)]
    Spec(#[from] ate_core::ValidationError),
}

/// Adds `authorization: Bearer <token>` to every call when a token is set (`--token`).
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: &str) -> Result<Self, InvalidToken> {
        let value = format!("Bearer {}", token.trim())
            .parse::<MetadataValue<Ascii>>()
            .map_err(|_| InvalidToken)?;
        Ok(Bearer(Some(value)))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// The channel every client uses: the api connection plus the bearer token, if any.
pub type ApiChannel = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
pub struct Clients {
    pub actors: ActorServiceClient<ApiChannel>,
    pub alarms: AlarmServiceClient<ApiChannel>,
    pub atespaces: AtespaceServiceClient<ApiChannel>,
    pub templates: TemplateServiceClient<ApiChannel>,
    pub tags: TagServiceClient<ApiChannel>,
    pub fleet: FleetServiceClient<ApiChannel>,
    pub join: JoinServiceClient<ApiChannel>,
}

impl Clients {
    pub fn new(channel: Channel) -> Self {
        Self::with_bearer(channel, Bearer::default())
    }

    pub fn with_bearer(channel: Channel, bearer: Bearer) -> Self {
        let c = |ch: &Channel| InterceptedService::new(ch.clone(), bearer.clone());
        Self {
            actors: ActorServiceClient::new(c(&channel)),
            alarms: AlarmServiceClient::new(c(&channel)),
            atespaces: AtespaceServiceClient::new(c(&channel)),
            templates: TemplateServiceClient::new(c(&channel)),
            tags: TagServiceClient::new(c(&channel)),
            fleet: FleetServiceClient::new(c(&channel)),
            join: JoinServiceClient::new(c(&channel)),
        }
    }
}

/// Why [`apply_documents`] stopped. Each caller words the api's refusals in its own terms.
pub enum ApplyError {
    /// The text is not a valid document stream, or a template's spec is invalid.
    Invalid(DocumentError),
    /// The api refused to create an atespace (one that already exists is not an error).
    Atespace { name: String, status: tonic::Status },
    /// The api refused a template.
    Template { name: String, status: tonic::Status },
}

/// Creates the atespaces (leaving existing ones as they are) and applies the templates of a YAML
/// document stream, in order: `ate up`'s demo and the benches' templates. (`ate apply` checks
/// every document before it changes anything and reports each object: ate-cli's `verbs::apply`.)
pub async fn apply_documents(c: &Clients, text: &str) -> Result<(), ApplyError> {
    for doc in parse_documents(text).map_err(ApplyError::Invalid)? {
        match doc {
            Document::Atespace(a) => match c
                .atespaces
                .clone()
                .create_atespace(v1::CreateAtespaceRequest {
                    name: a.metadata.name.clone(),
                    callers_allow: a
                        .spec
                        .as_ref()
                        .map(|s| s.callers.allow.clone())
                        .unwrap_or_default(),
                })
                .await
            {
                // A new atespace gets the document's quota too (an existing one is left as it
                // is, quota included).
                Ok(_) => {
                    let quota = match a.spec.as_ref().and_then(|s| s.quota.as_ref()) {
                        Some(q) => q.parse().map_err(|e| ApplyError::Invalid(e.into()))?,
                        None => ate_core::template::Quota::default(),
                    };
                    if quota != ate_core::template::Quota::default() {
                        let set = c
                            .atespaces
                            .clone()
                            .set_atespace_quota(v1::SetAtespaceQuotaRequest {
                                name: a.metadata.name.clone(),
                                quota: Some(v1::AtespaceQuota {
                                    running_actors: quota.running_actors,
                                    cpu_millis: quota.cpu_millis,
                                    memory_bytes: quota.memory_bytes,
                                }),
                            })
                            .await;
                        if let Err(status) = set {
                            return Err(ApplyError::Atespace {
                                name: a.metadata.name,
                                status,
                            });
                        }
                    }
                }
                Err(s) if s.code() == tonic::Code::AlreadyExists => {}
                Err(status) => {
                    return Err(ApplyError::Atespace {
                        name: a.metadata.name,
                        status,
                    });
                }
            },
            Document::ActorTemplate(t) => {
                let spec = TemplateSpec::from_document(&t.spec)
                    .map_err(|e| ApplyError::Invalid(e.into()))?;
                let template = v1::ActorTemplate {
                    namespace: t.metadata.namespace.clone(),
                    name: t.metadata.name.clone(),
                    spec: Some(ate_proto::spec_to_wire(&spec)),
                    ..Default::default()
                };
                if let Err(status) = c
                    .templates
                    .clone()
                    .apply_template(v1::ApplyTemplateRequest {
                        template: Some(template),
                    })
                    .await
                {
                    return Err(ApplyError::Template {
                        name: t.metadata.name,
                        status,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Parses every document of a YAML stream, with the document index in errors.
pub fn parse_documents(text: &str) -> Result<Vec<Document>, DocumentError> {
    let docs: Vec<Document> = serde_saphyr::from_multiple(text).map_err(DocumentError::Yaml)?;
    Ok(docs)
}

pub fn endpoint(address: &str) -> Result<Endpoint, ConnectError> {
    let uri = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    Ok(Endpoint::from_shared(uri.clone())
        .map_err(|source| ConnectError::Address {
            address: address.to_string(),
            source,
        })?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true))
}

/// Connects to the api at `address`, over mTLS with `tls` (the api's SPIFFE ID in the trust
/// domain of our own certificate is pinned) or in plaintext.
pub async fn connect_to(
    address: &str,
    tls: Option<&ate_tls::CertSource>,
) -> Result<Channel, ConnectError> {
    let config = match tls {
        Some(src) => {
            let td = src
                .id()
                .map(|id| id.trust_domain().to_string())
                .unwrap_or_else(|| ate_tls::DEFAULT_TRUST_DOMAIN.to_string());
            Some(std::sync::Arc::new(ate_tls::client_config(
                src,
                ate_tls::ServerCheck::Pin(ate_tls::SpiffeId::api(&td)?),
            )?))
        }
        None => None,
    };
    // Several replicas (`--api a:7443,b:7443`): whichever answers; the first call says if none.
    if address.contains(',') {
        return Ok(ate_tls::replicas_channel_lazy(
            address,
            config,
            std::time::Duration::from_secs(2),
            |e| e,
        )?);
    }
    let endpoint = endpoint(address)?;
    let channel = match config {
        Some(config) => ate_tls::tls_channel(endpoint, config).await?,
        None => endpoint.connect().await?,
    };
    Ok(channel)
}
