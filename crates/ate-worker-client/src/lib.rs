//! What the node agent needs of its workers without linking the worker crate: the client of a
//! worker's unix socket ([`connect_worker`]), and what it reads itself when a worker does not
//! answer: which of the worker's sandboxes still run ([`sandbox`], from the adoption records the
//! worker keeps next to them) and the host's memory ([`host`]). The worker uses the same
//! probes, so both sides read the worker's state dir the same way.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod host;
pub mod sandbox;

use std::path::{Path, PathBuf};

use ate_proto::v1::worker_service_client::WorkerServiceClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub use host::{host_memory_available_percent, process_running};
pub use sandbox::{live_sandboxes, sandbox_alive};

/// A WorkerService client over the worker's unix socket.
pub async fn connect_worker(
    socket: &Path,
) -> Result<WorkerServiceClient<Channel>, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    let channel = Endpoint::from_static("http://worker.sock")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await?;
    Ok(WorkerServiceClient::new(channel))
}
