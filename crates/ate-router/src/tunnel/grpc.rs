//! gRPC tunnels: one HTTP/2 connection per (actor, port) inside one long-lived CONNECT stream,
//! shared by every gRPC request to that port, marked in use while a stream is open on it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::actor_ref::ActorKey;
use crate::body::RouterBody;
use crate::cache::Route;

use super::{FailureKind, SendFailed, TunnelError, Tunnels, request_id_of};

/// How a shared HTTP/2 tunnel connection is used: streams open on it, and since when it is idle.
#[derive(Debug)]
pub(super) struct ConnUse {
    active: AtomicUsize,
    broken: AtomicBool,
    /// Milliseconds after `base` when the last stream ended.
    idle_since_ms: AtomicU64,
    base: Instant,
}

impl ConnUse {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Not broken, and either carrying a stream or idle for less than `idle_timeout`.
    fn reusable(&self, idle_timeout: Duration) -> bool {
        if self.broken.load(Ordering::SeqCst) {
            return false;
        }
        if self.active.load(Ordering::SeqCst) > 0 {
            return true;
        }
        let idle_ms = self
            .now_ms()
            .saturating_sub(self.idle_since_ms.load(Ordering::SeqCst));
        u128::from(idle_ms) < idle_timeout.as_millis()
    }
}

/// One stream's hold on a shared HTTP/2 tunnel connection (held by the response body): the
/// connection is not reaped while any is alive, and its idle time starts when the last one drops.
#[derive(Debug)]
pub struct InUse(Arc<ConnUse>);

impl InUse {
    fn new(usage: &Arc<ConnUse>) -> Self {
        usage.active.fetch_add(1, Ordering::SeqCst);
        Self(usage.clone())
    }

