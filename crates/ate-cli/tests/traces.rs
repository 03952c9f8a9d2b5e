//! OpenTelemetry traces end to end (issue 15): a real OTLP trace receiver on 127.0.0.1 (the
//! collector's TraceService from `opentelemetry-proto` over gRPC, or `POST /v1/traces` over HTTP
//! with protobuf or JSON bodies, either of them over TLS) and a real `ate up` (api, node agent,
//! runc + CRIU worker, router) configured only by `OTEL_*` variables, which `ate up` passes on to
//! every component.
//!
//! - Every transport: OTLP/gRPC in plaintext (the full check below), over TLS with the CA from
//!   `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`; OTLP/HTTP with protobuf over TLS presenting a
//!   client certificate the receiver requires, and with JSON in plaintext. Each of those
//!   exports the whole trace of a cold request.
//!
//! - A cold request (the actor suspended, resumed by it) is one trace with spans from the router,
//!   the api, the node agent and the worker, each hop the child of the previous one, and the
//!   api's workflow steps in order; a restore from a snapshot likewise (node `download` aside:
//!   the generation is node-local).
//! - A warm request (route cached) is the router's and atunnel's spans only.
//! - A client's `traceparent` is the parent of the router's span.
//! - The log lines of a request carry its trace id beside its request id: the router's access
//!   log line and the lines of the api, the node agent and the worker for the cold request.
//!
//! The router runs with `--tunnel-idle-per-actor=0` so that every request opens its own tunnel:
//! atunnel sees CONNECTs, not the requests inside a pooled tunnel, so only a request that opens
//! a tunnel has an atunnel span (docs/observability.md).

mod support;

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ate_tls::rustls::ServerConfig;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use support::*;

/// One span as received, with what the test looks at.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent: String,
    start: u64,
    attributes: HashMap<String, String>,
}

impl Got {
    fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map(String::as_str).unwrap_or("")
    }
}

