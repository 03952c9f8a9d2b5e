//! One atunnel tunnel's byte pipe (router ⇄ actor), with what a graceful suspend needs to know
//! about it: when bytes last went each way (a tunnel whose last bytes were the actor's answer and
//! that has been quiet since is idle — a pooled keep-alive connection — and can be closed without
//! cutting a request), and whether it carries a WebSocket (which gets a close frame, code 1001,
//! at a frame boundary instead of a cut).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// What the worker asks of a tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Run,
    /// Close now (an idle tunnel during a drain, or ingress off).
    Close,
    /// A WebSocket: finish the frame in flight, send close (1001, "actor suspending"), close.
    GoingAway,
}

/// WebSocket close code "going away".
const GOING_AWAY: u16 = 1001;
const GOING_AWAY_REASON: &[u8] = b"actor suspending";

/// What the drain reads about one tunnel.
#[derive(Debug)]
pub struct TunnelState {
    /// Milliseconds (since the tunnel's creation) of the last bytes router → actor and
    /// actor → router; -1 before any.
    up_ms: AtomicI64,
    down_ms: AtomicI64,
    websocket: AtomicBool,
    /// Handed off to the router (`ate_worker::handoff`): no bytes pass here, and the router closes
    /// it itself once idle when told to, so a drain treats it as idle.
    handoff: bool,
    born: std::time::Instant,
    command: watch::Sender<Command>,
    /// Called whenever bytes pass: the upstream leg of a hibernating WebSocket is not counted
    /// as an open tunnel, so its frames record the actor's activity as they flow.
    activity: Option<ActivityHook>,
}

struct ActivityHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ActivityHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ActivityHook")
    }
}

impl TunnelState {
    pub fn new() -> Arc<Self> {
        Self::with_handoff(false)
    }

    /// The state of a tunnel handed off to the router.
    pub fn handoff() -> Arc<Self> {
        Self::with_handoff(true)
    }

    /// The state of a tunnel whose bytes call `activity` as they pass.
    pub fn with_activity(activity: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Self::build(false, Some(ActivityHook(Box::new(activity))))
    }

    fn with_handoff(handoff: bool) -> Arc<Self> {
        Self::build(handoff, None)
    }

    fn build(handoff: bool, activity: Option<ActivityHook>) -> Arc<Self> {
        let (command, _) = watch::channel(Command::Run);
        Arc::new(TunnelState {
            up_ms: AtomicI64::new(-1),
            down_ms: AtomicI64::new(-1),
            websocket: AtomicBool::new(false),
            handoff,
            born: std::time::Instant::now(),
            command,
            activity,
        })
    }

