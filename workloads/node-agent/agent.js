// A small stateful "agent" on Node.js built-ins only, for Agent Substrate's tests.
//
// Each `GET /` (or `/turn`) is one agent turn:
//   - the in-memory turn counter goes up by one;
//   - the fake model server ($MODEL_ADDR, host:port) is asked over one kept-alive HTTP connection
//     (an `http.Agent({keepAlive: true, maxSockets: 1})`, so every turn reuses the pooled socket);
//   - a line is appended to a journal kept open under the volume ($ATE_DATA_DIR, /data): Node 20
//     has no SQLite built in (`node:sqlite` came in Node 22.5), so the "database" is an
//     append-only JSON-lines file, written with fsync on every turn and counted from disk;
//   - a message goes to the fake event server ($EVENTS_ADDR, host:port) over one WebSocket client
//     connection (written here on `net`: Node 20 has no WebSocket client built in), kept open
//     between turns, and its acknowledgement is read back;
//   - the answer is JSON: the counters, the rows in the journal, how many times each connection
//     had to be made (and how many broke), and the last error seen on each.
// A timer adds one to `ticks` every 100 ms.
//
// When a kept connection breaks (EOF, ECONNRESET, EPIPE, ENOTCONN: what an application sees
// after its sandbox was suspended and resumed, its connections restored closed), the agent
// records the error, connects again and retries that call once.
//
// `GET /healthz` answers 200 `ok`. Listens on $BIND_ADDR (0.0.0.0) port $PORT (80).
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');

const PORT = Number(process.env.PORT || 80);
const BIND_ADDR = process.env.BIND_ADDR || '0.0.0.0';
const DATA_DIR = process.env.ATE_DATA_DIR || '/data';
const TIMEOUT_MS = 5000;
const WS_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const BROKEN = new Set(['EOF', 'ECONNRESET', 'EPIPE', 'ENOTCONN', 'ECONNABORTED']);

function splitAddr(name) {
  const value = process.env[name] || '';
  const i = value.lastIndexOf(':');
  const port = Number(value.slice(i + 1));
  if (i <= 0 || !Number.isInteger(port) || port <= 0) {
    console.error(`${name} must be host:port, got ${JSON.stringify(value)}`);
    process.exit(2);
  }
  return { host: value.slice(0, i), port };
}

// What the answer says about one kept connection.
class Link {
  constructor(name) {
    this.name = name;
    this.connects = 0;
    this.errors = 0;
    this.lastError = '';
  }

  broke(code, err) {
    this.errors += 1;
    this.lastError = `${code}: ${err.message}`;
    console.log(`${this.name} broken (${this.lastError}); opening it again`);
  }
}

const modelLink = new Link('model connection');
const wsLink = new Link('event connection');

function errorCode(err) {
  return err && (err.code || (err.eof ? 'EOF' : undefined));
}

// Runs `call`; on a broken connection records it (unless the connection's own listeners
// already did) and runs it once more.
async function withRetry(link, call) {
  try {
    return await call();
  } catch (err) {
    const code = errorCode(err);
    if (!BROKEN.has(code)) throw err;
    if (!err.recorded) link.broke(code, err);
  }
  return call();
}

// ---------------------------------------------------------------- the model connection

const model = splitAddr('MODEL_ADDR');

// An http.Agent that counts its (re)connects and notes how each pooled socket broke: an idle
// socket that breaks is dropped from the pool by http.Agent itself (the next request simply
// connects again), so the note is how the answer can still say what happened.
class ModelAgent extends http.Agent {
  createConnection(options, callback) {
    const socket = super.createConnection(options, callback);
    let connected = false;
    let done = false;
    socket.once('connect', () => {
      connected = true;
      modelLink.connects += 1;
    });
    // Records the first break of a connected socket; later ones (and its close) are the same
    // event. A connect that fails is not a broken connection: the request fails with it.
    socket.ateBroke = (code, err) => {
      if (connected && !done) modelLink.broke(code, err);
      done = true;
    };
    socket.on('error', (err) => socket.ateBroke(err.code || 'ERROR', err));
    socket.on('end', () => socket.ateBroke('EOF', new Error('the model server closed the connection')));
    socket.on('close', () => {
      done = true;
    });
    return socket;
  }
}

const modelAgent = new ModelAgent({ keepAlive: true, maxSockets: 1 });

