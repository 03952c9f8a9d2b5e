//! Authorization: the caller's SPIFFE ID (verified during the mTLS handshake) maps to a role.
//!
//! | identity                          | role             | may call                                     |
//! |-----------------------------------|------------------|----------------------------------------------|
//! | `…/sa/atenet-router`              | `ingress_router` | ResumeActor                                  |
//! | `…/sa/ate-node`                   | `node_agent`     | FleetService, SuspendActor (idle suspend)    |
//! | `…/sa/ate-admin`                  | `admin`          | everything                                   |
//! | any other ID in the trust domain  | `client`         | actor and atespace verbs in its atespaces    |
//!
//! A client's atespaces come from `--client-atespaces`; a client not listed there has none.
//! Plaintext mode (no TLS configured) has no identities: every caller is `admin`, as before TLS.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use ate_tls::SpiffeId;
use tonic::{Request, Status};

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

/// Role policy of an api serving mTLS.
#[derive(Debug, Clone)]
pub struct Authz {
    trust_domain: String,
    clients: HashMap<SpiffeId, Atespaces>,
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
        })
    }

    /// The caller of `request`. No TLS on the connection (plaintext mode) → admin. TLS without
    /// a client certificate, or an ID from another trust domain → Unauthenticated.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let Some(peer) = ate_tls::request_peer(request) else {
            return Ok(Caller {
                id: None,
                role: Role::Admin,
            });
        };
        let Some(id) = peer.spiffe_id.clone() else {
            tracing::info!(target: "audit", remote = %peer.remote_addr, "denied: no client certificate");
            return Err(Status::unauthenticated(
                "a client certificate with a SPIFFE ID is required",
            ));
        };
        if id.trust_domain() != self.trust_domain {
            tracing::info!(target: "audit", identity = %id, "denied: foreign trust domain");
            return Err(Status::unauthenticated(format!(
                "identity {id} is not in trust domain {}",
                self.trust_domain
            )));
        }
        let role = if id.is_admin() {
            Role::Admin
        } else if id.is_router() {
            Role::IngressRouter
        } else if id.is_node() {
            Role::NodeAgent
        } else {
            Role::Client(
                self.clients
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| Atespaces::Only(BTreeSet::new())),
            )
        };
        Ok(Caller { id: Some(id), role })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Admin,
    IngressRouter,
    NodeAgent,
    Client(Atespaces),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Admin => "admin",
            Role::IngressRouter => "ingress_router",
            Role::NodeAgent => "node_agent",
            Role::Client(_) => "client",
        })
    }
}

/// What an RPC needs.
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    /// ResumeActor: the router, or a client for its atespace.
    Resume(&'a str),
    /// SuspendActor: the node agent (idle suspend), or a client for its atespace.
    Suspend(&'a str),
    /// Other actor and atespace verbs on one atespace: clients for their atespaces.
    Atespace(&'a str),
    /// Listing across atespaces: clients (results filtered to their atespaces).
    List,
    /// FleetService: the node agent.
    Fleet,
    /// Templates and tags: admin only.
    Admin,
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub id: Option<SpiffeId>,
    pub role: Role,
}

impl Caller {
    /// Ok if this caller may call `rpc` with `need`; else PermissionDenied (audit-logged).
    pub fn check(&self, rpc: &str, need: Need<'_>) -> Result<(), Status> {
        let allowed = match (&self.role, need) {
            (Role::Admin, _) => true,
            (Role::IngressRouter, Need::Resume(_)) => true,
            (Role::NodeAgent, Need::Suspend(_) | Need::Fleet) => true,
            (Role::Client(a), Need::Resume(s) | Need::Suspend(s) | Need::Atespace(s)) => {
                a.allows(s)
            }
            (Role::Client(_), Need::List) => true,
            _ => false,
        };
        if allowed {
            return Ok(());
        }
        let who = self
            .id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "anonymous".into());
        let what = match need {
            Need::Resume(s) | Need::Suspend(s) | Need::Atespace(s) => {
                format!(" on atespace {s:?}")
            }
            _ => String::new(),
        };
        tracing::info!(target: "audit", identity = %who, role = %self.role, rpc, atespace = ?atespace_of(need), "permission denied");
        Err(Status::permission_denied(format!(
            "identity {who} (role {}) may not call {rpc}{what}",
            self.role
        )))
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
        Need::Resume(s) | Need::Suspend(s) | Need::Atespace(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(id: SpiffeId, authz: &Authz) -> Caller {
        let role = if id.is_admin() {
            Role::Admin
        } else if id.is_router() {
            Role::IngressRouter
        } else if id.is_node() {
            Role::NodeAgent
        } else {
            Role::Client(
                authz
                    .clients
                    .get(&id)
                    .cloned()
                    .unwrap_or(Atespaces::Only(BTreeSet::new())),
            )
        };
        Caller { id: Some(id), role }
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
        let e = router
            .check("CreateActor", Need::Atespace("a"))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("atenet-router") && e.message().contains("CreateActor"));
        let node = caller(SpiffeId::node("ate.local").unwrap(), &a);
        assert!(node.check("Heartbeat", Need::Fleet).is_ok());
        assert!(node.check("SuspendActor", Need::Suspend("a")).is_ok());
        assert!(node.check("ResumeActor", Need::Resume("a")).is_err());
        let x = caller(SpiffeId::parse("spiffe://ate.local/ns/t/sa/x").unwrap(), &a);
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
        assert!(Authz::new("ate.local", "nonsense").is_err());
        assert!(Authz::new("ate.local", "spiffe://ate.local/ns/t/sa/x=Bad_Name").is_err());
    }
}
