#!/bin/bash
# One eagerly restored sleeper (default 1 GiB) suspended and resumed CYCLES times on a fresh
# `ate up` (1 worker, release build, KEEP_FROZEN off), printing each resume's first answer and the
# worker's `runc restore` time: a quicker probe of the eager node-local row of `ate bench
# snapshots` (docs/benchmarks.md). Extra arguments go to `ate up` (e.g. --no-snapshot-encryption).
# Usage: scripts/bench-eager-restore.sh LABEL [ate up flags…]   (MIB=1024 CYCLES=3 PERF=1)
set -u
cd "$(dirname "$0")/.."
label=${1:?label}; shift
IMG=${ATE_TEST_IMAGES:-$PWD/target/tmp/ate-test-images}
ATE=${ATE_BIN:-$PWD/target/release/ate}
MIB=${MIB:-1024} CYCLES=${CYCLES:-3}
D=${OUT:-$PWD/target/bench-eager}/$label; rm -rf "$D"; mkdir -p "$D"
cat > "$D/sleeper.yaml" <<YAML
apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {name: be}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {namespace: be, name: sleeper}
spec:
  containers:
    - name: sleeper
      image: "oci-layout:$IMG/sleeper:latest"
      command: ["/sleeper"]
      env: [{name: SLEEPER_MEMORY_MIB, value: "$MIB"}]
      wakeupProbe: {httpGet: {path: /healthz, port: 80}, timeoutSeconds: 120}
  resources: {cpu: 250m, memory: $((MIB + 64))Mi}
  snapshots: {fidelity: memory, memoryRestore: eager}
  idleTimeout: 5m
YAML
env RUST_LOG=info,ate_worker::runc=debug HOME=$D XDG_CONFIG_HOME=$D/config ATE_KEEP_FROZEN=0 \
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
$A create actor s1 -a be -t be/sleeper > /dev/null
curl -s -m 300 -o /dev/null -H 'ate-target-actor: be/s1' http://127.0.0.1:17980/healthz
for i in $(seq 1 "$CYCLES"); do
  $A suspend actor s1 -a be > /dev/null
  sleep 2
  PP=
  if [ -n "${PERF:-}" ] && [ "$i" = "$CYCLES" ]; then
    perf record -a -g -o $D/perf.data -- sleep 4 > /dev/null 2>&1 & PP=$!; sleep 0.3
  fi
  curl -s -m 300 -o /dev/null -w "[$label] resume $i: first answer %{time_total} s\n" \
    -H 'ate-target-actor: be/s1' http://127.0.0.1:17980/healthz
  [ -n "$PP" ] && wait $PP
done
kill -INT $UP; wait $UP
grep -ho "runc_restore_ms=[0-9]*" $D/state/logs/worker-1.log | sed "s/^/[$label] /"
# The logs stay for their phase times; the 1 GiB generations would fill the disk run after run.
rm -rf "$D/state/snapshots" "$D/state/durable" "$D/state/snapshot-cache"
