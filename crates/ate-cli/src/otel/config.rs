//! The export plan, read from the `OTEL_*` variables.

use std::path::PathBuf;
use std::time::Duration;

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

/// The signals exported over OTLP: each has its own variables (`OTEL_EXPORTER_OTLP_TRACES_*`,
/// `..._METRICS_*`, which win over the general ones) and its path on an OTLP/HTTP collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
        }
    }

    fn var(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
        }
    }
}

/// Reads the traces plan from `var` (the process environment in production).
pub fn plan(var: impl Fn(&str) -> Option<String>) -> Plan {
    plan_for(Signal::Traces, var)
}

/// Reads `signal`'s plan from `var`. Traces are off unless an endpoint is set. Metrics follow
/// `OTEL_METRICS_EXPORTER` (comma-separated; `otlp` or unset: OTLP; `none`, `prometheus`: no
/// OTLP, the Prometheus endpoint being `--metrics-listen`; anything else is refused): unset, they are exported when an
/// endpoint is set; `otlp` with no endpoint goes to the specification's default
/// (`localhost:4317` for gRPC, `http://localhost:4318` for HTTP).
pub fn plan_for(signal: Signal, var: impl Fn(&str) -> Option<String>) -> Plan {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let what = signal.name();
    // The signal's own variable wins over the general one (the specification's rule).
    let either = |suffix: &str| {
        set(&format!("OTEL_EXPORTER_OTLP_{}_{suffix}", signal.var()))
            .map(|v| (v, true))
            .or_else(|| set(&format!("OTEL_EXPORTER_OTLP_{suffix}")).map(|v| (v, false)))
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Plan::Off;
    }
    let mut asked = false;
    if let Some(exporters) = set("OTEL_METRICS_EXPORTER").filter(|_| signal == Signal::Metrics) {
        let mut otlp = false;
        for exporter in exporters
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            match exporter.to_ascii_lowercase().as_str() {
                "otlp" => otlp = true,
                // Prometheus is always there, on --metrics-listen: nothing to add for it.
                "none" | "prometheus" => {}
                other => {
                    return Plan::Refused(format!(
                        "OTEL_METRICS_EXPORTER={exporters}: {other} is not built in (otlp, \
                         prometheus: --metrics-listen, none); OTLP metrics are off"
                    ));
                }
            }
        }
        if !otlp {
            return Plan::Off;
        }
        asked = true;
    }
    let protocol = match either("PROTOCOL").map(|(p, _)| p).as_deref() {
        None | Some("grpc") => Protocol::Grpc,
        Some("http/protobuf") => Protocol::HttpProtobuf,
        Some("http/json") if signal == Signal::Traces => Protocol::HttpJson,
        Some("http/json") => {
            return Plan::Refused(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/json: not built in for {what} (grpc, \
                 http/protobuf); {what} are off"
            ));
        }
        Some(other) => {
            return Plan::Refused(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other}: not an OTLP protocol (grpc, http/protobuf, \
                 http/json); {what} are off"
            ));
        }
    };
    let (endpoint, for_signal) = match either("ENDPOINT") {
        Some(found) => found,
        None if asked => {
            let default = if protocol == Protocol::Grpc {
                "http://localhost:4317"
            } else {
                "http://localhost:4318"
            };
            (default.to_string(), false)
        }
        None => return Plan::Off,
    };
    let lower = endpoint.to_ascii_lowercase();
    let (endpoint, tls) = if lower.starts_with("https://") {
        (endpoint, true)
    } else if lower.starts_with("http://") {
        (endpoint, false)
    } else if lower.contains("://") {
        return Plan::Refused(format!(
            "OTLP endpoint {endpoint}: only http:// and https:// are supported; {what} are off"
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
            "OTLP/HTTP endpoint {endpoint}: give the URL with http:// or https://; {what} are off"
        ));
    };
    let endpoint = if protocol == Protocol::Grpc || for_signal {
        endpoint
    } else {
        // The general endpoint is the collector's base URL; each signal has its path.
        format!("{}/v1/{what}", endpoint.trim_end_matches('/'))
    };
    let timeout = either("TIMEOUT")
        .and_then(|(ms, _)| ms.parse::<u64>().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
    let tls = if tls {
        let client = match (either("CLIENT_CERTIFICATE"), either("CLIENT_KEY")) {
            (Some((cert, _)), Some((key, _))) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Plan::Refused(format!(
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go \
                     together (one is set without the other); {what} are off"
                ));
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
    /// One line for the component's log: how `what` (spans, metrics) leave.
    pub(super) fn describe(&self, what: &str) -> String {
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
            "{what}: exporting by {transport} ({}) to {}{tls}",
            self.protocol.name(),
            self.endpoint
        )
    }
}

/// The variables of the plans' tests (these and the metrics' ones): a list of pairs.
#[cfg(test)]
pub(crate) mod test_vars {
    use super::{Export, Plan, Signal, plan_for};

    /// `pairs` as the variables: the lookup [`plan_for`] takes.
    pub(crate) fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    /// `signal`'s plan under `pairs`, which must be an export.
    pub(crate) fn export(signal: Signal, pairs: &[(&str, &str)]) -> Export {
        match plan_for(signal, env(pairs)) {
            Plan::Export(export) => export,
            other => panic!("{pairs:?}: {other:?}"),
        }
    }

    /// Why `signal`'s plan under `pairs` is refused (it must be).
    pub(crate) fn refused(signal: Signal, pairs: &[(&str, &str)]) -> String {
        match plan_for(signal, env(pairs)) {
            Plan::Refused(why) => why,
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use test_vars::env;

    fn export(pairs: &[(&str, &str)]) -> Export {
        test_vars::export(Signal::Traces, pairs)
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        test_vars::refused(Signal::Traces, pairs)
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
}
