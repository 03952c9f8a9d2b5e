# Sourced by the one-sleeper probes (bench-eager-restore.sh, bench-durable-suspend.sh): starts a
# fresh `ate up` (1 worker, release build, KEEP_FROZEN off) in $D with atespace $NS and a sleeper
# template of $MIB MiB, and creates actor s1 from it.
#   sleeper_system ATESPACE SNAPSHOTS_YAML RUST_LOG [ate up flags…]
# Needs D, IMG, ATE, MIB; sets UP (the `ate up` pid) and A (the CLI against it), and exports the
# HOME and state dir the CLI reads.
sleeper_system() {
  NS=$1 SNAPSHOTS=$2 LOG=$3; shift 3
  cat > "$D/sleeper.yaml" <<YAML
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
      image: "oci-layout:$IMG/sleeper:latest"
      command: ["/sleeper"]
      env: [{name: SLEEPER_MEMORY_MIB, value: "$MIB"}]
      wakeupProbe: {httpGet: {path: /healthz, port: 80}, timeoutSeconds: 120}
  resources: {cpu: 250m, memory: $((MIB + 64))Mi}
  snapshots: $SNAPSHOTS
  idleTimeout: 5m
YAML
  env RUST_LOG="$LOG" HOME="$D" XDG_CONFIG_HOME="$D/config" ATE_KEEP_FROZEN=0 \
    "$ATE" up --state-dir "$D/state" --workers 1 --worker-slots 8 \
    --router-listen 127.0.0.1:17980 --router-metrics-listen 127.0.0.1:17981 \
    --api-listen 127.0.0.1:17943 --api-http-listen 127.0.0.1:17990 --node-listen 127.0.0.1:17985 \
    --worker-first-ip 127.79.0.2 --worker-port 17944 --ready-file "$D/ready.json" \
    --images-dir "$IMG" "$@" > "$D/up.log" 2>&1 &
  UP=$!
  for _ in $(seq 1 240); do [ -s "$D/ready.json" ] && break; sleep 0.5; done
  export HOME=$D XDG_CONFIG_HOME=$D/config ATE_STATE_DIR=$D/state
  A="$ATE --api 127.0.0.1:17943"
  $A apply -f "$D/sleeper.yaml" > /dev/null
  $A create actor s1 -a "$NS" -t "$NS/sleeper" > /dev/null
}
