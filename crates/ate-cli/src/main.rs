//! `ate`: one binary for every component (`ate api`, `ate up`, …) and the client verbs.
//! Also works when installed as `kubectl-ate`.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod bench;
mod ca;
mod client;
mod contexts;
mod cp;
mod events;
mod exec;
mod join;
mod keys;
mod logs;
mod otel;
mod proxy;
mod render;
mod serve;
mod token;
mod top;
mod up;
mod verbs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "ate",
    version,
    about = "Agent Substrate: suspend idle actors, resume them on the next request"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// How a client verb reaches the api. Declared `global` so that the verb's subcommands take them
// too (`ate get actors --api X`); `command()` also adds them to the root, not global there, so
// that `ate --api X get actors` works while the servers' `--help` does not list them. (Plain
// comments: a doc comment here would become the `about` of every command that flattens it.)
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Connection to the api")]
struct ApiFlags {
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
}

impl ApiFlags {
    async fn connect(self) -> anyhow::Result<client::Clients> {
        let tls = client::ClientTls {
            cert: self.cert,
            key: self.key,
            ca: self.ca,
            token: self.token,
            trust_domain: self.api_trust_domain,
        };
        client::connect(self.api, &tls).await
    }
}

// `-o`, for the verbs that print api objects (global, and on the root, like `ApiFlags`).
#[derive(Args, Clone, Copy, Debug)]
struct OutputFlag {
    /// Output format; `wide` is the table with more columns (`get actors`: LAST ERROR).
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
}

// An api verb: its subcommand, then `-o` and the connection flags. (No doc comment, as for
// `ApiFlags`: it would become the `about` of every verb.)
#[derive(Args, Debug)]
struct Verb<C: Subcommand> {
    #[command(subcommand)]
    cmd: C,
    #[command(flatten)]
    out: OutputFlag,
    #[command(flatten)]
    api: ApiFlags,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
}

