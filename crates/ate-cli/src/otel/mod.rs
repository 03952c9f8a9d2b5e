//! OpenTelemetry traces of a component, configured only by the standard `OTEL_*` variables
//! (DESIGN §8, docs/observability.md): on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`), off
//! otherwise, with no layer installed at all.
//!
//! Spans go out in batches (`OTEL_BSP_*`), sampled by `OTEL_TRACES_SAMPLER`/`_ARG`, by OTLP/gRPC
//! (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`, the default here) or OTLP/HTTP (`http/protobuf`,
//! `http/json`); the service name is `OTEL_SERVICE_NAME`, else the component's (`ate-router`,
//! `ate-api`, `ate-node`, `ate-worker`). Every variable also has its `_TRACES_` form, which wins.
//!
//! What this module reads itself ([`plan`]): the endpoint (for HTTP the generic one gets
//! `/v1/traces` appended), the protocol, the timeout, `OTEL_EXPORTER_OTLP_INSECURE` (a gRPC
//! endpoint without a scheme) and the TLS files, which opentelemetry-otlp 0.33 does not read:
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (the CA to check the collector with; the system's CAs when
//! unset) and `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` + `_CLIENT_KEY` (mutual TLS). TLS uses one
//! rustls config on the aws-lc-rs provider every component uses (`ate_tls::crypto_provider`),
//! given to tonic through our connector and to reqwest as a preconfigured backend. Headers and
//! compression (`OTEL_EXPORTER_OTLP_HEADERS`, `_COMPRESSION`: gzip; zstd is not built in) are
//! read by the exporter.
//!
//! A configuration this build cannot honour (an unknown protocol, a TLS file that does not
//! load, half a client certificate) leaves traces off with a warning in the component's log:
//! never a silent non-export.
//!
//! `config.rs` turns the variables into a [`Plan`] (for traces, and for metrics with their
//! `_METRICS_` forms); `export.rs` builds the span exporter (and its TLS) a plan describes; the
//! layer, the provider's lifetime and the resource both signals share (`service.name`,
//! `service.instance.id`) are here. OTLP metrics, the `/metrics` text exported beside
//! Prometheus, are [`metrics`].

mod config;
mod export;
pub mod metrics;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

use config::{Plan, plan};
use export::exporter;

/// How long the last batch may take to go out when the component stops.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The tracer provider of a component that exports traces; flushed and shut down by
/// [`Tracing::shutdown`] (or on drop, as a last resort).
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
    /// The OTLP metrics export, when asked for ([`metrics`]).
    metrics: Option<metrics::MetricsExport>,
}

impl Tracing {
    pub fn off() -> Self {
        Self {
            provider: None,
            metrics: None,
        }
    }

    /// Starts the OTLP metrics export of `component` if the variables ask for it
    /// ([`metrics::start`]) and logs how it goes (or why not). After logging is set up.
    pub fn export_metrics(
        &mut self,
        component: &'static str,
        install: fn() -> &'static ate_telemetry::PrometheusHandle,
    ) {
        let (export, notice) = metrics::start(component, install);
        self.metrics = export;
        match notice {
            Some(Notice::Exporting(how)) => tracing::info!("{how}"),
            Some(Notice::Refused(why)) => tracing::warn!("{why}"),
            None => {}
        }
    }

    /// Sends the last metrics and the spans still queued and stops the exporters. Runs the
    /// blocking shutdown off the async workers: the batch thread's export is driven by this
    /// runtime's I/O.
    pub async fn shutdown(mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.shutdown().await;
        }
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

/// What the component logs about its traces once its logging is set up.
#[derive(Debug)]
pub enum Notice {
    /// Traces on: how they leave (info).
    Exporting(String),
    /// Asked for and not possible: why (warning).
    Refused(String),
}

/// Builds the exporter and the tracing layer for `component` (its default service name), or
/// nothing when the plan is off. Must run inside the tokio runtime (the gRPC channel, the HTTP
/// client's runtime).
pub fn layer<S>(
    component: &'static str,
) -> (
    Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>>,
    Tracing,
    Option<Notice>,
)
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let export = match plan(|name| std::env::var(name).ok()) {
        Plan::Off => return (None, Tracing::off(), None),
        Plan::Refused(why) => return (None, Tracing::off(), Some(Notice::Refused(why))),
        Plan::Export(export) => export,
    };
    let exporter = match exporter(&export) {
        Ok(exporter) => exporter,
        Err(e) => {
            return (
                None,
                Tracing::off(),
                Some(Notice::Refused(format!(
                    "traces to {}: cannot set up the exporter: {e}; traces are off",
                    export.endpoint
                ))),
            );
        }
    };
    // OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME through the SDK's detectors; the instance
    // id the metrics carry too.
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.instance.id",
        instance_id().to_string(),
    ));
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
    ate_telemetry::trace_context::enable();
    (
        Some(layer),
        Tracing {
            provider: Some(provider),
            metrics: None,
        },
        Some(Notice::Exporting(export.describe("traces"))),
    )
}

/// `k1=v1,k2=v2` (`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`): trimmed, values
/// percent-decoded; entries without `=` or with an empty key are skipped, as the specification
/// says of malformed entries.
pub(crate) fn key_values(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), percent_decoded(v.trim())))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's `service.instance.id`: `OTEL_RESOURCE_ATTRIBUTES`' if it names one, else a
/// random UUID (the semantic conventions' advice), the same for traces and metrics.
pub(crate) fn instance_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::env::var("OTEL_RESOURCE_ATTRIBUTES")
            .ok()
            .and_then(|text| {
                key_values(&text)
                    .into_iter()
                    .find(|(k, _)| k == "service.instance.id")
                    .map(|(_, v)| v)
            })
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
    })
}

/// The resource of `component`'s telemetry: `OTEL_RESOURCE_ATTRIBUTES`, then `service.name`
/// (`OTEL_SERVICE_NAME`, else the component's), `service.instance.id` and `service.version`.
pub(crate) fn resource_attributes(component: &'static str) -> Vec<(String, String)> {
    let mut attributes: Vec<(String, String)> = std::env::var("OTEL_RESOURCE_ATTRIBUTES")
        .map(|text| key_values(&text))
        .unwrap_or_default();
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| component.to_string());
    for (key, value) in [
        ("service.name", service),
        ("service.instance.id", instance_id().to_string()),
    ] {
        attributes.retain(|(k, _)| k != key);
        attributes.push((key.to_string(), value));
    }
    if !attributes.iter().any(|(k, _)| k == "service.version") {
        let version = ate_telemetry::VERSION.to_string();
        attributes.push(("service.version".to_string(), version));
    }
    attributes
}
