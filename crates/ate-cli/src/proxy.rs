//! `ate proxy ATESPACE/NAME --listen 127.0.0.1:PORT`: a local port that forwards every request to
//! the router with the `ate-target-actor` header added (the spec's `kubectl ate proxy`), so tools
//! that cannot set headers can talk to an actor. WebSocket and other upgrades are relayed.

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
        let upgrade = req.headers().contains_key(http::header::UPGRADE);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        parts.uri = uri;
        parts
            .headers
            .insert(TARGET_ACTOR_HEADER, self.actor.clone());
        let outbound = Request::from_parts(parts, body.boxed());
        let mut resp = match self.client.request(outbound).await {
            Ok(r) => r,
            Err(e) => {
                return Ok(text(
                    StatusCode::BAD_GATEWAY,
                    format!("cannot reach the router at {}: {e}\n", self.router),
                ));
            }
        };
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
        Ok(resp.map(BodyExt::boxed))
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
    let shutdown = crate::serve::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = &mut shutdown => return Ok(()),
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| proxy.clone().forward(req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "proxy connection ended");
            }
        });
    }
}
