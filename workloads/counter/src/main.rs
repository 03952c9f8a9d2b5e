//! The demo counter actor.
//!
//! Keeps three counters and shows which of them survived a suspend/resume:
//! - one in memory (survives only a memory snapshot restore),
//! - one in a file in the volume directory `$ATE_DATA_DIR` (default `/data`, file `counter`),
//! - one in a file on the rootfs (`/var/lib/counter/count`, or `$COUNTER_ROOTFS_FILE`).
//!
//! `GET /ws` with a WebSocket upgrade: the RFC 6455 handshake, then every frame is echoed.
//!
//! `GET /sandbox` reports the sandbox as seen from inside (no-new-privs, seccomp mode, capability
//! sets, what refused syscalls and masked/read-only paths answer); see `sandbox.rs`.
//!
//! Every request except `/healthz`, `/whoami`, `/echo`, `/ws`, `/connect`, `/dials`, `/sandbox`,
//! `/call`, `/caller` and `/spin` increments all three and answers
//! `preserved memory count: N | preserved file counter: M | preserved rootfs counter: K`.
//!
//! `POST /sidecar-exit?code=N` asks the sidecar (`$SIDECAR_ADDR`) to exit with code N.
//!
//! `GET /connect?addr=IP:PORT` tries an outbound TCP connect (1 s timeout), then waits up to 1 s for
//! an immediate close or reset (what the worker's egress proxy does to a denied connection), and
//! answers `ok` or the error: the isolation tests use it to show what an actor can (not) reach.
//!
//! `GET /dials` reports the outbound dials of `$DIAL_ADDR` (see `dial.rs`).
//!
//! `GET /spin?seconds=N[&threads=T]` starts T threads (default: the cores it may use) spinning on
//! the CPU for N seconds and answers at once; `seconds=0` stops them (see `spin.rs`): the hog of
//! `ate bench noisy`.
//!
//! `GET /call?actor=A/N&path=P[&n=K][&forge=1]` calls another actor through the platform address
//! (see `call.rs`); `GET /caller` answers `caller: <ate-caller-actor or none>`.
//!
//! With `$SIDECAR_ADDR` set, each counted request also asks a sidecar counter at that address for
//! its memory count, over one kept-alive connection (see `sidecar.rs`).
//!
//! Listens on `$BIND_ADDR` (default 0.0.0.0) ports `$PORT` (default 80) and `$PORT2` (default 8080,
//! `off` disables it), both with the same handler.

mod call;
mod dial;
#[path = "../../common/http.rs"]
mod http;
mod sandbox;
mod sidecar;
mod spin;
mod ws;

use http::{Request, Response};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

struct Counters {
    memory: u64,
    /// Alarm deliveries received (`POST /on-alarm`), in memory like `memory`.
    alarms: u64,
    sidecar: Option<sidecar::Sidecar>,
    volume_file: PathBuf,
    rootfs_file: PathBuf,
}

fn env_path(name: &str, default: &str) -> PathBuf {
    match std::env::var_os(name) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(default),
    }
}

