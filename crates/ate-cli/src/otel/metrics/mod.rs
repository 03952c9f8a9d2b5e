//! OTLP metrics beside Prometheus: every `OTEL_METRIC_EXPORT_INTERVAL` (60 s by default) the
//! component renders its `/metrics` text ([`ate_telemetry::render`]: the recorder's series,
//! the render hooks' (per-actor) families and the `process_*` series), turns it into OTLP
//! ([`convert`]) and sends it to the collector by gRPC or HTTP/protobuf, cumulative.
//!
//! Why the rendered text and not a second recorder or the OpenTelemetry SDK: it is the one
//! place that has every series (hooks, per-actor families and process series are not in the
//! recorder), so `/metrics` and OTLP cannot drift; the SDK's metric data cannot be built from
//! outside it (no producer API in 0.33), and the Prometheus output stays byte for byte what it
//! was.
//!
//! Configuration ([`super::config::plan_for`]): `OTEL_METRICS_EXPORTER`,
//! `OTEL_EXPORTER_OTLP_METRICS_{ENDPOINT,PROTOCOL,HEADERS,COMPRESSION,TIMEOUT,INSECURE,
//! CERTIFICATE,CLIENT_CERTIFICATE,CLIENT_KEY}` over the general `OTEL_EXPORTER_OTLP_*`,
//! `OTEL_METRIC_EXPORT_INTERVAL` and `OTEL_METRIC_EXPORT_TIMEOUT`. The resource is the traces'
//! (`service.name`, `service.instance.id`, `service.version`, `OTEL_RESOURCE_ATTRIBUTES`).
//!
//! The request path never waits for the collector: exports run on a task of their own, one at a
//! time, each bounded by its timeout; an export that fails is dropped (the next one carries the
//! cumulative totals), counted in `ate_otel_metric_exports_total{outcome="failed"}` and logged
//! (the first failure, then at most once a minute, then when exports work again).

mod convert;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::config::{Export, Plan, Protocol, Signal, plan_for};

/// `OTEL_METRIC_EXPORT_INTERVAL`'s default (the specification's).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// `OTEL_METRIC_EXPORT_TIMEOUT`'s default (the specification's).
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a collector that keeps failing is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How often the recorder's histograms are compacted between exports (as the `/metrics`
/// endpoint does).
const UPKEEP: Duration = Duration::from_secs(5);
/// How long the last export may take when the component stops.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Exports by outcome (ok, failed): the only series this module adds, and only when exporting.
pub const EXPORTS: &str = "ate_otel_metric_exports_total";

/// What the variables ask beyond the endpoint: headers, gzip, the interval and the timeout.
#[derive(Debug, PartialEq, Eq)]
struct Extras {
    headers: Vec<(String, String)>,
    gzip: bool,
    interval: Duration,
    timeout: Duration,
}

