//! Router settings. The flag names are the spec's (`--parked-request-*`, `--drain-delay`, …);
//! the `ate router` subcommand flattens [`RouterConfig`].

use std::net::SocketAddr;
use std::time::Duration;

/// Settings of atenet-router (Envoy dataplane behaviour plus the 5 s assignment cache).
#[derive(Debug, Clone, clap::Args)]
pub struct RouterConfig {
    /// What the router serves: `ingress` (the specification's install passes `--mode=ingress`;
    /// it is the only mode).
    #[arg(long = "mode", value_enum, default_value_t = RouterMode::Ingress)]
    pub mode: RouterMode,

    /// The namespace the router is installed in (the specification's `--namespace=ate-system`),
    /// named in its start-up log line. A DNS label.
    #[arg(long = "namespace", default_value = "ate-system", value_parser = parse_namespace)]
    pub namespace: String,

    /// Preview features to turn on, comma-separated; empty (the default, and the
    /// specification's `--preview=`) turns none on. This router has no preview features yet, so
    /// any name is refused.
    #[arg(long = "preview", default_value = "", value_parser = parse_preview)]
    pub preview: PreviewFeatures,

    /// Address of the ingress listener (HTTP/1.1 and h2c on one port).
    #[arg(long = "listen", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Address of the operations listener (`/healthz`, `/metrics`).
    #[arg(long = "metrics-listen", default_value = "127.0.0.1:9091")]
    pub metrics_listen: SocketAddr,

    /// Address of the api (ResumeActor), `host:port` or `http://host:port`; several replicas
    /// comma-separated, and the router fails over to another when one stops answering.
    #[arg(long = "api", default_value = ate_core::DEFAULT_API_ADDR)]
    pub api: String,

    /// How long one actor's resume attempt series may keep retrying (joiners share the clock).
    #[arg(long = "parked-request-budget", default_value = "5s", value_parser = parse_duration)]
    pub parked_request_budget: Duration,

    /// Most requests parked at one time; 0 turns parking off.
    #[arg(long = "parked-request-max", default_value_t = 1024)]
    pub parked_request_max: usize,

    /// How long an actor's assignment is reused without asking the api; 0 asks on every request.
    #[arg(long = "assignment-cache-ttl", default_value = "5s", value_parser = parse_duration)]
    pub assignment_cache_ttl: Duration,

    /// On shutdown: stop accepting, then wait at most this long for in-flight and parked requests,
    /// WebSockets and client CONNECT tunnels; whatever is still open then is closed.
    #[arg(long = "drain-delay", default_value = "13s", value_parser = parse_duration)]
    pub drain_delay: Duration,

    /// Also serve clients over TLS on this address (the router's certificate; HTTP/1.1 and h2).
    #[arg(long = "tls-listen")]
    pub tls_listen: Option<SocketAddr>,

    /// SPIFFE IDs (comma-separated) whose client certificates `--tls-listen` admits; checked in
    /// the handshake (a certificate not on the list, or none, is refused there). Unset: clients
    /// present no certificate.
    #[arg(long = "ingress-allowed-spiffe-ids")]
    pub ingress_allowed_spiffe_ids: Option<String>,

    /// Who may use the ingress: `none` (no client authentication), `mtls` (a client certificate
    /// on --ingress-allowed-spiffe-ids) or `jwt` (a bearer token, verified like the api's
    /// --auth-mode=jwt; with --ingress-allowed-spiffe-ids, certificates on the list need no
    /// token). Default: `mtls` when --ingress-allowed-spiffe-ids is set, else `none`. `mtls` and
    /// `jwt` need --tls-listen and hold on every listener: requests on the plain --listen get
    /// 401 in `mtls` mode and need a token in `jwt` mode.
    #[arg(long = "ingress-auth-mode", value_enum)]
    pub ingress_auth_mode: Option<crate::auth::IngressAuthMode>,

    /// Certificate (PEM, leaf first) the --tls-listen listener presents, e.g. a servicedns
    /// certificate for the router's Service name. Default: the router's own --tls-cert.
    #[arg(long = "ingress-tls-cert", requires = "ingress_tls_key")]
    pub ingress_tls_cert: Option<std::path::PathBuf>,

