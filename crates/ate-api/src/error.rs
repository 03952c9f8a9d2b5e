//! Mapping of store and node errors onto gRPC statuses.

use ate_core::{NO_ROOM_MESSAGE, ValidationError};
use ate_store::StoreError;
use tonic::Status;

pub fn invalid(err: ValidationError) -> Status {
    Status::invalid_argument(err.to_string())
}

pub fn store(err: StoreError) -> Status {
    match err {
        StoreError::NotFound(m) => Status::not_found(m),
        StoreError::AlreadyExists(m) => Status::already_exists(m),
        StoreError::FailedPrecondition(m) => Status::failed_precondition(m),
        e @ StoreError::StateConflict { .. } => Status::failed_precondition(e.to_string()),
        StoreError::NoRoom { .. } => Status::resource_exhausted(NO_ROOM_MESSAGE),
        // A database that does not answer is a transient condition: the router parks on Unavailable.
        StoreError::Database(m) => Status::unavailable(format!("store unavailable: {m}")),
    }
}
