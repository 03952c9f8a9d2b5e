//! Conventions of the whole workspace, checked on its source files (in the style of
//! rust-analyzer's `tidy.rs`): what review would otherwise keep by hand. The lints that the
//! compiler can check (`undocumented_unsafe_blocks`, `todo`, `unimplemented`, `dbg_macro`,
//! `unwrap_used` in library code) are in `[workspace.lints]` and each crate root instead.

use std::fs;
use std::path::{Path, PathBuf};

/// Longest a source file of a crate may grow (lines): past it, split the file by concern.
const MAX_LINES: usize = 800;

fn workspace_crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/ate-core has a parent")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source files of every crate: `src/`, `tests/`, `benches/` (not `target/`, not the
/// generated protobuf code, which the build writes under `target/`).
fn sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in fs::read_dir(workspace_crates()).expect("crates/").flatten() {
        for part in ["src", "tests", "benches"] {
            rust_files(&krate.path().join(part), &mut files);
        }
    }
    files.sort();
    assert!(
        files.len() > 100,
        "found only {} source files: is this the workspace?",
        files.len()
    );
    files
}

fn relative(p: &Path) -> String {
    p.strip_prefix(workspace_crates())
        .unwrap_or(p)
        .display()
        .to_string()
}

#[test]
fn every_file_says_what_it_is_for() {
    let missing: Vec<String> = sources()
        .iter()
        .filter(|p| {
            let text = fs::read_to_string(p).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|p| relative(p))
        .collect();
    assert!(
        missing.is_empty(),
        "files without a module comment (`//! …` first: what the file is for): {missing:#?}"
    );
}

#[test]
fn no_source_file_is_too_long() {
    let long: Vec<String> = sources()
        .iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "src"))
        .filter_map(|p| {
            let lines = fs::read_to_string(p).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", relative(p)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by concern): {long:#?}"
    );
}

#[test]
fn an_ignored_test_says_why() {
    let bare: Vec<String> = sources()
        .iter()
        .flat_map(|p| {
            let text = fs::read_to_string(p).unwrap_or_default();
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.trim() == "#[ignore]")
                .map(|(n, _)| format!("{}:{}", relative(p), n + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        bare.is_empty(),
        "#[ignore] without a reason (write #[ignore = \"why\"]): {bare:#?}"
    );
}

/// The files of a crate's `src/` that may name a wire type (`ate_proto::v1`, `tonic::Status`):
/// the adapters ARCHITECTURE.md's invariants list for the api, the node agent and the worker.
/// Paths relative to the crate's `src/`; one ending in `/` covers a directory.
const WIRE_ADAPTERS: &[(&str, &[&str])] = &[
    (
        "ate-api",
        &[
            "services/",
            "convert.rs",
            "node.rs",
            "lib.rs",
            "join.rs",
            "authz.rs",
        ],
    ),
    (
        "ate-node",
        &[
            "agent/service.rs",
            "agent/convert.rs",
            "agent/convert/",
            // NodeService.Exec relays the exec stream's messages as they are.
            "agent/exec.rs",
            "worker_client.rs",
            "api_client.rs",
            "wire.rs",
        ],
    ),
    (
        "ate-worker",
        &[
            "service.rs",
            "convert/",
            // The actor's local API: a client of the api's services on the actor's behalf.
            "worker/local_api.rs",
        ],
    ),
    // The node's client of the worker's socket, and the adoption record's pid.
    ("ate-worker-client", &["lib.rs", "sandbox.rs"]),
];

/// Whether a line of code (not a comment) names a wire type.
fn names_a_wire_type(line: &str) -> bool {
    let code = line.trim_start();
    if code.starts_with("//") {
        return false;
    }
    code.contains("ate_proto::v1")
        || code.contains("tonic::Status")
        || (code.contains("ate_proto::{") && code.contains("v1"))
        || (code.contains("tonic::{") && code.contains("Status"))
}

#[test]
fn wire_types_stay_in_the_adapters() {
    let mut outside = Vec::new();
    for (krate, adapters) in WIRE_ADAPTERS {
        let src = workspace_crates().join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        assert!(!files.is_empty(), "{krate} has no sources");
        for f in files {
            let rel = f
                .strip_prefix(&src)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            if adapters.iter().any(|a| {
                if a.ends_with('/') {
                    rel.starts_with(a)
                } else {
                    rel == *a
                }
            }) {
                continue;
            }
            let text = fs::read_to_string(&f).unwrap_or_default();
            if let Some((n, _)) = text.lines().enumerate().find(|(_, l)| names_a_wire_type(l)) {
                outside.push(format!("{krate}/src/{rel}:{}", n + 1));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "wire types outside the adapters (convert at the edge, or list the file as an adapter \
         in WIRE_ADAPTERS and ARCHITECTURE.md): {outside:#?}"
    );
}

#[test]
fn the_wire_check_knows_a_wire_type() {
    assert!(names_a_wire_type("use ate_proto::v1;"));
    assert!(names_a_wire_type("    fn f(s: tonic::Status) {}"));
    assert!(names_a_wire_type("use ate_proto::{damage, v1};"));
    assert!(names_a_wire_type("use tonic::{Request, Status};"));
    assert!(!names_a_wire_type(
        "//! converted from `ate_proto::v1` at the edge"
    ));
    assert!(!names_a_wire_type("use ate_core::ActorRef;"));
}

/// A tidy check that finds nothing because it reads nothing would pass forever.
#[test]
fn the_checks_see_real_files() {
    let files = sources();
    let this = files
        .iter()
        .find(|p| p.ends_with("ate-core/tests/tidy.rs"))
        .expect("this file is among the sources");
    let text = fs::read_to_string(this).expect("read this file");
    assert!(text.starts_with("//!"));
    assert!(files.iter().any(|p| p.ends_with("ate-worker/src/lib.rs")));
}
