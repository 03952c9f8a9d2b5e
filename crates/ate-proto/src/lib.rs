//! Generated code for `proto/ate/v1` and conversions between wire messages and ate-core types.

// Library and product code never unwraps (tests may): errors go to the caller.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("ate.v1");
}

mod convert;
pub mod damage;
pub mod exec_relay;
pub mod request_id;
pub use convert::*;
