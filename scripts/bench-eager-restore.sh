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
. scripts/bench-sleeper-system.sh
sleeper_system be "{fidelity: memory, memoryRestore: eager}" "info,ate_worker::runc=debug" "$@"
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
