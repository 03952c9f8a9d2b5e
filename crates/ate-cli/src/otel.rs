//! OpenTelemetry traces of a component, configured only by the standard `OTEL_*` variables
//! (DESIGN §8, docs/observability.md): on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`), off
//! otherwise, with no layer installed at all. Spans go out by OTLP/gRPC in batches
//! (`OTEL_BSP_*`), sampled by `OTEL_TRACES_SAMPLER`/`_ARG`; the service name is
//! `OTEL_SERVICE_NAME`, else the component's (`ate-router`, `ate-api`, `ate-node`, `ate-worker`).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The variables that turn tracing on: an exporter needs somewhere to send to.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long the last batch may take to go out when the component stops.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// What to do about traces, from the environment.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Off,
    /// Export to this endpoint (as given; the exporter reads it again itself).
    Export {
        endpoint: String,
    },
    /// Asked for, but not possible with this build: the reason, for a warning.
    Refused(String),
}

/// Reads the plan from `var` (the process environment in production).
pub fn plan(var: impl Fn(&str) -> Option<String>) -> Plan {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Plan::Off;
    }
    let Some(endpoint) = ENDPOINT_VARS.iter().find_map(|name| set(name)) else {
        return Plan::Off;
    };
    let protocol =
        set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match protocol.as_deref().map(str::trim) {
        None | Some("grpc") => Plan::Export { endpoint },
        Some(other) => Plan::Refused(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other}: only grpc is built in (point the endpoint at the \
             collector's OTLP/gRPC port, 4317 by default); traces are off"
        )),
    }
}

/// The tracer provider of a component that exports traces; flushed and shut down by
/// [`Tracing::shutdown`] (or on drop, as a last resort).
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

impl Tracing {
    pub fn off() -> Self {
        Self { provider: None }
    }

    /// Sends the spans still queued and stops the exporter. Runs the blocking shutdown off the
    /// async workers: the batch thread's export is driven by this runtime's I/O.
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let done = tokio::task::spawn_blocking(move || {
                provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
            })
            .await;
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "traces: flushing the last spans failed"),
                Err(e) => tracing::warn!(error = %e, "traces: shutdown task failed"),
            }
        }
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        // Reached only when the component failed before `shutdown` (an error return): a best
        // effort to send what it recorded, which is what explains the failure.
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown_with_timeout(Duration::from_secs(1));
        }
    }
}

/// Builds the exporter and the tracing layer for `component` (its default service name), or
/// nothing when the plan is off. Must run inside the tokio runtime (the gRPC channel).
pub fn layer<S>(
    component: &'static str,
) -> (
    Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>>,
    Tracing,
    Option<String>,
)
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let endpoint = match plan(|name| std::env::var(name).ok()) {
        Plan::Off => return (None, Tracing::off(), None),
        Plan::Refused(why) => return (None, Tracing::off(), Some(why)),
        Plan::Export { endpoint } => endpoint,
    };
    // Timeouts, headers and the endpoint are read from the OTEL_* variables by the builder.
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_protocol(opentelemetry_otlp::Protocol::Grpc)
        .build()
    {
        Ok(exporter) => exporter,
        Err(e) => {
            return (
                None,
                Tracing::off(),
                Some(format!(
                    "traces to {endpoint}: cannot set up the exporter: {e}; traces are off"
                )),
            );
        }
    };
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
        resource = resource.with_service_name(component);
    }
    // Sampler (OTEL_TRACES_SAMPLER/_ARG), limits and batching (OTEL_BSP_*) come from the
    // variables through the SDK's defaults.
    let provider = SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(exporter)
        .build();
    let tracer = provider.tracer("ate");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Log lines stay log lines; only spans are exported.
        .with_location(false)
        // busy/idle times per span: a cost on every poll, and the span's duration says enough.
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_target(false);
    ate_tls::trace_context::enable();
    (
        Some(layer),
        Tracing {
            provider: Some(provider),
        },
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_set() {
        assert_eq!(plan(env(&[])), Plan::Off);
        assert_eq!(plan(env(&[("OTEL_SERVICE_NAME", "x")])), Plan::Off);
        assert_eq!(
            plan(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            Plan::Off
        );
        let on = |pairs: &[(&str, &str)]| matches!(plan(env(pairs)), Plan::Export { .. });
        assert!(on(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4317"
        )]));
        assert!(on(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4317"
        )]));
        assert!(on(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]));
        assert_eq!(
            plan(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_SDK_DISABLED", "TRUE"),
            ])),
            Plan::Off
        );
    }

    #[test]
    fn other_protocols_are_refused_with_a_reason() {
        let p = plan(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]));
        assert!(
            matches!(&p, Plan::Refused(why) if why.contains("http/protobuf")),
            "{p:?}"
        );
        // The signal's own variable wins over the general one.
        let p = plan(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]));
        assert!(matches!(p, Plan::Export { .. }), "{p:?}");
    }
}
