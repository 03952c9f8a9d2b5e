//! What a client sees when a request cannot be routed: the spec's error mapping (Envoy column).

use std::sync::Arc;

use ate_core::{CRASHED_PREREQUISITE, NO_ROOM_MESSAGE};
use http::StatusCode;
use tonic::Code;

/// Why the router could not find (or wake) the actor of a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The api has no such actor.
    #[error("actor not found")]
    NotFound,
    /// ResumeActor refused a CRASHED actor (`AssignWorker prerequisite not met`).
    #[error("actor crashed: {0}")]
    Crashed(Arc<str>),
    /// The budget was spent and no worker had room.
    #[error("{NO_ROOM_MESSAGE}")]
    NoRoom,
    /// The budget was spent without an answer from the api.
    #[error("api unavailable")]
    ApiUnavailable,
    /// FailedPrecondition (transient state) or Aborted outlasted the retries.
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

/// How one failed ResumeActor attempt is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Try again after a backoff; `parks` says whether waiting takes a parking place.
    Retry {
        parks: bool,
        if_exhausted: ResolveError,
    },
    /// Answer at once.
    Fail(ResolveError),
}

/// The spec's table "What the router parks, and what it does not". With parking off
/// (`--parked-request-max=0`) only Aborted is retried.
pub fn classify(status: &tonic::Status, parking: bool) -> Disposition {
    let message = || Arc::<str>::from(status.message());
    let park = |if_exhausted: ResolveError| {
        if parking {
            Disposition::Retry {
                parks: true,
                if_exhausted,
            }
        } else {
            Disposition::Fail(if_exhausted)
        }
    };
    match status.code() {
        Code::NotFound => Disposition::Fail(ResolveError::NotFound),
        Code::FailedPrecondition if status.message().contains(CRASHED_PREREQUISITE) => {
            Disposition::Fail(ResolveError::Crashed(message()))
        }
        Code::ResourceExhausted => park(ResolveError::NoRoom),
        Code::Unavailable => park(ResolveError::ApiUnavailable),
        Code::FailedPrecondition => park(ResolveError::Busy(message())),
        Code::Aborted => Disposition::Retry {
            parks: parking,
            if_exhausted: ResolveError::Busy(message()),
        },
        Code::DeadlineExceeded => Disposition::Fail(ResolveError::DeadlineExceeded),
        Code::PermissionDenied => Disposition::Fail(ResolveError::PermissionDenied),
        Code::Unauthenticated => Disposition::Fail(ResolveError::Unauthenticated),
        _ => Disposition::Fail(ResolveError::Internal(
            format!("{:?}: {}", status.code(), status.message()).into(),
        )),
    }
}

impl ResolveError {
    pub fn status(&self) -> StatusCode {
        match self {
            ResolveError::NotFound => StatusCode::NOT_FOUND,
            ResolveError::Crashed(_)
            | ResolveError::NoRoom
            | ResolveError::ApiUnavailable
            | ResolveError::Busy(_)
            | ResolveError::AtCapacity => StatusCode::SERVICE_UNAVAILABLE,
            ResolveError::DecisionTimeout | ResolveError::DeadlineExceeded => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ResolveError::PermissionDenied => StatusCode::FORBIDDEN,
            ResolveError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ResolveError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The response body; `actor` is `<atespace>/<name>`.
    pub fn body(&self, actor: &str) -> String {
        match self {
            ResolveError::NotFound => format!("actor {actor} not found"),
            ResolveError::Crashed(m) | ResolveError::Busy(m) => {
                format!("actor {actor} unavailable: {m}")
            }
            ResolveError::NoRoom => format!("actor {actor} unavailable: {NO_ROOM_MESSAGE}"),
            ResolveError::ApiUnavailable => format!("actor {actor} unavailable"),
            ResolveError::AtCapacity => {
                format!("actor \"{actor}\" unavailable: router at capacity")
            }
            // Envoy's decision timeout: 504 with an empty body.
            ResolveError::DecisionTimeout => String::new(),
            ResolveError::DeadlineExceeded => {
                format!("actor {actor} unavailable: deadline exceeded")
            }
            ResolveError::PermissionDenied => "permission denied".to_string(),
            ResolveError::Unauthenticated => "unauthenticated".to_string(),
            ResolveError::Internal(_) => "internal error".to_string(),
        }
    }
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

    #[test]
    fn mapping_table() {
        let a = "team-a/agent-7";
        let cases = [
            (
                Status::not_found("x"),
                404,
                "actor team-a/agent-7 not found",
            ),
            (
                Status::deadline_exceeded("x"),
                504,
                "actor team-a/agent-7 unavailable: deadline exceeded",
            ),
            (Status::permission_denied("x"), 403, "permission denied"),
            (Status::unauthenticated("x"), 401, "unauthenticated"),
            (Status::internal("secret db dsn"), 500, "internal error"),
            (Status::unknown("secret"), 500, "internal error"),
            (Status::invalid_argument("secret"), 500, "internal error"),
            (
                Status::failed_precondition(
                    "resume: AssignWorker prerequisite not met: state CRASHED",
                ),
                503,
                "actor team-a/agent-7 unavailable: resume: AssignWorker prerequisite not met: state CRASHED",
            ),
        ];
        for (status, code, body) in cases {
            let e = fail(status);
            assert_eq!(e.status().as_u16(), code, "{e:?}");
            assert_eq!(e.body(a), body);
        }
    }

    #[test]
    fn parked_results() {
        for s in [
            Status::resource_exhausted(NO_ROOM_MESSAGE),
            Status::unavailable("x"),
            Status::failed_precondition("actor is RESUMING"),
            Status::aborted("another resume"),
        ] {
            assert!(matches!(
                classify(&s, true),
                Disposition::Retry { parks: true, .. }
            ));
        }
        // Parking off: only Aborted is retried, without a parking place.
        assert!(matches!(
            classify(&Status::aborted("x"), false),
            Disposition::Retry { parks: false, .. }
        ));
        assert_eq!(
            classify(&Status::resource_exhausted("x"), false),
            Disposition::Fail(ResolveError::NoRoom)
        );
        assert_eq!(
            classify(&Status::unavailable("x"), false),
            Disposition::Fail(ResolveError::ApiUnavailable)
        );
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
}
