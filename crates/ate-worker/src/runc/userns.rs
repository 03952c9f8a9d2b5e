//! Actors in their own user namespace (issue 30): uid/gid 0–65535 inside map to a host range
//! of 65536 ids that no other actor on the node uses at the same time.
//!
//! How (proven by hand first, `scripts/userns-proof/proof.sh`; why each piece in
//! `docs/security.md`, "User namespaces"):
//! - **runc makes the user and network namespaces together** (`linux.uidMappings`, no namespace
//!   paths), so the netns is owned by the actor's user namespace: sysfs mounts, port 80 binds
//!   inside, and CRIU dumps it. A worker-made netns passed by path cannot be joined by the task
//!   CRIU creates in a fresh user namespace at restore (`Can't setns 16/net: Operation not
//!   permitted`). The worker sets the netns up from outside in an OCI `createRuntime` hook,
//!   which runc runs both after `runc run` made the namespaces and at CRIU's
//!   `setup-namespaces` step of a restore: the hook binds it at `/var/run/netns/<name>` (where
//!   the dialer and the egress rules find it, as before) and runs the same `ip -batch`. Dumps
//!   and restores use `--empty-ns network`: the hook rebuilds the netns, egress is re-applied.
//! - **Files stay in canonical form on disk** (the ids the actor sees: 0 = its root) and are
//!   **idmapped** onto the actor's range: the image layer (shared read-only, no copy), the
//!   actor's own dir (upper and work dirs, volumes) through one idmapped clone, and the overlay
//!   is mounted with fsuid = the range's root so overlayfs' own files (work dir, copy-ups) map.
//!   Idmapping rather than shifting (chown) because a move or a restore on another range then
//!   touches no file, archives and generations stay the same bytes whatever the range, and
//!   generations written before user namespaces restore unchanged. From the host, through the
//!   actor's root (`/proc/<pid>/root`), its files show its range.
//! - **Another range at restore**: CRIU writes the uid/gid maps it dumped (`userns-*.img`); the
//!   worker restores from a scratch copy of the image dir whose userns image is rewritten to the
//!   range claimed now (other files hard-linked).
//! - **Ranges**: a claim file per range index under a node-wide dir (`/run/ate/userns-ranges`
//!   by default, shared by every worker on the node), created with `O_EXCL`, holding the actor
//!   dir's path. The actor's own dir records its range (`userns-range`), so a worker restarted
//!   after `kill -9` re-adopts the sandbox with the same range. A claim is released when the
//!   sandbox is torn down; a claim whose actor dir no longer exists is stale and taken over.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{IoContext, Result, SandboxError};

/// Ids per actor (uid/gid 0–65535 inside).
pub const RANGE_SIZE: u32 = 65536;
/// Host id of the first range's root: far above any login user or `/etc/subuid` range.
pub const FIRST_BASE: u32 = 0x1000_0000;
/// Ranges on one node (claims beyond are refused).
pub const RANGES: u32 = 4096;
/// Default node-wide claims dir (tmpfs: ranges die with the sandboxes at reboot).
pub const DEFAULT_CLAIMS_DIR: &str = "/run/ate/userns-ranges";
/// In the actor dir: the base of the range it holds (decimal).
pub const RANGE_FILE: &str = "userns-range";
/// In the actor dir: mount points of the idmapped trees.
pub const IDMAP_DIR: &str = "idmap";

/// The default of the worker's `--userns`: on, unless `ATE_USERNS` is `0` or `false`.
pub fn enabled_by_default() -> bool {
    std::env::var("ATE_USERNS").map_or(true, |v| {
        !matches!(v.as_str(), "0" | "false" | "no" | "off")
    })
}

/// Host id of range `index`'s root.
pub fn base_of(index: u32) -> u32 {
    FIRST_BASE + index * RANGE_SIZE
}

fn index_of(base: u32) -> Option<u32> {
    let off = base.checked_sub(FIRST_BASE)?;
    (off % RANGE_SIZE == 0 && off / RANGE_SIZE < RANGES).then_some(off / RANGE_SIZE)
}

