//! The `--tls-cert`, `--tls-key`, `--tls-ca` and `--trust-domain` flags every component shares.
//! All three files given: mTLS with a [`CertSource`] reloaded when the files change. None given:
//! plaintext (development only; a warning is logged once). Some but not all: an error.

use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use crate::error::TlsError;
use crate::id::DEFAULT_TRUST_DOMAIN;
use crate::source::{CertSource, DEFAULT_FILE_POLL, PemFiles};

/// Flags of a component's own identity (flatten into its clap arguments).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct TlsArgs {
    /// This component's certificate (PEM, leaf first). With --tls-key and --tls-ca: mTLS.
    #[arg(long = "tls-cert", env = "ATE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM, mode 0600).
    #[arg(long = "tls-key", env = "ATE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle that peers' certificates must chain to (PEM).
    #[arg(long = "tls-ca", env = "ATE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// SPIFFE trust domain of every identity (`spiffe://<trust-domain>/ns/…/sa/…`).
    #[arg(long = "trust-domain", default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// How often the three files are checked for changes (`500ms`, `5s`); rotated certificates
    /// are picked up within this interval.
    #[arg(long = "tls-reload-interval", value_parser = parse_interval)]
    pub tls_reload_interval: Option<Duration>,
}

/// `250ms`, `5s` or `1m`.
pub fn parse_interval(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    let (number, unit_ms) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1u64)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60_000)
    } else {
        return Err(format!("{value:?}: use ms, s or m (e.g. 500ms)"));
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{value:?}: not a whole number followed by a unit"))?;
    let ms = n.saturating_mul(unit_ms);
    if ms == 0 {
        return Err(format!("{value:?}: must be > 0"));
    }
    Ok(Duration::from_millis(ms))
}

impl TlsArgs {
    /// Flags for these files (what `ate up` passes to its children).
    pub fn from_files(files: &PemFiles, trust_domain: &str) -> Self {
        TlsArgs {
            tls_cert: Some(files.cert.clone()),
            tls_key: Some(files.key.clone()),
            tls_ca: Some(files.ca.clone()),
            trust_domain: trust_domain.to_string(),
            tls_reload_interval: None,
        }
    }

    /// The trust domain, `ate.local` when the flag was left empty.
    pub fn trust_domain(&self) -> &str {
        if self.trust_domain.is_empty() {
            DEFAULT_TRUST_DOMAIN
        } else {
            &self.trust_domain
        }
    }

    /// The files, if all three were given; an error if only some were.
    pub fn files(&self) -> Result<Option<PemFiles>, TlsError> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(PemFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            })),
            _ => Err(TlsError::IncompleteFlags),
        }
    }

    /// The component's identity, reloaded from the files when they change; `None` (plaintext,
    /// logged once as a warning naming `component`) when no TLS flag was given. Must be called
    /// inside a tokio runtime.
    pub fn load(&self, component: &str) -> Result<Option<CertSource>, TlsError> {
        match self.files()? {
            Some(files) => {
                CertSource::from_files(files, self.tls_reload_interval.unwrap_or(DEFAULT_FILE_POLL))
                    .map(Some)
            }
            None => {
                static WARN: Once = Once::new();
                WARN.call_once(|| {
                    tracing::warn!(
                        component,
                        "no --tls-cert/--tls-key/--tls-ca: serving and calling in PLAINTEXT without authentication (development only)"
                    );
                });
                Ok(None)
            }
        }
    }

    /// The command-line form of these flags (what `ate up` passes to a child).
    pub fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (flag, path) in [
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
            ("--tls-ca", &self.tls_ca),
        ] {
            if let Some(p) = path {
                out.push(flag.to_string());
                out.push(p.display().to_string());
            }
        }
        out.push("--trust-domain".into());
        out.push(self.trust_domain().to_string());
        if let Some(i) = self.tls_reload_interval {
            out.push("--tls-reload-interval".into());
            out.push(format!("{}ms", i.as_millis().max(1)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_and_incomplete_flags() {
        assert_eq!(parse_interval("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_interval("5s").unwrap(), Duration::from_secs(5));
        assert!(parse_interval("5").is_err() && parse_interval("0s").is_err());
        let partial = TlsArgs {
            tls_cert: Some("a".into()),
            ..Default::default()
        };
        assert!(matches!(partial.files(), Err(TlsError::IncompleteFlags)));
        assert_eq!(TlsArgs::default().files().unwrap(), None);
        assert_eq!(TlsArgs::default().trust_domain(), DEFAULT_TRUST_DOMAIN);
    }
}
