//! `ate logs actor NAME -a ATESPACE [-f]`: an actor's stdout and stderr. Workers append them to
//! `<state>/logs/actors/<atespace>/<name>.log`, outside the actor's sandbox directory, so the log
//! follows the actor across suspends, restores and workers of the node. This reads that file on
//! the machine where `ate up` / the node runs (a remote logs API is not built yet).

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
        /// State directory of the node the actor runs on.
        #[arg(long, env = "ATE_STATE_DIR", default_value = crate::client::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
}

pub fn log_path(state_dir: &std::path::Path, actor: &ActorRef) -> PathBuf {
    state_dir
        .join("logs")
        .join("actors")
        .join(&actor.atespace)
        .join(format!("{}.log", actor.name))
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
