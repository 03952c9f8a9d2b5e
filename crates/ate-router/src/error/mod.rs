//! What a client sees when a request cannot be routed: the spec's error mapping (Envoy column),
//! and the body texts.
//!
//! Every body is one short line for a person: it names the actor, says what is wrong and, where
//! there is one, the command that fixes it. Internal names (RPCs, state enums, gRPC codes) and
//! long upstream messages never reach the client: an upstream reason is cut to its first line and
//! [`REASON_MAX`] characters and cleaned of such names ([`short_reason`]). The texts the spec
//! fixes stay exactly as the spec writes them (the capacity texts, `actor <a>/<n> unavailable`,
//! the empty 504, and the CRASHED text containing `AssignWorker prerequisite not met`, which the
//! spec tells operators to look for).

mod upstream;

use std::sync::Arc;

use ate_core::{CRASHED_PREREQUISITE, NO_ROOM_MESSAGE};
use http::StatusCode;

pub use upstream::{Disposition, REASON_MAX, classify, short_reason};

/// Why the router could not find (or wake) the actor of a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The api has no such actor.
    #[error("actor not found")]
    NotFound,
    /// NotFound for something the actor needs (its template, a snapshot): a short reason.
    #[error("actor cannot start: {0}")]
    Missing(Arc<str>),
    /// ResumeActor refused a CRASHED actor (`AssignWorker prerequisite not met`); the short
    /// reason from the actor's last error (may be empty).
    #[error("actor crashed: {0}")]
    Crashed(Arc<str>),
    /// The budget was spent and no worker had room.
    #[error("{NO_ROOM_MESSAGE}")]
    NoRoom,
    /// The actor's atespace is at one of its quotas (ResourceExhausted naming the quota, not
    /// parked: waiting rarely frees an atespace's own actors); the api's reason.
    #[error("over quota: {0}")]
    OverQuota(Arc<str>),
    /// The budget was spent without an answer from the api.
    #[error("api unavailable")]
    ApiUnavailable,
    /// FailedPrecondition (transient state) or Aborted outlasted the retries; a short reason.
    #[error("actor busy: {0}")]
    Busy(Arc<str>),
    /// No parking place was free.
    #[error("router at capacity")]
    AtCapacity,
    /// The routing decision took longer than budget + grace (504, empty body).
    #[error("routing decision timed out")]
    DecisionTimeout,
    #[error("deadline exceeded")]
    DeadlineExceeded,
    #[error("permission denied")]
    PermissionDenied,
    #[error("unauthenticated")]
    Unauthenticated,
    /// Anything else; the detail is logged, never shown to the client.
    #[error("internal: {0}")]
    Internal(Arc<str>),
}

/// `(<atespace>, <name>)` of a validated `<atespace>/<name>`, for the commands in the texts.
fn halves(actor: &str) -> (&str, &str) {
    actor.split_once('/').unwrap_or((actor, ""))
}

