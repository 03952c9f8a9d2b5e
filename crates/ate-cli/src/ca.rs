//! `ate ca`: the fleet's CA on a control host, and certificates for the control plane's own
//! identities (api replicas, routers, admins) — so no one writes an openssl recipe. Machines that
//! host actors do not use this: they join (`ate up --role node`, `ate join`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum CaCmd {
    /// Create the CA (`ca.crt`, `ca.key`) in DIR, or check the one there.
    Init {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = ate_tls::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
    },
    /// Issue a certificate for a control-plane identity into OUT (`<sa>.crt`, `<sa>.key`, `ca.crt`).
    Issue {
        /// The CA directory (`ate ca init`).
        #[arg(long)]
        dir: PathBuf,
        /// api, router, admin, or ingress-client (`…/ns/ate-system/sa/atenet-client`, the
        /// identity the router's --ingress-allowed-spiffe-ids admits by default).
        #[arg(long, value_enum)]
        identity: Identity,
        #[arg(long)]
        out: PathBuf,
        /// Extra DNS name or IP for clients that check the host name (repeatable).
        #[arg(long = "san")]
        sans: Vec<String>,
        /// Validity; re-issue (or use `ate up`, which rotates) before it ends.
        #[arg(long, default_value = "2160h", value_parser = ate_router::config::parse_duration)]
        lifetime: Duration,
    },
}

/// The service account of ingress clients in the spec's default allow-list
/// (`spiffe://cluster.local/ns/ate-system/sa/atenet-client`).
const INGRESS_CLIENT_SA: &str = "atenet-client";

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Identity {
    Api,
    Router,
    Admin,
    IngressClient,
}

pub fn run(cmd: CaCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        CaCmd::Init { dir, trust_domain } => {
            let ca = ate_tls::LocalCa::open_or_create(&dir, &trust_domain)
                .with_context(|| format!("cannot create or open the CA in {}", dir.display()))?;
            println!(
                "CA for trust domain {} in {} (sha256 {})",
                ca.trust_domain(),
                dir.display(),
                ate_tls::join::fingerprint(ca.cert_der())
            );
        }
        CaCmd::Issue {
            dir,
            identity,
            out,
            sans,
            lifetime,
        } => {
            let ca = ate_tls::LocalCa::open(&dir).with_context(|| {
                format!("cannot open the CA in {} (ate ca init)", dir.display())
            })?;
            let td = ca.trust_domain().to_string();
            let id = match identity {
                Identity::Api => ate_tls::SpiffeId::api(&td)?,
                Identity::Router => ate_tls::SpiffeId::router(&td)?,
                Identity::Admin => ate_tls::SpiffeId::admin(&td)?,
                Identity::IngressClient => {
                    ate_tls::SpiffeId::new(&td, ate_tls::SYSTEM_NAMESPACE, INGRESS_CLIENT_SA)?
                }
            };
            let mut req = ate_tls::SvidRequest::new(id.clone()).lifetime(lifetime);
            for san in &sans {
                req = match san.parse::<std::net::IpAddr>() {
                    Ok(ip) => req.ip(ip),
                    Err(_) => req.dns(san.clone()),
                };
            }
            let svid = ca.issue(&req)?;
            std::fs::create_dir_all(&out)
                .with_context(|| format!("cannot create {}", out.display()))?;
            let files = ate_tls::PemFiles::in_dir(&out, id.service_account());
            svid.write_pem(&files.cert, &files.key)?;
            ate_tls::write_atomic(&files.ca, ca.cert_pem().as_bytes(), 0o644)?;
            println!("{id}: {} and {}", files.cert.display(), files.key.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
