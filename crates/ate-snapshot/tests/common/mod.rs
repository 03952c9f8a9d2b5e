//! Shared fixtures: a fake generation with CRIU images, an upper dir with a whiteout, volumes.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use ate_core::Fidelity;
use ate_snapshot::GenerationMeta;

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (mknod of whiteouts, trusted.* xattrs, tmpfs mounts)"
    );
}

/// Deterministic pseudo-random bytes (xorshift), incompressible.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn meta(fidelity: Fidelity) -> GenerationMeta {
    GenerationMeta {
        atespace: "default".into(),
        name: "counter".into(),
        generation: 7,
        uuid: "5f0e0c4a-1b2c-4d3e-8f00-0123456789ab".into(),
        fidelity,
        template: "default/counter".into(),
        sandbox_class: "runc".into(),
        node: "node-a".into(),
        boot_id: "boot-1".into(),
        created_unix_ms: 1_764_000_000_000,
        reason: String::new(),
        parent: None,
    }
}

pub struct Fixture {
    pub root: tempfile::TempDir,
    pub gen_dir: PathBuf,
    pub upper: PathBuf,
    pub volumes: Vec<(String, PathBuf)>,
}

/// Downloads generation `key` of `store` into `target`, which must succeed: its manifest.
pub async fn download_ok(
    store: &ate_snapshot::DurableStore,
    key: &str,
    target: &Path,
) -> ate_snapshot::Manifest {
    let got = store.download(key, target).await;
    got.unwrap_or_else(|e| panic!("download {key}: {e}"))
}

/// A second sweep of partial uploads (another node's, say) finds nothing more to delete.
pub async fn assert_nothing_left_to_sweep(store: &ate_snapshot::DurableStore, depth: usize) {
    let again = store
        .sweep_partial_uploads(depth)
        .await
        .expect("sweep again");
    assert_eq!((again.keys_deleted, again.objects_deleted), (0, 0));
}

impl Fixture {
    /// Seals the fixture's generation at memory fidelity, with its upper dir and volumes.
    pub async fn seal_memory(&self) -> Result<ate_snapshot::Manifest, ate_snapshot::Error> {
        let meta = meta(Fidelity::Memory);
        ate_snapshot::seal_generation(&self.gen_dir, meta, Some(&self.upper), &self.volumes).await
    }
}

/// criu/ with three images (one nested), an upper dir with a regular file, a symlink, an empty
/// dir, a whiteout (char 0:0), an opaque dir (xattr), a fifo; two volumes.
pub fn fixture(big: usize) -> Fixture {
    fixture_with_big_file(big, "pages-1.img")
}

