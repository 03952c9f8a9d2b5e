//! `ate cp` end to end (real runc, a tar stream over exec): a 100 MiB file and a directory into
//! an actor's sandbox and back, byte-identical, with the CLI's memory bounded; paths that climb
//! out of the sandbox's root are refused; a missing file is a clear error.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::actors::*;
use support::*;

const NS: &str = "ate-demo";

fn cp(sys: &System, src: &str, dst: &str) -> Output {
    sys.ate(&["cp", src, dst])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The largest resident size (KiB) of any child this process has waited for.
fn children_max_rss_kib() -> i64 {
    let mut usage = std::mem::MaybeUninit::<nix::libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer, which lives for the call.
    let r = unsafe { nix::libc::getrusage(nix::libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    assert_eq!(r, 0);
    // SAFETY: getrusage succeeded, so it filled the struct.
    unsafe { usage.assume_init() }.ru_maxrss
}

#[test]
fn files_and_directories_both_ways() {
    let sys = System::up(UpOptions::with_workers(1));
    // Room for the file's page cache in the actor's memory limit.
    sys_apply(
        &sys,
        NS,
        "roomy",
        &Tpl {
            memory: "256Mi",
            ..Tpl::counter()
        },
    );
    create_actor(&sys, NS, "files", "roomy");
    let dir = sys.dir.path();

    // 100 MiB in and out, byte-identical; the CLI streams (its memory stays well below the
    // file's size).
    let big = dir.join("big");
    let status = Command::new("head")
        .args(["-c", "104857600", "/dev/urandom"])
        .stdout(std::fs::File::create(&big).expect("create"))
        .status()
        .expect("head");
    assert!(status.success());
    let out = cp(
        &sys,
        big.to_str().expect("utf-8"),
        "ate-demo/files:/data/big",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let back = dir.join("big.back");
    let out = cp(
        &sys,
        "ate-demo/files:/data/big",
        back.to_str().expect("utf-8"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sha256(&big), sha256(&back), "the copy came back different");
    let rss_mib = children_max_rss_kib() / 1024;
    eprintln!("[memory] largest CLI resident size: {rss_mib} MiB");
    assert!(rss_mib < 80, "a CLI held {rss_mib} MiB for a 100 MiB copy");
    // The file is in the actor's volume, as the actor sees it.
    let out = sys.ate(&[
        "exec",
        "actor",
        "files",
        "-a",
        NS,
        "--",
        "wc",
        "-c",
        "/data/big",
    ]);
    assert!(
        text(&out.stdout).starts_with("104857600"),
        "{}",
        text(&out.stdout)
    );

    // A directory tree in and out (into an existing local directory, as cp does).
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).expect("mkdir");
    std::fs::write(tree.join("a.txt"), "one\n").expect("write");
    std::fs::write(tree.join("sub/deeper/b.bin"), [0u8, 1, 2, 255]).expect("write");
    let out = cp(
        &sys,
        tree.to_str().expect("utf-8"),
        "ate-demo/files:/tmp/tree",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let into = dir.join("into");
    std::fs::create_dir_all(&into).expect("mkdir");
    let out = cp(
        &sys,
        "ate-demo/files:/tmp/tree",
        into.to_str().expect("utf-8"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(into.join("tree/a.txt")).expect("a.txt"),
        b"one\n"
    );
    assert_eq!(
        std::fs::read(into.join("tree/sub/deeper/b.bin")).expect("b.bin"),
        [0u8, 1, 2, 255]
    );

    // Paths that climb out of the sandbox's root are refused before anything runs.
    let big_path = big.to_str().expect("utf-8");
    let dir_path = dir.to_str().expect("utf-8");
    for (from, to) in [
        (big_path, "ate-demo/files:/data/../../x"),
        ("ate-demo/files:../etc/passwd", dir_path),
    ] {
        let out = cp(&sys, from, to);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "cp {from} {to}: {err}");
        assert!(err.contains("refused"), "cp {from} {to}: {err}");
    }
    // A file that is not there: tar's words and a non-zero exit.
    let out = cp(
        &sys,
        "ate-demo/files:/data/nothing",
        dir.join("n").to_str().expect("utf-8"),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("nothing") && err.contains("No such file"),
        "{err}"
    );
    assert!(!dir.join("n").exists());
}
