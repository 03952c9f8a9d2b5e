//! Which of a worker's sandboxes still run, read from its actors dir
//! (`<state>/workers/<id>/actors/<atespace>/<name>`): the adoption record the worker keeps next
//! to each active actor's sandbox names the sandbox's init, which must be alive in the
//! sandbox's own cgroup (named by [`short_id`] of the sandbox dir).

use std::path::Path;

use ate_proto::v1;
use sha2::{Digest, Sha256};

use crate::host::process_running;

/// Next to each active actor: what a restarted worker needs to re-adopt its sandbox.
pub const ADOPTION_FILE: &str = "adoption.pb";

/// Short stable id: 10 hex chars of sha256(`key`) (the worker uses the actor directory's path).
pub fn short_id(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(&digest[..5])
}

/// How many sandboxes under a worker's actors dir (`<state>/workers/<id>/actors`) still run:
/// those whose adoption record names an init that is alive (not a zombie) in the sandbox's own
/// cgroup. The node asks this about a worker whose process does not answer: while any runs, the
/// worker's actors may not be released (a restarted worker re-adopts them).
pub fn live_sandboxes(actors_dir: &Path) -> usize {
    actor_dirs(actors_dir)
        .into_iter()
        .filter(|(atespace, name)| sandbox_alive(actors_dir, atespace, name))
        .count()
}

/// Whether a sandbox of actor `atespace/name` still runs under a worker's actors dir (see
/// [`live_sandboxes`]).
pub fn sandbox_alive(actors_dir: &Path, atespace: &str, name: &str) -> bool {
    let dir = actors_dir.join(atespace).join(name);
    let short_id = short_id(&dir.to_string_lossy());
    read_adoption_pid(&dir).is_ok_and(|pid| pid.is_some_and(|pid| init_alive(pid, &short_id)))
}

/// `(atespace, name)` of every actor dir under an actors dir (`<atespace>/<name>`).
pub fn actor_dirs(actors_dir: &Path) -> Vec<(String, String)> {
    let Ok(spaces) = std::fs::read_dir(actors_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for space in spaces.flatten() {
        let Ok(names) = std::fs::read_dir(space.path()) else {
            continue;
        };
        let atespace = space.file_name().to_string_lossy().into_owned();
        for n in names.flatten() {
            out.push((
                atespace.clone(),
                n.file_name().to_string_lossy().into_owned(),
            ));
        }
    }
    out
}

/// Only the init pid of the adoption record next to an actor's sandbox (the rest unchecked).
fn read_adoption_pid(dir: &Path) -> Result<Option<u32>, String> {
    let bytes =
        std::fs::read(dir.join(ADOPTION_FILE)).map_err(|e| format!("no adoption record: {e}"))?;
    adoption_pid_from_bytes(&bytes)
}

/// The init pid of an adoption record's bytes (None: the record names none), the rest of the
/// record unchecked: the liveness check needs no spec.
pub fn adoption_pid_from_bytes(bytes: &[u8]) -> Result<Option<u32>, String> {
    let record: v1::AdoptionRecord =
        prost::Message::decode(bytes).map_err(|e| format!("adoption record unreadable: {e}"))?;
    Ok(Some(record.pid).filter(|pid| *pid != 0))
}

/// The process exists, is not a zombie, and sits in the sandbox's cgroup (not a reused pid).
fn init_alive(pid: u32, short_id: &str) -> bool {
    process_running(pid)
        && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| c.contains(short_id))
}
