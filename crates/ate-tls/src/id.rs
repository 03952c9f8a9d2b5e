//! SPIFFE IDs of the form `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`, the only
//! shape the system issues or accepts (it mirrors Kubernetes pod identities).

use std::fmt;
use std::str::FromStr;

use crate::error::TlsError;

/// Trust domain used when none is configured (`ate up`).
pub const DEFAULT_TRUST_DOMAIN: &str = "ate.local";
/// Namespace of every system component.
pub const SYSTEM_NAMESPACE: &str = "ate-system";
/// Service account of the ingress router (`ate router`).
pub const SA_ROUTER: &str = "atenet-router";
/// Service account of the control plane (`ate api`).
pub const SA_API: &str = "ate-api";
/// Service account of node agents (`ate node`).
pub const SA_NODE: &str = "ate-node";
/// Service account of workers (`ate worker` / atunnel).
pub const SA_WORKER: &str = "ate-worker";
/// Service account of the administrator's CLI.
pub const SA_ADMIN: &str = "ate-admin";

/// A validated SPIFFE ID with the `/ns/<ns>/sa/<sa>` path.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

impl SpiffeId {
    /// Builds and validates an ID from its parts.
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, TlsError> {
        Self::parse(&format!(
            "spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"
        ))
    }

    /// Parses `spiffe://<td>/ns/<ns>/sa/<sa>`; other SPIFFE paths are rejected because nothing
    /// in the system could authorize them.
    pub fn parse(s: &str) -> Result<Self, TlsError> {
        let bad = |reason: &str| TlsError::InvalidSpiffeId {
            id: s.to_string(),
            reason: reason.to_string(),
        };
        // The spiffe crate enforces the generic SPIFFE ID rules (scheme, trust-domain and segment
        // characters, no query/fragment/port/userinfo, no empty or dot segments).
        let generic = spiffe::SpiffeId::new(s).map_err(|e| bad(&e.to_string()))?;
        let segments: Vec<&str> = generic.path().trim_start_matches('/').split('/').collect();
        match segments.as_slice() {
            ["ns", ns, "sa", sa] if !ns.is_empty() && !sa.is_empty() => Ok(SpiffeId {
                trust_domain: generic.trust_domain_name().to_string(),
                namespace: (*ns).to_string(),
                service_account: (*sa).to_string(),
            }),
            _ => Err(bad("path must be /ns/<namespace>/sa/<service-account>")),
        }
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// The URI form, as placed in the certificate's URI SAN.
    pub fn uri(&self) -> String {
        self.to_string()
    }

    fn system(trust_domain: &str, sa: &str) -> Result<Self, TlsError> {
        Self::new(trust_domain, SYSTEM_NAMESPACE, sa)
    }

    /// `spiffe://<td>/ns/ate-system/sa/atenet-router`
    pub fn router(trust_domain: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, SA_ROUTER)
    }

    /// `spiffe://<td>/ns/ate-system/sa/ate-api`
    pub fn api(trust_domain: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, SA_API)
    }

    /// `spiffe://<td>/ns/ate-system/sa/ate-node`
    pub fn node(trust_domain: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, SA_NODE)
    }

    /// `spiffe://<td>/ns/ate-system/sa/ate-node-<node>`: a per-node identity, so the api knows
    /// which node is calling (a node agent may suspend only the actors of its own workers; used
    /// by `ate up`).
    pub fn node_instance(trust_domain: &str, node: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, &format!("{SA_NODE}-{node}"))
    }

    /// `spiffe://<td>/ns/ate-system/sa/ate-worker` (the shared worker identity on Kubernetes).
    pub fn worker(trust_domain: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, SA_WORKER)
    }

    /// `spiffe://<td>/ns/ate-system/sa/ate-worker-<name>`: a per-worker identity, so the router
    /// can pin the exact worker named in an assignment (used by `ate up`).
    pub fn worker_instance(trust_domain: &str, worker: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, &format!("{SA_WORKER}-{worker}"))
    }

    /// `spiffe://<td>/ns/ate-system/sa/ate-admin`
    pub fn admin(trust_domain: &str) -> Result<Self, TlsError> {
        Self::system(trust_domain, SA_ADMIN)
    }

    fn is_system(&self, sa: &str) -> bool {
        self.namespace == SYSTEM_NAMESPACE && self.service_account == sa
    }

    pub fn is_router(&self) -> bool {
        self.is_system(SA_ROUTER)
    }

    pub fn is_api(&self) -> bool {
        self.is_system(SA_API)
    }

    /// True for the shared node identity and for per-node identities.
    pub fn is_node(&self) -> bool {
        self.is_system(SA_NODE) || self.node_name().is_some()
    }

    /// The node a per-node identity (`…/ns/ate-system/sa/ate-node-<node>`) names; None for the
    /// shared `…/sa/ate-node` and for every other identity.
    pub fn node_name(&self) -> Option<&str> {
        if self.namespace != SYSTEM_NAMESPACE {
            return None;
        }
        self.service_account
            .strip_prefix(SA_NODE)
            .and_then(|rest| rest.strip_prefix('-'))
            .filter(|name| !name.is_empty())
    }

    pub fn is_admin(&self) -> bool {
        self.is_system(SA_ADMIN)
    }

    /// The worker a per-worker identity (`…/ns/ate-system/sa/ate-worker-<id>`) names; None for
    /// the shared `…/sa/ate-worker` and for every other identity.
    pub fn worker_name(&self) -> Option<&str> {
        if self.namespace != SYSTEM_NAMESPACE {
            return None;
        }
        self.service_account
            .strip_prefix(SA_WORKER)
            .and_then(|rest| rest.strip_prefix('-'))
            .filter(|name| !name.is_empty())
    }

    /// True for the shared worker identity and for per-worker identities.
    pub fn is_worker(&self) -> bool {
        self.namespace == SYSTEM_NAMESPACE
            && (self.service_account == SA_WORKER
                || self
                    .service_account
                    .strip_prefix(SA_WORKER)
                    .is_some_and(|rest| rest.len() > 1 && rest.starts_with('-')))
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl fmt::Debug for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpiffeId({self})")
    }
}

