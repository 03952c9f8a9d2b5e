#!/usr/bin/env bash
# The burst demo (spec 4.4, "A burst of resumes"): n suspended 50 MiB sleeper actors resumed by n
# simultaneous requests, one per actor, for n = 1, 2, 4, 8, 16, five rounds each. Needs room for
# 16 actors (the default `ate up`: 2 workers × 8 slots).
#
#   demos/burst/run.sh
#   LEVELS="1 2 4" ROUNDS=2 MEMORY_MIB=50 demos/burst/run.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
NS=${ATESPACE:-ate-demo-burst}
LEVELS=${LEVELS:-1 2 4 8 16}
ROUNDS=${ROUNDS:-5}
MEMORY_MIB=${MEMORY_MIB:-50}
IMAGES=${IMAGES_DIR:-$(images_dir)}
[[ -n $IMAGES ]] || { echo "demo: cannot find the images directory (set IMAGES_DIR)" >&2; exit 1; }
max=0
for n in $LEVELS; do ((n > max)) && max=$n; done

cat >"$DEMO_TMP/sleeper.yaml" <<YAML
apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {name: $NS}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {namespace: $NS, name: sleeper}
spec:
  containers:
    - name: sleeper
      image: "oci-layout:$IMAGES/sleeper:latest"
      command: ["/sleeper"]
      env: [{name: SLEEPER_MEMORY_MIB, value: "$MEMORY_MIB"}]
      wakeupProbe: {httpGet: {path: /healthz, port: 80}, timeoutSeconds: 10}
  resources: {cpu: 250m, memory: $((MEMORY_MIB + 64))Mi}
  snapshots: {fidelity: memory}
  idleTimeout: 5m
YAML
"$ATE" apply -f "$DEMO_TMP/sleeper.yaml" >&2

echo "==> $max sleeper actors holding $MEMORY_MIB MiB each: first start, then suspend" >&2
for i in $(seq 0 $((max - 1))); do
  create_quietly "$NS" "b$i" "$NS/sleeper"
  call "$NS/b$i"
  [[ $CODE == 200 ]] || { echo "demo: b$i: $CODE $BODY" >&2; exit 1; }
  "$ATE" suspend actor "b$i" -a "$NS" >/dev/null
done

echo "Resumes at the same instant | Requests | Returned 200 | Median  | Slowest"
for n in $LEVELS; do
  : >"$DEMO_TMP/level"
  for round in $(seq 1 "$ROUNDS"); do
    # n requests at the same instant, one per suspended actor.
    for i in $(seq 0 $((n - 1))); do
      (call "$NS/b$i"; printf '%s %s %s\n' "$CODE" "$SECS" "$round" >>"$DEMO_TMP/level") &
    done
    wait
    for i in $(seq 0 $((n - 1))); do "$ATE" suspend actor "b$i" -a "$NS" >/dev/null & done
    wait
  done
  sort -k2 -g "$DEMO_TMP/level" | awk -v n="$n" '
    { code[NR] = $1; t[NR] = $2; if ($1 == 200) ok++ }
    END {
      med = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
      printf "%27d | %8d | %12d | %5.2f s | %5.2f s\n", n, NR, ok, med, t[NR]
    }'
  awk '$1 != 200 { print "    failed: " $0 }' "$DEMO_TMP/level" >&2
done