function askModelOnce(turn) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ turn, prompt: `what next, turn ${turn}?` });
    const req = http.request(
      {
        host: model.host,
        port: model.port,
        method: 'POST',
        path: '/v1/complete',
        agent: modelAgent,
        timeout: TIMEOUT_MS,
        headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
      },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          if (res.statusCode !== 200) {
            reject(new Error(`model server answered ${res.statusCode}: ${text.slice(0, 200)}`));
            return;
          }
          try {
            resolve(JSON.parse(text));
          } catch (err) {
            reject(err);
          }
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error('model request timed out')));
    req.on('error', (err) => {
      if (err.code === 'ECONNRESET' && /socket hang up/.test(err.message)) err.code = 'EOF';
      // Recorded once per socket, whichever of the socket and the request reports it first.
      const socket = req.socket;
      if (socket && socket.ateBroke) socket.ateBroke(err.code || 'ERROR', err);
      err.recorded = true;
      reject(err);
    });
    req.end(body);
  });
}

function askModel(turn) {
  return withRetry(modelLink, () => askModelOnce(turn));
}

// ---------------------------------------------------------------- the event stream (WebSocket)

const events = splitAddr('EVENTS_ADDR');

function eofError(what) {
  const err = new Error(what);
  err.code = 'EOF';
  return err;
}

// A minimal RFC 6455 client: text frames out (masked), the server's text frames back.
class EventStream {
  constructor(host, port) {
    this.host = host;
    this.port = port;
    this.socket = null;
    this.buf = Buffer.alloc(0);
    this.waiting = null; // {resolve, reject} of the message in flight
  }

  // The connection broke: recorded (once), the message in flight fails.
  fail(err) {
    if (this.socket) {
      this.socket.destroy();
      this.socket = null;
      wsLink.broke(err.code || 'ERROR', err);
    }
    err.recorded = true;
    const w = this.waiting;
    this.waiting = null;
    if (w) w.reject(err);
  }