    /// The stream failed: the connection is not handed out again (it closes after its last
    /// stream).
    pub fn mark_broken(&self) {
        self.0.broken.store(true, Ordering::SeqCst);
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0
            .idle_since_ms
            .store(self.0.now_ms(), Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The gRPC connection of one (actor, port): HTTP/2 to the actor inside one CONNECT stream.
pub(super) struct GrpcConn {
    sender: http2::SendRequest<Incoming>,
    worker: Arc<str>,
    usage: Arc<ConnUse>,
}

impl GrpcConn {
    fn reusable(&self, worker: &Arc<str>, idle_timeout: Duration) -> bool {
        self.worker == *worker && !self.sender.is_closed() && self.usage.reusable(idle_timeout)
    }
}

/// The gRPC connection of one (actor, port), locked while it is checked or made so that a burst
/// of gRPC requests opens one tunnel. Requests that waited for a failed attempt fail with its
/// error instead of each trying (and timing out) in turn.
#[derive(Default)]
struct GrpcSlotState {
    conn: Option<GrpcConn>,
    /// Failed attempts so far, and the last one's worker and error (its text and kind).
    failures: u64,
    last_failure: Option<(Arc<str>, String, FailureKind)>,
}

#[derive(Default)]
pub(super) struct GrpcSlotInner {
    state: tokio::sync::Mutex<GrpcSlotState>,
    failures: AtomicU64,
}

pub(super) type GrpcSlot = Arc<GrpcSlotInner>;

impl Tunnels {
    /// Sends a gRPC request (HTTP/2, streams and trailers untouched) over the shared HTTP/2
    /// connection of (actor, port): one CONNECT stream carries every gRPC request to that port,
    /// opened on first use and closed after `idle_timeout` without a stream, on an error, or when
    /// the actor's route changes worker. A pooled connection found dead before the request was
    /// written is replaced transparently. With the pool off (`idle_per_actor == 0`) every request
    /// gets its own tunnel.
    pub async fn send_grpc(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        mut request: Request<Incoming>,
    ) -> Result<Response<RouterBody>, SendFailed<Request<Incoming>>> {
        if self.cfg.idle_per_actor == 0 {
            let id = request_id_of(&request);
            let mut sender = match self.h2(route, actor, port, id).await {
                Ok(sender) => sender,
                Err(error) => {
                    return Err(SendFailed {
                        error,
                        request: Some(request),
                    });
                }
            };
            return match sender.send_request(request).await {
                Ok(response) => Ok(response.map(RouterBody::from)),
                Err(e) => Err(SendFailed {
                    error: TunnelError::Actor(e),
                    request: None,
                }),
            };
        }
        let mut replaced = false;
        loop {
            let id = request_id_of(&request);
            let (mut sender, in_use, fresh) = match self.grpc_conn(route, actor, port, id).await {
                Ok(conn) => conn,
                Err(error) => {
                    return Err(SendFailed {
                        error,
                        request: Some(request),
                    });
                }
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    return Ok(response.map(|body| RouterBody::Shared(body, in_use)));
                }
                Err(mut e) => {
                    in_use.mark_broken();
                    drop(in_use);
                    match e.take_message() {
                        Some(back) if !fresh && !replaced => {
                            tracing::debug!(%actor, port, error = %e.error(), "pooled gRPC tunnel was dead; replacing it");
                            replaced = true;
                            request = back;
                        }
                        back => {
                            return Err(SendFailed {
                                error: TunnelError::Actor(e.into_error()),
                                request: back,
                            });
                        }
                    }
                }
            }
        }
    }

    /// The gRPC connection of (actor, port) on the route's worker, already marked in use: the
    /// pooled one if it is usable, else a new one (replacing it). Also says whether it is new.
    async fn grpc_conn(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<(http2::SendRequest<Incoming>, InUse, bool), TunnelError> {
        let slot = {
            let mut grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
            if !grpc.contains_key(actor) {
                grpc.insert(ActorKey::from_validated(actor), Vec::new());
            }
            let slots = grpc.get_mut(actor);
            match slots {
                Some(slots) => match slots.iter().find(|(p, _)| *p == port) {
                    Some((_, slot)) => slot.clone(),
                    None => {
                        let slot = GrpcSlot::default();
                        slots.push((port, slot.clone()));
                        slot
                    }
                },
                // Just inserted under the same lock.
                None => GrpcSlot::default(),
            }
        };
        let failures_seen = slot.failures.load(Ordering::SeqCst);
        let mut state = slot.state.lock().await;
        if let Some(c) = state.conn.as_ref() {
            if c.reusable(&route.worker, self.cfg.idle_timeout) {
                self.stats.tunnel_reuses.fetch_add(1, Ordering::Relaxed);
                // Marked under the slot's lock, so the reaper never sees it idle in between.
                return Ok((c.sender.clone(), InUse::new(&c.usage), false));
            }
            // Dropping our handle closes the connection (and its tunnel) after its last stream.
            state.conn = None;
        } else if state.failures != failures_seen
            && let Some((worker, reason, kind)) = &state.last_failure
            && *worker == route.worker
        {
            return Err(TunnelError::Shared {
                reason: reason.clone(),
                kind: *kind,
            });
        }
        let sender = match self.h2(route, actor, port, request_id).await {
            Ok(sender) => sender,
            Err(e) => {
                state.failures += 1;
                state.last_failure = Some((route.worker.clone(), e.to_string(), e.kind()));
                slot.failures.store(state.failures, Ordering::SeqCst);
                return Err(e);
            }
        };
        let usage = Arc::new(ConnUse::new());
        let in_use = InUse::new(&usage);
        state.conn = Some(GrpcConn {
            sender: sender.clone(),
            worker: route.worker.clone(),
            usage,
        });
        Ok((sender, in_use, true))
    }

    /// An HTTP/2 connection to the actor over a new tunnel (gRPC passes through as HTTP/2).
    pub async fn h2(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<http2::SendRequest<Incoming>, TunnelError> {
        // Boxed for the same reason as `new_h1`.
        Box::pin(self.h2_unboxed(route, actor, port, request_id)).await
    }

    async fn h2_unboxed(
        &self,
        route: &Route,
        actor: &str,
        port: u16,
        request_id: &str,
    ) -> Result<http2::SendRequest<Incoming>, TunnelError> {
        let io = self.open(route, actor, port, request_id).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(TunnelError::Actor)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "tunnel HTTP/2 connection ended");
            }
        });
        Ok(sender)
    }

    pub(super) fn evict_grpc(&self, actor: &str, worker: &Arc<str>) {
        let grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, slot) in grpc.get(actor).into_iter().flatten() {
            // A locked slot is being checked against the new route by its holder.
            if let Ok(mut state) = slot.state.try_lock()
                && state.conn.as_ref().is_some_and(|c| c.worker == *worker)
            {
                state.conn = None;
            }
        }
    }

    pub(super) fn reap_grpc(&self) {
        let idle_timeout = self.cfg.idle_timeout;
        let mut grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
        grpc.retain(|_, slots| {
            slots.retain(|(_, slot)| {
                let Ok(mut state) = slot.state.try_lock() else {
                    return true; // being checked or connected right now
                };
                if let Some(c) = state.conn.as_ref()
                    && (c.sender.is_closed() || !c.usage.reusable(idle_timeout))
                {
                    state.conn = None;
                }
                // An empty slot goes once no request holds it (clones are made under this lock).
                state.conn.is_some() || Arc::strong_count(slot) > 1
            });
            !slots.is_empty()
        });
    }

    /// Open pooled gRPC connections (one tunnel each).
    pub fn grpc_count(&self) -> usize {
        let grpc = self.grpc.lock().unwrap_or_else(PoisonError::into_inner);
        grpc.values()
            .flatten()
            .filter(|(_, slot)| {
                slot.state.try_lock().map_or(true, |s| {
                    s.conn.as_ref().is_some_and(|c| !c.sender.is_closed())
                })
            })
            .count()
    }
}
