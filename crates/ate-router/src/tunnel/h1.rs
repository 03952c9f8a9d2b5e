//! HTTP/1.1 tunnels: the pool of idle connections per (actor, port), each returned by the end
//! of its response body; connections handed over by a worker on this machine (the actor's own
//! socket, whose I/O the request holding it polls, and the watcher that acts on RETIRE) or
//! opened as CONNECT streams.

use std::future::Future;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::actor_ref::ActorKey;
use crate::body::RouterBody;
use crate::cache::Route;

use super::{SendFailed, TunnelError, Tunnels, request_id_of};

/// Whether atunnel asked for a handed-off tunnel back (the actor drains for a suspend). Read and
/// written under the pool's lock: a retired connection found in the pool is closed at once, one
/// a request holds is closed when that request's response ends (it is not put back).
#[derive(Debug, Default)]
struct HandoffUse {
    retired: AtomicBool,
    /// The watcher cut the socket (atunnel gone, or speaking out of turn): an end of stream read
    /// after this may be the cut's, not the actor's.
    cut: AtomicBool,
}

/// What a handed-off connection has beyond a CONNECT one, boxed so that [`H1Conn`] (which a
/// request's future holds) stays small. `_alive` ties it to its watcher task
/// ([`Tunnels::watch_handoff`]): dropped with the connection, wherever that happens, it ends the
/// watcher, whose end closes the unix connection, which is the tunnel's end at atunnel.
struct Handed {
    usage: Arc<HandoffUse>,
    _alive: tokio::sync::oneshot::Sender<()>,
    /// The connection's I/O, polled by whoever holds the connection; `None` once it has ended.
    driver: Option<Driver>,
    /// The actor it serves: the pool's key at every return, without a new copy of the name
    /// per request.
    actor: ActorKey,
    /// A second descriptor of the unix connection (the watcher reads the first): whether
    /// atunnel has ended it is checked here at once, without waiting for the watcher's turn.
    control: std::os::fd::OwnedFd,
}

impl Handed {
    fn retired(&self) -> bool {
        self.usage.retired.load(Ordering::SeqCst)
    }

    /// Whether the tunnel was cut rather than closed by the actor: the watcher cut the socket,
    /// or atunnel ended the unix connection (it does so before its own cut, `shutdown(2)` at
    /// ingress off, so an end of stream that cut caused is always read after this shows).
    fn cut(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        if self.usage.cut.load(Ordering::SeqCst) {
            return true;
        }
        // atunnel's close shows as POLLHUP, a shutdown of its writing as POLLRDHUP, even while a
        // RETIRE byte waits unread. nix has no name for POLLRDHUP: revents holding it do not
        // convert (`None`), and it is the only bit asked for beyond nix's own.
        let rdhup = PollFlags::from_bits_retain(nix::libc::POLLRDHUP);
        let mut fds = [PollFd::new(self.control.as_fd(), PollFlags::POLLIN | rdhup)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(n) if n > 0 => fds[0]
                .revents()
                .is_none_or(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
            // Nothing to read: atunnel still holds it. (A failed poll, EINTR, says nothing
            // either; the watcher's flag still counts.)
            _ => false,
        }
    }
}

/// The I/O of an HTTP/1.1 connection to an actor (hyper's connection future), polled by the task
/// that holds the connection: the request's own task while it waits for the answer and streams
/// the body, so a warm request never hands off to another task (no cross-task wake-ups: +15-18 %
/// req/s at 16 connections, docs/benchmarks.md). An idle pooled connection is
/// polled by the next request that checks it out, which then sees what happened meanwhile (the
/// actor closed it, or the previous response's end).
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

pub(super) struct IdleH1 {
    pub(super) conn: H1Conn,
    pub(super) since: Instant,
}

/// An HTTP/1.1 connection to an actor over a tunnel.
pub struct H1Conn {
    pub sender: http1::SendRequest<Incoming>,
    worker: Arc<str>,
    port: u16,
    /// Set for a handed-off tunnel (the actor's own socket), whose I/O its holder polls; a
    /// CONNECT tunnel's runs in a task of its own (its bytes cross the shared HTTP/2
    /// connection's task anyway).
    handoff: Option<Box<Handed>>,
}

impl H1Conn {
    /// Whether the connection's I/O is polled by its holder (and has not ended).
    fn polled_inline(&self) -> bool {
        self.handoff.as_ref().is_some_and(|h| h.driver.is_some())
    }

