#!/usr/bin/env bash
# Build the demo workloads and write one OCI image layout per workload:
#
#   workloads/build-images.sh OUT_DIR
#     → OUT_DIR/counter/, OUT_DIR/sleeper/       static Rust binaries (/<name>); counter also has
#                                                 Debian's busybox-static in /bin (for `ate exec`)
#     → OUT_DIR/py-agent/, OUT_DIR/node-agent/   an agent script with Debian's python3 / nodejs
#
# Each layout: oci-layout, index.json (one manifest, ref name `latest`), blobs/sha256/{config,manifest,layer}.
# The single gzip layer holds the workload plus empty /etc/ate, /data, /tmp, /var/lib.  The agents'
# layers also hold the interpreter and its libraries, copied from the host's Debian packages
# (`dpkg -L`, without docs, headers and tests) with every shared library `ldd` names, at their
# merged-/usr places (/lib → usr/lib ...).  Output is reproducible for the same host packages
# (fixed mtimes and owners, gzip -n, canonical JSON, bytecode by hash); a layout whose bytes would
# not change is left alone.
set -euo pipefail

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { printf '[build-images] ERROR: %s\n' "$*" >&2; exit 1; }

(($# == 1)) || die "usage: $0 OUT_DIR"
OUT_DIR=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGET=x86_64-unknown-linux-gnu
WORKLOADS=(counter sleeper)

for tool in cargo tar gzip sha256sum python3 ldd dpkg dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done

log "building ${WORKLOADS[*]} (static, $TARGET)"
(cd "$HERE" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --release --target "$TARGET")
# Where cargo put them: CARGO_TARGET_DIR when the caller set one (a CI run with its own target
# directory), else the workloads' own target/.
BIN_DIR=${CARGO_TARGET_DIR:-$HERE/target}/$TARGET/release

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ate-build-images.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# Move a file into the layout's blob store under its own digest; prints the digest (hex).
add_blob() {
  local layout=$1 file=$2 digest
  digest=$(sha256_of "$file")
  mkdir -p "$layout/blobs/sha256"
  mv "$file" "$layout/blobs/sha256/$digest"
  chmod 0644 "$layout/blobs/sha256/$digest"
  printf '%s\n' "$digest"
}

# Canonical JSON from a Python expression over the named arguments (argv[2:] as k=v strings).
json() {
  python3 - "$@" <<'PY'
import json, sys
out = sys.argv[1]
args = dict(a.split("=", 1) for a in sys.argv[2:])
kind = args.pop("kind")
if kind == "config":
    name = args["name"]
    ports = [p for p in args["ports"].split(",") if p]
    # cmd: the command line as JSON (default /<name>); env: extra NAME=value entries as JSON.
    cmd = json.loads(args["cmd"]) if args.get("cmd") else ["/" + name]
    env = json.loads(args["env"]) if args.get("env") else []
    doc = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": cmd,
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ATE_DATA_DIR=/data",
            ] + env,
            "WorkingDir": "/",
            "ExposedPorts": {p + "/tcp": {} for p in ports},
            "Labels": {"org.opencontainers.image.title": name},
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + args["diff_id"]]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "workloads/build-images.sh " + name}],
    }
elif kind == "manifest":
    doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": "sha256:" + args["config_digest"],
            "size": int(args["config_size"]),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": "sha256:" + args["layer_digest"],
            "size": int(args["layer_size"]),
        }],
    }
elif kind == "index":
    doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": "sha256:" + args["manifest_digest"],
            "size": int(args["manifest_size"]),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": "latest"},
        }],
    }
elif kind == "layout":
    doc = {"imageLayoutVersion": "1.0.0"}
else:
    raise SystemExit("unknown kind " + kind)
with open(out, "wb") as f:
    f.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
PY
}

# The skeleton every image has: empty /etc/ate, /data, /tmp (1777), /var/lib.
make_root() {
  local root=$1
  rm -rf "$root"
  mkdir -p "$root/etc/ate" "$root/data" "$root/tmp" "$root/var/lib"
  chmod 0755 "$root" "$root/etc" "$root/etc/ate" "$root/data" "$root/var" "$root/var/lib"
  chmod 1777 "$root/tmp"
}

