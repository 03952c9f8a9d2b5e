//! The security fields of every actor's OCI config: capabilities, no-new-privs, the seccomp
//! profile, masked and read-only `/proc`/`/sys` paths and a pids limit. Always on; no template
//! knob yet (a workload that needs one more capability would get a template field).
//!
//! Everything here survives a CRIU checkpoint/restore: CRIU dumps the seccomp filter (BPF),
//! `no_new_privs` and the capability sets of each task and installs them again at the end of the
//! restore; the masked/read-only paths are ordinary mounts in the container's mount namespace,
//! which runc recreates from this config before CRIU restores the processes. The `hardening`
//! test in `tests/hardening.rs` checks all of it on a cold start and after a memory restore.
//!
//! See docs/security.md for what this does and does not protect against.

use oci_spec::OciSpecError;
use oci_spec::runtime::{
    Arch, Capabilities, Capability, LinuxCapabilities, LinuxSeccomp, LinuxSeccompAction,
    LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscallBuilder,
};

use crate::error::{Result, SandboxError};

/// The only capability an actor keeps: the demo workloads (and most HTTP servers) run as root
/// in the container and bind port 80. Root in the container owns its rootfs upper dir, volumes
/// and `/tmp`, so it needs neither `CAP_DAC_OVERRIDE` nor `CAP_CHOWN`/`CAP_FOWNER` for them.
pub const CAPABILITIES: &[Capability] = &[Capability::NetBindService];

/// Upper bound on tasks (processes + threads) in one actor's cgroup: stops a fork bomb from
/// taking the host's pid space. The demo servers use one thread per connection.
pub const PIDS_LIMIT: i64 = 4096;

/// `clone` flag that creates a user namespace (`CLONE_NEWUSER`).
const CLONE_NEWUSER: u64 = 0x1000_0000;
const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// Syscalls refused with `EPERM` (a default-allow profile in the spirit of Docker's: kernel
/// surface an HTTP actor has no use for). Most already fail for lack of a capability; the
/// filter keeps them off even if a capability is added later, and shuts the ones that need
/// none (`bpf`, `userfaultfd`, `keyctl`, `perf_event_open`, `unshare`, `io_uring_*`, `ptrace`, …).
/// Names the kernel or libseccomp does not know on this architecture are skipped by runc.
pub const DENIED_SYSCALLS: &[&str] = &[
    // kernel code and boot
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "reboot",
    // mounts and namespaces (CLONE_NEWUSER through `clone` is a separate argument rule)
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    // swap, accounting, quotas, clocks, I/O ports
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_settime64",
    "clock_adjtime",
    "clock_adjtime64",
    "adjtimex",
    "iopl",
    "ioperm",
    // kernel facilities with a history of local privilege escalations
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "vm86",
    "vm86old",
    "_sysctl",
    "sysfs",
    "ustat",
    "syslog",
    "vhangup",
    "fanotify_init",
    // reading or writing other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "open_by_handle_at",
    "name_to_handle_at",
];

/// Syscalls answered `ENOSYS`: `clone3` passes its flags in memory a filter cannot read, so
/// (as Docker does) it is reported missing and libc falls back to `clone`, whose flags the
/// filter checks for `CLONE_NEWUSER`.
pub const ENOSYS_SYSCALLS: &[&str] = &["clone3"];

/// runc's default masked paths plus `/proc/interrupts` and `/sys/devices/virtual/powercap`
/// (RAPL energy counters: a power side channel), as current Docker masks them.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// runc's default read-only paths.
pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The capability bit mask `/proc/<pid>/status` shows (`CapEff`, `CapPrm`, `CapBnd`) for
/// [`CAPABILITIES`], or `None` if one is not in the table below.
pub fn capability_mask() -> Option<u64> {
    CAPABILITIES
        .iter()
        .try_fold(0u64, |mask, name| Some(mask | 1 << capability_bit(name)?))
}

fn capability_bit(cap: &Capability) -> Option<u32> {
    Some(match cap {
        Capability::Chown => 0,
        Capability::DacOverride => 1,
        Capability::Fowner => 3,
        Capability::Fsetid => 4,
        Capability::Kill => 5,
        Capability::Setgid => 6,
        Capability::Setuid => 7,
        Capability::Setpcap => 8,
        Capability::NetBindService => 10,
        Capability::NetRaw => 13,
        Capability::SysChroot => 18,
        Capability::Mknod => 27,
        Capability::AuditWrite => 29,
        Capability::Setfcap => 31,
        _ => return None,
    })
}

/// `process.capabilities`: bounding = effective = permitted = [`CAPABILITIES`] plus `extra`;
/// nothing inheritable or ambient (the actor runs as uid 0, which keeps its permitted set across
/// `execve` without ambient capabilities; a non-root process it starts gets none).
pub fn capabilities(extra: &[Capability]) -> LinuxCapabilities {
    let set: Capabilities = CAPABILITIES.iter().chain(extra).copied().collect();
    // Not the builder: it fills what is left unset with oci-spec's default capabilities
    // (CAP_AUDIT_WRITE, CAP_KILL, …), and inheritable/ambient must stay absent.
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(set.clone()))
        .set_effective(Some(set.clone()))
        .set_permitted(Some(set))
        .set_inheritable(None)
        .set_ambient(None);
    caps
}

