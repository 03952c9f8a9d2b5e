//! Vocabulary shared by every Agent Substrate component: actor references, lifecycle states,
//! snapshot fidelity, the template spec and its validation, label selectors and the restore
//! decision. This crate performs no I/O.

pub mod backoff;
pub mod clock;
pub mod duration;
pub mod handoff;
pub mod log_line;
pub mod names;
pub mod request_id;
pub mod restore;
pub mod selector;
pub mod state;
pub mod template;

pub use names::{ActorRef, ValidationError, validate_label};
pub use state::{ActorState, DurableStatus, Fidelity, SuspendMode};
pub use template::{Document, TemplateSpec};

/// Message of ResourceExhausted when no worker can take an actor (spec: request-parking).
pub const NO_ROOM_MESSAGE: &str = "no worker has room for the actor";
/// Text contained in the FailedPrecondition returned when resuming a CRASHED actor.
pub const CRASHED_PREREQUISITE: &str = "AssignWorker prerequisite not met";
/// Header naming the actor on every request to the router and to atunnel.
pub const TARGET_ACTOR_HEADER: &str = "ate-target-actor";
/// Header naming the actor's port on a tunnel stream.
pub const TARGET_PORT_HEADER: &str = "ate-target-port";
/// Header carrying the activation's fencing token on a tunnel stream (router → atunnel): atunnel
/// serves only the copy of the actor that holds exactly this token.
pub const ACTIVATION_HEADER: &str = "ate-activation";
/// Header (and gRPC metadata key) carrying a request's id through every component.
pub use request_id::REQUEST_ID_HEADER;
/// Default api gRPC address.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7443";
