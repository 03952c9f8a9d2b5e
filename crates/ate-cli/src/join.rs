//! A machine joining the fleet: certificates for its node agent and workers from the api's CA
//! (JoinService), written as `<dir>/{ca.crt,node.crt,node.key,<worker>.crt,<worker>.key}`, and
//! renewed at 2/3 of their lifetime with the node's own certificate. Keys are made here and never
//! leave the machine. The components read the files and reload them when they change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ate_proto::v1;
use ate_proto::v1::join_service_client::JoinServiceClient;
use ate_tls::{JoinToken, PemFiles, SpiffeId};

/// Name of the node agent's certificate files (and its entry in JoinService requests).
pub const NODE_CERT_NAME: &str = "node";
/// How long one api call of a join may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// A renewal that fails is retried after this long (until the certificates expire).
const RENEW_RETRY: Duration = Duration::from_secs(15);

/// CSRs to send and the matching private keys (PEM) by name.
type Requests = (Vec<v1::CertificateRequest>, Vec<(String, String)>);

/// The identities of one node: its agent and its workers.
#[derive(Clone, Debug)]
pub struct NodeIdentities {
    /// api address(es), comma-separated.
    pub api: String,
    pub node: String,
    pub workers: Vec<String>,
    /// Where the PEM files go.
    pub dir: PathBuf,
}

/// What a join or renewal produced.
#[derive(Clone, Debug)]
pub struct Issued {
    pub trust_domain: String,
    /// The earliest expiry among the certificates.
    pub not_after: SystemTime,
    /// The shortest lifetime among them (renewal happens at 2/3 of it).
    pub lifetime: Duration,
}

impl NodeIdentities {
    pub fn files(&self, name: &str) -> PemFiles {
        PemFiles::in_dir(&self.dir, name)
    }

    /// Gets fresh certificates: by renewal with the node's current certificate when it is still
    /// valid (a restarted node needs no new token), else with `token`.
    pub async fn obtain(&self, token: Option<&JoinToken>) -> anyhow::Result<Issued> {
        // A renewal cut short by a crash: finish it, or keep the set it was replacing.
        recover_staged(&self.dir)?;
        if self
            .node_cert_validity()
            .is_some_and(|left| left > Duration::ZERO)
        {
            match self.renew().await {
                Ok(issued) => return Ok(issued),
                Err(e) if token.is_none() => return Err(e),
                Err(e) => eprintln!(
                    "ate up: renewing with the node's certificate failed ({e:#}); joining with the token"
                ),
            }
        }
        let Some(token) = token else {
            anyhow::bail!(
                "node {} has no valid certificate in {}: join with a token (`--token`, from `ate token create` on the control host)",
                self.node,
                self.dir.display()
            );
        };
        self.join(token).await
    }

