#!/bin/sh
# Entry point of the ate-worker container (mounted from the ate-worker-entrypoint ConfigMap).
#
# Runs `ate worker` and starts it again when it exits, inside the same container. A worker's
# sandboxes outlive the worker process, and each actor's stdout/stderr goes to a `cat` relay
# process in this container; a new worker process re-adopts the sandboxes. If the container
# itself ended, the container runtime would kill every process left in it, relays included, so a
# crash of the worker must not end the container.
#
# SIGTERM (pod deletion, rollout) is passed to the worker, which has its actors suspended (up to
# 20 s) and exits; then this script exits. More than 10 exits within 5 minutes end the container,
# so a worker that cannot start shows up as a failing pod instead of restarting here forever.
#
# Environment: ATE_WORKER_ID, POD_IP, ATE_WORKER_SLOTS, ATE_TRUST_DOMAIN, ATE_WORKER_ARGS (extra
# flags, split on spaces), ATE_TLS_CERT/KEY/CA (read by `ate worker` itself). ATE_BIN and
# ATE_WORKER_RESTART_DELAY exist for the test in crates/ate-cli/tests/deploy.rs.
set -u

ate=${ATE_BIN:-/usr/local/bin/ate}
delay=${ATE_WORKER_RESTART_DELAY:-2}
child=
stopping=

on_term() {
  stopping=1
  if [ -n "$child" ]; then
    echo "worker-entrypoint: stopping worker $ATE_WORKER_ID (its actors are suspended first)" >&2
    kill -TERM "$child" 2>/dev/null
  fi
}
trap on_term TERM INT

exits=0
window_start=$(date +%s)
while [ -z "$stopping" ]; do
  # shellcheck disable=SC2086 # ATE_WORKER_ARGS is a list of flags
  "$ate" worker \
    --id="$ATE_WORKER_ID" \
    --state-dir=/var/lib/ate \
    --listen="$POD_IP:8443" \
    --slots="${ATE_WORKER_SLOTS:-8}" \
    --trust-domain="${ATE_TRUST_DOMAIN:-ate.local}" \
    --log-json \
    ${ATE_WORKER_ARGS:-} &
  child=$!
  # A TERM that came between the start and the line above found no child to pass it to.
  if [ -n "$stopping" ]; then kill -TERM "$child" 2>/dev/null; fi
  # `wait` returns early when a trapped signal arrives: wait again until the worker is gone (its
  # PID stays ours until `wait` has reaped it, so `kill -0` cannot hit another process).
  while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=
  if [ -n "$stopping" ]; then
    echo "worker-entrypoint: worker $ATE_WORKER_ID stopped with status $status" >&2
    exit "$status"
  fi
  now=$(date +%s)
  if [ $((now - window_start)) -gt 300 ]; then
    window_start=$now
    exits=0
  fi
  exits=$((exits + 1))
  if [ "$exits" -gt 10 ]; then
    echo "worker-entrypoint: worker $ATE_WORKER_ID exited $exits times within 5 minutes (last status $status); giving up" >&2
    exit 1
  fi
  echo "worker-entrypoint: worker $ATE_WORKER_ID exited with status $status; starting it again in ${delay}s (its sandboxes keep running and are re-adopted)" >&2
  sleep "$delay"
done
exit 0
