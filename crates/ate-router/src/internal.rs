//! The internal listeners, on which only workers connect to send their actors' calls
//! ([`crate::callers`]): `--internal-socket` (a unix socket for the workers of this machine) and
//! `--internal-listen` (mTLS for workers elsewhere). Every connection they admit is served as
//! [`ConnAuth::Worker`](crate::auth::ConnAuth::Worker).
//!
//! Architecture invariant: only a worker (or the api, delivering an actor's alarm to itself) can
//! name a caller. The unix socket is mode 0600 in a
//! directory created 0700 and admits only root and the router's own user (SO_PEERCRED), like
//! atunnel's handoff socket; the TCP listener requires a client certificate from the platform's
//! CA with a worker's or the api's SPIFFE ID, checked after the handshake (anything else is
//! closed).

use std::io;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};

/// The internal listeners the router serves (either may be absent).
#[derive(Default)]
pub struct InternalListeners {
    pub unix: Option<UnixListener>,
    pub tls: Option<ate_tls::TlsIncoming>,
}

/// May a unix peer with `uid` use the internal socket of a router running as `own_uid`?
pub fn peer_allowed(uid: u32, own_uid: u32) -> bool {
    uid == 0 || uid == own_uid
}

/// The router's effective uid, against which [`peer_allowed`] checks.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Binds the internal socket at `path`, replacing a stale one. A missing parent directory is
/// created 0700. The socket is bound under a temporary name, set to 0600 and renamed, so `path`
/// never names a socket with a wider mode whatever the umask.
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "internal.sock".into());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    for stale in [tmp.as_path(), path] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let listener = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// The `--internal-listen` TLS listener over `listener`: the router's own certificate, ALPN h2 +
/// http/1.1, and a client certificate chaining to the CA required in the handshake (which SPIFFE
/// ID is checked per connection: [`admits`]).
pub fn tls_listener(
    source: &ate_tls::CertSource,
    listener: TcpListener,
) -> Result<ate_tls::TlsIncoming, crate::RouterError> {
    let client_auth = ate_tls::ClientAuth::Required {
        allowed: ate_tls::AllowList::any(),
    };
    let mut server = ate_tls::server_config(source, client_auth)?;
    ate_tls::set_server_alpn(&mut server, &[ate_tls::Alpn::H2, ate_tls::Alpn::Http11]);
    let addr = listener
        .local_addr()
        .map_err(|source| crate::RouterError::Bind {
            addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
    ate_tls::TlsIncoming::new(listener, Arc::new(server))
        .map_err(|source| crate::RouterError::Bind { addr, source })
}

/// Whether a verified client certificate with this SPIFFE ID may send calls: workers (their
/// actors' calls) and the api (alarm deliveries).
pub fn admits(id: Option<&ate_tls::SpiffeId>) -> bool {
    id.is_some_and(|id| id.is_worker() || id.is_api())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers() {
        assert!(peer_allowed(0, 1000));
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(1000, 0));
    }

    #[tokio::test]
    async fn socket_is_0600_in_a_0700_dir_and_replaces_a_stale_one() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/router/internal.sock");
        let first = bind_socket(&path).unwrap();
        drop(first);
        // A stale socket file (the last router died) is replaced.
        let _listener = bind_socket(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        tokio::net::UnixStream::connect(&path).await.unwrap();
    }

    #[test]
    fn only_worker_ids_are_admitted() {
        let id = |s: &str| ate_tls::SpiffeId::parse(s).unwrap();
        assert!(admits(Some(&id(
            "spiffe://cluster.local/ns/ate-system/sa/ate-worker-w1"
        ))));
        assert!(!admits(Some(&id(
            "spiffe://cluster.local/ns/ate-system/sa/atenet-client"
        ))));
        assert!(!admits(Some(&id(
            "spiffe://cluster.local/ns/team-a/sa/ate-worker-w1"
        ))));
        assert!(!admits(None));
    }
}
