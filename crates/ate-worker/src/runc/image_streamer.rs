//! The serving side of CRIU's image streamer (criu/img-streamer.c), for an eager restore of a
//! sealed generation: CRIU asks for each image by name on `streamer-serve.sock` in its images
//! directory and reads it from a pipe it passes over; the memory images are opened frame by
//! frame from the sealed generation as CRIU reads them, the small files (opened into the
//! scratch dir beforehand) are copied from there.
//!
//! Why: opening a 1 GiB memory image into a tmpfs before CRIU could read it was most of what a
//! sealed eager restore cost over a plaintext one (docs/benchmarks.md); streamed, the opening
//! runs alongside CRIU's own work, and no plaintext copy of the memory is ever written.
//!
//! Architecture invariant: CRIU only ever reads authenticated, checked bytes. A chunk goes into
//! the pipe after its frames opened (each under the file's key, bound to its path and index);
//! on a bad chunk the pipe is closed short, CRIU fails the restore, and the error names the
//! file. The chunks' pages go in by reference ([`ate_snapshot::PipeSink`]), so a buffer is not
//! filled again before CRIU has read it.
//!
//! Needs CRIU with the project's patch 0002 (scripts/criu-patches): upstream `criu swrk`, which
//! runc drives, refuses `stream`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ate_snapshot::FileEntry;

use crate::error::{IoContext, Result, SandboxError};

/// The socket CRIU connects to in its images directory for a restore.
const SERVE_SOCKET: &str = "streamer-serve.sock";

/// CRIU's pipes default to 64 KiB: a 1 MiB pipe (the default `fs.pipe-max-size`) means 16
/// times fewer wake-ups per GiB. A smaller limit is fine: the pipe keeps its size.
const PIPE_BYTES: i32 = 1 << 20;

/// Threads opening one memory image's chunks side by side.
const OPEN_THREADS: usize = 2;

/// How long [`ImageStreamer::finish`] waits for the last pipes once `runc restore` has returned
/// (CRIU is gone by then, so every pipe is read or closed).
const FINISH_WAIT: Duration = Duration::from_secs(10);

/// The memory images of a scratch dir opened without them ([`ate_snapshot::sealed::Opening::Small`]),
/// by the name CRIU asks for (`pages-1.img`).
#[derive(Debug)]
pub(super) struct MemoryImages {
    /// The scratch dir (its `sealed-source.json` names the sealed generation).
    generation: PathBuf,
    entries: HashMap<String, FileEntry>,
}

/// The memory images to stream for a restore from `image_dir` (a generation's `criu/`): `None`
/// unless its generation dir was opened without them (a sealed generation, streamed).
pub(super) fn memory_images(image_dir: &Path) -> Result<Option<MemoryImages>> {
    let Some(generation) = image_dir.parent() else {
        return Ok(None);
    };
    let snapshot = |e: ate_snapshot::Error| SandboxError::Checkpoint {
        path: generation.to_path_buf(),
        message: e.to_string(),
    };
    if ate_snapshot::sealed_source(generation)
        .map_err(snapshot)?
        .is_none()
    {
        return Ok(None);
    }
    let path = generation.join(ate_snapshot::MANIFEST_FILE);
    let bytes = std::fs::read(&path).ctx(|| format!("read {}", path.display()))?;
    let manifest = ate_snapshot::Manifest::from_json(&bytes).map_err(snapshot)?;
    let dir = format!("{}/", ate_snapshot::CRIU_DIR);
    let entries = manifest
        .files
        .into_iter()
        .filter(|f| f.has_chunk_digests())
        .filter_map(|f| Some((f.path.strip_prefix(&dir)?.to_string(), f)))
        .collect();
    Ok(Some(MemoryImages {
        generation: generation.to_path_buf(),
        entries,
    }))
}

