//! The metrics plan and its extras from the variables, and an export to a collector that is
//! not there.

use super::*;

use crate::otel::config::test_vars::{self, env};

fn export(pairs: &[(&str, &str)]) -> Export {
    test_vars::export(Signal::Metrics, pairs)
}

fn refused(pairs: &[(&str, &str)]) -> String {
    test_vars::refused(Signal::Metrics, pairs)
}

#[test]
fn on_with_an_endpoint_or_when_asked_for() {
    assert_eq!(plan_for(Signal::Metrics, env(&[])), Plan::Off);
    // The general endpoint turns metrics on as it does traces.
    let e = export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")]);
    assert_eq!(e.endpoint, "http://127.0.0.1:4317");
    // `none` wins over an endpoint.
    let off = plan_for(
        Signal::Metrics,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ]),
    );
    assert_eq!(off, Plan::Off);
    // `otlp` with no endpoint: the specification's default.
    let e = export(&[("OTEL_METRICS_EXPORTER", "otlp")]);
    assert_eq!(
        (e.protocol, e.endpoint.as_str()),
        (Protocol::Grpc, "http://localhost:4317")
    );
    let e = export(&[
        ("OTEL_METRICS_EXPORTER", "otlp"),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
    ]);
    assert_eq!(e.endpoint, "http://localhost:4318/v1/metrics");
    // Prometheus is --metrics-listen: no OTLP, alone; beside otlp, OTLP.
    let prometheus = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
        ("OTEL_METRICS_EXPORTER", "prometheus"),
    ];
    assert_eq!(plan_for(Signal::Metrics, env(&prometheus)), Plan::Off);
    export(&[("OTEL_METRICS_EXPORTER", "prometheus, otlp")]);
    let why = refused(&[("OTEL_METRICS_EXPORTER", "otlp,console")]);
    assert!(why.contains("console"), "{why}");
    assert_eq!(
        plan_for(
            Signal::Metrics,
            env(&[
                ("OTEL_METRICS_EXPORTER", "otlp"),
                ("OTEL_SDK_DISABLED", "true")
            ])
        ),
        Plan::Off
    );
}

#[test]
fn the_metrics_variables_win_and_http_gets_the_metrics_path() {
    let e = export(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ]);
    assert_eq!(e.endpoint, "http://a:4318/v1/metrics");
    let e = export(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://b:9000/custom",
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "4000"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "1500"),
    ]);
    assert_eq!(e.endpoint, "http://b:9000/custom");
    assert_eq!(e.timeout, Duration::from_millis(1500));
    // Traces' own variables are not metrics'.
    assert_eq!(
        plan_for(
            Signal::Metrics,
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://a:4317")])
        ),
        Plan::Off
    );
    let why = refused(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json"),
    ]);
    assert!(why.contains("http/json"), "{why}");
}

#[test]
fn extras_from_the_variables() {
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-general=1"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "authorization=Bearer%20t0k, x-team = core ,broken",
        ),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "2000"),
    ];
    let e = export(&vars);
    let x = extras(&env(&vars), &e).expect("extras");
    assert_eq!(
        x,
        Extras {
            headers: vec![
                ("authorization".into(), "Bearer t0k".into()),
                ("x-team".into(), "core".into())
            ],
            gzip: true,
            interval: Duration::from_millis(500),
            // The smaller of the exporter's (10 s) and the export's.
            timeout: Duration::from_secs(2),
        }
    );
    let plain = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317")];
    let x = extras(&env(&plain), &export(&plain)).expect("extras");
    assert_eq!(
        (x.interval, x.timeout, x.gzip),
        (DEFAULT_INTERVAL, Duration::from_secs(10), false)
    );
    let zstd = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
        ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "zstd"),
    ];
    let why = extras(&env(&zstd), &export(&zstd)).expect_err("zstd");
    assert!(why.contains("zstd"), "{why}");
    let delta = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ];
    let why = extras(&env(&delta), &export(&delta)).expect_err("delta");
    assert!(why.contains("only cumulative"), "{why}");
    let cumulative = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            "Cumulative",
        ),
    ];
    assert!(extras(&env(&cumulative), &export(&cumulative)).is_ok());
}

#[test]
fn the_resource_names_the_component_and_this_instance() {
    let attributes = crate::otel::resource_attributes("ate-router");
    let get = |k: &str| {
        attributes
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    // (OTEL_SERVICE_NAME is not set in unit tests.)
    assert_eq!(get("service.name").as_deref(), Some("ate-router"));
    assert_eq!(
        get("service.instance.id").as_deref(),
        Some(crate::otel::instance_id())
    );
    assert!(!crate::otel::instance_id().is_empty());
}

/// A collector that accepts connections and never answers: the export gives up at its
/// timeout with an error (counted and dropped by the loop), it does not hang.
#[tokio::test]
async fn a_silent_collector_costs_one_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            open.push(tcp);
        }
    });
    for protocol in ["grpc", "http/protobuf"] {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "300".to_string()),
        ];
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let e = export(&vars);
        let x = extras(&env(&vars), &e).expect("extras");
        let mut exporter = Exporter::new(&e, x, "ate-test").expect("exporter");
        let begun = std::time::Instant::now();
        let result = exporter.export().await;
        assert!(result.is_err(), "{protocol}: {result:?}");
        assert!(
            begun.elapsed() < Duration::from_secs(5),
            "{protocol}: {:?}",
            begun.elapsed()
        );
    }
    held.abort();
}
