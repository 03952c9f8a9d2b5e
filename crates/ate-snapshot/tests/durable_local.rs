//! DurableStore over a local directory (LocalFileSystem), including corruption and ENOSPC.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use std::time::Duration;

use ate_snapshot::{
    DEFAULT_PARTIAL_GRACE, DurableStore, Error, Manifest, SweepStats, UploadPriority, verify,
};
use common::*;

/// A sealed generation whose big file is a memory image (its durable copy is chunks).
async fn sealed(big: usize) -> (Fixture, Manifest) {
    seal(fixture(big)).await
}

/// A sealed generation whose big file is a plain file: every file of it is one object.
async fn sealed_plain(big: usize) -> (Fixture, Manifest) {
    seal(fixture_with_big_file(big, "core-1.img")).await
}

async fn seal(fx: Fixture) -> (Fixture, Manifest) {
    let m = fx.seal_memory().await.expect("seal");
    (fx, m)
}

fn store_dir(fx: &Fixture) -> PathBuf {
    fx.root.path().join("durable")
}

fn object_file(store_root: &Path, key: &str, rel: &str) -> PathBuf {
    store_root.join(key).join(format!("{rel}.zst"))
}

#[tokio::test]
async fn upload_download_delete_round_trip() {
    let (fx, m) = sealed_plain(3 << 20).await;
    let (store, dir) = store_of(&fx);
    let key = "default/counter/7-5f0e0c4a";
    let uri = store.upload(&fx.gen_dir, key).await.expect("upload");
    assert_eq!(uri, format!("file://{}/{key}", dir.display()));
    assert!(store.exists_complete(&uri).await.expect("exists"));
    let objects = store.list_objects(key).await.expect("list");
    assert_eq!(objects.len(), m.files.len() + 1, "{objects:?}");
    assert!(
        objects
            .iter()
            .all(|o| o.ends_with(".zst") || o.ends_with("/manifest.json"))
    );
    // Compressed: the noise file is incompressible, the rest shrinks.
    let stored: u64 = objects
        .iter()
        .map(|o| fs::metadata(dir.join(o)).expect("stat").len())
        .sum();
    assert!(
        stored < m.total_size() + 4096,
        "stored {stored} raw {}",
        m.total_size()
    );

    // The local generation was only read.
    verify(&fx.gen_dir).await.expect("local intact");

    // Plain absolute path form of the same store, and download by bare key.
    let same = DurableStore::from_url(&dir.display().to_string()).expect("store by path");
    assert_eq!(same.url(), store.url());
    let target = fx.root.path().join("node-b/gen-7");
    let got = download_ok(&same, key, &target).await;
    assert_eq!(got, m);
    assert_eq!(verify(&target).await.expect("verify download"), m);
    assert_same_files(&m, &target, &fx.gen_dir);
    assert_eq!(
        fs::read(target.join("manifest.json")).expect("read"),
        fs::read(fx.gen_dir.join("manifest.json")).expect("read")
    );
    assert!(no_temp_siblings(&target));

    // A non-empty target is refused and kept.
    let err = store
        .download(&uri, &target)
        .await
        .expect_err("target exists");
    assert!(matches!(err, Error::Io { .. }), "{err}");
    verify(&target).await.expect("existing target untouched");

    // Foreign uris are refused.
    let err = store
        .download("s3://other/x", &fx.root.path().join("x"))
        .await
        .expect_err("foreign");
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");

    store.delete(&uri).await.expect("delete");
    assert!(!store.exists_complete(&uri).await.expect("exists"));
    assert!(store.list_objects(key).await.expect("list").is_empty());
    store.delete(&uri).await.expect("delete is idempotent");
    let err = store
        .download(&uri, &fx.root.path().join("gone"))
        .await
        .expect_err("deleted");
    assert!(matches!(err, Error::NotComplete { .. }), "{err}");
    assert!(
        err.to_string().contains("not a complete generation"),
        "{err}"
    );
    assert!(!fx.root.path().join("gone").exists());
}

