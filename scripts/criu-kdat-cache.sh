#!/usr/bin/env bash
# Give CRIU its kernel-probe cache on hosts whose /run is not a tmpfs.
#
#   scripts/criu-kdat-cache.sh          (as root; idempotent; scripts/setup.sh runs it)
#
# Every `criu dump` and `criu restore` starts by probing the kernel (pagemap, uffd, memfd, vdso,
# …): ~30 ms of a ~90 ms 50 MiB restore on a 2-core VM. CRIU keeps the result in /run/criu.kdat,
# but only when that file is on a tmpfs (so that a reboot into another kernel drops it); on a
# host whose /run is an ordinary disk directory it probes again on every run. systemd hosts have
# a tmpfs /run and need nothing: this script then says so and exits.
#
# Otherwise it builds the cache the way CRIU would on such a host and makes CRIU find it:
#   1. `criu check` in a private mount namespace whose /run is a fresh tmpfs writes the cache;
#   2. the file is kept on /dev/shm (a tmpfs: gone at reboot, like CRIU wants);
#   3. it is bind-mounted onto /run/criu.kdat, where CRIU looks for it.
# A cache from another CRIU build is refused by CRIU itself (it carries a build stamp); rerun
# this script after installing another CRIU or after a reboot.
set -euo pipefail

log() { printf '[criu-kdat-cache] %s\n' "$*" >&2; }
die() { printf '[criu-kdat-cache] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
CRIU=$(command -v criu) || die "criu not on PATH"
TARGET=/run/criu.kdat
KEPT=/dev/shm/ate-criu.kdat

if [[ $(stat -f -c %T /run) == tmpfs ]]; then
  log "/run is a tmpfs: CRIU keeps its own cache in $TARGET; nothing to do"
  exit 0
fi
[[ $(stat -f -c %T /dev/shm) == tmpfs ]] || die "/dev/shm is not a tmpfs; cannot keep the cache"

# An earlier cache (maybe from another CRIU build) goes first.
if mountpoint -q "$TARGET" 2>/dev/null; then
  umount "$TARGET"
fi
# A temporary file left by an interrupted CRIU run would stop CRIU from ever writing the cache.
rm -f /run/criu.kdat.tmp /run/.criu.kdat "$KEPT"

unshare --mount --propagation private sh -c '
  mount -t tmpfs -o size=1m,mode=0755 ate-criu-kdat /run &&
  "$1" check >/dev/null 2>&1
  test -s /run/criu.kdat && cat /run/criu.kdat' sh "$CRIU" >"$KEPT.new" ||
  die "criu check in a private namespace wrote no cache"
chmod 0600 "$KEPT.new"
mv "$KEPT.new" "$KEPT"

[[ -e $TARGET ]] || install -m 0600 /dev/null "$TARGET"
mount --bind "$KEPT" "$TARGET"

# Prove that CRIU now loads it.
probe_log=$(mktemp /tmp/ate-criu-kdat.XXXXXX.log)
"$CRIU" check -v4 --log-file "$probe_log" >/dev/null 2>&1 || true
if grep -q 'Loaded kdat cache' "$probe_log"; then
  rm -f "$probe_log"
  log "CRIU loads its kernel-probe cache from $TARGET (kept on $KEPT)"
else
  tail -n 5 "$probe_log" >&2 || true
  rm -f "$probe_log"
  umount "$TARGET" 2>/dev/null || true
  die "CRIU did not load the cache; left without one (CRIU still works, ~30 ms slower per run)"
fi
