#!/usr/bin/env bash
# Quick self-test of the demo workloads on loopback (no containers):
#   - counter: /healthz, three GETs count 1, 2, 3 on all counters, the second port, keep-alive,
#     POST /echo, /whoami, /sandbox, and a restart keeps the file counters but not the memory one;
#   - sleeper: /healthz and a stable checksum over its memory;
#   - build-images.sh: OCI layouts whose digests, sizes and diff_ids check out (when given OUT_DIR,
#     the layouts already built there are checked instead of building new ones).
#
#   workloads/test-workloads.sh [OUT_DIR]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGET=x86_64-unknown-linux-gnu
BIN_DIR=$HERE/target/$TARGET/release

log() { printf '[test-workloads] %s\n' "$*" >&2; }
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); log "ok: $*"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL: $*"; }
expect_eq() { # description expected actual
  if [[ $2 == "$3" ]]; then ok "$1"; else fail "$1: expected [$2], got [$3]"; fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ate-test-workloads.XXXXXX")
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_http() { # url
  local i
  for i in $(seq 1 100); do
    curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

OUT_DIR=${1:-}
if [[ -z $OUT_DIR ]]; then
  OUT_DIR=$WORK/images
  "$HERE/build-images.sh" "$OUT_DIR"
elif [[ ! -d $OUT_DIR/counter ]]; then
  "$HERE/build-images.sh" "$OUT_DIR"
fi
# build-images.sh built the binaries.
for b in counter sleeper; do
  [[ -x $BIN_DIR/$b ]] || { log "missing $BIN_DIR/$b"; exit 1; }
  if ldd "$BIN_DIR/$b" 2>&1 | grep -qE 'not a dynamic executable|statically linked'; then ok "$b is static"; else fail "$b is not static"; fi
done

# ------------------------------------------------------------------ counter
P1=$(free_port)
P2=$(free_port)
while [[ $P2 == "$P1" ]]; do P2=$(free_port); done
mkdir -p "$WORK/data"
start_counter() {
  BIND_ADDR=127.0.0.1 PORT=$P1 PORT2=$P2 ATE_DATA_DIR=$WORK/data COUNTER_ROOTFS_FILE=$WORK/rootfs/var/lib/counter/count \
    "$BIN_DIR/counter" 2>>"$WORK/counter.log" &
  COUNTER_PID=$!
  PIDS+=("$COUNTER_PID")
  wait_http "http://127.0.0.1:$P1/healthz" || { cat "$WORK/counter.log" >&2; fail "counter did not come up"; exit 1; }
}
start_counter
B=http://127.0.0.1:$P1

expect_eq "counter /healthz" "ok" "$(curl -fsS --max-time 5 "$B/healthz")"
for i in 1 2 3; do
  expect_eq "counter GET / #$i" "preserved memory count: $i | preserved file counter: $i | preserved rootfs counter: $i" \
    "$(curl -fsS --max-time 5 "$B/")"
done
expect_eq "counter second port" "preserved memory count: 4 | preserved file counter: 4 | preserved rootfs counter: 4" \
  "$(curl -fsS --max-time 5 "http://127.0.0.1:$P2/some/path")"
hdrs=$(curl -fsS --max-time 5 -D - -o /dev/null "$B/healthz" | tr -d '\r')
if grep -qi '^content-type: text/plain' <<<"$hdrs" && grep -qi '^content-length: 2$' <<<"$hdrs"; then
  ok "counter headers"
else
  fail "counter headers: $hdrs"
fi
# Keep-alive: two requests on one connection (curl reuses it and says so on stderr).
ka=$(curl -sS --max-time 5 -v "$B/healthz" "$B/healthz" 2>&1 >/dev/null | grep -ci 're-using existing connection\|reusing existing connection' || true)
if ((ka >= 1)); then ok "counter keep-alive"; else fail "counter keep-alive: connection not reused"; fi
expect_eq "counter Connection: close" "ok" "$(curl -fsS --max-time 5 -H 'Connection: close' "$B/healthz")"
expect_eq "counter POST /echo" "hello, actor" "$(curl -fsS --max-time 5 --data-binary 'hello, actor' "$B/echo")"
big=$(head -c 300000 /dev/urandom | base64 -w0)
expect_eq "counter POST /echo (large, 100-continue)" "$(printf %s "$big" | sha256sum)" \
  "$(printf %s "$big" | curl -fsS --max-time 10 --data-binary @- "$B/echo" | sha256sum)"
expect_eq "counter POST /echo (chunked)" "chunky" \
  "$(printf chunky | curl -fsS --max-time 5 -H 'Transfer-Encoding: chunked' --data-binary @- "$B/echo")"
# WebSocket: the RFC 6455 handshake at /ws, then a masked text frame comes back unmasked.
ws_reply=$(python3 - "$P1" <<'PY'
import base64, os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    buf += s.recv(4096)
head, rest = buf.split(b"\r\n\r\n", 1)
import hashlib
want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
if not head.startswith(b"HTTP/1.1 101") or ("Sec-WebSocket-Accept: " + want).encode() not in head:
    print("bad handshake: %r" % head); sys.exit(0)
msg, mask = b"hello, websocket", os.urandom(4)
s.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
while len(rest) < 2 + len(msg):
    rest += s.recv(4096)
print("opcode=%d %s" % (rest[0] & 0x0F, rest[2:2 + rest[1]].decode()))
PY
)
expect_eq "counter WebSocket echo at /ws" "opcode=1 hello, websocket" "$ws_reply"
expect_eq "counter /ws without upgrade" "426" "$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$B/ws")"
# /connect: an outbound TCP connect from the workload (ok to its own port, the error to a closed one).
expect_eq "counter /connect to a listening port" "ok" "$(curl -sS --max-time 5 "$B/connect?addr=127.0.0.1:$P2")"
CLOSED=$(free_port)
expect_eq "counter /connect to a closed port" "502" \
  "$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$B/connect?addr=127.0.0.1:$CLOSED")"