#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Got>>>,
    /// Exports that arrived gzip-compressed (`grpc-encoding` / `content-encoding: gzip`).
    gzipped: Arc<std::sync::atomic::AtomicUsize>,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if request
            .metadata()
            .get("grpc-encoding")
            .is_some_and(|v| v == "gzip")
        {
            self.gzipped
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Keeps the spans of one export, whichever transport brought it.
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut got = Vec::new();
        for rs in request.resource_spans {
            let resource = rs
                .resource
                .as_ref()
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        service: service.clone(),
                        name: s.name.clone(),
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        start: s.start_time_unix_nano,
                        attributes: attributes(&s.attributes),
                    });
                }
            }
        }
        self.spans.lock().expect("spans").extend(got);
    }

    fn all(&self) -> Vec<Got> {
        self.spans.lock().expect("spans").clone()
    }

    fn trace(&self, trace_id: &str) -> Vec<Got> {
        let mut spans: Vec<Got> = self
            .all()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect();
        spans.sort_by_key(|s| s.start);
        spans
    }

    /// Waits (up to 20 s: spans leave in batches every 200 ms) until `ready` holds for what
    /// was received; returns it.
    fn wait_for(&self, what: &str, ready: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let all = self.all();
            if ready(&all) {
                return all;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not received in 20 s; got:\n{}",
                show(&all)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The router's `request` span of the request with id `request_id`, once received.
    fn router_span(&self, request_id: &str) -> Got {
        let all = self.wait_for(&format!("router span of {request_id}"), |all| {
            all.iter().any(|s| is_router_request(s, request_id))
        });
        all.into_iter()
            .find(|s| is_router_request(s, request_id))
            .expect("found above")
    }
}

fn is_router_request(s: &Got, request_id: &str) -> bool {
    s.service == "ate-router" && s.name == "request" && s.attr("request_id") == request_id
}

fn show(spans: &[Got]) -> String {
    spans
        .iter()
        .map(|s| {
            format!(
                "  {} {} {} trace={} span={} parent={} {:?}",
                s.start, s.service, s.name, s.trace_id, s.span_id, s.parent, s.attributes
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Serves the collector's gRPC TraceService on 127.0.0.1 (over TLS with `tls`); its endpoint.
fn serve_grpc(
    runtime: &tokio::runtime::Runtime,
    receiver: &Receiver,
    tls: Option<Arc<ServerConfig>>,
) -> String {
    let _in = runtime.enter();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("address");
    let server = tonic::transport::Server::builder().add_service(
        TraceServiceServer::new(receiver.clone())
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
    );
    match tls {
        None => {
            runtime.spawn(
                server.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            format!("http://{addr}")
        }
        Some(mut config) => {
            Arc::make_mut(&mut config).alpn_protocols = vec![b"h2".to_vec()];
            let incoming = ate_tls::TlsIncoming::new(listener, config).expect("TLS listener");
            runtime.spawn(server.serve_with_incoming(incoming));
            format!("https://{addr}")
        }
    }
}

/// Serves OTLP/HTTP on 127.0.0.1 (over TLS with `tls`): `POST /v1/traces` with a protobuf or
/// JSON `ExportTraceServiceRequest`, answered in kind; anything else is a 404, which the
/// exporter takes as a failed export. Returns the base URL (the collector's, without the path).
fn serve_http(
    runtime: &tokio::runtime::Runtime,
    receiver: &Receiver,
    tls: Option<Arc<ServerConfig>>,
) -> String {
    use http_body_util::BodyExt as _;
    use prost::Message as _;

    async fn answer(
        receiver: Receiver,
        request: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Response<http_body_util::Full<bytes::Bytes>>, hyper::Error> {
        let json = request
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
        let ours = request.method() == hyper::Method::POST && request.uri().path() == "/v1/traces";
        let gzip = request
            .headers()
            .get(hyper::header::CONTENT_ENCODING)
            .is_some_and(|v| v == "gzip");
        let mut body = request.into_body().collect().await?.to_bytes();
        if gzip {
            use std::io::Read as _;
            let mut plain = Vec::new();
            if flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut plain)
                .is_ok()
            {
                receiver
                    .gzipped
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                body = plain.into();
            }
        }
        let decoded = if json {
            serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
        } else {
            ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string())
        };
        let (status, reply, kind) = match decoded {
            Ok(request) if ours => {
                receiver.record(request);
                let reply = ExportTraceServiceResponse {
                    partial_success: None,
                };
                if json {
                    (200, b"{}".to_vec(), "application/json")
                } else {
                    (200, reply.encode_to_vec(), "application/x-protobuf")
                }
            }
            Ok(_) => (404, b"not /v1/traces".to_vec(), "text/plain"),
            Err(e) => (400, e.into_bytes(), "text/plain"),
        };
        let mut response = hyper::Response::new(http_body_util::Full::from(reply));
        *response.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(kind),
        );
        Ok(response)
    }

    async fn serve<S>(stream: S, receiver: Receiver)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |r| answer(receiver.clone(), r));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .await;
    }

    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("address");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let acceptor = tls.map(ate_tls::tokio_rustls::TlsAcceptor::from);
    let receiver = receiver.clone();
    runtime.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let receiver = receiver.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    None => serve(tcp, receiver).await,
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(tls) => serve(tls, receiver).await,
                        Err(e) => eprintln!("receiver: TLS handshake refused: {e}"),
                    },
                }
            });
        }
    });
    format!("{scheme}://{addr}")
}

/// A CA in `dir` (its certificate at the returned path), and the receiver's TLS config with a
/// certificate of that CA for 127.0.0.1; requiring a client certificate of the CA when
/// `client_auth`, in which case it also writes one for the exporter (`client.pem`,
/// `client.key` in `dir`).
fn tls_receiver(dir: &std::path::Path, client_auth: bool) -> (std::path::PathBuf, ServerConfig) {
    use ate_tls::rustls;
    let ca = ate_tls::LocalCa::open_or_create(&dir.join("ca"), "otel.test").expect("CA");
    let issue = |name: &str| {
        let id = ate_tls::SpiffeId::parse(&format!("spiffe://otel.test/ns/t/sa/{name}"))
            .expect("SPIFFE ID");
        ca.issue(&ate_tls::SvidRequest::new(id).ip([127, 0, 0, 1].into()))
            .expect("issue")
    };
    let server = issue("collector");
    let provider = ate_tls::crypto_provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = if client_auth {
        let client = issue("exporter");
        std::fs::write(dir.join("client.pem"), client.cert_pem()).expect("write");
        std::fs::write(dir.join("client.key"), client.key_pem()).expect("write");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(ca.roots().expect("roots")),
            provider,
        )
        .build()
        .expect("client verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(server.chain.clone(), server.key_der())
        .expect("server certificate");
    (ca.cert_path(), config)
}

/// `ate up` exporting with `otel` (and spans every 200 ms); one cold request, whose trace must
/// arrive whole at `receiver`.
fn cold_request_exports_its_trace(receiver: &Receiver, otel: &[(&str, &str)], request_id: &str) {
    let mut env = otel.to_vec();
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "200"));
    // The receivers here take spans only (metrics: tests/otlp_metrics.rs).
    env.push(("OTEL_METRICS_EXPORTER", "none"));
    let sys = System::up_with_env(
        UpOptions {
            workers: 1,
            router_args: vec!["--tunnel-idle-per-actor=0".into()],
            // Requests through atunnel (its forward span): not handed off to the router.
            up_args: vec!["--no-local-tunnels".into()],
            ..Default::default()
        },
        &env,
    );
    sys.ate_ok(&create_actor_args("tr", "ate-demo", "ate-demo/counter"));
    let (status, head) = get_with(
        sys.router_addr,
        "ate-demo/tr",
        &[("x-request-id", request_id)],
    );
    assert_eq!(status, 200, "{head}\nrouter log:\n{}", sys.log("router"));
    assert_eq!(header(&head, "ate-resume"), Some("cold"), "{head}");
    let exporting = sys.log("router");
    assert!(
        exporting.contains("traces: exporting by"),
        "the router says how it exports:\n{exporting}"
    );
    check_cold(receiver, request_id, "run");
}

