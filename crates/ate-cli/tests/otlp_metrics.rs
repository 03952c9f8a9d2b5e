//! OTLP metrics end to end (issue 33): a real OTLP metrics receiver on 127.0.0.1 (the
//! collector's MetricsService from `opentelemetry-proto` over gRPC) and a real `ate up` (api,
//! node agent, runc + CRIU worker, router) configured only by `OTEL_*` variables, exporting
//! every 300 ms.
//!
//! - Every component exports, each with its `service.name` and a `service.instance.id` of its
//!   own; the router's spec series arrive under the spec's names: `atenet.router.parking.active`
//!   (1 while a request is parked) and `atenet.router.parking.rejected` (counting a request
//!   shed because the lot was full).
//! - The worker's per-actor series: `ate.worker.actor.cpu.time` / `.memory` for a running actor
//!   (on `/metrics` too), gone from the exports (and `/metrics`) once it is suspended.
//! - OTLP/HTTP with protobuf bodies, gzip and headers from the variables.
//! - A collector that never answers: requests are served, the failed exports counted and logged.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, metric, number_data_point};
use support::*;

/// One data point as received.
#[derive(Debug, Clone)]
struct Point {
    attributes: HashMap<String, String>,
    value: f64,
}

/// One export: its resource and its metrics (name → points).
#[derive(Debug, Clone)]
struct Got {
    at: Instant,
    service: String,
    instance: String,
    metrics: HashMap<String, Vec<Point>>,
}

impl Got {
    fn value(&self, metric: &str, attributes: &[(&str, &str)]) -> Option<f64> {
        self.metrics.get(metric)?.iter().find_map(|p| {
            attributes
                .iter()
                .all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v))
                .then_some(p.value)
        })
    }
}

