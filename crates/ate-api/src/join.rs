//! JoinService: machines join the fleet with a token and get their node and worker certificates
//! from the api's CA; node agents renew them; admins manage the tokens.
//!
//! Architecture invariant: a certificate signed here names exactly the identity the token or the
//! caller's own certificate entitles to — a node agent `…/sa/ate-node-<node>` and workers whose
//! ids start with `<node>-` (`…/sa/ate-worker-<node>-…`). What a CSR asks for is ignored; only
//! its public key is used.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use ate_proto::v1::join_service_server::JoinService;
use ate_proto::v1::*;
use ate_store::{JoinTokenRecord, Store, StoreError};
use ate_tls::{JoinToken, LocalCa, SpiffeId, SvidRequest};
use tonic::{Request, Response, Status};

use crate::authz::{Authz, Need};
use ate_core::clock::now_ms;

/// Lifetime of a join token when the request names none.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// Longest lifetime of a join token.
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default lifetime of the certificates signed for nodes and workers (renewed at 2/3).
pub const DEFAULT_CERT_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Most workers one node may ask certificates for in one call.
const MAX_WORKERS_PER_NODE: usize = 256;
/// Name of the node agent's entry in a certificate request list.
pub const NODE_CERT_NAME: &str = "node";

/// The api's signing authority for joins (`ate api --ca-dir`).
#[derive(Debug)]
pub struct Signer {
    pub ca: LocalCa,
    /// Lifetime of every certificate signed here.
    pub lifetime: Duration,
}

/// The JoinService of one api replica.
#[derive(Clone)]
pub struct Join {
    pub store: Arc<dyn Store>,
    pub authz: Arc<Authz>,
    /// None: this api cannot sign (no `--ca-dir`), joins are refused with a message saying so.
    pub signer: Option<Arc<Signer>>,
    /// The PEM bundle peers trust (`--tls-ca`); empty in plaintext mode.
    pub trust_bundle: String,
    pub trust_domain: String,
}

impl Join {
    fn signer(&self) -> Result<&Signer, Status> {
        self.signer.as_deref().ok_or_else(|| {
            Status::failed_precondition(
                "this api cannot sign certificates: start it with --ca-dir (the CA's ca.crt and ca.key)",
            )
        })
    }

    /// Checks the token against the store: Ok(record) if it is known, its secret matches and it
    /// has not expired.
    async fn check_token(&self, text: &str) -> Result<JoinTokenRecord, Status> {
        let token: JoinToken = text
            .parse()
            .map_err(|e: ate_tls::TlsError| Status::invalid_argument(e.to_string()))?;
        let signer = self.signer()?;
        let our_pin = ate_tls::join::fingerprint(signer.ca.cert_der());
        if token.ca_pin != our_pin {
            return Err(Status::failed_precondition(format!(
                "join token {} was made for another CA (sha256 {}); this api's CA is {our_pin}",
                token.id, token.ca_pin
            )));
        }
        let unknown = || {
            tracing::info!(target: "audit", token = %token.id, "denied: join token not recognised");
            Status::unauthenticated(format!(
                "join token {} is not recognised (unknown, deleted, or a wrong secret): create one with `ate token create`",
                token.id
            ))
        };
        let record = match self.store.get_join_token(&token.id).await {
            Ok(r) => r,
            Err(StoreError::NotFound(_)) => return Err(unknown()),
            Err(e) => return Err(crate::convert::store_status(e)),
        };
        if record.secret_sha256 != token.secret_hash() {
            return Err(unknown());
        }
        if record.expires_ms <= now_ms() {
            tracing::info!(target: "audit", token = %token.id, "denied: join token expired");
            return Err(Status::unauthenticated(format!(
                "join token {} expired {} s ago: create a new one with `ate token create`",
                token.id,
                (now_ms() - record.expires_ms) / 1000
            )));
        }
        Ok(record)
    }

