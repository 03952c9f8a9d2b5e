//! atunnel's same-machine handoff (wire format: `ate_core::handoff`; docs/tunnel-protocol.md,
//! "Handoff"). A router on this machine asks over a unix socket for a tunnel to an actor; atunnel
//! runs the CONNECT's checks (`atunnel::admit`), dials the actor inside its network namespace
//! the same way, and passes the connected socket to the router (SCM_RIGHTS). The router then
//! speaks HTTP/1.1 to the actor directly: one proxy on the request path instead of two.
//!
//! atunnel still owns the tunnel's life: the unix connection stays open while the router uses the
//! socket (its end is the tunnel's end: the open count and the activity the idle auto-suspend
//! reads), a drain for a suspend writes [`RETIRE`] on it (the router closes the socket once no
//! request is in flight on it), and ingress off cuts the socket (`shutdown(2)` on atunnel's own
//! copy) as it cuts a CONNECT tunnel. A router that loses the unix connection (the worker
//! process died) drops the socket at once, so no request reaches a copy the worker no longer
//! vouches for.
//!
//! Architecture invariant: only processes of this machine's root (or the worker's own user)
//! are served: the socket is mode 0600 in a 0700 directory, and the peer's uid is checked.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ate_core::handoff::{MAX_LINE, RETIRE, Reply, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

use ate_atunnel::pipe::{Command, TunnelState};
use ate_atunnel::{Refusal, Tunnels, admit, dial, dial_failure};

/// How long a router may take to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the handoff socket of the atunnel advertised at `address` under `dir` (replacing a stale
/// one), or says why not; the worker then runs without the fast path.
pub fn bind(dir: &Path, address: &str) -> io::Result<(UnixListener, PathBuf)> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let name = ate_core::handoff::socket_name(address).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{address:?} is not an ip:port"),
        )
    })?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok((listener, path))
}

/// Serves handoffs on `listener` until `shutdown`; then every handed-off tunnel ends (the
/// routers drop their sockets when their unix connections close).
pub async fn serve(
    listener: UnixListener,
    tunnels: Arc<Tunnels>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let me = nix::unistd::geteuid().as_raw();
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "handoff accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let uid = stream.peer_cred().map(|c| c.uid());
                if !matches!(uid, Ok(u) if crate::socket::peer_allowed(u, me)) {
                    tracing::warn!(?uid, "handoff refused: the peer is neither root nor this worker's user");
                    continue;
                }
                let tunnels = tunnels.clone();
                conns.spawn(handle(stream, tunnels));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

async fn handle(mut stream: UnixStream, tunnels: Arc<Tunnels>) {
    let line = match tokio::time::timeout(REQUEST_TIMEOUT, read_line(&mut stream)).await {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => {
            let _ = answer(&stream, &Reply::Refused(400, e.to_string()), None).await;
            return;
        }
        Err(_) => return,
    };
    let request = match Request::parse(&line) {
        Ok(r) => r,
        Err(why) => {
            let _ = answer(&stream, &Reply::Refused(400, why), None).await;
            return;
        }
    };
    let key = request.actor;
    let activation = match admit(&tunnels, key, request.activation) {
        Ok(a) => a,
        Err(why) => {
            let _ = answer(&stream, &Reply::Stale(why), None).await;
            return;
        }
    };
    let (upstream, guard) = match dial(&activation, request.port, ate_atunnel::Counted::Open).await
    {
        Ok(x) => x,
        Err(Refusal::Stale) => {
            let why = format!("actor {key} is not active on this worker");
            let _ = answer(&stream, &Reply::Stale(why), None).await;
            return;
        }
        Err(Refusal::Dial(e)) => {
            let reply = match dial_failure(key, request.port, &e) {
                (true, why) => Reply::PortClosed(why),
                (false, why) => Reply::Refused(502, why),
            };
            let _ = answer(&stream, &reply, None).await;
            return;
        }
    };
    let upstream = match upstream.into_std() {
        Ok(s) => s,
        Err(e) => {
            let why = format!("actor {key}: cannot hand the connection over: {e}");
            let _ = answer(&stream, &Reply::Refused(502, why), None).await;
            return;
        }
    };
    let state = TunnelState::handoff();
    activation.register(&state);
    let mut commands = state.commands();
    let mut closed = activation.subscribe_closed();
    if let Err(e) = answer(&stream, &Reply::Ok, Some(upstream.as_raw_fd())).await {
        tracing::debug!(actor = %key, error = %e, "handoff: the router went away before the socket");
        return;
    }
    tracing::debug!(actor = %key, port = request.port, request_id = %request.request_id, "tunnel handed off");
    enum Event {
        RouterDone,
        IngressOff,
        Drain,
    }
    let mut retired = false;
    let mut byte = [0u8; 1];
    loop {
        let event = tokio::select! {
            // The router's end: it dropped the socket (or died). Nothing else comes this way.
            _ = stream.read(&mut byte) => Event::RouterDone,
            _ = closed.wait_for(|c| *c) => Event::IngressOff,
            _ = commands.wait_for(|c| *c != Command::Run), if !retired => Event::Drain,
        };
        match event {
            Event::RouterDone => break,
            Event::IngressOff => {
                // Cut it as a CONNECT tunnel is cut, once the router can see that atunnel ended
                // the tunnel: the unix connection closes first, so a router that reads the cut
                // as the end of a body delimited by the connection's close finds it closed and
                // fails that body instead of ending it cleanly short.
                drop(stream);
                let _ = upstream.shutdown(std::net::Shutdown::Both);
                break;
            }
            Event::Drain => {
                retired = true;
                if stream.write_all(&[RETIRE]).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(guard);
}

/// One request line, at most [`MAX_LINE`] bytes.
async fn read_line(stream: &mut UnixStream) -> io::Result<String> {
    let mut line = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        if line.len() >= MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request line longer than 1024 bytes",
            ));
        }
        if stream.read(&mut byte).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.push(byte[0]);
    }
    String::from_utf8(line)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "request line is not UTF-8"))
}

/// Writes `reply`, with `fd` attached (SCM_RIGHTS) when given.
async fn answer(stream: &UnixStream, reply: &Reply, fd: Option<RawFd>) -> io::Result<()> {
    let text = reply.encode();
    let bytes = text.as_bytes();
    let raw = stream.as_raw_fd();
    let mut sent = 0;
    while sent < bytes.len() {
        // The descriptor goes with the first byte; the rest (if the write was short) after it.
        let with_fd = if sent == 0 { fd } else { None };
        let n = stream
            .async_io(Interest::WRITABLE, || send(raw, &bytes[sent..], with_fd))
            .await?;
        sent += n;
    }
    Ok(())
}

fn send(sock: RawFd, bytes: &[u8], fd: Option<RawFd>) -> io::Result<usize> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [io::IoSlice::new(bytes)];
    let fds = fd.map(|fd| [fd]);
    let attached;
    let cmsgs: &[ControlMessage] = match &fds {
        Some(fds) => {
            attached = [ControlMessage::ScmRights(fds)];
            &attached
        }
        None => &[],
    };
    sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
}