#[derive(Default, Clone)]
struct Receiver {
    exports: Arc<Mutex<Vec<Got>>>,
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn number(v: &Option<number_data_point::Value>) -> f64 {
    match v {
        Some(number_data_point::Value::AsDouble(d)) => *d,
        Some(number_data_point::Value::AsInt(i)) => *i as f64,
        None => f64::NAN,
    }
}

/// The points of a gauge or a sum.
fn numbers(points: &[NumberDataPoint]) -> Vec<Point> {
    points
        .iter()
        .map(|p| Point {
            attributes: attributes(&p.attributes),
            value: number(&p.value),
        })
        .collect()
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.record(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Keeps one export, whichever transport brought it.
    fn record(&self, request: ExportMetricsServiceRequest) {
        for rm in request.resource_metrics {
            let resource = rm
                .resource
                .as_ref()
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let mut metrics = HashMap::new();
            for sm in rm.scope_metrics {
                for m in sm.metrics {
                    let points: Vec<Point> = match m.data {
                        Some(metric::Data::Gauge(g)) => numbers(&g.data_points),
                        Some(metric::Data::Sum(s)) => numbers(&s.data_points),
                        Some(metric::Data::Histogram(h)) => h
                            .data_points
                            .iter()
                            .map(|p| Point {
                                attributes: attributes(&p.attributes),
                                value: p.count as f64,
                            })
                            .collect(),
                        _ => Vec::new(),
                    };
                    metrics.insert(m.name, points);
                }
            }
            self.exports.lock().expect("exports").push(Got {
                at: Instant::now(),
                service: resource.get("service.name").cloned().unwrap_or_default(),
                instance: resource
                    .get("service.instance.id")
                    .cloned()
                    .unwrap_or_default(),
                metrics,
            });
        }
    }

    /// Waits (up to 30 s) for an export of `service` received after `after` for which `ready`
    /// holds; returns it.
    fn wait_for(
        &self,
        what: &str,
        service: &str,
        after: Instant,
        ready: impl Fn(&Got) -> bool,
    ) -> Got {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self
                .exports
                .lock()
                .expect("exports")
                .iter()
                .rev()
                .find(|g| g.service == service && g.at > after && ready(g))
                .cloned();
            if let Some(got) = found {
                return got;
            }
            if Instant::now() > deadline {
                let last = self
                    .exports
                    .lock()
                    .expect("exports")
                    .iter()
                    .rev()
                    .find(|g| g.service == service)
                    .cloned();
                panic!("{what}: no such export of {service} in 30 s; the last one:\n{last:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The worker's `/metrics` text.
fn worker_scrape(sys: &System) -> String {
    ate_test_support::http::http_get(&sys.worker_metrics[0], "/metrics").1
}

#[test]
fn every_component_exports_its_metrics_over_otlp() {
    let runtime = runtime();
    let receiver = Receiver::default();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("address");
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let endpoint = format!("http://{addr}");
    // The metrics endpoint only: traces stay off (no TraceService here).
    let sys = System::up_with_env(
        UpOptions {
            workers: 1,
            slots: 1,
            // One parking place: a second request waiting is shed at once.
            router_args: vec![
                "--parked-request-max=1".into(),
                "--parked-request-budget=3s".into(),
            ],
            ..Default::default()
        },
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ],
    );
    let begun = Instant::now();
    for name in ["om-a", "om-b", "om-c"] {
        sys.ate_ok(&create_actor_args(name, "ate-demo", "ate-demo/counter"));
    }

    // Every component, each with its own instance id.
    let mut instances = HashMap::new();
    for service in ["ate-api", "ate-router", "ate-node", "ate-worker"] {
        let got = receiver.wait_for("any export", service, begun, |g| {
            g.metrics.contains_key("ate.build.info") && g.metrics.contains_key("process.cpu.time")
        });
        assert!(
            !got.instance.is_empty(),
            "{service}: no service.instance.id"
        );
        instances.insert(got.instance, service);
    }
    assert_eq!(instances.len(), 4, "instance ids: {instances:?}");
    let router_log = sys.log("router");
    assert!(
        router_log.contains("metrics: exporting by OTLP/gRPC"),
        "the router says how it exports:\n{router_log}"
    );

    // The worker's only slot taken: om-a's own series, over OTLP and on /metrics.
    let (status, _, body) = get(sys.router_addr, "ate-demo/om-a", "/");
    assert_eq!(status, 200, "{body}");
    let running = Instant::now();
    let om_a = [("atespace", "ate-demo"), ("actor", "om-a")];
    let got = receiver.wait_for("om-a's series", "ate-worker", running, |g| {
        g.value("ate.worker.actor.memory", &om_a)
            .is_some_and(|v| v > 0.0)
    });
    let cpu = got.value("ate.worker.actor.cpu.time", &om_a);
    assert!(cpu.is_some_and(|s| s > 0.0), "om-a cpu {cpu:?}");
    let start = got.value("ate.worker.actor.start.time", &om_a);
    assert!(
        start.is_some_and(|s| s > 1.7e9),
        "om-a start time {start:?}: {:#?}",
        got.metrics.keys()
    );
    assert_eq!(
        got.value("ate.worker.actor.metrics.omitted", &[]),
        Some(0.0)
    );
    let text = worker_scrape(&sys);
    assert!(
        text.contains("ate_worker_actor_cpu_seconds_total{atespace=\"ate-demo\",actor=\"om-a\"}"),
        "{text}"
    );

    // om-b parks (no slot); om-c finds the lot full and is shed at once.
    let router = sys.router_addr;
    let parked = std::thread::spawn(move || get(router, "ate-demo/om-b", "/"));
    let active = receiver.wait_for("a parked request", "ate-router", begun, |g| {
        g.value("atenet.router.parking.active", &[]) == Some(1.0)
    });
    assert!(
        active
            .metrics
            .contains_key("atenet.router.parking.rejected")
    );
    let (status, _, body) = get(sys.router_addr, "ate-demo/om-c", "/");
    assert_eq!(status, 503, "{body}");
    let shed = Instant::now();
    receiver.wait_for("the shed request", "ate-router", shed, |g| {
        g.value("atenet.router.parking.rejected", &[])
            .is_some_and(|v| v >= 1.0)
    });
    let (status, _, body) = parked.join().expect("parked request");
    assert_eq!(status, 503, "om-b waited its budget out: {body}");

    // Suspended: om-a's series go from the next export and from /metrics.
    sys.ate_ok(&["suspend", "actor", "om-a", "-a", "ate-demo"]);
    let suspended = Instant::now();
    let got = receiver.wait_for(
        "an export after the suspend",
        "ate-worker",
        suspended,
        |g| g.metrics.contains_key("ate.worker.actor.cpu.time"),
    );
    let left: Vec<&Point> = got.metrics["ate.worker.actor.cpu.time"]
        .iter()
        .filter(|p| p.attributes.get("actor").map(String::as_str) == Some("om-a"))
        .collect();
    assert!(
        left.is_empty(),
        "om-a still exported after its suspend: {left:?}"
    );
    assert_eq!(
        got.value(
            "ate.worker.actor.memory",
            &[("atespace", "_other"), ("actor", "_other")]
        ),
        Some(0.0)
    );
    let text = worker_scrape(&sys);
    assert!(!text.contains("actor=\"om-a\""), "{text}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What the OTLP/HTTP receiver saw of each request besides its body.
#[derive(Default, Clone)]
struct HttpSeen {
    /// (path, content-encoding, the `x-ate-test` header) per request.
    requests: Arc<Mutex<Vec<(String, String, String)>>>,
}

/// Serves OTLP/HTTP on 127.0.0.1: `POST /v1/metrics` with a protobuf (optionally gzip)
/// `ExportMetricsServiceRequest`; anything else is a 404. Returns the base URL.
fn serve_http(runtime: &tokio::runtime::Runtime, receiver: &Receiver, seen: &HttpSeen) -> String {
    use http_body_util::BodyExt as _;
    use prost::Message as _;

    async fn answer(
        receiver: Receiver,
        seen: HttpSeen,
        request: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Response<http_body_util::Full<bytes::Bytes>>, hyper::Error> {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let (encoding, marker) = (header("content-encoding"), header("x-ate-test"));
        let path = request.uri().path().to_string();
        seen.requests
            .lock()
            .expect("seen")
            .push((path.clone(), encoding.clone(), marker));
        let mut body = request.into_body().collect().await?.to_bytes();
        if encoding == "gzip" {
            use std::io::Read as _;
            let mut plain = Vec::new();
            if flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut plain)
                .is_ok()
            {
                body = plain.into();
            }
        }
        let status = match ExportMetricsServiceRequest::decode(body) {
            Ok(export) if path == "/v1/metrics" => {
                receiver.record(export);
                200
            }
            Ok(_) => 404,
            Err(_) => 400,
        };
        let reply = ExportMetricsServiceResponse {
            partial_success: None,
        }
        .encode_to_vec();
        let mut response = hyper::Response::new(http_body_util::Full::from(reply));
        *response.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
        Ok(response)
    }

    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("address");
    let (receiver, seen) = (receiver.clone(), seen.clone());
    runtime.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (receiver, seen) = (receiver.clone(), seen.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |r| answer(receiver.clone(), seen.clone(), r));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// OTLP/HTTP with protobuf bodies, gzip and a header, asked for by `OTEL_METRICS_EXPORTER=otlp`
/// and the general variables with their `_METRICS_` forms.
#[test]
fn http_protobuf_with_gzip_and_headers() {
    let runtime = runtime();
    let (receiver, seen) = (Receiver::default(), HttpSeen::default());
    let base = serve_http(&runtime, &receiver, &seen);
    let sys = System::up_with_env(
        UpOptions::with_workers(1),
        &[
            ("OTEL_METRICS_EXPORTER", "otlp"),
            // The metrics endpoint is the whole URL; traces stay off (no endpoint for them).
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                &format!("{base}/v1/metrics"),
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-ate-test=yes%21"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ],
    );
    let begun = Instant::now();
    let got = receiver.wait_for("the router's spec series", "ate-router", begun, |g| {
        g.value("atenet.router.parking.active", &[]) == Some(0.0)
            && g.value("atenet.router.parking.rejected", &[]) == Some(0.0)
    });
    assert!(!got.instance.is_empty());
    for service in ["ate-api", "ate-node", "ate-worker"] {
        receiver.wait_for("an export", service, begun, |g| {
            g.metrics.contains_key("ate.build.info")
        });
    }
    let requests = seen.requests.lock().expect("seen").clone();
    assert!(!requests.is_empty());
    for (path, encoding, marker) in &requests {
        assert_eq!(
            (path.as_str(), encoding.as_str(), marker.as_str()),
            ("/v1/metrics", "gzip", "yes!")
        );
    }
    let log = sys.log("api");
    assert!(
        log.contains("metrics: exporting by OTLP/HTTP (http/protobuf)"),
        "{log}"
    );
}

/// A collector that takes connections and never answers: requests are served as usual, each
/// export gives up at its timeout, and the failures are counted on `/metrics` and logged.
#[test]
fn a_silent_collector_is_counted_not_waited_for() {
    let runtime = runtime();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    runtime.spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    let endpoint = format!("http://{addr}");
    let sys = System::up_with_env(
        UpOptions::with_workers(1),
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "200"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ],
    );
    sys.ate_ok(&create_actor_args(
        "om-quiet",
        "ate-demo",
        "ate-demo/counter",
    ));
    let metrics = sys.router_metrics.to_string();
    let failed = || {
        let (_, text) = ate_test_support::http::http_get(&metrics, "/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix("ate_otel_metric_exports_total{outcome=\"failed\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    for _ in 0..5 {
        let (status, _, body) = get(sys.router_addr, "ate-demo/om-quiet", "/");
        assert_eq!(status, 200, "{body}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while failed() < 2.0 {
        assert!(Instant::now() < deadline, "no failed export counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _, body) = get(sys.router_addr, "ate-demo/om-quiet", "/");
    assert_eq!(status, 200, "{body}");
    let log = sys.log("router");
    assert!(
        log.contains("metrics: export to") && log.contains("failed; dropped"),
        "{log}"
    );
}
