//! `$DIAL_ADDR` (`IP:PORT`): a thread dials it every `$DIAL_EVERY_MS` (default 20) from the
//! process's start on, and `GET /dials[?since=UNIX_MS]` answers
//! `ok N failed M[ first: ERROR]` for the attempts begun at or after `since`. The egress tests
//! use it to show that egress is on before an actor's first instruction, at a cold start and
//! right after a restore (a frozen process's next attempt begins after the resume).

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http::Response;

/// One attempt: when it began (unix ms) and its error, if any.
type Attempt = (u64, Option<String>);

#[derive(Clone, Default)]
pub struct Dials(Arc<Mutex<Vec<Attempt>>>);

const TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts kept (the oldest are dropped): an hour at the default pace.
const KEPT: usize = 200_000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Dials {
    /// Starts the dialing thread when `$DIAL_ADDR` is set.
    pub fn from_env() -> Dials {
        let dials = Dials::default();
        let Some(addr) = std::env::var("DIAL_ADDR")
            .ok()
            .and_then(|a| a.parse::<SocketAddr>().ok())
        else {
            return dials;
        };
        let every = std::env::var("DIAL_EVERY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::from_millis(20), Duration::from_millis);
        let log = dials.0.clone();
        std::thread::spawn(move || {
            loop {
                let began = now_ms();
                let error = TcpStream::connect_timeout(&addr, TIMEOUT)
                    .err()
                    .map(|e| e.to_string());
                if let Ok(mut attempts) = log.lock() {
                    if attempts.len() >= KEPT {
                        attempts.drain(..KEPT / 2);
                    }
                    attempts.push((began, error));
                }
                std::thread::sleep(every);
            }
        });
        dials
    }

    pub fn report(&self, query: &str) -> Response {
        let since = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("since="))
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let Ok(attempts) = self.0.lock() else {
            return Response::text(500, "dial log poisoned");
        };
        let recent = attempts.iter().filter(|(t, _)| *t >= since);
        let (mut ok, mut failed, mut first) = (0u64, 0u64, None);
        for (_, error) in recent {
            match error {
                None => ok += 1,
                Some(e) => {
                    failed += 1;
                    first.get_or_insert(e.clone());
                }
            }
        }
        let first = first.map(|e| format!(" first: {e}")).unwrap_or_default();
        Response::text(200, format!("ok {ok} failed {failed}{first}"))
    }
}