/// The range the actor dir records, if any (its sandbox runs, or ran, in a user namespace).
pub fn recorded_base(actor_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(actor_dir.join(RANGE_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|b| index_of(*b).is_some())
}

/// Claims a range for `actor_dir` (the one it already holds, if its claim is still its own),
/// records it in the actor dir and returns its base.
pub fn claim(claims_dir: &Path, actor_dir: &Path) -> Result<u32> {
    std::fs::create_dir_all(claims_dir).ctx(|| format!("create {}", claims_dir.display()))?;
    let owner = actor_dir.to_string_lossy().into_owned();
    if let Some(base) = recorded_base(actor_dir)
        && let Some(index) = index_of(base)
    {
        match std::fs::read_to_string(claim_path(claims_dir, index)) {
            Ok(o) if o == owner => return Ok(base),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if try_claim(claims_dir, index, &owner)? {
                    return Ok(base);
                }
            }
            Err(e) => return Err(SandboxError::io("read a userns range claim", e)),
        }
    }
    let digest = Sha256::digest(owner.as_bytes());
    let start = u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]) % RANGES;
    for i in 0..RANGES {
        let index = (start + i) % RANGES;
        if try_claim(claims_dir, index, &owner)? {
            let base = base_of(index);
            let path = actor_dir.join(RANGE_FILE);
            std::fs::write(&path, base.to_string()).ctx(|| format!("write {}", path.display()))?;
            return Ok(base);
        }
    }
    Err(SandboxError::Unsupported(format!(
        "no free user namespace range: all {RANGES} claimed in {}",
        claims_dir.display()
    )))
}

fn claim_path(claims_dir: &Path, index: u32) -> PathBuf {
    claims_dir.join(index.to_string())
}

/// Takes range `index` for `owner` if it is free, already `owner`'s, or stale (its owner dir
/// is gone).
fn try_claim(claims_dir: &Path, index: u32, owner: &str) -> Result<bool> {
    let path = claim_path(claims_dir, index);
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(owner.as_bytes())
                    .ctx(|| format!("write {}", path.display()))?;
                return Ok(true);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let held = std::fs::read_to_string(&path).unwrap_or_default();
                if held == owner {
                    return Ok(true);
                }
                if held.is_empty() || Path::new(&held).exists() {
                    // Taken (or being written this instant): next range.
                    return Ok(false);
                }
                tracing::info!(range = base_of(index), stale_owner = %held, "taking over a stale userns range claim");
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => return Err(SandboxError::io(format!("claim {}", path.display()), e)),
        }
    }
    Ok(false)
}

/// Releases the actor's range (its claim, if still its own, and the record in its dir).
pub fn release(claims_dir: &Path, actor_dir: &Path) {
    let Some(base) = recorded_base(actor_dir) else {
        return;
    };
    if let Some(index) = index_of(base) {
        let path = claim_path(claims_dir, index);
        if std::fs::read_to_string(&path).is_ok_and(|o| o == actor_dir.to_string_lossy()) {
            let _ = std::fs::remove_file(&path);
        }
    }
    let _ = std::fs::remove_file(actor_dir.join(RANGE_FILE));
}

/// A user namespace mapping 0–65535 to `base`…, made only to carry that mapping into
/// `mount_setattr(MOUNT_ATTR_IDMAP)` (the actor's own user namespace is made later by runc,
/// or by CRIU at a restore, with the same mapping). A short-lived child unshares it; its fd
/// keeps it alive after the child is gone.
pub fn mapping_userns(base: u32) -> Result<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("30")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: unshare is async-signal-safe and the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .spawn()
        .ctx(|| "start a child in a new user namespace")?;
    let pid = child.id();
    let result = (|| {
        let map = format!("0 {base} {RANGE_SIZE}\n");
        for file in ["uid_map", "gid_map"] {
            let path = format!("/proc/{pid}/{file}");
            std::fs::write(&path, &map).ctx(|| format!("write {path}"))?;
        }
        let path = format!("/proc/{pid}/ns/user");
        let f = std::fs::File::open(&path).ctx(|| format!("open {path}"))?;
        Ok(OwnedFd::from(f))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Invalid(format!("path {} has a NUL byte", p.display())))
}