expect_eq "counter /connect without addr" "400" "$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$B/connect")"
expect_eq "counter /whoami without identity files" "/ " "$(curl -fsS --max-time 5 "$B/whoami")"
# Values depend on where this runs (inside a container the host's own filter answers); the shape does not.
sandbox=$(curl -fsS --max-time 5 "$B/sandbox")
expect_eq "counter /sandbox reports status fields" "6" "$(grep -cE '^(NoNewPrivs|Seccomp|CapEff|CapPrm|CapBnd|CapAmb): ' <<<"$sandbox")"
expect_eq "counter /sandbox probes 10 syscalls" "10" "$(grep -cE '^syscall [A-Za-z0-9_()]+: (ok|errno [0-9]+)$' <<<"$sandbox")"
expect_eq "counter file counter on disk" "4" "$(tr -d '\n' <"$WORK/data/counter")"
expect_eq "counter rootfs counter on disk" "4" "$(tr -d '\n' <"$WORK/rootfs/var/lib/counter/count")"

expect_eq "counter GET /exit" "405" "$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$B/exit?code=3")"
expect_eq "counter /exit without a code" "400" "$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' -X POST "$B/exit")"

# A restart loses the memory counter and keeps the file counters.
kill -TERM "$COUNTER_PID"
wait "$COUNTER_PID" 2>/dev/null && ok "counter exits 0 on SIGTERM" || fail "counter exit status on SIGTERM"
start_counter
# POST /exit?code=N: the answer, then the process exits with N.
expect_eq "counter POST /exit?code=3" "exiting with code 3" "$(curl -sS --max-time 5 -X POST "$B/exit?code=3")"
status=0
wait "$COUNTER_PID" 2>/dev/null || status=$?
expect_eq "counter exit status after /exit?code=3" "3" "$status"
start_counter
expect_eq "counter after restart" "preserved memory count: 1 | preserved file counter: 5 | preserved rootfs counter: 5" \
  "$(curl -fsS --max-time 5 "$B/")"
kill -TERM "$COUNTER_PID"; wait "$COUNTER_PID" 2>/dev/null || true