/// [`fixture`] with the `big` bytes of noise in `criu/<big_name>`: `pages-1.img` is a memory
/// image (chunk digests; its durable copy is content-addressed chunks), any other name a plain
/// file (one object per file).
pub fn fixture_with_big_file(big: usize, big_name: &str) -> Fixture {
    require_root();
    let root = tempfile::tempdir().expect("tempdir");
    let gen_dir = root.path().join("gen-7");
    let criu = gen_dir.join("criu");
    fs::create_dir_all(criu.join("sub")).expect("mkdir");
    fs::write(criu.join("inventory.img"), b"criu inventory").expect("write");
    fs::write(criu.join(big_name), noise(big, 1)).expect("write");
    fs::write(criu.join("sub/extra.img"), b"nested").expect("write");

    let upper = root.path().join("upper");
    fs::create_dir_all(upper.join("etc")).expect("mkdir");
    fs::write(upper.join("etc/app.conf"), b"counter=41\n").expect("write");
    fs::set_permissions(
        upper.join("etc/app.conf"),
        fs::Permissions::from_mode(0o640),
    )
    .expect("chmod");
    std::os::unix::fs::chown(upper.join("etc/app.conf"), Some(1000), Some(1000)).expect("chown");
    symlink("app.conf", upper.join("etc/link")).expect("symlink");
    symlink("/nonexistent/abs", upper.join("dangling")).expect("symlink");
    fs::create_dir_all(upper.join("empty")).expect("mkdir");
    fs::set_permissions(upper.join("empty"), fs::Permissions::from_mode(0o700)).expect("chmod");
    nix::sys::stat::mknod(
        &upper.join("etc/deleted"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o000),
        nix::sys::stat::makedev(0, 0),
    )
    .expect("mknod whiteout");
    fs::create_dir_all(upper.join("opaque")).expect("mkdir");
    fs::write(upper.join("opaque/new"), b"n").expect("write");
    xattr::set(upper.join("opaque"), "trusted.overlay.opaque", b"y").expect("xattr");
    nix::unistd::mkfifo(
        &upper.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .expect("mkfifo");
    fs::set_permissions(&upper, fs::Permissions::from_mode(0o755)).expect("chmod");

    let data = root.path().join("vol-data");
    fs::create_dir_all(data.join("nested/deeper")).expect("mkdir");
    fs::write(data.join("counter"), b"12").expect("write");
    fs::write(data.join("nested/deeper/blob"), noise(70_000, 2)).expect("write");
    let logs = root.path().join("vol-logs");
    fs::create_dir_all(&logs).expect("mkdir");
    fs::write(logs.join("app.log"), b"hello\n".repeat(1000)).expect("write");

    Fixture {
        gen_dir,
        upper,
        volumes: vec![("data".into(), data), ("logs".into(), logs)],
        root,
    }
}

/// Everything that must survive an archive round trip, per relative path.
pub fn snapshot_tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let rel = p.strip_prefix(root).expect("rel").display().to_string();
        let m = fs::symlink_metadata(&p).expect("lstat");
        let ft = m.file_type();
        let mut xa: Vec<String> = if ft.is_symlink() {
            Vec::new()
        } else {
            xattr::list(&p)
                .expect("xattrs")
                .filter(|n| n.to_string_lossy().starts_with("trusted.overlay."))
                .map(|n| {
                    let v = xattr::get(&p, &n).expect("get").unwrap_or_default();
                    format!("{}={}", n.to_string_lossy(), String::from_utf8_lossy(&v))
                })
                .collect()
        };
        xa.sort();
        let kind = if ft.is_dir() {
            "dir".to_string()
        } else if ft.is_symlink() {
            format!("link->{}", fs::read_link(&p).expect("readlink").display())
        } else if ft.is_char_device() {
            format!("chr {}", m.rdev())
        } else if ft.is_fifo() {
            "fifo".to_string()
        } else {
            format!("file {:x?}", sha(&fs::read(&p).expect("read")))
        };
        let mode = if ft.is_symlink() {
            0
        } else {
            m.mode() & 0o7777
        };
        let mtime = if ft.is_dir() || ft.is_symlink() {
            0
        } else {
            m.mtime()
        };
        out.insert(
            rel,
            format!(
                "{kind} mode={mode:o} uid={} gid={} mtime={mtime} xattrs={xa:?}",
                m.uid(),
                m.gid()
            ),
        );
        if ft.is_dir() {
            walk(root, &p, out);
        }
    }
}

fn sha(b: &[u8]) -> u64 {
    // Cheap content fingerprint for comparisons (not security relevant).
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100000001b3)
    })
}

/// Flips one byte in the middle of `path`.
pub fn flip_byte(path: &Path) {
    let mut b = fs::read(path).expect("read");
    let i = b.len() / 2;
    b[i] ^= 0x5a;
    fs::write(path, b).expect("write");
}

/// No `.<name>.*` temp siblings of `target` left behind.
pub fn no_temp_siblings(target: &Path) -> bool {
    let name = target
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    let Some(parent) = target.parent() else {
        return true;
    };
    let Ok(rd) = fs::read_dir(parent) else {
        return true;
    };
    !rd.flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .starts_with(&format!(".{name}."))
    })
}

/// A tmpfs mounted for the life of the guard.
pub struct TmpfsMount(pub PathBuf);

impl TmpfsMount {
    pub fn new(dir: &Path, size: &str) -> Self {
        require_root();
        fs::create_dir_all(dir).expect("mkdir");
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount tmpfs on {}", dir.display());
        Self(dir.to_path_buf())
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes `path` (creating its directory) with its mtime, which the local store reports as the
/// object's last-modified time, `age` in the past: no sleeping to make an object old.
pub fn write_aged(path: &Path, data: &[u8], age: std::time::Duration) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, data).expect("write");
    age_file(path, age);
}

pub fn age_file(path: &Path, age: std::time::Duration) {
    let f = fs::File::options().write(true).open(path).expect("open");
    f.set_modified(std::time::SystemTime::now() - age)
        .expect("set mtime");
}

pub fn age_tree(dir: &Path, age: std::time::Duration) {
    for e in fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            age_tree(&p, age);
        } else {
            age_file(&p, age);
        }
    }
}

/// Every file `m` lists reads the same in `got` as in `want`.
pub fn assert_same_files(m: &ate_snapshot::Manifest, got: &Path, want: &Path) {
    for f in &m.files {
        assert_eq!(
            fs::read(got.join(&f.path)).expect("read"),
            fs::read(want.join(&f.path)).expect("read"),
            "{}",
            f.path
        );
    }
}

/// The durable store of `fx` (a local directory, `file://`) and that directory.
pub fn store_of(fx: &Fixture) -> (ate_snapshot::DurableStore, PathBuf) {
    let dir = fx.root.path().join("durable");
    let url = format!("file://{}", dir.display());
    let store = ate_snapshot::DurableStore::from_url(&url).expect("store");
    (store, dir)
}
