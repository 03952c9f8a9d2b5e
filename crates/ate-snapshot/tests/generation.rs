//! seal / verify / extract on a node-local generation directory.

mod common;

use std::fs;

use ate_core::Fidelity;
use ate_snapshot::{Error, Manifest, extract_rootfs, extract_volume, seal_generation, verify};
use common::*;

#[tokio::test]
async fn seal_verify_extract_round_trip() {
    let fx = fixture(300_000);
    let before_upper = snapshot_tree(&fx.upper);
    let before_data = snapshot_tree(&fx.volumes[0].1);
    let before_logs = snapshot_tree(&fx.volumes[1].1);

    let m = seal_generation(
        &fx.gen_dir,
        meta(Fidelity::Memory),
        Some(&fx.upper),
        &fx.volumes,
    )
    .await
    .expect("seal");
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "criu/inventory.img",
            "criu/pages-1.img",
            "criu/sub/extra.img",
            "rootfs.tar",
            "volumes/data.tar",
            "volumes/logs.tar"
        ]
    );
    assert_eq!(m.fidelity, Fidelity::Memory);
    assert_eq!(m.generation, 7);
    assert_eq!(m.volumes(), ["data", "logs"]);
    assert!(m.has_rootfs());
    let on_disk = Manifest::from_json(&fs::read(fx.gen_dir.join("manifest.json")).expect("read"))
        .expect("parse");
    assert_eq!(on_disk, m);
    assert!(!fx.gen_dir.join("manifest.json.tmp").exists());
    assert_eq!(verify(&fx.gen_dir).await.expect("verify"), m);

    // Sealing twice is refused: a sealed generation is immutable.
    let again = seal_generation(
        &fx.gen_dir,
        meta(Fidelity::Memory),
        Some(&fx.upper),
        &fx.volumes,
    )
    .await
    .expect_err("second seal");
    assert!(matches!(again, Error::AlreadySealed { .. }), "{again}");

    // Extract over an existing upper dir with stale contents: they are replaced.
    let target = fx.root.path().join("restore/upper");
    fs::create_dir_all(target.join("stale")).expect("mkdir");
    fs::write(target.join("stale/file"), b"old").expect("write");
    extract_rootfs(&fx.gen_dir, &target)
        .await
        .expect("extract rootfs");
    let after = snapshot_tree(&target);
    assert_eq!(after, before_upper);
    assert!(
        after["etc/deleted"].starts_with("chr 0 mode=0"),
        "{after:?}"
    );
    assert!(
        after["opaque"].contains("trusted.overlay.opaque=y"),
        "{after:?}"
    );
    assert!(after["etc/link"].starts_with("link->app.conf"), "{after:?}");
    assert!(
        after["etc/app.conf"].contains("mode=640 uid=1000 gid=1000"),
        "{after:?}"
    );
    assert!(after["empty"].starts_with("dir mode=700"), "{after:?}");
    assert!(after.contains_key("fifo"));
    assert!(no_temp_siblings(&target));
    assert_eq!(
        fs::metadata(&target).expect("stat").permissions().mode() & 0o7777,
        0o755
    );

    let vdata = fx.root.path().join("restore/data");
    extract_volume(&fx.gen_dir, "data", &vdata)
        .await
        .expect("extract data");
    assert_eq!(snapshot_tree(&vdata), before_data);
    let vlogs = fx.root.path().join("restore/logs");
    extract_volume(&fx.gen_dir, "logs", &vlogs)
        .await
        .expect("extract logs");
    assert_eq!(snapshot_tree(&vlogs), before_logs);

    let missing = extract_volume(&fx.gen_dir, "nope", &vlogs)
        .await
        .expect_err("no volume");
    assert!(matches!(missing, Error::MissingFile { .. }), "{missing}");
    assert!(extract_volume(&fx.gen_dir, "../x", &vlogs).await.is_err());
    // The failed extract left the previous contents alone.
    assert_eq!(snapshot_tree(&vlogs), before_logs);
}

use std::os::unix::fs::PermissionsExt;

