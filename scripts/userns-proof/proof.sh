#!/bin/bash
# By-hand proof (issue 30): an actor in its own user namespace under runc 1.1.5 + CRIU 4.2.1,
# checkpointed and restored on the same and on another host uid range, eagerly and lazily.
#   scripts/userns-proof/proof.sh IMAGES_DIR   (IMAGES_DIR/counter from workloads/build-images.sh)
# The lazy restore needs CRIU with scripts/criu-patches (it opens /dev/userfaultfd as root);
# with an unpatched CRIU it shows the EPERM unless LAZY_SYSCTL=1 sets vm.unprivileged_userfaultfd=1
# for its duration (put back afterwards).
# Everything it makes lives under a temporary dir and is removed on exit.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
IMAGES=${1:?images dir}
T=$(mktemp -d /tmp/userns-proof.XXXXXX)
R="runc --root $T/runc"
A=1000000 B=1065536
step() { echo "== $*"; }
cleanup() {
  $R delete -f p 2>/dev/null
  [ -f "$T/lp.pid" ] && kill "$(cat "$T/lp.pid")" 2>/dev/null
  for m in "$T/netns" "$T/a/rootfs" "$T/a/lower-id" "$T/a/self-id" "$T/a/vol-id" "$T/userA" "$T/netA" "$T/userB" "$T/netB"; do umount "$m" 2>/dev/null; done
  rmdir /sys/fs/cgroup/*/ate-userns-proof/a /sys/fs/cgroup/*/ate-userns-proof 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
chmod 0711 "$T"  # the actor range must traverse to its rootfs
mkdir -p "$T"/lower "$T"/a/{upper,work,rootfs,lower-id,self-id,vol/data,vol-id}
blob=$(ls -S "$IMAGES"/counter/blobs/sha256/* | head -1)
tar -xzf "$blob" -C "$T/lower"
chmod 0710 "$T/a"
cat > "$T/criu.conf" <<C
network-lock skip
manage-cgroups ignore
tcp-close
C

# The worker's mounts for range $1: image layer and the actor's dir idmapped by a user
# namespace with that range (made only to carry the mapping), the overlay mounted with fsuid =
# the range's root so overlayfs' own files (work dir, copy-ups) are mapped, volume idmapped.
mounts() {
  local base=$1 u=$T/user$2
  python3 "$HERE/nstool.py" mkns "$base" "$u" "$T/net$2" || exit 1
  python3 "$HERE/nstool.py" idmap "$u" "$T/lower" "$T/a/lower-id" || exit 1
  python3 "$HERE/nstool.py" idmap "$u" "$T/a" "$T/a/self-id" || exit 1
  python3 "$HERE/nstool.py" idmap "$u" "$T/a/vol/data" "$T/a/vol-id" || exit 1
  python3 - "$base" "$T" <<'P' || exit 1
import ctypes, os, sys
base, t = int(sys.argv[1]), sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(28, 1 << 2, 0, 0, 0)  # SECBIT_NO_SETUID_FIXUP: keep capabilities with the new fsuid
libc.setfsgid(base); libc.setfsuid(base)
o = f"lowerdir={t}/a/lower-id,upperdir={t}/a/self-id/upper,workdir={t}/a/self-id/work"
if libc.mount(b"overlay", f"{t}/a/rootfs".encode(), b"overlay", 0, o.encode()) != 0:
    sys.exit(f"mount overlay: {os.strerror(ctypes.get_errno())}")
P
  chgrp "$base" "$T/a"
  python3 "$HERE/mkconfig.py" "$T/a" "$T/a/rootfs" "" "" "$base" "$T/a/vol-id"
  python3 - "$T" <<'P'
import json, sys
t = sys.argv[1]; p = f"{t}/a/config.json"; c = json.load(open(p))
c["annotations"] = {"org.criu.config": f"{t}/criu.conf"}
c["hooks"] = {"createRuntime": [{"path": "/bin/sh", "args": ["sh", f"{t}/hook.sh", f"{t}/netns"]}]}
# runc puts CRIU in the container's cgroup for a restore: its device filter must let CRIU open
# /dev/userfaultfd (10:257) for a lazy restore. No device node is made in the container.
c["linux"]["resources"]["devices"].append({"allow": True, "type": "c", "major": 10, "minor": 257, "access": "rw"})
json.dump(c, open(p, "w"), indent=1)
P
}
unmounts() { umount "$T/a/rootfs" "$T/a/lower-id" "$T/a/self-id" "$T/a/vol-id"; }
cp "$HERE/netns-hook.sh" "$T/hook.sh"
sed -i "s|/tmp/unsp/hook.log|$T/hook.log|" "$T/hook.sh"
# The restored task opens some images (timens-0.img) after it entered the new user namespace:
# the image dir must let the range's root group through (0710, group = the range's root gid).
imgs_for() { chgrp "$2" "$1" && chmod 0710 "$1"; }
hit() { nsenter --net="$T/netns" curl -s -m 2 http://169.254.17.2:80/; echo; }
ids() { grep -E '^(Uid|Gid)' "/proc/$(cat "$T/a/pid")/status" | tr '\n' ' '; echo; }

step "run on range $A (runc makes user+net namespaces; the createRuntime hook sets up the netns from outside)"
mounts $A A
(cd "$T/a" && $R run -d --pid-file "$T/a/pid" p </dev/null > >(cat >"$T/run.out") 2>&1) || { cat "$T/run.out"; exit 1; }
hit; hit; ids
step "checkpoint"
$R checkpoint --image-path "$T/img1" --work-path "$T/w1" p || { grep Error "$T/w1/dump.log"; exit 1; }
umount "$T/netns"
imgs_for "$T/img1" $A
step "restore on the same range (--empty-ns network: the hook rebuilds the netns)"
(cd "$T/a" && $R restore -d --empty-ns network --image-path "$T/img1" --work-path "$T/r1" --pid-file "$T/a/pid" p </dev/null >/dev/null 2>"$T/r1.err") || { cat "$T/r1.err"; grep Error "$T/r1/restore.log"; exit 1; }
hit; ids
step "checkpoint, then restore on range $B (userns-*.img rewritten, mounts idmapped for $B)"
$R checkpoint --image-path "$T/img2" --work-path "$T/w2" p || exit 1
umount "$T/netns"; unmounts
mounts $B B
python3 "$HERE/nstool.py" shift-userns "$T/img2" $B
imgs_for "$T/img2" $B
(cd "$T/a" && $R restore -d --empty-ns network --image-path "$T/img2" --work-path "$T/r2" --pid-file "$T/a/pid" p </dev/null >/dev/null 2>"$T/r2.err") || { cat "$T/r2.err"; grep Error "$T/r2/restore.log"; exit 1; }
hit; ids
echo "files from the host, through the actor's root:"; ls -ln "/proc/$(cat "$T/a/pid")/root/var/lib/counter" "/proc/$(cat "$T/a/pid")/root/data"
echo "the same files on disk (canonical ids):"; ls -ln "$T/a/upper/var/lib/counter" "$T/a/vol/data"
step "lazy restore (criu lazy-pages daemon)"
$R checkpoint --image-path "$T/img3" --work-path "$T/w3" p || exit 1
umount "$T/netns"
imgs_for "$T/img3" $B
mkdir -p "$T/r3"
criu lazy-pages --images-dir "$T/img3" --work-dir "$T/r3" -o lp.log & echo $! > "$T/lp.pid"
sleep 0.3
old=$(cat /proc/sys/vm/unprivileged_userfaultfd)
[ "${LAZY_SYSCTL:-0}" = 1 ] && sysctl -qw vm.unprivileged_userfaultfd=1
(cd "$T/a" && $R restore -d --lazy-pages --empty-ns network --image-path "$T/img3" --work-path "$T/r3" --pid-file "$T/a/pid" p </dev/null >/dev/null 2>"$T/r3.err")
rc=$?
sysctl -qw vm.unprivileged_userfaultfd="$old"
if [ $rc = 0 ]; then hit; ids; else echo "lazy restore failed:"; grep Error "$T/r3/restore.log"; fi
