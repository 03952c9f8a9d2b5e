//! The embedded-mode certificate authority: one self-signed CA per state directory that issues
//! short-lived X509-SVIDs to every component started by `ate up`.

use std::fs::{self, OpenOptions};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use crate::error::TlsError;
use crate::fsutil::{CERT_MODE, KEY_MODE, check_key_permissions, write_atomic};
use crate::id::SpiffeId;

/// File name of the CA certificate inside the CA directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside the CA directory.
pub const CA_KEY_FILE: &str = "ca.key";
const CA_LOCK_FILE: &str = "ca.lock";

/// Default leaf lifetime.
pub const DEFAULT_SVID_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Lifetime of the CA certificate itself.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// `notBefore` is set slightly in the past so small clock differences between processes do not
/// make a fresh certificate "not yet valid".
const BACKDATE: Duration = Duration::from_secs(5);

/// What to put in a leaf SVID.
#[derive(Clone, Debug)]
pub struct SvidRequest {
    pub id: SpiffeId,
    /// Extra DNS SANs for servers reached by name (e.g. `localhost`, `ate-api.ate-system.svc`).
    pub dns_names: Vec<String>,
    /// Extra IP SANs for servers reached by address.
    pub ips: Vec<IpAddr>,
    pub lifetime: Duration,
}

impl SvidRequest {
    pub fn new(id: SpiffeId) -> Self {
        SvidRequest {
            id,
            dns_names: Vec::new(),
            ips: Vec::new(),
            lifetime: DEFAULT_SVID_LIFETIME,
        }
    }

    pub fn dns(mut self, name: impl Into<String>) -> Self {
        self.dns_names.push(name.into());
        self
    }

    pub fn ip(mut self, ip: IpAddr) -> Self {
        self.ips.push(ip);
        self
    }

    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }
}

/// An issued leaf certificate and its key.
pub struct Svid {
    pub id: SpiffeId,
    /// Leaf first; the CA root is distributed separately.
    pub chain: Vec<CertificateDer<'static>>,
    key_der: PrivatePkcs8KeyDer<'static>,
    cert_pem: String,
    key_pem: String,
    pub serial: Vec<u8>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Clone for Svid {
    fn clone(&self) -> Self {
        Svid {
            id: self.id.clone(),
            chain: self.chain.clone(),
            key_der: self.key_der.clone_key(),
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key_pem.clone(),
            serial: self.serial.clone(),
            not_before: self.not_before,
            not_after: self.not_after,
        }
    }
}

impl std::fmt::Debug for Svid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No key material in logs.
        f.debug_struct("Svid")
            .field("id", &self.id)
            .field("serial", &hex(&self.serial))
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Svid {
    /// PEM of the certificate chain (leaf only).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// PKCS#8 PEM of the private key.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key_der.clone_key())
    }

    /// The rustls form served by resolvers.
    pub fn certified_key(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        Ok(Arc::new(CertifiedKey::from_der(
            self.chain.clone(),
            self.key_der(),
            &crate::crypto_provider(),
        )?))
    }

    /// Writes the chain (0644) and the key (0600), each atomically. The key is written first so
    /// a watcher that sees the new certificate also finds the matching key.
    pub fn write_pem(&self, cert_path: &Path, key_path: &Path) -> Result<(), TlsError> {
        write_atomic(key_path, self.key_pem.as_bytes(), KEY_MODE)?;
        write_atomic(cert_path, self.cert_pem.as_bytes(), CERT_MODE)
    }
}

/// A local CA kept in a directory (`ca.crt` 0644, `ca.key` 0600).
pub struct LocalCa {
    dir: PathBuf,
    trust_domain: String,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa")
            .field("dir", &self.dir)
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

impl LocalCa {
    /// Loads the CA in `dir`, creating it on first use. Several processes may race here (every
    /// component of `ate up`), so creation happens under an exclusive file lock. Blocks briefly.
    pub fn open_or_create(dir: &Path, trust_domain: &str) -> Result<Self, TlsError> {
        // Validates the trust domain with the same rules as IDs.
        SpiffeId::new(trust_domain, "x", "x")?;
        fs::create_dir_all(dir).map_err(|e| TlsError::io("create directory", dir, e))?;
        let lock_path = dir.join(CA_LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| TlsError::io("open", &lock_path, e))?;
        lock.lock()
            .map_err(|e| TlsError::io("lock", &lock_path, e))?;
        let result = match Self::open(dir) {
            Err(TlsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Self::create(dir, trust_domain)
            }
            other => other,
        };
        let _ = lock.unlock();
        let ca = result?;
        if ca.trust_domain != trust_domain {
            return Err(TlsError::InvalidSpiffeId {
                id: trust_domain.to_string(),
                reason: format!(
                    "the CA in {} belongs to trust domain {}",
                    dir.display(),
                    ca.trust_domain
                ),
            });
        }
        Ok(ca)
    }

