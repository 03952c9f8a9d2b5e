//! The api's ResumeActor errors as [`ResolveError`]s, and upstream reasons made fit for a client.

use ate_core::{CRASHED_PREREQUISITE, QUOTA_EXCEEDED};
use tonic::Code;

use super::ResolveError;

/// The longest upstream reason shown to a client, in characters.
pub const REASON_MAX: usize = 200;

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
    let message = status.message();
    match status.code() {
        Code::NotFound => Disposition::Fail(not_found(message)),
        Code::FailedPrecondition if message.contains(CRASHED_PREREQUISITE) => {
            Disposition::Fail(ResolveError::Crashed(crash_reason(message).into()))
        }
        // An atespace at its quota: waiting frees room only when one of its own actors stops,
        // so the client hears it at once (429) instead of after the parking budget.
        Code::ResourceExhausted if message.contains(QUOTA_EXCEEDED) => {
            Disposition::Fail(ResolveError::OverQuota(short_reason(message).into()))
        }
        Code::ResourceExhausted => park(ResolveError::NoRoom),
        Code::Unavailable => park(ResolveError::ApiUnavailable),
        Code::FailedPrecondition => park(ResolveError::Busy(busy_reason(message).into())),
        Code::Aborted => Disposition::Retry {
            parks: parking,
            if_exhausted: ResolveError::Busy("another operation on it is still running".into()),
        },
        Code::DeadlineExceeded => Disposition::Fail(ResolveError::DeadlineExceeded),
        Code::PermissionDenied => Disposition::Fail(ResolveError::PermissionDenied),
        Code::Unauthenticated => Disposition::Fail(ResolveError::Unauthenticated),
        _ => Disposition::Fail(ResolveError::Internal(
            format!("{:?}: {}", status.code(), message).into(),
        )),
    }
}

/// NotFound names the actor itself (`actor "a/b" not found`, or an atespace), or something the
/// actor needs: its template, a snapshot generation (the store's messages name the kind first).
fn not_found(message: &str) -> ResolveError {
    let needed = ["template ", "snapshot ", "worker "]
        .iter()
        .any(|kind| message.starts_with(kind));
    if needed {
        ResolveError::Missing(short_reason(message).into())
    } else {
        ResolveError::NotFound
    }
}

/// The actor's last error from the api's CRASHED message, which puts it in parentheses after
/// the state: `actor a/b is ACTOR_STATE_CRASHED (<last error>): AssignWorker prerequisite not
/// met; …`. Empty when the message has another shape.
fn crash_reason(message: &str) -> String {
    const MARK: &str = "ACTOR_STATE_CRASHED (";
    let before = message.split(CRASHED_PREREQUISITE).next().unwrap_or("");
    let Some(at) = before.find(MARK) else {
        return String::new();
    };
    let inner = before[at + MARK.len()..].trim_end();
    let inner = inner.strip_suffix(':').unwrap_or(inner).trim_end();
    short_reason(inner.strip_suffix(')').unwrap_or(inner))
}

/// A transient FailedPrecondition: the state the actor is in (`actor a/b is
/// ACTOR_STATE_SUSPENDING; …`) in plain words, else the cleaned message.
fn busy_reason(message: &str) -> String {
    if let Some(state) = state_word(message) {
        return format!("it is still {state}");
    }
    let reason = short_reason(message);
    if reason.is_empty() {
        "an operation on it is still running".to_string()
    } else {
        reason
    }
}

/// The first `ACTOR_STATE_<X>` in `text` as a lowercase word (`suspending`).
fn state_word(text: &str) -> Option<String> {
    const PREFIX: &str = "ACTOR_STATE_";
    let at = text.find(PREFIX)? + PREFIX.len();
    let word: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_uppercase() || *c == '_')
        .map(|c| {
            if c == '_' {
                ' '
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    let word = word.trim().to_string();
    (!word.is_empty()).then_some(word)
}

/// Internal names that may appear inside an upstream reason, and the words shown instead.
const PLAIN_WORDS: [(&str, &str); 16] = [
    ("AssignWorker", "worker assignment"),
    ("ResumeActor", "resume"),
    ("RevertActor", "revert"),
    ("SuspendActor", "suspend"),
    ("DeleteActor", "delete"),
    ("CreateActor", "create"),
    ("RestoreWorkload", "restore"),
    ("ReportActorExit", "exit report"),
    ("FailedPrecondition", "failed precondition"),
    ("ResourceExhausted", "resource exhausted"),
    ("DeadlineExceeded", "deadline exceeded"),
    ("PermissionDenied", "permission denied"),
    ("InvalidArgument", "invalid argument"),
    ("AlreadyExists", "already exists"),
    ("Unauthenticated", "unauthenticated"),
    ("Unimplemented", "unimplemented"),
];

/// Where a dump of a gRPC status or other debug output starts: the reason is cut there.
const DUMP_MARKERS: [&str; 6] = [
    "Status {", "status: ", "code: ", "code:", "tonic", "metadata",
];

/// An upstream reason as a client may see it: its first line, without internal names
/// (`ACTOR_STATE_X` becomes `x`, RPC and gRPC code names become words, a status dump is cut
/// off), control characters replaced, and at most [`REASON_MAX`] characters (`…` marks a cut).
pub fn short_reason(text: &str) -> String {
    let line = text.split(['\n', '\r']).next().unwrap_or("");
    let mut out = String::with_capacity(line.len().min(REASON_MAX * 2));
    let mut rest = line;
    while let Some(at) = rest.find("ACTOR_STATE_") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "ACTOR_STATE_".len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(after.len());
        out.push_str(&after[..end].to_ascii_lowercase().replace('_', " "));
        rest = &after[end..];
    }
    out.push_str(rest);
    for (name, plain) in PLAIN_WORDS {
        if out.contains(name) {
            out = out.replace(name, plain);
        }
    }
    if let Some(cut) = DUMP_MARKERS.iter().filter_map(|m| out.find(m)).min() {
        out.truncate(cut);
    }
    let cleaned: String = out
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let trimmed = cleaned.trim_end_matches(|c: char| c.is_whitespace() || ":;,(-".contains(c));
    let trimmed = trimmed.trim_start();
    if trimmed.chars().count() <= REASON_MAX {
        return trimmed.to_string();
    }
    let mut cut: String = trimmed.chars().take(REASON_MAX - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use ate_core::NO_ROOM_MESSAGE;
    use tonic::Status;

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
    fn an_atespace_over_its_quota_is_answered_at_once() {
        let why = ate_core::quota_exceeded_message("team-a", "memory", 256 << 20, 256 << 20);
        let e = match classify(&Status::resource_exhausted(why), true) {
            Disposition::Fail(e) => e,
            other => panic!("parked: {other:?}"),
        };
        assert_eq!(e.status().as_u16(), 429);
        assert_eq!(
            e.body("team-a/x"),
            "actor team-a/x unavailable: atespace \"team-a\" has no quota left for the actor: memory 256Mi of 256Mi in use; suspend another of the atespace's actors, or ask an admin to raise spec.quota of atespace team-a"
        );
    }
}
