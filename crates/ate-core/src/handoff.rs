//! The same-machine tunnel handoff (docs/tunnel-protocol.md, "Handoff"): when the router runs
//! on the worker's machine, it asks atunnel over a unix socket for a tunnel and gets the
//! connected socket itself (SCM_RIGHTS) instead of a byte pipe through atunnel, so a request
//! crosses one proxy instead of two. atunnel makes exactly the checks of a CONNECT (lease, actor
//! active here, fencing token, ingress on) and dials the actor the same way.
//!
//! This module is the wire format only (no I/O), shared by both ends:
//! - request, one line: `HANDOFF <atespace>/<name> <port> <activation|-> <request id|->\n`;
//! - reply, one line: `200 ok\n` (with the socket attached), `421 <why>\n` (stale: the CONNECT's
//!   421), `502 port-closed <why>\n`, or `<400|502> <why>\n`;
//! - afterwards the unix connection stays open for as long as the router uses the socket: its end
//!   tells atunnel the tunnel is gone, and atunnel writes one byte [`RETIRE`] on it when the actor
//!   drains for a suspend (the router closes the socket once no request is in flight on it).

use crate::names::is_label;

/// The longest request or reply line either end accepts (bytes, with the newline).
pub const MAX_LINE: usize = 1024;

/// Sent by atunnel on the handoff's unix connection when the actor drains: close the socket as
/// soon as no request is in flight on it.
pub const RETIRE: u8 = b'R';

/// A handoff request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// `<atespace>/<name>`.
    pub actor: &'a str,
    pub port: u16,
    /// The fencing token the router holds, if any.
    pub activation: Option<u64>,
    /// The request that opens the tunnel (empty: none).
    pub request_id: &'a str,
}

impl Request<'_> {
    pub fn encode(&self) -> String {
        let activation = self
            .activation
            .map_or_else(|| "-".to_string(), |t| t.to_string());
        let id = if self.request_id.is_empty() {
            "-"
        } else {
            self.request_id
        };
        format!("HANDOFF {} {} {activation} {id}\n", self.actor, self.port)
    }

    /// Parses one request line (with or without its newline); the error is the 400's text.
    pub fn parse(line: &str) -> Result<Request<'_>, String> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let mut parts = line.split(' ');
        if parts.next() != Some("HANDOFF") {
            return Err("not a HANDOFF request".into());
        }
        let (Some(actor), Some(port), Some(activation), Some(id), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(
                "want HANDOFF <atespace>/<name> <port> <activation|-> <request id|->".into(),
            );
        };
        let valid = actor
            .split_once('/')
            .is_some_and(|(ns, name)| is_label(ns) && is_label(name));
        if !valid {
            let shown: String = actor.chars().take(140).collect();
            return Err(format!(
                "actor {shown:?} is not <atespace>/<name> with both DNS-1123 labels"
            ));
        }
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("port {port:?} is not a port (1-65535)")),
        };
        let activation = match activation {
            "-" => None,
            t => match t.parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(format!("activation {t:?} is not a positive integer")),
            },
        };
        let request_id = match id {
            "-" => "",
            id if crate::request_id::is_valid(id.as_bytes()) => id,
            _ => return Err("request id is not a valid x-request-id".into()),
        };
        Ok(Request {
            actor,
            port,
            activation,
            request_id,
        })
    }
}

/// atunnel's answer to a handoff request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The socket comes with this reply.
    Ok,
    /// The CONNECT's 421: not active here, another activation, fenced, or draining.
    Stale(String),
    /// The CONNECT's 502 with `x-ate-port-closed`: nothing listens on the port.
    PortClosed(String),
    /// Any other refusal (400 bad request, 502 dial failed).
    Refused(u16, String),
}

impl Reply {
    pub fn encode(&self) -> String {
        // One line each: a reason's newlines would end the reply early.
        let clean = |why: &str| why.trim().replace(['\n', '\r'], " ");
        match self {
            Reply::Ok => "200 ok\n".into(),
            Reply::Stale(why) => format!("421 {}\n", clean(why)),
            Reply::PortClosed(why) => format!("502 port-closed {}\n", clean(why)),
            Reply::Refused(status, why) => format!("{status} {}\n", clean(why)),
        }
    }