/// GET `/` through the router for `actor` with extra header lines: (status, head).
fn get_with(router: SocketAddr, actor: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(router).expect("connect router");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: test.local\r\nate-target-actor: {actor}\r\n{extra}Connection: close\r\n\r\n"
    )
    .expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The access log line of the request `request_id`, once written (the writer is a thread).
fn access_line(path: &std::path::Path, request_id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["request_id"] == request_id);
        if let Some(line) = found {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no access log line for {request_id}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The one span of `trace` from `service` named `name`.
fn one<'a>(trace: &'a [Got], service: &str, name: &str) -> &'a Got {
    let found: Vec<&Got> = trace
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {service} span {name:?} expected in:\n{}",
        show(trace)
    );
    found[0]
}

/// Checks the trace of a request that resumed its actor (`call`: the node's `run` or
/// `restore`); returns it.
fn check_cold(receiver: &Receiver, request_id: &str, call: &str) -> Vec<Got> {
    let root = receiver.router_span(request_id);
    let trace_id = root.trace_id.clone();
    // A span is sent when it ends, and a parent ends after its children: once each
    // component's outermost span is in, so is the rest.
    receiver.wait_for(&format!("the whole trace of {request_id}"), |all| {
        let has = |service: &str, name: &str| {
            all.iter().any(|s| {
                s.trace_id == trace_id
                    && s.service == service
                    && s.name == name
                    && (name != "forward" || s.attr("status") == "200")
            })
        };
        has("ate-worker", "forward")
            && has("ate-worker", "start")
            && has("ate-node", "start")
            && has("ate-api", "resume")
            && has("ate-router", "ResumeActor")
    });
    let trace = receiver.trace(&trace_id);
    eprintln!("trace of {request_id}:\n{}", show(&trace));

    assert!(root.parent.is_empty(), "router span is the root: {root:?}");
    assert_eq!(root.attr("resume"), "cold", "{root:?}");
    assert_eq!(root.attr("status"), "200", "{root:?}");
    assert_eq!(root.attr("actor"), "ate-demo/tr", "{root:?}");

    let services: BTreeSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
    for service in ["ate-router", "ate-api", "ate-node", "ate-worker"] {
        assert!(
            services.contains(service),
            "{service} missing:\n{}",
            show(&trace)
        );
    }
    // One trace for the request: every span carrying its id is in it.
    for s in receiver.all() {
        if s.attr("request_id") == request_id {
            assert_eq!(
                s.trace_id, trace_id,
                "a span of {request_id} elsewhere: {s:?}"
            );
        }
    }

    // Each hop is the child of the previous one. (A route cached before a suspend is tried
    // first and found stale: then the resume is in the request's second `resolve`.)
    let call_span = one(&trace, "ate-router", "ResumeActor");
    let resolve = trace
        .iter()
        .find(|s| s.span_id == call_span.parent)
        .unwrap_or_else(|| panic!("parent of ResumeActor:\n{}", show(&trace)));
    assert_eq!(resolve.name, "resolve");
    assert_eq!(resolve.parent, root.span_id);
    assert!(
        trace
            .iter()
            .any(|s| s.name == "single_flight_wait" && s.parent == resolve.span_id),
        "{}",
        show(&trace)
    );
    let resume = one(&trace, "ate-api", "resume");
    assert_eq!(resume.parent, call_span.span_id, "api continues the router");
    assert_eq!(resume.attr("request_id"), request_id);
    assert_eq!(
        (resume.attr("atespace"), resume.attr("name")),
        ("ate-demo", "tr"),
        "the spec's tags: {resume:?}"
    );
    let node_call = one(&trace, "ate-api", "node");
    let start = one(&trace, "ate-node", "start");
    assert_eq!(start.parent, node_call.span_id, "node continues the api");
    assert_eq!(start.attr("call"), call);
    let worker_call = one(&trace, "ate-node", "worker_start");
    assert_eq!(worker_call.parent, start.span_id);
    let worker = one(&trace, "ate-worker", "start");
    assert_eq!(
        worker.parent, worker_call.span_id,
        "worker continues the node"
    );
    let phases: Vec<&str> = trace
        .iter()
        .filter(|s| s.parent == worker.span_id)
        .map(|s| s.name.as_str())
        .collect();
    let fresh = |boot| vec![boot, "egress", "probe", "activate"];
    if call == "run" {
        assert_eq!(phases, fresh("run"), "{}", show(&trace));
    } else {
        // The suspended copy kept frozen in place is thawed, or the generation restored.
        assert!(
            phases == ["thaw"] || phases == fresh("restore"),
            "{phases:?}\n{}",
            show(&trace)
        );
    }
    let forwards: Vec<&Got> = trace
        .iter()
        .filter(|s| s.service == "ate-worker" && s.name == "forward" && s.attr("status") == "200")
        .collect();
    assert_eq!(forwards.len(), 1, "{}", show(&trace));
    assert_eq!(
        forwards[0].parent, root.span_id,
        "atunnel continues the router"
    );
    assert_eq!(forwards[0].attr("request_id"), request_id);

    // The workflow's steps, children of the resume, in order.
    let steps: Vec<&str> = trace
        .iter()
        .filter(|s| s.service == "ate-api" && s.parent == resume.span_id)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        steps,
        ["lease", "load", "schedule", "node", "finalize"],
        "{}",
        show(&trace)
    );
    let schedule = one(&trace, "ate-api", "schedule");
    assert_eq!(one(&trace, "ate-api", "bind").parent, schedule.span_id);
    trace
}

