//! `ate logs actor NAME -a ATESPACE [-f] [--tail N]`: an actor's stdout and stderr. Workers
//! append them to `<state>/logs/actors/<atespace>/<name>.log`, outside the actor's sandbox
//! directory, so the log follows the actor across suspends, restores and workers of the node. By
//! default this reads it through the api (`ActorService.ReadActorLog`), which asks the node the
//! actor runs (or last ran) on, from any machine; `--state-dir DIR` reads the file on this
//! machine instead. Workers stamp each line with the time it was written (`ate log-relay`);
//! `--timestamps` shows the stamps, `--since` keeps the lines newer than a duration, and by
//! default the stamps are left out. Lines written by an older relay carry no stamp.
//! An actor with several containers prefixes each line with `[<container>] ` (its `ate-init`
//! does); `-c CONTAINER` shows one container's lines without the prefix.

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ate_core::ActorRef;

#[derive(clap::Subcommand, Debug)]
pub enum LogsCmd {
    /// One actor's output.
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Keep printing what the actor writes (also across suspends and resumes).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Print only the last N lines (then, with -f, what comes after them).
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
        /// Only lines written in the last DURATION (e.g. 10m); lines without a time (written
        /// before this release) are left out.
        #[arg(long, value_name = "DURATION", value_parser = ate_router::config::parse_duration)]
        since: Option<Duration>,
        /// Start each line with the time it was written (RFC 3339, UTC).
        #[arg(long)]
        timestamps: bool,
        /// Only this container's lines (an actor with several containers).
        #[arg(short = 'c', long, value_name = "CONTAINER")]
        container: Option<String>,
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

/// Kept for the callers: every flag is supported now that lines carry their time.
pub fn check_supported(_cmd: &LogsCmd) -> anyhow::Result<()> {
    Ok(())
}

/// Turns the log's bytes into what is printed: the time stamp of each line dropped (or kept
/// with `--timestamps`), and lines older than `--since` left out. Streams: a line may arrive in
/// pieces; only its first bytes (the stamp) are held until they are complete.
#[derive(Debug)]
struct LineFilter {
    timestamps: bool,
    /// Lines stamped before this are left out (`--since`).
    cutoff: Option<std::time::SystemTime>,
    /// The start of the current line, held until the stamp can be told.
    head: Vec<u8>,
    at_line_start: bool,
    /// Whether the current line (past its head) is printed.
    visible: bool,
    /// `[<container>] `: only lines with this prefix (after the stamp) are shown, without it.
    container: Option<Vec<u8>>,
}

impl LineFilter {
    fn new(timestamps: bool, since: Option<Duration>, container: Option<&str>) -> Self {
        let now = std::time::SystemTime::now();
        let container = container.map(|c| format!("[{c}] ").into_bytes());
        Self {
            timestamps,
            cutoff: since.and_then(|d| now.checked_sub(d)),
            head: Vec::with_capacity(ate_core::log_line::PREFIX_LEN + 64),
            at_line_start: true,
            visible: true,
            container,
        }
    }

    /// How much of a line is held before it is decided: its stamp and container prefix.
    fn head_len(&self) -> usize {
        ate_core::log_line::PREFIX_LEN + self.container.as_ref().map_or(0, Vec::len)
    }

    /// Decides the current line from its head and writes what is shown of it.
    fn decide(&mut self, out: &mut Vec<u8>) {
        let text = String::from_utf8_lossy(&self.head).into_owned();
        let (stamp, _) = ate_core::log_line::split(&text);
        self.visible = match (self.cutoff, stamp) {
            (None, _) => true,
            (Some(cutoff), Some(at)) => at >= cutoff,
            (Some(_), None) => false,
        };
        let stamp_len = if stamp.is_some() {
            ate_core::log_line::PREFIX_LEN.min(self.head.len())
        } else {
            0
        };
        let mut prefix_len = 0;
        if let Some(prefix) = &self.container {
            if self.head[stamp_len..].starts_with(prefix) {
                prefix_len = prefix.len();
            } else {
                self.visible = false;
            }
        }
        if self.visible {
            if self.timestamps {
                out.extend_from_slice(&self.head[..stamp_len]);
            }
            out.extend_from_slice(&self.head[stamp_len + prefix_len..]);
        }
        self.head.clear();
        self.at_line_start = false;
    }

    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        for &b in data {
            if self.at_line_start {
                self.head.push(b);
                if b == b'\n' || self.head.len() >= self.head_len() {
                    self.decide(out);
                    if b == b'\n' {
                        self.at_line_start = true;
                    }
                }
                continue;
            }
            if self.visible {
                out.push(b);
            }
            if b == b'\n' {
                self.at_line_start = true;
            }
        }
    }

