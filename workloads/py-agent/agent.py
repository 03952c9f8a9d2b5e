"""A small stateful "agent" on Python's standard library, for Agent Substrate's tests.

Each `GET /` (or `/turn`) is one agent turn:
  - the in-memory turn counter goes up by one;
  - the fake model server ($MODEL_ADDR, host:port) is asked over one kept-alive HTTP connection
    (an `http.client.HTTPConnection` held in a global, so every turn reuses it);
  - a row is added to an SQLite database kept open under the volume ($ATE_DATA_DIR, /data);
    when SQLite refuses the write because the file at its path is not the one it opened
    (SQLITE_READONLY_DBMOVED: a restore re-created the volume's files, same contents, new
    inodes), the database is opened again and the row written once more;
  - a message goes to the fake event server ($EVENTS_ADDR, host:port) over one WebSocket client
    connection, kept open between turns, and its acknowledgement is read back;
  - the answer is JSON: the counters, the rows in the database, how many times each connection
    had to be made (and how many broke), and the last error seen on each.
A background thread adds one to `ticks` every 100 ms.

When a kept connection turns out broken (EOF, ECONNRESET, EPIPE, ENOTCONN: what an application
sees after its sandbox was suspended and resumed, its connections restored closed), the agent
records the error, connects again and retries that call once.

`GET /healthz` answers 200 `ok`. Listens on $BIND_ADDR (0.0.0.0) port $PORT (80).
"""

import base64
import errno
import hashlib
import http.client
import http.server
import json
import os
import socket
import socketserver
import sqlite3
import struct
import sys
import threading
import time

PORT = int(os.environ.get("PORT", "80"))
BIND_ADDR = os.environ.get("BIND_ADDR", "0.0.0.0")
DATA_DIR = os.environ.get("ATE_DATA_DIR", "/data")
TIMEOUT = 5.0
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def split_addr(name):
    value = os.environ.get(name, "")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        sys.exit(f"{name} must be host:port, got {value!r}")
    return host, int(port)


