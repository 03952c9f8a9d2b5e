//! Connecting to the api: address resolution and one channel shared by every service client
//! (the channel and the service clients themselves: the ate-client crate).

use std::path::PathBuf;

use anyhow::Context;

use ate_client::Bearer;
pub use ate_client::{
    ADMIN_CERT_NAME, ApplyError, Clients, DEFAULT_STATE_DIR, TLS_DIR, apply_documents, connect_to,
    endpoint,
};

/// File in the state dir (and the user config dir) where `ate up` records the api address.
pub const API_ADDRESS_FILE: &str = "api-address";

/// The CLI's config dir: `$XDG_CONFIG_HOME/ate` or `~/.config/ate`.
pub fn config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("ate"))
}

/// The api-address file of earlier releases (`<config>/ate/api-address`), still read.
pub fn user_config_file() -> Option<PathBuf> {
    Some(config_dir()?.join(API_ADDRESS_FILE))
}

/// `--cert`, `--key`, `--ca` (or `ATE_CERT`, `ATE_KEY`, `ATE_CA`): the CLI's identity; or
/// `--token` (`ATE_TOKEN`) with `--ca`: a bearer token for an api in jwt mode.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    /// A JWT sent as `authorization: Bearer …` (never over plaintext).
    pub token: Option<String>,
    /// Trust domain of the api's pinned SPIFFE ID when no client certificate is presented.
    pub trust_domain: String,
}

/// Where `ate up` leaves a client configuration: the api-address file and the admin
/// certificate next to it; `explicit` when the user pointed at it (`ATE_STATE_DIR`).
struct Discovered {
    address_file: PathBuf,
    tls: ate_tls::PemFiles,
    explicit: bool,
}

fn discovered() -> Vec<Discovered> {
    let env_state = std::env::var_os("ATE_STATE_DIR").map(PathBuf::from);
    let state_dir = env_state
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    let from_state = Discovered {
        address_file: state_dir.join(API_ADDRESS_FILE),
        tls: ate_tls::PemFiles::in_dir(&state_dir.join(TLS_DIR), ADMIN_CERT_NAME),
        explicit: env_state.is_some(),
    };
    // An explicit ATE_STATE_DIR first, then the current context, then the default state dir.
    let context = crate::contexts::current_dir().map(|dir| Discovered {
        address_file: dir.join(API_ADDRESS_FILE),
        tls: ate_tls::PemFiles::in_dir(&dir, ADMIN_CERT_NAME),
        explicit: false,
    });
    let mut out = Vec::new();
    if from_state.explicit {
        out.push(from_state);
        out.extend(context);
    } else {
        out.extend(context);
        out.push(from_state);
    }
    if let Some(file) = user_config_file()
        && let Some(dir) = file.parent()
    {
        out.push(Discovered {
            tls: ate_tls::PemFiles::in_dir(dir, ADMIN_CERT_NAME),
            address_file: file,
            explicit: false,
        });
    }
    out
}

fn read_address(file: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let addr = text.trim();
    (!addr.is_empty()).then(|| addr.to_string())
}

/// `--api` / `ATE_API`, else what `ate up` wrote (state dir from `ATE_STATE_DIR`, then the user
/// config), else the default address.
pub fn resolve_address(flag: Option<String>) -> String {
    if let Some(a) = flag.filter(|a| !a.is_empty()) {
        return a;
    }
    discovered()
        .iter()
        .find_map(|d| read_address(&d.address_file))
        .unwrap_or_else(|| ate_core::DEFAULT_API_ADDR.to_string())
}

/// The certificate to present to the api at `address`: `--cert/--key/--ca` (all three), else
/// the admin certificate `ate up` wrote next to the api-address file that names `address` (or in
/// `$ATE_STATE_DIR/tls`), else none (plaintext).
pub fn resolve_tls(address: &str, flags: &ClientTls) -> anyhow::Result<Option<ate_tls::PemFiles>> {
    match (&flags.cert, &flags.key, &flags.ca) {
        (Some(cert), Some(key), Some(ca)) => {
            return Ok(Some(ate_tls::PemFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }));
        }
        (None, None, None) => {}
        _ => anyhow::bail!("--cert, --key and --ca (ATE_CERT, ATE_KEY, ATE_CA) go together"),
    }
    Ok(discovered()
        .into_iter()
        .find(|d| {
            d.tls.cert.exists()
                && (d.explicit || read_address(&d.address_file).as_deref() == Some(address))
        })
        .map(|d| d.tls))
}

