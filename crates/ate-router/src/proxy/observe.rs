//! What a request leaves behind (timings, span fields, the failure line); the router's own answers.

use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::RouterBody;
use crate::error::ResolveError;
use crate::resolve::ResumeKind;

/// What [`Proxy::forward`] measured, for the access log. Microseconds in `u32`s (`u32::MAX`:
/// not measured) rather than `Option<Duration>`s: every request future carries this twice.
///
/// [`Proxy::forward`]: super::Proxy::forward
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Finding (or waking) the actor, again after a stale route included.
    resolve_us: u32,
    /// Sending the request to the actor until its response head (the last attempt).
    pub(super) forward_us: u32,
    /// How the actor was found.
    pub kind: Option<ResumeKind>,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            resolve_us: u32::MAX,
            forward_us: u32::MAX,
            kind: None,
        }
    }
}

impl Timings {
    pub(super) fn micros(d: Duration) -> u32 {
        u32::try_from(d.as_micros()).unwrap_or(u32::MAX - 1)
    }
    pub(super) fn add_resolve(&mut self, d: Duration) {
        let before = if self.resolve_us == u32::MAX {
            0
        } else {
            self.resolve_us
        };
        self.resolve_us = before.saturating_add(Self::micros(d)).min(u32::MAX - 1);
    }
    fn duration(us: u32) -> Option<Duration> {
        (us != u32::MAX).then(|| Duration::from_micros(u64::from(us)))
    }
    /// Finding (or waking) the actor (every resolution of the request), if it was measured.
    pub fn resolve(&self) -> Option<Duration> {
        Self::duration(self.resolve_us)
    }
    /// Sending the request to the actor until its response head, if it was measured.
    pub fn forward(&self) -> Option<Duration> {
        Self::duration(self.forward_us)
    }
}

/// Why the router answered an error itself, beyond what the client is told (the worker, the
/// tunnel's error, an internal reason): a response extension, logged by [`log_failure`].
#[derive(Debug, Clone)]
struct Detail(String);

/// `response` with a [`Detail`] for the failure log.
pub(super) fn with_detail(
    mut response: Response<RouterBody>,
    detail: String,
) -> Response<RouterBody> {
    response.extensions_mut().insert(Detail(detail));
    response
}

/// The span around one request's resolution, parking and forwarding (the root of the router's
/// part of a trace, or the child of a client's `traceparent`). `trace_id` is recorded by
/// `continue_http`; `status`, `resume` and the error status only when traces are on
/// ([`note_status`], [`note_kind`]).
pub(super) fn request_span(id: &HeaderValue, actor: impl AsRef<[u8]>) -> tracing::Span {
    let actor = std::str::from_utf8(actor.as_ref()).unwrap_or_default();
    let request_id = id.to_str().unwrap_or_default();
    tracing::info_span!(
        "request",
        request_id = %request_id,
        trace_id = tracing::field::Empty,
        actor = %actor,
        status = tracing::field::Empty,
        resume = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// [`request_span`] for a request that already carries its id.
pub(super) fn request_span_for<B>(request: &http::Request<B>, actor: &str) -> tracing::Span {
    match request.headers().get(&super::REQUEST_ID) {
        Some(id) => request_span(id, actor),
        None => request_span(&HeaderValue::from_static(""), actor),
    }
}

/// The answer's status on the current request span (a server error marks the span failed).
pub(super) fn note_status(status: StatusCode) {
    if ate_telemetry::trace_context::enabled() {
        let span = tracing::Span::current();
        span.record("status", status.as_u16());
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// How the actor was found (`ate-resume`: warm, cold, parked) on the current request span.
pub(super) fn note_kind(kind: ResumeKind) {
    if ate_telemetry::trace_context::enabled() {
        tracing::Span::current().record("resume", kind.header_value());
    }
}

/// One line for a request the router answered with an error of its own (status 400 or more and
/// a body the router wrote; an actor's own error answers are not logged): warn for 5xx, info for
/// 4xx. Carries the request id, the trace id, the actor, the status, the client's text and the
/// [`Detail`]. (Written after the request span ended, so the ids are fields of the line.)
pub(super) fn log_failure(
    response: &Response<RouterBody>,
    request_id: &str,
    trace_id: Option<ate_telemetry::trace_context::TraceId>,
    actor: &str,
) {
    let status = response.status();
    let RouterBody::Text(body) = response.body() else {
        return;
    };
    if status.as_u16() < 400 {
        return;
    }
    let error = body
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let error = error.trim_end();
    let detail = response.extensions().get::<Detail>().map(|d| d.0.as_str());
    let code = status.as_u16();
    let trace_id = trace_id.map(tracing::field::display);
    if status.is_server_error() {
        tracing::warn!(
            request_id,
            trace_id,
            actor,
            status = code,
            error,
            detail,
            "request failed"
        );
    } else {
        tracing::info!(
            request_id,
            trace_id,
            actor,
            status = code,
            error,
            detail,
            "request failed"
        );
    }
}

pub fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<RouterBody> {
    let mut response = Response::new(RouterBody::text(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The answer to a request whose actor could not be found or woken; the failure line says why
/// (for an internal error, the reason the client is not shown).
pub(super) fn error_response(error: &ResolveError, actor: &str) -> Response<RouterBody> {
    let body = error.body(actor);
    let response = if body.is_empty() {
        let mut response = Response::new(RouterBody::empty());
        *response.status_mut() = error.status();
        response
    } else {
        text(error.status(), body)
    };
    with_detail(response, error.to_string())
}
