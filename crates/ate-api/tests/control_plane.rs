//! The control plane without sockets (issue 36): the real [`ate_api::Api`] over a real SQLite
//! store, its node calls answered in process by scripted nodes (`control_plane/fake_node.rs`),
//! each workflow's branches driven by calling the api's methods. No gRPC server, no TCP
//! listener. Concurrency is ordered with gates and `FakeNodes::wait_for`, never sleeps.
//!
//! Time: tokio's paused clock does not work over sqlx's SQLite. Its connections run on
//! threads of their own, and a paused runtime waiting for one jumps its clock to the next timer
//! (the pool's 30 s acquire timeout among them: "pool timed out"). So the branches that depend
//! on time run on real time, kept short: a node call timeout of 100 ms against a node that never
//! answers, one 200 ms suspend retry pause, a 1 ms heartbeat timeout for worker expiry (whose
//! wait is a condition loop on the store's wall clock).

#[path = "control_plane/fake_node.rs"]
mod fake_node;
#[path = "control_plane/fixture.rs"]
mod fixture;

#[path = "control_plane/fleet.rs"]
mod fleet;
#[path = "control_plane/lifecycle.rs"]
mod lifecycle;
#[path = "control_plane/resume.rs"]
mod resume;
#[path = "control_plane/suspend.rs"]
mod suspend;