#[tokio::test]
async fn background_upload_round_trips_and_checks_like_a_normal_one() {
    let (fx, m) = sealed_plain(3 << 20).await;
    let (store, _) = store_of(&fx);
    let key = "default/counter/8-6a1b";
    let uri = store
        .upload_with_priority(&fx.gen_dir, key, UploadPriority::Background)
        .await
        .expect("background upload");
    assert!(store.exists_complete(&uri).await.expect("exists"));
    let target = fx.root.path().join("node-b/gen-8");
    assert_eq!(download_ok(&store, key, &target).await, m);
    assert_same_files(&m, &target, &fx.gen_dir);

    // A file changed after sealing fails the background upload too, and leaves no copy.
    let victim = m.files.iter().max_by_key(|f| f.size).expect("a file");
    let mut bytes = fs::read(fx.gen_dir.join(&victim.path)).expect("read");
    bytes[0] ^= 0x01;
    fs::write(fx.gen_dir.join(&victim.path), bytes).expect("write");
    let key2 = "default/counter/8-6a1b-again";
    let err = store
        .upload_with_priority(&fx.gen_dir, key2, UploadPriority::Background)
        .await
        .expect_err("changed file");
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
    assert!(store.list_objects(key2).await.expect("list").is_empty());
}

#[tokio::test]
async fn corrupted_objects_fail_download_and_leave_nothing() {
    let (fx, m) = sealed_plain(200_000).await;
    let (store, dir) = store_of(&fx);
    let key = "gen-7";
    store.upload(&fx.gen_dir, key).await.expect("upload");

    // 1. A flipped byte in a stored (compressed) object.
    for f in &m.files {
        let obj = object_file(&dir, key, &f.path);
        let saved = fs::read(&obj).expect("read");
        flip_byte(&obj);
        let target = fx.root.path().join("t1/gen");
        let err = store
            .download(key, &target)
            .await
            .expect_err("corrupt object");
        assert!(err.to_string().contains(&f.path), "{}: {err}", f.path);
        assert!(!target.exists(), "target left behind");
        assert!(no_temp_siblings(&target), "temp dir left behind");
        fs::write(&obj, saved).expect("restore");
    }

    // 2. A valid zstd object whose content differs from the manifest (same size).
    let f = &m.files[1];
    let obj = object_file(&dir, key, &f.path);
    let mut other = fs::read(fx.gen_dir.join(&f.path)).expect("read");
    other[0] ^= 1;
    fs::write(&obj, zstd::encode_all(other.as_slice(), 3).expect("zstd")).expect("write");
    let target = fx.root.path().join("t2/gen");
    let err = store
        .download(key, &target)
        .await
        .expect_err("wrong content");
    match &err {
        Error::ChecksumMismatch { file, expected, .. } => {
            assert_eq!(file, &f.path);
            assert_eq!(expected, &f.sha256);
        }
        other => panic!("expected checksum mismatch, got {other}"),
    }
    assert!(!target.exists());
    assert!(no_temp_siblings(&target));

    // 3. A missing object (partial upload): named, nothing left.
    fs::remove_file(&obj).expect("rm");
    let err = store
        .download(key, &target)
        .await
        .expect_err("missing object");
    assert!(
        matches!(&err, Error::MissingFile { file } if file == &f.path),
        "{err}"
    );
    assert!(!target.exists());

    // 4. No manifest: never complete, whatever objects exist.
    fs::remove_file(dir.join(key).join("manifest.json")).expect("rm manifest");
    assert!(!store.exists_complete(key).await.expect("exists"));
    let err = store.download(key, &target).await.expect_err("incomplete");
    assert!(matches!(err, Error::NotComplete { .. }), "{err}");
    store.delete(key).await.expect("delete partial");
    assert!(store.list_objects(key).await.expect("list").is_empty());
}

#[tokio::test]
async fn store_urls() {
    let tmp = tempfile::tempdir().expect("tmp");
    for bad in [
        "ftp://x/y",
        "file://relative/dir",
        "relative/dir",
        "s3://",
        "gopher:/x",
    ] {
        let err = DurableStore::from_url(bad).expect_err(bad);
        assert!(matches!(err, Error::StoreUrl { .. }), "{bad}: {err}");
    }
    let s = DurableStore::from_url(&format!("file://{}/", tmp.path().display())).expect("file");
    assert_eq!(s.url(), format!("file://{}", tmp.path().display()));
    assert!(s.uri("../x").is_err());
    assert!(s.uri("a//b").is_err());
    assert_eq!(
        s.uri("a/b").expect("uri"),
        format!("file://{}/a/b", tmp.path().display())
    );
    // Cloud builders construct from the environment without network access.
    let s3 = DurableStore::from_url_with_options(
        "s3://bucket/some/prefix/",
        [
            ("aws_region", "us-east-1"),
            ("aws_endpoint", "http://127.0.0.1:9"),
        ],
    )
    .expect("s3");
    assert_eq!(s3.uri("k").expect("uri"), "s3://bucket/some/prefix/k");
    let err = DurableStore::from_url_with_options("s3://bucket", [("no_such_option", "x")])
        .expect_err("bad option");
    assert!(err.to_string().contains("no_such_option"), "{err}");
    DurableStore::from_url_with_options(
        "az://container/p",
        [
            ("azure_storage_account_name", "devstoreaccount1"),
            ("azure_storage_use_emulator", "true"),
        ],
    )
    .expect("azure emulator");
}

