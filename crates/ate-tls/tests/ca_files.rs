//! The CA directory on disk: persistence, modes, and refusing a readable key.

use std::os::unix::fs::PermissionsExt;

use ate_tls::{CA_CERT_FILE, CA_KEY_FILE, LocalCa, SpiffeId, SvidRequest, TlsError};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn created_once_with_modes_then_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let ca = LocalCa::open_or_create(dir.path(), "ate.local").unwrap();
    assert_eq!(mode(&dir.path().join(CA_KEY_FILE)), 0o600);
    assert_eq!(mode(&dir.path().join(CA_CERT_FILE)), 0o644);
    let again = LocalCa::open_or_create(dir.path(), "ate.local").unwrap();
    assert_eq!(ca.cert_der(), again.cert_der());
    assert_eq!(again.trust_domain(), "ate.local");

    // A leaf from the reloaded CA chains to the original certificate.
    let svid = again
        .issue(&SvidRequest::new(SpiffeId::node("ate.local").unwrap()))
        .unwrap();
    let cert = ate_tls::rustls::server::ParsedCertificate::try_from(&svid.chain[0]).unwrap();
    ate_tls::rustls::client::verify_server_cert_signed_by_trust_anchor(
        &cert,
        &ca.roots().unwrap(),
        &[],
        ate_tls::rustls::pki_types::UnixTime::now(),
        ate_tls::crypto_provider()
            .signature_verification_algorithms
            .all,
    )
    .unwrap();

    // A different trust domain for the same directory is an error, not a silent mix.
    assert!(LocalCa::open_or_create(dir.path(), "other.example").is_err());
}

#[test]
fn refuses_group_readable_key() {
    let dir = tempfile::tempdir().unwrap();
    LocalCa::open_or_create(dir.path(), "ate.local").unwrap();
    let key = dir.path().join(CA_KEY_FILE);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = LocalCa::open_or_create(dir.path(), "ate.local").unwrap_err();
    assert!(
        matches!(err, TlsError::InsecureKeyPermissions { mode: 0o644, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("refusing CA key file") && msg.contains("chmod 600"),
        "{msg}"
    );
}

#[test]
fn half_present_ca_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    LocalCa::open_or_create(dir.path(), "ate.local").unwrap();
    std::fs::remove_file(dir.path().join(CA_KEY_FILE)).unwrap();
    let err = LocalCa::open_or_create(dir.path(), "ate.local").unwrap_err();
    assert!(matches!(err, TlsError::CaIncomplete { .. }), "{err}");
}

#[test]
fn svid_pem_files_are_written_with_modes() {
    let dir = tempfile::tempdir().unwrap();
    let ca = LocalCa::open_or_create(dir.path(), "ate.local").unwrap();
    let svid = ca
        .issue(&SvidRequest::new(SpiffeId::admin("ate.local").unwrap()))
        .unwrap();
    let (c, k) = (dir.path().join("admin.crt"), dir.path().join("admin.key"));
    svid.write_pem(&c, &k).unwrap();
    assert_eq!(mode(&k), 0o600);
    assert_eq!(mode(&c), 0o644);
    let certs = ate_tls::read_certs(&c).unwrap();
    assert_eq!(certs, svid.chain);
    ate_tls::read_key(&k).unwrap();
}

#[test]
fn rotating_sources_need_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let ca = std::sync::Arc::new(LocalCa::open_or_create(dir.path(), "ate.local").unwrap());
    let req = SvidRequest::new(SpiffeId::api("ate.local").unwrap());
    let err = ate_tls::CertSource::issued(ca, req).unwrap_err();
    assert!(matches!(err, TlsError::NoRuntime(_)), "{err}");
}
