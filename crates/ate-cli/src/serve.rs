//! `ate api`: the control-plane server process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::otel;

#[derive(Args, Debug)]
pub struct ApiArgs {
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
    /// Write the bound addresses as JSON here once serving (used by `ate up` and tests).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    #[command(flatten)]
    pub log: LogArgs,
    /// The api's identity (`--tls-cert/--tls-key/--tls-ca`): gRPC over mTLS with roles, and mTLS
    /// to node agents. Absent: plaintext, and every caller is admin.
    #[command(flatten)]
    pub tls: ate_tls::TlsArgs,
    /// The CA (`ca.crt` and `ca.key`) this api signs joining nodes' certificates with
    /// (JoinService). Its certificate must be in `--tls-ca`. Without it, joins are refused.
    #[arg(long, env = "ATE_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Lifetime of the certificates signed for joining nodes and workers (renewed at 2/3).
    #[arg(long, default_value = "24h", value_parser = ate_router::config::parse_duration)]
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
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    Mtls,
    Jwt,
}

impl ApiArgs {
    /// The bearer-token verifier for `--auth-mode=jwt` (None in mtls mode).
    fn jwt(&self) -> anyhow::Result<Option<ate_api::jwt::JwtVerifier>> {
        let (issuer, audience, jwks) = (&self.jwt_issuer, &self.jwt_audience, &self.jwt_jwks_file);
        if self.auth_mode == AuthMode::Mtls {
            if issuer.is_some() || audience.is_some() || jwks.is_some() {
                anyhow::bail!(
                    "--jwt-issuer, --jwt-audience and --jwt-jwks-file need --auth-mode=jwt"
                );
            }
            return Ok(None);
        }
        let (Some(issuer), Some(audience), Some(jwks)) = (issuer, audience, jwks) else {
            anyhow::bail!("--auth-mode=jwt needs --jwt-issuer, --jwt-audience and --jwt-jwks-file");
        };
        if issuer.is_empty() || audience.is_empty() {
            anyhow::bail!("--jwt-issuer and --jwt-audience must not be empty");
        }
        Ok(Some(ate_api::jwt::JwtVerifier::new(
            ate_api::jwt::JwtConfig {
                issuer: issuer.clone(),
                audience: audience.clone(),
                jwks_file: jwks.clone(),
            },
        )?))
    }
}

/// How a component writes its log lines (stderr).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Plain text; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// `--log-format` (and its older spelling `--log-json`) of every component.
#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log line format: `text` (plain, coloured only at a terminal) or `json` (JSON lines).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The same as `--log-format json`.
    #[arg(long)]
    pub log_json: bool,
}

impl LogArgs {
    pub fn json(&self) -> bool {
        self.log_json || self.log_format == LogFormat::Json
    }
}

/// Serves `/metrics` and `/healthz` on `addr` for the rest of the process, with `install`'s
/// recorder (a component's `metrics::install`); returns the bound address.
async fn serve_metrics(
    addr: SocketAddr,
    install: fn() -> &'static ate_tls::telemetry::PrometheusHandle,
) -> anyhow::Result<SocketAddr> {
    install();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-listen {addr}: cannot listen"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(ate_tls::telemetry::serve(
        listener,
        std::future::pending::<()>(),
    ));
    Ok(bound)
}

/// Logging to stderr, and the OpenTelemetry traces of `component` (None: a run that serves
/// nothing) when the `OTEL_*` variables ask for them (`crate::otel`); the caller shuts the
/// returned [`otel::Tracing`] down last.
pub fn init_logging(json: bool, component: Option<&'static str>) -> otel::Tracing {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: `ate up` writes each component's stderr to a log
    // file, where escape codes would only get in the way of grep and log shippers.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let (traces, tracing, notice) = match component {
        Some(component) => otel::layer(component),
        None => (None, otel::Tracing::off(), None),
    };
    // A second init (tests) is harmless.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(traces)
        .with(fmt)
        .try_init();
    match notice {
        Some(otel::Notice::Exporting(how)) => tracing::info!("{how}"),
        Some(otel::Notice::Refused(why)) => tracing::warn!("{why}"),
        None => {}
    }
    tracing
}

