//! DurableStore against S3 (moto_server on loopback). Needs `ATE_TEST_S3_ENDPOINT`
//! (scripts/test-services.sh exports it); without it the test fails rather than skipping.

mod common;

use std::fs;

use ate_core::Fidelity;
use ate_snapshot::{DurableStore, Error, seal_generation, verify};
use common::*;
use object_store::ObjectStoreExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn endpoint() -> String {
    std::env::var("ATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "ATE_TEST_S3_ENDPOINT is not set: start moto with `eval \"$(scripts/test-services.sh)\"` \
             (or `moto_server -H 127.0.0.1 -p 55000` and ATE_TEST_S3_ENDPOINT=http://127.0.0.1:55000)"
        )
    })
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
    let hostport = ep
        .strip_prefix("http://")
        .expect("ATE_TEST_S3_ENDPOINT must be http://host:port")
        .trim_end_matches('/');
    let mut s = tokio::net::TcpStream::connect(hostport)
        .await
        .unwrap_or_else(|e| panic!("connect to moto at {hostport}: {e}"));
    let req = format!(
        "PUT /{bucket} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.expect("read");
    assert!(
        resp.starts_with("HTTP/1.1 200"),
        "create bucket {bucket}: {resp}"
    );
}

#[tokio::test]
async fn s3_upload_download_corrupt_delete() {
    let ep = endpoint();
    let bucket = format!("ate-snap-{}", uuid::Uuid::new_v4().simple());
    create_bucket(&ep, &bucket).await;

    // 12 MiB of noise in pages-1.img: bigger than one part, so it goes up as a multipart upload.
    let fx = fixture(12 << 20);
    let m = seal_generation(
        &fx.gen_dir,
        meta(Fidelity::Memory),
        Some(&fx.upper),
        &fx.volumes,
    )
    .await
    .expect("seal");
    let store =
        DurableStore::from_url_with_options(&format!("s3://{bucket}/snapshots"), options(&ep))
            .expect("s3 store");
    let key = "default/counter/7";
    let uri = store.upload(&fx.gen_dir, key).await.expect("upload");
    assert_eq!(uri, format!("s3://{bucket}/snapshots/{key}"));
    assert!(store.exists_complete(&uri).await.expect("exists"));
    assert_eq!(
        store.list_objects(&uri).await.expect("list").len(),
        m.files.len() + 1
    );

    let target = fx.root.path().join("node-b/gen-7");
    let got = store.download(&uri, &target).await.expect("download");
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
