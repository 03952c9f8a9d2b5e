//! Exec's wire messages (exec.proto) ↔ the worker's exec types.

use ate_proto::v1;

use super::{actor_ref, invalid};
use crate::exec::ExecSpec;
use crate::worker::{ExecEvent, ExecInput, ExecRequest, VerbError};

/// Most words a command may have, and most bytes in all.
const MAX_ARGS: usize = 4096;
const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// The first message of a WorkerService.Exec stream.
pub(crate) fn exec_start(m: Option<v1::PlacedExecRequest>) -> Result<ExecRequest, VerbError> {
    let start = match m.and_then(|m| m.request) {
        Some(v1::placed_exec_request::Request::Start(s)) => s,
        _ => return Err(invalid("exec: the first message must be the start")),
    };
    let exec = start
        .exec
        .ok_or_else(|| invalid("exec: start without exec"))?;
    let actor = actor_ref(exec.actor.as_ref())?;
    if exec.command.is_empty() || exec.command[0].is_empty() {
        return Err(invalid("exec: no command"));
    }
    let bytes: usize = exec.command.iter().map(String::len).sum();
    if exec.command.len() > MAX_ARGS || bytes > MAX_COMMAND_BYTES {
        return Err(invalid(format!(
            "exec: the command is too long (at most {MAX_ARGS} words, {MAX_COMMAND_BYTES} bytes)"
        )));
    }
    if exec.command.iter().any(|w| w.contains('\0')) {
        return Err(invalid("exec: a command word holds a NUL byte"));
    }
    Ok(ExecRequest {
        actor,
        worker_id: start.worker_id,
        activation: start.activation,
        container: Some(exec.container).filter(|c| !c.is_empty()),
        spec: ExecSpec {
            command: exec.command,
            tty: exec.tty,
            stdin: exec.stdin,
            size: exec.size.as_ref().and_then(terminal_size),
        },
        caller: start.caller,
    })
}

/// A later message of the stream; None for one that carries nothing this worker knows.
pub(crate) fn exec_input(m: v1::PlacedExecRequest) -> Option<ExecInput> {
    use v1::exec_input::Input;
    match m.request {
        Some(v1::placed_exec_request::Request::Input(v1::ExecInput { input: Some(i) })) => {
            match i {
                Input::Stdin(data) => Some(ExecInput::Stdin(data)),
                Input::StdinClosed(_) => Some(ExecInput::StdinClosed),
                Input::Resize(size) => {
                    terminal_size(&size).map(|(columns, rows)| ExecInput::Resize { columns, rows })
                }
            }
        }
        _ => None,
    }
}

/// A size with both sides set, each cut to what a terminal takes.
fn terminal_size(s: &v1::TerminalSize) -> Option<(u16, u16)> {
    let clamp = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
    (s.columns > 0 && s.rows > 0).then(|| (clamp(s.columns), clamp(s.rows)))
}

pub(crate) fn exec_output(e: ExecEvent) -> v1::ExecOutput {
    use v1::exec_output::Output;
    let output = match e {
        ExecEvent::Stdout(data) => Output::Stdout(data),
        ExecEvent::Stderr(data) => Output::Stderr(data),
        ExecEvent::Exit { code, message } => Output::Exit(v1::ExecExit { code, message }),
    };
    v1::ExecOutput {
        output: Some(output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(command: &[&str], size: Option<(u32, u32)>) -> Option<v1::PlacedExecRequest> {
        Some(v1::PlacedExecRequest {
            request: Some(v1::placed_exec_request::Request::Start(
                v1::PlacedExecStart {
                    exec: Some(v1::ExecStart {
                        actor: Some(v1::ObjectRef {
                            atespace: "ns".into(),
                            name: "a".into(),
                        }),
                        container: String::new(),
                        command: command.iter().map(|w| w.to_string()).collect(),
                        tty: true,
                        stdin: false,
                        size: size.map(|(columns, rows)| v1::TerminalSize { columns, rows }),
                    }),
                    worker_id: "w1".into(),
                    activation: 7,
                    caller: "admin".into(),
                },
            )),
        })
    }

    #[test]
    fn starts_are_checked() {
        let req = exec_start(start(&["sh", "-c", "x"], Some((100_000, 40)))).unwrap();
        assert_eq!(req.actor, ate_core::ActorRef::new("ns", "a"));
        assert_eq!(req.spec.command, ["sh", "-c", "x"]);
        assert_eq!((req.activation, req.container), (7, None));
        assert_eq!(req.spec.size, Some((u16::MAX, 40)));
        assert_eq!(
            exec_start(start(&["sh"], Some((0, 40)))).unwrap().spec.size,
            None
        );
        assert!(exec_start(start(&[], None)).is_err());
        assert!(exec_start(start(&[""], None)).is_err());
        assert!(exec_start(start(&["a\0b"], None)).is_err());
        assert!(exec_start(None).is_err());
        let input = v1::PlacedExecRequest {
            request: Some(v1::placed_exec_request::Request::Input(v1::ExecInput {
                input: Some(v1::exec_input::Input::StdinClosed(true)),
            })),
        };
        assert!(exec_start(Some(input.clone())).is_err());
        assert_eq!(exec_input(input), Some(ExecInput::StdinClosed));
    }
}
