//! Rotation without dropped connections: issued sources re-issue at 2/3 of a 3 s lifetime (a
//! scaled-down 60 s), file sources reload when the files change.

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ate_tls::{
    AllowList, CertSource, ClientAuth, LocalCa, PemFiles, ServerCheck, SpiffeId, SvidRequest,
    client_config, server_config,
};
use support::{echo_server, ping, round_trip, served_serial};

const TD: &str = ate_tls::DEFAULT_TRUST_DOMAIN;

fn router() -> SpiffeId {
    SpiffeId::router(TD).unwrap()
}

fn worker1() -> SpiffeId {
    SpiffeId::worker_instance(TD, "w1").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_second_certificates_rotate_under_traffic_without_failures() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(LocalCa::open_or_create(dir.path(), TD).unwrap());
    let lifetime = Duration::from_secs(3);
    let server_src =
        CertSource::issued(ca.clone(), SvidRequest::new(worker1()).lifetime(lifetime)).unwrap();
    let client_src =
        CertSource::issued(ca.clone(), SvidRequest::new(router()).lifetime(lifetime)).unwrap();
    let server = echo_server(
        server_config(
            &server_src,
            ClientAuth::Required {
                allowed: AllowList::only([router()]),
            },
        )
        .unwrap(),
    )
    .await;
    let client = client_config(&client_src, ServerCheck::Pin(worker1())).unwrap();
    let first_serial = server_src.current().serial.clone();
    let deadline = Instant::now() + Duration::from_secs(10);

    // One connection kept open across every rotation (its certificates expire meanwhile).
    let mut long_lived = round_trip(&client, server.addr).await.unwrap();
    let existing = async {
        let mut pings = 0u32;
        while Instant::now() < deadline {
            ping(&mut long_lived).await.unwrap();
            pings += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pings
    };
    // Fresh connections throughout, each a full handshake with the current certificates.
    let fresh = async {
        let mut serials = BTreeSet::new();
        let mut failures = Vec::new();
        let mut count = 0u32;
        while Instant::now() < deadline {
            match round_trip(&client, server.addr).await {
                Ok(tls) => {
                    serials.insert(served_serial(&tls));
                }
                Err(e) => failures.push(e),
            }
            count += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (serials, failures, count)
    };
    let (pings, (serials, failures, count)) = tokio::join!(existing, fresh);

    eprintln!(
        "rotation: {pings} pings on one connection, {count} new connections, {} failures, {} served serials",
        failures.len(),
        serials.len()
    );
    assert!(failures.is_empty(), "failed handshakes: {failures:?}");
    assert!(
        pings > 50 && count > 30,
        "pings {pings}, connections {count}"
    );
    // ~10 s / 2 s per rotation: expect about 5 server certificates; allow for a loaded box.
    assert!(serials.len() >= 3, "only {} served serials", serials.len());
    assert_ne!(server_src.current().serial, first_serial);
    assert!(*client_src.subscribe().borrow() >= 2);
}

fn write_svid(svid: &ate_tls::Svid, files: &PemFiles) {
    svid.write_pem(&files.cert, &files.key).unwrap();
}

async fn wait_rotation(rx: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("reload within 5 s")
        .unwrap();
}

#[tokio::test]
async fn file_source_reloads_changed_files() {
    let dir = tempfile::tempdir().unwrap();
    let ca = LocalCa::open_or_create(&dir.path().join("ca"), TD).unwrap();
    let files = PemFiles {
        ca: ca.cert_path(),
        ..PemFiles::in_dir(dir.path(), "tls")
    };
    let issue = || ca.issue(&SvidRequest::new(worker1())).unwrap();
    let a = issue();
    write_svid(&a, &files);

    let source = CertSource::from_files(files.clone(), Duration::from_millis(100)).unwrap();
    assert_eq!(source.id(), Some(worker1()));
    let mut rx = source.subscribe();
    let server = echo_server(
        server_config(
            &source,
            ClientAuth::Required {
                allowed: AllowList::any(),
            },
        )
        .unwrap(),
    )
    .await;
    let router_svid = ca.issue(&SvidRequest::new(router())).unwrap();
    let client = client_config(
        &CertSource::fixed(&router_svid, ca.roots().unwrap()).unwrap(),
        ServerCheck::Pin(worker1()),
    )
    .unwrap();
    let tls = round_trip(&client, server.addr).await.unwrap();
    assert_eq!(served_serial(&tls), a.serial);

    // Overwrite both files: new handshakes present the new certificate; the old connection
    // stays up.
    let b = issue();
    write_svid(&b, &files);
    wait_rotation(&mut rx).await;
    let tls_b = round_trip(&client, server.addr).await.unwrap();
    assert_eq!(served_serial(&tls_b), b.serial);
    let mut tls = tls;
    ping(&mut tls).await.unwrap();

    // A certificate without its key yet (a writer between the two files) is not loaded.
    let c = issue();
    std::fs::write(&files.cert, c.cert_pem()).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tls = round_trip(&client, server.addr).await.unwrap();
    assert_eq!(served_serial(&tls), b.serial);
    std::fs::write(&files.key, c.key_pem()).unwrap();
    wait_rotation(&mut rx).await;
    let tls = round_trip(&client, server.addr).await.unwrap();
    assert_eq!(served_serial(&tls), c.serial);
}

#[tokio::test]
async fn file_source_follows_kubernetes_symlink_swaps() {
    // Kubernetes secret volumes: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/, and an
    // update atomically repoints ..data.
    let dir = tempfile::tempdir().unwrap();
    let ca = LocalCa::open_or_create(&dir.path().join("ca"), TD).unwrap();
    let mount = dir.path().join("mount");
    std::fs::create_dir(&mount).unwrap();
    let publish = |generation: u32, svid: &ate_tls::Svid| {
        let data = mount.join(format!("..gen{generation}"));
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("tls.crt"), svid.cert_pem()).unwrap();
        std::fs::write(data.join("tls.key"), svid.key_pem()).unwrap();
        std::fs::write(data.join("ca.crt"), ca.cert_pem()).unwrap();
        let tmp = mount.join("..data_tmp");
        symlink(format!("..gen{generation}"), &tmp).unwrap();
        std::fs::rename(&tmp, mount.join("..data")).unwrap();
    };
    let a = ca.issue(&SvidRequest::new(worker1())).unwrap();
    publish(1, &a);
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        symlink(format!("..data/{f}"), mount.join(f)).unwrap();
    }
    let files = PemFiles {
        cert: mount.join("tls.crt"),
        key: mount.join("tls.key"),
        ca: mount.join("ca.crt"),
    };
    let source = CertSource::from_files(files, Duration::from_millis(100)).unwrap();
    assert_eq!(source.current().serial, a.serial);
    let mut rx = source.subscribe();
    let b = ca.issue(&SvidRequest::new(worker1())).unwrap();
    publish(2, &b);
    wait_rotation(&mut rx).await;
    assert_eq!(source.current().serial, b.serial);
}
