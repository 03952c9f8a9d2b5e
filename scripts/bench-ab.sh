#!/bin/bash
# Two systems side by side (docs/benchmarks.md): the same `ate bench snapshots` and `ate bench
# resume` against two `ate up`s started the same way but for one setting, alternating A/B/A/B
# so machine load hits both alike. Needs a release build and the test images.
# Usage: scripts/bench-ab.sh [MEMORY (default 50MiB)] [PAIRS (default 2)]
# The two systems (defaults: the durable-snapshot encryption comparison):
#   A_LABEL=encrypted A_ENV="" A_FLAGS=""        B_LABEL=plain B_ENV="" B_FLAGS=--no-snapshot-encryption
# Today's defaults against the ones before user namespaces and encryption:
#   A_LABEL=userns+encrypted B_LABEL=plain B_ENV=ATE_USERNS=0 B_FLAGS=--no-snapshot-encryption \
#     OUT=target/bench-sandbox scripts/bench-ab.sh 50MiB 2
# SKIP_RESUME=1 runs only `ate bench snapshots` (1 GiB: `bench resume` prepares 4 sleepers);
# SKIP_SNAPSHOTS=1 only `ate bench resume`.
# Summary: scripts/bench-ab-summary.py OUT A_LABEL B_LABEL
set -u
cd "$(dirname "$0")/.."
MEM=${1:-50MiB}
PAIRS=${2:-2}
IMG=${ATE_TEST_IMAGES:-$PWD/target/tmp/ate-test-images}
ATE=${ATE_BIN:-$PWD/target/release/ate}
OUT=${OUT:-$PWD/target/bench-encryption}
A_LABEL=${A_LABEL:-encrypted} A_ENV=${A_ENV:-} A_FLAGS=${A_FLAGS:-}
B_LABEL=${B_LABEL:-plain} B_ENV=${B_ENV:-} B_FLAGS=${B_FLAGS:---no-snapshot-encryption}
mkdir -p "$OUT"
run() { # $1 label, $2 pair, $3 env (NAME=VALUE …), $4… extra ate up flags
  local label=$1 pair=$2 env=$3; shift 3
  local D; D=$(mktemp -d)
  # shellcheck disable=SC2086
  env $env HOME=$D XDG_CONFIG_HOME=$D/config ATE_KEEP_FROZEN=0 $ATE up --state-dir $D/state --workers 1 \
    --worker-slots 8 --router-listen 127.0.0.1:17980 --router-metrics-listen 127.0.0.1:17981 \
    --api-listen 127.0.0.1:17943 --api-http-listen 127.0.0.1:17990 --node-listen 127.0.0.1:17985 \
    --worker-first-ip 127.79.0.2 --worker-port 17944 --ready-file $D/ready.json \
    --images-dir "$IMG" "$@" > $D/up.log 2>&1 &
  local UP=$!
  for _ in $(seq 1 240); do [ -s $D/ready.json ] && break; sleep 0.5; done
  export HOME=$D XDG_CONFIG_HOME=$D/config ATE_STATE_DIR=$D/state ATE_ROUTER=http://127.0.0.1:17980
  if [ -z "${SKIP_SNAPSHOTS:-}" ]; then
    $ATE --api 127.0.0.1:17943 bench snapshots --rounds 3 --memory "$MEM" --state-dir $D/state \
      --images-dir "$IMG" --out "$OUT/snapshots-$label-$pair.json" 2>&1 | tee "$OUT/snapshots-$label-$pair.txt"
  fi
  if [ -z "${SKIP_RESUME:-}" ]; then
    $ATE --api 127.0.0.1:17943 bench resume --concurrency 1,4 --rounds 3 --memory "$MEM" \
      --images-dir "$IMG" --out "$OUT/resume-$label-$pair.json" 2>&1 | tee "$OUT/resume-$label-$pair.txt"
  fi
  ls $D/state/keys 2>/dev/null | sed "s/^/[$label keys] /"
  kill -INT $UP; wait $UP
  # Kept: the components' logs carry each suspend's and restore's phase times.
  cp -r "$D/state/logs" "$OUT/logs-$label-$pair" 2>/dev/null
  rm -rf "$D"
}
for pair in $(seq 1 "$PAIRS"); do
  # shellcheck disable=SC2086
  run "$A_LABEL" "$pair" "$A_ENV" $A_FLAGS
  # shellcheck disable=SC2086
  run "$B_LABEL" "$pair" "$B_ENV" $B_FLAGS
done
