//! Authorization: the caller's identity maps to a role.
//!
//! | identity                          | role             | may call                                     |
//! |-----------------------------------|------------------|----------------------------------------------|
//! | `…/sa/atenet-router`              | `ingress_router` | ResumeActor, GetAtespace (callers allow lists) |
//! | `…/sa/ate-node-<node>`            | `node_agent`     | FleetService for its node's workers, SuspendActor of actors on its node's workers (idle suspend) |
//! | `…/sa/ate-node` (shared)          | `node_agent`     | FleetService; no SuspendActor (it names no node) |
//! | `…/sa/ate-worker-<id>`            | `worker`         | SetAlarm, GetAlarm, DeleteAlarm, IssueActorToken of the actor running on worker `<id>` (the local actor API) |
//! | `…/sa/ate-worker` (shared)        | `worker`         | the same for an actor running on any worker, at the activation it names |
//! | `…/sa/ate-admin`                  | `admin`          | everything                                   |
//! | any other ID in the trust domain  | `client`         | actor and atespace verbs in its atespaces (ExecActor included) |
//!
//! A client's atespaces come from `--client-atespaces`; a client not listed there has none.
//! Plaintext mode (no TLS configured) has no identities: every caller is `admin`, as before TLS.
//!
//! **Bearer tokens** (`--auth-mode=jwt`, see [`crate::jwt`]): the api then asks for a client
//! certificate without requiring one. A connection that presented a verified certificate is the
//! mesh identity above, in both modes, and any `authorization` header on it is ignored (the
//! mesh keeps working unchanged and a token can never widen a certificate's role). A
//! connection without a certificate must send `authorization: Bearer <jwt>`; the token's
//! `ate_role` (default `client`), `ate_atespaces` and `ate_node` claims give the role, and the
//! caller is named `jwt:<sub>` in denials and audit logs. In `mtls` mode (the default) a
//! connection without a certificate never gets past the handshake. Every refusal of a token is
//! Unauthenticated naming the problem (expired, wrong audience, bad signature, unsigned, …) and
//! is logged with target `audit`.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use ate_tls::SpiffeId;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::jwt::{JwtVerifier, TokenClaims, TokenRole};

/// Atespaces a client may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Atespaces {
    All,
    Only(BTreeSet<String>),
}

impl Atespaces {
    pub fn allows(&self, atespace: &str) -> bool {
        match self {
            Atespaces::All => true,
            Atespaces::Only(set) => set.contains(atespace),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("invalid --client-atespaces entry {entry:?}: {reason}")]
    Invalid { entry: String, reason: String },
}

/// Role policy of an api serving TLS.
#[derive(Debug, Clone)]
pub struct Authz {
    trust_domain: String,
    clients: HashMap<SpiffeId, Atespaces>,
    /// Bearer tokens for connections without a client certificate (`--auth-mode=jwt`).
    jwt: Option<Arc<JwtVerifier>>,
}

impl Authz {
    /// Policy for `trust_domain` with client atespaces from `--client-atespaces`
    /// (`spiffe://td/ns/x/sa/y=ns1,ns2;spiffe://…=*`; empty = no client has any atespace).
    pub fn new(trust_domain: &str, client_atespaces: &str) -> Result<Self, AuthzError> {
        let mut clients = HashMap::new();
        for entry in client_atespaces
            .split(';')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let invalid = |reason: String| AuthzError::Invalid {
                entry: entry.to_string(),
                reason,
            };
            let (id, list) = entry
                .split_once('=')
                .ok_or_else(|| invalid("expected <spiffe-id>=<atespace>,<atespace>".into()))?;
            let id = SpiffeId::parse(id.trim()).map_err(|e| invalid(e.to_string()))?;
            let list: Vec<&str> = list
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .collect();
            let access = if list == ["*"] {
                Atespaces::All
            } else {
                for a in &list {
                    ate_core::validate_label("atespace", a).map_err(|e| invalid(e.to_string()))?;
                }
                Atespaces::Only(list.iter().map(|a| a.to_string()).collect())
            };
            clients.insert(id, access);
        }
        Ok(Authz {
            trust_domain: trust_domain.to_string(),
            clients,
            jwt: None,
        })
    }