/// SIGINT or SIGTERM ([`ate_tls::process::shutdown_signal`]) for a component: logs which one
/// stopped it.
fn component_shutdown() -> impl Future<Output = ()> + Send + 'static {
    let signal = ate_tls::process::shutdown_signal();
    async move {
        tracing::info!("{}", signal.await);
    }
}

/// The CA in `dir` as the api's join signer, refusing a CA of another trust domain.
fn join_signer(
    dir: &std::path::Path,
    td: &str,
    lifetime: Duration,
) -> anyhow::Result<ate_api::join::Signer> {
    // A Kubernetes Secret volume of a non-root pod is group-readable (root:<fsGroup>, 0440).
    let ca = ate_tls::LocalCa::open_mounted(dir)
        .with_context(|| format!("--ca-dir {}: cannot load the CA", dir.display()))?;
    if ca.trust_domain() != td {
        anyhow::bail!(
            "--ca-dir {}: the CA belongs to trust domain {}, the api to {td}",
            dir.display(),
            ca.trust_domain()
        );
    }
    if lifetime < Duration::from_secs(60) {
        anyhow::bail!("--join-cert-lifetime must be at least 60s");
    }
    Ok(ate_api::join::Signer { ca, lifetime })
}

/// The `--tls-ca` bundle as text (what a joining machine checks against its token's pin).
fn trust_bundle(tls: &ate_tls::TlsArgs) -> anyhow::Result<String> {
    let Some(files) = tls.files()? else {
        return Ok(String::new());
    };
    std::fs::read_to_string(&files.ca)
        .with_context(|| format!("cannot read --tls-ca {}", files.ca.display()))
}

pub async fn run_api(args: ApiArgs) -> anyhow::Result<()> {
    let traces = init_logging(args.log.json(), Some("ate-api"));
    let store = ate_store::open(&args.store)
        .await
        .with_context(|| format!("cannot open store {}", args.store))?;
    let td = args.tls.trust_domain().to_string();
    let jwt = args.jwt()?;
    let source = args.tls.load("api")?;
    if source.is_none() && jwt.is_some() {
        // Plaintext would both leak the tokens and make every caller admin.
        anyhow::bail!("--auth-mode=jwt needs TLS: --tls-cert, --tls-key and --tls-ca");
    }
    if source.is_none() && args.ca_dir.is_some() {
        anyhow::bail!("--ca-dir needs TLS: --tls-cert, --tls-key and --tls-ca");
    }
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
            let signer = match &args.ca_dir {
                Some(dir) => Some(Arc::new(join_signer(dir, &td, args.join_cert_lifetime)?)),
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
            let mut authz = ate_api::authz::Authz::new(&td, &args.client_atespaces)?;
            if let Some(verifier) = jwt {
                authz = authz.with_jwt(verifier);
            }
            (
                Some(Arc::new(node)),
                Some(ate_api::TlsServe {
                    server: Arc::new(server),
                    authz,
                    trust_bundle: trust_bundle(&args.tls)?,
                    join_signer: signer,
                }),
            )
        }
        None => (None, None),
    };
    let cfg = ate_api::ApiConfig {
        heartbeat_timeout: Duration::from_secs(args.heartbeat_timeout_seconds.max(1)),
        lease_ttl: Duration::from_secs(args.lease_ttl_seconds.max(1)),
        node_tls,
        sole_replica: args.sole_replica,
        ..Default::default()
    };
    let api = Arc::new(ate_api::Api::new(store, cfg));
    let grpc = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let http = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.http_listen))?;
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.local_addr()?;
    if let Some(file) = &args.ready_file {
        let body =
            serde_json::json!({ "grpc": grpc_addr.to_string(), "http": http_addr.to_string() });
        write_atomically(file, &body.to_string())?;
    }
    tracing::info!(grpc = %grpc_addr, http = %http_addr, store = %redact(&args.store), tls = serve_tls.is_some(), auth_mode = ?args.auth_mode, "api serving");
    ate_api::serve_with(api, grpc, Some(http), serve_tls, component_shutdown()).await?;
    tracing::info!("api stopped");
    traces.shutdown().await;
    Ok(())
}

