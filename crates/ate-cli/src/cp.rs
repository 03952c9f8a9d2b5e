//! `ate cp SRC DST`: files and directories into and out of an actor's sandbox, with kubectl's
//! syntax (`FILE ATESPACE/NAME:PATH` and back) and kubectl's way: a tar stream over `ate exec`,
//! `tar -x` / `tar -c` running in the sandbox (the demo counter's busybox has it). Both ends
//! stream (bounded buffers), so a large file costs no memory here.
//!
//! Paths: a path in the sandbox is taken from its root (a relative one too) and may not climb
//! (`..` is refused, not resolved). What comes back is unpacked only under the destination:
//! an entry that is not under the copied name, names a parent, is absolute, or would be written
//! through a symbolic link is refused; links and special files in the archive are skipped with
//! a warning (a sandbox's files are not trusted).

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use ate_core::ActorRef;
use ate_proto::v1::{self, ExecActorRequest, ExecStart, exec_input, exec_output};
use tokio::sync::mpsc;

use crate::client::Clients;
use crate::exec::{self, Session};

#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// A local path, or ATESPACE/NAME:PATH in an actor's sandbox.
    pub src: String,
    /// A local path, or ATESPACE/NAME:PATH in an actor's sandbox.
    pub dst: String,
    /// The container (default: the actor's first).
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub container: Option<String>,
}

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Spec {
    Local(PathBuf),
    Remote(ActorRef, String),
}

/// `ATESPACE/NAME:PATH` is in an actor (both names DNS labels); anything else is a local path
/// (write `./a/b:c` for a local file of that name).
fn parse_spec(s: &str) -> Spec {
    if let Some((actor, path)) = s.split_once(':')
        && let Ok(actor) = ActorRef::parse(actor)
    {
        return Spec::Remote(actor, path.to_string());
    }
    Spec::Local(PathBuf::from(s))
}

/// A path in the sandbox as (its parent directory, its last name), from the sandbox's root.
fn remote_path(path: &str) -> anyhow::Result<(String, String)> {
    let mut names = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => bail!("path {path:?} climbs out of where it starts (`..`): refused"),
            name => names.push(name),
        }
    }
    let Some(last) = names.pop() else {
        bail!("path {path:?} names the sandbox's root: name a file or directory in it");
    };
    Ok((format!("/{}", names.join("/")), last.to_string()))
}

/// Where an archive entry named `entry` goes, relative to the destination: None for the copied
/// name itself; an error for an entry outside it.
fn entry_path(entry: &Path, base: &str) -> anyhow::Result<Option<PathBuf>> {
    let mut parts = Vec::new();
    for c in entry.components() {
        match c {
            Component::Normal(name) => parts.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                bail!(
                    "the archive from the sandbox names {}, outside the copy: refused",
                    entry.display()
                )
            }
        }
    }
    let mut parts = parts.into_iter();
    if parts.next().and_then(|p| p.to_str()) != Some(base) {
        bail!(
            "the archive from the sandbox names {}, not under {base:?}: refused",
            entry.display()
        );
    }
    let rest: PathBuf = parts.collect();
    Ok((!rest.as_os_str().is_empty()).then_some(rest))
}

/// Refuses a write at `root/rel` that would go through a symbolic link below `root`.
fn check_no_link(root: &Path, rel: &Path) -> anyhow::Result<()> {
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            bail!(
                "{} is a symbolic link: refused to write through it",
                at.display()
            );
        }
    }
    Ok(())
}

/// Unpacks the tar stream `from` (entries named `base/…`) at `target`; returns the files and
/// bytes written.
fn unpack(from: impl Read, base: &str, target: &Path) -> anyhow::Result<(u64, u64)> {
    let mut archive = tar::Archive::new(from);
    let (mut files, mut bytes) = (0u64, 0u64);
    for entry in archive.entries().context("read the archive")? {
        let mut entry = entry.context("read the archive")?;
        let name = entry.path().context("an entry's name")?.into_owned();
        let rel = entry_path(&name, base)?;
        let dest = match &rel {
            Some(rel) => {
                check_no_link(target, rel)?;
                target.join(rel)
            }
            None => target.to_path_buf(),
        };
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir()) {
            eprintln!(
                "warning: skipped {} ({kind:?} entries are not copied out of a sandbox)",
                name.display()
            );
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        let size = entry.header().size().unwrap_or(0);
        entry
            .unpack(&dest)
            .with_context(|| format!("write {}", dest.display()))?;
        if kind.is_file() {
            files += 1;
            bytes += size;
        }
    }
    Ok((files, bytes))
}

