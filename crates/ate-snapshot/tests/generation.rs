//! seal / verify / extract on a node-local generation directory.

mod common;

use std::fs;

use ate_core::Fidelity;
use ate_snapshot::{
    CHUNK_BYTES, Error, FORMAT_VERSION, Manifest, extract_rootfs, extract_volume,
    read_verified_chunk, read_verified_chunk_at, seal_generation, verify, verify_chunks,
    verify_files, verify_files_except_chunked,
};
use common::*;

#[tokio::test]
async fn seal_verify_extract_round_trip() {
    let fx = fixture(300_000);
    let before_upper = snapshot_tree(&fx.upper);
    let before_data = snapshot_tree(&fx.volumes[0].1);
    let before_logs = snapshot_tree(&fx.volumes[1].1);

    let m = fx.seal_memory().await.expect("seal");
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
    let again = fx.seal_memory().await.expect_err("second seal");
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
    let m = fx.seal_memory().await.expect("seal");
    for f in &m.files {
        let p = fx.gen_dir.join(&f.path);
        flip_byte(&p);
        let err = verify(&fx.gen_dir).await.expect_err("corrupt");
        match &err {
            Error::ChecksumMismatch {
                file,
                expected,
                actual,
            } if !f.has_chunk_digests() => {
                assert_eq!(file, &f.path);
                assert_eq!(expected, &f.sha256);
                assert_ne!(actual, expected);
            }
            // A memory image names the damaged chunk instead.
            Error::ChunkMismatch {
                file,
                chunk: 0,
                expected,
                actual,
                ..
            } if f.has_chunk_digests() => {
                assert_eq!(file, &f.path);
                assert_eq!(expected, &f.blake3_chunks[0]);
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
    let m = fx.seal_memory().await.expect("seal");
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

/// Memory images get a BLAKE3 digest per 2 MiB chunk, checked chunk by chunk on a lazy restore.
#[tokio::test]
async fn memory_images_get_chunk_digests() {
    const IMAGE: usize = 5 * 1024 * 1024 + 123;
    let fx = fixture(IMAGE);
    let m = fx.seal_memory().await.expect("seal");
    assert_eq!(m.format_version, FORMAT_VERSION);
    assert_eq!(FORMAT_VERSION, 3);
    let pages = m.file("criu/pages-1.img").expect("pages listed").clone();
    assert_eq!(pages.size, IMAGE as u64);
    // Pinned by its chunk digests alone (format 3); every other file keeps its sha256.
    assert_eq!(pages.sha256, "");
    assert!(
        m.files
            .iter()
            .filter(|f| !f.has_chunk_digests())
            .all(|f| f.sha256.len() == 64),
        "{m:?}"
    );
    assert_eq!(pages.chunk_count(), 3);
    assert_eq!(pages.blake3_chunks.len(), 3);
    let image = fs::read(fx.gen_dir.join("criu/pages-1.img")).expect("read");
    let chunk_len = CHUNK_BYTES as usize;
    for (i, part) in image.chunks(chunk_len).enumerate() {
        assert_eq!(
            pages.blake3_chunks[i],
            blake3::hash(part).to_hex().as_str(),
            "chunk {i}"
        );
    }
    assert_eq!(
        pages.chunk_range(2),
        Some((2 * CHUNK_BYTES, IMAGE as u64)),
        "last chunk is short"
    );
    // Every other file is sha256 only, the nested image too.
    for f in &m.files {
        if f.path != "criu/pages-1.img" {
            assert!(f.blake3_chunks.is_empty(), "{}", f.path);
        }
    }
    let text =
        String::from_utf8(fs::read(fx.gen_dir.join("manifest.json")).expect("read")).expect("utf8");
    assert_eq!(text.matches("blake3_chunks").count(), 1, "{text}");
    verify(&fx.gen_dir).await.expect("verify");

    // Each chunk reads back verified, by path and by open file, into a reused buffer.
    let path = fx.gen_dir.join("criu/pages-1.img");
    let mut buf = Vec::new();
    for i in 0..3u64 {
        read_verified_chunk(&path, &pages, i, &mut buf).expect("chunk");
        let (start, end) = pages.chunk_range(i).expect("range");
        assert_eq!(buf, image[start as usize..end as usize], "chunk {i}");
    }
    let open = fs::File::open(&path).expect("open");
    read_verified_chunk_at(&open, &pages, 2, &mut buf).expect("chunk at");
    assert_eq!(buf.len(), IMAGE - 2 * chunk_len);
    read_verified_chunk_at(&open, &pages, 0, &mut buf).expect("chunk at");
    assert_eq!(buf.len(), chunk_len);
    let all: Vec<(String, u64)> = (0..3).map(|i| (pages.path.clone(), i)).collect();
    verify_chunks(&fx.gen_dir, &m, &all).expect("verify chunks");

    // Bad arguments: past the end, a file without chunk digests, a path not listed.
    let err = read_verified_chunk(&path, &pages, 3, &mut buf).expect_err("past the end");
    assert!(
        matches!(&err, Error::InvalidInput(t) if t.contains("criu/pages-1.img")),
        "{err}"
    );
    assert!(!err.is_corrupt());
    let inventory = m.file("criu/inventory.img").expect("inventory");
    let err = read_verified_chunk(
        &fx.gen_dir.join("criu/inventory.img"),
        inventory,
        0,
        &mut buf,
    )
    .expect_err("no digests");
    assert!(
        matches!(&err, Error::InvalidInput(t) if t.contains("criu/inventory.img")),
        "{err}"
    );
    let err =
        verify_chunks(&fx.gen_dir, &m, &[("criu/nope.img".into(), 0)]).expect_err("not listed");
    assert!(
        matches!(&err, Error::InvalidInput(t) if t.contains("criu/nope.img")),
        "{err}"
    );

    // One flipped byte in chunk 1: that chunk, and only it, fails, naming its byte range.
    let at = 3 * 1024 * 1024 + 7;
    let mut damaged = image.clone();
    damaged[at] ^= 0x5a;
    fs::write(&path, &damaged).expect("write");
    read_verified_chunk(&path, &pages, 0, &mut buf).expect("chunk 0 intact");
    read_verified_chunk(&path, &pages, 2, &mut buf).expect("chunk 2 intact");
    let err = read_verified_chunk(&path, &pages, 1, &mut buf).expect_err("chunk 1 damaged");
    match &err {
        Error::ChunkMismatch {
            file,
            chunk,
            start,
            end,
            expected,
            actual,
        } => {
            assert_eq!(file, "criu/pages-1.img");
            assert_eq!(*chunk, 1);
            assert_eq!((*start, *end), (CHUNK_BYTES, 2 * CHUNK_BYTES));
            assert_eq!(expected, &pages.blake3_chunks[1]);
            assert_eq!(
                actual,
                blake3::hash(&damaged[chunk_len..2 * chunk_len])
                    .to_hex()
                    .as_str()
            );
        }
        other => panic!("expected a chunk mismatch, got {other}"),
    }
    assert!(err.is_corrupt());
    assert_eq!(err.corrupt_file(), Some("criu/pages-1.img"));
    let text = err.to_string();
    assert!(
        text.contains("memory image criu/pages-1.img chunk 1 (bytes 2097152..4194304) is damaged"),
        "{text}"
    );
    let err = read_verified_chunk_at(&open, &pages, 1, &mut buf).expect_err("open file too");
    assert!(
        matches!(err, Error::ChunkMismatch { chunk: 1, .. }),
        "{err}"
    );
    let err = verify_chunks(&fx.gen_dir, &m, &all).expect_err("verify chunks");
    assert!(
        matches!(err, Error::ChunkMismatch { chunk: 1, .. }),
        "{err}"
    );
    verify_chunks(
        &fx.gen_dir,
        &m,
        &[(pages.path.clone(), 2), (pages.path.clone(), 0)],
    )
    .expect("the intact chunks");

    // A lazy restore's up-front check passes (the chunk is caught when read); the full one fails.
    verify_files_except_chunked(&fx.gen_dir, &m)
        .await
        .expect("except chunked");
    let err = verify_files(&fx.gen_dir, &m).await.expect_err("full");
    assert!(
        matches!(&err, Error::ChunkMismatch { file, chunk: 1, .. } if file == "criu/pages-1.img"),
        "{err}"
    );
    assert!(err.is_corrupt());
    let err = verify(&fx.gen_dir).await.expect_err("verify");
    assert!(
        matches!(err, Error::ChunkMismatch { chunk: 1, .. }),
        "{err}"
    );

    // The up-front check still hashes every other file, and sizes the chunked ones.
    flip_byte(&fx.gen_dir.join("criu/inventory.img"));
    let err = verify_files_except_chunked(&fx.gen_dir, &m)
        .await
        .expect_err("inventory damaged");
    assert!(
        matches!(&err, Error::ChecksumMismatch { file, .. } if file == "criu/inventory.img"),
        "{err}"
    );
    flip_byte(&fx.gen_dir.join("criu/inventory.img"));
    fs::write(&path, &image[..IMAGE - 1]).expect("truncate");
    let err = verify_files_except_chunked(&fx.gen_dir, &m)
        .await
        .expect_err("truncated");
    assert!(
        matches!(&err, Error::SizeMismatch { file, .. } if file == "criu/pages-1.img"),
        "{err}"
    );
    // Read lazily, the truncated last chunk is a size mismatch, the others still verify.
    let err = read_verified_chunk(&path, &pages, 2, &mut buf).expect_err("short");
    assert!(
        matches!(&err, Error::SizeMismatch { expected, actual, .. } if *expected == IMAGE as u64 && *actual == IMAGE as u64 - 1),
        "{err}"
    );
    read_verified_chunk(&path, &pages, 1, &mut buf).expect("chunk 1 restored by the rewrite");
    fs::remove_file(&path).expect("rm");
    let err = read_verified_chunk(&path, &pages, 0, &mut buf).expect_err("missing");
    assert!(
        matches!(&err, Error::MissingFile { file } if file == "criu/pages-1.img"),
        "{err}"
    );
    let err = verify_files_except_chunked(&fx.gen_dir, &m)
        .await
        .expect_err("missing");
    assert!(matches!(err, Error::MissingFile { .. }), "{err}");
    fs::write(&path, &image).expect("restore");
    verify(&fx.gen_dir).await.expect("intact again");
}

/// A manifest whose chunk digests disagree with an intact file (the whole-file sha256 matches)
/// still fails full verification: the chunk digests are checked too.
#[tokio::test]
async fn full_verification_checks_chunk_digests_too() {
    let fx = fixture(CHUNK_BYTES as usize + 10);
    let mut m = fx.seal_memory().await.expect("seal");
    verify_files(&fx.gen_dir, &m).await.expect("intact");
    let idx = m
        .files
        .iter()
        .position(|f| f.path == "criu/pages-1.img")
        .expect("pages");
    assert_eq!(m.files[idx].blake3_chunks.len(), 2);
    m.files[idx].blake3_chunks[1] = "0".repeat(64);
    let err = verify_files(&fx.gen_dir, &m).await.expect_err("bad digest");
    assert!(
        matches!(&err, Error::ChunkMismatch { chunk: 1, start, end, .. } if *start == CHUNK_BYTES && *end == CHUNK_BYTES + 10),
        "{err}"
    );
    // Written to disk, the whole generation fails `verify` the same way.
    fs::write(fx.gen_dir.join("manifest.json"), m.to_json()).expect("write");
    let err = verify(&fx.gen_dir).await.expect_err("verify");
    assert!(
        matches!(err, Error::ChunkMismatch { chunk: 1, .. }),
        "{err}"
    );
    verify_files_except_chunked(&fx.gen_dir, &m)
        .await
        .expect("not hashed up front");
}

/// An empty memory image has no chunks; a generation of only small images still gets digests.
#[tokio::test]
async fn empty_memory_image_has_no_chunks() {
    let fx = fixture(0);
    let m = fx.seal_memory().await.expect("seal");
    let pages = m.file("criu/pages-1.img").expect("pages");
    assert_eq!(pages.size, 0);
    assert!(pages.blake3_chunks.is_empty());
    assert_eq!(pages.chunk_count(), 0);
    let mut buf = vec![1, 2, 3];
    let err = read_verified_chunk(&fx.gen_dir.join(&pages.path), pages, 0, &mut buf)
        .expect_err("no chunks");
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    verify(&fx.gen_dir).await.expect("verify");
}

/// A plaintext incremental generation made whole: new memory images copied in and hashed, the
/// archives the same files, no parent; a manifest naming a parent that is not a sibling name
/// is refused.
#[tokio::test]
async fn replacing_the_memory_of_a_plaintext_generation_drops_its_parent() {
    let fx = fixture(300_000);
    let mut m = meta(Fidelity::Memory);
    m.parent = Some(ate_snapshot::ParentGeneration {
        dir: "6-aaaa".into(),
        generation: 6,
        uuid: "u".into(),
    });
    let sealed = seal_generation(&fx.gen_dir, m, Some(&fx.upper), &fx.volumes)
        .await
        .expect("seal");
    assert!(sealed.parent.is_some());
    let rootfs = sealed.file("rootfs.tar").cloned();

    let flat = tempfile::tempdir().expect("tempdir");
    fs::create_dir_all(flat.path().join("criu")).expect("mkdir");
    let pages = noise(3 * 1024 * 1024, 5);
    fs::write(flat.path().join("criu/pages-1.img"), &pages).expect("write");
    let whole = ate_snapshot::replace_memory(&fx.gen_dir, flat.path())
        .await
        .expect("replace");
    assert_eq!(whole.parent, None);
    assert_eq!(whole.file("rootfs.tar").cloned(), rootfs);
    let paths: Vec<&str> = whole.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "criu/pages-1.img",
            "rootfs.tar",
            "volumes/data.tar",
            "volumes/logs.tar"
        ]
    );
    assert_eq!(verify(&fx.gen_dir).await.expect("verify"), whole);
    assert_eq!(
        fs::read(fx.gen_dir.join("criu/pages-1.img")).expect("read"),
        pages
    );

    let mut bad = whole.clone();
    bad.parent = Some(ate_snapshot::ParentGeneration {
        dir: "../elsewhere".into(),
        generation: 1,
        uuid: "u".into(),
    });
    let refused = Manifest::from_json(&bad.to_json()).expect_err("a parent outside the actor dir");
    assert!(refused.to_string().contains("sibling"), "{refused}");
}