/// The CA bundle to check the api with when sending a bearer token without a certificate:
/// `--ca`, else the one `ate up` wrote for `address`.
fn token_ca(address: &str, flags: &ClientTls) -> Option<PathBuf> {
    if let Some(ca) = &flags.ca {
        return Some(ca.clone());
    }
    discovered()
        .into_iter()
        .find(|d| {
            d.tls.ca.exists()
                && (d.explicit || read_address(&d.address_file).as_deref() == Some(address))
        })
        .map(|d| d.tls.ca)
}

/// Bearer-token mode (`--token`): TLS checked against the CA, the api's SPIFFE ID pinned; a
/// client certificate only if all of `--cert/--key/--ca` are given (the api then uses the
/// certificate and ignores the token). The admin certificate of `ate up` is not picked up, so
/// the token is what the api sees.
async fn connect_with_token(
    address: &str,
    tls: &ClientTls,
    token: &str,
) -> anyhow::Result<Clients> {
    let bearer = Bearer::new(token)?;
    if tls.cert.is_some() || tls.key.is_some() {
        let source = match resolve_tls(address, tls)? {
            Some(f) => ate_tls::CertSource::from_files(f.clone(), ate_tls::DEFAULT_FILE_POLL)
                .with_context(|| {
                    format!("cannot read the client certificate {}", f.cert.display())
                })?,
            None => anyhow::bail!("--cert, --key and --ca (ATE_CERT, ATE_KEY, ATE_CA) go together"),
        };
        let channel = connect_to(address, Some(&source))
            .await
            .with_context(|| format!("cannot reach the api at {address}"))?;
        return Ok(Clients::with_bearer(channel, bearer));
    }
    let Some(ca) = token_ca(address, tls) else {
        anyhow::bail!(
            "a bearer token is sent only over TLS: give --ca (ATE_CA), the CA bundle the api's certificate chains to"
        );
    };
    let roots = ate_tls::load_roots(&ca)
        .with_context(|| format!("cannot read the CA bundle {}", ca.display()))?;
    let config = ate_tls::client_config_no_cert(
        roots,
        ate_tls::ServerCheck::Pin(ate_tls::SpiffeId::api(&tls.trust_domain)?),
    )?;
    let channel = ate_tls::tls_channel(endpoint(address)?, std::sync::Arc::new(config))
        .await
        .with_context(|| {
            format!(
                "cannot reach the api at {address} (TLS with a bearer token, CA {})",
                ca.display()
            )
        })?;
    Ok(Clients::with_bearer(channel, bearer))
}

pub async fn connect(flag: Option<String>, tls: &ClientTls) -> anyhow::Result<Clients> {
    let address = resolve_address(flag);
    if let Some(token) = tls.token.as_deref().filter(|t| !t.trim().is_empty()) {
        return connect_with_token(&address, tls, token).await;
    }
    let files = resolve_tls(&address, tls)?;
    let source = match &files {
        Some(f) => Some(
            ate_tls::CertSource::from_files(f.clone(), ate_tls::DEFAULT_FILE_POLL).with_context(
                || format!("cannot read the client certificate {}", f.cert.display()),
            )?,
        ),
        None => None,
    };
    let channel = connect_to(&address, source.as_ref()).await.with_context(|| {
        let how = match &files {
            Some(f) => format!("mTLS as {}", f.cert.display()),
            None => "plaintext; no client certificate found (--cert/--key/--ca)".to_string(),
        };
        format!("cannot reach the api at {address} ({how}; is `ate up` running? set --api or ATE_API)")
    })?;
    Ok(Clients::new(channel))
}