#[test]
fn one_trace_per_request_across_every_hop() {
    let runtime = runtime();
    let receiver = Receiver::default();
    let endpoint = serve_grpc(&runtime, &receiver, None);

    let access = tempfile::tempdir().expect("tempdir");
    let access_log = access.path().join("access.log");
    let sys = System::up_with_env(
        UpOptions {
            workers: 1,
            router_args: vec![
                "--tunnel-idle-per-actor=0".into(),
                format!("--access-log={}", access_log.display()),
            ],
            // Requests through atunnel (its forward span): not handed off to the router.
            up_args: vec!["--no-local-tunnels".into()],
            ..Default::default()
        },
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    );
    sys.ate_ok(&create_actor_args("tr", "ate-demo", "ate-demo/counter"));

    // Cold (a cold boot), then at once warm (route cached) and warm with a client's trace.
    let (status, head) = get_with(
        sys.router_addr,
        "ate-demo/tr",
        &[("x-request-id", "tr-cold")],
    );
    assert_eq!(status, 200, "{head}\nrouter log:\n{}", sys.log("router"));
    assert_eq!(header(&head, "ate-resume"), Some("cold"), "{head}");
    let (status, head) = get_with(
        sys.router_addr,
        "ate-demo/tr",
        &[("x-request-id", "tr-warm")],
    );
    assert_eq!(status, 200, "{head}");
    assert_eq!(header(&head, "ate-resume"), Some("warm"), "{head}");
    let client_trace = "0af7651916cd43dd8448eb211c80319c";
    let client_span = "b7ad6b7169203331";
    let traceparent = format!("00-{client_trace}-{client_span}-01");
    let (status, head) = get_with(
        sys.router_addr,
        "ate-demo/tr",
        &[("x-request-id", "tr-client"), ("traceparent", &traceparent)],
    );
    assert_eq!(status, 200, "{head}");
    assert_eq!(header(&head, "ate-resume"), Some("warm"), "{head}");

    let cold = check_cold(&receiver, "tr-cold", "run");
    let cold_trace = &cold[0].trace_id;
    // The log lines of the request carry its trace id: the access log's, and every line of the
    // api, the node agent and the worker that names the request.
    assert_eq!(
        access_line(&access_log, "tr-cold")["trace_id"],
        cold_trace.as_str()
    );
    for component in ["api", "node", "worker-1"] {
        let lines = lines_with(component, "request_id=tr-cold", || sys.log(component));
        for line in &lines {
            assert!(
                line.contains(&format!("trace_id={cold_trace}")),
                "{component}: a line of tr-cold without its trace id {cold_trace}:\n{line}"
            );
        }
    }

    // Warm: the router and atunnel only (nothing asked the api).
    let warm = receiver.router_span("tr-warm");
    assert_eq!(warm.attr("resume"), "warm", "{warm:?}");
    let trace_id = warm.trace_id.clone();
    receiver.wait_for("atunnel's span of tr-warm", |all| {
        all.iter()
            .any(|s| s.trace_id == trace_id && s.service == "ate-worker" && s.name == "forward")
    });
    // Anything else of this trace would have come in the same batches.
    std::thread::sleep(Duration::from_millis(1000));
    let trace = receiver.trace(&trace_id);
    eprintln!("trace of tr-warm:\n{}", show(&trace));
    for s in &trace {
        let ours = (s.service == "ate-router")
            || (s.service == "ate-worker" && s.name == "forward" && s.parent == warm.span_id);
        assert!(ours, "a warm request is the router and atunnel only: {s:?}");
    }
    assert_eq!(one(&trace, "ate-router", "resolve").parent, warm.span_id);

    // The client's trace: the router's span is its child.
    let client = receiver.router_span("tr-client");
    assert_eq!(client.trace_id, client_trace, "{client:?}");
    assert_eq!(client.parent, client_span, "{client:?}");
    assert_eq!(
        access_line(&access_log, "tr-client")["trace_id"],
        client_trace
    );

    // A restore from the snapshot its suspend made: the node's Restore, the worker's restore.
    sys.ate_ok(&["suspend", "actor", "tr", "-a", "ate-demo"]);
    let (status, head) = get_with(
        sys.router_addr,
        "ate-demo/tr",
        &[("x-request-id", "tr-restore")],
    );
    assert_eq!(status, 200, "{head}\nrouter log:\n{}", sys.log("router"));
    assert_eq!(header(&head, "ate-resume"), Some("cold"), "{head}");
    check_cold(&receiver, "tr-restore", "restore");
}

