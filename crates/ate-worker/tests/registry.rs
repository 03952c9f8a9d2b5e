//! Registry pulls against a real registry on loopback (Debian's `docker-registry`, run by the
//! test): by tag and by digest into the node cache, the same rootfs as the OCI layout, tampered
//! blobs refused with nothing left in the cache, clear errors for unknown tags, unreachable
//! registries, unsupported media types and refused settings, one download for concurrent pulls,
//! and HTTPS with an extra CA plus basic auth from a Docker config file.
//!
//! Skipped with a message when `docker-registry` is not installed and `CI` is unset.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ate_image::RegistryConfig;
use ate_test_support::registry as registry_fixture;
use ate_worker::{ImageCache, ImageError, UnpackedImage};
use common::images_dir;
use registry_fixture::{HTPASSWD, Options, Registry};
use sha2::{Digest, Sha256};

fn cache(reg: &Registry, dir: &Path) -> ImageCache {
    ImageCache::with_registry(
        dir,
        RegistryConfig {
            insecure: vec![reg.host()],
            ..RegistryConfig::default()
        },
    )
}

fn image_message(r: Result<UnpackedImage, ImageError>) -> (String, String) {
    match r {
        Err(ImageError::Image { reference, message }) => {
            eprintln!("image {reference}: {message}");
            (reference, message)
        }
        other => panic!("expected an image error, got {other:?}"),
    }
}

/// Every entry under `root`: kind, mode, owner and content (or link target).
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let m = std::fs::symlink_metadata(&path).expect("metadata");
            let rel = path.strip_prefix(root).expect("under root").to_path_buf();
            let what = if m.file_type().is_symlink() {
                format!("link {:?}", std::fs::read_link(&path).expect("readlink"))
            } else if m.is_dir() {
                "dir".to_string()
            } else {
                let bytes = std::fs::read(&path).expect("read");
                format!("file {}", hex::encode(Sha256::digest(&bytes)))
            };
            out.insert(
                rel,
                format!("{what} mode {:o} {}:{}", m.mode(), m.uid(), m.gid()),
            );
            if m.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Names in the cache dir other than the flock files (which are kept by design).
fn cache_entries(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    names.sort();
    names
}

/// GET requests the registry served for one blob (from its log).
fn blob_gets(reg: &Registry, repo: &str, digest: &str) -> usize {
    let uri = format!("/v2/{repo}/blobs/{digest}");
    reg.log()
        .lines()
        .filter(|l| l.contains("response completed") && l.contains(&uri))
        .filter(|l| l.contains("http.request.method=GET"))
        .count()
}