impl Format {
    /// Table or wide: output for a person rather than a program.
    pub fn is_table(self) -> bool {
        matches!(self, Format::Table | Format::Wide)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the control plane (gRPC api).
    Api(serve::ApiArgs),
    /// Internal: copies a container's output into its log, stamping each line (run by workers).
    #[command(hide = true)]
    LogRelay,
    /// Internal: serves a lazily restored actor's memory pages (run by workers, one per lazy
    /// restore, with the worker's report socket as fd 3).
    #[command(hide = true)]
    PageSource {
        /// The generation being restored (its manifest holds the chunk digests).
        #[arg(long)]
        generation: std::path::PathBuf,
        /// The restore's work dir, where CRIU connects to `lazy-pages.socket`.
        #[arg(long)]
        work_dir: std::path::PathBuf,
        /// Place pages write-protected and stay once all are in, so the next dump can leave
        /// unwritten pages to this generation (CRIU restores with `lazy-pages-wp`).
        #[arg(long)]
        write_protect: bool,
    },
    /// Run the router (ingress): names → actors, parking, tunnels to workers.
    Router(serve::RouterArgs),
    /// Run the node agent (one per machine).
    Node(serve::NodeArgs),
    /// Run a worker (hosts many actors' sandboxes and their atunnel).
    Worker(serve::WorkerArgs),
    /// Start the whole system on this machine (api, node, workers, router) with a demo template.
    Up(up::UpArgs),
    /// Create or update ActorTemplates and Atespaces from a YAML file (multi-document); prints
    /// `created`, `configured` (changed) or `unchanged` for each.
    Apply {
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        #[command(flatten)]
        out: OutputFlag,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// Create an atespace, actor or tag.
    Create(Verb<verbs::CreateCmd>),
    /// Show actors, atespaces, templates, workers, tags or an actor's generations.
    Get(Verb<verbs::GetCmd>),
    /// Change an actor's worker selector.
    Update(Verb<verbs::UpdateCmd>),
    /// Resume an actor (wakes it on a worker with room).
    Resume(Verb<verbs::ActorCmd>),
    /// Suspend an actor to a snapshot.
    Suspend(Verb<verbs::SuspendCmd>),
    /// Return a CRASHED actor to SUSPENDED, optionally at a chosen generation.
    Revert(Verb<verbs::RevertCmd>),
    /// Print an actor's output (stdout and stderr), across suspends with -f.
    Logs {
        #[command(subcommand)]
        cmd: logs::LogsCmd,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// Run a command in an actor's sandbox (kubectl exec's conventions; the exit code is the
    /// command's).
    Exec {
        #[command(flatten)]
        exec: exec::ExecArgs,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// Copy files and directories into or out of an actor's sandbox (kubectl cp's syntax:
    /// `FILE ATESPACE/NAME:PATH` and back; a tar stream over exec).
    Cp {
        #[command(flatten)]
        cp: cp::CpArgs,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// What running actors use now: CPU, memory, uptime (kubectl top's look).
    Top {
        #[command(subcommand)]
        cmd: top::TopCmd,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// Forward a local port to an actor through the router (adds the ate-target-actor header).
    Proxy(proxy::ProxyArgs),
    /// Delete an actor, atespace, template or tag.
    Delete {
        #[command(subcommand)]
        cmd: verbs::DeleteCmd,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// The fleet's CA and certificates for control-plane identities (api, router, admin).
    #[command(subcommand)]
    Ca(ca::CaCmd),
    /// CLI contexts: which system `ate` talks to (each `ate up` adds one for its state dir).
    #[command(subcommand)]
    Config(contexts::ConfigCmd),
    /// Get this machine's node and worker certificates with a join token and keep renewing them
    /// (for node agents run by systemd or Kubernetes; `ate up --role node` does this itself).
    Join(join::JoinArgs),
    /// Snapshot encryption keys of a state directory: init, rotate, show.
    #[command(subcommand)]
    Keys(keys::KeysCmd),
    /// Join tokens for machines joining the fleet (`ate up --role node --join … --token …`).
    Token {
        #[command(subcommand)]
        cmd: token::TokenCmd,
        #[command(flatten)]
        out: OutputFlag,
        #[command(flatten)]
        api: ApiFlags,
    },
    /// Measure a running system through its router (tables on stdout, JSON to --out).
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
        #[command(flatten)]
        api: ApiFlags,
    },
}

/// The command line: [`Cli`] plus the client flags on the root, where they are not global (each
/// client verb declares them global for its own subtree; clap copies a value given on the root
/// down to the verb, and one given after the verb up, so both positions work).
fn command() -> clap::Command {
    let root = ApiFlags::augment_args(OutputFlag::augment_args(Cli::command()));
    root.mut_args(|a| a.global(false))
}

fn parse() -> Cli {
    let mut matches = command().get_matches();
    Cli::from_arg_matches_mut(&mut matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    ate_tls::install_crypto_provider();
    let cli = parse();
    if matches!(
        cli.command,
        Command::Api(_)
            | Command::Router(_)
            | Command::Node(_)
            | Command::Worker(_)
            | Command::Up(_)
    ) {
        // Before the runtime's threads: whatever a long-running component inherited (the lock
        // of `ate up`'s generation) must not reach the processes it starts (sandboxes outlive it),
        // and only this thread can read the parent-death signal `ate up` set (a worker whose
        // supervisor died stops without a drain).
        ate_tls::process::keep_inherited_descriptors();
        ate_tls::process::note_supervisor();
    }
    if let Some(title) = process_title(&cli.command) {
        // What `top`, `ps -o comm` and `pgrep` name the process (its `comm`): `exe` otherwise,
        // as `ate up` and the worker start this executable as /proc/self/exe. A failure only
        // leaves that name.
        let _ = nix::sys::prctl::set_name(title);
    }
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

/// The process name (at most 15 bytes) of a long-running component.
fn process_title(command: &Command) -> Option<&'static std::ffi::CStr> {
    Some(match command {
        Command::Api(_) => c"ate api",
        Command::Router(_) => c"ate router",
        Command::Node(_) => c"ate node",
        Command::Worker(_) => c"ate worker",
        Command::Up(_) => c"ate up",
        Command::PageSource { .. } => c"ate page-source",
        Command::LogRelay => c"ate log-relay",
        _ => return None,
    })
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Api(args) => serve::run_api(args).await.map(|_| ExitCode::SUCCESS),
        Command::LogRelay => {
            // Blocking reads: on a thread of its own rather than a runtime worker.
            tokio::task::spawn_blocking(serve::log_relay)
                .await
                .map_err(|e| anyhow::anyhow!("log relay: {e}"))??;
            Ok(ExitCode::SUCCESS)
        }
        Command::PageSource {
            generation,
            work_dir,
            write_protect,
        } => {
            // Blocking (poll on userfaultfds): on a thread of its own.
            let served = tokio::task::spawn_blocking(move || {
                ate_page_source::source::main(&generation, &work_dir, write_protect)
            })
            .await
            .map_err(|e| anyhow::anyhow!("page source: {e}"))?;
            match served {
                Ok(stats) => {
                    eprintln!("page source done: {}", stats.summary());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("page source failed: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Router(args) => serve::run_router(args).await.map(|_| ExitCode::SUCCESS),
        Command::Node(args) => serve::run_node(args).await.map(|_| ExitCode::SUCCESS),
        Command::Worker(args) => serve::run_worker(args).await.map(|_| ExitCode::SUCCESS),
        Command::Up(args) => up::run(args).await,
        Command::Keys(cmd) => keys::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Apply { file, api, out } => {
            verbs::apply(&api.connect().await?, &file, out.output).await
        }
        Command::Create(Verb { cmd, api, out }) => {
            verbs::create(&api.connect().await?, cmd, out.output).await
        }
        Command::Get(Verb { cmd, api, out }) => {
            verbs::get(&api.connect().await?, cmd, out.output).await
        }
        Command::Update(Verb { cmd, api, out }) => {
            verbs::update(&api.connect().await?, cmd, out.output).await
        }
        Command::Resume(Verb { cmd, api, out }) => {
            verbs::resume(&api.connect().await?, cmd, out.output).await
        }
        Command::Suspend(Verb { cmd, api, out }) => {
            verbs::suspend(&api.connect().await?, cmd, out.output).await
        }
        Command::Revert(Verb { cmd, api, out }) => {
            verbs::revert(&api.connect().await?, cmd, out.output).await
        }
        Command::Logs { cmd, api } => {
            // Refused before connecting: nothing to wait for when the flag cannot work.
            logs::check_supported(&cmd)?;
            if logs::is_local(&cmd) {
                logs::run(cmd).await?;
            } else {
                logs::run_remote(&api.connect().await?, cmd).await?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Exec { exec, api } => exec::run(&api.connect().await?, exec).await,
        Command::Cp { cp, api } => cp::run(&api.connect().await?, cp).await,
        Command::Top { cmd, api } => top::run(&api.connect().await?, cmd).await,
        Command::Proxy(args) => proxy::run(args).await.map(|_| ExitCode::SUCCESS),
        Command::Delete { cmd, api } => verbs::delete(&api.connect().await?, cmd).await,
        Command::Ca(cmd) => ca::run(cmd),
        Command::Config(cmd) => contexts::run(cmd),
        Command::Join(args) => join::run(args).await,
        Command::Token { cmd, api, out } => {
            // Tokens have no wide view; token.rs knows table, json and yaml.
            let out = if out.output.is_table() {
                Format::Table
            } else {
                out.output
            };
            token::run(&api.connect().await?, cmd, out).await
        }
        // Starts its own system: no api to connect to first.
        Command::Bench {
            cmd: bench::BenchCmd::Faults(args),
            ..
        } => ate_bench::faults::run(args).await,
        Command::Bench {
            cmd: bench::BenchCmd::Measure(cmd),
            api,
        } => ate_bench::run(api.connect().await?, cmd).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own checks of the whole command line (duplicate flags, bad settings).
    #[test]
    fn command_line_is_consistent() {
        command().debug_assert();
    }

    /// The client flags parse before and after the verb, and the later position wins.
    #[test]
    fn client_flags_in_either_position() {
        let api_of = |args: &[&str]| {
            let mut m = command()
                .try_get_matches_from(std::iter::once("ate").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
            match Cli::from_arg_matches_mut(&mut m)
                .map_err(|e| e.to_string())?
                .command
            {
                Command::Get(Verb { api, out, .. }) => Ok((api.api, out.output)),
                _ => Err("not get".to_string()),
            }
        };
        let want = Ok((Some("h:1".to_string()), Format::Wide));
        assert_eq!(
            api_of(&["--api", "h:1", "-o", "wide", "get", "actors"]),
            want
        );
        assert_eq!(
            api_of(&["get", "actors", "--api", "h:1", "-o", "wide"]),
            want
        );
        assert_eq!(
            api_of(&["get", "--api", "h:1", "actors", "-o", "wide"]),
            want
        );
        assert_eq!(
            api_of(&[
                "--api", "h:0", "get", "actors", "--api", "h:1", "-o", "wide"
            ]),
            want
        );
        assert!(api_of(&["api", "--api", "h:1"]).is_err());
    }
}