    /// How long the node's current certificate stays valid (None without one).
    fn node_cert_validity(&self) -> Option<Duration> {
        let files = self.files(NODE_CERT_NAME);
        let source = ate_tls::CertSource::from_files(files, ate_tls::DEFAULT_FILE_POLL).ok()?;
        let not_after = source.current().not_after?;
        Some(
            not_after
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO),
        )
    }

    /// The first join: trust bundle checked against the token's pin, then the CSRs with the token.
    pub async fn join(&self, token: &JoinToken) -> anyhow::Result<Issued> {
        let bundle = self.fetch_bundle(token).await?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let mut roots = ate_tls::rustls::RootCertStore::empty();
        for c in ate_tls::join::check_bundle(&bundle.ca_pem, &token.ca_pin)? {
            roots
                .add(c)
                .context("the api's CA bundle holds a bad certificate")?;
        }
        let config = ate_tls::client_config_no_cert(
            roots,
            ate_tls::ServerCheck::Pin(SpiffeId::api(&bundle.trust_domain)?),
        )?;
        let (csrs, keys) = self.csrs(&bundle.trust_domain)?;
        let reply = self
            .join_client(config)?
            .join_node(v1::JoinNodeRequest {
                token: token.to_string(),
                node: self.node.clone(),
                csrs,
            })
            .await
            .map_err(|s| anyhow::anyhow!("the api refused the join: {}", s.message()))?
            .into_inner();
        self.write(&reply, &keys)
    }

    /// Renews every certificate with the node's current one (mTLS).
    pub async fn renew(&self) -> anyhow::Result<Issued> {
        let source =
            ate_tls::CertSource::from_files(self.files(NODE_CERT_NAME), ate_tls::DEFAULT_FILE_POLL)
                .with_context(|| {
                    format!("cannot load the node certificate in {}", self.dir.display())
                })?;
        let td = source
            .id()
            .map(|id| id.trust_domain().to_string())
            .context("the node certificate has no SPIFFE ID")?;
        let config =
            ate_tls::client_config(&source, ate_tls::ServerCheck::Pin(SpiffeId::api(&td)?))?;
        let (csrs, keys) = self.csrs(&td)?;
        let reply = self
            .join_client(config)?
            .renew_node_certificates(v1::RenewNodeCertificatesRequest {
                node: self.node.clone(),
                csrs,
            })
            .await
            .map_err(|s| anyhow::anyhow!("the api refused the renewal: {}", s.message()))?
            .into_inner();
        self.write(&reply, &keys)
    }

    /// The JoinService of the api replicas, their certificate checked with `config`.
    fn join_client(
        &self,
        config: ate_tls::rustls::ClientConfig,
    ) -> anyhow::Result<JoinServiceClient<tonic::transport::Channel>> {
        let channel = ate_tls::replicas_channel_lazy(
            &self.api,
            Some(Arc::new(config)),
            Duration::from_secs(3),
            |e| e.timeout(CALL_TIMEOUT),
        )?;
        Ok(JoinServiceClient::new(channel))
    }

    /// The api's CA bundle over an unauthenticated connection (checked by the caller).
    async fn fetch_bundle(&self, token: &JoinToken) -> anyhow::Result<v1::TrustBundle> {
        let config = Arc::new(ate_tls::join::first_contact_client_config()?);
        let mut last = None;
        for addr in self.api.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let endpoint = ate_tls::endpoint(addr)?.timeout(CALL_TIMEOUT);
            let attempt = async {
                let channel = tokio::time::timeout(
                    CALL_TIMEOUT,
                    ate_tls::tls_channel(endpoint, config.clone()),
                )
                .await
                .context("timed out")??;
                let bundle = JoinServiceClient::new(channel)
                    .get_trust_bundle(v1::GetTrustBundleRequest {})
                    .await
                    .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                    .into_inner();
                // Checked here too, so a wrong replica is skipped rather than fatal.
                ate_tls::join::check_bundle(&bundle.ca_pem, &token.ca_pin)?;
                anyhow::Ok(bundle)
            };
            match attempt.await {
                Ok(b) => return Ok(b),
                Err(e) => last = Some(e.context(format!("api {addr}"))),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no api address given")))
    }

    /// One key and CSR per identity (node first), and the keys by name.
    fn csrs(&self, td: &str) -> anyhow::Result<Requests> {
        let mut csrs = Vec::with_capacity(self.workers.len() + 1);
        let mut keys = Vec::with_capacity(self.workers.len() + 1);
        let mut add = |name: &str, id: SpiffeId| -> anyhow::Result<()> {
            let (key, csr) = ate_tls::join::key_and_csr(&id)?;
            csrs.push(v1::CertificateRequest {
                name: name.to_string(),
                csr_pem: csr,
            });
            keys.push((name.to_string(), key));
            Ok(())
        };
        add(NODE_CERT_NAME, SpiffeId::node_instance(td, &self.node)?)?;
        for w in &self.workers {
            add(w, SpiffeId::worker_instance(td, w)?)?;
        }
        Ok((csrs, keys))
    }

    /// Writes the CA bundle and every key and certificate so that a crash at any point leaves
    /// a matching set: all of it is first written to a staging dir (`.renew/`) and marked
    /// complete there, then each file is renamed into place (key first: a component that reads
    /// the new certificate next to the old key retries at its next poll). A restart finishes a
    /// complete staging dir and drops an incomplete one ([`recover_staged`]), so a node killed
    /// mid-renewal restarts with its certificates, not needing a new join token.
    fn write(
        &self,
        reply: &v1::NodeCertificates,
        keys: &[(String, String)],
    ) -> anyhow::Result<Issued> {
        if reply.ca_pem.is_empty() {
            anyhow::bail!("the api sent no CA bundle");
        }
        recover_staged(&self.dir)?;
        let staging = self.dir.join(STAGING_DIR);
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("cannot create {}", staging.display()))?;
        write_file(&staging.join("ca.crt"), reply.ca_pem.as_bytes(), 0o644)?;
        let mut not_after = i64::MAX;
        for (name, key) in keys {
            let cert = reply
                .certificates
                .iter()
                .find(|c| &c.name == name)
                .with_context(|| format!("the api sent no certificate for {name}"))?;
            let files = PemFiles::in_dir(&staging, name);
            write_file(&files.key, key.as_bytes(), 0o600)?;
            write_file(&files.cert, cert.cert_pem.as_bytes(), 0o644)?;
            not_after = not_after.min(cert.not_after);
        }
        // The staged files' names reach the disk before the marker that makes them a set.
        sync_dir(&staging)?;
        write_file(&staging.join(STAGED_COMPLETE), b"", 0o644)?;
        sync_dir(&staging)?;
        recover_staged(&self.dir)?;
        let not_after = UNIX_EPOCH + Duration::from_secs(u64::try_from(not_after).unwrap_or(0));
        let lifetime = not_after
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Ok(Issued {
            trust_domain: reply.trust_domain.clone(),
            not_after,
            lifetime,
        })
    }

    /// Renews the certificates at 2/3 of their lifetime, forever; a failed renewal is retried
    /// every `RENEW_RETRY` (and reported) until it works.
    pub fn spawn_renewal(self: Arc<Self>, first: Issued) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut issued = first;
            loop {
                let wait = (issued.lifetime * 2 / 3).max(Duration::from_secs(1));
                tokio::time::sleep(wait).await;
                loop {
                    match self.renew().await {
                        Ok(next) => {
                            issued = next;
                            break;
                        }
                        Err(e) => {
                            let left = issued
                                .not_after
                                .duration_since(SystemTime::now())
                                .unwrap_or(Duration::ZERO);
                            eprintln!(
                                "ate up: cannot renew node {}'s certificates ({e:#}); they expire in {}s, retrying in {}s",
                                self.node,
                                left.as_secs(),
                                RENEW_RETRY.as_secs()
                            );
                            tokio::time::sleep(RENEW_RETRY).await;
                        }
                    }
                }
            }
        })
    }
}

