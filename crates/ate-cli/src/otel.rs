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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// How long the last batch may take to go out when the component stops.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter's timeout per export when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say (the
/// specification's 10 s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What to do about traces, from the environment.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Off,
    Export(Export),
    /// Asked for, but not possible with this build or these files: the reason, for a warning.
    Refused(String),
}

/// Where and how spans are exported.
#[derive(Debug, PartialEq, Eq)]
pub struct Export {
    pub protocol: Protocol,
    /// gRPC: the collector's address with its scheme; HTTP: the URL the spans are POSTed to.
    pub endpoint: String,
    /// TLS to the collector: an `https://` endpoint (or a gRPC one without a scheme, unless
    /// `OTEL_EXPORTER_OTLP_INSECURE=true`).
    pub tls: Option<TlsFiles>,
    pub timeout: Duration,
}

/// The OTLP transports and encodings built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
    HttpJson,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }
}

/// The files TLS to the collector uses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA certificates to check the collector with; the system's when `None`.
    pub ca: Option<PathBuf>,
    /// PEM certificate chain and private key to present (mutual TLS).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Reads the plan from `var` (the process environment in production).
pub fn plan(var: impl Fn(&str) -> Option<String>) -> Plan {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    // The signal's own variable wins over the general one (the specification's rule).
    let either = |suffix: &str| {
        set(&format!("OTEL_EXPORTER_OTLP_TRACES_{suffix}"))
            .map(|v| (v, true))
            .or_else(|| set(&format!("OTEL_EXPORTER_OTLP_{suffix}")).map(|v| (v, false)))
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Plan::Off;
    }
    let Some((endpoint, for_traces)) = either("ENDPOINT") else {
        return Plan::Off;
    };
    let protocol = match either("PROTOCOL").map(|(p, _)| p).as_deref() {
        None | Some("grpc") => Protocol::Grpc,
        Some("http/protobuf") => Protocol::HttpProtobuf,
        Some("http/json") => Protocol::HttpJson,
        Some(other) => {
            return Plan::Refused(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other}: not an OTLP protocol (grpc, http/protobuf, \
                 http/json); traces are off"
            ));
        }
    };
    let lower = endpoint.to_ascii_lowercase();
    let (endpoint, tls) = if lower.starts_with("https://") {
        (endpoint, true)
    } else if lower.starts_with("http://") {
        (endpoint, false)
    } else if lower.contains("://") {
        return Plan::Refused(format!(
            "OTLP endpoint {endpoint}: only http:// and https:// are supported; traces are off"
        ));
    } else if protocol == Protocol::Grpc {
        // `host:port`: TLS unless told otherwise, as the specification says for gRPC.
        let insecure = either("INSECURE").is_some_and(|(v, _)| v.eq_ignore_ascii_case("true"));
        if insecure {
            (format!("http://{endpoint}"), false)
        } else {
            (format!("https://{endpoint}"), true)
        }
    } else {
        return Plan::Refused(format!(
            "OTLP/HTTP endpoint {endpoint}: give the URL with http:// or https://; traces are off"
        ));
    };
    let endpoint = if protocol == Protocol::Grpc || for_traces {
        endpoint
    } else {
        // The general endpoint is the collector's base URL; each signal has its path.
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    };
    let timeout = either("TIMEOUT")
        .and_then(|(ms, _)| ms.parse::<u64>().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
    let tls = if tls {
        let client = match (either("CLIENT_CERTIFICATE"), either("CLIENT_KEY")) {
            (Some((cert, _)), Some((key, _))) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Plan::Refused(
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go \
                     together (one is set without the other); traces are off"
                        .into(),
                );
            }
        };
        Some(TlsFiles {
            ca: either("CERTIFICATE").map(|(ca, _)| PathBuf::from(ca)),
            client,
        })
    } else {
        None
    };
    Plan::Export(Export {
        protocol,
        endpoint,
        tls,
        timeout,
    })
}

impl Export {
    /// One line for the component's log: how spans leave.
    fn describe(&self) -> String {
        let transport = match self.protocol {
            Protocol::Grpc => "OTLP/gRPC",
            Protocol::HttpProtobuf | Protocol::HttpJson => "OTLP/HTTP",
        };
        let tls = match &self.tls {
            None => String::new(),
            Some(files) => format!(
                " over TLS (CA: {}{})",
                files
                    .ca
                    .as_deref()
                    .map_or_else(|| "the system's".to_string(), |p| p.display().to_string()),
                if files.client.is_some() {
                    "; client certificate"
                } else {
                    ""
                }
            ),
        };
        format!(
            "traces: exporting by {transport} ({}) to {}{tls}",
            self.protocol.name(),
            self.endpoint
        )
    }
}