/// The archive's bytes as they come from the session (stdout), for the unpacking thread.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The archive as the session's stdin, in pieces of [`PIECE`] bytes.
struct ChannelWriter {
    tx: mpsc::Sender<ExecActorRequest>,
    buf: Vec<u8>,
}

const PIECE: usize = 64 * 1024;

impl ChannelWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE));
        self.tx
            .blocking_send(exec::input(exec_input::Input::Stdin(data)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the session ended"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(PIECE - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PIECE {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

fn start(
    actor: &ActorRef,
    container: Option<String>,
    command: Vec<String>,
    stdin: bool,
) -> ExecStart {
    ExecStart {
        actor: Some(v1::ObjectRef {
            atespace: actor.atespace.clone(),
            name: actor.name.clone(),
        }),
        container: container.unwrap_or_default(),
        command,
        tty: false,
        stdin,
        size: None,
    }
}

pub async fn run(clients: &Clients, args: CpArgs) -> anyhow::Result<ExitCode> {
    match (parse_spec(&args.src), parse_spec(&args.dst)) {
        (Spec::Local(src), Spec::Remote(actor, path)) => {
            upload(clients, &src, &actor, &path, args.container).await
        }
        (Spec::Remote(actor, path), Spec::Local(dst)) => {
            download(clients, &actor, &path, &dst, args.container).await
        }
        (Spec::Local(_), Spec::Local(_)) => {
            bail!("one side must be in an actor: ATESPACE/NAME:PATH")
        }
        (Spec::Remote(..), Spec::Remote(..)) => {
            bail!("copies between two actors are not supported: copy through a local path")
        }
    }
}

/// The end of a session whose stdout is `on_stdout`'s: the command's exit code, its stderr
/// passed on.
async fn finish(
    output: &mut tonic::Streaming<v1::ExecOutput>,
    mut on_stdout: impl AsyncFnMut(Vec<u8>) -> bool,
) -> anyhow::Result<i32> {
    loop {
        let message = output.message().await.map_err(exec::status_error)?;
        let Some(message) = message.and_then(|m| m.output) else {
            bail!("cp: the session ended without the command's exit status");
        };
        match message {
            exec_output::Output::Stdout(data) => {
                if !on_stdout(data).await {
                    bail!("cp: the archive could not be unpacked");
                }
            }
            exec_output::Output::Stderr(data) => {
                let _ = std::io::stderr().write_all(&data);
            }
            exec_output::Output::Exit(exit) => {
                if !exit.message.is_empty() {
                    eprintln!("{}", exit.message);
                }
                return Ok(exit.code);
            }
        }
    }
}

async fn upload(
    clients: &Clients,
    src: &Path,
    actor: &ActorRef,
    path: &str,
    container: Option<String>,
) -> anyhow::Result<ExitCode> {
    let (parent, base) = remote_path(path)?;
    let meta = std::fs::metadata(src).with_context(|| format!("{}", src.display()))?;
    // -o: the files belong to whoever runs tar in the sandbox, not to this side's owner.
    let command = ["tar", "-x", "-m", "-o", "-f", "-", "-C", &parent]
        .map(String::from)
        .to_vec();
    let Session { input, mut output } =
        exec::open(clients, start(actor, container, command, true)).await?;
    let src = src.to_path_buf();
    let writer = ChannelWriter {
        tx: input.clone(),
        buf: Vec::with_capacity(PIECE),
    };
    let packing = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        if meta.is_dir() {
            builder
                .append_dir_all(&base, &src)
                .with_context(|| format!("read {}", src.display()))?;
        } else {
            builder
                .append_path_with_name(&src, &base)
                .with_context(|| format!("read {}", src.display()))?;
        }
        let mut writer = builder.into_inner().context("finish the archive")?;
        writer.flush().context("send the archive")?;
        let _ = writer
            .tx
            .blocking_send(exec::input(exec_input::Input::StdinClosed(true)));
        Ok(())
    });
    let code = finish(&mut output, async |_| true).await;
    // The call ends here: a packing thread still sending is told so and stops.
    drop(output);
    drop(input);
    let packed = packing
        .join()
        .map_err(|_| anyhow::anyhow!("cp: the archive's thread failed"))?;
    let code = code?;
    packed?;
    if code != 0 {
        bail!("tar in the sandbox failed (exit code {code})");
    }
    Ok(ExitCode::SUCCESS)
}