  connect() {
    return new Promise((resolve, reject) => {
      const key = crypto.randomBytes(16).toString('base64');
      const accept = crypto.createHash('sha1').update(key + WS_GUID).digest('base64');
      const socket = net.connect({ host: this.host, port: this.port });
      socket.setTimeout(TIMEOUT_MS);
      let open = false;
      let head = Buffer.alloc(0);
      socket.on('connect', () => {
        socket.write(
          `GET /events HTTP/1.1\r\nHost: ${this.host}:${this.port}\r\n` +
            'Upgrade: websocket\r\nConnection: Upgrade\r\n' +
            `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
        );
      });
      socket.on('data', (chunk) => {
        if (open) {
          this.buf = Buffer.concat([this.buf, chunk]);
          this.parse();
          return;
        }
        head = Buffer.concat([head, chunk]);
        const end = head.indexOf('\r\n\r\n');
        if (end < 0) return;
        const lines = head.subarray(0, end).toString('latin1').split('\r\n');
        const got = lines
          .slice(1)
          .map((l) => l.split(':'))
          .find(([k]) => k.trim().toLowerCase() === 'sec-websocket-accept');
        if (!lines[0].startsWith('HTTP/1.1 101') || !got || got.slice(1).join(':').trim() !== accept) {
          socket.destroy();
          reject(new Error(`WebSocket handshake refused: ${lines[0]}`));
          return;
        }
        open = true;
        // Open between turns for as long as it lasts: no idle timeout (each exchange has one).
        socket.setTimeout(0);
        this.socket = socket;
        this.buf = head.subarray(end + 4);
        wsLink.connects += 1;
        resolve();
      });
      socket.on('timeout', () => socket.destroy(new Error('event server timed out')));
      socket.on('error', (err) => {
        if (!open) reject(err);
        else if (this.socket === socket) this.fail(err);
      });
      socket.on('end', () => {
        const err = eofError('the event server closed the connection');
        if (!open) reject(err);
        else if (this.socket === socket) this.fail(err);
      });
      socket.on('close', () => {
        if (!open) reject(eofError('the event server closed the connection during the handshake'));
        else if (this.socket === socket) this.fail(eofError('the event connection closed'));
      });
    });
  }

  sendFrame(opcode, payload) {
    const mask = crypto.randomBytes(4);
    let head;
    if (payload.length < 126) {
      head = Buffer.from([0x80 | opcode, 0x80 | payload.length]);
    } else if (payload.length < 65536) {
      head = Buffer.alloc(4);
      head.writeUInt8(0x80 | opcode, 0);
      head.writeUInt8(0x80 | 126, 1);
      head.writeUInt16BE(payload.length, 2);
    } else {
      head = Buffer.alloc(10);
      head.writeUInt8(0x80 | opcode, 0);
      head.writeUInt8(0x80 | 127, 1);
      head.writeBigUInt64BE(BigInt(payload.length), 2);
    }
    const masked = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
    this.socket.write(Buffer.concat([head, mask, masked]));
  }

  // Takes whole frames off the buffer: text answers the message in flight, ping gets a pong,
  // close ends the connection.
  parse() {
    for (;;) {
      if (this.buf.length < 2) return;
      const opcode = this.buf[0] & 0x0f;
      let len = this.buf[1] & 0x7f;
      let at = 2;
      if (len === 126) {
        if (this.buf.length < 4) return;
        len = this.buf.readUInt16BE(2);
        at = 4;
      } else if (len === 127) {
        if (this.buf.length < 10) return;
        len = Number(this.buf.readBigUInt64BE(2));
        at = 10;
      }
      const masked = (this.buf[1] & 0x80) !== 0;
      const maskAt = at;
      if (masked) at += 4;
      if (this.buf.length < at + len) return;
      let payload = this.buf.subarray(at, at + len);
      if (masked) {
        const mask = this.buf.subarray(maskAt, maskAt + 4);
        payload = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
      }
      this.buf = this.buf.subarray(at + len);
      if (opcode === 0x1) {
        const w = this.waiting;
        this.waiting = null;
        if (w) w.resolve(payload.toString());
      } else if (opcode === 0x8) {
        this.fail(eofError('the event server sent a close frame'));
        return;
      } else if (opcode === 0x9) {
        this.sendFrame(0xa, payload);
      }
    }
  }

  // Sends one text message and resolves with the server's answer (within TIMEOUT_MS).
  async exchange(text) {
    if (!this.socket) await this.connect();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const err = new Error(`no answer from the event server in ${TIMEOUT_MS} ms`);
        err.code = 'ETIMEDOUT';
        this.fail(err);
      }, TIMEOUT_MS);
      const done = (fn) => (value) => {
        clearTimeout(timer);
        fn(value);
      };
      this.waiting = { resolve: done(resolve), reject: done(reject) };
      this.sendFrame(0x1, Buffer.from(text));
    });
  }
}

const stream = new EventStream(events.host, events.port);

function sendEvent(turn) {
  return withRetry(wsLink, () => stream.exchange(JSON.stringify({ turn, event: 'turn done' })));
}

// ---------------------------------------------------------------- the journal (the "database")

fs.mkdirSync(DATA_DIR, { recursive: true });
const journalPath = path.join(DATA_DIR, 'turns.jsonl');
const journal = fs.openSync(journalPath, 'a');

function record(row) {
  fs.writeSync(journal, `${JSON.stringify(row)}\n`);
  fs.fsyncSync(journal);
  const text = fs.readFileSync(journalPath, 'utf8');
  return text.split('\n').filter((l) => l.length > 0).length;
}

// ---------------------------------------------------------------- turns

let turns = 0;
let ticks = 0;
setInterval(() => {
  ticks += 1;
}, 100);

async function turn() {
  turns += 1;
  const n = turns;
  const reply = await askModel(n);
  const ack = await sendEvent(n);
  const rows = record({
    turn: n,
    model_connection: modelLink.connects,
    ws_connection: wsLink.connects,
    reply: reply.text || '',
    at: Date.now(),
  });
  return {
    runtime: `node ${process.version}`,
    memory_count: n,
    ticks,
    db_rows: rows,
    model_connection: modelLink.connects,
    model_errors: modelLink.errors,
    model_last_error: modelLink.lastError,
    model_reply: reply,
    ws_connection: wsLink.connects,
    ws_errors: wsLink.errors,
    ws_last_error: wsLink.lastError,
    ws_ack: ack,
    // The journal is never opened again: its fd (O_APPEND) writes to whatever file a restore
    // reopened at its path. The fields match py-agent's answer.
    db_opens: 1,
    db_errors: 0,
    db_last_error: '',
  };
}

// One turn at a time, in arrival order.
let queue = Promise.resolve();
function serialized(fn) {
  const next = queue.then(fn, fn);
  queue = next.catch(() => {});
  return next;
}

function answer(res, status, body, type = 'application/json') {
  res.writeHead(status, { 'Content-Type': type, 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

const server = http.createServer((req, res) => {
  const p = req.url.split('?')[0];
  if (p === '/healthz') {
    answer(res, 200, 'ok', 'text/plain');
  } else if (req.method === 'GET' && (p === '/' || p === '/turn')) {
    serialized(turn).then(
      (out) => {
        console.log(`turn ${out.memory_count} done: ${JSON.stringify(out)}`);
        answer(res, 200, JSON.stringify(out));
      },
      (err) => {
        console.log(`turn failed: ${err.code || ''} ${err.message}`);
        answer(res, 502, JSON.stringify({ error: `${err.code || ''} ${err.message}` }));
      },
    );
  } else {
    answer(res, 404, JSON.stringify({ error: `no route ${p}` }));
  }
});

server.listen(PORT, BIND_ADDR, () => {
  console.log(`node-agent (node ${process.version}) listening on ${BIND_ADDR}:${PORT}`);
});

for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
