//! `ate exec [-i] [-t] actor NAME -a ATESPACE [-c CONTAINER] -- COMMAND [ARGS…]`: a command
//! inside an actor's sandbox, with kubectl's conventions (docs/exec.md). The exit code is the
//! command's; stdout and stderr stay apart without a terminal. With `-t` the command gets a
//! terminal; when this side's stdin is one too (and `-i`), it is put in raw mode for the session
//! and window size changes (SIGWINCH) are sent on.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use ate_proto::v1::{
    self, ExecActorRequest, ExecInput, ExecStart, TerminalSize, exec_actor_request, exec_input,
    exec_output,
};
use tokio::sync::mpsc;

use crate::client::Clients;

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Pass stdin to the command.
    #[arg(short = 'i', long = "stdin", global = true)]
    pub stdin: bool,
    /// Give the command a terminal (stdout and stderr then arrive as one stream).
    #[arg(short = 't', long = "tty", global = true)]
    pub tty: bool,
    #[command(subcommand)]
    pub cmd: ExecCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum ExecCmd {
    /// Run a command in an actor's sandbox (a SUSPENDED actor is resumed first).
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// The container (default: the actor's first).
        #[arg(short = 'c', long, value_name = "CONTAINER")]
        container: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

/// Puts the terminal on stdin into raw mode until dropped.
struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).context("read the terminal's settings")?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).context("put the terminal in raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        use nix::sys::termios::{SetArg, tcsetattr};
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

/// The size of the terminal on stdout (else stdin), if either is one.
fn terminal_size() -> Option<TerminalSize> {
    for fd in [1, 0] {
        let mut ws = nix::libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer, which lives for the call.
        let r = unsafe { nix::libc::ioctl(fd, nix::libc::TIOCGWINSZ, &mut ws) };
        if r == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
            return Some(TerminalSize {
                columns: u32::from(ws.ws_col),
                rows: u32::from(ws.ws_row),
            });
        }
    }
    None
}

pub fn input(i: exec_input::Input) -> ExecActorRequest {
    ExecActorRequest {
        request: Some(exec_actor_request::Request::Input(ExecInput {
            input: Some(i),
        })),
    }
}

/// An open exec session: what is sent to it (the start is sent) and what comes back.
pub struct Session {
    pub input: mpsc::Sender<ExecActorRequest>,
    pub output: tonic::Streaming<v1::ExecOutput>,
}

/// Starts `start` (ExecActor) and returns the session.
pub async fn open(clients: &Clients, start: ExecStart) -> anyhow::Result<Session> {
    let (input, rx) = mpsc::channel::<ExecActorRequest>(16);
    input
        .send(ExecActorRequest {
            request: Some(exec_actor_request::Request::Start(start)),
        })
        .await
        .context("exec: request stream")?;
    let output = clients
        .actors
        .clone()
        .exec_actor(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(status_error)?
        .into_inner();
    Ok(Session { input, output })
}

/// A failed call as the CLI says it (the api's words, then the code).
pub fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", s.message(), s.code())
}

/// The command's exit code as this process's (an exit code is one byte).
pub fn exit_code(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(if code < 0 { 255 } else { (code & 0xff) as u8 })
}

pub async fn run(clients: &Clients, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let ExecCmd::Actor {
        name,
        atespace,
        container,
        command,
    } = args.cmd;
    let local_tty = std::io::stdin().is_terminal();
    let start = ExecStart {
        actor: Some(v1::ObjectRef {
            atespace: atespace.clone(),
            name: name.clone(),
        }),
        container: container.unwrap_or_default(),
        command,
        tty: args.tty,
        stdin: args.stdin,
        size: if args.tty { terminal_size() } else { None },
    };
    let Session {
        input: tx,
        mut output,
    } = open(clients, start).await?;

    // Raw mode only once the command runs: an error before it prints as usual.
    let raw = if args.tty && args.stdin && local_tty {
        Some(RawMode::enter()?)
    } else {
        None
    };
    if args.stdin {
        // A thread of its own, not the runtime's blocking pool: a read of a terminal that never
        // returns must not hold up the exit.
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.blocking_send(input(exec_input::Input::StdinClosed(true)));
                        return;
                    }
                    Ok(n) => {
                        let data = buf[..n].to_vec();
                        if tx
                            .blocking_send(input(exec_input::Input::Stdin(data)))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    }
    if args.tty {
        let tx = tx.clone();
        if let Ok(mut winch) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        {
            tokio::spawn(async move {
                while winch.recv().await.is_some() {
                    if let Some(size) = terminal_size()
                        && tx
                            .send(input(exec_input::Input::Resize(size)))
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    }
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    loop {
        let message = output.message().await.map_err(status_error)?;
        let Some(message) = message.and_then(|m| m.output) else {
            anyhow::bail!("exec: the session ended without the command's exit status");
        };
        match message {
            exec_output::Output::Stdout(data) => {
                let _ = stdout.write_all(&data);
                let _ = stdout.flush();
            }
            exec_output::Output::Stderr(data) => {
                let _ = stderr.write_all(&data);
                let _ = stderr.flush();
            }
            exec_output::Output::Exit(exit) => {
                drop(raw);
                if !exit.message.is_empty() {
                    eprintln!("{}", exit.message);
                }
                // Kept open until here: the request stream's end is not the caller's.
                drop(tx);
                return Ok(ExitCode::from(exit_code(exit.code)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_fit_a_byte() {
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(3), 3);
        assert_eq!(exit_code(137), 137);
        assert_eq!(exit_code(256), 0);
        assert_eq!(exit_code(-1), 255);
    }

    #[test]
    fn command_line() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            exec: ExecArgs,
        }
        let cli = Cli::try_parse_from([
            "ate",
            "-it",
            "actor",
            "counter-1",
            "-a",
            "ate-demo",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        assert!(cli.exec.stdin && cli.exec.tty);
        let ExecCmd::Actor {
            name,
            atespace,
            container,
            command,
        } = cli.exec.cmd;
        assert_eq!(
            (name.as_str(), atespace.as_str()),
            ("counter-1", "ate-demo")
        );
        assert_eq!(container, None);
        assert_eq!(command, ["sh", "-c", "exit 3"]);
        // Flags after the actor too; the command is required.
        let cli =
            Cli::try_parse_from(["ate", "actor", "x", "-a", "y", "-t", "-c", "c", "--", "tty"])
                .unwrap();
        assert!(cli.exec.tty && !cli.exec.stdin);
        assert!(Cli::try_parse_from(["ate", "actor", "x", "-a", "y"]).is_err());
    }
}
