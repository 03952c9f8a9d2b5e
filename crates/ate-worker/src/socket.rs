//! The WorkerService socket. It is the node agent's only way in, so two checks guard it: the
//! file is mode 0600 from the moment it has its name (bound under a temporary name, chmod'ed,
//! then renamed), and every accepted connection's peer credentials (`SO_PEERCRED`) must be root
//! or the worker's own uid ([`peer_allowed`]); any other peer is closed at once and logged with
//! its pid and uid.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;

use crate::service::{WorkerError, io_err};

/// Whether a peer running as `uid` may use the unix sockets (WorkerService, handoff) of a worker
/// running as `own_uid`: root (the node agent, a router) or the worker's own user.
pub fn peer_allowed(uid: u32, own_uid: u32) -> bool {
    uid == 0 || uid == own_uid
}

/// Binds the WorkerService socket at `path` (a stale file there is replaced). The socket is
/// bound under a temporary name in the same directory, set to 0600 and then renamed, so `path`
/// never names a socket with a wider mode (whatever the umask).
pub(crate) fn bind_socket(path: &Path) -> Result<UnixListener, WorkerError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "worker.sock".into());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    for stale in [&tmp, &path.to_path_buf()] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove stale {}", stale.display()))(e)),
        }
    }
    let unix = UnixListener::bind(&tmp).map_err(io_err(format!("bind {}", tmp.display())))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("chmod {}", tmp.display())))
        .and_then(|()| {
            std::fs::rename(&tmp, path).map_err(io_err(format!(
                "rename {} to {}",
                tmp.display(),
                path.display()
            )))
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(unix)
}

/// The connections of `listener` whose peer passes [`peer_allowed`] against `own_uid`. A
/// refused connection is dropped (closed) and logged; accept errors pass through to the server.
pub(crate) fn authorized_incoming(
    listener: UnixListener,
    own_uid: u32,
) -> impl tokio_stream::Stream<Item = std::io::Result<UnixStream>> {
    UnixListenerStream::new(listener).filter_map(move |conn| {
        let stream = match conn {
            Ok(stream) => stream,
            Err(e) => return Some(Err(e)),
        };
        match stream.peer_cred() {
            Ok(cred) if peer_allowed(cred.uid(), own_uid) => Some(Ok(stream)),
            Ok(cred) => {
                tracing::warn!(
                    pid = ?cred.pid(),
                    uid = cred.uid(),
                    gid = cred.gid(),
                    own_uid,
                    "WorkerService connection refused: the peer is neither root nor the worker's user"
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "WorkerService connection refused: no peer credentials");
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn only_root_or_the_workers_own_user() {
        assert!(peer_allowed(0, 0));
        assert!(peer_allowed(0, 1000));
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(1000, 0));
        assert!(!peer_allowed(65534, 1000));
    }

    /// Serves `listener` the way `run` does, answering every admitted connection with `ok`.
    fn serve_ok(listener: UnixListener) -> tokio::task::JoinHandle<()> {
        let own_uid = nix::unistd::geteuid().as_raw();
        tokio::spawn(async move {
            let incoming = authorized_incoming(listener, own_uid);
            tokio::pin!(incoming);
            while let Some(conn) = incoming.next().await {
                if let Ok(mut stream) = conn {
                    let _ = stream.write_all(b"ok").await;
                }
            }
        })
    }

    /// Connects to `path` as this process's user and expects [`serve_ok`]'s answer.
    async fn assert_admitted(path: &Path) {
        let mut client = UnixStream::connect(path).await.unwrap();
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut reply))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reply, b"ok");
    }

    #[tokio::test]
    async fn socket_is_0600_and_the_same_user_gets_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.sock");
        // A stale file at the path is replaced.
        std::fs::write(&path, b"stale").unwrap();
        let listener = bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
        // No temporary name is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("worker.sock")]);
        let server = serve_ok(listener);
        assert_admitted(&path).await;
        server.abort();
    }

    /// What a forked child running as `nobody` saw (its exit code).
    const CHILD_REFUSED: i32 = 0;
    const CHILD_ADMITTED: i32 = 1;
    const CHILD_CONNECT_DENIED: i32 = 2;
    const CHILD_OTHER: i32 = 3;

    /// Forks a child that becomes uid/gid 65534, connects to `path` and reads: EOF means the
    /// server closed the connection. Only async-signal-safe calls happen in the child.
    fn connect_as_nobody(path: &Path) -> i32 {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
        use nix::sys::wait::{WaitStatus, waitpid};
        use nix::unistd::{ForkResult, Gid, Uid, fork, setgid, setuid};

        let addr = UnixAddr::new(path).unwrap();
        let timeout = nix::sys::time::TimeVal::new(10, 0);
        // SAFETY: the child only makes raw system calls (no allocation, no locks) and leaves
        // with `_exit`.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let code = (|| {
                    if setgid(Gid::from_raw(65534)).is_err()
                        || setuid(Uid::from_raw(65534)).is_err()
                    {
                        return CHILD_OTHER;
                    }
                    let Ok(fd) = socket(
                        AddressFamily::Unix,
                        SockType::Stream,
                        SockFlag::empty(),
                        None,
                    ) else {
                        return CHILD_OTHER;
                    };
                    let _ = nix::sys::socket::setsockopt(
                        &fd,
                        nix::sys::socket::sockopt::ReceiveTimeout,
                        &timeout,
                    );
                    use std::os::fd::AsRawFd;
                    if connect(fd.as_raw_fd(), &addr).is_err() {
                        return CHILD_CONNECT_DENIED;
                    }
                    let mut buf = [0u8; 2];
                    match nix::unistd::read(&fd, &mut buf) {
                        Ok(0) => CHILD_REFUSED,
                        Ok(_) => CHILD_ADMITTED,
                        Err(_) => CHILD_OTHER,
                    }
                })();
                // SAFETY: ends the child without running the parent's destructors or atexit.
                unsafe { nix::libc::_exit(code) }
            }
            ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
                WaitStatus::Exited(_, code) => code,
                other => panic!("child ended with {other:?}"),
            },
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to become another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Let `nobody` reach the directory, so only the socket's own checks stand in its way.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("worker.sock");
        let listener = bind_socket(&path).unwrap();
        let server = serve_ok(listener);

        // Mode 0600: another user cannot even connect.
        let p = path.clone();
        let seen = tokio::task::spawn_blocking(move || connect_as_nobody(&p))
            .await
            .unwrap();
        assert_eq!(seen, CHILD_CONNECT_DENIED);

        // With the file opened up, the peer-credential check still closes the connection.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let p = path.clone();
        let seen = tokio::task::spawn_blocking(move || connect_as_nobody(&p))
            .await
            .unwrap();
        assert_eq!(seen, CHILD_REFUSED, "a uid 65534 peer must be refused");

        // And root still gets in on the same listener.
        assert_admitted(&path).await;
        server.abort();
    }
}