/// ENOSPC: the object store lives on a 1 MiB tmpfs. The upload fails with a disk-full error,
/// no manifest is written, partial objects are cleaned up, the local generation is intact.
/// Then the other direction: a download onto a full disk fails and leaves nothing.
#[tokio::test]
async fn disk_full_surfaces_and_keeps_local_generation() {
    let (fx, m) = sealed(3 << 20).await;
    let small = fx.root.path().join("small");
    let _mount = TmpfsMount::new(&small, "1m");
    let store =
        DurableStore::from_url(&format!("file://{}/store", small.display())).expect("store");
    let err = store
        .upload(&fx.gen_dir, "gen-7")
        .await
        .expect_err("ENOSPC");
    assert!(err.is_no_space(), "not reported as disk full: {err}");
    assert!(!store.exists_complete("gen-7").await.expect("exists"));
    assert!(store.list_objects("gen-7").await.expect("list").is_empty());
    assert_eq!(verify(&fx.gen_dir).await.expect("local intact"), m);

    let big_store_dir = fx.root.path().join("durable");
    let big = DurableStore::from_url(&big_store_dir.display().to_string()).expect("store");
    big.upload(&fx.gen_dir, "gen-7").await.expect("upload");
    let target = small.join("node-b/gen-7");
    let err = big
        .download("gen-7", &target)
        .await
        .expect_err("ENOSPC download");
    assert!(err.is_no_space(), "not reported as disk full: {err}");
    assert!(!target.exists());
    assert!(no_temp_siblings(&target));
    // Space is back after the failed download cleaned up.
    let left: Vec<_> = fs::read_dir(small.join("node-b")).expect("rd").collect();
    assert!(left.is_empty(), "{left:?}");
    verify(&fx.gen_dir).await.expect("local intact");
}

#[tokio::test]
async fn corrupted_local_generation_is_never_uploaded_as_complete() {
    let (fx, m) = sealed_plain(1 << 20).await;
    let (store, dir) = store_of(&fx);
    // Flip one byte of the largest file, keeping its size (so only its hash can tell).
    let victim = m
        .files
        .iter()
        .max_by_key(|f| f.size)
        .expect("a file")
        .path
        .clone();
    let path = fx.gen_dir.join(&victim);
    let mut bytes = fs::read(&path).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    fs::write(&path, bytes).expect("write");

    let key = "default/counter/8-corrupt";
    let err = store.upload(&fx.gen_dir, key).await.expect_err("refused");
    assert!(
        matches!(err, Error::ChecksumMismatch { ref file, .. } | Error::ChunkMismatch { ref file, .. } if *file == victim),
        "{err}"
    );
    let uri = format!("file://{}/{key}", dir.display());
    assert!(!store.exists_complete(&uri).await.expect("exists"));
    assert!(
        store.list_objects(key).await.expect("list").is_empty(),
        "partial objects removed"
    );
}

/// The node's key layout: `<atespace>/<name>/<generation>-<uuid>`.
const DEPTH: usize = 3;