/// What a finished streamer saw.
#[derive(Debug, Default)]
pub(super) struct Served {
    /// The first image that could not be served whole: a chunk refused, a sealed file missing.
    pub refused: Option<ate_snapshot::Error>,
    /// Memory bytes written to CRIU.
    pub memory_bytes: u64,
}

/// A streamer serving one restore, listening in the images directory until CRIU hangs up.
pub(super) struct ImageStreamer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Served>>,
    socket: PathBuf,
}

impl ImageStreamer {
    /// Listens on `streamer-serve.sock` in `serve_dir` (the images directory CRIU is given)
    /// and serves each name CRIU asks for: a memory image from `memory`, else the file of that
    /// name in `serve_dir`.
    pub fn start(serve_dir: &Path, memory: MemoryImages) -> Result<Self> {
        let socket = serve_dir.join(SERVE_SOCKET);
        let _ = std::fs::remove_file(&socket);
        // Bound through the directory's descriptor: a scratch path can be longer than a
        // socket address (108 bytes).
        let dir = File::open(serve_dir).ctx(|| format!("open {}", serve_dir.display()))?;
        let short = format!("/proc/self/fd/{}/{SERVE_SOCKET}", dir.as_raw_fd());
        let listener =
            UnixListener::bind(&short).ctx(|| format!("listen on {}", socket.display()))?;
        drop(dir);
        listener
            .set_nonblocking(true)
            .ctx(|| format!("listen on {}", socket.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Serving {
            dir: serve_dir.to_path_buf(),
            memory: Arc::new(memory),
        };
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("image-streamer".into())
            .spawn(move || serving.run(listener, &stopped))
            .ctx(|| "start the image streamer thread".to_string())?;
        Ok(Self {
            stop,
            thread: Some(thread),
            socket,
        })
    }

    /// Once `runc restore` has returned: what was served. A streamer CRIU never connected to
    /// (runc failed first) stops here.
    pub async fn finish(mut self) -> Served {
        self.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else {
            return Served::default();
        };
        let joined = tokio::task::spawn_blocking(move || thread.join());
        match tokio::time::timeout(FINISH_WAIT, joined).await {
            Ok(Ok(Ok(served))) => served,
            Ok(_) => Served {
                refused: Some(ate_snapshot::Error::InvalidInput(
                    "the image streamer thread panicked".into(),
                )),
                memory_bytes: 0,
            },
            Err(_) => {
                tracing::warn!(socket = %self.socket.display(), "the image streamer still has pipes open after the restore; leaving it");
                Served::default()
            }
        }
    }
}

impl Drop for ImageStreamer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Serving {
    dir: PathBuf,
    memory: Arc<MemoryImages>,
}

/// A pipe's write end, with what is written to it counted.
type Writer = std::thread::JoinHandle<(u64, Option<ate_snapshot::Error>)>;

impl Serving {
    fn run(self, listener: UnixListener, stop: &AtomicBool) -> Served {
        let conn = loop {
            match listener.accept() {
                Ok((conn, _)) => break conn,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if stop.load(Ordering::Relaxed) {
                        return Served::default();
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "image streamer: accept");
                    return Served::default();
                }
            }
        };
        drop(listener);
        let mut writers = Vec::new();
        if let Err(e) = self.serve(conn, &mut writers) {
            // CRIU's side of the protocol broke (it died, or sent what this does not speak):
            // the restore fails on its own; nothing here is about the generation.
            tracing::debug!(error = %e, "image streamer: connection ended");
        }
        let mut served = Served::default();
        for w in writers {
            if let Ok((bytes, refused)) = w.join() {
                served.memory_bytes += bytes;
                if served.refused.is_none() {
                    served.refused = refused;
                }
            }
        }
        served
    }

    /// One request after another until CRIU closes the socket (it is done with the images).
    fn serve(&self, mut conn: UnixStream, writers: &mut Vec<Writer>) -> io::Result<()> {
        conn.set_nonblocking(false)?;
        while let Some(name) = read_request(&mut conn)? {
            let source = self.source(&name);
            write_reply(&mut conn, source.is_some())?;
            let Some(source) = source else { continue };
            // The pipe CRIU passes after a reply that the file exists.
            let pipe = ate_page_source::source::criu::receive_criu_fd(conn.as_raw_fd())?
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        "CRIU sent no pipe after the reply",
                    )
                })?;
            let memory = self.memory.clone();
            writers.push(
                std::thread::Builder::new()
                    .name("image-pipe".into())
                    .spawn(move || write_image(source, &memory, File::from(pipe)))?,
            );
        }
        Ok(())
    }

    fn source(&self, name: &str) -> Option<Source> {
        // CRIU asks for plain names (`pages-1.img`); nothing else is served.
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return None;
        }
        if self.memory.entries.contains_key(name) {
            return Some(Source::Memory(name.to_string()));
        }
        let path = self.dir.join(name);
        path.is_file().then_some(Source::File(path))
    }
}