    /// Private key of --ingress-tls-cert.
    #[arg(long = "ingress-tls-key", requires = "ingress_tls_cert")]
    pub ingress_tls_key: Option<std::path::PathBuf>,

    /// CA bundle that ingress client certificates must chain to. Default: --tls-ca.
    #[arg(long = "ingress-client-ca")]
    pub ingress_client_ca: Option<std::path::PathBuf>,

    /// jwt mode: the required `iss` of bearer tokens.
    #[arg(long = "ingress-jwt-issuer", env = "ATE_INGRESS_JWT_ISSUER")]
    pub ingress_jwt_issuer: Option<String>,

    /// jwt mode: the audience bearer tokens must be for (`aud`).
    #[arg(long = "ingress-jwt-audience", env = "ATE_INGRESS_JWT_AUDIENCE")]
    pub ingress_jwt_audience: Option<String>,

    /// jwt mode: the issuer's public keys (JWKS JSON); re-read when the file changes.
    #[arg(long = "ingress-jwt-jwks-file", env = "ATE_INGRESS_JWT_JWKS_FILE")]
    pub ingress_jwt_jwks_file: Option<std::path::PathBuf>,

    /// Idle tunnels kept per actor for keep-alive reuse (default 256; at least the number of
    /// concurrent requests one actor gets, or the rest open a new tunnel each); 0 disables the
    /// pool (also the one shared gRPC tunnel per actor port). Idle tunnels close after 1 s.
    #[arg(long = "tunnel-idle-per-actor")]
    pub tunnel_idle_per_actor: Option<usize>,

    /// Directory of the handoff sockets of the workers on this machine (`ate up` passes
    /// `<state>/run/atunnel`). A plain HTTP/1.1 tunnel to a worker that has one there is handed
    /// over by atunnel as the actor's own socket, so requests cross one proxy instead of two
    /// (docs/tunnel-protocol.md, "Handoff"); every other tunnel, and every worker without a
    /// socket there, uses the mTLS CONNECT path. Unset: CONNECT only.
    #[arg(long = "local-tunnels", value_name = "DIR")]
    pub local_tunnels: Option<std::path::PathBuf>,

    /// Unix socket on which the workers of this machine send their actors' calls to other actors
    /// (`ate up` passes `<state>/run/router/internal.sock`). Made mode 0600 in a directory created
    /// 0700; only processes of root or the router's own user may connect (checked with
    /// SO_PEERCRED). Requests on it skip the ingress authentication and must name their caller in
    /// `ate-caller-actor`. Unset: no such socket.
    #[arg(long = "internal-socket", value_name = "PATH")]
    pub internal_socket: Option<std::path::PathBuf>,

    /// Like --internal-socket, over TCP for workers on other machines: TLS with the router's own
    /// certificate (--tls-cert/--tls-key/--tls-ca, required), a client certificate required, and
    /// only a worker's SPIFFE ID (`…/sa/ate-worker[-<id>]`) admitted; any other peer is closed.
    #[arg(long = "internal-listen", value_name = "ADDR")]
    pub internal_listen: Option<SocketAddr>,

    /// Most client WebSockets the router terminates at once for actors whose template says
    /// `webSockets: hibernate` (awake or hibernated); one more is refused with 503
    /// (docs/websockets.md).
    #[arg(long = "hibernate-websockets-max", default_value_t = 100_000)]
    pub hibernate_websockets_max: usize,

    /// Most such WebSockets to one actor; one more is refused with 503.
    #[arg(long = "hibernate-websockets-per-actor", default_value_t = 1024)]
    pub hibernate_websockets_per_actor: usize,

    /// Write a JSON access log, one line per request: `stdout`, `stderr` or a file (appended
    /// to). Off by default. Lines are written by a thread of their own; when it falls behind,
    /// lines are dropped and counted, never waited for.
    #[arg(long = "access-log", value_name = "stdout|stderr|FILE")]
    pub access_log: Option<String>,

    /// The router's identity (`--tls-cert/--tls-key/--tls-ca`, `--trust-domain`): mTLS to the
    /// api and to every atunnel. Absent: plaintext.
    #[command(flatten)]
    pub tls: ate_tls::TlsArgs,