    /// Polls the connection's I/O in the caller's task (nothing when it has its own task).
    fn poll_io(&mut self, cx: &mut Context<'_>) {
        if let Some(handed) = &mut self.handoff
            && let Some(driver) = &mut handed.driver
            && let Poll::Ready(result) = driver.as_mut().poll(cx)
        {
            if let Err(e) = result {
                tracing::debug!(error = %e, "handed-off HTTP/1.1 connection ended");
            }
            handed.driver = None;
        }
    }

    /// Waits for `answer` (the response to a request just given to this connection), polling
    /// the connection's I/O in this same task.
    fn drive<'a, F: Future>(&'a mut self, answer: Pin<&'a mut F>) -> Drive<'a, F> {
        Drive { conn: self, answer }
    }

    /// The connection will not be reused (the pool is off): its I/O gets a task of its own,
    /// which ends after the response in flight (the sender is dropped here).
    fn detach(self) {
        if let Some(mut handed) = self.handoff
            && let Some(driver) = handed.driver.take()
        {
            tokio::spawn(async move {
                if let Err(e) = driver.await {
                    tracing::debug!(error = %e, "handed-off HTTP/1.1 connection ended");
                }
                drop(handed);
            });
        }
    }
}

/// [`H1Conn::drive`]'s future. Written out rather than an `async fn` so that the answer's
/// future is stored once, pinned in the request's future, not copied into this one: the request
/// future's size is what every parked request costs.
struct Drive<'a, F> {
    conn: &'a mut H1Conn,
    answer: Pin<&'a mut F>,
}

impl<F: Future> Future for Drive<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if let Poll::Ready(out) = this.answer.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        if !this.conn.polled_inline() {
            return Poll::Pending;
        }
        this.conn.poll_io(cx);
        this.answer.as_mut().poll(cx)
    }
}

/// A pooled HTTP/1.1 connection waiting for the end of the response body it carries, carried by
/// that body ([`crate::body::RouterBody`]): the body's end puts the connection back in the pool
/// in place, without a task per request waiting for it to be ready again (a pooled connection
/// that is not ready yet is skipped by `checkout`, not dropped).
pub struct PoolReturn {
    tunnels: Arc<Tunnels>,
    key: ActorKey,
    pub(super) conn: H1Conn,
    /// The body is delimited by the connection's close (no Content-Length, not chunked), so an
    /// end of stream is its end only if the actor closed the connection (see
    /// [`PoolReturn::cut_before_end`]).
    until_close: bool,
}