def broken_reason(exc):
    """The name of a broken-connection error ("EOF", "ECONNRESET", ...), or None for others."""
    if isinstance(exc, (EOFError, http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return "EOF"
    if isinstance(exc, OSError) and exc.errno in (
        errno.ECONNRESET,
        errno.EPIPE,
        errno.ENOTCONN,
        errno.ECONNABORTED,
    ):
        return errno.errorcode[exc.errno]
    return None


class Link:
    """What the answer says about one kept connection (or the open database)."""

    def __init__(self, name):
        self.name = name
        self.connects = 0
        self.errors = 0
        self.last_error = ""

    def broke(self, reason, exc):
        self.errors += 1
        self.last_error = f"{reason}: {exc}"
        print(f"{self.name} broken ({self.last_error}); opening it again", flush=True)


MODEL_LINK = Link("model connection")
WS_LINK = Link("event connection")
DB_LINK = Link("database")


class ModelConnection(http.client.HTTPConnection):
    """An HTTPConnection that counts its (re)connects."""

    def connect(self):
        super().connect()
        MODEL_LINK.connects += 1


class EventStream:
    """A minimal RFC 6455 client: text frames out (masked), the server's text frames back."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.sock = None
        self.buf = b""

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock, self.buf = None, b""

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the event server closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def connect(self):
        sock = socket.create_connection((self.host, self.port), timeout=TIMEOUT)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                f"GET /events HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        self.sock, self.buf = sock, b""
        while b"\r\n\r\n" not in self.buf:
            chunk = sock.recv(4096)
            if not chunk:
                raise EOFError("the event server closed the connection during the handshake")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        if not lines[0].startswith("HTTP/1.1 101") or headers.get("sec-websocket-accept") != accept:
            raise RuntimeError(f"WebSocket handshake refused: {lines[0]}")
        WS_LINK.connects += 1

    def _send_frame(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _recv_text(self):
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x1:
                return payload.decode()
            if opcode == 0x8:
                raise EOFError("the event server sent a close frame")
            if opcode == 0x9:
                self._send_frame(0xA, payload)

    def exchange(self, text):
        """Sends one text message and returns the server's answer."""
        if self.sock is None:
            self.connect()
        self._send_frame(0x1, text.encode())
        return self._recv_text()


def moved_reason(exc):
    """Names SQLITE_READONLY_DBMOVED (SQLite refuses to write because the file at the
    database's path is no longer the one it opened: a restore re-created the volume, same path
    and contents, another inode); None for any other error."""
    name = getattr(exc, "sqlite_errorname", "")
    return name if name == "SQLITE_READONLY_DBMOVED" else None


def with_retry(link, reset, call, reason_of=broken_reason):
    """Runs `call`; when `reason_of` names the error (a broken connection), records it, resets
    and runs it once more."""
    for attempt in (1, 2):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - re-raised unless a broken connection
            reset()
            reason = reason_of(exc)
            if reason is not None:
                link.broke(reason, exc)
            if reason is None or attempt == 2:
                raise
    raise AssertionError("unreachable")


class Agent:
    def __init__(self):
        model_host, model_port = split_addr("MODEL_ADDR")
        events_host, events_port = split_addr("EVENTS_ADDR")
        self.lock = threading.Lock()
        self.turns = 0
        self.ticks = 0
        self.model = ModelConnection(model_host, model_port, timeout=TIMEOUT)
        self.events = EventStream(events_host, events_port)
        os.makedirs(DATA_DIR, exist_ok=True)
        self.db = None
        self.open_db()
        threading.Thread(target=self.tick, name="ticker", daemon=True).start()

    def open_db(self):
        if self.db is not None:
            self.db.close()
        self.db = sqlite3.connect(os.path.join(DATA_DIR, "agent.db"), check_same_thread=False)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS turns (turn INTEGER, model_connection INTEGER, "
            "ws_connection INTEGER, reply TEXT, at REAL)"
        )
        self.db.commit()
        DB_LINK.connects += 1

    def record(self, turn, reply):
        """Adds the turn's row; answers the rows in the database."""
        self.db.execute(
            "INSERT INTO turns VALUES (?, ?, ?, ?, ?)",
            (turn, MODEL_LINK.connects, WS_LINK.connects, reply.get("text", ""), time.time()),
        )
        self.db.commit()
        (rows,) = self.db.execute("SELECT COUNT(*) FROM turns").fetchone()
        return rows

    def tick(self):
        while True:
            time.sleep(0.1)
            self.ticks += 1

    def ask_model(self, turn):
        def call():
            body = json.dumps({"turn": turn, "prompt": f"what next, turn {turn}?"})
            self.model.request("POST", "/v1/complete", body, {"Content-Type": "application/json"})
            resp = self.model.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"model server answered {resp.status}: {data[:200]!r}")
            return json.loads(data)

        return with_retry(MODEL_LINK, self.model.close, call)

    def turn(self):
        with self.lock:
            self.turns += 1
            turn = self.turns
            reply = self.ask_model(turn)
            ack = with_retry(
                WS_LINK,
                self.events.close,
                lambda: self.events.exchange(json.dumps({"turn": turn, "event": "turn done"})),
            )
            # A database whose file was re-created under it (a restore) is opened again.
            rows = with_retry(DB_LINK, self.open_db, lambda: self.record(turn, reply), moved_reason)
            return {
                "runtime": f"python {sys.version.split()[0]}",
                "memory_count": turn,
                "ticks": self.ticks,
                "db_rows": rows,
                "model_connection": MODEL_LINK.connects,
                "model_errors": MODEL_LINK.errors,
                "model_last_error": MODEL_LINK.last_error,
                "model_reply": reply,
                "ws_connection": WS_LINK.connects,
                "ws_errors": WS_LINK.errors,
                "ws_last_error": WS_LINK.last_error,
                "ws_ack": ack,
                "db_opens": DB_LINK.connects,
                "db_errors": DB_LINK.errors,
                "db_last_error": DB_LINK.last_error,
            }


AGENT = None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self.answer(200, "ok", "text/plain")
        elif path in ("/", "/turn"):
            try:
                out = AGENT.turn()
            except Exception as exc:  # noqa: BLE001 - the turn failed: say why
                print(f"turn failed: {exc!r}", flush=True)
                self.answer(502, json.dumps({"error": repr(exc)}))
                return
            print(f"turn {out['memory_count']} done: {json.dumps(out)}", flush=True)
            self.answer(200, json.dumps(out))
        else:
            self.answer(404, json.dumps({"error": f"no route {path}"}))

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self):
        # HTTPServer.server_bind looks the host name up (socket.getfqdn): not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "agent", self.server_address[1]


def main():
    global AGENT
    AGENT = Agent()
    server = Server((BIND_ADDR, PORT), Handler)
    print(f"py-agent (python {sys.version.split()[0]}) listening on {BIND_ADDR}:{PORT}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
