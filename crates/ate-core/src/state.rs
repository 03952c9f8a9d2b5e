//! Actor lifecycle states, snapshot fidelity, durable-copy status and suspend modes.
//!
//! Each enum has a stable text form (stored in SQL, printed by the CLI) and a wire number that
//! equals the protobuf enum value in `proto/ate/v1/types.proto`.

use serde::{Deserialize, Serialize};

macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $num:literal, $text:literal;)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name { $($variant),+ }

        impl $name {
            /// Stable text form (SQL and CLI).
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
            /// Parses the text form.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some(Self::$variant),)+ _ => None }
            }
            /// Protobuf enum number.
            pub fn wire(self) -> i32 {
                match self { $(Self::$variant => $num),+ }
            }
            /// From a protobuf enum number (0 and unknown numbers give `None`).
            pub fn from_wire(n: i32) -> Option<Self> {
                match n { $($num => Some(Self::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(
    /// Lifecycle of an actor.
    ActorState {
        Suspended = 1, "ACTOR_STATE_SUSPENDED";
        Resuming = 2, "ACTOR_STATE_RESUMING";
        Running = 3, "ACTOR_STATE_RUNNING";
        Suspending = 4, "ACTOR_STATE_SUSPENDING";
        Crashed = 5, "ACTOR_STATE_CRASHED";
    }
);

text_enum!(
    /// What a snapshot generation preserves.
    Fidelity {
        Memory = 1, "FIDELITY_MEMORY";
        Rootfs = 2, "FIDELITY_ROOTFS";
        Volumes = 3, "FIDELITY_VOLUMES";
    }
);

text_enum!(
    /// State of a generation's durable copy in the object store.
    DurableStatus {
        Pending = 1, "DURABLE_STATUS_PENDING";
        Completed = 2, "DURABLE_STATUS_COMPLETED";
        Failed = 3, "DURABLE_STATUS_FAILED";
    }
);

text_enum!(
    /// When SuspendActor returns.
    SuspendMode {
        Async = 1, "SUSPEND_MODE_ASYNC";
        Durable = 2, "SUSPEND_MODE_DURABLE";
    }
);

impl ActorState {
    /// Short form for tables (`SUSPENDED`, `RUNNING`, …).
    pub fn short(self) -> &'static str {
        &self.as_str()["ACTOR_STATE_".len()..]
    }
}

impl Fidelity {
    /// Short form used in template YAML (`memory`, `rootfs`, `volumes`).
    pub fn short(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Rootfs => "rootfs",
            Self::Volumes => "volumes",
        }
    }

    /// Accepts the short form (any case) or the full enum name.
    pub fn parse_any(text: &str) -> Option<Self> {
        Self::parse(text).or_else(|| match text.to_ascii_lowercase().as_str() {
            "memory" => Some(Self::Memory),
            "rootfs" => Some(Self::Rootfs),
            "volumes" => Some(Self::Volumes),
            _ => None,
        })
    }

    /// Rank: higher preserves more.
    pub fn rank(self) -> u8 {
        match self {
            Self::Memory => 3,
            Self::Rootfs => 2,
            Self::Volumes => 1,
        }
    }

    /// The lower of two fidelities.
    pub fn min(self, other: Self) -> Self {
        if self.rank() <= other.rank() {
            self
        } else {
            other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for s in [
            ActorState::Suspended,
            ActorState::Resuming,
            ActorState::Running,
            ActorState::Suspending,
            ActorState::Crashed,
        ] {
            assert_eq!(ActorState::parse(s.as_str()), Some(s));
            assert_eq!(ActorState::from_wire(s.wire()), Some(s));
        }
        assert_eq!(ActorState::Running.short(), "RUNNING");
        assert_eq!(ActorState::from_wire(0), None);
        assert_eq!(Fidelity::parse_any("Memory"), Some(Fidelity::Memory));
        assert_eq!(
            Fidelity::parse_any("FIDELITY_ROOTFS"),
            Some(Fidelity::Rootfs)
        );
        assert_eq!(Fidelity::Memory.min(Fidelity::Volumes), Fidelity::Volumes);
    }
}