async fn download(
    clients: &Clients,
    actor: &ActorRef,
    path: &str,
    dst: &Path,
    container: Option<String>,
) -> anyhow::Result<ExitCode> {
    let (parent, base) = remote_path(path)?;
    // As cp: into an existing directory, else as the name given.
    let target = if dst.is_dir() {
        dst.join(&base)
    } else {
        dst.to_path_buf()
    };
    let command = ["tar", "-c", "-f", "-", "-C", &parent, &base]
        .map(String::from)
        .to_vec();
    let Session { input, mut output } =
        exec::open(clients, start(actor, container, command, false)).await?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    let unpacking = std::thread::spawn(move || {
        let mut reader = ChannelReader {
            rx,
            chunk: Vec::new(),
            at: 0,
        };
        let done = unpack(&mut reader, &base, &target);
        // The rest (the archive's padding) is read, so the sender never waits on this side.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
        done
    });
    let code = finish(&mut output, async |data| tx.send(data).await.is_ok()).await;
    drop(tx);
    drop(output);
    drop(input);
    let unpacked = unpacking
        .join()
        .map_err(|_| anyhow::anyhow!("cp: the unpacking thread failed"))?;
    // The unpacking's own error says more than the session's end it caused.
    let (files, bytes) = unpacked?;
    let code = code?;
    if code != 0 {
        bail!("tar in the sandbox failed (exit code {code})");
    }
    tracing::debug!(files, bytes, "copied");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            parse_spec("ate-demo/c1:/data/x"),
            Spec::Remote(ActorRef::new("ate-demo", "c1"), "/data/x".into())
        );
        assert_eq!(parse_spec("./a/b:c"), Spec::Local("./a/b:c".into()));
        assert_eq!(parse_spec("/tmp/f"), Spec::Local("/tmp/f".into()));
        assert_eq!(
            parse_spec("Bad_Name/x:/y"),
            Spec::Local("Bad_Name/x:/y".into())
        );
    }

    #[test]
    fn remote_paths_never_climb() {
        assert_eq!(
            remote_path("/data/x").unwrap(),
            ("/data".to_string(), "x".to_string())
        );
        assert_eq!(
            remote_path("data//./x/").unwrap(),
            ("/data".to_string(), "x".to_string())
        );
        assert_eq!(
            remote_path("/f").unwrap(),
            ("/".to_string(), "f".to_string())
        );
        assert!(remote_path("/data/../../etc/passwd").is_err());
        assert!(remote_path("..").is_err());
        assert!(remote_path("/").is_err());
        assert!(remote_path("").is_err());
    }

    #[test]
    fn entries_stay_under_the_copy() {
        assert_eq!(entry_path(Path::new("x"), "x").unwrap(), None);
        assert_eq!(
            entry_path(Path::new("./x/a/b"), "x").unwrap(),
            Some(PathBuf::from("a/b"))
        );
        assert!(entry_path(Path::new("x/../../etc"), "x").is_err());
        assert!(entry_path(Path::new("/etc/passwd"), "x").is_err());
        assert!(entry_path(Path::new("y/a"), "x").is_err());
    }

    /// A tar with `entries` (name, body; a body of None is a symlink to /etc).
    fn archive(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, body) in entries {
            let mut h = tar::Header::new_gnu();
            // Set by hand: the builder refuses the names these tests need.
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            match body {
                Some(b) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(b.len() as u64);
                    h.set_mode(0o644);
                    h.set_cksum();
                    out.extend_from_slice(h.as_bytes());
                    out.extend_from_slice(b);
                    out.resize(out.len().div_ceil(512) * 512, 0);
                }
                None => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_link_name("/etc").unwrap();
                    h.set_size(0);
                    h.set_cksum();
                    out.extend_from_slice(h.as_bytes());
                }
            }
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    #[test]
    fn unpacking_refuses_escapes_and_skips_links() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x");
        let ok = archive(&[("x/a", Some(b"hello")), ("x/l", None)]);
        assert_eq!(unpack(&ok[..], "x", &target).unwrap(), (1, 5));
        assert_eq!(std::fs::read(target.join("a")).unwrap(), b"hello");
        assert!(std::fs::symlink_metadata(target.join("l")).is_err());
        let evil = archive(&[("x/../evil", Some(b"no"))]);
        assert!(unpack(&evil[..], "x", &target).is_err());
        assert!(!dir.path().join("evil").exists());
        // A link already in the destination is not written through.
        std::os::unix::fs::symlink(dir.path(), target.join("up")).unwrap();
        let through = archive(&[("x/up/evil", Some(b"no"))]);
        assert!(unpack(&through[..], "x", &target).is_err());
        assert!(!dir.path().join("evil").exists());
    }
}