impl ResolveError {
    pub fn status(&self) -> StatusCode {
        match self {
            ResolveError::NotFound | ResolveError::Missing(_) => StatusCode::NOT_FOUND,
            ResolveError::Crashed(_)
            | ResolveError::NoRoom
            | ResolveError::ApiUnavailable
            | ResolveError::Busy(_)
            | ResolveError::AtCapacity => StatusCode::SERVICE_UNAVAILABLE,
            ResolveError::DecisionTimeout | ResolveError::DeadlineExceeded => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ResolveError::OverQuota(_) => StatusCode::TOO_MANY_REQUESTS,
            ResolveError::PermissionDenied => StatusCode::FORBIDDEN,
            ResolveError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ResolveError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The response body; `actor` is `<atespace>/<name>`.
    pub fn body(&self, actor: &str) -> String {
        let (atespace, name) = halves(actor);
        match self {
            ResolveError::NotFound => format!(
                "actor {actor} not found; create it with `ate create actor {name} -a {atespace} -t <atespace>/<template>`"
            ),
            ResolveError::Missing(why) if why.starts_with("template ") => format!(
                "actor {actor} cannot start: {why}; apply the template again with `ate apply -f <file>`"
            ),
            ResolveError::Missing(why) => format!("actor {actor} cannot start: {why}"),
            // The spec: "a fast 503 with the text AssignWorker prerequisite not met means the
            // actor is crashed", so that text stays, after the part meant for a person.
            ResolveError::Crashed(why) => {
                let why = if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                };
                format!(
                    "actor {actor} crashed{why}; run `ate revert actor {name} -a {atespace}` to retry ({CRASHED_PREREQUISITE})"
                )
            }
            ResolveError::Busy(why) => {
                format!("actor {actor} unavailable: {why}; retry in a few seconds")
            }
            // Spec texts, byte for byte.
            ResolveError::NoRoom => format!("actor {actor} unavailable: {NO_ROOM_MESSAGE}"),
            ResolveError::OverQuota(why) => format!(
                "actor {actor} unavailable: {why}; suspend another of the atespace's actors, or ask an admin to raise spec.quota of atespace {atespace}"
            ),
            ResolveError::ApiUnavailable => format!("actor {actor} unavailable"),
            ResolveError::AtCapacity => {
                format!("actor \"{actor}\" unavailable: router at capacity")
            }
            // Envoy's decision timeout: 504 with an empty body.
            ResolveError::DecisionTimeout => String::new(),
            // Spec 4.4: a resume still at work; the client should send again, not revert.
            ResolveError::DeadlineExceeded => format!(
                "actor {actor} unavailable: the control plane did not finish in time; retry after a pause"
            ),
            ResolveError::PermissionDenied => format!(
                "actor {actor}: permission denied: the control plane does not let this router resume it"
            ),
            ResolveError::Unauthenticated => format!(
                "actor {actor}: unauthenticated: the control plane did not accept this router's credentials"
            ),
            ResolveError::Internal(_) => {
                format!("actor {actor}: internal error (details are in the router's log)")
            }
        }
    }
}

/// Why a request the router had resolved did not get an answer from the actor (all 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// The worker did not answer (connect, TLS or HTTP/2 handshake failed) until the retries
    /// ran out.
    #[error("worker did not answer")]
    WorkerDown,
    /// atunnel kept answering 421 (the worker fenced itself, or the actor moved) until the
    /// retries ran out.
    #[error("worker does not serve the actor")]
    NotServed,
    /// atunnel could not open the tunnel for another reason (refused, stream error).
    #[error("tunnel failed")]
    Tunnel,
    /// atunnel: nothing accepts connections on the port inside the actor.
    #[error("nothing listens on the port")]
    PortClosed,
    /// The tunnel ended before the answer and the actor is no longer active on its worker:
    /// ingress was switched off for a suspend, a move or a stop (a crash too), which closes its
    /// tunnels.
    #[error("connection cut: the actor's ingress was closed")]
    IngressClosed,
    /// The tunnel ended before the answer while the actor is still active: the actor's process
    /// closed (or reset) the connection.
    #[error("actor closed the connection")]
    ClosedByActor,
    /// The actor answered a WebSocket upgrade with a 2xx that switches nothing.
    #[error("WebSocket upgrade not accepted")]
    UpgradeRefused,
}

