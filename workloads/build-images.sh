#!/usr/bin/env bash
# Build the demo workloads as static binaries and write one OCI image layout per workload:
#
#   workloads/build-images.sh OUT_DIR      → OUT_DIR/counter/, OUT_DIR/sleeper/
#
# Each layout: oci-layout, index.json (one manifest, ref name `latest`), blobs/sha256/{config,manifest,layer}.
# The single gzip layer holds /<name> plus empty /etc/ate, /data, /tmp, /var/lib.  Output is reproducible
# (fixed mtimes and owners, gzip -n, canonical JSON); a layout whose bytes would not change is left alone.
set -euo pipefail

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { printf '[build-images] ERROR: %s\n' "$*" >&2; exit 1; }

(($# == 1)) || die "usage: $0 OUT_DIR"
OUT_DIR=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGET=x86_64-unknown-linux-gnu
WORKLOADS=(counter sleeper)

for tool in cargo tar gzip sha256sum python3 ldd; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done

log "building ${WORKLOADS[*]} (static, $TARGET)"
(cd "$HERE" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --release --target "$TARGET")
BIN_DIR=$HERE/target/$TARGET/release

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
    doc = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": ["/" + name],
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ATE_DATA_DIR=/data",
            ],
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

build_layout() {
  local name=$1 ports=$2
  local bin=$BIN_DIR/$name
  [[ -x $bin ]] || die "$bin was not built"
  if ! ldd "$bin" 2>&1 | grep -qE 'not a dynamic executable|statically linked'; then
    die "$bin is not static: $(ldd "$bin" 2>&1 | head -n3)"
  fi

  local root=$WORK/$name-rootfs layout=$WORK/$name
  rm -rf "$root" "$layout"
  mkdir -p "$root/etc/ate" "$root/data" "$root/tmp" "$root/var/lib" "$layout"
  chmod 0755 "$root" "$root/etc" "$root/etc/ate" "$root/data" "$root/var" "$root/var/lib"
  chmod 1777 "$root/tmp"
  install -m 0755 "$bin" "$root/$name"

  # The layer: uncompressed tar (its sha256 is the diff_id), then gzip -n (its sha256 is the digest).
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$root" -cf "$WORK/$name-layer.tar" data etc tmp var "$name"
  local diff_id layer_digest layer_size
  diff_id=$(sha256_of "$WORK/$name-layer.tar")
  gzip -n -6 -c "$WORK/$name-layer.tar" >"$WORK/$name-layer.tar.gz"
  layer_size=$(size_of "$WORK/$name-layer.tar.gz")
  layer_digest=$(add_blob "$layout" "$WORK/$name-layer.tar.gz")

  local config_digest config_size
  json "$WORK/$name-config.json" kind=config name="$name" ports="$ports" diff_id="$diff_id"
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
    return
  fi
  rm -rf "$dest.old"
  [[ -e $dest ]] && mv "$dest" "$dest.old"
  mv "$layout" "$dest"
  rm -rf "$dest.old"
  log "$name: wrote $dest (manifest sha256:$manifest_digest, layer $layer_size bytes)"
}

build_layout counter 80,8080
build_layout sleeper 80
