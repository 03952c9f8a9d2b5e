//! `GET /sandbox`: what the sandbox looks like from inside, for the hardening tests.
//!
//! One `key: value` line each:
//! - `NoNewPrivs`, `Seccomp`, `CapEff`, `CapPrm`, `CapBnd`, `CapAmb` from `/proc/self/status`;
//! - `syscall <name>: ok | errno N` for syscalls the worker's seccomp profile refuses, each called
//!   with arguments the kernel itself would reject (or that change nothing), so the errno shows
//!   whether the filter or the kernel answered: the filter says 1 (EPERM) or 38 (ENOSYS, clone3);
//! - `read <path>: N bytes | errno N` for masked paths (bound to /dev/null: 0 bytes);
//! - `write <path>: ok | errno N` for read-only paths (30 = EROFS).

use std::fs;
use std::io;

unsafe extern "C" {
    fn syscall(number: i64, ...) -> i64;
}

// x86_64 syscall numbers (the workloads are built for x86_64-unknown-linux-gnu only).
const SYS_PTRACE: i64 = 101;
const SYS_KEYCTL: i64 = 250;
const SYS_UNSHARE: i64 = 272;
const SYS_SETNS: i64 = 308;
const SYS_USERFAULTFD: i64 = 323;
const SYS_BPF: i64 = 321;
const SYS_IO_URING_SETUP: i64 = 425;
const SYS_CLONE: i64 = 56;
const SYS_CLONE3: i64 = 435;
const SYS_MOUNT: i64 = 165;

const CLONE_NEWUSER: i64 = 0x1000_0000;
const CLONE_THREAD: i64 = 0x0001_0000;

fn errno_of(ret: i64) -> String {
    if ret >= 0 {
        "ok".to_string()
    } else {
        match io::Error::last_os_error().raw_os_error() {
            Some(e) => format!("errno {e}"),
            None => "errno ?".to_string(),
        }
    }
}

/// Calls one syscall and reads errno right after it. Each probe is harmless whether or not the
/// filter is there (the comment says what the kernel itself would answer).
fn probe(name: &str) -> String {
    let ret = unsafe {
        match name {
            // the process is threaded, so the kernel would say EINVAL
            "unshare" => syscall(SYS_UNSHARE, CLONE_NEWUSER),
            // fd -1: EBADF
            "setns" => syscall(SYS_SETNS, -1i64, 0i64),
            // PTRACE_PEEKDATA on a pid that does not exist: ESRCH
            "ptrace" => syscall(SYS_PTRACE, 2i64, 0x7fff_fff0i64, 0i64, 0i64),
            // KEYCTL_GET_KEYRING_ID of the session keyring, without creating it
            "keyctl" => syscall(SYS_KEYCTL, 0i64, -3i64, 0i64),
            // an invalid flag: EINVAL
            "userfaultfd" => syscall(SYS_USERFAULTFD, 0x4000_0000i64),
            // an invalid command with a null attr: EINVAL or EPERM
            "bpf" => syscall(SYS_BPF, 0xffffi64, 0i64, 0i64),
            // zero entries: EINVAL
            "io_uring_setup" => syscall(SYS_IO_URING_SETUP, 0i64, 0i64),
            // CLONE_NEWUSER together with CLONE_THREAD is invalid: EINVAL
            "clone(CLONE_NEWUSER)" => syscall(
                SYS_CLONE,
                CLONE_NEWUSER | CLONE_THREAD,
                0i64,
                0i64,
                0i64,
                0i64,
            ),
            // a null argument struct: EFAULT or EINVAL
            "clone3" => syscall(SYS_CLONE3, 0i64, 0i64),
            // null arguments: EFAULT, or EPERM without CAP_SYS_ADMIN
            "mount" => syscall(SYS_MOUNT, 0i64, 0i64, 0i64, 0i64, 0i64),
            _ => return "unknown probe".to_string(),
        }
    };
    errno_of(ret)
}

const PROBES: &[&str] = &[
    "unshare",
    "setns",
    "ptrace",
    "keyctl",
    "userfaultfd",
    "bpf",
    "io_uring_setup",
    "clone(CLONE_NEWUSER)",
    "clone3",
    "mount",
];

pub fn report() -> String {
    let mut out = String::new();
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    for key in [
        "NoNewPrivs",
        "Seccomp",
        "CapEff",
        "CapPrm",
        "CapBnd",
        "CapAmb",
    ] {
        let value = status
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
            .map(str::trim)
            .unwrap_or("?");
        out.push_str(&format!("{key}: {value}\n"));
    }
    for name in PROBES {
        out.push_str(&format!("syscall {name}: {}\n", probe(name)));
    }
    for path in ["/proc/kcore", "/proc/keys", "/proc/timer_list"] {
        let r = match fs::read(path) {
            Ok(b) => format!("{} bytes", b.len()),
            Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
        };
        out.push_str(&format!("read {path}: {r}\n"));
    }
    for path in ["/proc/sys/kernel/domainname", "/proc/sysrq-trigger"] {
        let r = match fs::OpenOptions::new().write(true).open(path) {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
        };
        out.push_str(&format!("write {path}: {r}\n"));
    }
    out
}