    /// At the end of what is there: a short unfinished line is shown as it is.
    fn flush(&mut self, out: &mut Vec<u8>) {
        if self.at_line_start && !self.head.is_empty() {
            self.decide(out);
        }
    }
}

/// The last `n` lines of what it is given, as `tail -n` counts them: a last line without its
/// newline yet is a line. Holds at most `n` lines, however long the log.
#[derive(Debug)]
struct TailLines {
    n: usize,
    /// Whole lines (each ending in `\n`) and, last, possibly one still open.
    lines: VecDeque<Vec<u8>>,
}

impl TailLines {
    fn new(n: usize) -> Self {
        Self {
            n,
            lines: VecDeque::new(),
        }
    }

    fn push(&mut self, data: &[u8]) {
        for piece in data.split_inclusive(|b| *b == b'\n') {
            match self.lines.back_mut() {
                Some(open) if open.last() != Some(&b'\n') => open.extend_from_slice(piece),
                _ => self.lines.push_back(piece.to_vec()),
            }
            while self.lines.len() > self.n {
                self.lines.pop_front();
            }
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        self.lines.into_iter().flatten().collect()
    }
}

/// Where log bytes go: straight to stdout, or, with `--tail` until the reader has caught up with
/// the end of the log, into the last lines kept so far.
struct Printer {
    tail: Option<TailLines>,
    filter: LineFilter,
    out: std::io::Stdout,
}

impl Printer {
    fn new(
        tail: Option<usize>,
        timestamps: bool,
        since: Option<Duration>,
        container: Option<&str>,
    ) -> Self {
        Self {
            tail: tail.map(TailLines::new),
            filter: LineFilter::new(timestamps, since, container),
            out: std::io::stdout(),
        }
    }

    fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut shown = Vec::with_capacity(data.len());
        self.filter.feed(data, &mut shown);
        self.emit(&shown)
    }

    fn emit(&mut self, data: &[u8]) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.tail {
            Some(t) => t.push(data),
            None => {
                self.out.write_all(data)?;
                self.out.flush()?;
            }
        }
        Ok(())
    }

    /// The log was replaced or truncated: what was kept for the tail is gone from it.
    fn restart(&mut self) {
        if let Some(t) = &mut self.tail {
            *t = TailLines::new(t.n);
        }
    }

    /// The reader reached the end of the log: print the tail, then pass everything through.
    fn caught_up(&mut self) -> std::io::Result<()> {
        let mut rest = Vec::new();
        self.filter.flush(&mut rest);
        self.emit(&rest)?;
        if let Some(t) = self.tail.take() {
            self.out.write_all(&t.into_bytes())?;
            self.out.flush()?;
        }
        Ok(())
    }
}

/// Through the api: each call returns what the node has from `offset` on.
pub async fn run_remote(c: &crate::client::Clients, cmd: LogsCmd) -> anyhow::Result<()> {
    let (actor, mut out, follow, _) = start(cmd)?;
    let mut offset = 0u64;
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
                // The node reads from 0 when the log became shorter than `offset`.
                let start = reply.next_offset.saturating_sub(reply.data.len() as u64);
                if start < offset {
                    out.restart();
                }
                let more = !reply.data.is_empty();
                out.write(&reply.data)?;
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
        if !more_to_come(&mut out, follow, Duration::from_millis(500)).await? {
            return Ok(());
        }
    }
}

/// Bytes read from the local log per read (the tail keeps only its lines of each).
const LOCAL_READ_CHUNK: usize = 1 << 20;