/// Attaches at `dst` (an existing dir) an idmapped clone of the directory `src` (not its
/// submounts): ids on disk are shown as `userns` maps them.
pub fn idmapped_clone(userns: &OwnedFd, src: &Path, dst: &Path) -> Result<()> {
    let what = || format!("idmapped mount of {} at {}", src.display(), dst.display());
    let src_c = cpath(src)?;
    let dst_c = cpath(dst)?;
    let empty = c"";
    // SAFETY: plain syscalls on valid NUL-terminated strings; the returned fd is owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src_c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(SandboxError::io(what(), std::io::Error::last_os_error()));
    }
    // SAFETY: open_tree returned a new fd that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: attr lives across the call and its size is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(SandboxError::io(what(), std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst_c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(SandboxError::io(what(), std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Mounts an overlay on idmapped layers with fsuid/fsgid = `base` (the range's root), on a
/// thread of its own (credentials are per thread): overlayfs keeps the mounter's credentials
/// for its own work (work dir, copy-ups, whiteouts), and those must map through the idmapped
/// upper layer (host root does not: EOVERFLOW, and the overlay falls back to read-only).
/// `SECBIT_NO_SETUID_FIXUP` keeps the thread's capabilities across the fsuid change.
pub fn mount_overlay_as(
    base: u32,
    lower: &Path,
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<()> {
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let target = target.to_path_buf();
    let what = format!("mount overlay at {} ({opts})", target.display());
    let joined = std::thread::Builder::new()
        .name("ate-idmap-overlay".into())
        .spawn(move || -> std::io::Result<()> {
            const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
            // SAFETY: per-thread credential calls with constant arguments.
            unsafe {
                if libc::prctl(libc::PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::syscall(libc::SYS_setfsgid, base);
                libc::syscall(libc::SYS_setfsuid, base);
            }
            nix::mount::mount(
                Some("overlay"),
                &target,
                Some("overlay"),
                nix::mount::MsFlags::empty(),
                Some(opts.as_str()),
            )
            .map_err(std::io::Error::from)
        })
        .ctx(|| "start the overlay mount thread")?
        .join();
    match joined {
        Ok(r) => r.ctx(|| what),
        Err(_) => Err(SandboxError::Invalid(format!("{what}: thread panicked"))),
    }
}

/// Lets the range's root group traverse `dir` and makes sure every ancestor lets others
/// traverse (`o+x`): runc, inside the actor's user namespace, resolves the rootfs and volume
/// paths under it. `dir` stays `root:root` 0710 with an ACL entry `group:<base>:--x`: its gid
/// must stay canonical (0), because the idmapped clone of the actor dir shows the same inode,
/// and an id outside the mapping there would take host root's capabilities on it away (runc
/// opens volume sources through it: `failed to open mount source …: Permission denied`).
pub fn open_path_for(base: u32, dir: &Path) -> Result<()> {
    nix::unistd::chown(
        dir,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(0)),
    )
    .ctx(|| format!("chown {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
        .ctx(|| format!("chmod {}", dir.display()))?;
    set_traverse_acl(dir, base).ctx(|| format!("set the ACL of {}", dir.display()))?;
    for a in dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(a) else {
            continue;
        };
        let mode = meta.permissions().mode();
        if mode & 0o001 == 0 {
            tracing::info!(dir = %a.display(), "adding o+x so that actors in user namespaces reach their rootfs");
            std::fs::set_permissions(a, std::fs::Permissions::from_mode((mode & 0o7777) | 0o001))
                .ctx(|| format!("chmod o+x {}", a.display()))?;
        }
    }
    Ok(())
}

/// `system.posix_acl_access` = `u::rwx,g::--x,g:<gid>:--x,m::--x,o::---`.
fn set_traverse_acl(dir: &Path, gid: u32) -> std::io::Result<()> {
    const VERSION: u32 = 2;
    const UNDEFINED_ID: u32 = u32::MAX;
    let entries: [(u16, u16, u32); 5] = [
        (0x01, 7, UNDEFINED_ID), // ACL_USER_OBJ
        (0x04, 1, UNDEFINED_ID), // ACL_GROUP_OBJ
        (0x08, 1, gid),          // ACL_GROUP
        (0x10, 1, UNDEFINED_ID), // ACL_MASK
        (0x20, 0, UNDEFINED_ID), // ACL_OTHER
    ];
    let mut value = VERSION.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        value.extend_from_slice(&tag.to_le_bytes());
        value.extend_from_slice(&perm.to_le_bytes());
        value.extend_from_slice(&id.to_le_bytes());
    }
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: valid NUL-terminated name and path, value pointer and length from one Vec.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a CRIU image dir was dumped from a sandbox in a user namespace.
pub fn image_has_userns(image_dir: &Path) -> bool {
    std::fs::read_dir(image_dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("userns-") && n.ends_with(".img")
        })
    })
}

