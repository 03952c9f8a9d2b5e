//! W3C trace context (`traceparent`, `tracestate`) across every hop (DESIGN §8): read from an
//! incoming gRPC call or HTTP request into the span that serves it, and written from the current
//! span onto the next call. One module for the data path (router, atunnel) and the control plane
//! (api, node agent, worker); here because every component depends on this crate.
//!
//! Everything is a no-op until [`enable`] (the binary calls it after installing an exporter from
//! the `OTEL_*` variables): one relaxed atomic load per call, so with tracing off the request path
//! pays nothing else and a client's `traceparent` passes through to the actor untouched.
//!
//! The `continue_*` functions also put the trace id on the span they continue, as its
//! [`TRACE_ID_FIELD`] field (declare it `tracing::field::Empty`), so every log line written inside
//! it carries the id: the span's own when tracing is on; when it is off, the id of a valid
//! incoming `traceparent` (a client's, at the router), read in place without allocating.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C header carrying the trace id and parent span id.
pub const TRACEPARENT: &str = "traceparent";

/// The span field the `continue_*` functions record the trace id in.
pub const TRACE_ID_FIELD: &str = "trace_id";

/// A trace id, kept as its 16 bytes (no allocation; `Option<TraceId>` is 17 bytes) and shown as
/// 32 lowercase hex digits, as in `traceparent` and in the exported spans.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

impl TraceId {
    /// The trace id of a W3C `traceparent` value, if the value is valid: version (not `ff`),
    /// trace id, parent id and flags in lowercase hex, neither id all zeros; a later version may
    /// append fields after a `-`.
    pub fn from_traceparent(value: &[u8]) -> Option<TraceId> {
        fn hex(b: u8) -> Option<u8> {
            match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'a'..=b'f' => Some(b - b'a' + 10),
                _ => None,
            }
        }
        fn all_hex(s: &[u8]) -> bool {
            s.iter().all(|&b| hex(b).is_some())
        }
        let (version, rest) = value.split_at_checked(2)?;
        if !all_hex(version) || version == b"ff" || rest.len() < 53 {
            return None;
        }
        let version_00 = version == b"00";
        if (version_00 && rest.len() != 53) || (!version_00 && rest.len() > 53 && rest[53] != b'-')
        {
            return None;
        }
        let dashes = rest[0] == b'-' && rest[33] == b'-' && rest[50] == b'-';
        let (trace, parent, flags) = (&rest[1..33], &rest[34..50], &rest[51..53]);
        if !dashes || !all_hex(trace) || !all_hex(parent) || !all_hex(flags) {
            return None;
        }
        if trace.iter().all(|&b| b == b'0') || parent.iter().all(|&b| b == b'0') {
            return None;
        }
        let mut id = [0u8; 16];
        for (byte, pair) in id.iter_mut().zip(trace.chunks_exact(2)) {
            *byte = (hex(pair[0])? << 4) | hex(pair[1])?;
        }
        Some(TraceId(id))
    }

    fn of_context(cx: &Context) -> Option<TraceId> {
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| TraceId(sc.trace_id().to_bytes()))
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static PROPAGATOR: LazyLock<TraceContextPropagator> = LazyLock::new(TraceContextPropagator::new);

/// Turns propagation on for the rest of the process (an OpenTelemetry layer is installed).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether traces are exported by this process.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// `info_span!`-made `span` when tracing is on, else a disabled span: spans that exist only for
/// the trace (not for log context) cost nothing when it is off.
#[macro_export]
macro_rules! trace_span {
    ($($arg:tt)*) => {
        if $crate::trace_context::enabled() {
            ::tracing::info_span!($($arg)*)
        } else {
            ::tracing::Span::none()
        }
    };
}

