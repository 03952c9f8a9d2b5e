//! `ate api` as a component: its flags ([`ServerConfig`]) and [`run`], which opens the store,
//! builds the TLS, role and join setup from the flags, binds the listeners and serves until
//! shutdown, like `ate_router::run`, `ate_node::run` and `ate_worker::run`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::{Api, ApiConfig, ServeError, TlsServe, authz, join, jwt};

/// The flags of `ate api` (the binary flattens them next to its log flags).
#[derive(clap::Args, Debug, Clone)]
pub struct ServerConfig {
    /// gRPC listen address.
    #[arg(long, default_value = ate_core::DEFAULT_API_ADDR)]
    pub listen: SocketAddr,
    /// `/healthz` and `/metrics` listen address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub http_listen: SocketAddr,
    /// Store URL: `sqlite:///path/ate.db` (embedded) or `postgres://…`.
    #[arg(
        long,
        env = "ATE_STORE",
        default_value = "sqlite:///var/lib/ate/ate.db"
    )]
    pub store: String,
    /// Seconds without a heartbeat before a worker is marked gone.
    #[arg(long, default_value_t = 10)]
    pub heartbeat_timeout_seconds: u64,
    /// Seconds a workflow lease lives without renewal (an api that dies mid-workflow holds its
    /// actors this long).
    #[arg(long, default_value_t = 10)]
    pub lease_ttl_seconds: u64,
    /// This api is the only replica on its store (`ate up` sets it). Then a heartbeat it cannot
    /// record because the store is down still renews the worker's lease: no other replica can
    /// release that worker's actors meanwhile, so its actors keep serving through a store
    /// outage. Never set it when several replicas share the store.
    #[arg(long)]
    pub sole_replica: bool,
    /// Slots used as a cache: when no worker has room for an actor, suspend the least recently
    /// used running actor that has had no request, tunnel, exec session or outbound connection
    /// open for this long (its memory kept) and place the newcomer there (`2s` recommended).
    /// `0`, the default: the newcomer parks and gets the specification's 503 after the budget.
    #[arg(long, env = "ATE_EVICT_IDLE_AFTER", default_value = "0", value_parser = ate_core::duration::parse_duration)]
    pub evict_idle_after: Duration,
    /// How long actor events (`ate get events`: every state change and why) are kept.
    #[arg(long, env = "ATE_EVENT_RETENTION", default_value = "24h", value_parser = ate_core::duration::parse_duration)]
    pub event_retention: Duration,
    /// Write the bound addresses as JSON here once serving (used by `ate up` and tests).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// The api's identity (`--tls-cert/--tls-key/--tls-ca`): gRPC over mTLS with roles, and mTLS
    /// to node agents. Absent: plaintext, and every caller is admin.
    #[command(flatten)]
    pub tls: ate_tls::TlsArgs,
    /// The CA (`ca.crt` and `ca.key`) this api signs joining nodes' certificates with
    /// (JoinService). Its certificate must be in `--tls-ca`. Without it, joins are refused.
    #[arg(long, env = "ATE_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Lifetime of the certificates signed for joining nodes and workers (renewed at 2/3).
    #[arg(long, default_value = "24h", value_parser = ate_core::duration::parse_duration)]
    pub join_cert_lifetime: Duration,
    /// Atespaces of `client` identities: `spiffe://td/ns/x/sa/y=team-a,team-b;spiffe://…=*`.
    /// A client identity not listed has no atespace.
    #[arg(long, env = "ATE_CLIENT_ATESPACES", default_value = "")]
    pub client_atespaces: String,
    /// How callers authenticate: `mtls` (a client certificate on every connection) or `jwt`
    /// (a verified client certificate still works; a connection without one must send
    /// `authorization: Bearer <jwt>`). jwt needs the TLS flags and the three --jwt-* flags.
    #[arg(long, value_enum, default_value_t = AuthMode::Mtls)]
    pub auth_mode: AuthMode,
    /// jwt mode: the required `iss` of bearer tokens.
    #[arg(long, env = "ATE_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// jwt mode: the audience bearer tokens must be for (`aud`).
    #[arg(long, env = "ATE_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// jwt mode: the issuer's public keys (JWKS JSON); re-read when the file changes.
    #[arg(long, env = "ATE_JWT_JWKS_FILE")]
    pub jwt_jwks_file: Option<PathBuf>,
    /// Where actors' alarms are delivered: the router's internal listener, `unix:PATH` (same
    /// machine) or `host:port[,host:port…]` (mTLS with this api's certificate). Unset: alarms
    /// are kept but not delivered by this api (another replica may).
    #[arg(
        long,
        env = "ATE_API_ROUTER_INTERNAL",
        value_name = "unix:PATH|HOST:PORT"
    )]
    pub router_internal: Option<ate_router_client::RouterAddr>,
    /// Ed25519 key (PKCS#8 PEM) that signs actors' identity tokens (`GET /v1/identity?audience=`
    /// inside an actor), created 0600 when missing; `<file>.previous` stays in the JWKS after a
    /// rotation (`ate keys rotate-identity`). Every replica needs the same file. Unset: no
    /// identity tokens, no JWKS.
    #[arg(long, env = "ATE_IDENTITY_KEY")]
    pub identity_key: Option<PathBuf>,
    /// The `iss` of actors' identity tokens. An https URL that serves this api's
    /// `/.well-known/jwks.json` and `/.well-known/openid-configuration` lets cloud workload
    /// identity federation trust them.
    #[arg(long, env = "ATE_IDENTITY_ISSUER", default_value = "ate-api")]
    pub identity_issuer: String,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    Mtls,
    Jwt,
}

