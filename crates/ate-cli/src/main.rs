//! `ate`: one binary for every component (`ate api`, `ate up`, …) and the client verbs.
//! Also works when installed as `kubectl-ate`.

mod bench;
mod ca;
mod client;
mod faults;
mod join;
mod logs;
mod plot;
mod proxy;
mod render;
mod serve;
mod token;
mod up;
mod verbs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "ate",
    version,
    about = "Agent Substrate: suspend idle actors, resume them on the next request"
)]
struct Cli {
    /// api address (host:port). Default: the address `ate up` wrote, else 127.0.0.1:7443.
    #[arg(long, global = true, env = "ATE_API")]
    api: Option<String>,
    /// Client certificate for the api (PEM). Default: the admin certificate `ate up` wrote.
    #[arg(long, global = true, env = "ATE_CERT")]
    cert: Option<PathBuf>,
    /// Private key of --cert.
    #[arg(long, global = true, env = "ATE_KEY")]
    key: Option<PathBuf>,
    /// CA bundle the api's certificate must chain to.
    #[arg(long, global = true, env = "ATE_CA")]
    ca: Option<PathBuf>,
    /// Bearer token (JWT) for an api in `--auth-mode=jwt`; sent only over TLS (with --ca). The
    /// admin certificate `ate up` wrote is then not used.
    #[arg(long, global = true, env = "ATE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// With --token and no client certificate: trust domain of the api's pinned SPIFFE ID.
    #[arg(long, global = true, env = "ATE_API_TRUST_DOMAIN", default_value = ate_tls::DEFAULT_TRUST_DOMAIN)]
    api_trust_domain: String,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

#[derive(Subcommand)]
enum Command {
    /// Run the control plane (gRPC api).
    Api(serve::ApiArgs),
    /// Run the router (ingress): names → actors, parking, tunnels to workers.
    Router(serve::RouterArgs),
    /// Run the node agent (one per machine).
    Node(serve::NodeArgs),
    /// Run a worker (hosts many actors' sandboxes and their atunnel).
    Worker(serve::WorkerArgs),
    /// Start the whole system on this machine (api, node, workers, router) with a demo template.
    Up(up::UpArgs),
    /// Create or update ActorTemplates and Atespaces from a YAML file (multi-document).
    Apply {
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Create an atespace, actor or tag.
    #[command(subcommand)]
    Create(verbs::CreateCmd),
    /// Show actors, atespaces, templates, workers or tags.
    #[command(subcommand)]
    Get(verbs::GetCmd),
    /// Change an actor's worker selector.
    #[command(subcommand)]
    Update(verbs::UpdateCmd),
    /// Resume an actor (wakes it on a worker with room).
    #[command(subcommand)]
    Resume(verbs::ActorCmd),
    /// Suspend an actor to a snapshot.
    #[command(subcommand)]
    Suspend(verbs::SuspendCmd),
    /// Return a CRASHED actor to SUSPENDED.
    #[command(subcommand)]
    Revert(verbs::ActorCmd),
    /// Print an actor's output (stdout and stderr), across suspends with -f.
    #[command(subcommand)]
    Logs(logs::LogsCmd),
    /// Forward a local port to an actor through the router (adds the ate-target-actor header).
    Proxy(proxy::ProxyArgs),
    /// Delete an actor, atespace, template or tag.
    #[command(subcommand)]
    Delete(verbs::DeleteCmd),
    /// The fleet's CA and certificates for control-plane identities (api, router, admin).
    #[command(subcommand)]
    Ca(ca::CaCmd),
    /// Get this machine's node and worker certificates with a join token and keep renewing them
    /// (for node agents run by systemd or Kubernetes; `ate up --role node` does this itself).
    Join(join::JoinArgs),
    /// Join tokens for machines joining the fleet (`ate up --role node --join … --token …`).
    #[command(subcommand)]
    Token(token::TokenCmd),
    /// Measure a running system through its router (tables on stdout, JSON to --out).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

fn main() -> ExitCode {
    ate_tls::install_crypto_provider();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let out = cli.output;
    let api = cli.api;
    let tls = client::ClientTls {
        cert: cli.cert,
        key: cli.key,
        ca: cli.ca,
        token: cli.token,
        trust_domain: cli.api_trust_domain,
    };
    match cli.command {
        Command::Api(args) => serve::run_api(args).await.map(|_| ExitCode::SUCCESS),
        Command::Router(args) => serve::run_router(args).await.map(|_| ExitCode::SUCCESS),
        Command::Node(args) => serve::run_node(args).await.map(|_| ExitCode::SUCCESS),
        Command::Worker(args) => serve::run_worker(args).await.map(|_| ExitCode::SUCCESS),
        Command::Up(args) => up::run(args).await,
        Command::Apply { file } => {
            verbs::apply(&client::connect(api, &tls).await?, &file, out).await
        }
        Command::Create(cmd) => verbs::create(&client::connect(api, &tls).await?, cmd, out).await,
        Command::Get(cmd) => verbs::get(&client::connect(api, &tls).await?, cmd, out).await,
        Command::Update(cmd) => verbs::update(&client::connect(api, &tls).await?, cmd, out).await,
        Command::Resume(cmd) => verbs::resume(&client::connect(api, &tls).await?, cmd, out).await,
        Command::Suspend(cmd) => verbs::suspend(&client::connect(api, &tls).await?, cmd, out).await,
        Command::Revert(cmd) => verbs::revert(&client::connect(api, &tls).await?, cmd, out).await,
        Command::Logs(cmd) if logs::is_local(&cmd) => {
            logs::run(cmd).await.map(|_| ExitCode::SUCCESS)
        }
        Command::Logs(cmd) => logs::run_remote(&client::connect(api, &tls).await?, cmd)
            .await
            .map(|_| ExitCode::SUCCESS),
        Command::Proxy(args) => proxy::run(args).await.map(|_| ExitCode::SUCCESS),
        Command::Delete(cmd) => verbs::delete(&client::connect(api, &tls).await?, cmd).await,
        Command::Ca(cmd) => ca::run(cmd),
        Command::Join(args) => join::run(args).await,
        Command::Token(cmd) => token::run(&client::connect(api, &tls).await?, cmd, out).await,
        // Starts its own system: no api to connect to first.
        Command::Bench(bench::BenchCmd::Faults(args)) => faults::run(args).await,
        Command::Bench(cmd) => bench::run(client::connect(api, &tls).await?, cmd).await,
    }
}