#[tokio::test]
async fn flipped_byte_in_any_file_is_named() {
    let fx = fixture(50_000);
    let m = seal_generation(
        &fx.gen_dir,
        meta(Fidelity::Memory),
        Some(&fx.upper),
        &fx.volumes,
    )
    .await
    .expect("seal");
    for f in &m.files {
        let p = fx.gen_dir.join(&f.path);
        flip_byte(&p);
        let err = verify(&fx.gen_dir).await.expect_err("corrupt");
        match &err {
            Error::ChecksumMismatch {
                file,
                expected,
                actual,
            } => {
                assert_eq!(file, &f.path);
                assert_eq!(expected, &f.sha256);
                assert_ne!(actual, expected);
            }
            other => panic!("{}: expected checksum mismatch, got {other}", f.path),
        }
        assert!(err.to_string().contains(&f.path), "{err}");
        flip_byte(&p); // flip back
    }
    verify(&fx.gen_dir).await.expect("restored");

    // Truncated and missing files are named too; extra files are ignored.
    fs::write(fx.gen_dir.join("criu/unlisted.log"), b"x").expect("write");
    let rootfs = fx.gen_dir.join("rootfs.tar");
    let saved = fs::read(&rootfs).expect("read");
    fs::write(&rootfs, &saved[..100]).expect("truncate");
    let err = verify(&fx.gen_dir).await.expect_err("truncated");
    assert!(
        matches!(&err, Error::SizeMismatch { file, .. } if file == "rootfs.tar"),
        "{err}"
    );
    fs::remove_file(&rootfs).expect("rm");
    let err = verify(&fx.gen_dir).await.expect_err("missing");
    assert!(
        matches!(&err, Error::MissingFile { file } if file == "rootfs.tar"),
        "{err}"
    );
    fs::write(&rootfs, saved).expect("restore");
    verify(&fx.gen_dir).await.expect("restored again");

    // No manifest: incomplete by definition.
    fs::remove_file(fx.gen_dir.join("manifest.json")).expect("rm manifest");
    let err = verify(&fx.gen_dir).await.expect_err("incomplete");
    assert!(matches!(err, Error::Incomplete { .. }), "{err}");
    assert!(err.to_string().contains("incomplete"), "{err}");
    assert!(!ate_snapshot::is_sealed(&fx.gen_dir));
}

#[tokio::test]
async fn lower_fidelities_and_bad_inputs() {
    let fx = fixture(1000);
    // ROOTFS: a criu/ dir left by a failed dump is not part of the generation.
    let mut m = meta(Fidelity::Rootfs);
    m.reason = "CRIU dump failed: fell back to ROOTFS".into();
    let rootfs_gen = fx.root.path().join("gen-rootfs");
    fs::create_dir_all(rootfs_gen.join("criu")).expect("mkdir");
    fs::write(rootfs_gen.join("criu/dump.log"), b"error").expect("write");
    let sealed = seal_generation(&rootfs_gen, m, Some(&fx.upper), &fx.volumes[..1])
        .await
        .expect("seal rootfs");
    let paths: Vec<&str> = sealed.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["rootfs.tar", "volumes/data.tar"]);
    assert!(sealed.reason.contains("fell back"));

    let vol_gen = fx.root.path().join("gen-volumes");
    let sealed = seal_generation(&vol_gen, meta(Fidelity::Volumes), None, &fx.volumes)
        .await
        .expect("seal volumes");
    assert!(!sealed.has_rootfs());
    assert!(!vol_gen.join("criu").exists());
    verify(&vol_gen).await.expect("verify volumes");

    let err = seal_generation(
        &fx.root.path().join("g1"),
        meta(Fidelity::Rootfs),
        None,
        &[],
    )
    .await
    .expect_err("rootfs without upper");
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let err = seal_generation(
        &fx.root.path().join("g2"),
        meta(Fidelity::Memory),
        Some(&fx.upper),
        &[],
    )
    .await
    .expect_err("memory without criu images");
    assert!(err.to_string().contains("CRIU"), "{err}");
    let bad = vec![("../etc".to_string(), fx.upper.clone())];
    let err = seal_generation(
        &fx.root.path().join("g3"),
        meta(Fidelity::Volumes),
        None,
        &bad,
    )
    .await
    .expect_err("bad volume name");
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
}

