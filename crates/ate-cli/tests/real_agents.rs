//! Real runtimes end to end: the `py-agent` (Debian's Python 3, stdlib only) and `node-agent`
//! (Debian's Node.js, built-ins only) images run a small stateful agent in real runc + CRIU
//! sandboxes through `ate up`. Each turn of an agent asks a fake model server over one kept-alive
//! HTTP connection, writes a row to its volume (SQLite for Python, a journal file for Node) and
//! sends an event over one WebSocket client connection, while a background thread/timer ticks.
//!
//! The fake model server (HTTP/1.1 keep-alive, JSON) and the fake event server (WebSocket) run
//! in this test process, listening inside a network namespace the test creates
//! (`support/test_host.rs`), which the agents reach through their template's egress allow list.
//!
//! After warm turns, cycles of: suspend → resume on the same worker (node-local generation);
//! suspend → resume on the other worker (node-local generation); suspend --durable, the
//! node-local generation removed → resume on the other worker from the durable copy. After each
//! resume: the memory count continues (+1 per turn), the ticks go on from where they were, the
//! rows on the volume continue, and both connections were broken by the suspend and made again
//! (the agent saw the error, reconnected, the turn succeeded, the servers saw the new
//! connections). A restore re-creates the volume's files (same contents, new inodes), which
//! SQLite notices (SQLITE_READONLY_DBMOVED): the Python agent then opens its database again,
//! and the test accepts that reason alone.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

use support::actors::*;
use support::test_host::TestHost;
use support::*;

const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

// ---------------------------------------------------------------- fake servers

/// What a fake server saw: connections accepted (numbered from 1) and, for each, the turns it
/// carried.
#[derive(Default, Debug)]
struct Seen {
    connections: u64,
    turns: BTreeMap<u64, Vec<u64>>,
}