/// Why `ate api` could not start or stopped serving. The display texts are those the binary
/// printed before this moved here; the cause is the `source`, printed after them.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Flags that do not go together.
    #[error("{0}")]
    Config(String),
    #[error("cannot open store {url}")]
    Store {
        url: String,
        #[source]
        source: ate_store::StoreError,
    },
    #[error("--ca-dir {dir}: cannot load the CA")]
    Ca {
        dir: PathBuf,
        #[source]
        source: ate_tls::TlsError,
    },
    #[error("cannot read --tls-ca {path}")]
    TrustBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    ReadyFile {
        path: PathBuf,
        #[source]
        source: ate_tls::TlsError,
    },
    #[error(transparent)]
    Tls(#[from] ate_tls::TlsError),
    #[error(transparent)]
    Jwt(#[from] jwt::JwtError),
    #[error(transparent)]
    Authz(#[from] authz::AuthzError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

fn config_error(message: &str) -> RunError {
    RunError::Config(message.to_string())
}

impl ServerConfig {
    /// The bearer-token verifier for `--auth-mode=jwt` (None in mtls mode).
    fn jwt(&self) -> Result<Option<jwt::JwtVerifier>, RunError> {
        let (issuer, audience, jwks) = (&self.jwt_issuer, &self.jwt_audience, &self.jwt_jwks_file);
        if self.auth_mode == AuthMode::Mtls {
            if issuer.is_some() || audience.is_some() || jwks.is_some() {
                return Err(config_error(
                    "--jwt-issuer, --jwt-audience and --jwt-jwks-file need --auth-mode=jwt",
                ));
            }
            return Ok(None);
        }
        let (Some(issuer), Some(audience), Some(jwks)) = (issuer, audience, jwks) else {
            return Err(config_error(
                "--auth-mode=jwt needs --jwt-issuer, --jwt-audience and --jwt-jwks-file",
            ));
        };
        if issuer.is_empty() || audience.is_empty() {
            return Err(config_error(
                "--jwt-issuer and --jwt-audience must not be empty",
            ));
        }
        Ok(Some(jwt::JwtVerifier::new(jwt::JwtConfig {
            issuer: issuer.clone(),
            audience: audience.clone(),
            jwks_file: jwks.clone(),
        })?))
    }

    /// The signer of actors' identity tokens (`--identity-key`), loaded or created.
    fn identity(&self) -> Result<Option<Arc<ate_jwt::issuer::TokenIssuer>>, RunError> {
        let Some(path) = &self.identity_key else {
            return Ok(None);
        };
        if self.identity_issuer.is_empty() {
            return Err(config_error("--identity-issuer must not be empty"));
        }
        let issuer = ate_jwt::issuer::TokenIssuer::load_or_create(path, &self.identity_issuer)
            .map_err(|e| RunError::Config(e.to_string()))?;
        tracing::info!(key = %path.display(), kid = issuer.kid(), issuer = issuer.issuer(), "signing actors' identity tokens");
        Ok(Some(Arc::new(issuer)))
    }

    /// The workflows' settings these flags give.
    fn api_config(
        &self,
        node_tls: Option<Arc<ate_tls::rustls::ClientConfig>>,
        identity: Option<Arc<ate_jwt::issuer::TokenIssuer>>,
    ) -> ApiConfig {
        ApiConfig {
            identity,
            heartbeat_timeout: Duration::from_secs(self.heartbeat_timeout_seconds.max(1)),
            lease_ttl: Duration::from_secs(self.lease_ttl_seconds.max(1)),
            node_tls,
            sole_replica: self.sole_replica,
            evict_idle_after: self.evict_idle_after,
            event_retention: self.event_retention,
            ..Default::default()
        }
    }
}

/// The CA in `dir` as the api's join signer, refusing a CA of another trust domain.
fn join_signer(dir: &Path, td: &str, lifetime: Duration) -> Result<join::Signer, RunError> {
    // A Kubernetes Secret volume of a non-root pod is group-readable (root:<fsGroup>, 0440).
    let ca = ate_tls::LocalCa::open_mounted(dir).map_err(|source| RunError::Ca {
        dir: dir.to_path_buf(),
        source,
    })?;
    if ca.trust_domain() != td {
        return Err(RunError::Config(format!(
            "--ca-dir {}: the CA belongs to trust domain {}, the api to {td}",
            dir.display(),
            ca.trust_domain()
        )));
    }
    if lifetime < Duration::from_secs(60) {
        return Err(config_error("--join-cert-lifetime must be at least 60s"));
    }
    Ok(join::Signer { ca, lifetime })
}

/// The `--tls-ca` bundle as text (what a joining machine checks against its token's pin).
fn trust_bundle(tls: &ate_tls::TlsArgs) -> Result<String, RunError> {
    let Some(files) = tls.files()? else {
        return Ok(String::new());
    };
    std::fs::read_to_string(&files.ca).map_err(|source| RunError::TrustBundle {
        path: files.ca.clone(),
        source,
    })
}

/// Hides a password in a store URL for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Runs the api until `shutdown` resolves: opens the store, binds `--listen` (gRPC) and
/// `--http-listen` (`/healthz`, `/metrics`), writes `--ready-file`, and serves
/// ([`crate::serve_with`]).
pub async fn run(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let store = ate_store::open(&config.store)
        .await
        .map_err(|source| RunError::Store {
            url: config.store.clone(),
            source,
        })?;
    let td = config.tls.trust_domain().to_string();
    let source = config.tls.load("api")?;
    // Checked before the JWKS is read: the flags are wrong whatever the file holds.
    if source.is_none() && config.auth_mode == AuthMode::Jwt {
        // Plaintext would both leak the tokens and make every caller admin.
        return Err(config_error(
            "--auth-mode=jwt needs TLS: --tls-cert, --tls-key and --tls-ca",
        ));
    }
    if source.is_none() && config.ca_dir.is_some() {
        return Err(config_error(
            "--ca-dir needs TLS: --tls-cert, --tls-key and --tls-ca",
        ));
    }
    let jwt = config.jwt()?;
    let (node_tls, serve_tls) = match &source {
        Some(src) => {
            // Any node agent: the shared `…/sa/ate-node` or a per-node `…/sa/ate-node-<name>`.
            let node = ate_tls::client_config(
                src,
                ate_tls::ServerCheck::NodeAgent {
                    trust_domain: td.clone(),
                },
            )?;
            let allowed = ate_tls::AllowList::any();
            let signer = match &config.ca_dir {
                Some(dir) => Some(Arc::new(join_signer(dir, &td, config.join_cert_lifetime)?)),
                None => None,
            };
            // A joining machine has no certificate yet: it may connect without one, and then
            // reach nothing but JoinService (every other RPC needs an identity).
            let client_auth = if jwt.is_some() || signer.is_some() {
                ate_tls::ClientAuth::Optional { allowed }
            } else {
                ate_tls::ClientAuth::Required { allowed }
            };
            let server = ate_tls::server_config(src, client_auth)?;
            let mut authz = authz::Authz::new(&td, &config.client_atespaces)?;
            if let Some(verifier) = jwt {
                authz = authz.with_jwt(verifier);
            }
            (
                Some(Arc::new(node)),
                Some(TlsServe {
                    server: Arc::new(server),
                    authz,
                    trust_bundle: trust_bundle(&config.tls)?,
                    join_signer: signer,
                }),
            )
        }
        None => (None, None),
    };
    let identity = config.identity()?;
    let api = Arc::new(Api::new(store, config.api_config(node_tls, identity)));
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::Listen { addr, source })
    };
    let grpc = bind(config.listen).await?;
    let http = bind(config.http_listen).await?;
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.local_addr()?;
    if let Some(file) = &config.ready_file {
        let body =
            serde_json::json!({ "grpc": grpc_addr.to_string(), "http": http_addr.to_string() });
        ate_tls::process::write_ready_file(file, &body.to_string()).map_err(|source| {
            RunError::ReadyFile {
                path: file.clone(),
                source,
            }
        })?;
    }
    tracing::info!(grpc = %grpc_addr, http = %http_addr, store = %redact(&config.store), tls = serve_tls.is_some(), auth_mode = ?config.auth_mode, "api serving");
    let (stop_alarms, alarms_stopped) = tokio::sync::watch::channel(false);
    let alarms = match &config.router_internal {
        Some(addr) => {
            let router = ate_router_client::RouterClient::new(addr.clone(), source.as_ref(), &td)
                .map_err(|e| RunError::Config(e.to_string()))?;
            tracing::info!(router = %addr, "delivering actors' alarms");
            Some(tokio::spawn(
                api.clone().deliver_alarms(router, alarms_stopped),
            ))
        }
        None => {
            tracing::warn!("no --router-internal: this api delivers no alarms");
            None
        }
    };
    let served = crate::serve_with(api, grpc, Some(http), serve_tls, shutdown).await;
    let _ = stop_alarms.send(true);
    if let Some(task) = alarms {
        task.abort();
    }
    served?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        api: ServerConfig,
    }

    fn parse(args: &[&str]) -> Result<ServerConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("api").chain(args.iter().copied())).map(|c| c.api)
    }

    /// The config of an api on `store` listening on free loopback ports, with `more` flags.
    fn on_loopback(store: &str, more: &[&str]) -> ServerConfig {
        let listen = ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"];
        let args: Vec<&str> = ["--store", store]
            .into_iter()
            .chain(listen)
            .chain(more.iter().copied())
            .collect();
        parse(&args).unwrap()
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact("sqlite:///var/lib/ate/ate.db"),
            "sqlite:///var/lib/ate/ate.db"
        );
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.listen.to_string(), ate_core::DEFAULT_API_ADDR);
        assert_eq!(c.http_listen.to_string(), "127.0.0.1:9090");
        assert_eq!(c.join_cert_lifetime, Duration::from_secs(24 * 3600));
        assert_eq!(c.auth_mode, AuthMode::Mtls);
        let api = c.api_config(None, None);
        assert_eq!(api.heartbeat_timeout, Duration::from_secs(10));
        assert_eq!(api.lease_ttl, Duration::from_secs(10));
        assert!(!api.sole_replica);
        // Zero would expire every worker and lease at once: at least a second.
        let c = parse(&[
            "--heartbeat-timeout-seconds",
            "0",
            "--lease-ttl-seconds",
            "0",
        ])
        .unwrap();
        assert_eq!(c.api_config(None, None).lease_ttl, Duration::from_secs(1));
        assert_eq!(
            c.api_config(None, None).heartbeat_timeout,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn jwt_flags_must_go_together() {
        let message = |args: &[&str]| match parse(args).unwrap().jwt() {
            Err(e) => e.to_string(),
            Ok(v) => format!("ok: {}", v.is_some()),
        };
        assert_eq!(message(&[]), "ok: false");
        assert_eq!(
            message(&["--jwt-issuer", "i"]),
            "--jwt-issuer, --jwt-audience and --jwt-jwks-file need --auth-mode=jwt"
        );
        assert_eq!(
            message(&["--auth-mode", "jwt", "--jwt-issuer", "i"]),
            "--auth-mode=jwt needs --jwt-issuer, --jwt-audience and --jwt-jwks-file"
        );
        assert_eq!(
            message(&[
                "--auth-mode",
                "jwt",
                "--jwt-issuer",
                "",
                "--jwt-audience",
                "a",
                "--jwt-jwks-file",
                "/nonexistent"
            ]),
            "--jwt-issuer and --jwt-audience must not be empty"
        );
    }

    #[tokio::test]
    async fn refuses_jwt_without_tls_before_binding() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, r#"{"keys":[]}"#).unwrap();
        let store = format!("sqlite://{}/ate.db", dir.path().display());
        let jwks = jwks.display().to_string();
        let config = on_loopback(
            &store,
            &[
                "--auth-mode",
                "jwt",
                "--jwt-issuer",
                "i",
                "--jwt-audience",
                "a",
                "--jwt-jwks-file",
                &jwks,
            ],
        );
        let e = run(config, std::future::ready(())).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "--auth-mode=jwt needs TLS: --tls-cert, --tls-key and --tls-ca"
        );
    }

    #[tokio::test]
    async fn serves_writes_the_ready_file_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("sqlite://{}/ate.db", dir.path().display());
        let ready = dir.path().join("ready.json");
        let ready_arg = ready.display().to_string();
        let config = on_loopback(&store, &["--ready-file", &ready_arg]);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(config, async move {
            let _ = stop_rx.await;
        }));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let addrs: serde_json::Value = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break serde_json::from_str(&text).unwrap();
            }
            assert!(tokio::time::Instant::now() < deadline, "no ready file");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let grpc: SocketAddr = addrs["grpc"].as_str().unwrap().parse().unwrap();
        let http: SocketAddr = addrs["http"].as_str().unwrap().parse().unwrap();
        assert_ne!(grpc.port(), 0);
        tokio::net::TcpStream::connect(grpc).await.unwrap();
        tokio::net::TcpStream::connect(http).await.unwrap();
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("stops on shutdown")
            .unwrap()
            .unwrap();
    }
}
