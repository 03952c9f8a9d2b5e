//! The span exporter of a plan: OTLP/gRPC or OTLP/HTTP, with its TLS config.

use std::path::Path;
use std::sync::Arc;

use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};

use super::config::{Export, Protocol, TlsFiles};

/// The rustls client config for the collector: its CA (or the system's), the client
/// certificate if any, on the provider of every other TLS config in the process.
pub(super) fn client_tls(files: &TlsFiles) -> Result<ate_tls::rustls::ClientConfig, String> {
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
pub(super) fn exporter(export: &Export) -> Result<opentelemetry_otlp::SpanExporter, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
