#!/usr/bin/env bash
# Install everything the project's builds and tests need on a fresh Debian 12 machine.
# Idempotent; run as root.  Steps that are already satisfied are skipped and say so.
#
#   - Debian packages: runc, iptables, nftables, iproute2, jq, curl, docker-registry, CRIU build
#     deps, PostgreSQL 15, Python 3.11 and Node.js (the interpreters of the py-agent and node-agent
#     images: workloads/build-images.sh copies them from these packages), busybox-static (the
#     counter image's shell)
#   - CRIU 4.2.1 built from Debian's source archive (suite `unstable`) when `criu` is missing,
#     older than 4.2, or `criu check` fails  (see shared/notes/sandbox-facts.md for why)
#   - CRIU's kernel-probe cache on hosts whose /run is not a tmpfs (scripts/criu-kdat-cache.sh)
#   - moto[server] from PyPI (S3 API on loopback for object-store tests)
#   - cargo-nextest if missing
set -euo pipefail

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"

export DEBIAN_FRONTEND=noninteractive

CRIU_VERSION=4.2.1
CRIU_ORIG=criu_${CRIU_VERSION}.orig.tar.xz
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_PREFIX=/usr/local/sbin
# The project's patches (scripts/criu-patches/*.patch, applied in order); the last one sets
# CRIU's version suffix to CRIU_PATCH_LEVEL, which is how a build with them is recognised.
CRIU_PATCH_LEVEL=ate3
CRIU_PATCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/criu-patches
TMP_SRC_LIST=/etc/apt/sources.list.d/ate-criu-src-unstable.list

# docker-registry: the distribution registry v2 the registry-pull tests run on loopback (each test
# starts its own with a private config; the package's system service is not used).
# systemd: systemd-analyze, which checks the deploy/systemd units in the test suite.
# podman: the baseline of `ate bench resume --baseline podman` (checkpoint/restore on the same
# CRIU), run by the test suite's bench_podman test.
# python3.11-minimal, libpython3.11-minimal, libpython3.11-stdlib (sqlite3 module included): the
# py-agent image's interpreter and standard library.
# busybox-static: the counter image's shell and tools (`ate exec actor counter-1 -- sh`).
RUNTIME_PKGS=(runc iptables nftables iproute2 jq curl ca-certificates tar gzip xz-utils python3
  python3.11-minimal libpython3.11-minimal libpython3.11-stdlib busybox-static
  nginx-light nghttp2-client
  podman
  docker-registry systemd)
CRIU_BUILD_PKGS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler python3-protobuf libnl-3-dev libcap-dev libnet1-dev libbsd-dev libaio-dev
  libgnutls28-dev libnftables-dev uuid-dev iptables patch)

# Never leave the temporary deb-src entry behind, whatever happens.
cleanup_src_list() {
  if [[ -f $TMP_SRC_LIST ]]; then
    rm -f "$TMP_SRC_LIST"
    log "removed temporary $TMP_SRC_LIST; refreshing package lists"
    apt-get update -qq || true
  fi
}
WORKDIR=""
cleanup() {
  cleanup_src_list
  [[ -n $WORKDIR && -d $WORKDIR ]] && rm -rf "$WORKDIR"
  return 0
}
trap cleanup EXIT

# A stale entry from an interrupted earlier run.
if [[ -f $TMP_SRC_LIST ]]; then
  log "found stale $TMP_SRC_LIST from an earlier run; removing"
  rm -f "$TMP_SRC_LIST"
fi

# ---------------------------------------------------------------- Debian packages
log "apt-get update"
apt-get update -qq

missing=()
for p in "${RUNTIME_PKGS[@]}" "${CRIU_BUILD_PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [[ ! -x /usr/lib/postgresql/15/bin/postgres ]]; then
  missing+=(postgresql-15)
fi
# The node-agent image's interpreter: whatever package provides /usr/bin/node (Debian's nodejs,
# or a nodejs from another source already installed); Debian's when there is none.
if [[ ! -x /usr/bin/node ]]; then
  missing+=(nodejs)
fi
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "Debian packages already installed"
fi
[[ -x /usr/lib/postgresql/15/bin/postgres ]] || die "PostgreSQL 15 server binaries missing after install"
[[ -x /usr/bin/node ]] || die "/usr/bin/node missing after installing nodejs"

# ---------------------------------------------------------------- CRIU 4.2.1
criu_ok() {
  local c v major minor
  c=$(command -v criu 2>/dev/null) || { log "criu: not on PATH"; return 1; }
  v=$("$c" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -n1)
  [[ -n $v ]] || { log "criu at $c: cannot read version"; return 1; }
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  if ((major < 4 || (major == 4 && minor < 2))); then
    log "criu at $c is $v (< 4.2)"
    return 1
  fi
  if [[ $v != *".$CRIU_PATCH_LEVEL" ]]; then
    log "criu at $c is $v, without the project's patches (.$CRIU_PATCH_LEVEL: lazy restores in user namespaces, image streaming over RPC, memory tracking with uffd-wp)"
    return 1
  fi
  if ! "$c" check >/dev/null 2>&1; then
    log "criu at $c ($v): 'criu check' fails"
    return 1
  fi
  log "criu at $c is $v and 'criu check' passes"
  return 0
}

debian_mirror_uri() {
  # The first URI of the main Debian archive (not -security) in debian.sources.
  local f=/etc/apt/sources.list.d/debian.sources uri
  if [[ -f $f ]]; then
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
  fi
  if [[ -z ${uri:-} && -f /etc/apt/sources.list ]]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
  fi
  [[ -n ${uri:-} ]] || die "cannot find the Debian archive URI in debian.sources"
  printf '%s\n' "${uri%/}"
}

