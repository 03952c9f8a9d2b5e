//! Where a component's identity comes from, kept current in the background: issued in-process by
//! a `LocalCa` and re-issued at 2/3 of its lifetime, or read from files and reloaded when they
//! change. Handshakes read the current certificate through a lock-free `ArcSwap`, so rotation
//! never touches established connections.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::ca::{LocalCa, Svid, SvidRequest, hex};
use crate::error::TlsError;
use crate::fsutil::{CERT_MODE, write_atomic};
use crate::id::SpiffeId;

/// Default poll interval for file sources (Kubernetes updates mounted secrets within ~1 min).
pub const DEFAULT_FILE_POLL: Duration = Duration::from_secs(5);

/// Certificate, key and CA bundle paths (`--cert`, `--key`, `--ca`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl PemFiles {
    /// `<dir>/<name>.crt`, `<dir>/<name>.key` and `<dir>/ca.crt`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        PemFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            ca: dir.join("ca.crt"),
        }
    }
}

/// One generation of identity material.
#[derive(Clone)]
pub struct Material {
    pub certified_key: Arc<CertifiedKey>,
    /// Trust anchors used by our verifiers for peers.
    pub roots: Arc<RootCertStore>,
    /// Our own SPIFFE ID (None if the file certificate has none).
    pub id: Option<SpiffeId>,
    pub serial: Vec<u8>,
    pub not_after: Option<SystemTime>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("id", &self.id)
            .field("serial", &hex(&self.serial))
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Material {
    fn from_svid(svid: &Svid, roots: Arc<RootCertStore>) -> Result<Self, TlsError> {
        Ok(Material {
            certified_key: svid.certified_key()?,
            roots,
            id: Some(svid.id.clone()),
            serial: svid.serial.clone(),
            not_after: Some(svid.not_after),
        })
    }

    fn from_files(files: &PemFiles) -> Result<Self, TlsError> {
        let chain = read_certs(&files.cert)?;
        let key = read_key(&files.key)?;
        let roots = load_roots(&files.ca)?;
        let leaf = chain
            .first()
            .ok_or_else(|| TlsError::NoCertificate(files.cert.clone()))?;
        let (serial, not_after) = leaf_facts(leaf)?;
        let id = crate::peer::spiffe_id_from_der(leaf).ok();
        // from_der also checks that the key matches the certificate, which catches a watcher
        // reading a new certificate next to the old key.
        let certified_key = CertifiedKey::from_der(chain, key, &crate::crypto_provider())?;
        Ok(Material {
            certified_key: Arc::new(certified_key),
            roots: Arc::new(roots),
            id,
            serial,
            not_after: Some(not_after),
        })
    }
}

struct Inner {
    current: ArcSwap<Material>,
    generation: watch::Sender<u64>,
    task: Mutex<Option<AbortHandle>>,
}

impl Inner {
    fn store(&self, material: Material) {
        tracing::info!(
            id = ?material.id,
            serial = %hex(&material.serial),
            not_after = ?material.not_after,
            "certificate updated"
        );
        self.current.store(Arc::new(material));
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut task) = self.task.lock()
            && let Some(task) = task.take()
        {
            task.abort();
        }
    }
}

/// A component's identity, kept current in the background. Cheap to clone.
#[derive(Clone)]
pub struct CertSource {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CertSource")
            .field(&self.inner.current.load())
            .finish()
    }
}

impl CertSource {
    fn with_material(material: Material) -> Self {
        let (generation, _) = watch::channel(0);
        CertSource {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(material),
                generation,
                task: Mutex::new(None),
            }),
        }
    }

    fn set_task(&self, handle: AbortHandle) {
        if let Ok(mut task) = self.inner.task.lock() {
            *task = Some(handle);
        }
    }

    /// A fixed identity that never rotates (tests, one-shot tools).
    pub fn fixed(svid: &Svid, roots: RootCertStore) -> Result<Self, TlsError> {
        Ok(Self::with_material(Material::from_svid(
            svid,
            Arc::new(roots),
        )?))
    }

    /// Issues `req` from `ca` now and re-issues at 2/3 of the lifetime. Must be called inside a
    /// tokio runtime (else `TlsError::NoRuntime`).
    pub fn issued(ca: Arc<LocalCa>, req: SvidRequest) -> Result<Self, TlsError> {
        Self::issued_inner(ca, req, None)
    }

    /// Like `issued`, and also writes every generation to `files` (cert 0644, key 0600, CA copy)
    /// for processes that read files, e.g. the CLI configuration written by `ate up`.
    pub fn issued_to_files(
        ca: Arc<LocalCa>,
        req: SvidRequest,
        files: PemFiles,
    ) -> Result<Self, TlsError> {
        write_atomic(&files.ca, ca.cert_pem().as_bytes(), CERT_MODE)?;
        Self::issued_inner(ca, req, Some(files))
    }

    fn issued_inner(
        ca: Arc<LocalCa>,
        req: SvidRequest,
        out: Option<PemFiles>,
    ) -> Result<Self, TlsError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| TlsError::NoRuntime("CertSource::issued"))?;
        let roots = Arc::new(ca.roots()?);
        let issue = move |ca: &LocalCa| -> Result<Material, TlsError> {
            let svid = ca.issue(&req)?;
            if let Some(out) = &out {
                svid.write_pem(&out.cert, &out.key)?;
            }
            Material::from_svid(&svid, roots.clone())
        };
        let source = Self::with_material(issue(&ca)?);
        let weak = Arc::downgrade(&source.inner);
        let handle = runtime.spawn(renew_loop(weak, ca, issue));
        source.set_task(handle.abort_handle());
        Ok(source)
    }

    /// Reads `files` now and reloads them when their metadata changes (checked every `poll`).
    /// A failed reload (e.g. a key that does not match the certificate yet) keeps the current
    /// identity and is retried at the next poll. Must be called inside a tokio runtime (else
    /// `TlsError::NoRuntime`).
    pub fn from_files(files: PemFiles, poll: Duration) -> Result<Self, TlsError> {
        const ROTATION_RETRIES: u32 = 10;
        const ROTATION_RETRY_PAUSE: Duration = Duration::from_millis(50);
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| TlsError::NoRuntime("CertSource::from_files"))?;
        // A rotation replaces the certificate and the key one file after the other: a read in
        // between sees a pair that does not match (KeyMismatch). Read again briefly before
        // failing (the watch loop below does the same at its next poll).
        let mut tries = 0;
        let (stamp, material) = loop {
            let stamp = files_stamp(&files);
            match Material::from_files(&files) {
                Ok(m) => break (stamp, m),
                // Missing files are not a rotation: fail at once.
                Err(e)
                    if tries >= ROTATION_RETRIES || !files.cert.exists() || !files.key.exists() =>
                {
                    return Err(e);
                }
                Err(_) => {
                    tries += 1;
                    std::thread::sleep(ROTATION_RETRY_PAUSE);
                }
            }
        };
        let source = Self::with_material(material);
        let weak = Arc::downgrade(&source.inner);
        let handle = runtime.spawn(watch_loop(weak, files, poll, stamp));
        source.set_task(handle.abort_handle());
        Ok(source)
    }

    /// The current generation.
    pub fn current(&self) -> Arc<Material> {
        self.inner.current.load_full()
    }

    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        self.inner.current.load().certified_key.clone()
    }

    pub fn roots(&self) -> Arc<RootCertStore> {
        self.inner.current.load().roots.clone()
    }

    /// Our own SPIFFE ID, if the certificate carries one.
    pub fn id(&self) -> Option<SpiffeId> {
        self.inner.current.load().id.clone()
    }

    /// Counts rotations; `changed()` fires after each new certificate.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.generation.subscribe()
    }

    /// A rustls resolver (server and client) that always returns the current certificate.
    pub fn resolver(&self) -> Arc<SourceResolver> {
        Arc::new(SourceResolver {
            source: self.clone(),
        })
    }
}