# Packs ROOT into the layout OUT_DIR/NAME.  CMD: the command line as JSON ("" for ["/NAME"]); ENV: a
# JSON list of NAME=value added to the image's Env (""); then the top-level entries of the layer in
# their order (default: all, sorted).
pack_layout() {
  local name=$1 root=$2 ports=$3 cmd=$4 env=$5
  shift 5
  local layout=$WORK/$name
  rm -rf "$layout"
  mkdir -p "$layout"

  # The layer: uncompressed tar (its sha256 is the diff_id), then gzip -n (its sha256 is the digest).
  local entries=("$@")
  ((${#entries[@]})) || mapfile -t entries < <(cd "$root" && LC_ALL=C ls -A | LC_ALL=C sort)
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$root" -cf "$WORK/$name-layer.tar" "${entries[@]}"
  local diff_id layer_digest layer_size
  diff_id=$(sha256_of "$WORK/$name-layer.tar")
  gzip -n -6 -c "$WORK/$name-layer.tar" >"$WORK/$name-layer.tar.gz"
  rm -f "$WORK/$name-layer.tar"
  layer_size=$(size_of "$WORK/$name-layer.tar.gz")
  layer_digest=$(add_blob "$layout" "$WORK/$name-layer.tar.gz")

  local config_digest config_size
  json "$WORK/$name-config.json" kind=config name="$name" ports="$ports" diff_id="$diff_id" cmd="$cmd" env="$env"
  config_size=$(size_of "$WORK/$name-config.json")
  config_digest=$(add_blob "$layout" "$WORK/$name-config.json")

  local manifest_digest manifest_size
  json "$WORK/$name-manifest.json" kind=manifest config_digest="$config_digest" config_size="$config_size" \
    layer_digest="$layer_digest" layer_size="$layer_size"
  manifest_size=$(size_of "$WORK/$name-manifest.json")
  manifest_digest=$(add_blob "$layout" "$WORK/$name-manifest.json")

  json "$layout/index.json" kind=index manifest_digest="$manifest_digest" manifest_size="$manifest_size"
  json "$layout/oci-layout" kind=layout
  chmod 0644 "$layout/index.json" "$layout/oci-layout"

  local dest=$OUT_DIR/$name
  if [[ -d $dest ]] && diff -r -q "$layout" "$dest" >/dev/null 2>&1; then
    log "$name: unchanged (manifest sha256:$manifest_digest) at $dest"
    rm -rf "$layout"
    return
  fi
  rm -rf "$dest.old"
  [[ -e $dest ]] && mv "$dest" "$dest.old"
  mv "$layout" "$dest"
  rm -rf "$dest.old"
  log "$name: wrote $dest (manifest sha256:$manifest_digest, layer $layer_size bytes)"
}

# BUSYBOX=1: also Debian's static busybox at /bin/busybox with a link per applet in /bin (sh, ls,
# ps, cat, tty, ...), so `ate exec actor counter-1 -a ate-demo -- sh` has a shell to run.
build_layout() {
  local name=$1 ports=$2 busybox=${3:-0}
  local bin=$BIN_DIR/$name
  [[ -x $bin ]] || die "$bin was not built"
  if ! ldd "$bin" 2>&1 | grep -qE 'not a dynamic executable|statically linked'; then
    die "$bin is not static: $(ldd "$bin" 2>&1 | head -n3)"
  fi
  local root=$WORK/$name-rootfs entries=(data etc tmp var "$name") applet
  make_root "$root"
  install -m 0755 "$bin" "$root/$name"
  if ((busybox)); then
    [[ -x /bin/busybox ]] && grep -qE 'not a dynamic executable|statically linked' <<<"$(ldd /bin/busybox 2>&1 || true)" ||
      die "/bin/busybox (a static one: Debian's busybox-static; scripts/setup.sh installs it) not found"
    install -D -m 0755 /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list | LC_ALL=C sort); do
      [[ $applet == busybox || -e $root/bin/$applet ]] || ln -s busybox "$root/bin/$applet"
    done
    entries=(bin "${entries[@]}")
  fi
  pack_layout "$name" "$root" "$ports" "" "" "${entries[@]}"
  rm -rf "$root"
}

build_layout counter 80,8080 1
build_layout sleeper 80

# ------------------------------------------------------------------ interpreter images

# The files of Debian packages an image needs: what `dpkg -L` lists, without directories, docs,
# man pages, headers, npm and test suites.
package_files() {
  local f
  dpkg -L "$@" | while IFS= read -r f; do
    [[ -L $f || -f $f ]] || continue
    case $f in
      /usr/share/* | /usr/include/* | /usr/lib/node_modules/* | /usr/lib/binfmt.d/* | */__pycache__/* | \
        */test/* | */tests/* | */idlelib/* | */tkinter/* | */turtledemo/* | */lib-dynload/_test* | \
        */lib-dynload/_ctypes_test* | */lib-dynload/xxlimited*) continue ;;
    esac
    printf '%s\n' "$f"
  done
}

# Copies the host's PATH into ROOT at its place on a merged-/usr system (/lib/x86_64-linux-gnu/x
# lands in /usr/lib/x86_64-linux-gnu/x, as on the host): a symlink stays one, and the file it
# finally points to comes too.
add_host_file() {
  local root=$1 path=$2 dir real
  dir=$(readlink -f "$(dirname "$path")")
  real=$dir/$(basename "$path")
  [[ -L $real || -e $real ]] || die "$path does not exist"
  [[ -L $root$real || -e $root$real ]] && return 0
  mkdir -p "$root$dir"
  cp -P --preserve=mode "$real" "$root$real"
  if [[ -L $real ]]; then
    add_host_file "$root" "$(readlink -f "$real")"
  fi
}

# Every shared library (and the dynamic loader) that ldd names for the executables and libraries
# under ROOT, from the host.
add_shared_libs() {
  local root=$1 f host out lib
  local -A seen=()
  while IFS= read -r -d '' f; do
    host=${f#"$root"}
    out=$(ldd "$host" 2>&1) || continue # not a dynamic ELF file
    if grep -q 'not found' <<<"$out"; then
      die "ldd $host: a library is missing on this host: $(grep 'not found' <<<"$out" | head -n3)"
    fi
    for lib in $(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$out"); do
      [[ -n ${seen[$lib]:-} ]] && continue
      seen[$lib]=1
      add_host_file "$root" "$lib"
    done
  done < <(find "$root" -type f \( -path '*/bin/*' -o -name '*.so' -o -name '*.so.*' \) -print0 | LC_ALL=C sort -z)
}

# Finishes an interpreter rootfs: merged-/usr links at the top (/bin → usr/bin ...), symlinks
# whose target was left out removed, directories 0755.
finish_root() {
  local root=$1 d l t p
  for d in bin lib lib64 sbin; do
    if [[ -d $root/usr/$d && ! -e $root/$d ]]; then ln -s "usr/$d" "$root/$d"; fi
  done
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    if [[ $t == /* ]]; then p=$root$t; else p=$(dirname "$l")/$t; fi
    [[ -e $p ]] || rm -f "$l"
  done < <(find "$root/usr" "$root/etc" -type l -print0)
  find "$root" -type d ! -path "$root/tmp" -exec chmod 0755 {} +
}

# The Debian package that holds PATH on this host.
package_of() {
  local pkg
  pkg=$(dpkg -S "$1" 2>/dev/null | awk -F': ' -v p="$1" '$2 == p && $1 !~ /^diversion/ { print $1; exit }')
  [[ -n $pkg ]] || die "no installed Debian package holds $1 (scripts/setup.sh installs it)"
  printf '%s\n' "${pkg%%:*}"
}

build_py_agent() {
  [[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 not found (Debian's python3; scripts/setup.sh installs it)"
  # /usr/bin/python3 → python3.X: the interpreter, its minimal and standard library (sqlite3 included).
  local py root=$WORK/py-agent-rootfs pkg f
  py=$(basename "$(readlink -f /usr/bin/python3)")
  [[ $py =~ ^python3\.[0-9]+$ ]] || die "/usr/bin/python3 is $py, not a Debian python3.X"
  make_root "$root"
  for pkg in "$py-minimal" "lib$py-minimal" "lib$py-stdlib"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      die "Debian package $pkg is not installed (scripts/setup.sh installs it)"
  done
  while IFS= read -r f; do add_host_file "$root" "$f"; done < <(package_files "$py-minimal" "lib$py-minimal" "lib$py-stdlib")
  add_host_file "$root" /usr/bin/python3
  add_shared_libs "$root"
  [[ -n $(find "$root/usr/lib/$py/lib-dynload" -name '_sqlite3.*.so') ]] || die "the sqlite3 module of $py is missing"
  # Bytecode checked by hash, not by mtime (the layer's mtimes are all 0), written now so a start
  # does not compile the standard library (and never writes it into the actor's rootfs).
  /usr/bin/python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$root" -p / \
    "$root/usr/lib/$py" >/dev/null || die "compileall failed"
  install -D -m 0644 "$HERE/py-agent/agent.py" "$root/app/agent.py"
  finish_root "$root"
  pack_layout py-agent "$root" 80 '["/usr/bin/python3","-u","/app/agent.py"]' \
    '["PYTHONDONTWRITEBYTECODE=1","HOME=/tmp"]'
  rm -rf "$root"
}

build_node_agent() {
  [[ -x /usr/bin/node ]] || die "/usr/bin/node not found (the nodejs package; scripts/setup.sh installs it)"
  local root=$WORK/node-agent-rootfs pkg f
  pkg=$(package_of /usr/bin/node)
  make_root "$root"
  while IFS= read -r f; do add_host_file "$root" "$f"; done < <(package_files "$pkg")
  add_host_file "$root" /usr/bin/node
  add_shared_libs "$root"
  install -D -m 0644 "$HERE/node-agent/agent.js" "$root/app/agent.js"
  finish_root "$root"
  # UV_USE_IO_URING=0: libuv's io_uring (which CRIU cannot dump, and the worker's seccomp profile
  # refuses anyway) stays off.
  pack_layout node-agent "$root" 80 '["/usr/bin/node","/app/agent.js"]' '["UV_USE_IO_URING=0","HOME=/tmp"]'
  rm -rf "$root"
}

log "building py-agent and node-agent (interpreters from this host's Debian packages)"
build_py_agent
build_node_agent