    /// What the worker asks of this tunnel, as it changes.
    pub fn commands(&self) -> watch::Receiver<Command> {
        self.command.subscribe()
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.born.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn note_activity(&self) {
        if let Some(ActivityHook(activity)) = &self.activity {
            activity();
        }
    }

    pub fn is_websocket(&self) -> bool {
        self.websocket.load(Ordering::Acquire)
    }

    /// No request in flight: nothing ever sent, or the actor spoke last and both sides have
    /// been quiet for `quiet`. Always for a handed-off tunnel: told to close, the router waits
    /// for its request in flight itself.
    pub fn is_idle(&self, quiet: Duration) -> bool {
        if self.handoff {
            return true;
        }
        let up = self.up_ms.load(Ordering::Acquire);
        let down = self.down_ms.load(Ordering::Acquire);
        if up < 0 {
            return true;
        }
        let quiet_ms = i64::try_from(quiet.as_millis()).unwrap_or(i64::MAX);
        down >= up && self.now_ms().saturating_sub(down) >= quiet_ms
    }

    pub fn command(&self, c: Command) {
        self.command.send_if_modified(|cur| {
            // Close wins over GoingAway; nothing goes back to Run.
            let next = match (*cur, c) {
                (Command::Close, _) => Command::Close,
                (_, Command::Run) => *cur,
                (_, c) => c,
            };
            let changed = next != *cur;
            *cur = next;
            changed
        });
    }
}

/// Copies both ways until either side ends, `cut` turns true, or the tunnel is told to close.
pub async fn run<D, U>(
    downstream: D,
    upstream: U,
    state: Arc<TunnelState>,
    mut cut: watch::Receiver<bool>,
    buf_size: usize,
) where
    D: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut down_r, mut down_w) = tokio::io::split(downstream);
    let (mut up_r, mut up_w) = tokio::io::split(upstream);
    let looks_like_ws = Arc::new(AtomicBool::new(false));

    // router → actor
    let up = {
        let (state, looks_like_ws) = (state.clone(), looks_like_ws.clone());
        let mut commands = state.command.subscribe();
        async move {
            let mut buf = vec![0u8; buf_size];
            let mut first = true;
            loop {
                let n = tokio::select! {
                    r = down_r.read(&mut buf) => match r { Ok(n) => n, Err(_) => return },
                    _ = commands.wait_for(|c| *c == Command::Close) => return,
                };
                if n == 0 {
                    let _ = up_w.shutdown().await;
                    return;
                }
                if first {
                    first = false;
                    looks_like_ws.store(is_websocket_request(&buf[..n]), Ordering::Release);
                }
                state.up_ms.store(state.now_ms(), Ordering::Release);
                state.note_activity();
                if up_w.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };

    // actor → router, watching WebSocket frame boundaries once upgraded
    let down = {
        let state = state.clone();
        let mut commands = state.command.subscribe();
        async move {
            let mut buf = vec![0u8; buf_size];
            let mut first = true;
            let mut frames: Option<FrameTracker> = None;
            loop {
                let going_away = *commands.borrow() == Command::GoingAway;
                if going_away && frames.as_ref().is_some_and(FrameTracker::at_boundary) {
                    let _ = down_w.write_all(&close_frame()).await;
                    let _ = down_w.shutdown().await;
                    return;
                }
                let n = tokio::select! {
                    r = up_r.read(&mut buf) => match r { Ok(n) => n, Err(_) => return },
                    changed = commands.changed() => {
                        if changed.is_err() || *commands.borrow() == Command::Close {
                            return;
                        }
                        continue;
                    }
                };
                if n == 0 {
                    let _ = down_w.shutdown().await;
                    return;
                }
                let chunk = &buf[..n];
                if first {
                    first = false;
                    if looks_like_ws.load(Ordering::Acquire) && chunk.starts_with(b"HTTP/1.1 101") {
                        state.websocket.store(true, Ordering::Release);
                        // Frames start after the response head.
                        frames = Some(FrameTracker {
                            skip_head: true,
                            ..Default::default()
                        });
                    }
                }
                if let Some(t) = frames.as_mut() {
                    t.feed(chunk);
                }
                state.down_ms.store(state.now_ms(), Ordering::Release);
                state.note_activity();
                if down_w.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    };

    let going_away = state.command.subscribe();
    let both = async {
        tokio::pin!(up);
        tokio::pin!(down);
        tokio::select! {
            _ = &mut down => {
                // After a close frame the client gets a moment to answer with its own, then
                // the tunnel ends (a drain must not wait for a client that never replies).
                if *going_away.borrow() == Command::GoingAway {
                    let _ = tokio::time::timeout(CLOSE_REPLY_WAIT, &mut up).await;
                } else {
                    up.await;
                }
            }
            _ = &mut up => down.await,
        }
    };
    tokio::select! {
        _ = both => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}

/// How long a client gets to answer our WebSocket close frame.
const CLOSE_REPLY_WAIT: Duration = Duration::from_millis(500);

/// The first bytes of an HTTP/1.1 request asking for a WebSocket.
fn is_websocket_request(head: &[u8]) -> bool {
    if !head.starts_with(b"GET ") {
        return false;
    }
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len());
    let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    text.lines().any(|l| {
        l.strip_prefix("upgrade:")
            .is_some_and(|v| v.split(',').any(|t| t.trim() == "websocket"))
    })
}

/// `close` frame from the server side (unmasked): code 1001 and a reason.
fn close_frame() -> Vec<u8> {
    let mut f = vec![0x88, (2 + GOING_AWAY_REASON.len()) as u8];
    f.extend_from_slice(&GOING_AWAY.to_be_bytes());
    f.extend_from_slice(GOING_AWAY_REASON);
    f
}

/// Follows the actor's WebSocket frames byte by byte (headers may split across reads) to know
/// when the stream is between two frames.
#[derive(Debug, Default)]
struct FrameTracker {
    /// Still inside the HTTP 101 response head (until `\r\n\r\n`).
    skip_head: bool,
    head_tail: [u8; 4],
    /// Bytes of the current frame's header seen so far, and the header's full length once known.
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
}

impl FrameTracker {
    fn at_boundary(&self) -> bool {
        !self.skip_head && self.header.is_empty() && self.payload_left == 0
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.skip_head {
                let b = bytes[0];
                bytes = &bytes[1..];
                self.head_tail.rotate_left(1);
                self.head_tail[3] = b;
                if &self.head_tail == b"\r\n\r\n" {
                    self.skip_head = false;
                }
                continue;
            }
            if self.payload_left > 0 {
                let take = self.payload_left.min(bytes.len() as u64) as usize;
                self.payload_left -= take as u64;
                bytes = &bytes[take..];
                continue;
            }
            // In a header.
            self.header.push(bytes[0]);
            bytes = &bytes[1..];
            if let Some((len, payload)) = header_length(&self.header)
                && self.header.len() == len
            {
                self.header.clear();
                self.payload_left = payload;
            }
        }
    }
}

/// For the header bytes seen so far: (header length, payload length) once they are known.
fn header_length(h: &[u8]) -> Option<(usize, u64)> {
    if h.len() < 2 {
        return None;
    }
    let masked = h[1] & 0x80 != 0;
    let mask = if masked { 4 } else { 0 };
    match h[1] & 0x7f {
        126 => {
            if h.len() < 4 {
                return None;
            }
            let n = u16::from_be_bytes([h[2], h[3]]) as u64;
            Some((4 + mask, n))
        }
        127 => {
            if h.len() < 10 {
                return None;
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[2..10]);
            Some((10 + mask, u64::from_be_bytes(b)))
        }
        n => Some((2 + mask, u64::from(n))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_requests_are_recognised() {
        assert!(is_websocket_request(
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        ));
        assert!(is_websocket_request(
            b"GET / HTTP/1.1\r\nupgrade: WebSocket\r\n\r\n"
        ));
        assert!(!is_websocket_request(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(!is_websocket_request(
            b"POST / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"
        ));
    }

    #[test]
    fn frame_boundaries_across_split_reads() {
        let mut t = FrameTracker {
            skip_head: true,
            ..Default::default()
        };
        t.feed(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r");
        assert!(!t.at_boundary());
        t.feed(b"\n");
        assert!(t.at_boundary());
        // A 5-byte text frame split in three reads, then a 300-byte one (16-bit length).
        t.feed(&[0x81]);
        assert!(!t.at_boundary());
        t.feed(&[0x05, b'h', b'e']);
        assert!(!t.at_boundary());
        t.feed(b"llo");
        assert!(t.at_boundary());
        let mut big = vec![0x82, 126, 0x01, 0x2c];
        big.extend(std::iter::repeat_n(7u8, 299));
        t.feed(&big);
        assert!(!t.at_boundary());
        t.feed(&[7]);
        assert!(t.at_boundary());
    }

    #[test]
    fn idle_means_answered_and_quiet() {
        let s = TunnelState::new();
        assert!(s.is_idle(Duration::from_millis(100)), "nothing sent yet");
        s.up_ms.store(s.now_ms(), Ordering::Release);
        assert!(!s.is_idle(Duration::ZERO), "a request without an answer");
        s.down_ms.store(s.now_ms(), Ordering::Release);
        assert!(s.is_idle(Duration::ZERO));
        assert!(!s.is_idle(Duration::from_secs(60)), "answered just now");
        s.command(Command::GoingAway);
        s.command(Command::Close);
        s.command(Command::GoingAway);
        assert_eq!(*s.command.borrow(), Command::Close);
    }

    #[test]
    fn the_close_frame_says_going_away() {
        let f = close_frame();
        assert_eq!(f[0], 0x88);
        assert_eq!(f[1] as usize, f.len() - 2);
        assert_eq!(u16::from_be_bytes([f[2], f[3]]), 1001);
    }
}