impl ForwardError {
    /// 503 for a route that stayed bad through the retries within the parking budget (the
    /// spec's "Unavailable (after retries)": the worker is fenced or restarting and nothing
    /// reached the actor), 502 for the rest (the actor or its tunnel failed the request).
    pub fn status(self) -> StatusCode {
        match self {
            ForwardError::WorkerDown | ForwardError::NotServed => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// The response body; `actor` is `<atespace>/<name>`, `port` the actor port asked for.
    pub fn body(self, actor: &str, port: u16) -> String {
        let (atespace, name) = halves(actor);
        match self {
            ForwardError::WorkerDown => format!(
                "actor {actor} unreachable: its worker did not answer; retry in a few seconds"
            ),
            ForwardError::NotServed => format!(
                "actor {actor} unreachable: its worker is not serving it right now; retry in a few seconds"
            ),
            ForwardError::Tunnel => format!(
                "actor {actor} unreachable: the tunnel to its worker failed; retry in a few seconds"
            ),
            ForwardError::PortClosed => format!(
                "actor {actor}: nothing listens on port {port} in the actor; check its process with `ate logs actor {name} -a {atespace}`"
            ),
            ForwardError::IngressClosed => format!(
                "actor {actor}: its connection was cut before it answered (the actor was suspended, moved or stopped); send the request again"
            ),
            ForwardError::ClosedByActor => format!(
                "actor {actor} closed the connection before it answered; check its process with `ate logs actor {name} -a {atespace}`"
            ),
            ForwardError::UpgradeRefused => {
                format!("actor {actor} did not accept the WebSocket upgrade")
            }
        }
    }
}

/// Why a request's routing headers are refused before anything is resolved. Checked without
/// allocating ([`crate::actor_ref`]); the body is made only for a refused request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// More than one `ate-target-actor` header (400): which one is meant is a guess.
    #[error("duplicate ate-target-actor headers")]
    DuplicateTarget,
    /// More than one `ate-target-port` header (400).
    #[error("duplicate ate-target-port headers")]
    DuplicatePort,
    /// `ate-target-port` is not a port number 1-65535 (400).
    #[error("bad ate-target-port")]
    BadPort,
    /// A client CONNECT whose `ate-target-port` names another port than its authority (400).
    #[error("ate-target-port disagrees with the CONNECT port")]
    PortMismatch { header: u16, connect: u16 },
}

impl RequestError {
    pub fn status(self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }

    /// The response body; `actor` is the first `ate-target-actor` value when it is valid.
    pub fn body(self, actor: Option<&str>, port_value: Option<&[u8]>) -> String {
        let about = actor.map(|a| format!("actor {a}: ")).unwrap_or_default();
        match self {
            RequestError::DuplicateTarget => {
                "more than one ate-target-actor header in the request; send exactly one".to_string()
            }
            RequestError::DuplicatePort => format!(
                "{about}more than one ate-target-port header in the request; send at most one"
            ),
            RequestError::BadPort => format!(
                "{about}ate-target-port {} is not a port number (1-65535)",
                shown(port_value.unwrap_or_default())
            ),
            RequestError::PortMismatch { header, connect } => format!(
                "{about}ate-target-port {header} disagrees with the CONNECT port {connect}; send one of them"
            ),
        }
    }
}

/// A client-supplied header value for a body: quoted, escaped (so it stays on one line) and cut
/// to 64 characters.
pub fn shown(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let mut cut: String = text.chars().take(64).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    fn fail(s: Status) -> ResolveError {
        match classify(&s, true) {
            Disposition::Fail(e) => e,
            other => panic!("{other:?}"),
        }
    }

    /// What no body may contain: internal RPC / enum names and status dumps.
    use ate_test_support::oracles::ROUTER_INTERNAL_NAMES as INTERNAL;

    /// One line, and no internal name apart from the spec's own CRASHED text.
    fn assert_clean(body: &str) {
        assert!(!body.contains(['\n', '\r']), "{body:?}");
        let without_spec = body.replace(CRASHED_PREREQUISITE, "");
        for name in INTERNAL {
            assert!(!without_spec.contains(name), "{name} in {body:?}");
        }
    }

    /// The api's CRASHED message (crates/ate-api/src/workflows/mod.rs `crashed`).
    fn api_crashed(actor: &str, last_error: &str) -> Status {
        let why = if last_error.is_empty() {
            String::new()
        } else {
            format!(" ({last_error})")
        };
        Status::failed_precondition(format!(
            "actor {actor} is ACTOR_STATE_CRASHED{why}: {CRASHED_PREREQUISITE}; RevertActor returns it to ACTOR_STATE_SUSPENDED"
        ))
    }

    #[test]
    fn mapping_table() {
        let a = "team-a/agent-7";
        let cases = [
            (
                Status::not_found("actor \"team-a/agent-7\" not found"),
                404,
                "actor team-a/agent-7 not found; create it with `ate create actor agent-7 -a team-a -t <atespace>/<template>`",
            ),
            (
                Status::not_found("template \"team-a/t\" not found"),
                404,
                "actor team-a/agent-7 cannot start: template \"team-a/t\" not found; apply the template again with `ate apply -f <file>`",
            ),
            (
                Status::deadline_exceeded("x"),
                504,
                "actor team-a/agent-7 unavailable: the control plane did not finish in time; retry after a pause",
            ),
            (
                Status::permission_denied("x"),
                403,
                "actor team-a/agent-7: permission denied: the control plane does not let this router resume it",
            ),
            (
                Status::unauthenticated("x"),
                401,
                "actor team-a/agent-7: unauthenticated: the control plane did not accept this router's credentials",
            ),
            (
                Status::internal("secret db dsn"),
                500,
                "actor team-a/agent-7: internal error (details are in the router's log)",
            ),
            (
                Status::unknown("secret"),
                500,
                "actor team-a/agent-7: internal error (details are in the router's log)",
            ),
            (
                Status::invalid_argument("secret"),
                500,
                "actor team-a/agent-7: internal error (details are in the router's log)",
            ),
            (
                api_crashed(
                    a,
                    "restore on worker w-1 failed: wakeup probe on port 9999 timed out",
                ),
                503,
                "actor team-a/agent-7 crashed: restore on worker w-1 failed: wakeup probe on port 9999 timed out; run `ate revert actor agent-7 -a team-a` to retry (AssignWorker prerequisite not met)",
            ),
            (
                api_crashed(a, ""),
                503,
                "actor team-a/agent-7 crashed; run `ate revert actor agent-7 -a team-a` to retry (AssignWorker prerequisite not met)",
            ),
            (
                Status::failed_precondition(
                    "resume: AssignWorker prerequisite not met: state CRASHED",
                ),
                503,
                "actor team-a/agent-7 crashed; run `ate revert actor agent-7 -a team-a` to retry (AssignWorker prerequisite not met)",
            ),
        ];
        for (status, code, body) in cases {
            let e = fail(status);
            assert_eq!(e.status().as_u16(), code, "{e:?}");
            let got = e.body(a);
            assert_eq!(got, body);
            assert_clean(&got);
        }
    }

    #[test]
    fn upstream_reasons_are_one_short_clean_line() {
        let long = format!(
            "restore on worker w-1 failed: {}\nsecond line\nthird",
            "x".repeat(500)
        );
        let e = fail(api_crashed("a/b", &long));
        let body = e.body("a/b");
        assert_clean(&body);
        let ResolveError::Crashed(why) = &e else {
            panic!("{e:?}")
        };
        assert!(why.chars().count() <= REASON_MAX, "{}", why.chars().count());
        assert!(why.ends_with('…'), "{why}");
        assert!(!body.contains("second line"), "{body}");
        // A status dump inside the last error is cut off; RPC and state names become words.
        let e = fail(api_crashed(
            "a/b",
            "node call RestoreWorkload failed: status: Internal, message: \"x\", details: [], metadata: MetadataMap { headers: {} }",
        ));
        let body = e.body("a/b");
        assert_clean(&body);
        assert!(
            body.starts_with("actor a/b crashed: node call restore failed; run"),
            "{body}"
        );
        for (input, want) in [
            ("actor a/b is ACTOR_STATE_RESUMING", "actor a/b is resuming"),
            (
                "FailedPrecondition: tonic::transport::Error(x)",
                "failed precondition:",
            ),
            ("code: Unavailable", ""),
            ("a\tb\u{7}c", "a b c"),
        ] {
            let got = short_reason(input);
            assert_eq!(got, want.trim_end_matches(':'), "{input:?}");
        }
    }

    #[test]
    fn transient_states_read_as_words() {
        let busy = |s: Status| match classify(&s, true) {
            Disposition::Retry { if_exhausted, .. } => if_exhausted,
            other => panic!("{other:?}"),
        };
        let e = busy(Status::failed_precondition(
            "actor a/b is ACTOR_STATE_SUSPENDING; try again when the operation on it has finished",
        ));
        assert_eq!(
            e.body("a/b"),
            "actor a/b unavailable: it is still suspending; retry in a few seconds"
        );
        let e = busy(Status::aborted("another operation holds actor a/b"));
        assert_eq!(
            e.body("a/b"),
            "actor a/b unavailable: another operation on it is still running; retry in a few seconds"
        );
        let e = busy(Status::failed_precondition(""));
        assert_clean(&e.body("a/b"));
        assert!(e.body("a/b").contains("still running"));
    }

    #[test]
    fn capacity_texts() {
        let a = "lab-c/b0-5";
        assert_eq!(
            ResolveError::NoRoom.body(a),
            "actor lab-c/b0-5 unavailable: no worker has room for the actor"
        );
        assert_eq!(
            ResolveError::AtCapacity.body(a),
            "actor \"lab-c/b0-5\" unavailable: router at capacity"
        );
        assert_eq!(
            ResolveError::ApiUnavailable.body(a),
            "actor lab-c/b0-5 unavailable"
        );
        assert_eq!(ResolveError::DecisionTimeout.body(a), "");
        assert_eq!(ResolveError::DecisionTimeout.status().as_u16(), 504);
    }

    #[test]
    fn every_body_is_one_clean_line_naming_the_actor() {
        let a = "team-a/agent-7";
        let resolve = [
            ResolveError::NotFound,
            ResolveError::Missing("snapshot 3 of actor \"team-a/agent-7\" not found".into()),
            ResolveError::Crashed("probe failed".into()),
            ResolveError::NoRoom,
            ResolveError::OverQuota(
                "atespace \"team-a\" has no quota left for the actor: runningActors 2 of 2 in use"
                    .into(),
            ),
            ResolveError::ApiUnavailable,
            ResolveError::Busy("it is still resuming".into()),
            ResolveError::AtCapacity,
            ResolveError::DeadlineExceeded,
            ResolveError::PermissionDenied,
            ResolveError::Unauthenticated,
            ResolveError::Internal("Status { code: Internal }".into()),
        ];
        for e in resolve {
            let body = e.body(a);
            assert_clean(&body);
            assert!(body.contains(a), "{body}");
        }
        let forward = [
            ForwardError::WorkerDown,
            ForwardError::NotServed,
            ForwardError::Tunnel,
            ForwardError::PortClosed,
            ForwardError::IngressClosed,
            ForwardError::ClosedByActor,
            ForwardError::UpgradeRefused,
        ];
        let mut seen = std::collections::HashSet::new();
        for e in forward {
            let unavailable = matches!(e, ForwardError::WorkerDown | ForwardError::NotServed);
            assert_eq!(
                e.status(),
                if unavailable {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::BAD_GATEWAY
                }
            );
            let body = e.body(a, 8080);
            assert_clean(&body);
            assert!(body.contains(a), "{body}");
            assert!(seen.insert(body.clone()), "distinct texts: {body}");
        }
        assert!(
            ForwardError::PortClosed
                .body(a, 8080)
                .contains("nothing listens on port 8080")
        );
        let request = [
            RequestError::DuplicateTarget,
            RequestError::DuplicatePort,
            RequestError::BadPort,
            RequestError::PortMismatch {
                header: 1,
                connect: 2,
            },
        ];
        for e in request {
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            let body = e.body(Some(a), Some(b"x\ny\"z"));
            assert_clean(&body);
            if e != RequestError::DuplicateTarget {
                assert!(body.contains(a), "{body}");
            }
        }
        assert_eq!(
            RequestError::BadPort.body(Some(a), Some(b"0")),
            "actor team-a/agent-7: ate-target-port \"0\" is not a port number (1-65535)"
        );
    }
}