fn layer_digest(layout: &Path, manifest_digest: &str) -> String {
    let hex = manifest_digest.strip_prefix("sha256:").expect("sha256");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(layout.join("blobs/sha256").join(hex)).expect("manifest"),
    )
    .expect("json");
    manifest["layers"][0]["digest"]
        .as_str()
        .expect("layer digest")
        .to_string()
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[tokio::test]
async fn pulls_by_tag_and_by_digest_into_the_cache_like_the_layout() {
    if !registry_fixture::available("pulls_by_tag_and_by_digest_into_the_cache_like_the_layout") {
        return;
    }
    let layout = images_dir().join("counter");
    let mut reg = Registry::start();
    let digest = reg.push_layout(&layout, "ate/counter", "v1");
    let tmp = tempfile::tempdir().expect("tempdir");

    // The layout, unpacked the way it always was: the reference rootfs.
    let from_layout = ImageCache::new(tmp.path().join("layout-cache"))
        .ensure(&format!("oci-layout:{}", layout.display()))
        .await
        .expect("layout unpack");
    let expected = tree(&from_layout.rootfs);
    assert!(expected.contains_key(Path::new("counter")), "{expected:?}");

    // By tag.
    let by_tag_ref = format!("{}/ate/counter:v1", reg.host());
    let tag_cache = tmp.path().join("tag-cache");
    let by_tag = cache(&reg, &tag_cache)
        .ensure(&by_tag_ref)
        .await
        .expect("pull by tag");
    assert_eq!(by_tag.manifest_digest, digest);
    assert_eq!(
        by_tag.rootfs,
        tag_cache
            .join(digest.trim_start_matches("sha256:"))
            .join("rootfs")
    );
    assert_eq!(
        tree(&by_tag.rootfs),
        expected,
        "rootfs differs from the layout's"
    );
    assert_eq!(by_tag.config, from_layout.config);
    assert_eq!(by_tag.config.cmd, vec!["/counter".to_string()]);
    // The tag's resolution is recorded; no temporary directory or blob is left behind.
    let refs: Vec<_> = std::fs::read_dir(tag_cache.join("refs"))
        .expect("refs dir")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).expect("record"))
        .collect();
    assert_eq!(refs.len(), 1, "{refs:?}");
    assert!(
        refs[0].contains(&digest) && refs[0].contains("ate/counter:v1"),
        "{refs:?}"
    );
    assert_eq!(
        cache_entries(&tag_cache),
        vec![
            digest.trim_start_matches("sha256:").to_string(),
            "refs".into()
        ]
    );
    assert!(
        !by_tag
            .rootfs
            .parent()
            .expect("entry")
            .join("blobs")
            .exists()
    );

    // By digest, into another cache.
    let by_digest_ref = format!("{}/ate/counter@{digest}", reg.host());
    let by_digest = cache(&reg, &tmp.path().join("digest-cache"))
        .ensure(&by_digest_ref)
        .await
        .expect("pull by digest");
    assert_eq!(by_digest.manifest_digest, digest);
    assert_eq!(tree(&by_digest.rootfs), expected);

    // Through an image index (multi-platform tag): the linux/amd64 manifest is what is cached.
    let manifest_len = std::fs::read(
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .expect("manifest")
    .len();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
             "size": manifest_len, "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
             "size": manifest_len, "platform": {"architecture": "amd64", "os": "linux"}}
        ]
    });
    let index_bytes = serde_json::to_vec(&index).expect("json");
    reg.push_manifest(
        "ate/counter",
        "multi",
        "application/vnd.oci.image.index.v1+json",
        &index_bytes,
    );
    let via_index = cache(&reg, &tmp.path().join("index-cache"))
        .ensure(&format!("{}/ate/counter:multi", reg.host()))
        .await
        .expect("pull through an index");
    assert_eq!(via_index.manifest_digest, digest);
    assert_eq!(tree(&via_index.rootfs), expected);

    // Known on this node: served without the registry.
    reg.stop();
    let again = cache(&reg, &tag_cache)
        .ensure(&by_tag_ref)
        .await
        .expect("cached tag, registry down");
    assert_eq!(again, by_tag);
    let again = cache(&reg, &tmp.path().join("digest-cache"))
        .ensure(&by_digest_ref)
        .await
        .expect("cached digest, registry down");
    assert_eq!(again, by_digest);
    let again = cache(&reg, &tmp.path().join("index-cache"))
        .ensure(&format!("{}/ate/counter:multi", reg.host()))
        .await
        .expect("cached index tag, registry down");
    assert_eq!(again, via_index);
}

#[tokio::test]
async fn concurrent_pulls_download_once() {
    if !registry_fixture::available("concurrent_pulls_download_once") {
        return;
    }
    let layout = images_dir().join("counter");
    let reg = Registry::start();
    let digest = reg.push_layout(&layout, "ate/counter", "v1");
    let layer = layer_digest(&layout, &digest);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    // Two caches on one directory stand for two workers of a node (separate in-process
    // single-flight maps, so only the per-digest flock keeps them apart).
    let (a, b) = (cache(&reg, &dir), cache(&reg, &dir));
    let reference = format!("{}/ate/counter:v1", reg.host());
    let mut tasks = Vec::new();
    for i in 0..6 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        let r = reference.clone();
        tasks.push(tokio::spawn(async move { c.ensure(&r).await }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("join").expect("concurrent pull"));
    }
    assert!(results.iter().all(|r| *r == results[0]));
    assert_eq!(
        blob_gets(&reg, "ate/counter", &layer),
        1,
        "the layer was downloaded more than once:\n{}",
        reg.log()
    );
}

