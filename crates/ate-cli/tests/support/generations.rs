//! Generations on disk and in a `file://` durable store: damaging one, where a damaged one is
//! moved, a durable copy's manifest, and a tmpfs durable store that can be made read-only.

use std::path::{Path, PathBuf};
use std::process::Command;

use ate_test_support::fs::walk;

/// Flips one byte in the middle of the largest file of a generation (a CRIU pages image or the
/// rootfs tar; never the manifest) and returns that file.
pub fn flip_byte_in_largest_file(gen_dir: &Path) -> PathBuf {
    let mut files: Vec<(u64, PathBuf)> = walk(gen_dir)
        .into_iter()
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "manifest.json"))
        .map(|p| (std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0), p))
        .collect();
    files.sort();
    let (len, victim) = files.pop().expect("a file to corrupt");
    let mut bytes = std::fs::read(&victim).expect("read");
    bytes[(len / 2) as usize] ^= 0x40;
    std::fs::write(&victim, bytes).expect("write");
    victim
}

/// `<parent>/.<name>.corrupt`: where the node moves a damaged node-local generation.
pub fn quarantined(gen_dir: &Path) -> PathBuf {
    let name = gen_dir
        .file_name()
        .expect("generation dir name")
        .to_string_lossy();
    gen_dir
        .parent()
        .expect("generation dir parent")
        .join(format!(".{name}.corrupt"))
}

/// The durable copy's manifest of generation `generation` of `ns/name` in a `file://` store.
pub fn durable_manifest(store: &Path, ns: &str, name: &str, generation: u64) -> Option<PathBuf> {
    let prefix = format!("{generation}-");
    std::fs::read_dir(store.join(ns).join(name))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .map(|p| p.join("manifest.json"))
        .filter(|m| m.is_file())
}

/// A tmpfs mounted as a `file://` durable store, unmounted on drop (declare it before the
/// system that uses it). Read-only, every upload to it fails.
pub struct TmpfsStore {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

impl TmpfsStore {
    pub fn mount(read_only: bool) -> TmpfsStore {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("store");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let opts = if read_only { "ro,size=1m" } else { "size=256m" };
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(mounted.success(), "mount tmpfs");
        TmpfsStore { _tmp: tmp, dir }
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    pub fn make_read_only(&self) {
        let ro = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.dir)
            .status()
            .expect("remount");
        assert!(ro.success(), "remount the store read-only");
    }
}

impl Drop for TmpfsStore {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// The manifest of a node-local generation as JSON text: opened with `state`'s snapshot keys
/// when it is sealed (what `ate up` writes), read as it is otherwise. Each test runs in its own
/// process (nextest), so configuring this process's keys once is enough.
pub fn local_manifest(state: &Path, gen_dir: &Path) -> String {
    try_local_manifest(state, gen_dir)
        .unwrap_or_else(|e| panic!("manifest of {}: {e}", gen_dir.display()))
}

/// [`local_manifest`], or the reason it cannot be read (a generation being deleted by
/// retention loses its files one by one while a test lists the actor's directory).
pub fn try_local_manifest(state: &Path, gen_dir: &Path) -> Result<String, ate_snapshot::Error> {
    if ate_snapshot::sealed::is_encrypted(gen_dir) {
        let keys = ate_snapshot::SnapshotKeys::load(&state.join("keys")).expect("snapshot keys");
        ate_snapshot::sealed::configure(Some(keys), std::env::temp_dir().join("ate-test-scratch"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let m = rt.block_on(ate_snapshot::read_manifest(gen_dir))?;
    Ok(serde_json::to_string(&m).expect("manifest json"))
}
