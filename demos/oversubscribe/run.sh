#!/usr/bin/env bash
# The oversubscribe demo: many more actors than slots under steady load, with idle auto-suspend
# (a template with a short idleTimeout). Idle actors are suspended by the node agent and the next
# request resumes them, so the pool serves far more actors than it has room for at once.
#
#   demos/oversubscribe/run.sh
#   ACTORS=64 CLIENTS=4 DURATION=60 IDLE_TIMEOUT=3s demos/oversubscribe/run.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
NS=${ATESPACE:-ate-demo-dense}
SLOTS=$(total_slots)
ACTORS=${ACTORS:-$((SLOTS * 4))}
CLIENTS=${CLIENTS:-4}
DURATION=${DURATION:-60}
IDLE_TIMEOUT=${IDLE_TIMEOUT:-3s}
IMAGES=${IMAGES_DIR:-$(images_dir)}
[[ -n $IMAGES ]] || { echo "demo: cannot find the images directory (set IMAGES_DIR)" >&2; exit 1; }

cat >"$DEMO_TMP/counter.yaml" <<YAML
apiVersion: ate.dev/v1alpha1
kind: Atespace
metadata: {name: $NS}
---
apiVersion: ate.dev/v1alpha1
kind: ActorTemplate
metadata: {namespace: $NS, name: counter-idle}
spec:
  containers:
    - name: counter
      image: "oci-layout:$IMAGES/counter:latest"
      command: ["/counter"]
      wakeupProbe: {httpGet: {path: /healthz, port: 80}, timeoutSeconds: 10}
  resources: {cpu: 100m, memory: 64Mi}
  volumes: [{name: data, mountPath: /data}]
  snapshots: {fidelity: memory}
  idleTimeout: $IDLE_TIMEOUT
YAML
"$ATE" apply -f "$DEMO_TMP/counter.yaml" >&2
echo "==> $ACTORS actors on $SLOTS slots, idleTimeout $IDLE_TIMEOUT, $CLIENTS clients for $DURATION s" >&2
for i in $(seq 0 $((ACTORS - 1))); do create_quietly "$NS" "d$i" "$NS/counter-idle"; done

end=$((SECONDS + DURATION))
for c in $(seq 1 "$CLIENTS"); do
  (
    RANDOM=$((c * 7919))
    while ((SECONDS < end)); do
      i=$((RANDOM % ACTORS))
      call "$NS/d$i"
      printf '%s %s %s\n' "$CODE" "$SECS" "d$i" >>"$DEMO_TMP/load.$c"
    done
  ) &
done
echo "time                      running  suspended  requests  200" >&2
max_running=0
while ((SECONDS < end)); do
  sleep 5
  running=$(count_state "$NS" RUNNING)
  ((running > max_running)) && max_running=$running
  done_requests=$(cat "$DEMO_TMP"/load.* 2>/dev/null | wc -l)
  ok=$(cat "$DEMO_TMP"/load.* 2>/dev/null | awk '$1 == 200' | wc -l)
  printf '%s  %7d  %9d  %8d  %3d\n' "$(stamp)" "$running" "$(count_state "$NS" SUSPENDED)" "$done_requests" "$ok" >&2
done
wait
cat "$DEMO_TMP"/load.* | awk -v slots="$SLOTS" -v actors="$ACTORS" -v maxrun="$max_running" '
  { n++; if ($1 == 200) { ok++; sum += $2; served[$3] = 1 } else if ($1 == 503) u++; else o++ }
  END {
    for (a in served) distinct++
    print "==> results"
    printf "    actors         : %d on %d slots (%.1f actors per slot)\n", actors, slots, actors / slots
    printf "    served actors  : %d distinct actors answered 200 (%.1f per slot)\n", distinct, distinct / slots
    printf "    most running   : %d at once (sampled every 5 s)\n", maxrun
    printf "    total requests : %d\n", n
    printf "    200 OK         : %d\n", ok
    printf "    503 unavailable: %d\n", u
    printf "    other          : %d\n", o
    printf "    200 latency    : avg %.3fs\n", (ok ? sum / ok : 0)
  }'