fn extras(var: &impl Fn(&str) -> Option<String>, export: &Export) -> Result<Extras, String> {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let either = |suffix: &str| {
        set(&format!("OTEL_EXPORTER_OTLP_METRICS_{suffix}"))
            .or_else(|| set(&format!("OTEL_EXPORTER_OTLP_{suffix}")))
    };
    let ms = |name: &str, default: Duration| {
        set(name)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .map_or(default, Duration::from_millis)
    };
    let gzip = match either("COMPRESSION")
        .map(|c| c.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("none") => false,
        Some("gzip") => true,
        Some(other) => {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_COMPRESSION={other}: not built in (gzip, none); OTLP metrics are off"
            ));
        }
    };
    // Every series is sent as the registry holds it, cumulative: a delta export would need
    // the previous values of every series kept here.
    if let Some(t) = set("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE")
        .filter(|t| !t.eq_ignore_ascii_case("cumulative"))
    {
        return Err(format!(
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={t}: only cumulative is built in"
        ));
    }
    Ok(Extras {
        headers: either("HEADERS")
            .map(|h| super::key_values(&h))
            .unwrap_or_default(),
        gzip,
        interval: ms("OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_INTERVAL),
        timeout: export
            .timeout
            .min(ms("OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_EXPORT_TIMEOUT)),
    })
}

/// How exports leave.
enum Transport {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    Http {
        client: reqwest::Client,
        url: String,
    },
}

struct Exporter {
    transport: Transport,
    extras: Extras,
    resource: Resource,
    /// The start of every cumulative series (Unix ns): when export began.
    start_ns: u64,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Exporter {
    fn new(export: &Export, extras: Extras, component: &'static str) -> Result<Self, String> {
        let tls = export
            .tls
            .as_ref()
            .map(super::export::client_tls)
            .transpose()?;
        let transport = match export.protocol {
            Protocol::Grpc => {
                let endpoint =
                    ate_tls::grpc::endpoint(&export.endpoint).map_err(|e| e.to_string())?;
                let endpoint = endpoint.timeout(extras.timeout);
                let channel = match tls {
                    None => endpoint.connect_lazy(),
                    Some(config) => {
                        ate_tls::grpc::tls_channel_lazy(endpoint, std::sync::Arc::new(config))
                    }
                };
                let mut client = MetricsServiceClient::new(channel);
                if extras.gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc(client)
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                // No proxy from HTTP(S)_PROXY, as for traces.
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .timeout(extras.timeout);
                let client = match tls {
                    Some(config) => client.tls_backend_preconfigured(config),
                    None => client,
                }
                .build()
                .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
                Transport::Http {
                    client,
                    url: export.endpoint.clone(),
                }
            }
        };
        // Header names and values a request cannot carry are refused now, not at each export.
        for (k, v) in &extras.headers {
            let bad = http::HeaderName::from_bytes(k.as_bytes()).is_err()
                || http::HeaderValue::from_str(v).is_err();
            if bad {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_HEADERS: {k:?} is not a valid header"
                ));
            }
        }
        Ok(Self {
            transport,
            extras,
            resource: Resource {
                attributes: super::resource_attributes(component)
                    .into_iter()
                    .map(|(key, value)| KeyValue {
                        key_strindex: 0,
                        key,
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(value)),
                        }),
                    })
                    .collect(),
                dropped_attributes_count: 0,
                entity_refs: Vec::new(),
            },
            start_ns: unix_ns(),
        })
    }

    /// One export of everything `/metrics` shows now, bounded by the timeout (the refresh of
    /// state behind some gauges included).
    async fn export(&mut self) -> Result<(), String> {
        let timeout = self.extras.timeout;
        match tokio::time::timeout(timeout, self.render_and_send()).await {
            Ok(sent) => sent,
            Err(_) => Err(format!("no answer in {} ms", timeout.as_millis())),
        }
    }

    async fn render_and_send(&mut self) -> Result<(), String> {
        ate_telemetry::refresh().await;
        let text = tokio::task::spawn_blocking(ate_telemetry::render)
            .await
            .map_err(|e| format!("rendering the metrics failed: {e}"))?;
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "ate".into(),
                        version: ate_telemetry::VERSION.into(),
                        attributes: Vec::new(),
                        dropped_attributes_count: 0,
                    }),
                    metrics: convert::metrics(&text, self.start_ns, unix_ns()),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        self.send(request).await
    }

    async fn send(&mut self, request: ExportMetricsServiceRequest) -> Result<(), String> {
        let rejected = match &mut self.transport {
            Transport::Grpc(client) => {
                let mut request = tonic::Request::new(request);
                for (k, v) in &self.extras.headers {
                    // Checked in `new`; gRPC metadata keys are lower case.
                    let key =
                        tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes());
                    if let (Ok(key), Ok(value)) = (key, v.parse()) {
                        request.metadata_mut().insert(key, value);
                    }
                }
                let reply = client
                    .export(request)
                    .await
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                reply.into_inner().partial_success
            }
            Transport::Http { client, url } => {
                use prost::Message as _;
                let mut body = request.encode_to_vec();
                let mut post = client
                    .post(url.as_str())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf");
                if self.extras.gzip {
                    body = gzip(&body).map_err(|e| format!("gzip: {e}"))?;
                    post = post.header(http::header::CONTENT_ENCODING, "gzip");
                }
                for (k, v) in &self.extras.headers {
                    post = post.header(k.as_str(), v.as_str());
                }
                let response = post.body(body).send().await.map_err(|e| e.to_string())?;
                let status = response.status();
                let bytes = response.bytes().await.unwrap_or_default();
                if !status.is_success() {
                    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
                    return Err(format!("HTTP {status}: {text}"));
                }
                opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse::decode(bytes)
                    .ok()
                    .and_then(|r| r.partial_success)
            }
        };
        match rejected {
            Some(p) if p.rejected_data_points > 0 => Err(format!(
                "the collector rejected {} data points: {}",
                p.rejected_data_points, p.error_message
            )),
            _ => Ok(()),
        }
    }
}

fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(body)?;
    encoder.finish()
}

/// The running export: stopped (with a last export) by [`MetricsExport::shutdown`].
pub struct MetricsExport {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsExport {
    /// Sends what the component counted up to now, then stops.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let bound = SHUTDOWN_TIMEOUT + Duration::from_secs(1);
        if tokio::time::timeout(bound, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Drop for MetricsExport {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts exporting `component`'s metrics when the variables ask for it (its recorder, from
/// `install`, is installed first, so its series are described even without `--metrics-listen`).
/// Must run inside the tokio runtime.
pub fn start(
    component: &'static str,
    install: fn() -> &'static ate_telemetry::PrometheusHandle,
) -> (Option<MetricsExport>, Option<super::Notice>) {
    use super::Notice;
    let var = |name: &str| std::env::var(name).ok();
    let export = match plan_for(Signal::Metrics, var) {
        Plan::Off => return (None, None),
        Plan::Refused(why) => return (None, Some(Notice::Refused(why))),
        Plan::Export(export) => export,
    };
    let exporter =
        extras(&var, &export).and_then(|extras| Exporter::new(&export, extras, component));
    let exporter = match exporter {
        Ok(exporter) => exporter,
        Err(e) => {
            return (
                None,
                Some(Notice::Refused(format!(
                    "metrics to {}: cannot set up the exporter: {e}; OTLP metrics are off",
                    export.endpoint
                ))),
            );
        }
    };
    let handle = install();
    ::metrics::describe_counter!(
        EXPORTS,
        ::metrics::Unit::Count,
        "OTLP metric exports by outcome (ok; failed: dropped, the next export carries the totals)."
    );
    for outcome in ["ok", "failed"] {
        ::metrics::counter!(EXPORTS, "outcome" => outcome).increment(0);
    }
    let how = format!(
        "{} every {} ms",
        export.describe("metrics"),
        exporter.extras.interval.as_millis()
    );
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(run(exporter, handle, export.endpoint, stopped));
    (
        Some(MetricsExport {
            stop: Some(stop),
            task,
        }),
        Some(Notice::Exporting(how)),
    )
}

async fn run(
    mut exporter: Exporter,
    handle: &'static ate_telemetry::PrometheusHandle,
    endpoint: String,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let interval = exporter.extras.interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    // An export slower than the interval delays the next; none queue up.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // The recorder keeps histogram samples until a render or an upkeep folds them into the
    // buckets: without `--metrics-listen` (whose endpoint does it) nothing else would between
    // exports.
    let mut upkeep = tokio::time::interval(UPKEEP);
    upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = Failing::default();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = upkeep.tick() => handle.run_upkeep(),
            _ = tick.tick() => {
                let result = exporter.export().await;
                failing.note(&endpoint, result);
            }
        }
    }
    let last = tokio::time::timeout(SHUTDOWN_TIMEOUT, exporter.export()).await;
    match last {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics: the last export to {endpoint} failed"),
        Err(_) => tracing::warn!("metrics: the last export to {endpoint} did not finish in time"),
    }
}

/// Failed exports since the last warning, and when that was.
#[derive(Default)]
struct Failing {
    since_warning: u64,
    warned: Option<std::time::Instant>,
}

impl Failing {
    fn note(&mut self, endpoint: &str, result: Result<(), String>) {
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        ::metrics::counter!(EXPORTS, "outcome" => outcome).increment(1);
        match result {
            Ok(()) => {
                if self.warned.take().is_some() {
                    tracing::info!("metrics: exports to {endpoint} work again");
                }
                self.since_warning = 0;
            }
            Err(e) => {
                self.since_warning += 1;
                if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    tracing::warn!(
                        error = %e,
                        dropped = self.since_warning,
                        "metrics: export to {endpoint} failed; dropped (the next export carries the totals)"
                    );
                    self.warned = Some(std::time::Instant::now());
                    self.since_warning = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
