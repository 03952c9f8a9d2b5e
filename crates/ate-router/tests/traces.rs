//! Trace context through the router on real sockets (scripted api, test atunnel, echo upstream),
//! with an OpenTelemetry layer installed in this test process as the `ate` binary installs one
//! when the `OTEL_*` variables ask for traces: the request the actor receives carries a
//! `traceparent` whose parent is the router's `request` span; a client's `traceparent` is that
//! span's parent (same trace id). The end-to-end test with every component is
//! `crates/ate-cli/tests/traces.rs`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Keeps every span it is given.
#[derive(Clone, Default, Debug)]
struct Collect(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collect {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Collect {
    /// The router's `request` span of the request with id `id` (exported as it ends).
    fn request_span(&self, id: &str) -> SpanData {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = self.0.lock().unwrap().iter().find_map(|s| {
                let ours = s.name == "request"
                    && s.attributes
                        .iter()
                        .any(|kv| kv.key.as_str() == "request_id" && kv.value.as_str() == id);
                ours.then(|| s.clone())
            });
            if let Some(span) = found {
                return span;
            }
            assert!(Instant::now() < deadline, "no request span for {id}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The `traceparent` values the echo upstream saw.
fn seen_by_actor(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("header traceparent: "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn the_actor_continues_the_routers_span_which_continues_the_clients() {
    let spans = Collect::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .init();
    ate_telemetry::trace_context::enable();

    let w = World::start(|_| {}).await;
    w.running("a/b");

    // A client's trace: the router's span is its child, the actor's parent is the router's span.
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let got = get_with(w.router.addr, Some("a/b"), "app.example", |r| {
        r.headers_mut().insert(
            "traceparent",
            format!("00-{client_trace}-{client_span}-01")
                .parse()
                .unwrap(),
        );
        r.headers_mut()
            .insert("x-request-id", "with-parent".parse().unwrap());
    })
    .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    let router = spans.request_span("with-parent");
    assert_eq!(router.span_context.trace_id().to_string(), client_trace);
    assert_eq!(router.parent_span_id.to_string(), client_span);
    assert!(router.parent_span_is_remote);
    let router_span = router.span_context.span_id().to_string();
    assert_eq!(
        seen_by_actor(&got.body),
        [format!("00-{client_trace}-{router_span}-01")],
        "{}",
        got.body
    );

    // No client trace: the router's span is a root, and still the actor's parent.
    let got = get_with(w.router.addr, Some("a/b"), "app.example", |r| {
        r.headers_mut()
            .insert("x-request-id", "no-parent".parse().unwrap());
    })
    .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    let router = spans.request_span("no-parent");
    assert_eq!(
        router.parent_span_id,
        opentelemetry::trace::SpanId::INVALID,
        "a root"
    );
    let trace = router.span_context.trace_id().to_string();
    assert_ne!(trace, client_trace);
    let span = router.span_context.span_id().to_string();
    assert_eq!(
        seen_by_actor(&got.body),
        [format!("00-{trace}-{span}-01")],
        "{}",
        got.body
    );
    let _ = provider.shutdown();
}
