//! Clients of node agents, one lazily-connected channel per node address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ate_proto::v1::node_service_client::NodeServiceClient;
use ate_tls::rustls::ClientConfig;
use tonic::Status;
use tonic::transport::Channel;

/// Pool of node-agent clients keyed by gRPC address (`host:port` or `http://host:port`).
#[derive(Default)]
pub struct NodeClients {
    channels: Mutex<HashMap<String, Channel>>,
    /// mTLS (the api's certificate, the node's SPIFFE ID pinned); None: plaintext.
    tls: Option<Arc<ClientConfig>>,
}

impl NodeClients {
    pub fn new(tls: Option<Arc<ClientConfig>>) -> Self {
        Self {
            channels: Mutex::default(),
            tls,
        }
    }

    /// Client for `address`. Connection happens on first use, so a down node surfaces as
    /// Unavailable on the call (a transient state the router parks on), not here.
    pub fn client(&self, address: &str) -> Result<NodeServiceClient<Channel>, Status> {
        let mut channels = self
            .channels
            .lock()
            .map_err(|_| Status::internal("node client pool poisoned"))?;
        if let Some(ch) = channels.get(address) {
            return Ok(NodeServiceClient::new(ch.clone()));
        }
        let endpoint = ate_tls::endpoint(address)
            .map_err(|e| Status::failed_precondition(format!("bad node address {address:?}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10));
        let channel = match &self.tls {
            Some(tls) => ate_tls::tls_channel_lazy(endpoint, tls.clone()),
            None => endpoint.connect_lazy(),
        };
        channels.insert(address.to_string(), channel.clone());
        Ok(NodeServiceClient::new(channel))
    }
}
