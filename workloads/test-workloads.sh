#!/usr/bin/env bash
# Quick self-test of the demo workloads on loopback (no containers):
#   - counter: /healthz, three GETs count 1, 2, 3 on all counters, the second port, keep-alive,
#     POST /echo, /whoami, /sandbox, /call and /caller, and a restart keeps the file counters but not the memory one;
#   - sleeper: /healthz and a stable checksum over its memory;
#   - py-agent, node-agent: run from their image's rootfs (chroot, when root; else the host's
#     /usr/bin/python3 and /usr/bin/node) against a fake model server and a fake WebSocket event
#     server on loopback: turns count, both connections are kept between turns, a restart of the
#     fake servers breaks them and the next turn reconnects (and says so), py-agent opens its
#     database again when its file is re-created under it, a restart of an agent keeps its rows
#     on the volume;
#   - build-images.sh: OCI layouts whose digests, sizes and diff_ids check out (when given OUT_DIR,
#     the layouts already built there are checked instead of building new ones).
#
#   workloads/test-workloads.sh [OUT_DIR]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGET=x86_64-unknown-linux-gnu
# Where cargo put them: CARGO_TARGET_DIR when the caller set one (a CI run with its own target
# directory), else the workloads' own target/.
BIN_DIR=${CARGO_TARGET_DIR:-$HERE/target}/$TARGET/release

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
elif [[ ! -d $OUT_DIR/counter || ! -d $OUT_DIR/py-agent || ! -d $OUT_DIR/node-agent ]]; then
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
  BIND_ADDR=127.0.0.1 PORT=$P1 PORT2=$P2 ATE_PLATFORM_ADDR=127.0.0.1:$P2 ATE_DATA_DIR=$WORK/data COUNTER_ROOTFS_FILE=$WORK/rootfs/var/lib/counter/count \
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
# /call with ATE_PLATFORM_ADDR pointing at the counter's own second port (no platform here to
# replace the caller): the client side of calls between actors, on one kept-alive connection.
expect_eq "counter /caller" "caller: none" "$(curl -fsS --max-time 5 "$B/caller")"
expect_eq "counter /call" "$(printf 'status: 200\ncaller: none')" \
  "$(curl -fsS --max-time 5 "$B/call?actor=a/b&path=/caller")"
expect_eq "counter /call forge=1" "$(printf 'status: 200\ncaller: evil/forged')" \
  "$(curl -fsS --max-time 5 "$B/call?actor=a/b&path=/caller&forge=1")"
call_hdrs=$(curl -fsS --max-time 10 -D - -o /dev/null "$B/call?actor=a/b&path=/healthz&n=20" | tr -d '\r')
if grep -qiE '^x-call-p50-us: [0-9]+$' <<<"$call_hdrs"; then ok "counter /call n=20 p50"; else fail "counter /call n=20: $call_hdrs"; fi
expect_eq "counter /call relays the callee's status" "426" \
  "$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$B/call?actor=a/b&path=/ws")"
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

# ------------------------------------------------------------------ py-agent, node-agent
# The fake servers: a model server (HTTP/1.1 keep-alive, answers {"turn", "connection", "text"})
# and an event server (WebSocket, acks each text message {"turn"} with {"ack", "connection"}).
cat >"$WORK/fake_servers.py" <<'PY'
import base64, hashlib, json, socket, struct, sys, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
counts = {"model": 0, "events": 0}
lock = threading.Lock()
def number(kind):
    with lock:
        counts[kind] += 1
        return counts[kind]
