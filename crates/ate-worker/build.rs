//! Builds `init/main.rs` (the PID 1 of multi-container sandboxes) as a static executable with
//! the same rustc, so it runs on any image root; the worker embeds its bytes (`ATE_INIT_PATH`).
//! It uses `std` only, so one rustc invocation builds it (no cargo inside cargo).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=init/main.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let binary = out.join("ate-init");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2024",
            "--crate-name",
            "ate_init",
            "--target",
            &target,
        ])
        .args([
            "-C",
            "opt-level=s",
            "-C",
            "panic=abort",
            "-C",
            "strip=symbols",
        ])
        .args(["-C", "target-feature=+crt-static", "-C", "codegen-units=1"])
        .arg("-o")
        .arg(&binary)
        .arg("init/main.rs")
        .status()
        .expect("run rustc for init/main.rs");
    assert!(status.success(), "building init/main.rs failed");
    println!("cargo::rustc-env=ATE_INIT_PATH={}", binary.display());
}