impl FromStr for SpiffeId {
    type Err = TlsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<&str> for SpiffeId {
    type Error = TlsError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_roles() {
        let r = SpiffeId::router(DEFAULT_TRUST_DOMAIN).unwrap();
        assert_eq!(
            r.to_string(),
            "spiffe://ate.local/ns/ate-system/sa/atenet-router"
        );
        assert_eq!(SpiffeId::parse(&r.to_string()).unwrap(), r);
        assert!(r.is_router() && !r.is_worker());
        assert!(SpiffeId::worker("ate.local").unwrap().is_worker());
        let w1 = SpiffeId::worker_instance("ate.local", "w1").unwrap();
        assert!(w1.is_worker());
        assert_eq!(w1.service_account(), "ate-worker-w1");
        assert_eq!(w1.worker_name(), Some("w1"));
        assert_eq!(SpiffeId::worker("ate.local").unwrap().worker_name(), None);
        assert!(
            !SpiffeId::new("ate.local", "ate-system", "ate-workerx")
                .unwrap()
                .is_worker()
        );
        assert_eq!(
            SpiffeId::api("example.org").unwrap().uri(),
            "spiffe://example.org/ns/ate-system/sa/ate-api"
        );
    }

    #[test]
    fn node_identities() {
        let shared = SpiffeId::node("ate.local").unwrap();
        assert!(shared.is_node());
        assert_eq!(shared.node_name(), None);
        let n1 = SpiffeId::node_instance("ate.local", "node-1").unwrap();
        assert_eq!(
            n1.to_string(),
            "spiffe://ate.local/ns/ate-system/sa/ate-node-node-1"
        );
        assert!(n1.is_node() && !n1.is_worker());
        assert_eq!(n1.node_name(), Some("node-1"));
        for not_node in [
            "spiffe://ate.local/ns/ate-system/sa/ate-nodex",
            "spiffe://ate.local/ns/ate-system/sa/ate-node-",
            "spiffe://ate.local/ns/team/sa/ate-node-node-1",
        ] {
            let id = SpiffeId::parse(not_node).unwrap();
            assert!(!id.is_node() && id.node_name().is_none(), "{not_node}");
        }
    }

    #[test]
    fn trust_domain_is_case_normalized() {
        // The spiffe crate lowercases trust domains, so comparisons are case-insensitive there.
        let id = SpiffeId::parse("spiffe://ATE.local/ns/a/sa/b").unwrap();
        assert_eq!(id.trust_domain(), "ate.local");
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "http://ate.local/ns/a/sa/b",
            "spiffe://ate.local",
            "spiffe://ate.local/ns/a",
            "spiffe://ate.local/ns/a/sa/b/extra",
            "spiffe://ate.local/sa/b/ns/a",
            "spiffe://ate.local/ns//sa/b",
            "spiffe://ate.local:8443/ns/a/sa/b",
            "spiffe://ate.local/ns/a/sa/b?x=1",
            "spiffe://ate.local/ns/a/sa/b c",
        ] {
            assert!(SpiffeId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
