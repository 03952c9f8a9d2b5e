//! DurableStore against S3 (moto_server on loopback). Needs `ATE_TEST_S3_ENDPOINT`
//! (scripts/test-services.sh exports it); without it the test fails rather than skipping.

mod common;

use std::fs;
use std::time::Duration;

use ate_snapshot::{DurableStore, Error, SweepStats, verify};
use ate_test_support::wait::poll_until;
use common::*;
use object_store::ObjectStoreExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn endpoint() -> String {
    ate_test_support::services::s3_endpoint()
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn options(ep: &str) -> Vec<(&'static str, String)> {
    vec![
        ("aws_endpoint", ep.to_string()),
        ("aws_allow_http", "true".to_string()),
        ("aws_access_key_id", env_or("AWS_ACCESS_KEY_ID", "testing")),
        (
            "aws_secret_access_key",
            env_or("AWS_SECRET_ACCESS_KEY", "testing"),
        ),
        ("aws_region", env_or("AWS_DEFAULT_REGION", "us-east-1")),
    ]
}

/// object_store cannot create buckets; moto accepts an unsigned `PUT /<bucket>`.
async fn create_bucket(ep: &str, bucket: &str) {
    let resp = raw_request(ep, "PUT", &format!("/{bucket}")).await;
    assert!(
        resp.starts_with("HTTP/1.1 200"),
        "create bucket {bucket}: {resp}"
    );
}

/// Sends one unsigned request to moto and returns the whole response.
async fn raw_request(ep: &str, method: &str, path: &str) -> String {
    let hostport = ep
        .strip_prefix("http://")
        .expect("ATE_TEST_S3_ENDPOINT must be http://host:port")
        .trim_end_matches('/');
    let mut s = tokio::net::TcpStream::connect(hostport)
        .await
        .unwrap_or_else(|e| panic!("connect to moto at {hostport}: {e}"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.expect("read");
    resp
}

/// Multipart uploads of `bucket` neither completed nor aborted (object_store cannot list them).
async fn incomplete_uploads(ep: &str, bucket: &str) -> usize {
    let resp = raw_request(ep, "GET", &format!("/{bucket}?uploads")).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "list uploads: {resp}");
    resp.matches("<Upload>").count()
}

fn raw_store(ep: &str, bucket: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(ep)
        .with_allow_http(true)
        .with_access_key_id(env_or("AWS_ACCESS_KEY_ID", "testing"))
        .with_secret_access_key(env_or("AWS_SECRET_ACCESS_KEY", "testing"))
        .with_region(env_or("AWS_DEFAULT_REGION", "us-east-1"))
        .build()
        .expect("raw s3")
}

async fn s3_store(ep: &str) -> (String, DurableStore) {
    let bucket = format!("ate-snap-{}", uuid::Uuid::new_v4().simple());
    create_bucket(ep, &bucket).await;
    let store =
        DurableStore::from_url_with_options(&format!("s3://{bucket}/snapshots"), options(ep))
            .expect("s3 store");
    (bucket, store)
}

/// The node's key layout: `<atespace>/<name>/<generation>-<uuid>`.
const DEPTH: usize = 3;

#[tokio::test]
async fn s3_sweep_removes_old_partial_uploads_only() {
    let ep = endpoint();
    let (bucket, store) = s3_store(&ep).await;
    let fx = fixture(100_000);
    let m = fx.seal_memory().await.expect("seal");
    let complete = "default/counter/7-complete";
    store.upload(&fx.gen_dir, complete).await.expect("upload");

    // What uploads cut off by a dead node leave: compressed files without a manifest.
    let raw = raw_store(&ep, &bucket);
    let put = |key: &str, len: usize| {
        let obj = object_store::path::Path::from(format!("snapshots/{key}"));
        let raw = &raw;
        async move {
            raw.put(&obj, vec![7u8; len].into())
                .await
                .expect("put partial object");
        }
    };
    put("default/counter/8-partial/criu/pages-1.img.zst", 1000).await;
    put("default/counter/8-partial/rootfs.tar.zst", 500).await;
    put("default/other/3-partial/volumes/data.tar.zst", 250).await;

    // With the default grace age (1 h) they are young: an upload might still be writing them.
    let stats = store.sweep_partial_uploads(DEPTH).await.expect("sweep");
    assert_eq!(
        stats,
        SweepStats {
            keys_seen: 3,
            keys_young: 2,
            ..SweepStats::default()
        }
    );
    assert_eq!(
        store
            .list_objects("default/counter/8-partial")
            .await
            .expect("list")
            .len(),
        2
    );

    // A grace age of 1 s, and a little more than that waited: they are garbage now. The
    // complete generation, just as old, stays.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let short = store.clone().with_partial_grace(Duration::from_secs(1));
    let stats = short.sweep_partial_uploads(DEPTH).await.expect("sweep");
    assert_eq!(
        stats,
        SweepStats {
            keys_seen: 3,
            keys_deleted: 2,
            objects_deleted: 3,
            bytes_deleted: 1750,
            ..SweepStats::default()
        }
    );
    for key in ["default/counter/8-partial", "default/other/3-partial"] {
        assert!(
            store.list_objects(key).await.expect("list").is_empty(),
            "{key}"
        );
    }
    assert!(store.exists_complete(complete).await.expect("exists"));
    let target = fx.root.path().join("node-b/gen-7");
    assert_eq!(download_ok(&store, complete, &target).await, m);

    // Idempotent: another node sweeping after it finds nothing.
    assert_nothing_left_to_sweep(&short, DEPTH).await;
}

#[tokio::test]
async fn s3_upload_past_half_the_grace_age_writes_no_manifest() {
    let ep = endpoint();
    let (bucket, store) = s3_store(&ep).await;
    let fx = fixture(12 << 20);
    fx.seal_memory().await.expect("seal");
    // Half of 2 ns is over at once: the upload must give up and leave nothing.
    let store = store.with_partial_grace(Duration::from_nanos(2));
    let key = "default/counter/7-slow";
    let err = store.upload(&fx.gen_dir, key).await.expect_err("too slow");
    assert!(matches!(err, Error::UploadTooSlow { .. }), "{err}");
    assert!(!store.exists_complete(key).await.expect("exists"));
    assert!(store.list_objects(key).await.expect("list").is_empty());
    assert_eq!(incomplete_uploads(&ep, &bucket).await, 0);
}

#[tokio::test]
async fn s3_failed_and_cancelled_multipart_uploads_are_aborted() {
    let ep = endpoint();
    let (bucket, store) = s3_store(&ep).await;
    // 40 MiB of noise in a plain file (one object): five parts, long enough to be cut off
    // half-way.
    let fx = fixture_with_big_file(40 << 20, "core-1.img");
    fx.seal_memory().await.expect("seal");

    // 1. Cancelled: the upload future is dropped (a cancelled RPC) while its multipart upload
    //    is open. The upload is aborted in the background.
    let key = "default/counter/7-cancelled";
    // Boxed, so that dropping it below really drops the future (a pinned local would live on).
    let mut upload = Box::pin(store.upload(&fx.gen_dir, key));
    let mut seen_open = false;
    for _ in 0..2000 {
        tokio::select! {
            done = &mut upload => {
                done.expect("upload");
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(5)) => {
                if incomplete_uploads(&ep, &bucket).await > 0 {
                    seen_open = true;
                    break;
                }
            }
        }
    }
    drop(upload);
    if seen_open {
        let aborted = "the cancelled multipart upload aborted";
        poll_until(
            aborted,
            Duration::from_secs(20),
            Duration::from_millis(100),
            async || (incomplete_uploads(&ep, &bucket).await == 0).then_some(()),
        )
        .await;
    } else {
        // The upload finished before a poll saw it open: nothing to check in this run.
        eprintln!("upload finished before its multipart upload was seen open");
    }

    // 2. Failed: same size, one other byte, found only after all the parts went up.
    let path = fx.gen_dir.join("criu/core-1.img");
    let mut bytes = fs::read(&path).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    fs::write(&path, bytes).expect("write");
    let key = "default/counter/7-changed";
    let err = store.upload(&fx.gen_dir, key).await.expect_err("changed");
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
    assert!(store.list_objects(key).await.expect("list").is_empty());
    assert_eq!(incomplete_uploads(&ep, &bucket).await, 0);
}

#[tokio::test]
async fn s3_upload_download_corrupt_delete() {
    let ep = endpoint();
    let bucket = format!("ate-snap-{}", uuid::Uuid::new_v4().simple());
    create_bucket(&ep, &bucket).await;

    // 12 MiB of noise in pages-1.img: a memory image, so six content-addressed chunks.
    let fx = fixture(12 << 20);
    let m = fx.seal_memory().await.expect("seal");
    let store =
        DurableStore::from_url_with_options(&format!("s3://{bucket}/snapshots"), options(&ep))
            .expect("s3 store");
    let key = "default/counter/7";
    let uri = store.upload(&fx.gen_dir, key).await.expect("upload");
    assert_eq!(uri, format!("s3://{bucket}/snapshots/{key}"));
    assert!(store.exists_complete(&uri).await.expect("exists"));
    // Every file but the memory image, plus the manifest.
    assert_eq!(
        store.list_objects(&uri).await.expect("list").len(),
        m.files.len()
    );
    // The same memory again under another key: no chunk is sent twice.
    let (_, again) = store
        .upload_with_stats(&fx.gen_dir, "default/counter/8")
        .await
        .expect("upload again");
    assert_eq!(again.chunks_reused, 6, "{again:?}");
    assert!(again.sent_bytes < 1 << 20, "{again:?}");
    // A lazy restore's download: the small files and the chunks named; the rest by fetch.
    let lazy = fx.root.path().join("node-b/gen-7.lazy");
    store
        .download_for_lazy_restore(&uri, &lazy, |_| Ok(vec![("criu/pages-1.img".into(), 0)]))
        .await
        .expect("lazy download");
    let entry = m.file("criu/pages-1.img").expect("listed").clone();
    let original = fs::read(fx.gen_dir.join("criu/pages-1.img")).expect("read");
    let local = fs::read(lazy.join("criu/pages-1.img")).expect("read");
    let c = ate_snapshot::CHUNK_BYTES as usize;
    assert_eq!(&local[..c], &original[..c]);
    assert!(local[c..].iter().all(|b| *b == 0));
    assert_eq!(
        store.fetch_chunk(&entry, 5).await.expect("fetch"),
        &original[5 * c..]
    );
    store
        .delete("default/counter/8")
        .await
        .expect("delete the copy");

    // A generation with one page changed goes up as a delta (its header read back by a ranged
    // GET of the parent's chunk) and comes back whole.
    let fx2 = fixture(12 << 20);
    let pages2 = fx2.gen_dir.join("criu/pages-1.img");
    let mut changed = fs::read(&pages2).expect("read");
    changed[3 * c + 4096 * 7 + 1] ^= 0x11;
    fs::write(&pages2, &changed).expect("write");
    let m2 = fx2.seal_memory().await.expect("seal g2");
    let (_, delta) = store
        .upload_with_parents(
            &fx2.gen_dir,
            "default/counter/9",
            ate_snapshot::UploadPriority::Normal,
            std::slice::from_ref(&fx.gen_dir),
            &|_| None,
        )
        .await
        .expect("upload g2");
    assert_eq!(
        (delta.chunks_reused, delta.chunks_delta),
        (5, 1),
        "{delta:?}"
    );
    let target2 = fx.root.path().join("node-b/gen-9");
    assert_eq!(download_ok(&store, "default/counter/9", &target2).await, m2);
    assert_eq!(
        fs::read(target2.join("criu/pages-1.img")).expect("read"),
        changed
    );

    let target = fx.root.path().join("node-b/gen-7");
    let got = download_ok(&store, &uri, &target).await;
    assert_eq!(got, m);
    assert_eq!(verify(&target).await.expect("verify"), m);
    assert_eq!(
        fs::read(target.join("criu/pages-1.img")).expect("read"),
        fs::read(fx.gen_dir.join("criu/pages-1.img")).expect("read")
    );

    // Corrupt one object behind the store's back: download names the file, leaves nothing.
    let raw = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&bucket)
        .with_endpoint(&ep)
        .with_allow_http(true)
        .with_access_key_id(env_or("AWS_ACCESS_KEY_ID", "testing"))
        .with_secret_access_key(env_or("AWS_SECRET_ACCESS_KEY", "testing"))
        .with_region(env_or("AWS_DEFAULT_REGION", "us-east-1"))
        .build()
        .expect("raw s3");
    let obj = object_store::path::Path::from(format!("snapshots/{key}/volumes/data.tar.zst"));
    let mut bytes = raw
        .get(&obj)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes")
        .to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    raw.put(&obj, bytes.into()).await.expect("put corrupted");
    let target2 = fx.root.path().join("node-c/gen-7");
    let err = store.download(&uri, &target2).await.expect_err("corrupt");
    assert!(err.to_string().contains("volumes/data.tar"), "{err}");
    assert!(!target2.exists());
    assert!(no_temp_siblings(&target2));

    store.delete(&uri).await.expect("delete");
    assert!(!store.exists_complete(&uri).await.expect("exists"));
    assert!(store.list_objects(&uri).await.expect("list").is_empty());
    store.delete(&uri).await.expect("idempotent");
    let err = store.download(&uri, &target2).await.expect_err("gone");
    assert!(matches!(err, Error::NotComplete { .. }), "{err}");
}
