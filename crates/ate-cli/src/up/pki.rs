//! The local CA and the certificates `ate up` issues (and keeps rotating) for its components and
//! the admin.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::UpArgs;
use crate::client;

/// The local CA and one rotating certificate per component, written to `<state>/tls/<name>.crt`
/// and `.key` (+ `ca.crt`) for the children, which reload them when they change.
pub(super) struct Pki {
    /// None on a joined node: its certificates come from the api (see `crate::join`).
    ca: Option<Arc<ate_tls::LocalCa>>,
    pub(super) dir: PathBuf,
    pub(super) td: String,
    lifetime: Duration,
    /// Kept alive: dropping a source stops its rotation.
    sources: Vec<ate_tls::CertSource>,
}

impl Pki {
    pub(super) fn open(args: &UpArgs) -> anyhow::Result<Self> {
        let ca_dir = ca_dir(args);
        let ca =
            ate_tls::LocalCa::open_or_create(&ca_dir, &args.trust_domain).with_context(|| {
                format!("cannot open or create the local CA in {}", ca_dir.display())
            })?;
        let dir = args.state_dir.join(client::TLS_DIR);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Pki {
            ca: Some(Arc::new(ca)),
            dir,
            td: args.trust_domain.clone(),
            lifetime: args.cert_lifetime,
            sources: Vec::new(),
        })
    }

    /// A joined node's certificates, already in `dir` and renewed by `crate::join`.
    pub(super) fn joined(dir: PathBuf, issued: &crate::join::Issued) -> Self {
        Pki {
            ca: None,
            dir,
            td: issued.trust_domain.clone(),
            lifetime: issued.lifetime,
            sources: Vec::new(),
        }
    }

    /// Issues (and keeps rotating) `id`'s certificate as `<name>.{crt,key}`.
    pub(super) fn issue(
        &mut self,
        name: &str,
        id: ate_tls::SpiffeId,
    ) -> anyhow::Result<(ate_tls::CertSource, ate_tls::TlsArgs)> {
        self.issue_req(name, ate_tls::SvidRequest::new(id))
    }

    pub(super) fn issue_req(
        &mut self,
        name: &str,
        req: ate_tls::SvidRequest,
    ) -> anyhow::Result<(ate_tls::CertSource, ate_tls::TlsArgs)> {
        let files = ate_tls::PemFiles::in_dir(&self.dir, name);
        let source = match &self.ca {
            Some(ca) => {
                let req = req.lifetime(self.lifetime);
                ate_tls::CertSource::issued_to_files(ca.clone(), req, files.clone())
                    .with_context(|| format!("cannot issue the {name} certificate"))?
            }
            // Joined: the files are there (checked by loading them), renewed elsewhere.
            None => ate_tls::CertSource::from_files(files.clone(), ate_tls::DEFAULT_FILE_POLL)
                .with_context(|| format!("cannot load the {name} certificate"))?,
        };
        self.sources.push(source.clone());
        let mut flags = ate_tls::TlsArgs::from_files(&files, &self.td);
        // Children must notice a rotated certificate well before the old one expires.
        flags.tls_reload_interval = Some(
            (self.lifetime / 12).clamp(Duration::from_millis(100), ate_tls::DEFAULT_FILE_POLL),
        );
        Ok((source, flags))
    }
}

/// Copies the admin certificate into the CLI context `dir` (key 0600) now and after each
/// rotation, so `ate` finds it without flags.
pub(super) fn publish_admin(admin: &ate_tls::CertSource, pki_dir: &Path, dir: PathBuf) {
    let from = ate_tls::PemFiles::in_dir(pki_dir, client::ADMIN_CERT_NAME);
    let to = ate_tls::PemFiles::in_dir(&dir, client::ADMIN_CERT_NAME);
    let copy = move || -> anyhow::Result<()> {
        std::fs::create_dir_all(&dir)?;
        for (src, dst, mode) in [
            (&from.cert, &to.cert, 0o644),
            (&from.key, &to.key, 0o600),
            (&from.ca, &to.ca, 0o644),
        ] {
            let bytes = std::fs::read(src)?;
            let tmp = dst.with_extension("tmp");
            {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let _ = std::fs::remove_file(&tmp);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&tmp)?;
                f.write_all(&bytes)?;
            }
            std::fs::rename(&tmp, dst)?;
        }
        Ok(())
    };
    if let Err(e) = copy() {
        eprintln!("ate up: cannot copy the admin certificate to the user config dir: {e:#}");
    }
    let mut changes = admin.subscribe();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            if let Err(e) = copy() {
                eprintln!("ate up: cannot copy the rotated admin certificate: {e:#}");
            }
        }
    });
}

/// The CA directory: `--ca-dir`, else STATE_DIR/ca.
pub(super) fn ca_dir(args: &UpArgs) -> PathBuf {
    args.ca_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("ca"))
}

/// The key that signs actors' identity tokens: `STATE_DIR/identity/identity-key.pem` (what
/// `ate keys rotate-identity` rotates).
pub(crate) fn identity_key(args: &UpArgs) -> PathBuf {
    identity_key_in(&args.state_dir)
}

pub(crate) fn identity_key_in(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("identity").join("identity-key.pem")
}

/// `req` with the `--tls-san` names and addresses.
pub(super) fn with_sans(mut req: ate_tls::SvidRequest, sans: &[String]) -> ate_tls::SvidRequest {
    for san in sans {
        req = match san.parse::<std::net::IpAddr>() {
            Ok(ip) => req.ip(ip),
            Err(_) => req.dns(san.clone()),
        };
    }
    req
}