    /// Loads an existing CA; NotFound (as `TlsError::Io`) when neither file exists.
    pub fn open(dir: &Path) -> Result<Self, TlsError> {
        Self::open_checked(dir, false)
    }

    /// Like [`LocalCa::open`], but also accepts a key its group may read (never write, and
    /// nothing for others): how Kubernetes mounts a Secret for a pod that runs as a non-root
    /// user with an `fsGroup` (files `root:<fsGroup>`, mode 0440).
    pub fn open_mounted(dir: &Path) -> Result<Self, TlsError> {
        Self::open_checked(dir, true)
    }

    fn open_checked(dir: &Path, group_read: bool) -> Result<Self, TlsError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        match (cert_path.exists(), key_path.exists()) {
            (true, true) => {}
            (false, false) => {
                return Err(TlsError::io(
                    "open",
                    &cert_path,
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ));
            }
            (true, false) => {
                return Err(TlsError::CaIncomplete {
                    dir: dir.to_path_buf(),
                    present: CA_CERT_FILE,
                    missing: CA_KEY_FILE,
                });
            }
            (false, true) => {
                return Err(TlsError::CaIncomplete {
                    dir: dir.to_path_buf(),
                    present: CA_KEY_FILE,
                    missing: CA_CERT_FILE,
                });
            }
        }
        if group_read {
            crate::fsutil::check_key_permissions_group_read(&key_path)?;
        } else {
            check_key_permissions(&key_path)?;
        }
        let key_pem =
            fs::read_to_string(&key_path).map_err(|e| TlsError::io("read", &key_path, e))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| TlsError::Pem {
            path: key_path.clone(),
            reason: e.to_string(),
        })?;
        let cert_pem =
            fs::read_to_string(&cert_path).map_err(|e| TlsError::io("read", &cert_path, e))?;
        let cert_der =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| TlsError::Pem {
                path: cert_path.clone(),
                reason: e.to_string(),
            })?;
        let trust_domain = ca_trust_domain(&cert_der)?;
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)?;
        Ok(LocalCa {
            dir: dir.to_path_buf(),
            trust_domain,
            cert_der,
            cert_pem,
            issuer,
        })
    }

    fn create(dir: &Path, trust_domain: &str) -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let serial = random_serial()?;
        let mut dn = DistinguishedName::new();
        // A unique name per CA, so a certificate from another (re-created) CA is reported as
        // an unknown issuer rather than a bad signature from a same-named one.
        dn.push(
            DnType::CommonName,
            format!("ate local CA {}", &hex(&serial.to_bytes())[..8]),
        );
        // The trust domain lives in O so a reload can recover it without side files.
        dn.push(DnType::OrganizationName, trust_domain);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + CA_LIFETIME).into();
        params.serial_number = Some(serial);
        params.subject_alt_names = vec![SanType::URI(Ia5String::try_from(format!(
            "spiffe://{trust_domain}"
        ))?)];
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        write_atomic(
            &dir.join(CA_KEY_FILE),
            key.serialize_pem().as_bytes(),
            KEY_MODE,
        )?;
        write_atomic(&dir.join(CA_CERT_FILE), cert_pem.as_bytes(), CERT_MODE)?;
        tracing::info!(dir = %dir.display(), trust_domain, "created local CA");
        Ok(LocalCa {
            dir: dir.to_path_buf(),
            trust_domain: trust_domain.to_string(),
            cert_der: cert.der().clone(),
            cert_pem,
            issuer: Issuer::new(params, key),
        })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of `ca.crt`, for `--ca` flags and client configurations.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CA_CERT_FILE)
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A root store holding only this CA.
    pub fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert_der.clone())?;
        Ok(roots)
    }

    /// Issues a leaf valid from (about) now for `req.lifetime`.
    pub fn issue(&self, req: &SvidRequest) -> Result<Svid, TlsError> {
        if req.lifetime.is_zero() {
            return Err(TlsError::InvalidLifetime("lifetime must be > 0".into()));
        }
        let now = SystemTime::now();
        self.issue_with_validity(req, now - BACKDATE, now + req.lifetime)
    }

    /// Issues a leaf with an explicit validity window (tests use a window in the past).
    pub fn issue_with_validity(
        &self,
        req: &SvidRequest,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Svid, TlsError> {
        if req.id.trust_domain() != self.trust_domain {
            return Err(TlsError::ForeignTrustDomain {
                ca: self.trust_domain.clone(),
                id: Box::new(req.id.clone()),
            });
        }
        if not_after <= not_before {
            return Err(TlsError::InvalidLifetime(
                "notAfter must be after notBefore".into(),
            ));
        }
        let key = KeyPair::generate()?;
        let (params, serial_bytes) = leaf_params(req, not_before, not_after)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Svid {
            id: req.id.clone(),
            chain: vec![cert.der().clone()],
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial: serial_bytes,
            not_before,
            not_after,
        })
    }

    /// Signs a certificate signing request for `req.id`, valid from (about) now for
    /// `req.lifetime`. Only the CSR's public key is used (after checking the CSR's signature,
    /// which proves the caller holds the private key): the subject, SANs and usages are ours, so
    /// a CSR can never ask for another identity or for CA powers.
    pub fn sign_csr(&self, req: &SvidRequest, csr_pem: &str) -> Result<SignedCert, TlsError> {
        if req.lifetime.is_zero() {
            return Err(TlsError::InvalidLifetime("lifetime must be > 0".into()));
        }
        if req.id.trust_domain() != self.trust_domain {
            return Err(TlsError::ForeignTrustDomain {
                ca: self.trust_domain.clone(),
                id: Box::new(req.id.clone()),
            });
        }
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| TlsError::BadCsr(e.to_string()))?;
        let now = SystemTime::now();
        let not_after = now + req.lifetime;
        let (params, serial) = leaf_params(req, now - BACKDATE, not_after)?;
        let cert = params.signed_by(&csr.public_key, &self.issuer)?;
        Ok(SignedCert {
            cert_pem: cert.pem(),
            serial,
            not_after,
        })
    }
}