build_criu() {
  local uri
  uri=$(debian_mirror_uri)
  WORKDIR=$(mktemp -d /tmp/ate-criu-build.XXXXXX)
  log "adding temporary deb-src entry ($uri unstable main) in $TMP_SRC_LIST"
  printf 'deb-src %s unstable main\n' "$uri" >"$TMP_SRC_LIST"
  apt-get update -qq
  log "apt-get source --download-only criu (into $WORKDIR)"
  # The .debian.tar.xz may 404; only the orig tarball matters and its checksum is verified below.
  (cd "$WORKDIR" && apt-get source --download-only -qq criu) || log "apt-get source reported an error; checking what arrived"
  cleanup_src_list

  [[ -f $WORKDIR/$CRIU_ORIG ]] || die "$CRIU_ORIG was not downloaded (got: $(ls "$WORKDIR" | tr '\n' ' '))"
  echo "$CRIU_SHA256  $WORKDIR/$CRIU_ORIG" | sha256sum -c --quiet - || die "sha256 mismatch for $CRIU_ORIG"
  log "sha256 of $CRIU_ORIG verified"

  tar -C "$WORKDIR" -xJf "$WORKDIR/$CRIU_ORIG"
  local src
  src=$(find "$WORKDIR" -mindepth 1 -maxdepth 1 -type d -name 'criu*' | head -n1)
  [[ -n $src ]] || die "unpacked CRIU source directory not found"
  local p
  for p in "$CRIU_PATCH_DIR"/*.patch; do
    log "applying $(basename "$p")"
    patch -d "$src" -p1 --quiet <"$p" || die "CRIU patch $p does not apply"
  done
  log "building CRIU $CRIU_VERSION in $src (make -j2 criu)"
  make -C "$src" -j2 criu >"$WORKDIR/build.log" 2>&1 || { tail -n 50 "$WORKDIR/build.log" >&2; die "CRIU build failed"; }
  install -D -m 0755 "$src/criu/criu" "$CRIU_PREFIX/criu"
  hash -r
  log "installed $CRIU_PREFIX/criu: $("$CRIU_PREFIX/criu" --version | head -n1)"
}

if criu_ok; then
  log "CRIU: nothing to do"
else
  # A Debian criu (3.17) earlier on PATH would shadow ours; /usr/local/sbin normally comes first.
  build_criu
  criu_ok || die "CRIU $CRIU_VERSION installed but 'criu check' still fails: $(criu check 2>&1 | tail -n 3)"
  if [[ $(command -v criu) != "$CRIU_PREFIX/criu" ]]; then
    die "another criu ($(command -v criu)) shadows $CRIU_PREFIX/criu on PATH"
  fi
fi

# ---------------------------------------------------------------- moto_server
if command -v moto_server >/dev/null 2>&1 && moto_server --help >/dev/null 2>&1; then
  log "moto_server already installed"
else
  log "installing moto[server] with pip"
  if command -v pip3 >/dev/null 2>&1; then PIP=pip3; else PIP="python3 -m pip"; fi
  # Debian's system python is externally managed; pyenv's is not.  Try plain first.
  $PIP install -q 'moto[server]' 2>/dev/null || $PIP install -q --break-system-packages 'moto[server]'
  hash -r
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
  command -v moto_server >/dev/null 2>&1 || die "moto_server still not on PATH after pip install"
fi

# ---------------------------------------------------------------- kubernetes-validate
# Offline Kubernetes OpenAPI schemas for the deploy/ manifests (crates/ate-cli/tests/deploy.rs).
if command -v kubernetes-validate >/dev/null 2>&1; then
  log "kubernetes-validate already installed"
else
  if command -v pip3 >/dev/null 2>&1; then PIP=pip3; else PIP="python3 -m pip"; fi
  log "pip install kubernetes-validate==1.37.0"
  # shellcheck disable=SC2086 # PIP may be two words
  $PIP install -q 'kubernetes-validate==1.37.0' 2>/dev/null \
    || $PIP install -q --break-system-packages 'kubernetes-validate==1.37.0'
  hash -r
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
  command -v kubernetes-validate >/dev/null 2>&1 || die "kubernetes-validate not on PATH after pip install"
fi

# ---------------------------------------------------------------- CRIU's kernel-probe cache
# ~30 ms off every dump and restore on hosts whose /run is not a tmpfs (see the script).
bash "$(dirname "${BASH_SOURCE[0]}")/criu-kdat-cache.sh" ||
  log "WARNING: no CRIU kernel-probe cache; every dump and restore probes the kernel again"

# ---------------------------------------------------------------- Rust test tooling
if command -v cargo >/dev/null 2>&1; then
  if cargo nextest --version >/dev/null 2>&1; then
    log "cargo-nextest already installed"
  else
    log "installing cargo-nextest from crates.io"
    cargo install --locked cargo-nextest
  fi
  if command -v rustup >/dev/null 2>&1; then
    for comp in rustfmt clippy; do
      if ! rustup component list --installed 2>/dev/null | grep -q "^$comp"; then
        log "adding rustup component $comp"
        rustup component add "$comp" || log "could not add $comp (no network for toolchains?)"
      fi
    done
  fi
else
  log "WARNING: cargo not found; Rust builds will fail"
fi

# ---------------------------------------------------------------- summary
log "runc: $(runc --version | head -n1)"
log "criu: $(criu --version | head -n1) at $(command -v criu); check: $(criu check 2>&1 | tail -n1)"
log "postgres: $(/usr/lib/postgresql/15/bin/postgres --version)"
log "moto_server: $(command -v moto_server)"
log "done"