# ------------------------------------------------------------------ sleeper
P3=$(free_port)
BIND_ADDR=127.0.0.1 PORT=$P3 SLEEPER_MEMORY_MIB=16 "$BIN_DIR/sleeper" 2>>"$WORK/sleeper.log" &
SLEEPER_PID=$!
PIDS+=("$SLEEPER_PID")
if wait_http "http://127.0.0.1:$P3/healthz"; then
  expect_eq "sleeper /healthz" "ok" "$(curl -fsS --max-time 5 "http://127.0.0.1:$P3/healthz")"
  s1=$(curl -fsS --max-time 5 "http://127.0.0.1:$P3/")
  s2=$(curl -fsS --max-time 5 "http://127.0.0.1:$P3/")
  if [[ $s1 =~ ^sleeper\ holding\ 16\ MiB,\ checksum\ [0-9a-f]{16}$ ]]; then ok "sleeper reply: $s1"; else fail "sleeper reply: [$s1]"; fi
  expect_eq "sleeper checksum stable" "$s1" "$s2"
  rss_kib=$(awk '/^VmRSS:/ { print $2 }' "/proc/$SLEEPER_PID/status")
  if ((rss_kib >= 16 * 1024)); then ok "sleeper RSS ${rss_kib} KiB"; else fail "sleeper RSS only ${rss_kib} KiB"; fi
else
  cat "$WORK/sleeper.log" >&2
  fail "sleeper did not come up"
fi
kill -TERM "$SLEEPER_PID"; wait "$SLEEPER_PID" 2>/dev/null || true

# ------------------------------------------------------------------ OCI layouts
if python3 - "$OUT_DIR" counter sleeper <<'PY'
import gzip, hashlib, json, os, sys, tarfile
out, names = sys.argv[1], sys.argv[2:]
bad = []
def blob(layout, digest):
    algo, hexd = digest.split(":", 1)
    assert algo == "sha256", digest
    data = open(os.path.join(layout, "blobs", "sha256", hexd), "rb").read()
    if hashlib.sha256(data).hexdigest() != hexd:
        bad.append(f"{layout}: blob {hexd} has another sha256")
    return data
for name in names:
    layout = os.path.join(out, name)
    if json.load(open(os.path.join(layout, "oci-layout"))) != {"imageLayoutVersion": "1.0.0"}:
        bad.append(f"{name}: oci-layout")
    index = json.load(open(os.path.join(layout, "index.json")))
    ms = index["manifests"]
    if len(ms) != 1 or ms[0]["annotations"].get("org.opencontainers.image.ref.name") != "latest":
        bad.append(f"{name}: index manifests {ms}")
    mdata = blob(layout, ms[0]["digest"])
    if len(mdata) != ms[0]["size"]:
        bad.append(f"{name}: manifest size")
    m = json.loads(mdata)
    cdata = blob(layout, m["config"]["digest"])
    if len(cdata) != m["config"]["size"]:
        bad.append(f"{name}: config size")
    c = json.loads(cdata)
    if (c["os"], c["architecture"], c["config"]["Cmd"]) != ("linux", "amd64", ["/" + name]):
        bad.append(f"{name}: config {c}")
    (layer,) = m["layers"]
    ldata = blob(layout, layer["digest"])
    if len(ldata) != layer["size"]:
        bad.append(f"{name}: layer size")
    tar_bytes = gzip.decompress(ldata)
    if c["rootfs"]["diff_ids"] != ["sha256:" + hashlib.sha256(tar_bytes).hexdigest()]:
        bad.append(f"{name}: diff_id")
    import io
    members = {t.name.rstrip("/"): t for t in tarfile.open(fileobj=io.BytesIO(tar_bytes))}
    for d in ("etc/ate", "data", "tmp", "var/lib"):
        if d not in members or not members[d].isdir():
            bad.append(f"{name}: layer lacks dir /{d}")
    if name not in members or not members[name].isfile() or not members[name].mode & 0o111:
        bad.append(f"{name}: layer lacks executable /{name}")
for b in bad:
    print(b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
then ok "OCI image layouts in $OUT_DIR"; else fail "OCI image layouts in $OUT_DIR"; fi

echo "workloads: $PASSED passed, $FAILED failed"
((FAILED == 0))
