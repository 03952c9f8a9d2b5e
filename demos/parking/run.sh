#!/usr/bin/env bash
# The parking demo (spec 4.4, Fig. 4.7): a pool of 2 workers with room for 1 actor each, actors
# p1..p4. p1 and p2 take both workers; p3 is parked for the 5 s budget and gets the capacity 503;
# p3 again, and FREE_AFTER (2) s into its wait p1 is suspended: p3 is served. Then the load run:
# LOAD_SECONDS (30) of requests to all four actors, each actor suspended after its answer.
#
#   ate up --workers 2 --worker-slots 1     # the pool of the demo
#   demos/parking/run.sh
#
# Columns of the timeline: time (the request's start), event, HTTP code, seconds, body.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
NS=${ATESPACE:-ate-demo-parking}
LOAD_SECONDS=${LOAD_SECONDS:-30}
FREE_AFTER=${FREE_AFTER:-2}

slots=$(total_slots)
if [[ $slots != 2 ]]; then
  echo "demo: the pool has $slots slots; start it with: ate up --workers 2 --worker-slots 1" >&2
  exit 1
fi
"$ATE" create atespace "$NS" >/dev/null 2>&1 || true
for p in p1 p2 p3 p4; do
  create_quietly "$NS" "$p" ate-demo/counter
  suspend_quietly "$NS" "$p"
done

row() { printf '%s\t%s\t%s\t%s\t%s\n' "$@"; }
echo "time	event	code	seconds	body"
for p in p1 p2; do
  t=$(stamp); call "$NS/$p"
  row "$t" "$p-free-worker" "$CODE" "$SECS" "$BODY"
done
t=$(stamp); call "$NS/p3"
row "$t" p3-no-free-worker "$CODE" "$SECS" "$BODY"

# p3 again, in the background; p1 is suspended FREE_AFTER seconds into its wait.
t3=$(stamp)
row "$t3" p3-request-start "parked while pool is full"
(call "$NS/p3"; printf '%s\n%s\n%s\n' "$CODE" "$SECS" "$BODY" >"$DEMO_TMP/p3") &
p3_pid=$!
sleep "$FREE_AFTER"
"$ATE" suspend actor p1 -a "$NS" >/dev/null
row "$(stamp)" suspend-p1-done "freed a worker $FREE_AFTER s after p3 request started"
wait "$p3_pid"
{ read -r CODE; read -r SECS; BODY=$(cat); } <"$DEMO_TMP/p3"
row "$t3" p3-served-after-park "$CODE" "$SECS" "$BODY"

((LOAD_SECONDS > 0)) || exit 0
echo
echo "==> load run: $LOAD_SECONDS s, requests to p1..p4, each actor suspended after its answer"
end=$((SECONDS + LOAD_SECONDS))
for p in p1 p2 p3 p4; do
  (
    while ((SECONDS < end)); do
      t=$(stamp); call "$NS/$p"
      row "$t" "$p" "$CODE" "$SECS" "$BODY"
      printf '%s %s\n' "$CODE" "$SECS" >>"$DEMO_TMP/load.$p"
      if [[ $CODE == 200 ]]; then "$ATE" suspend actor "$p" -a "$NS" >/dev/null 2>&1 || true; fi
    done
  ) &
done
wait
cat "$DEMO_TMP"/load.* | awk '
  { n++ }
  $1 == 200 { ok++; sum += $2; if ($2 > max) max = $2; next }
  $1 == 503 { unavailable++; next }
  { other++ }
  END {
    print "==> results"
    printf "    total requests : %d\n", n
    printf "    200 OK         : %d\n", ok
    printf "    503 unavailable: %d\n", unavailable
    printf "    other          : %d\n", other
    printf "    200 latency    : avg %.3fs, slowest %.6fs\n", (ok ? sum / ok : 0), max
  }'
