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
. scripts/bench-sleeper-system.sh
sleeper_system bd "{fidelity: memory}" "info" "$@"
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
