//! `ate logs actor NAME -a ATESPACE [-f]`: an actor's stdout and stderr. Workers append them to
//! `<state>/logs/actors/<atespace>/<name>.log`, outside the actor's sandbox directory, so the log
//! follows the actor across suspends, restores and workers of the node. By default this reads it
//! through the api (`ActorService.ReadActorLog`), which asks the node the actor runs (or last
//! ran) on, from any machine; `--state-dir DIR` reads the file on this machine instead.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ate_core::ActorRef;

#[derive(clap::Subcommand, Debug)]
pub enum LogsCmd {
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Keep printing what the actor writes (also across suspends and resumes).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Read the log file under this node state directory on this machine instead of
        /// through the api.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
}

pub fn log_path(state_dir: &std::path::Path, actor: &ActorRef) -> PathBuf {
    state_dir
        .join("logs")
        .join("actors")
        .join(&actor.atespace)
        .join(format!("{}.log", actor.name))
}

/// Whether the command reads a local file (`--state-dir`) rather than through the api.
pub fn is_local(cmd: &LogsCmd) -> bool {
    let LogsCmd::Actor { state_dir, .. } = cmd;
    state_dir.is_some()
}

/// Through the api: each call returns what the node has from `offset` on.
pub async fn run_remote(c: &crate::client::Clients, cmd: LogsCmd) -> anyhow::Result<()> {
    let LogsCmd::Actor {
        name,
        atespace,
        follow,
        ..
    } = cmd;
    let actor = ActorRef::new(atespace, name);
    actor.validate()?;
    let mut offset = 0u64;
    let mut out = std::io::stdout();
    loop {
        let req = ate_proto::v1::ReadActorLogRequest {
            actor: Some(ate_proto::v1::ObjectRef {
                atespace: actor.atespace.clone(),
                name: actor.name.clone(),
            }),
            offset,
        };
        match c.actors.clone().read_actor_log(req).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                let more = !reply.data.is_empty();
                out.write_all(&reply.data)?;
                out.flush()?;
                offset = reply.next_offset;
                if more {
                    continue; // drain what is there before waiting
                }
            }
            Err(s) if follow && s.code() != tonic::Code::PermissionDenied => {
                tracing::debug!(error = %s.message(), "log not readable yet");
            }
            Err(s) => anyhow::bail!("{}", s.message()),
        }
        if !follow {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = crate::serve::shutdown_signal() => return Ok(()),
        }
    }
}

pub async fn run(cmd: LogsCmd) -> anyhow::Result<()> {
    let LogsCmd::Actor {
        name,
        atespace,
        follow,
        state_dir,
    } = cmd;
    let actor = ActorRef::new(atespace, name);
    actor.validate()?;
    let state_dir = state_dir.unwrap_or_else(|| PathBuf::from(crate::client::DEFAULT_STATE_DIR));
    let path = log_path(&state_dir, &actor);
    let mut offset = 0u64;
    let mut out = std::io::stdout();
    loop {
        match std::fs::File::open(&path) {
            Ok(mut file) => {
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if len < offset {
                    offset = 0; // truncated or replaced
                }
                file.seek(SeekFrom::Start(offset))
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let mut buf = Vec::new();
                file.read_to_end(&mut buf)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                offset += buf.len() as u64;
                out.write_all(&buf)?;
                out.flush()?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && follow => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                anyhow::bail!(
                    "actor {actor} has no log at {} yet (has it run on this machine?)",
                    path.display()
                )
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
        if !follow {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = crate::serve::shutdown_signal() => return Ok(()),
        }
    }
}
