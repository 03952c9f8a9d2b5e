//! The restore-fidelity decision of the resume workflow (spec: resume-actor, "Choosing what to restore").

use crate::state::Fidelity;

/// What the api asks the node to do for a resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestorePlan {
    /// No usable generation: cold boot the template's containers.
    Run,
    /// Restore the chosen generation at this fidelity.
    Restore(Fidelity),
}

/// Facts about the newest usable generation that the decision needs.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotFacts<'a> {
    pub fidelity: Fidelity,
    /// Template the generation was captured under (`ns/name`).
    pub template: &'a str,
}

/// Newest usable generation → Restore; captured under another template → VOLUMES; else the
/// snapshot's own fidelity. Never lower for want of a capability: the scheduler places an actor
/// only on a worker that can restore everything its generation holds (`crate::capability`), and
/// parks it (ResourceExhausted) when there is none, so memory is never dropped by placement.
pub fn decide(snapshot: Option<SnapshotFacts<'_>>, actor_template: &str) -> RestorePlan {
    let Some(snap) = snapshot else {
        return RestorePlan::Run;
    };
    if snap.template != actor_template {
        return RestorePlan::Restore(Fidelity::Volumes);
    }
    RestorePlan::Restore(snap.fidelity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_tree() {
        let mem = SnapshotFacts {
            fidelity: Fidelity::Memory,
            template: "ns/t",
        };
        assert_eq!(decide(None, "ns/t"), RestorePlan::Run);
        assert_eq!(
            decide(Some(mem), "ns/other"),
            RestorePlan::Restore(Fidelity::Volumes)
        );
        // A memory snapshot restores at MEMORY: never lowered to ROOTFS.
        assert_eq!(
            decide(Some(mem), "ns/t"),
            RestorePlan::Restore(Fidelity::Memory)
        );
        let vol = SnapshotFacts {
            fidelity: Fidelity::Volumes,
            template: "ns/t",
        };
        assert_eq!(
            decide(Some(vol), "ns/t"),
            RestorePlan::Restore(Fidelity::Volumes)
        );
    }
}
