//! Vocabulary shared by every Agent Substrate component: actor references, lifecycle states,
//! snapshot fidelity, the template spec and its validation, label selectors and the restore
//! decision. This crate performs no I/O.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backoff;
pub mod capability;
pub mod clock;
pub mod duration;
pub mod handoff;
pub mod log_line;
pub mod names;
pub mod platform;
pub mod request_id;
pub mod restore;
pub mod selector;
pub mod state;
pub mod template;
pub mod tunnel;

pub use names::{ActorRef, TemplateRef, ValidationError, validate_label};
pub use state::{ActorState, DurableStatus, Fidelity, SuspendMode};
pub use template::{Document, TemplateSpec, validate_callers_allow};

/// Message of ResourceExhausted when no worker can take an actor (spec: request-parking).
pub const NO_ROOM_MESSAGE: &str = "no worker has room for the actor";
/// Text contained in the ResourceExhausted returned when an actor's atespace is at one of its
/// quotas: not a condition waiting clears soon, so the router answers at once (429).
pub const QUOTA_EXCEEDED: &str = "has no quota left for the actor";

/// The message of a refusal for quota: `atespace "team-a" has no quota left for the actor:
/// runningActors 2 of 2 in use` (cpu in millicores as `500m`, memory as `128Mi`).
pub fn quota_exceeded_message(atespace: &str, quota: &str, limit: u64, used: u64) -> String {
    let amount = |n: u64| match quota {
        "cpu" => template::format_cpu(u32::try_from(n).unwrap_or(u32::MAX)),
        "memory" => template::format_memory(n),
        _ => n.to_string(),
    };
    format!(
        "atespace \"{atespace}\" {QUOTA_EXCEEDED}: {quota} {} of {} in use",
        amount(used),
        amount(limit)
    )
}

/// Text contained in the FailedPrecondition returned when resuming a CRASHED actor.
pub const CRASHED_PREREQUISITE: &str = "AssignWorker prerequisite not met";
/// Header (and gRPC metadata key) carrying a request's id through every component.
pub use request_id::REQUEST_ID_HEADER;
/// The tunnel protocol's headers under the names the rest of the code uses (see [`tunnel`]).
pub use tunnel::{
    ACTIVATION as ACTIVATION_HEADER, TARGET_ACTOR as TARGET_ACTOR_HEADER,
    TARGET_PORT as TARGET_PORT_HEADER,
};
/// Default api gRPC address.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7443";