    /// Also accepts bearer tokens verified by `verifier` on connections without a client
    /// certificate (the server config must then use `ClientAuth::Optional`).
    pub fn with_jwt(mut self, verifier: JwtVerifier) -> Self {
        self.jwt = Some(Arc::new(verifier));
        self
    }

    /// The trust domain callers' identities must belong to.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// Whether bearer tokens are accepted (`--auth-mode=jwt`).
    pub fn accepts_tokens(&self) -> bool {
        self.jwt.is_some()
    }

    /// The role of a verified mesh identity of our trust domain.
    fn role_of(&self, id: &SpiffeId) -> Role {
        if id.is_admin() {
            Role::Admin
        } else if id.is_router() {
            Role::IngressRouter
        } else if id.is_node() {
            Role::NodeAgent {
                node: id.node_name().map(str::to_string),
            }
        } else if id.is_worker() {
            Role::Worker {
                worker: id.worker_name().map(str::to_string),
            }
        } else {
            Role::Client(
                self.clients
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| Atespaces::Only(BTreeSet::new())),
            )
        }
    }

    /// The caller of `request`. No TLS on the connection (plaintext mode) → admin. A verified
    /// client certificate → its SPIFFE ID's role (another trust domain → Unauthenticated).
    /// No certificate → a bearer token in jwt mode, else Unauthenticated.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let Some(peer) = ate_tls::request_peer(request) else {
            return Ok(Caller {
                identity: Identity::Plaintext,
                role: Role::Admin,
            });
        };
        let Some(id) = peer.spiffe_id.clone() else {
            return match &self.jwt {
                Some(verifier) => self.bearer(verifier, request.metadata(), peer.remote_addr),
                None => {
                    tracing::info!(target: "audit", remote = %peer.remote_addr, "denied: no client certificate");
                    Err(Status::unauthenticated(
                        "a client certificate with a SPIFFE ID is required",
                    ))
                }
            };
        };
        if id.trust_domain() != self.trust_domain {
            tracing::info!(target: "audit", identity = %id, "denied: foreign trust domain");
            return Err(Status::unauthenticated(format!(
                "identity {id} is not in trust domain {}",
                self.trust_domain
            )));
        }
        let role = self.role_of(&id);
        Ok(Caller {
            identity: Identity::Spiffe(id),
            role,
        })
    }

    fn bearer(
        &self,
        verifier: &JwtVerifier,
        metadata: &MetadataMap,
        remote: std::net::SocketAddr,
    ) -> Result<Caller, Status> {
        let refuse = |why: String| {
            tracing::info!(target: "audit", %remote, reason = %why, "denied: bearer token");
            Status::unauthenticated(why)
        };
        let Some(value) = metadata.get("authorization") else {
            return Err(refuse(
                "a client certificate or an `authorization: Bearer <jwt>` header is required"
                    .into(),
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or_else(|| refuse("the authorization header is not `Bearer <jwt>`".into()))?;
        let claims = verifier.verify(token).map_err(|e| refuse(e.to_string()))?;
        Ok(Caller::from_token(claims))
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Plaintext mode: no identity at all.
    Plaintext,
    /// A verified client certificate.
    Spiffe(SpiffeId),
    /// A verified bearer token (`sub`, `iss`).
    Token { subject: String, issuer: String },
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Plaintext => f.write_str("anonymous"),
            Identity::Spiffe(id) => write!(f, "{id}"),
            Identity::Token { subject, .. } => write!(f, "jwt:{subject}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Admin,
    IngressRouter,
    /// A node agent; `node` is the node its identity names (per-node SPIFFE ID or the token's
    /// `ate_node`), None for the shared node identity.
    NodeAgent {
        node: Option<String>,
    },
    /// A worker; `worker` is the worker its identity names, None for the shared identity.
    Worker {
        worker: Option<String>,
    },
    Client(Atespaces),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Admin => f.write_str("admin"),
            Role::IngressRouter => f.write_str("ingress_router"),
            Role::NodeAgent { node: None } => f.write_str("node_agent"),
            Role::NodeAgent { node: Some(n) } => write!(f, "node_agent of node {n}"),
            Role::Worker { worker: None } => f.write_str("worker"),
            Role::Worker { worker: Some(w) } => write!(f, "worker {w}"),
            Role::Client(_) => f.write_str("client"),
        }
    }
}

/// What an RPC needs.
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    /// ResumeActor: the router, or a client for its atespace.
    Resume(&'a str),
    /// SuspendActor: the node agent (idle suspend; the service then checks the actor runs on
    /// the node's own worker), or a client for its atespace.
    Suspend(&'a str),
    /// Other actor and atespace verbs on one atespace: clients for their atespaces.
    Atespace(&'a str),
    /// Listing across atespaces: clients (results filtered to their atespaces).
    List,
    /// FleetService: the node agent.
    Fleet,
    /// GetAtespace: the router (an atespace's callers allow list decides calls between
    /// actors), or a client for its atespace.
    ReadAtespace(&'a str),
    /// SetAlarm, GetAlarm, DeleteAlarm of an actor of this atespace: the worker it runs on (the
    /// service then checks that), or a client for its atespace.
    Alarm(&'a str),
    /// IssueActorToken for an actor of this atespace: the worker it runs on (the service then
    /// checks that) or admin; never a client (a token speaks for the actor).
    ActorToken(&'a str),
    /// ExecActor (a command inside the actor's sandbox): admin, or a client for its atespace;
    /// never the router, a node agent or a worker.
    Exec(&'a str),
    /// Templates and tags: admin only.
    Admin,
}

impl<'a> Need<'a> {
    /// What a request naming an optional atespace needs: [`Need::List`] when it names none
    /// (across atespaces, results filtered), else [`Need::Atespace`].
    pub fn atespace_or_list(atespace: &'a str) -> Self {
        if atespace.is_empty() {
            Need::List
        } else {
            Need::Atespace(atespace)
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub identity: Identity,
    pub role: Role,
}

impl Caller {
    fn from_token(t: TokenClaims) -> Caller {
        let role = match t.role {
            TokenRole::Admin => Role::Admin,
            TokenRole::IngressRouter => Role::IngressRouter,
            TokenRole::NodeAgent => Role::NodeAgent { node: t.node },
            TokenRole::Client => Role::Client(match t.atespaces {
                None => Atespaces::All,
                Some(list) => Atespaces::Only(list.into_iter().collect()),
            }),
        };
        Caller {
            identity: Identity::Token {
                subject: t.subject,
                issuer: t.issuer,
            },
            role,
        }
    }

    /// The caller's SPIFFE ID, if it authenticated with a certificate.
    pub fn spiffe_id(&self) -> Option<&SpiffeId> {
        match &self.identity {
            Identity::Spiffe(id) => Some(id),
            _ => None,
        }
    }

    /// For a node agent: Some(the node it is bound to, if any). None for other roles.
    pub fn node_agent(&self) -> Option<Option<&str>> {
        match &self.role {
            Role::NodeAgent { node } => Some(node.as_deref()),
            _ => None,
        }
    }

    /// For a worker: Some(the worker it is, if its identity names one). None for other roles.
    pub fn worker(&self) -> Option<Option<&str>> {
        match &self.role {
            Role::Worker { worker } => Some(worker.as_deref()),
            _ => None,
        }
    }

    /// Ok if this caller may call `rpc` with `need`; else PermissionDenied (audit-logged).
    pub fn check(&self, rpc: &str, need: Need<'_>) -> Result<(), Status> {
        let allowed = match (&self.role, need) {
            (Role::Admin, _) => true,
            (Role::IngressRouter, Need::Resume(_) | Need::ReadAtespace(_)) => true,
            (Role::NodeAgent { .. }, Need::Suspend(_) | Need::Fleet) => true,
            (Role::Worker { .. }, Need::Alarm(_) | Need::ActorToken(_)) => true,
            (
                Role::Client(a),
                Need::Resume(s)
                | Need::Suspend(s)
                | Need::Atespace(s)
                | Need::ReadAtespace(s)
                | Need::Alarm(s)
                | Need::Exec(s),
            ) => a.allows(s),
            (Role::Client(_), Need::List) => true,
            _ => false,
        };
        if allowed {
            return Ok(());
        }
        let what = atespace_of(need)
            .map(|s| format!(" on atespace {s:?}"))
            .unwrap_or_default();
        tracing::info!(target: "audit", identity = %self.identity, role = %self.role, rpc, atespace = ?atespace_of(need), "permission denied");
        Err(Status::permission_denied(format!(
            "identity {} (role {}) may not call {rpc}{what}",
            self.identity, self.role
        )))
    }

    /// PermissionDenied for `rpc` on `target` (e.g. `actor a/b`) because of `reason`, logged
    /// like every other denial. For checks that need the store (a node agent's own actors).
    pub fn deny(&self, rpc: &str, target: &str, reason: &str) -> Status {
        tracing::info!(target: "audit", identity = %self.identity, role = %self.role, rpc, target, reason, "permission denied");
        Status::permission_denied(format!(
            "identity {} (role {}) may not call {rpc} on {target}: {reason}",
            self.identity, self.role
        ))
    }

    /// For listings: whether rows of `atespace` are visible to this caller.
    pub fn sees(&self, atespace: &str) -> bool {
        match &self.role {
            Role::Client(a) => a.allows(atespace),
            _ => true,
        }
    }
}

fn atespace_of(need: Need<'_>) -> Option<&str> {
    match need {
        Need::Resume(s)
        | Need::Suspend(s)
        | Need::Atespace(s)
        | Need::ReadAtespace(s)
        | Need::Alarm(s)
        | Need::ActorToken(s)
        | Need::Exec(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(id: SpiffeId, authz: &Authz) -> Caller {
        Caller {
            role: authz.role_of(&id),
            identity: Identity::Spiffe(id),
        }
    }

    #[test]
    fn roles_and_client_atespaces() {
        let a = Authz::new(
            "ate.local",
            "spiffe://ate.local/ns/t/sa/x=team-a, team-b; spiffe://ate.local/ns/t/sa/all=*",
        )
        .unwrap();
        let router = caller(SpiffeId::router("ate.local").unwrap(), &a);
        assert!(router.check("ResumeActor", Need::Resume("a")).is_ok());
        assert!(router.check("GetAtespace", Need::ReadAtespace("a")).is_ok());
        assert!(router.check("UpdateAtespace", Need::Atespace("a")).is_err());
        let e = router
            .check("CreateActor", Need::Atespace("a"))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("atenet-router") && e.message().contains("CreateActor"));
        let node = caller(SpiffeId::node("ate.local").unwrap(), &a);
        assert_eq!(node.role, Role::NodeAgent { node: None });
        assert!(node.check("Heartbeat", Need::Fleet).is_ok());
        assert!(node.check("SuspendActor", Need::Suspend("a")).is_ok());
        assert!(node.check("ResumeActor", Need::Resume("a")).is_err());
        let n1 = caller(SpiffeId::node_instance("ate.local", "node-1").unwrap(), &a);
        assert_eq!(n1.node_agent(), Some(Some("node-1")));
        assert!(n1.check("Heartbeat", Need::Fleet).is_ok());
        let x = caller(SpiffeId::parse("spiffe://ate.local/ns/t/sa/x").unwrap(), &a);
        assert_eq!(x.node_agent(), None);
        assert!(x.check("GetActor", Need::Atespace("team-b")).is_ok());
        assert!(x.check("GetActor", Need::Atespace("team-c")).is_err());
        assert!(x.check("ApplyTemplate", Need::Admin).is_err());
        assert!(x.sees("team-a") && !x.sees("team-c"));
        let all = caller(
            SpiffeId::parse("spiffe://ate.local/ns/t/sa/all").unwrap(),
            &a,
        );
        assert!(all.check("GetActor", Need::Atespace("anything")).is_ok());
        let worker = caller(SpiffeId::worker_instance("ate.local", "w1").unwrap(), &a);
        assert!(worker.check("ResumeActor", Need::Resume("a")).is_err());
        assert!(worker.check("ListActors", Need::List).is_err());
        assert_eq!(worker.worker(), Some(Some("w1")));
        assert!(worker.check("SetAlarm", Need::Alarm("a")).is_ok());
        assert!(x.check("SetAlarm", Need::Alarm("team-a")).is_ok());
        assert!(x.check("SetAlarm", Need::Alarm("team-c")).is_err());
        assert!(node.check("SetAlarm", Need::Alarm("a")).is_err());
        assert!(
            worker
                .check("IssueActorToken", Need::ActorToken("a"))
                .is_ok()
        );
        assert!(
            x.check("IssueActorToken", Need::ActorToken("team-a"))
                .is_err()
        );
        assert!(
            node.check("IssueActorToken", Need::ActorToken("a"))
                .is_err()
        );
        // Exec runs code in the sandbox: admin and the atespace's clients only.
        assert!(router.check("ExecActor", Need::Exec("a")).is_err());
        assert!(node.check("ExecActor", Need::Exec("a")).is_err());
        assert!(worker.check("ExecActor", Need::Exec("a")).is_err());
        assert!(x.check("ExecActor", Need::Exec("team-a")).is_ok());
        assert!(x.check("ExecActor", Need::Exec("team-c")).is_err());
        assert!(Authz::new("ate.local", "nonsense").is_err());
        assert!(Authz::new("ate.local", "spiffe://ate.local/ns/t/sa/x=Bad_Name").is_err());
    }

    #[test]
    fn token_roles() {
        let token = |role, atespaces: Option<Vec<&str>>, node: Option<&str>| {
            Caller::from_token(TokenClaims {
                issuer: "https://issuer".into(),
                subject: "alice".into(),
                role,
                atespaces: atespaces.map(|l| l.into_iter().map(String::from).collect()),
                node: node.map(String::from),
            })
        };
        let c = token(TokenRole::Client, Some(vec!["team-a"]), None);
        assert!(c.check("GetActor", Need::Atespace("team-a")).is_ok());
        let e = c.check("GetActor", Need::Atespace("team-b")).unwrap_err();
        assert!(e.message().contains("jwt:alice"), "{}", e.message());
        assert!(c.spiffe_id().is_none());
        let all = token(TokenRole::Client, None, None);
        assert!(all.check("GetActor", Need::Atespace("any")).is_ok());
        assert!(all.check("ApplyTemplate", Need::Admin).is_err());
        let admin = token(TokenRole::Admin, None, None);
        assert!(admin.check("ApplyTemplate", Need::Admin).is_ok());
        let router = token(TokenRole::IngressRouter, None, None);
        assert!(router.check("ResumeActor", Need::Resume("x")).is_ok());
        assert!(router.check("GetActor", Need::Atespace("x")).is_err());
        let node = token(TokenRole::NodeAgent, None, Some("node-2"));
        assert_eq!(node.node_agent(), Some(Some("node-2")));
        let e = node.deny("ActorService/SuspendActor", "actor a/b", "not yours");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("jwt:alice") && e.message().contains("actor a/b"),
            "{}",
            e.message()
        );
    }
}