#[tokio::test]
async fn tampered_blobs_are_refused_and_nothing_is_cached() {
    if !registry_fixture::available("tampered_blobs_are_refused_and_nothing_is_cached") {
        return;
    }
    let layout = images_dir().join("counter");
    let reg = Registry::start();
    let digest = reg.push_layout(&layout, "ate/counter", "v1");
    let layer = layer_digest(&layout, &digest);

    // Same length, one byte flipped in the middle of the layer the registry stores.
    let file = reg.blob_file(&layer);
    let mut bytes = std::fs::read(&file).expect("stored layer");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, &bytes).expect("tamper");

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    for reference in [
        format!("{}/ate/counter:v1", reg.host()),
        format!("{}/ate/counter@{digest}", reg.host()),
    ] {
        let (named, message) = image_message(cache(&reg, &dir).ensure(&reference).await);
        assert_eq!(named, reference);
        assert!(
            message.contains("digest mismatch") && message.contains(&layer),
            "{message}"
        );
        assert!(message.contains("refused"), "{message}");
        assert_eq!(
            cache_entries(&dir),
            Vec::<String>::new(),
            "left in the cache"
        );
    }

    // A tampered manifest (by tag: the registry still announces the old digest) is refused too.
    let manifest_file = reg.blob_file(&digest);
    let mut manifest = std::fs::read(&manifest_file).expect("stored manifest");
    manifest.push(b'\n'); // still the same JSON, another sha256
    std::fs::write(&manifest_file, &manifest).expect("tamper manifest");
    let reference = format!("{}/ate/counter:v1", reg.host());
    let (_, message) = image_message(cache(&reg, &dir).ensure(&reference).await);
    assert!(
        message.starts_with("digest mismatch") && message.contains("refused"),
        "tampered manifest: {message}"
    );
    assert_eq!(
        cache_entries(&dir),
        Vec::<String>::new(),
        "left in the cache"
    );
}

#[tokio::test]
async fn unknown_names_unreachable_registries_and_bad_settings_are_named() {
    if !registry_fixture::available(
        "unknown_names_unreachable_registries_and_bad_settings_are_named",
    ) {
        return;
    }
    let layout = images_dir().join("counter");
    let reg = Registry::start();
    let digest = reg.push_layout(&layout, "ate/counter", "v1");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cache");
    let c = cache(&reg, &dir);

    for (reference, what) in [
        (format!("{}/ate/counter:nope", reg.host()), "tag \"nope\""),
        (format!("{}/ate/missing:v1", reg.host()), "tag \"v1\""),
        (
            format!("{}/ate/counter@sha256:{}", reg.host(), "0".repeat(64)),
            "manifest sha256:0000",
        ),
    ] {
        let (named, message) = image_message(c.ensure(&reference).await);
        assert_eq!(named, reference);
        assert!(
            message.starts_with("not found") && message.contains(what),
            "{reference}: {message}"
        );
    }

    // Nothing listens: unreachable, named.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let reference = format!("{closed}/ate/counter:v1");
    let (_, message) = image_message(
        ImageCache::with_registry(
            &dir,
            RegistryConfig {
                insecure: vec![closed.to_string()],
                ..RegistryConfig::default()
            },
        )
        .ensure(&reference)
        .await,
    );
    assert!(message.contains("registry unreachable"), "{message}");

    // HTTPS unless the registry is listed: the plain-HTTP registry does not answer TLS.
    let reference = format!("{}/ate/counter@{digest}", reg.host());
    let (_, message) = image_message(
        ImageCache::with_registry(&dir, RegistryConfig::default())
            .ensure(&reference)
            .await,
    );
    assert!(message.contains("https://"), "{message}");

    // Plain HTTP to a non-loopback registry is refused before any request.
    let (_, message) = image_message(
        ImageCache::with_registry(
            &dir,
            RegistryConfig {
                insecure: vec!["10.1.2.3:5000".into()],
                ..RegistryConfig::default()
            },
        )
        .ensure("10.1.2.3:5000/ate/counter:v1")
        .await,
    );
    assert!(
        message.contains("10.1.2.3:5000") && message.contains("loopback"),
        "{message}"
    );

    // Not an image: a Helm chart (artifact config) and a zstd layer are refused by media type.
    let config = br#"{"name":"chart"}"#;
    let content = b"not really a chart";
    reg.push_blob("ate/chart", &digest_of(config), config);
    reg.push_blob("ate/chart", &digest_of(content), content);
    let artifact = |config_type: &str, layer_type: &str| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": config_type, "digest": digest_of(config), "size": config.len()},
            "layers": [{"mediaType": layer_type, "digest": digest_of(content), "size": content.len()}]
        }))
        .expect("json")
    };
    let media = "application/vnd.oci.image.manifest.v1+json";
    reg.push_manifest(
        "ate/chart",
        "helm",
        media,
        &artifact(
            "application/vnd.cncf.helm.config.v1+json",
            "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
        ),
    );
    reg.push_manifest(
        "ate/chart",
        "zstd",
        media,
        &artifact(
            "application/vnd.oci.image.config.v1+json",
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ),
    );
    for (tag, bad) in [
        ("helm", "application/vnd.cncf.helm.config.v1+json"),
        ("zstd", "application/vnd.oci.image.layer.v1.tar+zstd"),
    ] {
        let (_, message) =
            image_message(c.ensure(&format!("{}/ate/chart:{tag}", reg.host())).await);
        assert!(
            message.starts_with("unsupported media type") && message.contains(bad),
            "{tag}: {message}"
        );
    }
    assert_eq!(
        cache_entries(&dir),
        Vec::<String>::new(),
        "left in the cache"
    );
}