/// Where a renewal stages its files before moving them into place.
const STAGING_DIR: &str = ".renew";
/// Written last into the staging dir: the staged set is whole.
const STAGED_COMPLETE: &str = "complete";

/// Finishes or drops a renewal staged in `dir/.renew/`: with its `complete` marker every staged
/// file is renamed into `dir` (keys before certificates, the marker last), without it the staged
/// files are removed and `dir` keeps its current set. Idempotent.
fn recover_staged(dir: &Path) -> anyhow::Result<()> {
    let staging = dir.join(STAGING_DIR);
    if !staging.is_dir() {
        return Ok(());
    }
    let complete = staging.join(STAGED_COMPLETE);
    if complete.is_file() {
        let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(&staging)
            .with_context(|| format!("cannot read {}", staging.display()))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            // Not the marker, nor a temporary file of an atomic write.
            .filter(|n| n != STAGED_COMPLETE && !n.to_string_lossy().starts_with('.'))
            .collect();
        // Keys first, then certificates and the CA bundle.
        names.sort_by_key(|n| (!n.to_string_lossy().ends_with(".key"), n.clone()));
        for name in names {
            std::fs::rename(staging.join(&name), dir.join(&name)).with_context(|| {
                format!(
                    "cannot move {} into {}",
                    staging.join(&name).display(),
                    dir.display()
                )
            })?;
        }
        sync_dir(dir)?;
    }
    std::fs::remove_dir_all(&staging)
        .with_context(|| format!("cannot remove {}", staging.display()))?;
    Ok(())
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

/// Atomic write with `mode` (readers never see half a file or a briefly readable key).
fn write_file(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    ate_tls::write_atomic(path, data, mode)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `ate join`: the certificates of a node agent and its workers, kept renewed.
#[derive(clap::Args, Debug)]
pub struct JoinArgs {
    /// api address(es), comma-separated.
    #[arg(long = "join", env = "ATE_JOIN")]
    pub api: String,
    /// The join token (`ate token create`); not needed while the node's certificate is valid.
    #[arg(long, env = "ATE_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// This node's name.
    #[arg(long, env = "ATE_NODE_NAME")]
    pub node_name: String,
    /// Worker ids on this node (each must start with `<node>-`), comma-separated.
    #[arg(long, env = "ATE_WORKER_IDS", value_delimiter = ',')]
    pub workers: Vec<String>,
    /// Where the PEM files go (`node.crt`, `<worker>.crt`, … and `ca.crt`).
    #[arg(long, env = "ATE_TLS_DIR", default_value = "/var/lib/ate/tls")]
    pub dir: PathBuf,
    /// Get the certificates and exit instead of renewing them forever.
    #[arg(long)]
    pub once: bool,
}

pub async fn run(args: JoinArgs) -> anyhow::Result<std::process::ExitCode> {
    let token = args
        .join_token
        .as_deref()
        .map(str::parse::<JoinToken>)
        .transpose()?;
    ate_core::validate_label("--node-name", &args.node_name)?;
    let ids = Arc::new(NodeIdentities {
        api: args.api,
        node: args.node_name,
        workers: args.workers,
        dir: args.dir,
    });
    let issued = ids.obtain(token.as_ref()).await?;
    println!(
        "node {} joined: {} certificates in {} (trust domain {}, valid {}s)",
        ids.node,
        ids.workers.len() + 1,
        ids.dir.display(),
        issued.trust_domain,
        issued.lifetime.as_secs()
    );
    if args.once {
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let renewal = ids.clone().spawn_renewal(issued);
    tokio::select! {
        _ = ate_tls::process::shutdown_signal() => {}
        r = renewal => {
            if let Err(e) = r {
                anyhow::bail!("the renewal task failed: {e}");
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(dir: &Path, complete: bool) {
        let staging = dir.join(STAGING_DIR);
        std::fs::create_dir_all(&staging).unwrap();
        for (name, text) in [
            ("node.key", "new key"),
            ("node.crt", "new cert"),
            ("ca.crt", "new ca"),
            (".node.crt.tmp.1.2", "torn"),
        ] {
            std::fs::write(staging.join(name), text).unwrap();
        }
        if complete {
            std::fs::write(staging.join(STAGED_COMPLETE), "").unwrap();
        }
    }

    fn current(dir: &Path) -> (String, String) {
        (
            std::fs::read_to_string(dir.join("node.key")).unwrap(),
            std::fs::read_to_string(dir.join("node.crt")).unwrap(),
        )
    }

    #[test]
    fn a_renewal_cut_short_keeps_a_matching_set() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("node.key"), "old key").unwrap();
        std::fs::write(dir.path().join("node.crt"), "old cert").unwrap();

        // Killed before the set was whole: the old key and certificate stay.
        staged(dir.path(), false);
        recover_staged(dir.path()).unwrap();
        assert_eq!(current(dir.path()), ("old key".into(), "old cert".into()));
        assert!(!dir.path().join(STAGING_DIR).exists());

        // Killed after it was whole: the new set is moved in, with nothing else.
        staged(dir.path(), true);
        recover_staged(dir.path()).unwrap();
        assert_eq!(current(dir.path()), ("new key".into(), "new cert".into()));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
            "new ca"
        );
        assert!(!dir.path().join(STAGING_DIR).exists());
        assert!(!dir.path().join(".node.crt.tmp.1.2").exists());
        assert!(!dir.path().join(STAGED_COMPLETE).exists());

        // Nothing staged: nothing to do.
        recover_staged(dir.path()).unwrap();
        assert_eq!(current(dir.path()), ("new key".into(), "new cert".into()));
    }
}
