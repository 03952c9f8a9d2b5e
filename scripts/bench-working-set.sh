#!/bin/bash
# Working-set prefetch measurement (docs/benchmarks.md): a 1 GiB sleeper, the first request after
# each resume is GET /tail?percent=5; node-local rounds, then durable rounds. Needs a release build.
set -u
D=$(mktemp -d)
cd "$(dirname "$0")/.."
IMG=${ATE_TEST_IMAGES:-$PWD/target/tmp/ate-test-images}
ATE_KEEP_FROZEN=0 target/release/ate up --state-dir $D/state --workers 1 --worker-slots 8 \
  --router-listen 127.0.0.1:17680 --api-listen 127.0.0.1:17643 --ready-file $D/ready.json --images-dir $IMG > $D/up.log 2>&1 &
UP=$!
for i in $(seq 1 240); do [ -s $D/ready.json ] && break; sleep 0.5; done
export ATE_STATE_DIR=$D/state
ATE="target/release/ate"
cat > $D/t.yaml <<Y
apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {name: ws}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {namespace: ws, name: sleeper}
spec:
  containers:
    - name: sleeper
      image: "oci-layout:$IMG/sleeper:latest"
      command: ["/sleeper"]
      env: [{name: SLEEPER_MEMORY_MIB, value: "1024"}]
      wakeupProbe: {httpGet: {path: /healthz, port: 80}, timeoutSeconds: 60}
  resources: {cpu: 2000m, memory: 1100Mi}
  snapshots: {fidelity: memory}
  idleTimeout: 5m
Y
$ATE apply -f $D/t.yaml >/dev/null
$ATE create actor s -a ws -t ws/sleeper >/dev/null 2>&1 || $ATE create actor s --template ws/sleeper -a ws
req() { curl -s -o /dev/null -w "%{http_code} %{time_total}" -H "ate-target-actor: ws/s" "http://127.0.0.1:17680$1"; }
echo "cold: $(req /)"
for mode in local durable; do
for r in 1 2 3 4 5 6; do
  if [ $mode = durable ]; then $ATE suspend actor s -a ws --durable >/dev/null; rm -rf $D/state/snapshots/ws/s; else $ATE suspend actor s -a ws >/dev/null; fi
  sleep 2
  echo "$mode round $r: /tail?percent=5 first request: $(req '/tail?percent=5')"
  sleep 3
done
done
grep -o "every page is in.*" $D/state/logs/worker-1.log | grep -o "prefetched=[0-9]* working_set=[0-9]*\|fetched=[0-9]*" | paste - - | head -20
kill -INT $UP; wait $UP
echo "dir: $D"
