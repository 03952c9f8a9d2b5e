//! IdentityService: short-lived identity tokens for actors. The worker an actor runs on asks
//! (the local actor API's `GET /v1/identity?audience=…`); the api checks that the actor runs
//! there at the activation named and signs with `--identity-key` ([`ate_jwt::issuer`]).

use std::time::Duration;

use ate_jwt::issuer::{ActorTokenRequest, DEFAULT_TOKEN_TTL, IssuerError};
use ate_proto::v1::identity_service_server::IdentityService;
use ate_proto::v1::{ActorToken, IssueActorTokenRequest};
use tonic::{Request, Response, Status};

use super::{Services, actor_ref, ref_atespace};
use crate::authz::Need;
use crate::convert::store_status;

#[tonic::async_trait]
impl IdentityService for Services {
    async fn issue_actor_token(
        &self,
        req: Request<IssueActorTokenRequest>,
    ) -> Result<Response<ActorToken>, Status> {
        const RPC: &str = "IdentityService/IssueActorToken";
        let caller = self.authorize(&req, RPC, |r| Need::ActorToken(ref_atespace(&r.actor)))?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        let Some(issuer) = self.api.identity_issuer() else {
            return Err(Status::failed_precondition(
                "this api signs no identity tokens: start it with --identity-key",
            ));
        };
        let ttl = match req.ttl_seconds {
            0 => DEFAULT_TOKEN_TTL,
            s => Duration::from_secs(u64::from(s)),
        };
        self.check_worker_actor(&caller, RPC, &r, req.activation)
            .await?;
        // Admin names no activation: the token carries the actor's current one.
        let activation = match req.activation {
            0 => {
                self.api
                    .store
                    .get_actor(&r)
                    .await
                    .map_err(store_status)?
                    .activation
            }
            a => a,
        };
        let signed = issuer
            .sign(
                &ActorTokenRequest {
                    atespace: &r.atespace,
                    name: &r.name,
                    activation,
                    audience: &req.audience,
                    ttl,
                },
                u64::try_from(ate_core::clock::now_ms() / 1000).unwrap_or(0),
            )
            .map_err(|e| match e {
                IssuerError::Audience(_) | IssuerError::Ttl(_) => {
                    Status::invalid_argument(e.to_string())
                }
                other => Status::internal(other.to_string()),
            })?;
        tracing::info!(target: "audit", identity = %caller.identity, actor = %r, audience = %req.audience, expires_unix = signed.expires_unix, "identity token issued");
        Ok(Response::new(ActorToken {
            token: signed.token,
            expires_unix: i64::try_from(signed.expires_unix).unwrap_or(i64::MAX),
            issuer: issuer.issuer().to_string(),
            key_id: issuer.kid().to_string(),
        }))
    }
}