    pub fn parse(line: &str) -> Result<Reply, String> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let (status, rest) = line.split_once(' ').unwrap_or((line, ""));
        match status {
            "200" => Ok(Reply::Ok),
            "421" => Ok(Reply::Stale(rest.to_string())),
            "502" => match rest.strip_prefix("port-closed ") {
                Some(why) => Ok(Reply::PortClosed(why.to_string())),
                None => Ok(Reply::Refused(502, rest.to_string())),
            },
            other => match other.parse::<u16>() {
                Ok(code) if (400..600).contains(&code) => {
                    Ok(Reply::Refused(code, rest.to_string()))
                }
                _ => {
                    let shown: String = line.chars().take(80).collect();
                    Err(format!("not a handoff reply: {shown:?}"))
                }
            },
        }
    }
}

/// The unix socket of the atunnel advertised at `address` (`ip:port`) under `dir`, or `None`
/// when the address is not one (it becomes a file name).
pub fn socket_name(address: &str) -> Option<String> {
    let plausible = !address.is_empty()
        && address.len() <= 64
        && address
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b'.' | b':' | b'[' | b']'));
    plausible.then(|| format!("{address}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request {
            actor: "team/agent-1",
            port: 8080,
            activation: Some(42),
            request_id: "0123456789abcdef0123456789abcdef",
        };
        let line = r.encode();
        assert_eq!(
            line,
            "HANDOFF team/agent-1 8080 42 0123456789abcdef0123456789abcdef\n"
        );
        assert_eq!(Request::parse(&line), Ok(r));
        let bare = Request {
            actor: "a/b",
            port: 80,
            activation: None,
            request_id: "",
        };
        assert_eq!(bare.encode(), "HANDOFF a/b 80 - -\n");
        assert_eq!(Request::parse(&bare.encode()), Ok(bare));
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let err = |line: &str| Request::parse(line).unwrap_err();
        assert!(err("GET / HTTP/1.1").contains("not a HANDOFF"));
        assert!(err("HANDOFF a/b 80 -").contains("want HANDOFF"));
        assert!(err("HANDOFF a/b 80 - - extra").contains("want HANDOFF"));
        assert!(err("HANDOFF A/b 80 - -").contains("DNS-1123"));
        assert!(err("HANDOFF ab 80 - -").contains("DNS-1123"));
        assert!(err("HANDOFF a/b 0 - -").contains("not a port"));
        assert!(err("HANDOFF a/b 70000 - -").contains("not a port"));
        assert!(err("HANDOFF a/b 80 0 -").contains("positive integer"));
        assert!(err("HANDOFF a/b 80 x -").contains("positive integer"));
        assert!(err("HANDOFF a/b 80 1 bad\u{1}id").contains("request id"));
    }

    #[test]
    fn replies_round_trip() {
        for reply in [
            Reply::Ok,
            Reply::Stale("actor a/b is not active on this worker".into()),
            Reply::PortClosed("actor a/b: nothing listens on port 81 in the actor".into()),
            Reply::Refused(400, "port \"0\" is not a port".into()),
            Reply::Refused(502, "actor a/b: cannot connect: timed out".into()),
        ] {
            assert_eq!(Reply::parse(&reply.encode()), Ok(reply));
        }
        assert_eq!(
            Reply::Stale("two\nlines".into()).encode(),
            "421 two lines\n"
        );
        assert!(Reply::parse("hello").is_err());
        assert!(Reply::parse("200x ok").is_err());
        assert!(Reply::parse("302 moved").is_err());
    }

    #[test]
    fn socket_names_only_for_addresses() {
        assert_eq!(
            socket_name("127.0.0.2:8443").as_deref(),
            Some("127.0.0.2:8443.sock")
        );
        assert_eq!(
            socket_name("[::1]:8443").as_deref(),
            Some("[::1]:8443.sock")
        );
        assert_eq!(socket_name("../etc:1"), None);
        assert_eq!(socket_name("a/b"), None);
        assert_eq!(socket_name(""), None);
    }
}
