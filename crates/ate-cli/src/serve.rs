//! The component subcommands (`ate api`, `ate router`, `ate node`, `ate worker`): their flags, logging
//! and the signal that stops them; each component's own work is its crate's `run(config, shutdown)`.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;

use crate::otel;
use ate_cmd::SELF_EXE;

#[derive(Args, Debug)]
pub struct ApiArgs {
    #[command(flatten)]
    pub config: ate_api::ServerConfig,
    #[command(flatten)]
    pub log: LogArgs,
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
    install: fn() -> &'static ate_telemetry::PrometheusHandle,
) -> anyhow::Result<SocketAddr> {
    install();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-listen {addr}: cannot listen"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(ate_telemetry::serve(listener, std::future::pending::<()>()));
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
        // Awaited outside the log macro: a disabled level (`RUST_LOG=warn`) skips the macro's
        // arguments, and the component would stop as soon as it started.
        let which = signal.await;
        tracing::info!("{which}");
    }
}

/// The end of a component's run: its error, or a log line that `what` stopped and its traces
/// flushed.
async fn stopped<E>(traces: otel::Tracing, what: &str, ran: Result<(), E>) -> anyhow::Result<()>
where
    anyhow::Error: From<E>,
{
    ran?;
    tracing::info!("{what} stopped");
    traces.shutdown().await;
    Ok(())
}

pub async fn run_api(args: ApiArgs) -> anyhow::Result<()> {
    let mut traces = init_logging(args.log.json(), Some("ate-api"));
    traces.export_metrics("ate-api", ate_api::metrics::install);
    let ran = ate_api::run(args.config, component_shutdown()).await;
    stopped(traces, "api", ran).await
}

#[derive(Args, Debug)]
pub struct RouterArgs {
    #[command(flatten)]
    pub config: ate_router::RouterConfig,
    #[command(flatten)]
    pub log: LogArgs,
}

pub async fn run_router(args: RouterArgs) -> anyhow::Result<()> {
    let mut traces = init_logging(args.log.json(), Some("ate-router"));
    traces.export_metrics("ate-router", ate_router::metrics::prometheus);
    tracing::info!(
        listen = %args.config.listen,
        api = %args.config.api,
        mode = ?args.config.mode,
        namespace = %args.config.namespace,
        preview = ?args.config.preview.0,
        "router starting"
    );
    let ran = ate_router::run(args.config, component_shutdown()).await;
    stopped(traces, "router", ran).await
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
    let mut traces = init_logging(args.log.json(), Some("ate-node"));
    traces.export_metrics("ate-node", ate_node::metrics::install);
    let mut shutdown = Box::pin(component_shutdown());
    // The state dir's node lock before anything else, the metrics port included: an earlier
    // node agent still stopping holds both.
    let lock = tokio::select! {
        lock = ate_node::lock_identity(&args.config) => lock?,
        () = &mut shutdown => return stopped(traces, "node agent", anyhow::Ok(())).await,
    };
    if let Some(addr) = args.metrics_listen {
        let bound = serve_metrics(addr, ate_node::metrics::install).await?;
        tracing::info!(metrics = %bound, "node agent metrics serving");
    }
    let ran = ate_node::run_locked(args.config, lock, shutdown).await;
    stopped(traces, "node agent", ran).await
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
    let mut traces = init_logging(
        args.log.json(),
        Some("ate-worker").filter(|_| !args.config.remove_leftovers),
    );
    if !args.config.remove_leftovers {
        traces.export_metrics("ate-worker", ate_worker::metrics::install);
    }
    let mut shutdown = Box::pin(component_shutdown());
    // The worker's identity lock before anything else, the metrics port included: an earlier
    // process of this worker still stopping (finishing a checkpoint) holds both.
    let lock = tokio::select! {
        lock = ate_worker::lock_identity(&args.config) => lock?,
        () = &mut shutdown => return stopped(traces, "worker", anyhow::Ok(())).await,
    };
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
    config.log_relay = Some(vec![SELF_EXE.to_string(), "log-relay".to_string()]);
    // Lazy memory restores are served by `ate page-source` (this executable again).
    config.page_source = Some(vec![SELF_EXE.to_string(), "page-source".to_string()]);
    let ran = ate_worker::run_locked(config, lock, shutdown).await;
    stopped(traces, "worker", ran).await
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
