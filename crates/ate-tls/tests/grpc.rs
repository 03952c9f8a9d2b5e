//! tonic served over `TlsIncoming`: handlers see the caller's SPIFFE ID; callers outside the
//! allow-list never reach a handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ate_proto::v1::identity_service_client::IdentityServiceClient;
use ate_proto::v1::identity_service_server::{IdentityService, IdentityServiceServer};
use ate_proto::v1::{ActorToken, IssueActorTokenRequest};
use ate_tls::{
    AllowList, Alpn, CertSource, ClientAuth, LocalCa, ServerCheck, SpiffeId, SvidRequest,
    TlsIncoming, client_config, endpoint, request_identity, server_config, set_server_alpn,
    tls_channel, tls_channel_lazy,
};
use tonic::{Request, Response, Status};

const TD: &str = ate_tls::DEFAULT_TRUST_DOMAIN;

/// Answers IssueActorToken with the caller's identity as the token (the one RPC of a small
/// service: what is served does not matter, only who the handler sees).
#[derive(Default, Clone)]
struct WhoAmI {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl IdentityService for WhoAmI {
    async fn issue_actor_token(
        &self,
        request: Request<IssueActorTokenRequest>,
    ) -> Result<Response<ActorToken>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let id = request_identity(&request)
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        Ok(Response::new(ActorToken {
            token: id.to_string(),
            ..Default::default()
        }))
    }
}

fn source(ca: &LocalCa, id: SpiffeId) -> CertSource {
    let svid = ca.issue(&SvidRequest::new(id)).unwrap();
    CertSource::fixed(&svid, ca.roots().unwrap()).unwrap()
}

#[tokio::test]
async fn handler_sees_caller_identity_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = LocalCa::open_or_create(dir.path(), TD).unwrap();
    let api = SpiffeId::api(TD).unwrap();
    let router = SpiffeId::router(TD).unwrap();

    let mut cfg = server_config(
        &source(&ca, api.clone()),
        ClientAuth::Required {
            allowed: AllowList::only([router.clone(), SpiffeId::admin(TD).unwrap()]),
        },
    )
    .unwrap();
    set_server_alpn(&mut cfg, &[Alpn::H2]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let incoming = TlsIncoming::new(listener, Arc::new(cfg)).unwrap();
    let addr = incoming.local_addr();
    let svc = WhoAmI::default();
    let calls = svc.calls.clone();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServiceServer::new(svc))
            .serve_with_incoming(incoming),
    );

    let get = || Request::new(IssueActorTokenRequest::default());

    // The router gets in and the handler sees its SPIFFE ID.
    let router_cfg = Arc::new(
        client_config(&source(&ca, router.clone()), ServerCheck::Pin(api.clone())).unwrap(),
    );
    let channel = tls_channel(endpoint(&addr.to_string()).unwrap(), router_cfg.clone())
        .await
        .unwrap();
    let reply = IdentityServiceClient::new(channel)
        .issue_actor_token(get())
        .await
        .unwrap();
    assert_eq!(reply.into_inner().token, router.to_string());

    // A lazy channel with an https:// address works the same.
    let lazy = tls_channel_lazy(endpoint(&format!("https://{addr}")).unwrap(), router_cfg);
    let reply = IdentityServiceClient::new(lazy)
        .issue_actor_token(get())
        .await
        .unwrap();
    assert_eq!(reply.into_inner().token, router.to_string());
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A worker identity is refused at the handshake: the call fails and no handler runs.
    let worker_cfg = Arc::new(
        client_config(
            &source(&ca, SpiffeId::worker(TD).unwrap()),
            ServerCheck::Pin(api.clone()),
        )
        .unwrap(),
    );
    let refused = match tls_channel(endpoint(&addr.to_string()).unwrap(), worker_cfg).await {
        Err(_) => true,
        Ok(channel) => IdentityServiceClient::new(channel)
            .issue_actor_token(get())
            .await
            .is_err(),
    };
    assert!(refused);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // The server keeps serving after refusing someone.
    let admin_cfg = Arc::new(
        client_config(
            &source(&ca, SpiffeId::admin(TD).unwrap()),
            ServerCheck::Pin(api),
        )
        .unwrap(),
    );
    let channel = tls_channel(endpoint(&addr.to_string()).unwrap(), admin_cfg)
        .await
        .unwrap();
    let reply = IdentityServiceClient::new(channel)
        .issue_actor_token(get())
        .await
        .unwrap();
    assert!(reply.into_inner().token.ends_with("/sa/ate-admin"));
    server.abort();
}