/// seccomp architectures for this build: the native ABI plus the compat ABIs a process could
/// switch to (`int 0x80`, x32), so the deny list holds on every entry point.
fn seccomp_architectures() -> Vec<Arch> {
    match std::env::consts::ARCH {
        "x86_64" => vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32],
        "x86" => vec![Arch::ScmpArchX86],
        "aarch64" => vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm],
        _ => Vec::new(),
    }
}

/// `linux.seccomp`: allow by default; [`DENIED_SYSCALLS`] → EPERM; [`ENOSYS_SYSCALLS`] → ENOSYS;
/// `clone` with `CLONE_NEWUSER` → EPERM.
pub fn seccomp() -> Result<LinuxSeccomp> {
    seccomp_denying(DENIED_SYSCALLS.iter())
}

/// [`seccomp`] with `chroot` allowed: for an actor with sidecars, whose `ate-init` chroots each
/// into its rootfs (it needs CAP_SYS_CHROOT for that and drops it from every container it starts).
pub fn seccomp_allowing_chroot() -> Result<LinuxSeccomp> {
    seccomp_denying(DENIED_SYSCALLS.iter().filter(|n| **n != "chroot"))
}

fn seccomp_denying<'a>(denied: impl Iterator<Item = &'a &'static str>) -> Result<LinuxSeccomp> {
    let errno = |names: Vec<String>, errno: u32| {
        LinuxSyscallBuilder::default()
            .names(names)
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(errno)
    };
    let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    // flags are the first argument of clone on x86 and arm
    let new_user = LinuxSeccompArgBuilder::default()
        .index(0usize)
        .value(CLONE_NEWUSER)
        .value_two(CLONE_NEWUSER)
        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
        .build()
        .map_err(oci_error)?;
    let syscalls = vec![
        errno(denied.map(|n| n.to_string()).collect(), EPERM)
            .build()
            .map_err(oci_error)?,
        errno(names(ENOSYS_SYSCALLS), ENOSYS)
            .build()
            .map_err(oci_error)?,
        errno(names(&["clone"]), EPERM)
            .args(vec![new_user])
            .build()
            .map_err(oci_error)?,
    ];
    let mut profile = LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .syscalls(syscalls);
    let arches = seccomp_architectures();
    if !arches.is_empty() {
        profile = profile.architectures(arches);
    }
    profile.build().map_err(oci_error)
}

/// An `oci-spec` builder's error as a [`SandboxError`]. The builders here fail only for a field
/// oci-spec requires and the code left unset, so this is a bug, not a bad template.
pub(crate) fn oci_error(e: OciSpecError) -> SandboxError {
    SandboxError::Invalid(format!("OCI runtime config: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn capabilities_are_bounding_effective_and_permitted_only() {
        let caps = serde_json::to_value(capabilities(&[])).unwrap();
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(caps[set], json!(["CAP_NET_BIND_SERVICE"]));
        }
        assert!(caps["inheritable"].is_null());
        assert!(caps["ambient"].is_null());
        let caps = serde_json::to_value(capabilities(&[Capability::SysChroot])).unwrap();
        let effective = caps["effective"].as_array().cloned().unwrap_or_default();
        assert_eq!(effective.len(), 2);
        assert!(effective.contains(&json!("CAP_SYS_CHROOT")));
    }

    #[test]
    fn seccomp_denies_the_dangerous_syscalls() {
        let s = serde_json::to_value(seccomp().unwrap()).unwrap();
        let rules = s["syscalls"].as_array().cloned().unwrap_or_default();
        let eperm = &rules[0];
        assert_eq!(eperm["action"], "SCMP_ACT_ERRNO");
        assert_eq!(eperm["errnoRet"], 1);
        let names: Vec<&str> = eperm["names"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for n in [
            "kexec_load",
            "init_module",
            "finit_module",
            "delete_module",
            "mount",
            "umount2",
            "pivot_root",
            "swapon",
            "swapoff",
            "reboot",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "keyctl",
            "add_key",
            "request_key",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "open_by_handle_at",
            "name_to_handle_at",
            "unshare",
            "setns",
            "iopl",
            "ioperm",
            "acct",
            "settimeofday",
            "clock_settime",
            "quotactl",
        ] {
            assert!(names.contains(&n), "{n} not denied");
        }
        // No duplicates (libseccomp would accept them, but it hides mistakes).
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert_eq!(rules[1]["names"], json!(["clone3"]));
        assert_eq!(rules[1]["errnoRet"], 38);
        assert_eq!(rules[2]["names"], json!(["clone"]));
        assert_eq!(rules[2]["args"][0]["value"], 0x1000_0000u64);
        assert_eq!(rules[2]["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
        // Thread creation must stay allowed: clone and clone3 are not in the blanket deny.
        assert!(!names.contains(&"clone") && !names.contains(&"clone3"));
        if std::env::consts::ARCH == "x86_64" {
            assert_eq!(s["architectures"][0], "SCMP_ARCH_X86_64");
        }
    }

    #[test]
    fn capability_mask_matches_proc_status() {
        // CapEff of a process holding only CAP_NET_BIND_SERVICE reads 0000000000000400.
        assert_eq!(capability_mask(), Some(0x400));
        assert_eq!(capability_bit(&Capability::SysAdmin), None);
    }
}