/// `scratch` becomes the image dir to restore from: every file of `image_dir` hard-linked (or
/// copied across filesystems), the userns images rewritten to map 0–65535 to `base`. It lets
/// the range's root group in (the restored task opens some images after it entered its user
/// namespace).
pub fn images_for_range(image_dir: &Path, scratch: &Path, base: u32) -> Result<()> {
    if scratch.exists() {
        std::fs::remove_dir_all(scratch).ctx(|| format!("remove {}", scratch.display()))?;
    }
    std::fs::create_dir_all(scratch).ctx(|| format!("create {}", scratch.display()))?;
    for e in std::fs::read_dir(image_dir).ctx(|| format!("read {}", image_dir.display()))? {
        let e = e.ctx(|| format!("read {}", image_dir.display()))?;
        let name = e.file_name();
        let src = e.path();
        let dst = scratch.join(&name);
        let n = name.to_string_lossy();
        if n.starts_with("userns-") && n.ends_with(".img") {
            let bytes = std::fs::read(&src).ctx(|| format!("read {}", src.display()))?;
            let out =
                rewrite_userns_image(&bytes, base).ok_or_else(|| SandboxError::Checkpoint {
                    path: src.clone(),
                    message: "unreadable CRIU userns image".to_string(),
                })?;
            std::fs::write(&dst, out).ctx(|| format!("write {}", dst.display()))?;
        } else if e.file_type().is_ok_and(|t| t.is_symlink()) && n == "parent" {
            // An incremental dump's link to its parent images, followed from the copy too.
            // Relative: CRIU follows it through the images dir's descriptor in a task whose
            // root is already the container's, where an absolute path would not resolve.
            let target = std::fs::canonicalize(&src).ctx(|| format!("follow {}", src.display()))?;
            let here =
                std::fs::canonicalize(scratch).ctx(|| format!("resolve {}", scratch.display()))?;
            std::os::unix::fs::symlink(relative_to(&here, &target), &dst)
                .ctx(|| format!("link {}", dst.display()))?;
        } else if e.file_type().is_ok_and(|t| t.is_file())
            && std::fs::hard_link(&src, &dst).is_err()
        {
            std::fs::copy(&src, &dst).ctx(|| format!("copy {}", src.display()))?;
        }
    }
    open_to_range(scratch, base)
}

/// The path of `target` seen from directory `from` (both absolute, without `..` or links).
fn relative_to(from: &Path, target: &Path) -> PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), target.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for c in &to[common..] {
        path.push(c);
    }
    path
}

/// `dir` becomes `root:<range root gid>` 0710: the range's root group may pass through it,
/// nobody else.
pub fn open_to_range(dir: &Path, base: u32) -> Result<()> {
    nix::unistd::chown(dir, None, Some(nix::unistd::Gid::from_raw(base)))
        .ctx(|| format!("chgrp {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
        .ctx(|| format!("chmod {}", dir.display()))?;
    Ok(())
}

fn read_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let c = *b.get(*i)?;
        *i += 1;
        v |= u64::from(c & 0x7f) << shift;
        if c < 0x80 {
            return Some(v);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let c = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(c);
            return;
        }
        out.push(c | 0x80);
    }
}

