//! The router's end of the same-machine tunnel handoff (wire format: `ate_core::handoff`;
//! docs/tunnel-protocol.md, "Handoff"): asks the atunnel of a worker on this machine, over its
//! unix socket, for the actor's socket itself. The caller speaks HTTP/1.1 over that socket and
//! keeps the unix connection open for as long as it does (see `tunnel.rs`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use ate_core::handoff::{MAX_LINE, RETIRE, Reply, Request, socket_name};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};

/// A tunnel handed over: the actor's socket, and the unix connection that is the tunnel's life.
pub struct Handed {
    pub tcp: TcpStream,
    pub control: UnixStream,
    /// atunnel already asked for it back (the actor started draining as it answered).
    pub retired: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// No handoff socket for that worker here (another machine, or a worker without one): use
    /// the CONNECT path.
    #[error("no handoff socket for {worker}: {source}")]
    Unavailable { worker: String, source: io::Error },
    /// atunnel refused, as it would have refused the CONNECT.
    #[error("atunnel refused the handoff: {0:?}")]
    Refused(Reply),
    #[error("handoff with atunnel {worker}: {source}")]
    Io { worker: String, source: io::Error },
}

/// Asks the atunnel advertised at `worker` (its handoff socket under `dir`) for a tunnel.
pub async fn take(
    dir: &Path,
    worker: &str,
    request: &Request<'_>,
    timeout: Duration,
) -> Result<Handed, HandoffError> {
    let unavailable = |source| HandoffError::Unavailable {
        worker: worker.to_string(),
        source,
    };
    let Some(name) = socket_name(worker) else {
        return Err(unavailable(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an ip:port",
        )));
    };
    let mut control = UnixStream::connect(dir.join(name))
        .await
        .map_err(unavailable)?;
    let io_err = |source| HandoffError::Io {
        worker: worker.to_string(),
        source,
    };
    let exchange = async {
        control.write_all(request.encode().as_bytes()).await?;
        read_reply(&control).await
    };
    let (line, fd, retired) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| io_err(io::ErrorKind::TimedOut.into()))?
        .map_err(io_err)?;
    let reply =
        Reply::parse(&line).map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    if reply != Reply::Ok {
        return Err(HandoffError::Refused(reply));
    }
    let fd = fd.ok_or_else(|| {
        io_err(io::Error::new(
            io::ErrorKind::InvalidData,
            "atunnel said 200 without a socket",
        ))
    })?;
    let std = std::net::TcpStream::from(fd);
    // atunnel's copy is non-blocking already (the flag belongs to the shared file description);
    // set it anyway, as tokio requires.
    std.set_nonblocking(true).map_err(io_err)?;
    let tcp = TcpStream::from_std(std).map_err(io_err)?;
    let _ = tcp.set_nodelay(true);
    Ok(Handed {
        tcp,
        control,
        retired,
    })
}

/// The reply line, the socket attached to it, and whether a [`RETIRE`] byte followed at once.
async fn read_reply(control: &UnixStream) -> io::Result<(String, Option<OwnedFd>, bool)> {
    let raw = control.as_raw_fd();
    let mut line = Vec::new();
    let mut fd = None;
    let retired;
    let mut buf = [0u8; 256];
    loop {
        let (n, got) = control
            .async_io(Interest::READABLE, || receive(raw, &mut buf))
            .await?;
        if fd.is_none() {
            fd = got;
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let chunk = &buf[..n];
        match chunk.iter().position(|b| *b == b'\n') {
            Some(end) => {
                line.extend_from_slice(&chunk[..=end]);
                retired = chunk[end + 1..].contains(&RETIRE);
                break;
            }
            None => line.extend_from_slice(chunk),
        }
        if line.len() > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "reply line longer than 1024 bytes",
            ));
        }
    }
    let line = String::from_utf8(line)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "reply is not UTF-8"))?;
    Ok((line, fd, retired))
}

/// One `recvmsg`: the bytes read and the first descriptor attached (others are closed).
fn receive(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut first = None;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: SCM_RIGHTS installed this descriptor in our table for us to own.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if first.is_none() {
                    first = Some(owned);
                }
            }
        }
    }
    Ok((msg.bytes, first))
}