    /// Signs every CSR of `csrs` for `node` after checking the list: one `node` entry, workers
    /// named `<node>-…`, no duplicates.
    fn sign_all(
        &self,
        node: &str,
        csrs: Vec<CertificateRequest>,
    ) -> Result<NodeCertificates, Status> {
        ate_core::validate_label("node", node).map_err(crate::convert::invalid)?;
        let signer = self.signer()?;
        if !csrs.iter().any(|c| c.name == NODE_CERT_NAME) {
            return Err(Status::invalid_argument(
                "csrs: one request must be named \"node\" (the node agent's)",
            ));
        }
        if csrs.len() > MAX_WORKERS_PER_NODE + 1 {
            return Err(Status::invalid_argument(format!(
                "csrs: at most {MAX_WORKERS_PER_NODE} workers per node"
            )));
        }
        let mut seen = BTreeSet::new();
        let mut certificates = Vec::with_capacity(csrs.len());
        for c in csrs {
            if !seen.insert(c.name.clone()) {
                return Err(Status::invalid_argument(format!(
                    "csrs: {:?} is named twice",
                    c.name
                )));
            }
            let id = if c.name == NODE_CERT_NAME {
                SpiffeId::node_instance(&self.trust_domain, node)
            } else {
                if !c.name.starts_with(&format!("{node}-")) {
                    return Err(Status::invalid_argument(format!(
                        "csrs: worker id {:?} must start with \"{node}-\" (a node gets certificates only for its own workers)",
                        c.name
                    )));
                }
                ate_core::validate_label("worker id", &c.name).map_err(crate::convert::invalid)?;
                SpiffeId::worker_instance(&self.trust_domain, &c.name)
            }
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let req = SvidRequest::new(id).lifetime(signer.lifetime);
            let signed = signer
                .ca
                .sign_csr(&req, &c.csr_pem)
                .map_err(|e| Status::invalid_argument(format!("csrs: {:?}: {e}", c.name)))?;
            let not_after = signed
                .not_after
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            certificates.push(IssuedCertificate {
                name: c.name,
                cert_pem: signed.cert_pem,
                not_after,
            });
        }
        Ok(NodeCertificates {
            ca_pem: self.trust_bundle.clone(),
            trust_domain: self.trust_domain.clone(),
            certificates,
        })
    }
}

fn token_info(r: &JoinTokenRecord) -> JoinTokenInfo {
    JoinTokenInfo {
        id: r.id.clone(),
        description: r.description.clone(),
        created_at_ms: r.created_ms,
        expires_at_ms: r.expires_ms,
        used_by: r.used_by.clone(),
    }
}

#[tonic::async_trait]
impl JoinService for Join {
    async fn get_trust_bundle(
        &self,
        _req: Request<GetTrustBundleRequest>,
    ) -> Result<Response<TrustBundle>, Status> {
        if self.trust_bundle.is_empty() {
            return Err(Status::failed_precondition(
                "this api runs without TLS: there is no CA to join",
            ));
        }
        Ok(Response::new(TrustBundle {
            ca_pem: self.trust_bundle.clone(),
            trust_domain: self.trust_domain.clone(),
        }))
    }

    async fn join_node(
        &self,
        req: Request<JoinNodeRequest>,
    ) -> Result<Response<NodeCertificates>, Status> {
        let remote = ate_tls::request_peer(&req).map(|p| p.remote_addr);
        let req = req.into_inner();
        let token = self.check_token(&req.token).await?;
        let workers = req.csrs.len().saturating_sub(1);
        let certs = self.sign_all(&req.node, req.csrs)?;
        if let Err(e) = self.store.record_join_token_use(&token.id, &req.node).await {
            // The certificates are signed already; the usage list is only for operators.
            tracing::warn!(token = %token.id, error = %e, "cannot record the join token's use");
        }
        tracing::info!(target: "audit", token = %token.id, node = %req.node, workers, remote = ?remote, "node joined");
        Ok(Response::new(certs))
    }