class Conn:
    def __init__(self, c): self.c, self.buf = c, b""
    def read(self, n):
        while len(self.buf) < n:
            d = self.c.recv(65536)
            if not d: raise EOFError
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out
    def head(self):
        while b"\r\n\r\n" not in self.buf:
            d = self.c.recv(65536)
            if not d: raise EOFError
            self.buf += d
        h, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = h.decode("latin-1").split("\r\n")
        return {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
def model(c):
    n, conn = number("model"), Conn(c)
    while True:
        body = json.loads(conn.read(int(conn.head().get("content-length", "0"))))
        out = json.dumps({"turn": body["turn"], "connection": n, "text": "answer"}).encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
def events(c):
    conn = Conn(c)
    key = conn.head()["sec-websocket-key"].encode()
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    n = number("events")
    while True:
        b0, b1 = conn.read(2)
        size = b1 & 0x7F
        if size == 126: (size,) = struct.unpack("!H", conn.read(2))
        elif size == 127: (size,) = struct.unpack("!Q", conn.read(8))
        mask = conn.read(4) if b1 & 0x80 else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(conn.read(size)))
        if b0 & 0x0F == 0x8: return
        if b0 & 0x0F == 0x1:
            out = json.dumps({"ack": json.loads(payload)["turn"], "connection": n}).encode()
            c.sendall(bytes([0x81, len(out)]) + out)
def handle(fn, c):
    try: fn(c)
    except (EOFError, OSError, KeyError, ValueError): pass
    finally: c.close()
def serve(port, fn):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(fn, c), daemon=True).start()
threading.Thread(target=serve, args=(int(sys.argv[1]), model), daemon=True).start()
threading.Thread(target=serve, args=(int(sys.argv[2]), events), daemon=True).start()
threading.Event().wait()
PY
MODEL_PORT=$(free_port)
EVENTS_PORT=$(free_port)
start_fakes() {
  python3 "$WORK/fake_servers.py" "$MODEL_PORT" "$EVENTS_PORT" 2>>"$WORK/fakes.log" &
  FAKES_PID=$!
  PIDS+=("$FAKES_PID")
  local i
  for i in $(seq 1 100); do
    if python3 -c "import socket, sys; [socket.create_connection(('127.0.0.1', int(p)), 1).close() for p in sys.argv[1:]]" \
      "$MODEL_PORT" "$EVENTS_PORT" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  fail "fake servers did not come up"
  return 1
}
stop_fakes() { kill "$FAKES_PID" 2>/dev/null || true; wait "$FAKES_PID" 2>/dev/null || true; }

# One field of a JSON answer (nested with dots), or "" when absent.
field() {
  python3 -c 'import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    v = v.get(k, "") if isinstance(v, dict) else ""
print(v)' "$1" "$2" 2>/dev/null || true
}

# The layer of an image, unpacked (for a chroot).
unpack_layer() { # name dir
  python3 - "$OUT_DIR/$1" "$2" <<'PY'
import json, os, sys, tarfile
layout, dest = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(layout, "index.json")))
blob = lambda d: os.path.join(layout, "blobs", "sha256", d.split(":", 1)[1])
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
with tarfile.open(blob(manifest["layers"][0]["digest"])) as t:
    t.extractall(dest)
PY
}

AGENT_PIDS=()
CHROOT=""
if [[ $(id -u) == 0 ]]; then CHROOT=$(command -v chroot || true); fi
start_agent() { # name port data_dir
  local name=$1 port=$2 data=$3 root=$WORK/$1-root
  local -a cmd
  if [[ $name == py-agent ]]; then cmd=(/usr/bin/python3 -u); else cmd=(/usr/bin/node); fi
  local script=agent.py
  [[ $name == node-agent ]] && script=agent.js
  local -a envs=(PORT="$port" BIND_ADDR=127.0.0.1 MODEL_ADDR="127.0.0.1:$MODEL_PORT"
    EVENTS_ADDR="127.0.0.1:$EVENTS_PORT" HOME=/tmp PYTHONDONTWRITEBYTECODE=1 UV_USE_IO_URING=0)
  if [[ -n $CHROOT ]]; then
    # From the image's own rootfs: nothing of the host but the kernel (and its loopback).
    mkdir -p "$root$data"
    env -i "${envs[@]}" ATE_DATA_DIR="$data" "$CHROOT" "$root" "${cmd[@]}" "/app/$script" >>"$WORK/$name.log" 2>&1 &
  else
    mkdir -p "$WORK/$name$data"
    env -i "${envs[@]}" ATE_DATA_DIR="$WORK/$name$data" "${cmd[@]}" "$HERE/$name/$script" >>"$WORK/$name.log" 2>&1 &
  fi
  AGENT_PIDS+=($!)
  PIDS+=($!)
  wait_http "http://127.0.0.1:$port/healthz" || { cat "$WORK/$name.log" >&2; fail "$name did not come up"; return 1; }
}