pub async fn run(cmd: LogsCmd) -> anyhow::Result<()> {
    let (actor, mut out, follow, state_dir) = start(cmd)?;
    let state_dir = state_dir.unwrap_or_else(|| PathBuf::from(crate::client::DEFAULT_STATE_DIR));
    let path = log_path(&state_dir, &actor);
    let mut offset = 0u64;
    let mut buf = vec![0u8; LOCAL_READ_CHUNK];
    loop {
        match std::fs::File::open(&path) {
            Ok(mut file) => {
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if len < offset {
                    offset = 0; // truncated or replaced
                    out.restart();
                }
                file.seek(SeekFrom::Start(offset))
                    .with_context(|| format!("cannot read {}", path.display()))?;
                loop {
                    let n = file
                        .read(&mut buf)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    if n == 0 {
                        break;
                    }
                    offset += n as u64;
                    out.write(&buf[..n])?;
                }
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
        if !more_to_come(&mut out, follow, Duration::from_millis(200)).await? {
            return Ok(());
        }
    }
}

/// What both ways of reading start from: the actor (checked), the printer for the flags,
/// `--follow` and `--state-dir`.
fn start(cmd: LogsCmd) -> anyhow::Result<(ActorRef, Printer, bool, Option<PathBuf>)> {
    let LogsCmd::Actor {
        name,
        atespace,
        follow,
        tail,
        state_dir,
        since,
        timestamps,
        container,
    } = cmd;
    let actor = ActorRef::new(atespace, name);
    actor.validate()?;
    let out = Printer::new(tail, timestamps, since, container.as_deref());
    Ok((actor, out, follow, state_dir))
}

/// After printing all there is: whether to read again, `poll` later (only with `--follow`, and
/// not once a shutdown signal came).
async fn more_to_come(out: &mut Printer, follow: bool, poll: Duration) -> anyhow::Result<bool> {
    out.caught_up()?;
    if !follow {
        return Ok(false);
    }
    tokio::select! {
        _ = tokio::time::sleep(poll) => Ok(true),
        _ = ate_tls::process::shutdown_signal() => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filtered(timestamps: bool, since: Option<Duration>, pieces: &[&[u8]]) -> String {
        let mut f = LineFilter::new(timestamps, since, None);
        let mut out = Vec::new();
        for p in pieces {
            f.feed(p, &mut out);
        }
        f.flush(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn one_containers_lines_are_picked_without_their_prefix() {
        let now = std::time::SystemTime::now();
        let stamp = ate_core::log_line::prefix(now);
        let log = format!(
            "{stamp}[app] counted 1\n{stamp}[side] hello\n[app] unstamped\n{stamp}[ate-init] container \"side\" exited\n{stamp}[app]\n"
        );
        let bytes = log.as_bytes();
        for cut in 0..bytes.len() {
            let mut f = LineFilter::new(false, None, Some("app"));
            let mut out = Vec::new();
            f.feed(&bytes[..cut], &mut out);
            f.feed(&bytes[cut..], &mut out);
            f.flush(&mut out);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "counted 1\nunstamped\n",
                "split at {cut}"
            );
        }
        let mut f = LineFilter::new(true, None, Some("side"));
        let mut out = Vec::new();
        f.feed(bytes, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), format!("{stamp}hello\n"));
    }

    #[test]
    fn stamps_are_dropped_kept_or_filtered_across_split_reads() {
        let now = std::time::SystemTime::now();
        let new = ate_core::log_line::prefix(now);
        let old = ate_core::log_line::prefix(now - Duration::from_secs(3600));
        let log = format!("{old}first\n{new}second\nplain line\n{new}third");
        let bytes = log.as_bytes();
        // Split everywhere, including inside a stamp.
        let pieces: Vec<&[u8]> = bytes.chunks(7).collect();
        assert_eq!(
            filtered(false, None, &pieces),
            "first\nsecond\nplain line\nthird"
        );
        assert_eq!(filtered(true, None, &pieces), log);
        assert_eq!(
            filtered(false, Some(Duration::from_secs(60)), &pieces),
            "second\nthird"
        );
    }

    fn tail(n: usize, pieces: &[&str]) -> String {
        let mut t = TailLines::new(n);
        for p in pieces {
            t.push(p.as_bytes());
        }
        String::from_utf8(t.into_bytes()).unwrap()
    }

    #[test]
    fn tail_keeps_the_last_lines_across_reads() {
        assert_eq!(tail(2, &["a\nb\nc\n"]), "b\nc\n");
        // Lines split across reads are joined before counting.
        assert_eq!(tail(2, &["a\nb", "b\nc", "c\n"]), "bb\ncc\n");
        // An open last line counts, as in `tail -n`.
        assert_eq!(tail(2, &["a\nb\nc"]), "b\nc");
        assert_eq!(tail(5, &["a\nb\n"]), "a\nb\n");
        assert_eq!(tail(0, &["a\nb\n"]), "");
        assert_eq!(tail(3, &[]), "");
    }
}