/// CRIU's `userns-*.img`: two magics, then one entry (u32 little-endian size + protobuf
/// `userns_entry { repeated uid_gid_extent uid_map = 1; repeated uid_gid_extent gid_map = 2; }`,
/// `uid_gid_extent { uint32 first = 1; uint32 lower_first = 2; uint32 count = 3; }`). Returns
/// the image with every `lower_first` set to `base`; `None` for anything else.
pub fn rewrite_userns_image(bytes: &[u8], base: u32) -> Option<Vec<u8>> {
    let head = bytes.get(..8)?;
    let size = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
    let msg = bytes.get(12..12 + size)?;
    let rest = &bytes[12 + size..];
    let mut out = Vec::with_capacity(msg.len() + 8);
    let mut i = 0;
    while i < msg.len() {
        let key = read_varint(msg, &mut i)?;
        if key & 7 != 2 {
            return None;
        }
        let len = usize::try_from(read_varint(msg, &mut i)?).ok()?;
        let ext = msg.get(i..i + len)?;
        i += len;
        let mut sub = Vec::new();
        let mut j = 0;
        while j < ext.len() {
            let k = read_varint(ext, &mut j)?;
            if k & 7 != 0 {
                return None;
            }
            let v = read_varint(ext, &mut j)?;
            write_varint(k, &mut sub);
            write_varint(if k >> 3 == 2 { u64::from(base) } else { v }, &mut sub);
        }
        write_varint(key, &mut out);
        write_varint(sub.len() as u64, &mut out);
        out.extend_from_slice(&sub);
    }
    let mut image = head.to_vec();
    image.extend_from_slice(&u32::try_from(out.len()).ok()?.to_le_bytes());
    image.extend_from_slice(&out);
    image.extend_from_slice(rest);
    Some(image)
}

/// The `createRuntime` hook's script: [`NETNS_HOOK`], then the egress gate (`$4`: its dir,
/// see `ate_egress::gate`).
pub fn netns_hook() -> String {
    format!("{NETNS_HOOK}shift 3\n{}", ate_egress::gate::HOOK)
}

/// The netns part of the `createRuntime` hook: binds the container's netns (pid from the state
/// JSON on stdin) at `/var/run/netns/$1`, then `ip -batch` `$2` in it (`$3` when `$2` fails:
/// veth instead of a dummy link on kernels without one).
const NETNS_HOOK: &str = r#"set -e
pid=$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p')
[ -n "$pid" ] || { echo "netns hook: no pid in the state" >&2; exit 1; }
mkdir -p /var/run/netns
f=/var/run/netns/$1
umount "$f" 2>/dev/null || true
: > "$f"
mount --bind "/proc/$pid/ns/net" "$f"
printf '%s' "$2" | ip -n "$1" -batch - 2>/dev/null || printf '%s' "$3" | ip -n "$1" -batch -
"#;

/// `/dev/userfaultfd`'s (major, minor): a misc device with a dynamic minor, so read from the
/// device node.
pub fn userfaultfd_device() -> Option<(i64, i64)> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/dev/userfaultfd").ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let rdev = meta.rdev();
    let major = i64::try_from(nix::sys::stat::major(rdev)).ok()?;
    let minor = i64::try_from(nix::sys::stat::minor(rdev)).ok()?;
    Some((major, minor))
}

/// CRIU's version suffix for a build with the project's patches (scripts/criu-patches), the
/// first of which opens a lazy restore's userfaultfd through `/dev/userfaultfd`.
const CRIU_PATCH_LEVEL_PREFIX: &str = ".ate";