/// Reads a tonic `MetadataMap` as an OpenTelemetry carrier.
pub struct MetadataExtractor<'a>(pub &'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Writes into a tonic `MetadataMap` as an OpenTelemetry carrier.
pub struct MetadataInjector<'a>(pub &'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only well-formed keys and values; anything else is dropped.
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Reads an HTTP `HeaderMap` as an OpenTelemetry carrier.
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Writes into an HTTP `HeaderMap` as an OpenTelemetry carrier.
pub struct HeaderInjector<'a>(pub &'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::try_from(value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Makes the trace context `carrier` holds the parent of `span` (which must not have been
/// entered yet; a carrier without a valid `traceparent` leaves `span` a root), and returns the
/// trace id `span` then has. That starts `span`'s OpenTelemetry span (its parent is fixed from
/// here on), which its first entry would have done anyway.
fn adopt(span: &tracing::Span, carrier: &dyn Extractor) -> Option<TraceId> {
    let cx = PROPAGATOR.extract(carrier);
    if cx.span().span_context().is_valid() {
        // Fails only for a disabled span or one already started: then it simply keeps its parent.
        let _ = span.set_parent(cx);
    }
    TraceId::of_context(&span.context())
}

/// `span` continues the trace of an incoming gRPC call (its `traceparent` metadata); returns the
/// trace id it recorded on `span` (see the module's doc).
pub fn continue_grpc<T>(span: &tracing::Span, request: &tonic::Request<T>) -> Option<TraceId> {
    continue_metadata(span, request.metadata())
}

/// [`continue_grpc`] for a call already taken apart.
pub fn continue_metadata(span: &tracing::Span, metadata: &MetadataMap) -> Option<TraceId> {
    continue_from(span, &MetadataExtractor(metadata), || {
        metadata.get(TRACEPARENT).map(|v| v.as_bytes())
    })
}

/// `span` continues the trace of an incoming HTTP request (its `traceparent` header); returns the
/// trace id it recorded on `span` (see the module's doc).
pub fn continue_http(span: &tracing::Span, headers: &HeaderMap) -> Option<TraceId> {
    continue_from(span, &HeaderExtractor(headers), || {
        headers.get(TRACEPARENT).map(|v| v.as_bytes())
    })
}

/// With tracing on, `span` adopts the trace `carrier` holds; off, only the trace id of the
/// `traceparent` value is read, for the logs.
fn continue_from<'a>(
    span: &tracing::Span,
    carrier: &dyn Extractor,
    traceparent: impl FnOnce() -> Option<&'a [u8]>,
) -> Option<TraceId> {
    let id = if enabled() {
        adopt(span, carrier)
    } else {
        traceparent().and_then(TraceId::from_traceparent)
    };
    record(span, id)
}

fn record(span: &tracing::Span, id: Option<TraceId>) -> Option<TraceId> {
    if let Some(id) = id {
        span.record(TRACE_ID_FIELD, tracing::field::display(id));
    }
    id
}

/// Puts the current span's trace context on an outgoing gRPC call.
pub fn inject_grpc<T>(request: &mut tonic::Request<T>) {
    if enabled() {
        let cx = tracing::Span::current().context();
        inject_valid(&cx, &mut MetadataInjector(request.metadata_mut()));
    }
}

/// Puts the current span's trace context on an outgoing HTTP request, replacing what the
/// headers carried (a client's `traceparent` becomes this span's parent, not the next hop's).
pub fn inject_http(headers: &mut HeaderMap) {
    if enabled() {
        let cx = tracing::Span::current().context();
        inject_valid(&cx, &mut HeaderInjector(headers));
    }
}

fn inject_valid(cx: &Context, carrier: &mut dyn Injector) {
    // A span outside any trace (no OpenTelemetry layer under it) injects nothing, so a
    // client's own header, if any, is left as it was.
    if cx.span().span_context().is_valid() {
        PROPAGATOR.inject_context(cx, carrier);
    }
}

/// The current span's trace id, when tracing is on and the span is in a trace.
pub fn current_trace_id() -> Option<TraceId> {
    if !enabled() {
        return None;
    }
    TraceId::of_context(&tracing::Span::current().context())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn header_and_metadata_carriers_round_trip() {
        let mut headers = HeaderMap::new();
        HeaderInjector(&mut headers).set(TRACEPARENT, PARENT.to_string());
        let cx = PROPAGATOR.extract(&HeaderExtractor(&headers));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_remote());

        let mut metadata = MetadataMap::new();
        PROPAGATOR.inject_context(&cx, &mut MetadataInjector(&mut metadata));
        assert_eq!(MetadataExtractor(&metadata).get(TRACEPARENT), Some(PARENT));
        // `tracestate` goes along (empty here).
        assert!(MetadataExtractor(&metadata).keys().contains(&TRACEPARENT));
    }

    #[test]
    fn bad_values_are_no_context() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static("00-zz-00-01"));
        let cx = PROPAGATOR.extract(&HeaderExtractor(&headers));
        assert!(!cx.span().span_context().is_valid());
        // A value a header cannot hold is dropped, not a panic.
        HeaderInjector(&mut headers).set("bad key", "x".into());
        MetadataInjector(&mut MetadataMap::new()).set(TRACEPARENT, "a\nb".into());
    }

    #[test]
    fn trace_ids_of_traceparents() {
        let id = TraceId::from_traceparent(PARENT.as_bytes()).expect("valid");
        assert_eq!(id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        // What the propagator reads, byte for byte.
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(PARENT));
        let cx = PROPAGATOR.extract(&HeaderExtractor(&headers));
        assert_eq!(TraceId::of_context(&cx), Some(id));
        // A later version may append fields.
        let future = format!("01{}-what-comes-next", &PARENT[2..]);
        assert_eq!(TraceId::from_traceparent(future.as_bytes()), Some(id));
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceId::from_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn off_means_untouched() {
        // No test here calls enable() (process-wide).
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(PARENT));
        inject_http(&mut headers);
        assert_eq!(headers[TRACEPARENT], PARENT);
        assert_eq!(current_trace_id(), None);
    }
}
