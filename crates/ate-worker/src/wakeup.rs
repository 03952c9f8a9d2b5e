//! Prompt wake-ups for actors that use little of their CPU share (issue 38, item 4: a spinning
//! neighbour must not stretch another actor's tail latency).
//!
//! An actor's cgroup weight is its template's `cpu` (`crate::cpu`), which is its share of a busy
//! machine. Under EEVDF the weight also decides how soon a waking thread runs beside one that
//! spins: a light actor's virtual deadline lies far ahead, so a 250m counter beside a hog
//! booking 2 cores (8× its weight) waits out the hog's slice, often to the next tick, at every
//! wake-up of a request. So each CPU pass weighs an actor that used less than half its share
//! over the last window ([`boosted`]) at [`BOOST`] times the weight of the whole machine, above
//! any actor that can be busy there; one that used more goes back to its template's weight.
//!
//! This never gives an actor more CPU than it booked: its CFS quota (the template's `cpu`) caps
//! it whatever it weighs, and the next pass (2 s) takes the boost from an actor that got busy.
//! A template that books more than the machine weighs as the machine: no actor can use more.
//! Measured (`ate bench noisy`, docs/benchmarks.md "Noisy neighbours"; the hog booking the whole
//! machine): the quiet actor weighing 1/8 (its template's), 1×, 4× and 128× the hog's gave its
//! p99 under the hog 2.2–5.3×, 1.7–2.1×, 1.1–1.8× and 0.7–3.1× its quiet value; 4× is [`BOOST`].

/// The boosted weight, in multiples of the machine's weight (`crate::cpu::shares` of all its
/// cores).
pub const BOOST: u64 = 4;

/// Whether an actor whose template books `share_millis` and used `used_millis` over the last
/// window (None: not measured yet, an actor that just started, which starts idle) is boosted.
pub fn boosted(used_millis: Option<u32>, share_millis: u32, physical_millis: u32) -> bool {
    let share = share_millis.min(physical_millis).max(1);
    used_millis.is_none_or(|used| u64::from(used) * 2 < u64::from(share))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_under_half_their_share_are_boosted() {
        // The demo counter (250m) answering now and then.
        assert!(boosted(Some(3), 250, 2000));
        // Not measured yet: an actor starts idle.
        assert!(boosted(None, 250, 2000));
        // Using half its share or more: its template's weight.
        assert!(!boosted(Some(250), 250, 2000));
        assert!(!boosted(Some(125), 250, 2000));
        assert!(boosted(Some(124), 250, 2000));
        // A hog booking more than the machine has: its share is the machine's.
        assert!(!boosted(Some(1990), 4000, 2000));
        assert!(!boosted(Some(1990), 2000, 2000));
        // No share known (0): any use counts as more than half of it.
        assert!(!boosted(Some(1), 0, 2000));
    }
}
