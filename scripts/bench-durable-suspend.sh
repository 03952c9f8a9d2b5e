#!/bin/bash
# One lazily restored sleeper (default 1 GiB) on a fresh `ate up` (1 worker, release build): each
# cycle dirties 1 % of its pages, suspends it with `ate suspend --durable` (dump, node-local
# generation, upload with deltas against the parent), timed, then resumes it and reads all its
# memory. A quicker probe of the durable suspend rows of `ate bench snapshots`
# (docs/benchmarks.md). Extra arguments go to `ate up` (e.g. --no-snapshot-encryption).
# Usage: scripts/bench-durable-suspend.sh LABEL [ate up flags…]   (MIB=1024 CYCLES=3 PERF=1|first:
# `perf record -a -g` into $OUT/LABEL/perf.data during the last, or the first, durable suspend)
set -u
cd "$(dirname "$0")/.."
label=${1:?label}; shift
IMG=${ATE_TEST_IMAGES:-$PWD/target/tmp/ate-test-images}
ATE=${ATE_BIN:-$PWD/target/release/ate}
MIB=${MIB:-1024} CYCLES=${CYCLES:-3}
D=${OUT:-$PWD/target/bench-durable}/$label; rm -rf "$D"; mkdir -p "$D"
cat > "$D/sleeper.yaml" <<YAML
apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {name: bd}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {namespace: bd, name: sleeper}
spec:
  containers:
    - name: sleeper
      image: "oci-layout:$IMG/sleeper:latest"
      command: ["/sleeper"]
      env: [{name: SLEEPER_MEMORY_MIB, value: "$MIB"}]
      wakeupProbe: {httpGet: {path: /healthz, port: 80}, timeoutSeconds: 120}
  resources: {cpu: 250m, memory: $((MIB + 64))Mi}
  snapshots: {fidelity: memory}
  idleTimeout: 5m
YAML
env RUST_LOG=info HOME=$D XDG_CONFIG_HOME=$D/config ATE_KEEP_FROZEN=0 \
  $ATE up --state-dir $D/state --workers 1 --worker-slots 8 \
  --router-listen 127.0.0.1:17980 --router-metrics-listen 127.0.0.1:17981 \
  --api-listen 127.0.0.1:17943 --api-http-listen 127.0.0.1:17990 --node-listen 127.0.0.1:17985 \
  --worker-first-ip 127.79.0.2 --worker-port 17944 --ready-file $D/ready.json \
  --images-dir "$IMG" "$@" > $D/up.log 2>&1 &
UP=$!
for _ in $(seq 1 240); do [ -s $D/ready.json ] && break; sleep 0.5; done
export HOME=$D XDG_CONFIG_HOME=$D/config ATE_STATE_DIR=$D/state
A="$ATE --api 127.0.0.1:17943"
$A apply -f "$D/sleeper.yaml" > /dev/null
$A create actor s1 -a bd -t bd/sleeper > /dev/null
get() { curl -s -m 300 -o /dev/null -w "$2" -H 'ate-target-actor: bd/s1' "http://127.0.0.1:17980$1"; }
get /healthz ""; get / ""
# The first durable copy: every chunk new to the store; later ones go as deltas.
PP=
if [ "${PERF:-}" = first ]; then
  perf record -a -g -o $D/perf.data > /dev/null 2>&1 & PP=$!; sleep 0.3
fi
s=$(date +%s.%N); $A suspend actor s1 -a bd --durable > /dev/null
echo "[$label] first durable suspend: $(echo "$(date +%s.%N) - $s" | bc) s"
[ -n "$PP" ] && kill -INT $PP && wait $PP
get /healthz ""; get / ""
for i in $(seq 1 "$CYCLES"); do
  get "/dirty?percent=1" ""
  PP=
  if [ "${PERF:-}" = 1 ] && [ "$i" = "$CYCLES" ]; then
    perf record -a -g -o $D/perf.data > /dev/null 2>&1 & PP=$!; sleep 0.3
  fi
  s=$(date +%s.%N); $A suspend actor s1 -a bd --durable > /dev/null
  echo "[$label] durable suspend $i (1 % dirtied): $(echo "$(date +%s.%N) - $s" | bc) s"
  [ -n "$PP" ] && kill -INT $PP && wait $PP
  get /healthz "[$label] resume $i: first answer %{time_total} s\n"
  get / "[$label] resume $i: all memory read by %{time_total} s more\n"
done
kill -INT $UP; wait $UP