#[derive(Args, Debug)]
pub struct RouterArgs {
    #[command(flatten)]
    pub config: ate_router::RouterConfig,
    #[command(flatten)]
    pub log: LogArgs,
}

pub async fn run_router(args: RouterArgs) -> anyhow::Result<()> {
    let traces = init_logging(args.log.json(), Some("ate-router"));
    tracing::info!(listen = %args.config.listen, api = %args.config.api, "router starting");
    ate_router::run(args.config, component_shutdown()).await?;
    tracing::info!("router stopped");
    traces.shutdown().await;
    Ok(())
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    #[command(flatten)]
    pub config: ate_node::NodeConfig,
    /// Serve `/metrics` (Prometheus) and `/healthz` on this address. Off when absent.
    #[arg(long, env = "ATE_NODE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub log: LogArgs,
}

pub async fn run_node(args: NodeArgs) -> anyhow::Result<()> {
    let traces = init_logging(args.log.json(), Some("ate-node"));
    if let Some(addr) = args.metrics_listen {
        let bound = serve_metrics(addr, ate_node::metrics::install).await?;
        tracing::info!(metrics = %bound, "node agent metrics serving");
    }
    ate_node::run(args.config, component_shutdown()).await?;
    tracing::info!("node agent stopped");
    traces.shutdown().await;
    Ok(())
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub config: ate_worker::WorkerConfig,
    /// Serve `/metrics` (Prometheus) and `/healthz` on this address. Off when absent.
    #[arg(long, env = "ATE_WORKER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub log: LogArgs,
}

pub async fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    // A `--remove-leftovers` run serves nothing and has nothing to trace.
    let traces = init_logging(
        args.log.json(),
        Some("ate-worker").filter(|_| !args.config.remove_leftovers),
    );
    // Not for `--remove-leftovers`, a clean-up run that serves nothing.
    if let Some(addr) = args
        .metrics_listen
        .filter(|_| !args.config.remove_leftovers)
    {
        let bound = serve_metrics(addr, ate_worker::metrics::install).await?;
        tracing::info!(metrics = %bound, "worker metrics serving");
    }
    let mut config = args.config;
    // Actor output goes through `ate log-relay` (this executable, as the kernel keeps it):
    // every line stamped with its time, for `ate logs --since/--timestamps`.
    config.log_relay = Some(vec!["/proc/self/exe".to_string(), "log-relay".to_string()]);
    // Lazy memory restores are served by `ate page-source` (this executable again).
    config.page_source = Some(vec![
        "/proc/self/exe".to_string(),
        "page-source".to_string(),
    ]);
    ate_worker::run(config, component_shutdown()).await?;
    tracing::info!("worker stopped");
    traces.shutdown().await;
    Ok(())
}

/// Hides a password in a store URL for logs.
fn redact(url: &str) -> String {
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

/// Replaces `path` with `body` whole ([`ate_tls::process::write_ready_file`]: ready files and
/// the small state files other processes read).
pub fn write_atomically(path: &std::path::Path, body: &str) -> anyhow::Result<()> {
    ate_tls::process::write_ready_file(path, body)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `ate log-relay`: copies stdin to stdout, each line prefixed with the time its first byte
/// arrived (`ate_core::log_line`). The worker runs it with a container's output pipe on stdin
/// and the actor's log (append) on stdout; it ends at EOF. Synchronous and unbuffered: each
/// chunk is written as soon as it is read, so `ate logs -f` sees output at once.
pub fn log_relay() -> std::io::Result<()> {
    use std::io::{Read, Write};
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = Vec::with_capacity(buf.len() + 256);
    let mut at_line_start = true;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return output.flush(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.clear();
        let stamp = ate_core::log_line::prefix(std::time::SystemTime::now());
        for &b in &buf[..n] {
            if at_line_start {
                out.extend_from_slice(stamp.as_bytes());
                at_line_start = false;
            }
            out.push(b);
            if b == b'\n' {
                at_line_start = true;
            }
        }
        output.write_all(&out)?;
        output.flush()?;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(
            super::redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            super::redact("sqlite:///var/lib/ate/ate.db"),
            "sqlite:///var/lib/ate/ate.db"
        );
    }
}