enum Source {
    Memory(String),
    File(PathBuf),
}

/// Writes one image into its pipe and closes it. A reader that hangs up (CRIU failed on
/// something else, or needed no more) is not the generation's fault.
fn write_image(
    source: Source,
    memory: &MemoryImages,
    mut pipe: File,
) -> (u64, Option<ate_snapshot::Error>) {
    match source {
        Source::File(path) => {
            if let Err(e) = File::open(&path).and_then(|mut f| io::copy(&mut f, &mut pipe)) {
                tracing::debug!(file = %path.display(), error = %e, "image streamer: file not sent whole");
            }
            (0, None)
        }
        Source::Memory(name) => {
            let Some(entry) = memory.entries.get(&name) else {
                return (0, None);
            };
            // Fewer wake-ups per GiB; a smaller `fs.pipe-max-size` keeps the default.
            let _ = nix::fcntl::fcntl(pipe.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
            // The opened chunks' pages go into the pipe by reference: CRIU's read is the only
            // copy of the memory after opening it.
            let mut out = Paced::from_env(ate_snapshot::PipeSink::new(pipe));
            let streamed = ate_snapshot::MemoryFile::open(&memory.generation, entry)
                .and_then(|file| file.stream_to(entry, &mut out, Path::new(&name), OPEN_THREADS));
            if let Err(e) = out.sink.finish() {
                tracing::warn!(image = %name, error = %e, "image streamer: the pipe was not read to its end; its buffers are left allocated");
            }
            match streamed {
                Ok(()) => (entry.size, None),
                Err(ate_snapshot::Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::BrokenPipe =>
                {
                    tracing::debug!(image = %name, "image streamer: CRIU closed the pipe early");
                    (0, None)
                }
                Err(e) => (0, Some(e)),
            }
        }
    }
}

/// Where a memory image's chunks go. Test-only pacing (`ATE_FAULT_IMAGE_STREAM_DELAY_MS`): a
/// pause after every chunk (2 MiB) keeps an eager restore streaming long enough for a fault
/// test to kill a process in the middle of it.
struct Paced<S> {
    sink: S,
    delay: Option<Duration>,
}

impl<S> Paced<S> {
    fn from_env(sink: S) -> Self {
        let delay = std::env::var("ATE_FAULT_IMAGE_STREAM_DELAY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis);
        Paced { sink, delay }
    }
}

impl<S: ate_snapshot::ChunkSink> ate_snapshot::ChunkSink for Paced<S> {
    fn write_chunk(
        &mut self,
        buf: Vec<u8>,
        pieces: &[std::ops::Range<usize>],
    ) -> io::Result<Vec<Vec<u8>>> {
        let freed = self.sink.write_chunk(buf, pieces)?;
        if let Some(delay) = self.delay {
            std::thread::sleep(delay);
        }
        Ok(freed)
    }
}

/// CRIU's framing (`pb_write_one`): a native-endian u32 length, then the message.
fn read_message(conn: &mut UnixStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match conn.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_ne_bytes(len) as usize;
    // A file name: anything larger is not CRIU speaking.
    if len > 4096 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {len}-byte request"),
        ));
    }
    let mut msg = vec![0u8; len];
    conn.read_exact(&mut msg)?;
    Ok(Some(msg))
}