#[tokio::test]
async fn sweep_removes_old_partial_uploads_and_nothing_else() {
    let (fx, m) = sealed_plain(1 << 20).await;
    let (store, dir) = store_of(&fx);
    assert_eq!(store.partial_grace(), DEFAULT_PARTIAL_GRACE);
    let two_hours = Duration::from_secs(2 * 3600);

    // A complete generation, all of it (manifest included) far older than the grace age.
    let complete = "default/counter/7-complete";
    store.upload(&fx.gen_dir, complete).await.expect("upload");
    age_tree(&dir.join(complete), two_hours);

    // What a node killed mid-upload leaves: compressed files, no manifest, two hours old. A file
    // an upload never writes (no .zst) stays, even there.
    let partial = dir.join("default/counter/8-partial");
    write_aged(&partial.join("criu/pages-1.img.zst"), &[1; 1000], two_hours);
    write_aged(&partial.join("volumes/data.tar.zst"), &[2; 500], two_hours);
    write_aged(&partial.join("notes.txt"), b"not ours", two_hours);
    // A partial upload still in flight: young.
    let young = dir.join("default/counter/9-young");
    write_aged(&young.join("rootfs.tar.zst"), &[3; 10], Duration::ZERO);
    // Old files, but one written just now: the upload may still be going.
    let mixed = dir.join("default/counter/10-mixed");
    write_aged(&mixed.join("criu/inventory.img.zst"), &[4; 10], two_hours);
    write_aged(&mixed.join("rootfs.tar.zst"), &[5; 10], Duration::ZERO);
    // Nearer the root than a key: not a generation's object, never looked at.
    let stray = dir.join("default/stray.zst");
    write_aged(&stray, b"stray", two_hours);

    let stats = store.sweep_partial_uploads(DEPTH).await.expect("sweep");
    assert_eq!(
        stats,
        SweepStats {
            keys_seen: 4,
            keys_deleted: 1,
            objects_deleted: 2,
            bytes_deleted: 1500,
            keys_young: 2,
            keys_failed: 0,
        }
    );
    assert!(!partial.join("criu").exists());
    assert!(!partial.join("volumes/data.tar.zst").exists());
    assert!(partial.join("notes.txt").exists());
    assert!(young.join("rootfs.tar.zst").exists());
    assert!(mixed.join("criu/inventory.img.zst").exists());
    assert!(stray.exists());
    // The complete generation is intact and still downloads.
    assert!(store.exists_complete(complete).await.expect("exists"));
    assert_eq!(
        store.list_objects(complete).await.expect("list").len(),
        m.files.len() + 1
    );
    let target = fx.root.path().join("node-b/gen-7");
    assert_eq!(download_ok(&store, complete, &target).await, m);

    // Idempotent: a second sweep (another node's, say) finds nothing more to delete.
    assert_nothing_left_to_sweep(&store, DEPTH).await;

    // With a grace age of zero sweeping is refused (it would take uploads in flight).
    let no_grace = store.clone().with_partial_grace(Duration::ZERO);
    let err = no_grace
        .sweep_partial_uploads(DEPTH)
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert!(young.join("rootfs.tar.zst").exists());
}

#[tokio::test]
async fn upload_past_half_the_grace_age_writes_no_manifest() {
    let (fx, m) = sealed_plain(3 << 20).await;
    let dir = store_dir(&fx);
    // Half of 2 ns is over before the first file is read: the upload runs out of time.
    let store = DurableStore::from_url(&format!("file://{}", dir.display()))
        .expect("store")
        .with_partial_grace(Duration::from_nanos(2));
    let key = "default/counter/7-slow";
    let err = store.upload(&fx.gen_dir, key).await.expect_err("too slow");
    assert!(matches!(err, Error::UploadTooSlow { .. }), "{err}");
    assert!(
        err.to_string().contains("manifest.json not written"),
        "{err}"
    );
    assert!(!store.exists_complete(key).await.expect("exists"));
    assert!(
        store.list_objects(key).await.expect("list").is_empty(),
        "what it wrote is removed"
    );
    // No multipart staging file left behind either.
    assert!(!dir.exists() || staging_files(&dir).is_empty());
    verify(&fx.gen_dir).await.expect("local intact");

    // Without a limit (grace age 0) the same upload completes.
    let unlimited = store.with_partial_grace(Duration::ZERO);
    unlimited.upload(&fx.gen_dir, key).await.expect("upload");
    assert!(unlimited.exists_complete(key).await.expect("exists"));
    assert_eq!(
        unlimited.list_objects(key).await.expect("list").len(),
        m.files.len() + 1
    );
}

/// The local store stages multipart uploads as `<object>#<n>` files.
fn staging_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(staging_files(&p));
        } else if p.to_string_lossy().contains('#') {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn failed_multipart_upload_is_aborted() {
    // 12 MiB of noise: more than one part, so core-1.img goes up as a multipart upload.
    let (fx, m) = sealed_plain(12 << 20).await;
    let (store, dir) = store_of(&fx);
    // Same size, other bytes: found only once the whole file is hashed, after its parts went up.
    let path = fx.gen_dir.join("criu/core-1.img");
    let mut bytes = fs::read(&path).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    fs::write(&path, bytes).expect("write");
    let key = "default/counter/7-multipart";
    let err = store.upload(&fx.gen_dir, key).await.expect_err("changed");
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
    assert!(store.list_objects(key).await.expect("list").is_empty());
    assert!(staging_files(&dir).is_empty(), "{:?}", staging_files(&dir));
    assert!(m.files.iter().any(|f| f.path == "criu/core-1.img"));
}
