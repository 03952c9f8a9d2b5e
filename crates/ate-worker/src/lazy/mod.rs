//! Lazy memory restore, the worker's side: [`watch`] starts the page source (crate
//! `ate-page-source`, `ate page-source`) and is the worker's handle on it, which holds a copy of
//! every userfaultfd so a dead page source leaves faults blocked rather than zero-filled.

pub mod watch;

pub use watch::{Outcome, PageSource, SOURCE_DIED, Tracking};