impl PoolReturn {
    /// The body ended: the connection goes back to the pool (unless atunnel asked for it back,
    /// or the pool is full: then it is dropped, which closes it).
    pub fn done(self) {
        let PoolReturn {
            tunnels, key, conn, ..
        } = self;
        if conn.sender.is_closed() {
            return;
        }
        let mut idle = tunnels.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the pool's lock, where the watcher sets it: a connection atunnel asked
        // for back while the request ran is closed now, not pooled.
        if conn.handoff.as_ref().is_some_and(|h| h.retired()) {
            drop(idle);
            return;
        }
        let conns = idle.entry(key).or_default();
        if conns.len() < tunnels.cfg.idle_per_actor {
            conns.push(IdleH1 {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Whether the end of stream of a body delimited by the connection's close came from a cut
    /// (ingress off, the worker gone) rather than the actor closing the connection: such a body
    /// may be short, and must reach the client as an error. A body with a length or chunks
    /// needs no check (a cut before its end is already an error). Only a handed-off connection
    /// can tell: a CONNECT tunnel's cut (the stream reset by atunnel) reads as its end of
    /// stream (hyper reads `CANCEL` as a clean end).
    pub fn cut_before_end(&self) -> bool {
        self.until_close && self.conn.handoff.as_ref().is_some_and(|h| h.cut())
    }

    /// Polls the connection's I/O (the body's task drives it while the body streams).
    pub fn poll_io(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.conn.polled_inline() {
            return false;
        }
        self.conn.poll_io(cx);
        true
    }
}

impl std::fmt::Debug for PoolReturn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolReturn")
            .field("worker", &self.conn.worker)
            .field("port", &self.conn.port)
            .finish()
    }
}

impl Tunnels {
    /// A new HTTP/1.1 connection over a new tunnel (upgrades allowed, for WebSocket).
    pub async fn new_h1(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, TunnelError> {
        // Boxed, like the worker connection: opening a tunnel (CONNECT stream, upgrade, HTTP/1.1
        // handshake) is a large future that would otherwise sit in every request's future,
        // parked ones included; the warm path takes a pooled tunnel and never gets here (with
        // the pool off, this is one allocation beside a new CONNECT stream and handshake).
        Box::pin(self.new_h1_unboxed(route, actor, port, request_id)).await
    }

    /// A new HTTP/1.1 connection for the pool: the actor's own socket handed over by a worker
    /// on this machine when there is one (`--local-tunnels`), else a CONNECT tunnel. No upgrades
    /// go over it (WebSockets take [`Tunnels::new_h1`]: atunnel closes them with a close frame
    /// on a suspend, which needs the bytes to pass through it).
    async fn pooled_h1(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, TunnelError> {
        if let Some(dir) = &self.cfg.local_tunnels {
            match self.handed_h1(dir, route, actor, port, request_id).await {
                Ok(conn) => return Ok(conn),
                Err(crate::handoff::HandoffError::Unavailable { .. }) => {}
                Err(crate::handoff::HandoffError::Refused(reply)) => {
                    return Err(match reply {
                        ate_core::handoff::Reply::Stale(_) => TunnelError::Stale,
                        ate_core::handoff::Reply::PortClosed(_) => TunnelError::PortClosed,
                        ate_core::handoff::Reply::Refused(status, _) => TunnelError::Refused(
                            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                        ),
                        ate_core::handoff::Reply::Ok => TunnelError::Refused(StatusCode::OK),
                    });
                }
                Err(e) => {
                    // The worker's process is going or gone: as when its atunnel does not
                    // answer, the route is bad.
                    return Err(TunnelError::Connect {
                        worker: route.worker.clone(),
                        source: std::io::Error::other(e.to_string()),
                    });
                }
            }
        }
        self.new_h1(route, actor, port, request_id).await
    }

    async fn handed_h1(
        self: &Arc<Self>,
        dir: &std::path::Path,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, crate::handoff::HandoffError> {
        let request = ate_core::handoff::Request {
            actor,
            port,
            // 0: an assignment without a token (as the CONNECT path, none is sent).
            activation: (route.activation != 0).then_some(route.activation),
            request_id,
        };
        let handed =
            crate::handoff::take(dir, &route.worker, &request, self.cfg.connect_timeout).await?;
        self.stats.tunnel_connects.fetch_add(1, Ordering::Relaxed);
        self.stats.tunnel_handoffs.fetch_add(1, Ordering::Relaxed);
        let io_err = |e: std::io::Error| crate::handoff::HandoffError::Io {
            worker: route.worker.to_string(),
            source: e,
        };
        // A second descriptor of the socket, for the watcher to cut it with (`shutdown(2)`)
        // whoever holds the connection at that moment.
        let cut = handed.tcp.as_fd().try_clone_to_owned().map_err(io_err)?;
        let control = handed
            .control
            .as_fd()
            .try_clone_to_owned()
            .map_err(io_err)?;
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(handed.tcp))
            .await
            .map_err(|e| io_err(std::io::Error::other(e)))?;
        let usage = Arc::new(HandoffUse {
            retired: AtomicBool::new(handed.retired),
            cut: AtomicBool::new(false),
        });
        let (alive, dropped) = tokio::sync::oneshot::channel();
        let key = ActorKey::from_validated(actor);
        tokio::spawn(Self::watch_handoff(
            Arc::downgrade(self),
            key.clone(),
            usage.clone(),
            handed.control,
            std::net::TcpStream::from(cut),
            dropped,
        ));
        Ok(H1Conn {
            sender,
            worker: route.worker.clone(),
            port,
            handoff: Some(Box::new(Handed {
                usage,
                _alive: alive,
                driver: Some(Box::pin(conn)),
                actor: key,
                control,
            })),
        })
    }

    /// Holds a handed-off tunnel's unix connection for as long as the connection lives, and
    /// acts on what atunnel says on it: [`ate_core::handoff::RETIRE`] closes the connection if
    /// it sits in the pool (else its request's end does, see [`PoolReturn::done`]); atunnel gone
    /// (the worker process ended) or speaking out of turn cuts the socket at once, request in
    /// flight or not, so nothing reaches a copy no worker vouches for. Returning drops `control`,
    /// which tells atunnel the tunnel ended.
    async fn watch_handoff(
        tunnels: std::sync::Weak<Self>,
        key: ActorKey,
        usage: Arc<HandoffUse>,
        mut control: tokio::net::UnixStream,
        socket: std::net::TcpStream,
        mut dropped: tokio::sync::oneshot::Receiver<()>,
    ) {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        loop {
            tokio::select! {
                // The connection was dropped (closed): the tunnel ends with it.
                _ = &mut dropped => return,
                read = control.read(&mut byte) => match read {
                    Ok(1) if byte[0] == ate_core::handoff::RETIRE => {
                        let Some(tunnels) = tunnels.upgrade() else { return };
                        if tunnels.retire_handoff(&key, &usage) {
                            return;
                        }
                        // A request holds it: its end closes it, and `dropped` fires.
                    }
                    _ => {
                        // Before the cut: a body that reads the cut as its end sees this.
                        usage.cut.store(true, Ordering::SeqCst);
                        let _ = socket.shutdown(std::net::Shutdown::Both);
                        if let Some(tunnels) = tunnels.upgrade() {
                            tunnels.retire_handoff(&key, &usage);
                        }
                        return;
                    }
                },
            }
        }
    }

    /// Marks a handed-off connection retired and closes it if it sits in the pool; says whether
    /// it did (false: a request holds it).
    fn retire_handoff(&self, key: &ActorKey, usage: &Arc<HandoffUse>) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        usage.retired.store(true, Ordering::SeqCst);
        let Some(conns) = idle.get_mut(key.as_str()) else {
            return false;
        };
        let Some(i) = conns.iter().position(|c| {
            c.conn
                .handoff
                .as_ref()
                .is_some_and(|h| Arc::ptr_eq(&h.usage, usage))
        }) else {
            return false;
        };
        let conn = conns.swap_remove(i);
        if conns.is_empty() {
            idle.remove(key.as_str());
        }
        drop(idle);
        drop(conn);
        true
    }

    async fn new_h1_unboxed(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<H1Conn, TunnelError> {
        let io = self.open(route, actor, port, request_id).await?;
        let (sender, conn) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(TunnelError::Actor)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "tunnel HTTP/1.1 connection ended");
            }
        });
        Ok(H1Conn {
            sender,
            worker: route.worker.clone(),
            port,
            handoff: None,
        })
    }