async fn renew_loop<F>(weak: Weak<Inner>, ca: Arc<LocalCa>, issue: F)
where
    F: Fn(&LocalCa) -> Result<Material, TlsError> + Send + 'static,
{
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let current = inner.current.load_full();
        drop(inner);
        tokio::time::sleep(renew_delay(&current)).await;
        loop {
            let Some(inner) = weak.upgrade() else { return };
            match issue(&ca) {
                Ok(material) => {
                    inner.store(material);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "certificate re-issue failed; retrying");
                    drop(inner);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// Time until 2/3 of the certificate's remaining validity has passed, so a renewal failure
/// leaves a third of the lifetime for retries.
fn renew_delay(material: &Material) -> Duration {
    let now = SystemTime::now();
    let remaining = material
        .not_after
        .and_then(|na| na.duration_since(now).ok())
        .unwrap_or_default();
    (remaining * 2 / 3).max(Duration::from_millis(100))
}

/// (mtime s, mtime ns, size, inode, device) of one file; None if it cannot be stat'ed.
type FileMeta = Option<(i64, i64, u64, u64, u64)>;

#[derive(PartialEq, Eq, Debug, Clone)]
struct FileStamp(Vec<FileMeta>);

/// mtime, size, inode and device of each file, following symlinks: a Kubernetes secret update
/// swaps the `..data` symlink, which changes the inode the paths resolve to.
fn files_stamp(files: &PemFiles) -> FileStamp {
    FileStamp(
        [&files.cert, &files.key, &files.ca]
            .iter()
            .map(|p| {
                fs::metadata(p)
                    .ok()
                    .map(|m| (m.mtime(), m.mtime_nsec(), m.size(), m.ino(), m.dev()))
            })
            .collect(),
    )
}

async fn watch_loop(weak: Weak<Inner>, files: PemFiles, poll: Duration, mut last: FileStamp) {
    let poll = poll.max(Duration::from_millis(50));
    loop {
        tokio::time::sleep(poll).await;
        let Some(inner) = weak.upgrade() else { return };
        let files_now = files.clone();
        let seen = last.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let before = files_stamp(&files_now);
            if before == seen {
                return None;
            }
            let loaded = Material::from_files(&files_now);
            // A writer still busy with the files: skip this round rather than load a mix.
            (files_stamp(&files_now) == before).then_some((before, loaded))
        });
        let Ok(Some((stamp, loaded))) = checked.await else {
            continue;
        };
        match loaded {
            Ok(material) => {
                inner.store(material);
                last = stamp;
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    cert = %files.cert.display(),
                    "certificate reload failed; keeping the current one"
                );
            }
        }
    }
}

/// Resolves to the source's current certificate for both server and client handshakes.
#[derive(Debug)]
pub struct SourceResolver {
    source: CertSource,
}

impl ResolvesServerCert for SourceResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.source.certified_key())
    }
}

impl ResolvesClientCert for SourceResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.source.certified_key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Reads every certificate in a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey(path.to_path_buf()),
        e => pem_error(path, e),
    })
}

/// A root store from a PEM bundle (`--ca`).
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> TlsError {
    match e {
        rustls::pki_types::pem::Error::Io(io) => TlsError::io("read", path, io),
        e => TlsError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    }
}

fn leaf_facts(der: &CertificateDer<'_>) -> Result<(Vec<u8>, SystemTime), TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| TlsError::CertParse(format!("{e:?}")))?;
    let secs = cert.validity().not_after.timestamp();
    let not_after = if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH
    };
    Ok((cert.raw_serial().to_vec(), not_after))
}
