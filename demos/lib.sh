# Shared by the demo scripts (sourced). Talks to a running `ate up` with `ate` and `curl`.
#   ATE         the ate binary (default: `ate` on PATH)
#   ATE_ROUTER  router URL (default http://127.0.0.1:8080)
#   ATE_API     api address (default: what `ate up` recorded, see `ate --help`)
ATE=${ATE:-ate}
ROUTER=${ATE_ROUTER:-http://127.0.0.1:8080}
command -v "$ATE" >/dev/null 2>&1 || { echo "demo: $ATE not found (set ATE=/path/to/ate)" >&2; exit 1; }
command -v curl >/dev/null 2>&1 || { echo "demo: curl not found" >&2; exit 1; }

DEMO_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ate-demo.XXXXXX")
trap 'rm -rf "$DEMO_TMP"' EXIT

# UTC time with milliseconds, like the spec's logs.
stamp() { date -u +%Y-%m-%dT%H:%M:%S.%3NZ; }

# call ACTOR [PATH] → sets CODE, SECS, BODY (CODE 000 when the request failed).
call() {
  local out f=$DEMO_TMP/body.$BASHPID
  out=$(curl -sS -o "$f" -w '%{http_code} %{time_total}' --max-time 60 \
    -H "ate-target-actor: $1" "$ROUTER${2:-/}" 2>/dev/null) || true
  CODE=${out%% *}
  SECS=${out##* }
  [[ -n $CODE ]] || CODE=000
  BODY=$(cat "$f" 2>/dev/null || true)
  rm -f "$f"
}

# The directory of the demo OCI images, read from the ate-demo/counter template `ate up` registers.
images_dir() {
  "$ATE" get templates -a ate-demo -o yaml | sed -n 's|.*oci-layout:\(.*\)/counter:latest.*|\1|p' | head -n1
}

# Number of actors of an atespace in a state (RUNNING, SUSPENDED, …).
count_state() {
  "$ATE" get actors -a "$1" -o json | grep -c "\"state\": *\"ACTOR_STATE_$2\"" || true
}

# Total actor slots of the ACTIVE workers.
total_slots() {
  "$ATE" get workers -o json | sed -n 's/.*"slots": *\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s + 0 }'
}

# Suspends an actor if it is running (errors ignored: it may already be suspended).
suspend_quietly() { "$ATE" suspend actor "$2" -a "$1" >/dev/null 2>&1 || true; }

# create_quietly ATESPACE NAME TEMPLATE: creates the actor unless it exists.
create_quietly() {
  "$ATE" create actor "$2" -a "$1" -t "$3" >/dev/null 2>"$DEMO_TMP/create.err" ||
    grep -qi 'exists' "$DEMO_TMP/create.err" || { cat "$DEMO_TMP/create.err" >&2; return 1; }
}
