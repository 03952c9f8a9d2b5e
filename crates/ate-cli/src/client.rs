//! Connecting to the api: address resolution and one channel shared by every service client.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ate_proto::v1::actor_service_client::ActorServiceClient;
use ate_proto::v1::atespace_service_client::AtespaceServiceClient;
use ate_proto::v1::fleet_service_client::FleetServiceClient;
use ate_proto::v1::tag_service_client::TagServiceClient;
use ate_proto::v1::template_service_client::TemplateServiceClient;
use tonic::transport::{Channel, Endpoint};

/// File in the state dir (and the user config dir) where `ate up` records the api address.
pub const API_ADDRESS_FILE: &str = "api-address";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/ate";

#[derive(Clone)]
pub struct Clients {
    pub actors: ActorServiceClient<Channel>,
    pub atespaces: AtespaceServiceClient<Channel>,
    pub templates: TemplateServiceClient<Channel>,
    pub tags: TagServiceClient<Channel>,
    pub fleet: FleetServiceClient<Channel>,
}

impl Clients {
    pub fn new(channel: Channel) -> Self {
        Self {
            actors: ActorServiceClient::new(channel.clone()),
            atespaces: AtespaceServiceClient::new(channel.clone()),
            templates: TemplateServiceClient::new(channel.clone()),
            tags: TagServiceClient::new(channel.clone()),
            fleet: FleetServiceClient::new(channel),
        }
    }
}

/// User config dir file (`$XDG_CONFIG_HOME/ate/api-address` or `~/.config/ate/api-address`).
pub fn user_config_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("ate").join(API_ADDRESS_FILE))
}

/// `--api` / `ATE_API`, else what `ate up` wrote (state dir from `ATE_STATE_DIR`, then the user
/// config), else the default address.
pub fn resolve_address(flag: Option<String>) -> String {
    if let Some(a) = flag.filter(|a| !a.is_empty()) {
        return a;
    }
    let state_dir = std::env::var_os("ATE_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    let candidates = [Some(state_dir.join(API_ADDRESS_FILE)), user_config_file()];
    for file in candidates.into_iter().flatten() {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let addr = text.trim();
            if !addr.is_empty() {
                return addr.to_string();
            }
        }
    }
    ate_core::DEFAULT_API_ADDR.to_string()
}

pub fn endpoint(address: &str) -> anyhow::Result<Endpoint> {
    let uri = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    Ok(Endpoint::from_shared(uri.clone())
        .with_context(|| format!("invalid api address {address:?}"))?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true))
}

pub async fn connect(flag: Option<String>) -> anyhow::Result<Clients> {
    let address = resolve_address(flag);
    let channel = endpoint(&address)?.connect().await.with_context(|| {
        format!("cannot reach the api at {address} (is `ate up` running? set --api or ATE_API)")
    })?;
    Ok(Clients::new(channel))
}
