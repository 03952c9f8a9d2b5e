//! A tiny OTLP/gRPC trace receiver that only counts what it is sent, for measuring the cost of
//! exporting traces (docs/benchmarks.md) without a collector:
//!
//!     cargo run --release -p ate-cli --example otlp_sink -- 127.0.0.1:4317
//!
//! Prints the spans received so far, per service, every 5 seconds when the count changed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;

#[derive(Default, Clone)]
struct Sink {
    spans: Arc<Mutex<BTreeMap<String, u64>>>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self
            .spans
            .lock()
            .map_err(|_| tonic::Status::internal("poisoned"))?;
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    any_value::Value::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            let n: usize = rs.scope_spans.iter().map(|s| s.spans.len()).sum();
            *spans.entry(service).or_default() += n as u64;
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4317".to_string())
        .parse()?;
    let sink = Sink::default();
    let report = sink.clone();
    tokio::spawn(async move {
        let mut last = BTreeMap::new();
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let now = report.spans.lock().map(|s| s.clone()).unwrap_or_default();
            if now != last {
                println!("spans received: {now:?}");
                last = now;
            }
        }
    });
    println!("OTLP/gRPC trace sink on {addr}");
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(sink))
        .serve(addr)
        .await?;
    Ok(())
}
