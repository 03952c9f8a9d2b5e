//! `ate proxy ATESPACE/NAME --listen 127.0.0.1:PORT`: a local port that forwards every request to
//! the router with the `ate-target-actor` header added (the spec's `kubectl ate proxy`), so tools
//! that cannot set headers can talk to an actor. Clients speak HTTP/1.1 or h2c (prior knowledge;
//! an `Upgrade: h2c` is answered over HTTP/1.1); WebSocket and other upgrades are relayed.
//! Every request it cannot forward, and every error answer, is logged on stderr.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use ate_core::{ActorRef, TARGET_ACTOR_HEADER};
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Body = BoxBody<Bytes, hyper::Error>;

#[derive(clap::Args, Debug)]
pub struct ProxyArgs {
    /// The actor, ATESPACE/NAME.
    pub actor: String,
    /// Local address to listen on.
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,
    /// Router URL.
    #[arg(long, env = "ATE_ROUTER", default_value = "http://127.0.0.1:8080")]
    pub router: String,
}

struct Proxy {
    actor: HeaderValue,
    router: Uri,
    client: Client<HttpConnector, Body>,
}

fn text(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(msg))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

impl Proxy {
    async fn forward(
        self: Arc<Self>,
        mut req: Request<Incoming>,
    ) -> Result<Response<Body>, hyper::Error> {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let uri = match format!("{}{}", self.router.to_string().trim_end_matches('/'), path)
            .parse::<Uri>()
        {
            Ok(u) => u,
            Err(e) => {
                return Ok(text(
                    StatusCode::BAD_REQUEST,
                    format!("bad request path: {e}\n"),
                ));
            }
        };
        let method = req.method().clone();
        let shown = path.to_string();
        // `Upgrade: h2c` (curl --http2) is a request to switch this connection to HTTP/2: not
        // something to relay. The request is answered over HTTP/1.1, as RFC 9113 allows.
        let h2c_upgrade = req
            .headers()
            .get(http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("h2c"));
        if h2c_upgrade {
            let headers = req.headers_mut();
            headers.remove(http::header::UPGRADE);
            headers.remove("http2-settings");
            strip_connection_tokens(headers, &["upgrade", "http2-settings"]);
        }
        let upgrade = req.headers().contains_key(http::header::UPGRADE);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        parts.uri = uri;
        // The router is reached over HTTP/1.1 whatever the client spoke.
        parts.version = http::Version::HTTP_11;
        parts
            .headers
            .insert(TARGET_ACTOR_HEADER, self.actor.clone());
        let outbound = Request::from_parts(parts, body.boxed());
        let mut resp = match self.client.request(outbound).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!(
                    "ate proxy: {method} {shown}: cannot reach the router at {}: {e}",
                    self.router
                );
                return Ok(text(
                    StatusCode::BAD_GATEWAY,
                    format!("cannot reach the router at {}: {e}\n", self.router),
                ));
            }
        };
        if resp.status().is_client_error() || resp.status().is_server_error() {
            eprintln!(
                "ate proxy: {method} {shown} → {} from the router",
                resp.status()
            );
        }
        if upgrade && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            eprintln!(
                "ate proxy: {method} {shown}: the upgrade was refused ({})",
                resp.status()
            );
        }
        if let (Some(client_upgrade), StatusCode::SWITCHING_PROTOCOLS) =
            (client_upgrade, resp.status())
        {
            let router_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (client_upgrade.await, router_upgrade.await) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b))
                            .await;
                }
            });
        }
        // Connection-specific headers of the router's HTTP/1.1 answer mean nothing (and are
        // not allowed) on an HTTP/2 client connection.
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            let headers = resp.headers_mut();
            for h in [
                "connection",
                "keep-alive",
                "proxy-connection",
                "transfer-encoding",
                "upgrade",
            ] {
                headers.remove(h);
            }
        }
        Ok(resp.map(BodyExt::boxed))
    }
}

/// Removes `tokens` from the `Connection` header (dropping the header when nothing is left).
fn strip_connection_tokens(headers: &mut http::HeaderMap, tokens: &[&str]) {
    let Some(value) = headers
        .get(http::header::CONNECTION)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    let kept: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty() && !tokens.iter().any(|x| t.eq_ignore_ascii_case(x)))
        .collect();
    if kept.is_empty() {
        headers.remove(http::header::CONNECTION);
    } else if let Ok(v) = HeaderValue::from_str(&kept.join(", ")) {
        headers.insert(http::header::CONNECTION, v);
    }
}

pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let actor = ActorRef::parse(&args.actor)?;
    let router: Uri = args
        .router
        .parse()
        .with_context(|| format!("invalid --router {:?}", args.router))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let proxy = Arc::new(Proxy {
        actor: HeaderValue::from_str(&actor.to_string())?,
        router,
        client: Client::builder(TokioExecutor::new()).build_http(),
    });
    eprintln!(
        "ate proxy: http://{} → {} (actor {actor}); Ctrl-C to stop",
        listener.local_addr()?,
        args.router
    );
    let shutdown = ate_tls::process::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = &mut shutdown => return Ok(()),
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| proxy.clone().forward(req));
            // HTTP/1.1 or h2c with prior knowledge, told apart by the connection preface.
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            if let Err(e) = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
            {
                eprintln!("ate proxy: a client connection failed: {e}");
            }
        });
    }
}