#[test]
fn otlp_http_protobuf_over_tls_with_a_client_certificate() {
    let runtime = runtime();
    let receiver = Receiver::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, config) = tls_receiver(dir.path(), true);
    // The general endpoint: the exporter adds /v1/traces.
    let endpoint = serve_http(&runtime, &receiver, Some(Arc::new(config)));
    let (cert, key) = (dir.path().join("client.pem"), dir.path().join("client.key"));
    cold_request_exports_its_trace(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca.to_string_lossy()),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                &cert.to_string_lossy(),
            ),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key.to_string_lossy()),
        ],
        "tr-https",
    );
}

#[test]
fn otlp_grpc_over_tls() {
    let runtime = runtime();
    let receiver = Receiver::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, config) = tls_receiver(dir.path(), false);
    let endpoint = serve_grpc(&runtime, &receiver, Some(Arc::new(config)));
    // The traces forms of the variables, over general ones that would fail.
    cold_request_exports_its_trace(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                &ca.to_string_lossy(),
            ),
        ],
        "tr-grpcs",
    );
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`, over gRPC and over HTTP: the exports arrive
/// compressed and whole.
#[test]
fn otlp_gzip_over_grpc_and_http() {
    let runtime = runtime();
    for (protocol, request_id) in [("grpc", "tr-gzip-grpc"), ("http/protobuf", "tr-gzip-http")] {
        let receiver = Receiver::default();
        let endpoint = if protocol == "grpc" {
            serve_grpc(&runtime, &receiver, None)
        } else {
            serve_http(&runtime, &receiver, None)
        };
        cold_request_exports_its_trace(
            &receiver,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ],
            request_id,
        );
        assert!(
            receiver.gzipped.load(std::sync::atomic::Ordering::SeqCst) > 0,
            "{protocol}: the exports were gzip-compressed"
        );
    }
}

#[test]
fn otlp_http_json() {
    let runtime = runtime();
    let receiver = Receiver::default();
    let endpoint = serve_http(&runtime, &receiver, None);
    // The traces endpoint is the whole URL.
    let url = format!("{endpoint}/v1/traces");
    cold_request_exports_its_trace(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ],
        "tr-json",
    );
}