/// The rustls client config for the collector: its CA (or the system's), the client
/// certificate if any, on the provider of every other TLS config in the process.
fn client_tls(files: &TlsFiles) -> Result<ate_tls::rustls::ClientConfig, String> {
    use ate_tls::rustls::pki_types::pem::PemObject as _;
    use ate_tls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{what} {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "{what} {}: no PEM certificate in it",
                path.display()
            ));
        }
        Ok(certs)
    }

    let mut roots = ate_tls::rustls::RootCertStore::empty();
    match &files.ca {
        Some(path) => {
            for cert in certificates(path, "OTEL_EXPORTER_OTLP_CERTIFICATE")? {
                roots.add(cert).map_err(|e| {
                    format!("OTEL_EXPORTER_OTLP_CERTIFICATE {}: {e}", path.display())
                })?;
            }
        }
        None => {
            // Unreadable entries are skipped, as every TLS client does with the system store.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "no CA certificates found on this system to check the collector with; set \
                     OTEL_EXPORTER_OTLP_CERTIFICATE"
                        .into(),
                );
            }
        }
    }
    let builder = ate_tls::rustls::ClientConfig::builder_with_provider(ate_tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    match &files.client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = certificates(cert, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("OTEL_EXPORTER_OTLP_CLIENT_KEY {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate and key do not go together: {e}"))
        }
    }
}