if [[ -n $CHROOT ]]; then
  log "agents run from their images' rootfs (chroot)"
  for name in py-agent node-agent; do unpack_layer "$name" "$WORK/$name-root"; done
else
  log "not root: agents run on the host's /usr/bin/python3 and /usr/bin/node"
fi
PY_PORT=$(free_port)
NODE_PORT=$(free_port)
if start_fakes && start_agent py-agent "$PY_PORT" /data && start_agent node-agent "$NODE_PORT" /data; then
  for name in py-agent node-agent; do
    if [[ $name == py-agent ]]; then B=http://127.0.0.1:$PY_PORT; else B=http://127.0.0.1:$NODE_PORT; fi
    expect_eq "$name /healthz" "ok" "$(curl -fsS --max-time 5 "$B/healthz")"
    t1=$(curl -fsS --max-time 10 "$B/")
    t2=$(curl -fsS --max-time 10 "$B/turn")
    expect_eq "$name turns count (memory, rows)" "1 1 2 2" \
      "$(field "$t1" memory_count) $(field "$t1" db_rows) $(field "$t2" memory_count) $(field "$t2" db_rows)"
    expect_eq "$name keeps one model and one WebSocket connection" "1 1" \
      "$(field "$t2" model_connection) $(field "$t2" ws_connection)"
    expect_eq "$name turn answered by the model and acked by the event server" "1 2 2" \
      "$(field "$t1" model_reply.turn) $(field "$t2" model_reply.turn) $(field "$(field "$t2" ws_ack)" ack)"
    case $(field "$t2" runtime) in
      "python 3."* | "node v"*) ok "$name runtime: $(field "$t2" runtime)" ;;
      *) fail "$name runtime: $t2" ;;
    esac
  done
  sleep 0.3
  for name in py-agent node-agent; do
    if [[ $name == py-agent ]]; then B=http://127.0.0.1:$PY_PORT; else B=http://127.0.0.1:$NODE_PORT; fi
    t=$(curl -fsS --max-time 10 "$B/")
    if (($(field "$t" ticks) >= 3)); then ok "$name ticks: $(field "$t" ticks)"; else fail "$name ticks: $t"; fi
  done
  # The fake servers restart: both kept connections break, the next turn reconnects once.
  stop_fakes
  start_fakes
  for name in py-agent node-agent; do
    if [[ $name == py-agent ]]; then B=http://127.0.0.1:$PY_PORT; else B=http://127.0.0.1:$NODE_PORT; fi
    t=$(curl -fsS --max-time 10 "$B/")
    got="$(field "$t" memory_count) $(field "$t" model_connection) $(field "$t" model_errors) $(field "$t" ws_connection) $(field "$t" ws_errors)"
    expect_eq "$name reconnects after its servers restart (count, conns, errors)" "4 2 1 2 1" "$got"
    [[ $got == "4 2 1 2 1" ]] || tail -n 20 "$WORK/$name.log" >&2
    if [[ $(field "$t" model_last_error) =~ ^(EOF|ECONNRESET|EPIPE|ENOTCONN|ECONNABORTED) &&
      $(field "$t" ws_last_error) =~ ^(EOF|ECONNRESET|EPIPE|ENOTCONN|ECONNABORTED) ]]; then
      ok "$name says which error broke each connection: $(field "$t" model_last_error) / $(field "$t" ws_last_error)"
    else
      fail "$name last errors: $t"
    fi
  done
  # py-agent's database file re-created under it (same path and contents, another inode: what a
  # restore does to a volume): SQLite refuses the write (SQLITE_READONLY_DBMOVED), the agent
  # opens the database again and the row goes in.
  if [[ -n $CHROOT ]]; then db=$WORK/py-agent-root/data/agent.db; else db=$WORK/py-agent/data/agent.db; fi
  cp -p "$db" "$db.copy" && mv "$db.copy" "$db"
  t=$(curl -fsS --max-time 10 "http://127.0.0.1:$PY_PORT/")
  expect_eq "py-agent reopens its moved database (count, rows, opens, errors)" "5 5 2 1" \
    "$(field "$t" memory_count) $(field "$t" db_rows) $(field "$t" db_opens) $(field "$t" db_errors)"
  expect_eq "py-agent names the database error" "SQLITE_READONLY_DBMOVED" "$(field "$t" db_last_error | cut -d: -f1)"
  # An agent restarted: memory starts over, the rows on its volume stay.
  for pid in "${AGENT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  AGENT_PIDS=()
  start_agent py-agent "$PY_PORT" /data && start_agent node-agent "$NODE_PORT" /data
  for name in py-agent node-agent; do
    if [[ $name == py-agent ]]; then B=http://127.0.0.1:$PY_PORT; else B=http://127.0.0.1:$NODE_PORT; fi
    t=$(curl -fsS --max-time 10 "$B/")
    rows=5
    [[ $name == py-agent ]] && rows=6
    expect_eq "$name after a restart (memory, rows)" "1 $rows" "$(field "$t" memory_count) $(field "$t" db_rows)"
  done
