//! `ate bench`: the measurements of the ate-bench crate, and `faults` (`faults/`), which starts a
//! system of its own.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCmd {
    #[command(flatten)]
    Measure(ate_bench::BenchCmd),
    /// A Jepsen-style fault suite on a system of its own (the bench starts and stops its own
    /// `ate up`): kills and outages of each component, the store and the snapshot disk under a
    /// client load; checks that no actor loses state or runs twice, slots add up and nothing is
    /// orphaned.
    Faults(ate_bench::faults::FaultsArgs),
}
