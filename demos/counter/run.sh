#!/usr/bin/env bash
# The counter demo: create an actor, call it, suspend it, resume it, call it again. The three
# counts (memory, volume file, rootfs file) continue across every suspend.
#   demos/counter/run.sh            (against a running `ate up`)
#   NAME=my-counter ATESPACE=ate-demo demos/counter/run.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
NS=${ATESPACE:-ate-demo}
NAME=${NAME:-counter-$(date +%s)}
A=$NS/$NAME

step() { printf '\n$ %s\n' "$*"; }
expect=1
check_reply() {
  printf '%s  (%s, %.3f s)\n' "$BODY" "$CODE" "$SECS"
  local want="preserved memory count: $expect | preserved file counter: $expect | preserved rootfs counter: $expect"
  if [[ $CODE != 200 || $BODY != "$want" ]]; then
    echo "demo: expected [$want]" >&2
    exit 1
  fi
  expect=$((expect + 1))
}

step "$ATE create actor $NAME -a $NS -t ate-demo/counter"
"$ATE" create actor "$NAME" -a "$NS" -t ate-demo/counter
for _ in 1 2; do
  step "curl -H 'ate-target-actor: $A' $ROUTER/"
  call "$A"; check_reply
done
step "$ATE suspend actor $NAME -a $NS"
"$ATE" suspend actor "$NAME" -a "$NS"
step "$ATE resume actor $NAME -a $NS"
"$ATE" resume actor "$NAME" -a "$NS"
step "curl -H 'ate-target-actor: $A' $ROUTER/"
call "$A"; check_reply
step "$ATE suspend actor $NAME -a $NS   (the next request resumes it)"
"$ATE" suspend actor "$NAME" -a "$NS"
step "curl -H 'ate-target-actor: $A' $ROUTER/"
call "$A"; check_reply
echo
echo "==> counts continued across 2 suspends: memory, file and rootfs counters all at $((expect - 1))"
