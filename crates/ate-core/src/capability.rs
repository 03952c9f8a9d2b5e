//! Restore capabilities: what a worker can restore, and what a generation needs to be restored
//! with everything it holds (the spec's scheduler filter: a worker must "still restore its
//! runtime (for a memory snapshot)").
//!
//! A capability is a string `<kind>:<value>`, so new kinds (a CRIU feature, a kernel, another
//! runtime) need no schema or wire change: workers advertise a list, each generation records the
//! list a restore of it needs, and the scheduler places the actor only on a worker that offers
//! every one. An actor whose newest generation needs something no worker offers is not placed
//! (ResourceExhausted naming what is missing, so the router parks), never restored at a lower
//! fidelity than it was captured at.
//!
//! Kinds today:
//! - `memory:criu` — CRIU ≥ 4.2 is there: memory images can be dumped and restored. Needed by
//!   every MEMORY generation.
//! - `memory:lazy` — memory can also come back lazily (userfaultfd page source). Advertised only;
//!   no generation needs it (a worker without it restores eagerly).
//! - `userns:off` / `userns:on` — whether the worker runs actors in their own user namespace. A
//!   memory image holds the uids and namespaces it was dumped with, so a MEMORY generation needs
//!   the mode of the worker that captured it.

use crate::state::Fidelity;

/// CRIU memory dumps and restores.
pub const MEMORY_CRIU: &str = "memory:criu";
/// Lazy memory restores (userfaultfd).
pub const MEMORY_LAZY: &str = "memory:lazy";
/// Actors run without a user namespace of their own.
pub const USERNS_OFF: &str = "userns:off";
/// Actors run in a user namespace of their own.
pub const USERNS_ON: &str = "userns:on";

/// The kind of a capability (`memory` of `memory:criu`).
pub fn kind(capability: &str) -> &str {
    capability.split_once(':').map_or(capability, |(k, _)| k)
}

/// Capabilities of a worker registered without a list (before workers advertised one): derived
/// from its memory flag, in the user-namespace mode every worker had then (off).
pub fn legacy_worker(can_restore_memory: bool) -> Vec<String> {
    let mut caps = Vec::new();
    if can_restore_memory {
        caps.push(MEMORY_CRIU.to_string());
    }
    caps.push(USERNS_OFF.to_string());
    caps
}

/// What a worker offers: its advertised list, or for a worker that advertised none,
/// [`legacy_worker`].
pub fn offered(advertised: &[String], can_restore_memory: bool) -> Vec<String> {
    if advertised.is_empty() {
        legacy_worker(can_restore_memory)
    } else {
        advertised.to_vec()
    }
}

/// What restoring a generation of `fidelity` needs, given what the worker that captured it
/// offered: a MEMORY generation needs CRIU and the captor's user-namespace mode; ROOTFS and
/// VOLUMES generations are files and restore anywhere.
pub fn required_by_generation(fidelity: Fidelity, captured_by: &[String]) -> Vec<String> {
    if fidelity != Fidelity::Memory {
        return Vec::new();
    }
    let mut req = vec![MEMORY_CRIU.to_string()];
    req.extend(
        captured_by
            .iter()
            .filter(|c| kind(c) == kind(USERNS_OFF))
            .cloned(),
    );
    req
}

/// What a generation recorded without a list needs (written before generations recorded one):
/// a MEMORY generation needs CRIU; its user-namespace mode is unknown, and every worker then ran
/// without one, so none is required.
pub fn legacy_generation(fidelity: Fidelity) -> Vec<String> {
    required_by_generation(fidelity, &[])
}

/// What a generation needs: its recorded list, or for one recorded without,
/// [`legacy_generation`].
pub fn required(recorded: &[String], fidelity: Fidelity) -> Vec<String> {
    if recorded.is_empty() {
        legacy_generation(fidelity)
    } else {
        recorded.to_vec()
    }
}

/// The capabilities of `required` that `offered` lacks, in order.
pub fn missing<'a>(required: &'a [String], offered: &[String]) -> Vec<&'a str> {
    required
        .iter()
        .filter(|r| !offered.iter().any(|o| o == *r))
        .map(String::as_str)
        .collect()
}

/// A capability is `<kind>:<value>`, both non-empty, in `[a-z0-9.-]`.
pub fn is_valid(capability: &str) -> bool {
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    };
    capability
        .split_once(':')
        .is_some_and(|(k, v)| ok(k) && ok(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn memory_generations_need_criu_and_the_captors_userns_mode() {
        let captor = caps(&[MEMORY_CRIU, MEMORY_LAZY, USERNS_ON]);
        assert_eq!(
            required_by_generation(Fidelity::Memory, &captor),
            caps(&[MEMORY_CRIU, USERNS_ON])
        );
        assert!(required_by_generation(Fidelity::Rootfs, &captor).is_empty());
        assert!(required_by_generation(Fidelity::Volumes, &captor).is_empty());
        assert_eq!(legacy_generation(Fidelity::Memory), caps(&[MEMORY_CRIU]));
        assert_eq!(required(&[], Fidelity::Memory), caps(&[MEMORY_CRIU]));
        assert_eq!(
            required(&caps(&[MEMORY_CRIU, USERNS_OFF]), Fidelity::Memory),
            caps(&[MEMORY_CRIU, USERNS_OFF])
        );
    }

    #[test]
    fn missing_and_legacy_workers() {
        let need = caps(&[MEMORY_CRIU, USERNS_ON]);
        assert_eq!(
            missing(&need, &caps(&[MEMORY_CRIU, USERNS_OFF])),
            vec![USERNS_ON]
        );
        assert_eq!(
            missing(&need, &caps(&[USERNS_OFF])),
            vec![MEMORY_CRIU, USERNS_ON]
        );
        assert!(missing(&need, &caps(&[USERNS_ON, MEMORY_CRIU, MEMORY_LAZY])).is_empty());
        assert_eq!(offered(&[], true), caps(&[MEMORY_CRIU, USERNS_OFF]));
        assert_eq!(offered(&[], false), caps(&[USERNS_OFF]));
        assert_eq!(offered(&caps(&[USERNS_ON]), true), caps(&[USERNS_ON]));
    }

    #[test]
    fn validity() {
        assert!(is_valid(MEMORY_CRIU) && is_valid("criu:4.2") && is_valid("kernel:6.18"));
        assert!(!is_valid("memory") && !is_valid(":x") && !is_valid("a:") && !is_valid("A:b"));
    }
}