/// Whether CRIU's lazy restore can open its userfaultfd from a restored task already inside the
/// actor's user namespace. The syscall refuses one that handles kernel faults there (`uffd:
/// Unable to open an userfaultfd descriptor: Operation not permitted`) unless
/// `vm.unprivileged_userfaultfd = 1`; CRIU with the project's patch (version `….ate1` or later)
/// asks `/dev/userfaultfd`, which the criu master opened as root, instead. The sysctl stays 0.
pub fn lazy_restore_in_userns(criu_version: &str) -> bool {
    (criu_patch_level(criu_version) >= 1 && userfaultfd_device().is_some())
        || unprivileged_userfaultfd()
}

/// The `N` of a `Version: 4.2.1.ateN` line, 0 for an unpatched CRIU.
pub(super) fn criu_patch_level(criu_version: &str) -> u32 {
    super::criu::criu_version_line(criu_version)
        .and_then(|v| v.rsplit_once(CRIU_PATCH_LEVEL_PREFIX))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

fn unprivileged_userfaultfd() -> bool {
    std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_relative_to_a_dir() {
        assert_eq!(
            relative_to(Path::new("/t/a/criu-images"), Path::new("/t/gen1/criu")),
            Path::new("../../gen1/criu")
        );
        assert_eq!(
            relative_to(Path::new("/t"), Path::new("/t/x")),
            Path::new("x")
        );
    }

    #[test]
    fn criu_patch_levels() {
        assert_eq!(criu_patch_level("Version: 4.2.1.ate1\n"), 1);
        assert_eq!(criu_patch_level("Version: 4.2.1.ate12\nGitID: x"), 12);
        assert_eq!(criu_patch_level("Version: 4.2.1\n"), 0);
        assert_eq!(criu_patch_level("Version: 4.2\n"), 0);
        assert_eq!(criu_patch_level("nope"), 0);
    }

    #[test]
    fn userns_image_is_rewritten() {
        // As dumped by CRIU 4.2.1 for `0 1000000 65536` (uid and gid).
        let dumped: Vec<u8> = [
            0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55, 0x18, 0, 0, 0, 0x0a, 0x0a, 0x08, 0x00,
            0x10, 0xc0, 0x84, 0x3d, 0x18, 0x80, 0x80, 0x04, 0x12, 0x0a, 0x08, 0x00, 0x10, 0xc0,
            0x84, 0x3d, 0x18, 0x80, 0x80, 0x04,
        ]
        .to_vec();
        let out = rewrite_userns_image(&dumped, 1_065_536).expect("parses");
        // 1065536 = varint c0 84 41.
        assert_eq!(&out[..12], &dumped[..12]);
        assert_eq!(&out[16..20], &[0x10, 0xc0, 0x84, 0x41]);
        assert_eq!(&out[28..32], &[0x10, 0xc0, 0x84, 0x41]);
        let back = rewrite_userns_image(&out, 1_000_000).expect("parses");
        assert_eq!(back, dumped);
        assert!(rewrite_userns_image(&dumped[..20], 5).is_none());
    }

    #[test]
    fn ranges_are_claimed_once_and_taken_over_when_stale() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let claims = tmp.path().join("claims");
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).expect("a");
        std::fs::create_dir_all(&b).expect("b");
        let ra = claim(&claims, &a).expect("claim a");
        let rb = claim(&claims, &b).expect("claim b");
        assert_ne!(ra, rb);
        assert_eq!(
            claim(&claims, &a).expect("again"),
            ra,
            "an actor keeps its range"
        );
        assert_eq!(recorded_base(&a), Some(ra));
        release(&claims, &a);
        assert_eq!(recorded_base(&a), None);
        assert!(!claim_path(&claims, index_of(ra).expect("index")).exists());
        // b's dir disappears without a release: its claim is stale and can be taken over.
        std::fs::remove_dir_all(&b).expect("rm b");
        let index = index_of(rb).expect("index");
        let owner = tmp.path().join("c");
        std::fs::create_dir_all(&owner).expect("c");
        assert!(try_claim(&claims, index, &owner.to_string_lossy()).expect("try"));
    }
}