    /// Internal tuning that has no flag in the spec; tests shorten these.
    #[arg(skip = Tuning::default())]
    pub tuning: Tuning,
}

/// The router's mode (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouterMode {
    /// Routes requests to actors, resuming them (the only mode).
    Ingress,
}

/// The preview features `--preview` names (none exist yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreviewFeatures(pub Vec<String>);

/// The names of preview features this router has.
const PREVIEW_FEATURES: &[&str] = &[];

fn parse_preview(s: &str) -> Result<PreviewFeatures, String> {
    let mut names = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !PREVIEW_FEATURES.contains(&name) {
            return Err(if PREVIEW_FEATURES.is_empty() {
                format!("unknown preview feature `{name}`: this router has none")
            } else {
                format!(
                    "unknown preview feature `{name}` (known: {})",
                    PREVIEW_FEATURES.join(", ")
                )
            });
        }
        names.push(name.to_string());
    }
    Ok(PreviewFeatures(names))
}

/// A DNS label (RFC 1123): what Kubernetes accepts as a namespace name.
fn parse_namespace(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a namespace name (lowercase letters, digits and '-', at most 63, not starting or ending with '-')"
        ))
    }
}

/// Values the spec fixes (or leaves to the implementation) that tests need to scale down.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// The routing decision gives up this long after the budget with 504 (spec: budget + 5 s).
    pub decision_grace: Duration,
    /// With parking off, Aborted is still retried for this long (DESIGN §3: 15 s).
    pub unparked_abort_window: Duration,
    /// First retry delay (spec: 100 ms).
    pub retry_initial: Duration,
    /// Most distinct actors whose assignment is cached.
    pub cache_capacity: usize,
    /// Slowloris guard: time allowed for a client to send a request's headers.
    pub header_read_timeout: Duration,
    /// Largest request head accepted (HTTP/1.1 read buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
    /// Longest request target accepted; longer gets 414.
    pub max_uri_len: usize,
    /// Idle HTTP/1.1-over-CONNECT connections kept per actor; 0 disables the pool
    /// (`--tunnel-idle-per-actor` overrides it).
    pub tunnel_idle_per_actor: usize,
    /// Idle pooled tunnel connections older than this are dropped (HTTP/1.1 tunnels, and gRPC
    /// tunnels without an open stream).
    pub tunnel_idle_timeout: Duration,
    /// Time allowed to open the TCP + HTTP/2 connection to a worker's atunnel.
    pub worker_connect_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            decision_grace: Duration::from_secs(5),
            unparked_abort_window: Duration::from_secs(15),
            retry_initial: Duration::from_millis(100),
            cache_capacity: 65_536,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            max_uri_len: 8 * 1024,
            // At least the concurrency one actor sees: a request that finds no idle tunnel opens
            // a new CONNECT stream, and atunnel dials the actor again (a new TCP connection, and
            // a new thread in a thread-per-connection workload). With 8, 32 keep-alive clients
            // of one actor dialed per request and filled the actor namespace with TIME-WAIT
            // sockets (connect() then spent most of the worker's CPU looking for a free port).
            // Idle ones are reaped after `tunnel_idle_timeout` anyway.
            tunnel_idle_per_actor: 256,
            // Short: an open tunnel counts as activity for the worker's idle auto-suspend, so a
            // pooled idle tunnel held for 60 s (the old default) kept every actor with a shorter
            // `idleTimeout` running for a minute after its last request. Under steady load a
            // tunnel is reused long before this; reaping runs every half of it.
            tunnel_idle_timeout: Duration::from_secs(1),
            worker_connect_timeout: Duration::from_secs(3),
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            mode: RouterMode::Ingress,
            namespace: "ate-system".to_string(),
            preview: PreviewFeatures::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9091)),
            api: ate_core::DEFAULT_API_ADDR.to_string(),
            parked_request_budget: Duration::from_secs(5),
            parked_request_max: 1024,
            assignment_cache_ttl: Duration::from_secs(5),
            drain_delay: Duration::from_secs(13),
            tls_listen: None,
            ingress_allowed_spiffe_ids: None,
            ingress_auth_mode: None,
            ingress_tls_cert: None,
            ingress_tls_key: None,
            ingress_client_ca: None,
            ingress_jwt_issuer: None,
            ingress_jwt_audience: None,
            ingress_jwt_jwks_file: None,
            tunnel_idle_per_actor: None,
            local_tunnels: None,
            internal_socket: None,
            internal_listen: None,
            hibernate_websockets_max: 100_000,
            hibernate_websockets_per_actor: 1024,
            access_log: None,
            tls: ate_tls::TlsArgs::default(),
            tuning: Tuning::default(),
        }
    }
}