/// The number stored in `path`; 0 when the file is missing or does not hold a number.
fn read_count(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Write `value` to `path` durably: temp file, fsync, rename, fsync the directory.
fn write_count(path: &Path, value: u64) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(format!("{value}\n").as_bytes())?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

impl Counters {
    fn increment(&mut self) -> io::Result<(u64, u64, u64)> {
        let file = read_count(&self.volume_file) + 1;
        let rootfs = read_count(&self.rootfs_file) + 1;
        write_count(&self.volume_file, file)?;
        write_count(&self.rootfs_file, rootfs)?;
        self.memory += 1;
        Ok((self.memory, file, rootfs))
    }
}

fn read_identity(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn handle(counters: &Mutex<Counters>, platform: &call::Platform, req: &Request) -> Response {
    match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        "/call" => platform.handle(&req.query),
        "/spin" => spin::handle(&req.query),
        "/dials" => DIALS.get_or_init(dial::Dials::default).report(&req.query),
        "/caller" => Response::text(
            200,
            format!(
                "caller: {}",
                req.header("ate-caller-actor").unwrap_or("none")
            ),
        ),
        "/whoami" => {
            let name = read_identity("/etc/ate/actor-name");
            let atespace = read_identity("/etc/ate/atespace");
            let uid = read_identity("/etc/ate/uid");
            Response::text(200, format!("{atespace}/{name} {uid}"))
        }
        "/ws" => match req.header("sec-websocket-key") {
            Some(key)
                if req
                    .header("upgrade")
                    .is_some_and(|u| u.eq_ignore_ascii_case("websocket")) =>
            {
                let mut resp = Response::text(
                    101,
                    format!(
                        "Upgrade: websocket\r\nSec-WebSocket-Accept: {}\r\n",
                        ws::accept_key(key)
                    ),
                );
                resp.upgrade = Some(ws::echo);
                resp
            }
            _ => Response::text(426, "WebSocket upgrade required\n"),
        },
        "/echo" => {
            if req.method == "POST" || req.method == "PUT" {
                let ct = if req
                    .header("content-type")
                    .is_some_and(|c| c.starts_with("text/"))
                {
                    "text/plain; charset=utf-8"
                } else {
                    "application/octet-stream"
                };
                Response::bytes(200, ct, req.body.clone())
            } else {
                Response::text(405, "use POST\n")
            }
        }
        "/connect" => connect(&req.query),
        "/exit" => exit_later(&req.method, &req.query),
        "/sidecar-exit" if req.method == "POST" => {
            let mut c = counters.lock().unwrap_or_else(|p| p.into_inner());
            match c.sidecar.as_mut().map(|s| s.exit(&req.query)) {
                Some(Ok(body)) => Response::text(200, format!("sidecar: {body}")),
                Some(Err(e)) => Response::text(502, format!("sidecar: {e}\n")),
                None => Response::text(404, "no SIDECAR_ADDR\n"),
            }
        }
        "/sandbox" => Response::text(200, sandbox::report()),
        // `POST /alarm?in=SECONDS`: sets this actor's alarm to POST /on-alarm then.
        "/alarm" if req.method == "POST" => {
            let secs = req
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("in="))
                .and_then(|v| v.parse::<u64>().ok());
            match secs {
                Some(s) => platform.local_post(
                    "/v1/alarm",
                    format!("{{\"in\": \"{s}s\", \"path\": \"/on-alarm\"}}").as_bytes(),
                ),
                None => Response::text(400, "use POST /alarm?in=SECONDS\n"),
            }
        }
        "/on-alarm" if req.method == "POST" => {
            let mut c = counters.lock().unwrap_or_else(|p| p.into_inner());
            c.alarms += 1;
            http::log(&format!(
                "alarm delivered {} (attempt {})",
                c.alarms,
                req.header("ate-alarm-attempt").unwrap_or("?")
            ));
            let n = c.alarms;
            drop(c);
            // `?suspend=1`: done with this turn, free the slot now (`ate bench alarms`).
            if req.query.split('&').any(|kv| kv == "suspend=1") {
                platform.local_post("/v1/suspend", b"");
            }
            Response::text(200, format!("alarm {n}\n"))
        }
        "/alarms" => {
            let c = counters.lock().unwrap_or_else(|p| p.into_inner());
            Response::text(200, format!("alarms delivered: {}\n", c.alarms))
        }
        _ => {
            let mut c = counters.lock().unwrap_or_else(|p| p.into_inner());
            match c.increment() {
                Ok((m, f, r)) => {
                    // One line per counted request, so `ate logs` shows output across suspends.
                    http::log(&format!("counted request {m}"));
                    let side = c.sidecar.as_mut().map(|s| s.report()).unwrap_or_default();
                    Response::text(
                        200,
                        format!(
                            "preserved memory count: {m} | preserved file counter: {f} | preserved rootfs counter: {r}{side}"
                        ),
                    )
                }
                Err(e) => {
                    Response::text(500, format!("counter: cannot write counter files: {e}\n"))
                }
            }
        }
    }
}