/// One fake server: an accept loop on a listener in the test host, a thread per connection.
struct FakeServer {
    addr: String,
    seen: Arc<Mutex<Seen>>,
    /// A clone of every accepted connection, shut down on drop.
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl FakeServer {
    fn start(listener: TcpListener, serve: fn(TcpStream, u64, Arc<Mutex<Seen>>)) -> FakeServer {
        let addr = listener.local_addr().expect("listener address").to_string();
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (s, st, cs) = (seen.clone(), stop.clone(), conns.clone());
        let accept = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(600)));
                        if let Ok(c) = conn.try_clone() {
                            cs.lock().expect("conns").push(c);
                        }
                        let n = {
                            let mut seen = s.lock().expect("seen");
                            seen.connections += 1;
                            seen.connections
                        };
                        let s = s.clone();
                        std::thread::spawn(move || serve(conn, n, s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        FakeServer {
            addr,
            seen,
            conns,
            stop,
            accept: Some(accept),
        }
    }

    fn connections(&self) -> u64 {
        self.seen.lock().expect("seen").connections
    }

    /// The turns connection `n` carried.
    fn turns_on(&self, n: u64) -> Vec<u64> {
        self.seen
            .lock()
            .expect("seen")
            .turns
            .get(&n)
            .cloned()
            .unwrap_or_default()
    }

    fn record(seen: &Mutex<Seen>, conn: u64, turn: u64) {
        seen.lock()
            .expect("seen")
            .turns
            .entry(conn)
            .or_default()
            .push(turn);
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().expect("conns").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The fake model server: HTTP/1.1 keep-alive; each `POST` with a JSON body `{"turn": N, …}` is
/// answered `{"turn": N, "connection": C, "text": …}` (C: this connection's number).
fn serve_model(conn: TcpStream, n: u64, seen: Arc<Mutex<Seen>>) {
    let mut out = match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let turn = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["turn"].as_u64())
            .unwrap_or(0);
        FakeServer::record(&seen, n, turn);
        let reply =
            json!({"turn": turn, "connection": n, "text": format!("model answer to turn {turn}")})
                .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        if out
            .write_all(head.as_bytes())
            .and_then(|_| out.write_all(reply.as_bytes()))
            .is_err()
        {
            return;
        }
    }
}

/// The fake event server: the RFC 6455 handshake, then each text message `{"turn": N, …}` is
/// acknowledged with a text frame `{"ack": N, "connection": C}`.
fn serve_events(conn: TcpStream, n: u64, seen: Arc<Mutex<Seen>>) {
    let mut out = match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    let mut key = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("sec-websocket-key")
        {
            key = Some(v.trim().to_string());
        }
    }
    let Some(key) = key else { return };
    let accept = base64::engine::general_purpose::STANDARD
        .encode(Sha1::digest(format!("{key}{WS_GUID}").as_bytes()));
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if out.write_all(head.as_bytes()).is_err() {
        return;
    }
    loop {
        let mut h = [0u8; 2];
        if reader.read_exact(&mut h).is_err() {
            return;
        }
        let opcode = h[0] & 0x0f;
        let mut len = u64::from(h[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            if reader.read_exact(&mut b).is_err() {
                return;
            }
            len = u64::from(u16::from_be_bytes(b));
        } else if len == 127 {
            let mut b = [0u8; 8];
            if reader.read_exact(&mut b).is_err() {
                return;
            }
            len = u64::from_be_bytes(b);
        }
        let mut mask = [0u8; 4];
        if h[1] & 0x80 != 0 && reader.read_exact(&mut mask).is_err() {
            return;
        }
        let mut payload = vec![0u8; len as usize];
        if reader.read_exact(&mut payload).is_err() {
            return;
        }
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match opcode {
            0x1 => {
                let turn = serde_json::from_slice::<Value>(&payload)
                    .ok()
                    .and_then(|v| v["turn"].as_u64())
                    .unwrap_or(0);
                FakeServer::record(&seen, n, turn);
                let ack = json!({"ack": turn, "connection": n}).to_string();
                let mut frame = vec![0x81, ack.len() as u8];
                frame.extend_from_slice(ack.as_bytes());
                if out.write_all(&frame).is_err() {
                    return;
                }
            }
            0x8 => return,
            _ => {}
        }
    }
}

// ---------------------------------------------------------------- the agents

struct Runtime {
    /// The image (and the actor's name).
    image: &'static str,
    /// How the agent's `runtime` field starts.
    runtime: &'static str,
    memory: &'static str,
}

const PYTHON: Runtime = Runtime {
    image: "py-agent",
    runtime: "python 3.",
    memory: "128Mi",
};

const NODE: Runtime = Runtime {
    image: "node-agent",
    runtime: "node v",
    memory: "256Mi",
};

fn template(ns: &str, rt: &Runtime, model: &str, events: &str, restore: Restore) -> String {
    let images = images_dir();
    let restore = match restore {
        Restore::Lazy => "",
        Restore::Eager => ", memoryRestore: eager",
    };
    format!(
        "{head}spec:
  containers:
    - name: main
      image: oci-layout:{images}/{image}:latest
      env:
        - {{name: MODEL_ADDR, value: \"{model}\"}}
        - {{name: EVENTS_ADDR, value: \"{events}\"}}
      wakeupProbe:
        httpGet: {{path: /healthz, port: 80}}
        timeoutSeconds: 60
  resources: {{cpu: 500m, memory: {memory}}}
  volumes:
    - name: data
      mountPath: /data
  snapshots: {{fidelity: memory{restore}}}
  idleTimeout: 10m
  egress:
    defaultAction: deny-all
    allow: [\"{model}\", \"{events}\"]
",
        head = template_head(ns, rt.image),
        images = images.display(),
        image = rt.image,
        memory = rt.memory,
    )
}

/// One turn's answer.
#[derive(Debug, Clone)]
struct Turn {
    at: Instant,
    raw: Value,
    memory_count: u64,
    ticks: u64,
    db_rows: u64,
    model_connection: u64,
    model_errors: u64,
    model_last_error: String,
    /// The model server's answer: (turn, connection).
    model_reply: (u64, u64),
    ws_connection: u64,
    ws_errors: u64,
    ws_last_error: String,
    /// The event server's acknowledgement: (turn, connection).
    ws_ack: (u64, u64),
    /// How many times the agent opened its database, how many times it had to open it again,
    /// and why.
    db_opens: u64,
    db_errors: u64,
    db_last_error: String,
}

impl Turn {
    fn parse(body: &str) -> Turn {
        let v: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
        let n = |k: &str| {
            v[k].as_u64()
                .unwrap_or_else(|| panic!("no number {k} in {body}"))
        };
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        let ack: Value = serde_json::from_str(v["ws_ack"].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("ws_ack is not JSON ({e}): {body}"));
        Turn {
            at: Instant::now(),
            memory_count: n("memory_count"),
            ticks: n("ticks"),
            db_rows: n("db_rows"),
            model_connection: n("model_connection"),
            model_errors: n("model_errors"),
            model_last_error: s("model_last_error"),
            model_reply: (
                v["model_reply"]["turn"].as_u64().unwrap_or(0),
                v["model_reply"]["connection"].as_u64().unwrap_or(0),
            ),
            ws_connection: n("ws_connection"),
            ws_errors: n("ws_errors"),
            ws_last_error: s("ws_last_error"),
            ws_ack: (
                ack["ack"].as_u64().unwrap_or(0),
                ack["connection"].as_u64().unwrap_or(0),
            ),
            db_opens: n("db_opens"),
            db_errors: n("db_errors"),
            db_last_error: s("db_last_error"),
            raw: v,
        }
    }
}

/// The errors an application sees on a connection its suspend broke.
fn is_broken_connection_error(e: &str) -> bool {
    ["EOF", "ECONNRESET", "EPIPE", "ENOTCONN", "ECONNABORTED"]
        .iter()
        .any(|k| e.starts_with(k))
}

struct Run<'a> {
    sys: &'a System,
    ns: &'static str,
    name: &'static str,
    model: &'a FakeServer,
    events: &'a FakeServer,
    suspends: u64,
}

impl Run<'_> {
    fn target(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    /// One turn through the router, with what both servers saw checked against the answer.
    fn turn(&self, what: &str) -> Turn {
        let body = get_ok(self.sys, &self.target(), "/");
        let t = Turn::parse(&body);
        let n = t.memory_count;
        assert_eq!(
            t.model_reply.0, n,
            "{what}: the model answered this turn: {body}"
        );
        assert_eq!(
            t.ws_ack.0, n,
            "{what}: the event server acked this turn: {body}"
        );
        assert_eq!(
            t.model_reply.1, t.model_connection,
            "{what}: the model server numbers the agent's connections as it does: {body}"
        );
        assert_eq!(
            self.model.connections(),
            t.model_connection,
            "{what}: the model server saw every connection the agent made: {body}"
        );
        assert_eq!(t.ws_ack.1, t.ws_connection, "{what}: {body}");
        assert_eq!(
            self.events.connections(),
            t.ws_connection,
            "{what}: the event server saw every connection the agent made: {body}"
        );
        assert_eq!(
            self.model.turns_on(t.model_connection).last(),
            Some(&n),
            "{what}: this turn went over the newest model connection"
        );
        assert_eq!(
            self.events.turns_on(t.ws_connection).last(),
            Some(&n),
            "{what}: this turn went over the newest event connection"
        );
        t
    }

    fn worker(&self) -> String {
        actor(self.sys, self.ns, self.name)["worker"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn pin(&self, worker: &str) {
        let selector = format!("ate.dev/worker={worker}");
        self.sys.ate_ok(&[
            "update",
            "actor",
            self.name,
            "-a",
            self.ns,
            "--selector",
            &selector,
        ]);
    }

    fn suspend(&mut self, durable: bool) -> Duration {
        let mut args = vec!["suspend", "actor", self.name, "-a", self.ns];
        if durable {
            args.push("--durable");
        }
        let t = Instant::now();
        self.sys.ate_ok(&args);
        self.suspends += 1;
        t.elapsed()
    }
}

/// After a resume: state continued, both connections were broken and made again.
fn assert_continued(what: &str, before: &Turn, after: &Turn) {
    let both = format!("before: {}\nafter:  {}", before.raw, after.raw);
    assert_eq!(
        after.memory_count,
        before.memory_count + 1,
        "{what}: the memory count continues\n{both}"
    );
    assert_eq!(
        after.db_rows,
        before.db_rows + 1,
        "{what}: the rows on the volume continue\n{both}"
    );
    assert!(
        after.ticks > before.ticks,
        "{what}: the ticks go on from where they were\n{both}"
    );
    // At most one tick per 100 ms since the previous answer (plus slack): the counter was not
    // replaced by something else either.
    let bound = before.ticks + (after.at - before.at).as_millis() as u64 / 100 + 10;
    assert!(
        after.ticks <= bound,
        "{what}: ticks at most {bound}\n{both}"
    );
    assert_eq!(
        after.model_connection,
        before.model_connection + 1,
        "{what}: the model connection was made again, once\n{both}"
    );
    assert_eq!(
        after.model_errors,
        before.model_errors + 1,
        "{what}: the agent saw its old model connection break\n{both}"
    );
    assert!(
        is_broken_connection_error(&after.model_last_error),
        "{what}: a broken-connection error on the model connection\n{both}"
    );
    assert_eq!(
        after.ws_connection,
        before.ws_connection + 1,
        "{what}: the WebSocket was made again, once\n{both}"
    );
    assert_eq!(
        after.ws_errors,
        before.ws_errors + 1,
        "{what}: the agent saw its old WebSocket break\n{both}"
    );
    assert!(
        is_broken_connection_error(&after.ws_last_error),
        "{what}: a broken-connection error on the WebSocket\n{both}"
    );
    // The database: the rows continued (above). An agent may have had to open it again, once,
    // for the one reason a restore gives it: its file was re-created at the same path (same
    // contents, another inode), which SQLite notices and refuses to write to.
    assert!(
        after.db_errors == before.db_errors
            || (after.db_errors == before.db_errors + 1
                && after.db_opens == before.db_opens + 1
                && after.db_last_error.starts_with("SQLITE_READONLY_DBMOVED")),
        "{what}: the database stays usable\n{both}"
    );
}

/// Warm turns: +1 each, over the same two connections.
fn assert_warm(before: &Turn, after: &Turn) {
    let both = format!("before: {}\nafter:  {}", before.raw, after.raw);
    assert_eq!(after.memory_count, before.memory_count + 1, "{both}");
    assert_eq!(after.db_rows, before.db_rows + 1, "{both}");
    assert!(after.ticks >= before.ticks, "{both}");
    assert_eq!(
        (after.model_connection, after.model_errors),
        (before.model_connection, before.model_errors),
        "the model connection is kept alive between turns\n{both}"
    );
    assert_eq!(
        (after.ws_connection, after.ws_errors),
        (before.ws_connection, before.ws_errors),
        "the WebSocket stays open between turns\n{both}"
    );
    assert_eq!(
        (after.db_opens, after.db_errors),
        (before.db_opens, before.db_errors),
        "the database stays open between turns\n{both}"
    );
}

/// Lines of the node agent's log that say an actor was restored from `from`.
fn restores_from(sys: &System, from: &str) -> usize {
    sys.log("node")
        .lines()
        .filter(|l| l.contains("actor restored") && l.contains(from))
        .count()
}

fn other(worker: &str) -> &'static str {
    if worker == "worker-1" {
        "worker-2"
    } else {
        "worker-1"
    }
}

/// How the agent's memory comes back: on demand (the default), or whole before the first request
/// (`memoryRestore: eager`: for a sealed generation, streamed to CRIU by the worker).
#[derive(Clone, Copy)]
enum Restore {
    Lazy,
    Eager,
}

fn agent_keeps_its_state_across_suspends(rt: Runtime, restore: Restore) {
    // Before the system starts: the workers' first read of the node addresses has the host side.
    let host = TestHost::new();
    let model = FakeServer::start(host.listen(0), serve_model);
    let events = FakeServer::start(host.listen(0), serve_events);
    // No frozen copies: every resume restores a generation with CRIU.
    let sys = System::up_with_env(UpOptions::default(), &[("ATE_KEEP_FROZEN", "0")]);
    let ns = "ns-agents";
    let path = sys.dir.path().join("agent.yaml");
    std::fs::write(&path, template(ns, &rt, &model.addr, &events.addr, restore))
        .expect("write template");
    sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
    create_actor(&sys, ns, rt.image, rt.image);
    let mut run = Run {
        sys: &sys,
        ns,
        name: rt.image,
        model: &model,
        events: &events,
        suspends: 0,
    };

    // The cold start and warm turns: one connection each, kept.
    let t = Instant::now();
    let mut last = run.turn("first turn");
    eprintln!(
        "[timing] {}: cold start → first turn {} ms",
        rt.image,
        ms(t.elapsed())
    );
    assert!(
        last.raw["runtime"]
            .as_str()
            .is_some_and(|r| r.starts_with(rt.runtime)),
        "{}",
        last.raw
    );
    assert_eq!(
        (
            last.memory_count,
            last.db_rows,
            last.model_connection,
            last.ws_connection
        ),
        (1, 1, 1, 1),
        "{}",
        last.raw
    );
    for i in 2..=3 {
        let t = run.turn(&format!("warm turn {i}"));
        assert_warm(&last, &t);
        last = t;
    }

    let mut timings = Vec::new();
    for cycle in 1..=2 {
        for step in [
            "same worker, node-local",
            "other worker, node-local",
            "other worker, durable copy",
        ] {
            let here = run.worker();
            let next = if step.starts_with("same") {
                here.clone()
            } else {
                other(&here).to_string()
            };
            let durable = step.ends_with("durable copy");
            // Let the ticker tick between the last turn and the dump.
            std::thread::sleep(Duration::from_millis(300));
            let suspended = run.suspend(durable);
            if durable {
                let dir = generation_dir(&sys.state_dir(), ns, rt.image, run.suspends);
                std::fs::remove_dir_all(&dir).expect("remove the node-local generation");
            }
            run.pin(&next);
            let (local, remote) = (
                restores_from(&sys, "node-local copy"),
                restores_from(&sys, "durable copy"),
            );
            let what = format!("{} cycle {cycle}, {step}", rt.image);
            let t = Instant::now();
            let now = run.turn(&what);
            let resumed = t.elapsed();
            assert_continued(&what, &last, &now);
            assert_eq!(run.worker(), next, "{what}: resumed on the selected worker");
            let (local_after, remote_after) = (
                restores_from(&sys, "node-local copy"),
                restores_from(&sys, "durable copy"),
            );
            if durable {
                assert_eq!(
                    (local_after, remote_after),
                    (local, remote + 1),
                    "{what}: restored from the durable copy\n{}",
                    sys.log("node")
                );
            } else {
                assert_eq!(
                    (local_after, remote_after),
                    (local + 1, remote),
                    "{what}: restored from the node-local generation\n{}",
                    sys.log("node")
                );
            }
            let db = if now.db_errors > last.db_errors {
                format!("reopened: {:?}", now.db_last_error)
            } else {
                "kept open".to_string()
            };
            eprintln!(
                "[timing] {what}: suspend{} {} ms, resume → turn {} ms (model: {:?}, ws: {:?}, database {db})",
                if durable { " --durable" } else { "" },
                ms(suspended),
                ms(resumed),
                now.model_last_error,
                now.ws_last_error,
            );
            timings.push((what, ms(suspended), ms(resumed)));
            // A warm turn after the resume: the new connections are kept again.
            let warm = run.turn(&format!("{} cycle {cycle}, warm after {step}", rt.image));
            assert_warm(&now, &warm);
            last = warm;
        }
    }
    assert_eq!(last.memory_count, 3 + 2 * 3 * 2);
    if matches!(restore, Restore::Eager) {
        // The node-local generations (sealed) came back through the worker's image streamer.
        assert!(
            sys.worker_metric("ate_worker_memory_streamed_bytes_total") > 0,
            "no memory streamed to CRIU"
        );
    }
    assert_eq!(model.connections(), 1 + 2 * 3);
    assert_eq!(events.connections(), 1 + 2 * 3);
    eprintln!("[timing] {} summary: {timings:?}", rt.image);
}

#[test]
fn python_agent_keeps_memory_ticks_and_rows_and_reconnects_across_suspends() {
    agent_keeps_its_state_across_suspends(PYTHON, Restore::Lazy);
}

#[test]
fn node_agent_keeps_memory_ticks_and_rows_and_reconnects_across_suspends() {
    agent_keeps_its_state_across_suspends(NODE, Restore::Lazy);
}

#[test]
fn python_agent_restored_eagerly_keeps_its_state_across_suspends() {
    agent_keeps_its_state_across_suspends(PYTHON, Restore::Eager);
}

#[test]
fn node_agent_restored_eagerly_keeps_its_state_across_suspends() {
    agent_keeps_its_state_across_suspends(NODE, Restore::Eager);
}