/// A hand-made archive with `..` entries is refused and leaves the target untouched.
#[tokio::test]
async fn extract_refuses_traversal() {
    let fx = fixture(10);
    let gen_dir = fx.root.path().join("evil");
    fs::create_dir_all(&gen_dir).expect("mkdir");
    let mut raw = Vec::new();
    {
        let mut h = tar::Header::new_gnu();
        let data = b"pwned";
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // Bypass the builder's own `..` check by writing the name bytes directly.
        let name = b"../escaped";
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        raw.extend_from_slice(h.as_bytes());
        raw.extend_from_slice(data);
        raw.resize(raw.len().div_ceil(512) * 512 + 1024, 0);
    }
    fs::write(gen_dir.join("rootfs.tar"), raw).expect("write");
    let target = fx.root.path().join("t/upper");
    fs::create_dir_all(&target).expect("mkdir");
    fs::write(target.join("keep"), b"k").expect("write");
    let err = extract_rootfs(&gen_dir, &target)
        .await
        .expect_err("traversal");
    assert!(matches!(err, Error::Archive { .. }), "{err}");
    assert!(!fx.root.path().join("t/escaped").exists());
    assert_eq!(fs::read(target.join("keep")).expect("kept"), b"k");
    assert!(no_temp_siblings(&target));
}

#[tokio::test]
async fn corruption_is_classified_and_quarantined_idempotently() {
    let fx = fixture(20_000);
    let m = seal_generation(
        &fx.gen_dir,
        meta(Fidelity::Memory),
        Some(&fx.upper),
        &fx.volumes,
    )
    .await
    .expect("seal");
    let victim = &m.files[m.files.len() / 2].path;
    flip_byte(&fx.gen_dir.join(victim));
    let err = verify(&fx.gen_dir).await.expect_err("corrupt");
    assert!(err.is_corrupt(), "{err}");
    assert_eq!(err.corrupt_file(), Some(victim.as_str()));
    // Not damage: a generation that was never sealed, an I/O error.
    let never_sealed = Error::Incomplete {
        dir: fx.gen_dir.clone(),
    };
    assert!(!never_sealed.is_corrupt());
    assert_eq!(never_sealed.corrupt_file(), None);
    let io = Error::Io {
        op: "read",
        path: fx.gen_dir.clone(),
        source: std::io::Error::other("EIO"),
    };
    assert!(!io.is_corrupt());
    let bad_manifest = Error::InvalidManifest("not json".into());
    assert!(bad_manifest.is_corrupt());
    assert_eq!(bad_manifest.corrupt_file(), Some("manifest.json"));

    // Moved aside beside it, hidden, files kept for inspection; the path is no generation now.
    let aside = ate_snapshot::quarantine(&fx.gen_dir)
        .await
        .expect("quarantine")
        .expect("moved");
    assert_eq!(
        aside,
        ate_snapshot::quarantine_path(&fx.gen_dir).expect("path")
    );
    assert_eq!(aside.parent(), fx.gen_dir.parent());
    assert!(
        aside
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.')),
        "{}",
        aside.display()
    );
    assert!(!fx.gen_dir.exists());
    assert!(!ate_snapshot::is_sealed(&fx.gen_dir));
    assert!(aside.join(victim).is_file());
    // Again: nothing to move.
    assert_eq!(
        ate_snapshot::quarantine(&fx.gen_dir).await.expect("again"),
        None
    );
    // The same directory written and quarantined once more replaces the older copy.
    fs::create_dir_all(&fx.gen_dir).expect("mkdir");
    fs::write(fx.gen_dir.join("marker"), b"second").expect("write");
    let again = ate_snapshot::quarantine(&fx.gen_dir)
        .await
        .expect("quarantine again")
        .expect("moved again");
    assert_eq!(again, aside);
    assert_eq!(fs::read(aside.join("marker")).expect("read"), b"second");
    assert!(!aside.join(victim).exists());
}
