#!/usr/bin/env python3
"""Helpers for the by-hand user-namespace proof (scripts/userns-proof/proof.sh).

  nstool.py mkns BASE USERNS_FILE NETNS_FILE
      a user namespace mapping 0..65535 -> BASE..BASE+65535 and a network namespace created
      together with it (so owned by it), both kept by bind mounts on the two files.
  nstool.py idmap USERNS_FILE SRC DST
      an idmapped clone of the directory SRC (ids as the user namespace maps them) attached at DST.
  nstool.py shift-userns IMG_DIR BASE
      rewrites CRIU's userns-*.img so the restored user namespace maps 0..65535 -> BASE..
"""
import ctypes, os, subprocess, sys

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SYS_open_tree, SYS_move_mount, SYS_mount_setattr = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def check(ret, what):
    if ret < 0:
        e = ctypes.get_errno()
        sys.exit(f"{what}: {os.strerror(e)} (errno {e})")
    return ret


def mkns(base, userns_file, netns_file):
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            os._exit(1)
        os.write(w, b"x")
        os.read(r2, 1)
        os._exit(0)
    if os.read(r, 1) != b"x":
        sys.exit("child could not unshare")
    for m in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{m}", "w") as f:
            f.write(f"0 {base} 65536\n")
    for ns, dst in (("user", userns_file), ("net", netns_file)):
        open(dst, "a").close()
        subprocess.run(["mount", "--bind", f"/proc/{pid}/ns/{ns}", dst], check=True)
    os.write(w2, b"x")
    os.waitpid(pid, 0)


def idmap(userns_file, src, dst):
    ufd = os.open(userns_file, os.O_RDONLY | os.O_CLOEXEC)
    fd = check(libc.syscall(SYS_open_tree, AT_FDCWD, src.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC), f"open_tree {src}")
    attr = MountAttr(MOUNT_ATTR_IDMAP, 0, 0, ufd)
    check(libc.syscall(SYS_mount_setattr, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)), f"mount_setattr {src}")
    check(libc.syscall(SYS_move_mount, fd, b"", AT_FDCWD, dst.encode(), MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {dst}")



def _varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7f) << s; s += 7
        if c < 0x80:
            return v, i


def _enc(v):
    out = bytearray()
    while True:
        c = v & 0x7f; v >>= 7
        if v:
            out.append(c | 0x80)
        else:
            out.append(c); return bytes(out)


def shift_userns(img_dir, new_base):
    """Rewrites userns-*.img so CRIU gives the restored user namespace the new host range."""
    import glob, struct
    for path in glob.glob(f"{img_dir}/userns-*.img"):
        b = open(path, "rb").read()
        head, size = b[:8], struct.unpack("<I", b[8:12])[0]
        msg, out, i = b[12:12 + size], bytearray(), 0
        while i < len(msg):
            key, i = _varint(msg, i)
            ln, i = _varint(msg, i)
            ext, j, fields = msg[i:i + ln], 0, []
            while j < len(ext):
                k, j = _varint(ext, j)
                v, j = _varint(ext, j)
                fields.append((k, new_base if k >> 3 == 2 else v))
            i += ln
            sub = b"".join(_enc(k) + _enc(v) for k, v in fields)
            out += _enc(key) + _enc(len(sub)) + sub
        open(path, "wb").write(head + struct.pack("<I", len(out)) + bytes(out) + b[12 + size:])


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "mkns":
        mkns(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif cmd == "idmap":
        idmap(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "shift-userns":
        shift_userns(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