    /// Sends `request` over HTTP/1.1, reusing an idle tunnel when one exists. A pooled connection
    /// that turns out dead before the request was written is replaced transparently.
    pub async fn send_h1(
        self: &Arc<Self>,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        // One call site for sending, so the request's future holds one send state, not two.
        let mut fresh = false;
        loop {
            let pooled = std::future::poll_fn(|cx| {
                Poll::Ready(self.checkout(actor, port, &route.worker, cx))
            })
            .await;
            let mut conn = match pooled {
                Some(conn) => {
                    self.stats.tunnel_reuses.fetch_add(1, Ordering::Relaxed);
                    conn
                }
                None => {
                    let id = request_id_of(&request);
                    // Boxed for the same reason as `new_h1`: a new connection (a handoff or a
                    // CONNECT tunnel) is a large future, and the warm path never makes one.
                    match Box::pin(self.pooled_h1(route, actor, port, id)).await {
                        Ok(conn) => {
                            fresh = true;
                            conn
                        }
                        Err(error) => {
                            return Err(SendFailed {
                                error,
                                request: Some(request),
                            });
                        }
                    }
                }
            };
            let answer = std::pin::pin!(conn.sender.try_send_request(request));
            match conn.drive(answer).await {
                Ok(response) => return Ok(self.respond(actor, conn, response)),
                Err(mut e) => match e.take_message() {
                    // A pooled connection that died before the request was written: another.
                    Some(back) if !fresh => request = back,
                    // A fresh one too: the request was not written, so the caller may send it
                    // again (its worker may be restarting).
                    back => {
                        return Err(SendFailed {
                            error: TunnelError::Actor(e.into_error()),
                            request: back,
                        });
                    }
                },
            }
        }
    }