    async fn renew_node_certificates(
        &self,
        req: Request<RenewNodeCertificatesRequest>,
    ) -> Result<Response<NodeCertificates>, Status> {
        let rpc = "JoinService/RenewNodeCertificates";
        let caller = self.authz.caller(&req)?;
        caller.check(rpc, Need::Fleet)?;
        let node = req.get_ref().node.clone();
        // A node renews only its own certificates; the shared node identity names no node.
        if let Some(bound) = caller.node_agent()
            && bound != Some(node.as_str())
        {
            return Err(caller.deny(
                rpc,
                &format!("node {node}"),
                &format!("the caller's identity is bound to node {bound:?}"),
            ));
        }
        let certs = self.sign_all(&node, req.into_inner().csrs)?;
        tracing::info!(target: "audit", node = %node, identity = %caller.identity, certificates = certs.certificates.len(), "node certificates renewed");
        Ok(Response::new(certs))
    }

    async fn create_join_token(
        &self,
        req: Request<CreateJoinTokenRequest>,
    ) -> Result<Response<CreatedJoinToken>, Status> {
        let caller = self.authz.caller(&req)?;
        caller.check("JoinService/CreateJoinToken", Need::Admin)?;
        let req = req.into_inner();
        let signer = self.signer()?;
        let ttl = match req.ttl_seconds {
            0 => DEFAULT_TOKEN_TTL,
            s => Duration::from_secs(u64::from(s)),
        };
        if ttl > MAX_TOKEN_TTL {
            return Err(Status::invalid_argument(format!(
                "ttl_seconds: at most {} (30 days)",
                MAX_TOKEN_TTL.as_secs()
            )));
        }
        if req.description.len() > 256 {
            return Err(Status::invalid_argument("description: at most 256 bytes"));
        }
        let pin = ate_tls::join::fingerprint(signer.ca.cert_der());
        let token = JoinToken::generate(&pin).map_err(|e| Status::internal(e.to_string()))?;
        let now = now_ms();
        let record = JoinTokenRecord {
            id: token.id.clone(),
            secret_sha256: token.secret_hash(),
            description: req.description,
            created_ms: now,
            expires_ms: now.saturating_add(ttl.as_millis() as i64),
            used_by: Vec::new(),
        };
        self.store
            .create_join_token(&record)
            .await
            .map_err(crate::convert::store_status)?;
        tracing::info!(target: "audit", token = %token.id, identity = %caller.identity, ttl_s = ttl.as_secs(), "join token created");
        Ok(Response::new(CreatedJoinToken {
            token: token.to_string(),
            info: Some(token_info(&record)),
        }))
    }

    async fn list_join_tokens(
        &self,
        req: Request<ListJoinTokensRequest>,
    ) -> Result<Response<ListJoinTokensResponse>, Status> {
        let caller = self.authz.caller(&req)?;
        caller.check("JoinService/ListJoinTokens", Need::Admin)?;
        let tokens = self
            .store
            .list_join_tokens()
            .await
            .map_err(crate::convert::store_status)?;
        Ok(Response::new(ListJoinTokensResponse {
            tokens: tokens.iter().map(token_info).collect(),
        }))
    }

    async fn delete_join_token(
        &self,
        req: Request<DeleteJoinTokenRequest>,
    ) -> Result<Response<DeleteJoinTokenResponse>, Status> {
        let caller = self.authz.caller(&req)?;
        caller.check("JoinService/DeleteJoinToken", Need::Admin)?;
        let id = req.into_inner().id;
        let deleted = self
            .store
            .delete_join_token(&id)
            .await
            .map_err(crate::convert::store_status)?;
        if !deleted {
            return Err(Status::not_found(format!("join token {id:?} not found")));
        }
        tracing::info!(target: "audit", token = %id, identity = %caller.identity, "join token deleted");
        Ok(Response::new(DeleteJoinTokenResponse { deleted }))
    }
}