/// The duration flags' parser (in ate-core so every component's flags share it).
pub use ate_core::duration::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        router: RouterConfig,
    }

    /// The specification's install command line parses, with its meaning; unknown modes,
    /// preview features and namespace names are refused by name.
    #[test]
    fn the_specifications_command_line_is_accepted() {
        let cli = Cli::try_parse_from([
            "ate",
            "--mode=ingress",
            "--namespace=ate-system",
            "--drain-delay=13s",
            "--ingress-allowed-spiffe-ids=spiffe://cluster.local/ns/ate-system/sa/atenet-client",
            "--preview=",
        ])
        .unwrap();
        assert_eq!(cli.router.mode, RouterMode::Ingress);
        assert_eq!(cli.router.namespace, "ate-system");
        assert!(cli.router.preview.0.is_empty());
        assert_eq!(cli.router.drain_delay, Duration::from_secs(13));
        let refused = |args: &[&str], needle: &str| {
            let mut all = vec!["ate"];
            all.extend_from_slice(args);
            let err = Cli::try_parse_from(all).err().expect("refused").to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        };
        refused(&["--mode=egress"], "egress");
        refused(
            &["--preview=websockets"],
            "unknown preview feature `websockets`",
        );
        refused(&["--namespace=Ate_System"], "not a namespace name");
        refused(&["--namespace=-x"], "not a namespace name");
    }

    #[test]
    fn defaults_match_spec() {
        let cli = Cli::try_parse_from(["ate"]).unwrap();
        let d = RouterConfig::default();
        assert_eq!(cli.router.parked_request_budget, Duration::from_secs(5));
        assert_eq!(cli.router.parked_request_max, 1024);
        assert_eq!(cli.router.assignment_cache_ttl, Duration::from_secs(5));
        assert_eq!(cli.router.drain_delay, Duration::from_secs(13));
        assert_eq!(cli.router.listen, d.listen);
        assert_eq!(cli.router.metrics_listen, d.metrics_listen);
        assert_eq!(cli.router.api, d.api);
    }

    #[test]
    fn flag_names() {
        let cli = Cli::try_parse_from([
            "ate",
            "--listen=127.0.0.1:1",
            "--metrics-listen=127.0.0.1:2",
            "--api=http://127.0.0.1:3",
            "--parked-request-budget=500ms",
            "--parked-request-max=0",
            "--assignment-cache-ttl=0",
            "--drain-delay=1s",
            "--tunnel-idle-per-actor=8",
            "--access-log=stderr",
            "--internal-socket=/run/r/internal.sock",
            "--internal-listen=127.0.0.1:8444",
        ])
        .unwrap();
        let r = cli.router;
        assert_eq!(r.listen.port(), 1);
        assert_eq!(r.metrics_listen.port(), 2);
        assert_eq!(r.api, "http://127.0.0.1:3");
        assert_eq!(r.parked_request_budget, Duration::from_millis(500));
        assert_eq!(r.parked_request_max, 0);
        assert_eq!(r.assignment_cache_ttl, Duration::ZERO);
        assert_eq!(r.drain_delay, Duration::from_secs(1));
        assert_eq!(r.tunnel_idle_per_actor, Some(8));
        assert_eq!(r.access_log.as_deref(), Some("stderr"));
        assert_eq!(
            r.internal_socket.as_deref(),
            Some(std::path::Path::new("/run/r/internal.sock"))
        );
        assert_eq!(r.internal_listen.map(|a| a.port()), Some(8444));
        assert_eq!(
            Cli::try_parse_from(["ate"]).unwrap().router.access_log,
            None
        );
    }
}
