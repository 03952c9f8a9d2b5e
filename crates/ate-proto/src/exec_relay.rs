//! The output half of an exec relay (`ate exec`), shared by the api and the node: the next
//! hop's answers passed on to the caller unchanged, ending when either side ends. A caller
//! that goes away drops the next hop's stream (which cancels its call, and so the session)
//! and aborts `feeder`, the task passing the caller's input on: its request stream held open
//! would keep the next hop's call alive after its caller is gone.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::v1::ExecOutput;

/// The caller's side of a relayed exec session.
pub type ExecOutputStream = ReceiverStream<Result<ExecOutput, Status>>;

/// Relays `answers` to the returned stream; aborts `feeder` when the relay ends.
pub fn relay_output(
    mut answers: Streaming<ExecOutput>,
    feeder: JoinHandle<()>,
) -> ExecOutputStream {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let _feeder = AbortOnDrop(feeder);
        loop {
            tokio::select! {
                m = answers.message() => match m {
                    Ok(Some(m)) => if tx.send(Ok(m)).await.is_err() { return },
                    Ok(None) => return,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                },
                () = tx.closed() => {
                    tracing::info!("exec: the caller went away; ending the session");
                    return;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
