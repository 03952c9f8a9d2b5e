//! A real OCI registry on loopback for tests: Debian's `docker-registry` (distribution 2.x) run
//! as a child process with its own config (storage in a temp dir, `127.0.0.1:<free port>`, no
//! auth by default; optionally HTTPS and htpasswd basic auth), plus a push of an on-disk OCI layout through the registry's HTTP API (blob uploads and
//! a manifest PUT, byte for byte, so the pushed manifest keeps the layout's digest).
//!
//! Used by the worker's registry pull tests and by `ate-cli`'s registry and images-doc tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::free_port;

/// The registry binary, if installed.
pub fn binary() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("docker-registry"))
            .find(|p| p.is_file())
    });
    from_path.or_else(|| {
        let p = PathBuf::from("/usr/bin/docker-registry");
        p.is_file().then_some(p)
    })
}

/// True when the test can run. Without `docker-registry` the test is skipped with a message,
/// unless `CI` is set: then it fails, because CI installs the package (scripts/setup.sh).
pub fn available(test: &str) -> bool {
    if binary().is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: `docker-registry` is not installed but CI is set; scripts/setup.sh installs it (apt-get install docker-registry)"
    );
    eprintln!(
        "SKIPPED {test}: `docker-registry` is not installed (apt-get install -y docker-registry)"
    );
    false
}

pub struct Registry {
    child: Child,
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    storage: PathBuf,
    tls: bool,
}

/// How to run a registry beyond the defaults (plain HTTP, no auth, its own storage).
#[derive(Default)]
pub struct Options {
    /// Serve HTTPS with this certificate and key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Require basic auth against these htpasswd lines (bcrypt).
    pub htpasswd: Option<String>,
    /// Serve another registry's storage directory (push to that one over plain HTTP).
    pub storage: Option<PathBuf>,
}

/// `ate` / `s3cret-test` (bcrypt cost 4).
pub const HTPASSWD: &str = "ate:$2b$04$B8eVjYUqoxCz7tZ1dJA35O8sN1yXszxO1/cM4o9W5H2q3A.37s6Fi";
pub const USER: &str = "ate";
pub const PASSWORD: &str = "s3cret-test";

impl Registry {
    /// Starts a plain-HTTP registry without auth and waits until `GET /v2/` answers 200.
    pub fn start() -> Registry {
        Self::start_with(Options::default())
    }

    /// Starts a registry and waits until it answers (a TCP connection, for TLS).
    pub fn start_with(opts: Options) -> Registry {
        let bin = binary().expect("docker-registry installed");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::tempdir().expect("tempdir");
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let storage = opts
                .storage
                .clone()
                .unwrap_or_else(|| dir.path().join("storage"));
            let mut yaml = format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                storage.display()
            );
            if let Some((cert, key)) = &opts.tls {
                yaml.push_str(&format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    cert.display(),
                    key.display()
                ));
            }
            if let Some(lines) = &opts.htpasswd {
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, format!("{lines}\n")).expect("write htpasswd");
                yaml.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: ate-test\n    path: {}\n",
                    path.display()
                ));
            }
            let config = dir.path().join("config.yml");
            std::fs::write(&config, yaml).expect("write registry config");
            let log = std::fs::File::create(dir.path().join("registry.log")).expect("log file");
            let child = Command::new(&bin)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log fd"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry");
            let mut reg = Registry {
                child,
                dir,
                addr,
                storage,
                tls: opts.tls.is_some(),
            };
            match reg.wait_ready() {
                Ok(()) => return reg,
                Err(log) if attempt < 4 && log.contains("address already in use") => {
                    reg.stop();
                    continue;
                }
                Err(log) => {
                    reg.stop();
                    panic!("docker-registry did not start:\n{log}");
                }
            }
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let ready = if self.tls {
                TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok()
            } else {
                http(self.addr, "GET", "/v2/", &[], b"").is_ok()
            };
            if ready {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status}): {}", self.log()));
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err(format!("not ready in 20 s: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The storage directory (give it to [`Options::storage`] to serve it again).
    pub fn storage(&self) -> &Path {
        &self.storage
    }

    /// `127.0.0.1:<port>`: the registry part of references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps a blob's bytes (to tamper with them).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Uploads one blob (monolithic: POST an upload, PUT the bytes with the digest).
    pub fn push_blob(&self, repo: &str, digest: &str, bytes: &[u8]) {
        let (status, headers, body) = http(
            self.addr,
            "POST",
            &format!("/v2/{repo}/blobs/uploads/"),
            &[],
            b"",
        )
        .expect("start upload");
        assert_eq!(
            status,
            202,
            "start upload: {}",
            String::from_utf8_lossy(&body)
        );
        let location = header(&headers, "location").expect("upload location");
        let path = location
            .strip_prefix(&format!("http://{}", self.addr))
            .unwrap_or(&location)
            .to_string();
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, _, body) = http(
            self.addr,
            "PUT",
            &format!("{path}{sep}digest={digest}"),
            &[("Content-Type", "application/octet-stream")],
            bytes,
        )
        .expect("upload blob");
        assert_eq!(
            status,
            201,
            "upload {digest}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// PUTs a manifest under `reference` (a tag or a digest); returns the registry's digest.
    pub fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> String {
        let (status, headers, body) = http(
            self.addr,
            "PUT",
            &format!("/v2/{repo}/manifests/{reference}"),
            &[("Content-Type", media_type)],
            bytes,
        )
        .expect("put manifest");
        assert_eq!(
            status,
            201,
            "put manifest {repo}:{reference}: {}",
            String::from_utf8_lossy(&body)
        );
        header(&headers, "docker-content-digest").expect("manifest digest header")
    }

    /// Pushes the OCI layout's `latest` image (config, layers, the manifest bytes unchanged) as
    /// `<repo>:<tag>`; returns the manifest digest (the same as in the layout).
    pub fn push_layout(&self, layout: &Path, repo: &str, tag: &str) -> String {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index.json"))
                .expect("index.json is JSON");
        let manifest_digest = index["manifests"][0]["digest"]
            .as_str()
            .expect("a manifest in index.json")
            .to_string();
        let manifest = read_blob(layout, &manifest_digest);
        let parsed: serde_json::Value = serde_json::from_slice(&manifest).expect("manifest JSON");
        let media_type = parsed["mediaType"]
            .as_str()
            .unwrap_or("application/vnd.oci.image.manifest.v1+json");
        let layers = parsed["layers"].as_array().cloned().unwrap_or_default();
        for desc in std::iter::once(&parsed["config"]).chain(layers.iter()) {
            let d = desc["digest"].as_str().expect("descriptor digest");
            self.push_blob(repo, d, &read_blob(layout, d));
        }
        let digest = self.push_manifest(repo, tag, media_type, &manifest);
        assert_eq!(
            digest, manifest_digest,
            "the registry kept the manifest bytes"
        );
        digest
    }

    /// Stops the registry (SIGKILL to the child we started; it holds nothing worth flushing).
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    std::fs::read(layout.join("blobs/sha256").join(hex)).expect("layout blob")
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
}

/// `(status, headers, body)`.
pub type Response = (u16, Vec<(String, String)>, Vec<u8>);

/// One HTTP/1.1 request on a fresh connection: `(status, headers, body)`. Bodies of the
/// responses used here are small and not chunked (or ignored).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok((status, headers, buf[split + 4..].to_vec()))
}
