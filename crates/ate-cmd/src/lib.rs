//! Running external tools (runc, CRIU, ip) with their stderr captured into errors: the worker's
//! runtime and its network namespaces (`ate-netns`) run them the same way. A failure is a
//! [`CommandError`] naming the command line, how it ended and the tail of what it said; the
//! worker turns it into its `SandboxError::Command` of the same fields and text.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::ffi::OsStr;
use std::process::{Output, Stdio};

use tokio::process::Command;

/// An external command exited non-zero or could not be started (or waited for).
#[derive(Debug, thiserror::Error)]
#[error("`{command}` failed ({status}): {stderr}")]
pub struct CommandError {
    pub command: String,
    pub status: String,
    pub stderr: String,
}

pub type Result<T, E = CommandError> = std::result::Result<T, E>;

const STDERR_TAIL: usize = 2000;

/// The path a component runs its own executable again by (`ate page-source`, `ate log-relay`):
/// the kernel keeps it even after the file on disk was replaced.
pub const SELF_EXE: &str = "/proc/self/exe";

/// `std::process::Command::new(program)`, named `ate` in `ps` when `program` is this very
/// executable ([`SELF_EXE`]) rather than `/proc/self/exe`.
pub fn self_aware_command(program: &str) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    if program == SELF_EXE {
        std::os::unix::process::CommandExt::arg0(&mut command, "ate");
    }
    command
}

/// Renders a command line for error messages.
pub fn render<I, S>(program: &str, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut line = program.to_string();
    for a in args {
        line.push(' ');
        line.push_str(&a.as_ref().to_string_lossy());
    }
    line
}

/// `program args` with stdout and stderr captured and `stdin` as given, killed if dropped.
fn piped<I, S>(program: &str, args: I, stdin: Stdio) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The error of a `program args` that could not be started or waited for (`status` says which).
fn not_run<I, S>(program: &str, args: I, status: &str, e: &std::io::Error) -> CommandError
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    CommandError {
        command: render(program, args),
        status: status.to_string(),
        stderr: e.to_string(),
    }
}

/// Runs `program args` to completion with stdin closed; returns its output on success, a
/// [`CommandError`] with the stderr tail otherwise.
pub async fn run<I, S>(program: &str, args: I) -> Result<Output>
where
    I: IntoIterator<Item = S> + Clone,
    S: AsRef<OsStr>,
{
    let out = output(program, args.clone()).await?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(failed(program, args, &out))
    }
}

/// [`run`], but `give_up(pid)` (given the program's pid) may end it early: when that future
/// resolves first, the program is killed (SIGKILL) and its output, a failure, is what is
/// returned.
pub async fn run_unless<I, S, F>(
    program: &str,
    args: I,
    give_up: impl FnOnce(u32) -> F,
) -> Result<Output>
where
    I: IntoIterator<Item = S> + Clone,
    S: AsRef<OsStr>,
    F: std::future::Future<Output = ()>,
{
    let child = piped(program, args.clone(), Stdio::null())
        .spawn()
        .map_err(|e| not_run(program, args.clone(), "could not start", &e))?;
    let pid = child.id();
    let output = child.wait_with_output();
    tokio::pin!(output);
    let give_up = async {
        match pid {
            Some(pid) => give_up(pid).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(give_up);
    let mut killed = false;
    let out = loop {
        tokio::select! {
            out = &mut output => break out,
            () = &mut give_up, if !killed => {
                killed = true;
                if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
    .map_err(|e| not_run(program, args.clone(), "could not be waited for", &e))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(failed(program, args, &out))
    }
}

/// Runs `program args` and returns its output whatever the exit status.
pub async fn output<I, S>(program: &str, args: I) -> Result<Output>
where
    I: IntoIterator<Item = S> + Clone,
    S: AsRef<OsStr>,
{
    piped(program, args.clone(), Stdio::null())
        .output()
        .await
        .map_err(|e| not_run(program, args, "could not start", &e))
}

/// Runs `program args` with `input` on its stdin; like [`run`] otherwise.
pub async fn run_with_input<I, S>(program: &str, args: I, input: &str) -> Result<Output>
where
    I: IntoIterator<Item = S> + Clone,
    S: AsRef<OsStr>,
{
    use tokio::io::AsyncWriteExt;
    let could_not = |e: std::io::Error| not_run(program, args.clone(), "could not start", &e);
    let mut child = piped(program, args.clone(), Stdio::piped())
        .spawn()
        .map_err(could_not)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).await.map_err(could_not)?;
        // Dropped here: EOF ends the program's input.
    }
    let out = child.wait_with_output().await.map_err(could_not)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(failed(program, args, &out))
    }
}

pub fn failed<I, S>(program: &str, args: I, out: &Output) -> CommandError
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    if text.trim().is_empty() {
        text = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    CommandError {
        command: render(program, args),
        status: out.status.to_string(),
        stderr: tail(&text, STDERR_TAIL),
    }
}

/// Keeps the last `max` bytes of command output, on a char boundary, trimmed.
pub fn tail(text: &str, max: usize) -> String {
    let t = text.trim();
    if t.len() <= max {
        return t.to_string();
    }
    let mut start = t.len() - max;
    while !t.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &t[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_names_the_command_its_exit_and_what_it_said() {
        let args = ["-c", "echo out; echo said-this >&2; exit 3"];
        let e = run("sh", args).await.expect_err("exit 3 fails");
        assert_eq!(e.command, "sh -c echo out; echo said-this >&2; exit 3");
        assert!(e.status.contains('3'), "{}", e.status);
        assert_eq!(e.stderr, "said-this");
        // Nothing on stderr: stdout is what it said.
        let e = run("sh", ["-c", "echo only-out; exit 1"])
            .await
            .expect_err("exit 1 fails");
        assert_eq!(e.stderr, "only-out");
        assert!(run("true", [] as [&str; 0]).await.is_ok());
    }

    #[tokio::test]
    async fn a_program_that_cannot_start_says_so() {
        let e = run("/nonexistent/ate-cmd-test", ["x"])
            .await
            .expect_err("no such program");
        assert_eq!(e.status, "could not start");
        assert_eq!(e.command, "/nonexistent/ate-cmd-test x");
    }

    #[tokio::test]
    async fn giving_up_kills_the_program_and_reports_a_failure() {
        let started = std::time::Instant::now();
        let e = run_unless("sleep", ["30"], |_pid| async {})
            .await
            .expect_err("killed");
        assert!(e.status.contains("SIGKILL"), "{}", e.status);
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        // A give-up that never comes leaves the program to finish.
        let out = run_unless("echo", ["done"], |_pid| std::future::pending())
            .await
            .expect("echo");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    }

    #[tokio::test]
    async fn input_reaches_the_program_and_ends_with_eof() {
        let out = run_with_input("cat", [] as [&str; 0], "hello")
            .await
            .expect("cat");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello");
    }

    #[test]
    fn the_tail_keeps_the_end_on_a_char_boundary() {
        assert_eq!(tail("  short  ", 10), "short");
        assert_eq!(tail("abcdef", 3), "…def");
        // 'é' is two bytes: a cut inside it moves past it.
        assert_eq!(tail("aéb", 2), "…b");
        assert_eq!(render("ip", ["netns", "add", "x"]), "ip netns add x");
    }
}