/// A certificate signed from a CSR (the key stays with the requester).
#[derive(Clone, Debug)]
pub struct SignedCert {
    pub cert_pem: String,
    pub serial: Vec<u8>,
    pub not_after: SystemTime,
}

/// The parameters of a leaf SVID for `req` (the same for a certificate we key ourselves and one
/// signed from a CSR) and its serial number.
fn leaf_params(
    req: &SvidRequest,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(CertificateParams, Vec<u8>), TlsError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, req.id.service_account());
    params.distinguished_name = dn;
    // X509-SVID validators reject leaves without basicConstraints, so say CA:false explicitly.
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let serial = random_serial()?;
    let serial_bytes = serial.to_bytes();
    params.serial_number = Some(serial);
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    let mut sans = vec![SanType::URI(Ia5String::try_from(req.id.uri())?)];
    for name in &req.dns_names {
        sans.push(SanType::DnsName(Ia5String::try_from(name.as_str())?));
    }
    sans.extend(req.ips.iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = sans;
    Ok((params, serial_bytes))
}

/// Recovers the trust domain from the CA certificate (URI SAN `spiffe://<td>`, else O).
fn ca_trust_domain(der: &CertificateDer<'_>) -> Result<String, TlsError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        parse_x509_certificate(der).map_err(|e| TlsError::CertParse(format!("{e:?}")))?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && let Some(td) = uri.strip_prefix("spiffe://")
            {
                return Ok(td.trim_end_matches('/').to_string());
            }
        }
    }
    cert.subject()
        .iter_organization()
        .next()
        .and_then(|o| o.as_str().ok())
        .map(str::to_string)
        .ok_or_else(|| TlsError::CertParse("CA certificate names no trust domain".into()))
}

/// 16 random bytes, top bit cleared so the DER INTEGER stays positive and minimal.
fn random_serial() -> Result<SerialNumber, TlsError> {
    let mut bytes = [0u8; 16];
    crate::crypto_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::Rustls(rustls::Error::FailedToGetRandomBytes))?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; // avoid a leading zero byte so the encoding is always 16 bytes
    Ok(SerialNumber::from_slice(&bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