    /// The actor's response, its body returning `conn` to the pool at its end.
    fn respond(
        self: &Arc<Self>,
        actor: &str,
        conn: H1Conn,
        response: Response<Incoming>,
    ) -> Response<RouterBody> {
        use hyper::body::Body as _;
        // hyper delimits a response with neither header by the connection's close (RFC 9112
        // §6.3); one without a body at all (HEAD, 204, 304) is an end of stream already.
        let until_close = conn.handoff.is_some()
            && !response.body().is_end_stream()
            && !response
                .headers()
                .contains_key(http::header::CONTENT_LENGTH)
            && !response
                .headers()
                .contains_key(http::header::TRANSFER_ENCODING);
        match self.checkin(actor, conn, until_close) {
            Ok(back) => response.map(|body| RouterBody::pooled(body, back)),
            Err(conn) => {
                conn.detach();
                response.map(RouterBody::from)
            }
        }
    }

    /// A pooled connection for `actor`'s `port` on `worker`, newest first, its I/O polled here
    /// (in `cx`'s task) first so that one the actor closed while it was idle is not used.
    fn checkout(
        &self,
        actor: &str,
        port: u16,
        worker: &Arc<str>,
        cx: &mut Context<'_>,
    ) -> Option<H1Conn> {
        if self.cfg.idle_per_actor == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.get_mut(actor)?;
        let now = Instant::now();
        let mut found = None;
        // Newest first. Dead entries go; one still finishing its last response (its body
        // ended a moment ago, the connection has not caught up) stays for the next turn.
        let mut i = conns.len();
        while i > 0 {
            i -= 1;
            let c = &mut conns[i];
            if c.conn.port != port {
                continue;
            }
            let retired = c.conn.handoff.as_ref().is_some_and(|h| h.retired());
            if c.conn.worker != *worker
                || retired
                || now.duration_since(c.since) >= self.cfg.idle_timeout
            {
                conns.swap_remove(i);
                continue;
            }
            c.conn.poll_io(cx);
            if c.conn.sender.is_closed() {
                conns.swap_remove(i);
                continue;
            }
            if !c.conn.sender.is_ready() {
                continue;
            }
            found = Some(conns.swap_remove(i).conn);
            break;
        }
        // An actor's entry stays while it is empty (its connections are all in use, and come
        // back at their responses' ends, which would make it anew each time);
        // `reap_idle_h1` removes it once it has stayed empty.
        found
    }

    /// What returns `conn` to the pool once its response body has ended (see
    /// [`PoolReturn`]); the connection back with the pool off.
    fn checkin(
        self: &Arc<Self>,
        actor: &str,
        conn: H1Conn,
        until_close: bool,
    ) -> Result<PoolReturn, H1Conn> {
        if self.cfg.idle_per_actor == 0 {
            return Err(conn);
        }
        let key = match &conn.handoff {
            Some(handed) => handed.actor.clone(),
            None => ActorKey::from_validated(actor),
        };
        Ok(PoolReturn {
            tunnels: self.clone(),
            key,
            conn,
            until_close,
        })
    }

    pub(super) fn evict_idle_h1(&self, actor: &str, worker: &Arc<str>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(conns) = idle.get_mut(actor) {
            conns.retain(|c| c.conn.worker != *worker);
            if conns.is_empty() {
                idle.remove(actor);
            }
        }
    }

    pub(super) fn reap_idle_h1(&self) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, conns| {
            conns.retain(|c| {
                !c.conn.sender.is_closed() && now.duration_since(c.since) < self.cfg.idle_timeout
            });
            !conns.is_empty()
        });
    }

    /// Idle pooled connections (for tests and metrics).
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum()
    }
}