/// The OTLP/HTTP client: reqwest, with each request run on the component's tokio runtime. The
/// batch processor exports from a thread of its own that has no runtime, and reqwest (hyper)
/// needs one for its connections and timers.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[tonic::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// The span exporter `export` describes. Must run inside the tokio runtime.
fn exporter(export: &Export) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let tls = export.tls.as_ref().map(client_tls).transpose()?;
    let built = match export.protocol {
        Protocol::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                .with_timeout(export.timeout);
            match tls {
                None => builder.with_endpoint(export.endpoint.as_str()).build(),
                Some(config) => {
                    // Our connector does the TLS (ALPN h2, the endpoint's host as the name
                    // checked); tonic dials plain http to it.
                    let endpoint = ate_tls::grpc::endpoint(&export.endpoint)
                        .map_err(|e| e.to_string())?
                        .timeout(export.timeout);
                    let channel = ate_tls::grpc::tls_channel_lazy(endpoint, Arc::new(config));
                    builder.with_channel(channel).build()
                }
            }
        }
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            // No proxy from HTTP(S)_PROXY: like the gRPC exporter, spans go straight to the
            // collector.
            let client = reqwest::Client::builder()
                .no_proxy()
                .timeout(export.timeout);
            let client = match tls {
                Some(config) => client.tls_backend_preconfigured(config),
                None => client,
            }
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
            let runtime = tokio::runtime::Handle::try_current().map_err(|e| e.to_string())?;
            let protocol = if export.protocol == Protocol::HttpJson {
                opentelemetry_otlp::Protocol::HttpJson
            } else {
                opentelemetry_otlp::Protocol::HttpBinary
            };
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(OnRuntime { client, runtime })
                .with_protocol(protocol)
                .with_endpoint(export.endpoint.as_str())
                .with_timeout(export.timeout)
                .build()
        }
    };
    built.map_err(|e| e.to_string())
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
        Some(Notice::Exporting(export.describe())),
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

    fn export(pairs: &[(&str, &str)]) -> Export {
        match plan(env(pairs)) {
            Plan::Export(export) => export,
            other => panic!("{pairs:?}: {other:?}"),
        }
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        match plan(env(pairs)) {
            Plan::Refused(why) => why,
            other => panic!("{pairs:?}: {other:?}"),
        }
    }

    const GRPC: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");

    #[test]
    fn off_unless_an_endpoint_is_set() {
        assert_eq!(plan(env(&[])), Plan::Off);
        assert_eq!(plan(env(&[("OTEL_SERVICE_NAME", "x")])), Plan::Off);
        assert_eq!(
            plan(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            Plan::Off
        );
        assert_eq!(
            export(&[GRPC]),
            Export {
                protocol: Protocol::Grpc,
                endpoint: "http://127.0.0.1:4317".into(),
                tls: None,
                timeout: DEFAULT_TIMEOUT,
            }
        );
        let e = export(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4317",
        )]);
        assert_eq!(e.endpoint, "http://127.0.0.1:4317");
        assert_eq!(plan(env(&[GRPC, ("OTEL_SDK_DISABLED", "TRUE")])), Plan::Off);
    }

    #[test]
    fn protocols() {
        let protocol = |p: &str| export(&[GRPC, ("OTEL_EXPORTER_OTLP_PROTOCOL", p)]).protocol;
        assert_eq!(protocol("grpc"), Protocol::Grpc);
        assert_eq!(protocol(" http/protobuf "), Protocol::HttpProtobuf);
        assert_eq!(protocol("http/json"), Protocol::HttpJson);
        let why = refused(&[GRPC, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/xml")]);
        assert!(why.contains("http/xml"), "{why}");
        // The signal's own variable wins over the general one.
        let e = export(&[
            GRPC,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]);
        assert_eq!(e.protocol, Protocol::Grpc);
        let e = export(&[
            GRPC,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ]);
        assert_eq!(e.protocol, Protocol::HttpProtobuf);
    }

    #[test]
    fn http_endpoints_get_the_traces_path_unless_given_for_traces() {
        let http = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
        for (base, url) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
            ("https://c.example/otlp", "https://c.example/otlp/v1/traces"),
        ] {
            let e = export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", base), http]);
            assert_eq!(e.endpoint, url);
        }
        // The traces endpoint is used as it is, and wins.
        let e = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4318/custom"),
            http,
        ]);
        assert_eq!(e.endpoint, "http://b:4318/custom");
        // gRPC has no path to add.
        assert_eq!(export(&[GRPC]).endpoint, "http://127.0.0.1:4317");
        // An HTTP URL needs its scheme; other schemes are refused.
        let why = refused(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"), http]);
        assert!(why.contains("http://"), "{why}");
        let why = refused(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "unix:///run/otel.sock")]);
        assert!(why.contains("unix://"), "{why}");
    }

    #[test]
    fn tls_for_https_and_for_grpc_without_a_scheme() {
        assert_eq!(export(&[GRPC]).tls, None);
        let e = export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "HTTPS://c.example:4317")]);
        assert_eq!(e.tls, Some(TlsFiles::default()), "the system's CAs");
        let e = export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c.example:4317")]);
        assert_eq!(e.endpoint, "https://c.example:4317");
        assert!(e.tls.is_some());
        let e = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "c.example:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true"),
        ]);
        assert_eq!(e.endpoint, "http://c.example:4317");
        assert_eq!(e.tls, None);
        // Certificates are for TLS only; a plaintext endpoint ignores them.
        let e = export(&[GRPC, ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")]);
        assert_eq!(e.tls, None);
    }

    #[test]
    fn tls_files_and_their_traces_forms() {
        let https = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4318");
        let e = export(&[
            https,
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/general.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/client.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/client.key"),
        ]);
        assert_eq!(
            e.tls,
            Some(TlsFiles {
                ca: Some("/traces.pem".into()),
                client: Some(("/client.pem".into(), "/client.key".into())),
            })
        );
        let why = refused(&[https, ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem")]);
        assert!(why.contains("CLIENT_KEY"), "{why}");
        let why = refused(&[https, ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/c.key")]);
        assert!(why.contains("CLIENT_CERTIFICATE"), "{why}");
    }

    #[test]
    fn timeouts() {
        assert_eq!(export(&[GRPC]).timeout, DEFAULT_TIMEOUT);
        let e = export(&[GRPC, ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")]);
        assert_eq!(e.timeout, Duration::from_millis(2500));
        let e = export(&[
            GRPC,
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700"),
        ]);
        assert_eq!(e.timeout, Duration::from_millis(700));
        // Not a number of milliseconds: the default, as the exporter itself does.
        let e = export(&[GRPC, ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s")]);
        assert_eq!(e.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn tls_files_that_do_not_load_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let files = TlsFiles {
            ca: Some(missing.clone()),
            client: None,
        };
        let why = client_tls(&files).expect_err("missing CA");
        assert!(
            why.contains("OTEL_EXPORTER_OTLP_CERTIFICATE") && why.contains("missing.pem"),
            "{why}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not PEM\n").expect("write");
        let files = TlsFiles {
            ca: Some(empty),
            client: None,
        };
        let why = client_tls(&files).expect_err("no certificate");
        assert!(why.contains("no PEM certificate"), "{why}");
    }

    #[test]
    fn a_ca_and_a_client_certificate_make_a_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca =
            ate_tls::LocalCa::open_or_create(&dir.path().join("ca"), "test.local").expect("CA");
        let id = ate_tls::SpiffeId::parse("spiffe://test.local/ns/t/sa/client").expect("id");
        let svid = ca.issue(&ate_tls::SvidRequest::new(id)).expect("issue");
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("c.key"));
        std::fs::write(&cert, svid.cert_pem()).expect("write");
        std::fs::write(&key, svid.key_pem()).expect("write");
        let files = TlsFiles {
            ca: Some(ca.cert_path()),
            client: Some((cert.clone(), key)),
        };
        let config = client_tls(&files).expect("config");
        assert!(config.client_auth_cert_resolver.has_certs());
        // A certificate with another's key is refused, not sent.
        let other = ca
            .issue(&ate_tls::SvidRequest::new(
                ate_tls::SpiffeId::parse("spiffe://test.local/ns/t/sa/other").expect("id"),
            ))
            .expect("issue");
        let other_key = dir.path().join("other.key");
        std::fs::write(&other_key, other.key_pem()).expect("write");
        let files = TlsFiles {
            ca: Some(ca.cert_path()),
            client: Some((cert, other_key)),
        };
        let why = client_tls(&files).expect_err("mismatched key");
        assert!(why.contains("do not go together"), "{why}");
    }
}
