//! The runc containers of a system's workers, found through each worker's runc root under
//! `<state>/workers/<id>/runc`: which exist, their init pids and states, and killing one.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::System;

/// Container ids (= netns names) of `ns/name` under `state`, found by their bundle (the actor's
/// directory on a worker); the worker derives the id from that path.
pub fn ids_of(state: &Path, ns: &str, name: &str) -> Vec<String> {
    actor_containers(state, ns, name)
        .into_iter()
        .map(|c| c.0)
        .collect()
}

/// [`containers_full`] of `ns/name` only (any worker).
pub fn actor_containers(state: &Path, ns: &str, name: &str) -> Vec<(String, u32, String, String)> {
    let suffix = format!("/actors/{ns}/{name}");
    containers_full(state)
        .into_iter()
        .filter(|c| c.3.ends_with(&suffix))
        .collect()
}

/// `(container id, pid)` of every runc container of every worker under `state`.
pub fn containers(state: &Path) -> Vec<(String, u32)> {
    containers_with_status(state)
        .into_iter()
        .map(|(id, pid, _)| (id, pid))
        .collect()
}

/// `(container id, pid, runc status)` of every runc container of every worker under `state`.
pub fn containers_with_status(state: &Path) -> Vec<(String, u32, String)> {
    containers_full(state)
        .into_iter()
        .map(|(id, pid, status, _)| (id, pid, status))
        .collect()
}

/// `(container id, pid, runc status, bundle)` of every runc container under `state`.
pub fn containers_full(state: &Path) -> Vec<(String, u32, String, String)> {
    runc_lists(state)
        .into_iter()
        .flat_map(|(_, list)| list)
        .map(|c| {
            (
                c["id"].as_str().unwrap_or_default().to_string(),
                c["pid"].as_u64().unwrap_or(0) as u32,
                c["status"].as_str().unwrap_or_default().to_string(),
                c["bundle"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// `runc list` of each worker under `state` that has a runc root: (worker id, containers as
/// runc prints them; none when its answer does not parse).
pub fn runc_lists(state: &Path) -> Vec<(String, Vec<Value>)> {
    let Ok(workers) = std::fs::read_dir(state.join("workers")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for w in workers.flatten() {
        let root = w.path().join("runc");
        if !root.exists() {
            continue;
        }
        let o = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["list", "-f", "json"])
            .output()
            .expect("runc list");
        let list: Option<Vec<Value>> = serde_json::from_slice(&o.stdout).unwrap_or(None);
        let worker = w.file_name().to_string_lossy().into_owned();
        out.push((worker, list.unwrap_or_default()));
    }
    out
}

pub fn container_of(state: &Path, ns: &str, name: &str) -> Option<(u32, String)> {
    actor_containers(state, ns, name)
        .into_iter()
        .next()
        .map(|(_, pid, status, _)| (pid, status))
}

/// SIGKILLs the init of `ns/name`'s container.
pub fn kill_actor(sys: &System, ns: &str, name: &str) {
    let (pid, _) = container_of(&sys.state_dir(), ns, name)
        .unwrap_or_else(|| panic!("no container for {ns}/{name}"));
    assert!(pid > 0);
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill")
            .success()
    );
}
