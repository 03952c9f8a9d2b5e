//! The test services `scripts/test-services.sh` starts, found through the environment:
//! PostgreSQL (`ATE_TEST_POSTGRES_URL`) and moto, the S3 stand-in (`ATE_TEST_S3_ENDPOINT`).

use std::io::{Read, Write};
use std::process::Command;

/// The test PostgreSQL server's URL (`ATE_TEST_POSTGRES_URL`); panics saying how to get one.
pub fn postgres_url() -> String {
    std::env::var("ATE_TEST_POSTGRES_URL").expect(
        "ATE_TEST_POSTGRES_URL must point at a PostgreSQL server (scripts/test.sh starts one)",
    )
}

/// Creates database `db` on the test server with `psql` and returns its URL.
pub fn create_postgres_database(db: &str) -> String {
    let base = postgres_url();
    let status = Command::new("psql")
        .args([base.as_str(), "-q", "-c", &format!("CREATE DATABASE {db}")])
        .status()
        .expect("run psql");
    assert!(status.success(), "CREATE DATABASE failed");
    let (prefix, _) = base.rsplit_once('/').expect("URL has a database part");
    format!("{prefix}/{db}")
}

/// moto's endpoint (`ATE_TEST_S3_ENDPOINT`); panics saying how to start it.
pub fn s3_endpoint() -> String {
    std::env::var("ATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "ATE_TEST_S3_ENDPOINT is not set: start moto with `eval \"$(scripts/test-services.sh)\"` \
             (or `moto_server -H 127.0.0.1 -p 55000` and ATE_TEST_S3_ENDPOINT=http://127.0.0.1:55000)"
        )
    })
}

/// Creates an S3 bucket on moto with an unsigned PUT (object_store cannot create buckets); a
/// bucket this test run already made is fine.
pub fn create_s3_bucket(endpoint: &str, bucket: &str) {
    let hostport = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(hostport).expect("connect to the S3 endpoint");
    write!(
        s,
        "PUT /{bucket} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    assert!(
        buf.starts_with("HTTP/1.1 200") || buf.contains("BucketAlreadyOwnedByYou"),
        "bucket create: {buf}"
    );
}
