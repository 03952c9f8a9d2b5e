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

use serde_json::{Value, json};

/// The only capability an actor keeps: the demo workloads (and most HTTP servers) run as root
/// in the container and bind port 80. Root in the container owns its rootfs upper dir, volumes
/// and `/tmp`, so it needs neither `CAP_DAC_OVERRIDE` nor `CAP_CHOWN`/`CAP_FOWNER` for them.
pub const CAPABILITIES: &[&str] = &["CAP_NET_BIND_SERVICE"];

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
/// [`CAPABILITIES`], or `None` if a name is not in the table below.
pub fn capability_mask() -> Option<u64> {
    CAPABILITIES
        .iter()
        .try_fold(0u64, |mask, name| Some(mask | 1 << capability_bit(name)?))
}

fn capability_bit(name: &str) -> Option<u32> {
    Some(match name {
        "CAP_CHOWN" => 0,
        "CAP_DAC_OVERRIDE" => 1,
        "CAP_FOWNER" => 3,
        "CAP_FSETID" => 4,
        "CAP_KILL" => 5,
        "CAP_SETGID" => 6,
        "CAP_SETUID" => 7,
        "CAP_SETPCAP" => 8,
        "CAP_NET_BIND_SERVICE" => 10,
        "CAP_NET_RAW" => 13,
        "CAP_SYS_CHROOT" => 18,
        "CAP_MKNOD" => 27,
        "CAP_AUDIT_WRITE" => 29,
        "CAP_SETFCAP" => 31,
        _ => return None,
    })
}

/// `process.capabilities`: bounding = effective = permitted; nothing inheritable or ambient
/// (the actor runs as uid 0, which keeps its permitted set across `execve` without ambient
/// capabilities; a non-root process it starts gets none).
pub fn capabilities() -> Value {
    let caps = json!(CAPABILITIES);
    json!({"bounding": caps, "effective": caps, "permitted": caps})
}

/// seccomp architectures for this build: the native ABI plus the compat ABIs a process could
/// switch to (`int 0x80`, x32), so the deny list holds on every entry point.
fn seccomp_architectures() -> Vec<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => vec!["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "x86" => vec!["SCMP_ARCH_X86"],
        "aarch64" => vec!["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
        _ => Vec::new(),
    }
}

/// `linux.seccomp`: allow by default; [`DENIED_SYSCALLS`] → EPERM; [`ENOSYS_SYSCALLS`] → ENOSYS;
/// `clone` with `CLONE_NEWUSER` → EPERM.
pub fn seccomp() -> Value {
    let mut profile = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": DENIED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
            {"names": ENOSYS_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                // flags are the first argument of clone on x86 and arm
                "args": [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}]
            }
        ]
    });
    let arches = seccomp_architectures();
    if !arches.is_empty() {
        profile["architectures"] = json!(arches);
    }
    profile
}

/// [`seccomp`] with `chroot` allowed: for an actor with sidecars, whose `ate-init` chroots each
/// into its rootfs (it needs CAP_SYS_CHROOT for that and drops it from every container it starts).
pub fn seccomp_allowing_chroot() -> Value {
    let mut profile = seccomp();
    if let Some(names) = profile
        .pointer_mut("/syscalls/0/names")
        .and_then(Value::as_array_mut)
    {
        names.retain(|n| n != "chroot");
    }
    profile
}

/// Writes the hardening into an OCI config built by `oci_config`: `process.capabilities`,
/// `process.noNewPrivileges`, `linux.seccomp`, `linux.maskedPaths`, `linux.readonlyPaths` and
/// `linux.resources.pids`. Fields already set are replaced (the pids limit only when unset).
pub fn apply(config: &mut Value) {
    if let Some(process) = config.get_mut("process").and_then(Value::as_object_mut) {
        process.insert("capabilities".into(), capabilities());
        process.insert("noNewPrivileges".into(), Value::Bool(true));
    }
    if let Some(linux) = config.get_mut("linux").and_then(Value::as_object_mut) {
        linux.insert("seccomp".into(), seccomp());
        linux.insert("maskedPaths".into(), json!(MASKED_PATHS));
        linux.insert("readonlyPaths".into(), json!(READONLY_PATHS));
        let resources = linux
            .entry("resources")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(resources) = resources {
            resources
                .entry("pids")
                .or_insert_with(|| json!({"limit": PIDS_LIMIT}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "process": {"args": ["/x"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}},
            "linux": {"resources": {"memory": {"limit": 1}}}
        })
    }

    #[test]
    fn apply_sets_every_field() {
        let mut c = base();
        apply(&mut c);
        assert_eq!(c["process"]["noNewPrivileges"], true);
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(
                c["process"]["capabilities"][set],
                json!(["CAP_NET_BIND_SERVICE"])
            );
        }
        assert!(c["process"]["capabilities"]["inheritable"].is_null());
        assert!(c["process"]["capabilities"]["ambient"].is_null());
        assert_eq!(c["process"]["args"], json!(["/x"]));
        assert_eq!(c["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], PIDS_LIMIT);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 1);
        let masked = c["linux"]["maskedPaths"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for p in ["/proc/kcore", "/proc/keys", "/sys/firmware", "/proc/scsi"] {
            assert!(masked.contains(&json!(p)), "{p} not masked");
        }
        let ro = c["linux"]["readonlyPaths"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for p in ["/proc/sys", "/proc/sysrq-trigger"] {
            assert!(ro.contains(&json!(p)), "{p} not read-only");
        }
    }

    #[test]
    fn seccomp_denies_the_dangerous_syscalls() {
        let s = seccomp();
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
        assert_eq!(capability_bit("CAP_NOPE"), None);
    }
}