fi
for pid in "${AGENT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
stop_fakes

# ------------------------------------------------------------------ OCI layouts
if python3 - "$OUT_DIR" counter sleeper py-agent node-agent <<'PY'
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
    cmd = {
        "py-agent": ["/usr/bin/python3", "-u", "/app/agent.py"],
        "node-agent": ["/usr/bin/node", "/app/agent.js"],
    }.get(name, ["/" + name])
    if (c["os"], c["architecture"], c["config"]["Cmd"]) != ("linux", "amd64", cmd):
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
    def resolve(path):
        """A path in the layer with its symlinks followed (merged /usr: /lib64 → usr/lib64 ...)."""
        parts, seen = path.strip("/").split("/"), 0
        i = 0
        while i < len(parts):
            here = "/".join(parts[: i + 1])
            m = members.get(here)
            if m is not None and m.issym():
                seen += 1
                if seen > 40:
                    return None
                base = [] if m.linkname.startswith("/") else parts[:i]
                parts = [p for p in "/".join(base + [m.linkname.strip("/")] + parts[i + 1:]).split("/") if p]
                # resolve ".." entries
                out = []
                for p in parts:
                    if p == "..":
                        out = out[:-1]
                    elif p != ".":
                        out.append(p)
                parts, i = out, 0
                continue
            i += 1
        return members.get("/".join(parts))
    program = resolve(cmd[0])
    if program is None or not program.isfile() or not program.mode & 0o111:
        bad.append(f"{name}: layer lacks executable {cmd[0]}")
    if name in ("py-agent", "node-agent"):
        for needed in (cmd[-1], "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"):
            m = resolve(needed)
            if m is None or not m.isfile():
                bad.append(f"{name}: layer lacks {needed}")
        if name == "py-agent" and not any(n.startswith("usr/lib/python3.") and "/lib-dynload/_sqlite3." in n for n in members):
            bad.append(f"{name}: layer lacks the sqlite3 module")
    if name == "counter":
        # Debian's busybox-static, for `ate exec` (sh, ps, tar, ...).
        for needed in ("/bin/busybox", "/bin/sh", "/bin/ps", "/bin/tar"):
            m = resolve(needed)
            if m is None or not m.isfile() or not m.mode & 0o111:
                bad.append(f"{name}: layer lacks {needed} (busybox)")
for b in bad:
    print(b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
then ok "OCI image layouts in $OUT_DIR"; else fail "OCI image layouts in $OUT_DIR"; fi

echo "workloads: $PASSED passed, $FAILED failed"
((FAILED == 0))