#[tokio::test]
async fn https_with_an_extra_ca_and_basic_auth_from_a_docker_config() {
    if !registry_fixture::available("https_with_an_extra_ca_and_basic_auth_from_a_docker_config") {
        return;
    }
    let layout = images_dir().join("counter");
    let plain = Registry::start();
    let digest = plain.push_layout(&layout, "ate/counter", "v1");
    let tmp = tempfile::tempdir().expect("tempdir");

    // A registry certificate for 127.0.0.1 from a test CA the system does not trust.
    let ca = ate_tls::LocalCa::open_or_create(&tmp.path().join("ca"), "registry.test").expect("ca");
    let id = ate_tls::SpiffeId::parse("spiffe://registry.test/ns/test/sa/registry").expect("id");
    let svid = ca
        .issue(&ate_tls::SvidRequest::new(id).ip(std::net::IpAddr::from([127, 0, 0, 1])))
        .expect("issue");
    let (cert, key) = (
        tmp.path().join("registry.crt"),
        tmp.path().join("registry.key"),
    );
    svid.write_pem(&cert, &key).expect("write pem");
    // The same storage served over HTTPS with basic auth.
    let secure = Registry::start_with(Options {
        tls: Some((cert, key)),
        htpasswd: Some(HTPASSWD.into()),
        storage: Some(plain.storage().to_path_buf()),
    });
    let reference = format!("{}/ate/counter:v1", secure.host());

    let good = tmp.path().join("good.json");
    std::fs::write(
        &good,
        format!(
            r#"{{"auths": {{"https://{}": {{"auth": "YXRlOnMzY3JldC10ZXN0"}}}}}}"#,
            secure.host()
        ),
    )
    .expect("auth file");
    assert_eq!(
        registry_fixture::USER.to_string() + ":" + registry_fixture::PASSWORD,
        "ate:s3cret-test",
        "the auth file above encodes these"
    );
    let wrong = tmp.path().join("wrong.json");
    std::fs::write(
        &wrong,
        format!(
            r#"{{"auths": {{"{}": {{"username": "ate", "password": "nope"}}}}}}"#,
            secure.host()
        ),
    )
    .expect("auth file");
    let cache_with = |name: &str, auth: Option<&Path>, trust: bool| {
        ImageCache::with_registry(
            tmp.path().join(name),
            RegistryConfig {
                insecure: Vec::new(),
                auth_file: auth.map(Path::to_path_buf),
                ca_file: trust.then(|| ca.cert_path()),
            },
        )
    };

    // The test CA not configured: the certificate is refused.
    let (_, message) = image_message(
        cache_with("c1", Some(&good), false)
            .ensure(&reference)
            .await,
    );
    assert!(
        message.contains("registry unreachable") && message.to_lowercase().contains("certificate"),
        "{message}"
    );
    // Trusted, but anonymous or with a wrong password: not authorized.
    for (name, auth) in [("c2", None), ("c3", Some(wrong.as_path()))] {
        let (_, message) = image_message(cache_with(name, auth, true).ensure(&reference).await);
        assert!(message.contains("not authorized"), "{name}: {message}");
    }
    // Trusted and the right credentials: pulled over HTTPS, the layout's rootfs.
    let img = cache_with("c4", Some(&good), true)
        .ensure(&reference)
        .await
        .expect("pull over HTTPS with basic auth");
    assert_eq!(img.manifest_digest, digest);
    let from_layout = ImageCache::new(tmp.path().join("layout-cache"))
        .ensure(&format!("oci-layout:{}", layout.display()))
        .await
        .expect("layout unpack");
    assert_eq!(tree(&img.rootfs), tree(&from_layout.rootfs));
}