/// How long `/connect` waits for the connect, then for the connection to prove it stays open.
/// `POST /exit?code=N`: answers, then the whole process exits with code N (0–255) 100 ms later
/// (tests of exit detection and exit codes).
fn exit_later(method: &str, query: &str) -> Response {
    if method != "POST" {
        return Response::text(405, "use POST /exit?code=N\n");
    }
    let code = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("code="))
        .and_then(|c| c.parse::<u8>().ok());
    let Some(code) = code else {
        return Response::text(400, "use POST /exit?code=N (0-255)\n");
    };
    let spawned = std::thread::Builder::new().spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        http::log(&format!("exiting with code {code} as asked"));
        std::process::exit(i32::from(code));
    });
    match spawned {
        Ok(_) => Response::text(200, format!("exiting with code {code}\n")),
        Err(e) => Response::text(500, format!("cannot exit later: {e}\n")),
    }
}

const CONNECT_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// `/connect?addr=IP:PORT[&hold=SECONDS]`: 200 `ok` when a TCP connect succeeds within 1 s and
/// the connection is not closed or reset by the peer within the next second, else 502 with the
/// error (400 for a missing or malformed address). With `hold`, a reached connection is kept
/// open that long (at most 600 s) by a background thread after the answer.
fn connect(query: &str) -> Response {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    let addr = param("addr").and_then(|a| a.parse::<std::net::SocketAddr>().ok());
    let Some(addr) = addr else {
        return Response::text(400, "use /connect?addr=IP:PORT[&hold=SECONDS]\n");
    };
    let hold = param("hold")
        .and_then(|h| h.parse::<u64>().ok())
        .map(|h| std::time::Duration::from_secs(h.min(600)));
    let stream = match std::net::TcpStream::connect_timeout(&addr, CONNECT_WINDOW) {
        Ok(s) => s,
        Err(e) => return Response::text(502, format!("connect {addr}: {e}")),
    };
    // Outbound TCP goes through the worker's egress proxy, which accepts every connect and then
    // resets one it denies (or cannot dial) at once: a connection closed or reset within the
    // window counts as refused. One that stays open (or sends data) counts as reached.
    let _ = stream.set_read_timeout(Some(CONNECT_WINDOW));
    let mut byte = [0u8; 1];
    let reached = match stream.peek(&mut byte) {
        Ok(0) => Err("connection closed by peer right after connect".to_string()),
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    };
    match reached {
        Ok(()) => {
            if let Some(hold) = hold {
                std::thread::spawn(move || {
                    std::thread::sleep(hold);
                    drop(stream);
                });
            }
            Response::text(200, "ok")
        }
        Err(e) => Response::text(502, format!("connect {addr}: {e}")),
    }
}

/// The outbound dials of `$DIAL_ADDR`, started first thing in `main`.
static DIALS: std::sync::OnceLock<dial::Dials> = std::sync::OnceLock::new();

fn main() {
    DIALS.get_or_init(dial::Dials::from_env);
    http::exit_on_sigterm();
    let data_dir = env_path("ATE_DATA_DIR", "/data");
    let counters = Counters {
        alarms: 0,
        memory: 0,
        sidecar: sidecar::Sidecar::from_env(),
        volume_file: data_dir.join("counter"),
        rootfs_file: env_path("COUNTER_ROOTFS_FILE", "/var/lib/counter/count"),
    };
    let counters = Arc::new(Mutex::new(counters));
    let platform = Arc::new(call::Platform::from_env());
    let handler: Arc<http::Handler> = {
        let counters = counters.clone();
        Arc::new(move |req: &Request| handle(&counters, &platform, req))
    };

    let port = http::env_port("PORT", 80).unwrap_or(80);
    let main_addr = http::bind_addr(port);
    let main_listener = http::bind(main_addr);
    let mut listening = vec![main_addr.to_string()];
    if let Some(port2) = http::env_port("PORT2", 8080).filter(|p| *p != port) {
        let addr = http::bind_addr(port2);
        let l = http::bind(addr);
        listening.push(addr.to_string());
        http::serve_in_background(l, handler.clone());
    }
    http::log(&format!("counter listening on {}", listening.join(", ")));
    http::serve(main_listener, handler);
}