fn read_request(conn: &mut UnixStream) -> io::Result<Option<String>> {
    use prost::Message;
    let Some(msg) = read_message(conn)? else {
        return Ok(None);
    };
    let req = ImgStreamerRequestEntry::decode(msg.as_slice())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some(req.filename))
}

fn write_reply(conn: &mut UnixStream, exists: bool) -> io::Result<()> {
    use prost::Message;
    let body = ImgStreamerReplyEntry { exists }.encode_to_vec();
    let mut framed = (body.len() as u32).to_ne_bytes().to_vec();
    framed.extend_from_slice(&body);
    conn.write_all(&framed)
}

/// `img_streamer_request_entry` (images/img-streamer.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct ImgStreamerRequestEntry {
    #[prost(string, required, tag = "1")]
    filename: String,
}

/// `img_streamer_reply_entry` (images/img-streamer.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct ImgStreamerReplyEntry {
    #[prost(bool, required, tag = "1")]
    exists: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRIU's side of one exchange, as img-streamer.c does it.
    fn ask(conn: &mut UnixStream, name: &str) -> Option<Vec<u8>> {
        use prost::Message;
        let body = ImgStreamerRequestEntry {
            filename: name.into(),
        }
        .encode_to_vec();
        let mut framed = (body.len() as u32).to_ne_bytes().to_vec();
        framed.extend_from_slice(&body);
        conn.write_all(&framed).unwrap();
        let reply = read_message(conn).unwrap().unwrap();
        let reply = ImgStreamerReplyEntry::decode(reply.as_slice()).unwrap();
        if !reply.exists {
            return None;
        }
        let (read, write) = nix::unistd::pipe().unwrap();
        let fds = [write.as_raw_fd()];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        nix::sys::socket::sendmsg::<()>(
            conn.as_raw_fd(),
            &[io::IoSlice::new(&[0])],
            &cmsg,
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .unwrap();
        drop(write);
        let mut out = Vec::new();
        File::from(read).read_to_end(&mut out).unwrap();
        Some(out)
    }

    #[tokio::test]
    async fn serves_files_by_name_and_nothing_outside_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("inventory.img"), b"inventory bytes").unwrap();
        std::fs::write(dir.path().join("outside"), b"x").unwrap();
        let serve = dir.path().join("criu");
        std::fs::create_dir(&serve).unwrap();
        std::fs::write(serve.join("core-1.img"), vec![7u8; 300_000]).unwrap();
        let memory = MemoryImages {
            generation: dir.path().to_path_buf(),
            entries: HashMap::new(),
        };
        let streamer = ImageStreamer::start(&serve, memory).unwrap();
        let mut conn = UnixStream::connect(serve.join(SERVE_SOCKET)).unwrap();
        assert_eq!(ask(&mut conn, "core-1.img").unwrap(), vec![7u8; 300_000]);
        assert_eq!(ask(&mut conn, "missing.img"), None);
        assert_eq!(ask(&mut conn, "../outside"), None);
        assert_eq!(ask(&mut conn, ".."), None);
        drop(conn);
        let served = streamer.finish().await;
        assert!(served.refused.is_none());
        assert!(!serve.join(SERVE_SOCKET).exists());
    }

    #[tokio::test]
    async fn a_streamer_criu_never_reached_stops_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let memory = MemoryImages {
            generation: dir.path().to_path_buf(),
            entries: HashMap::new(),
        };
        let streamer = ImageStreamer::start(dir.path(), memory).unwrap();
        let served = tokio::time::timeout(Duration::from_secs(5), streamer.finish())
            .await
            .expect("finish returns");
        assert!(served.refused.is_none());
        assert_eq!(served.memory_bytes, 0);
    }
}
