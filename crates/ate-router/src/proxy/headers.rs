//! Request and response heads: hop-by-hop headers, a request's shape for the tunnel, request ids.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::ext::Protocol;

use super::upgrade::{SEC_WEBSOCKET_KEY, websocket_key};
use super::{REQUEST_ID, RESUME};
use crate::body::RouterBody;
use crate::resolve::ResumeKind;

/// Headers that describe one hop and never cross the router (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// How a request crosses the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Http1,
    Upgrade,
    /// RFC 8441 extended CONNECT with `:protocol = websocket` (checked by the caller).
    H2WebSocket,
    Grpc,
}

impl Mode {
    pub(super) fn of(request: &Request<Incoming>) -> Mode {
        if request.method() == Method::CONNECT && request.extensions().get::<Protocol>().is_some() {
            return Mode::H2WebSocket;
        }
        if request.version() == Version::HTTP_2 {
            let grpc = request
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
            return if grpc { Mode::Grpc } else { Mode::Http1 };
        }
        if request.headers().contains_key(header::UPGRADE)
            && has_token(request.headers(), header::CONNECTION, "upgrade")
        {
            return Mode::Upgrade;
        }
        Mode::Http1
    }
}

/// Replaces every header value and the target by copies in one allocation of their own (see
/// [`Proxy::unshare_head_if_cold`]); a value or target that does not parse again stays as it was.
///
/// [`Proxy::unshare_head_if_cold`]: super::Proxy::unshare_head_if_cold
pub(super) fn unshare_head<B>(request: &mut Request<B>) {
    use std::fmt::Write as _;
    let values: usize = request.headers().values().map(HeaderValue::len).sum();
    // The target as it was sent: `/path?query`, `scheme://authority/path` or `host:port`.
    let mut copy = bytes::BytesMut::with_capacity(uri_len(request.uri()) + 16 + values);
    let _ = write!(copy, "{}", request.uri());
    let target = copy.len();
    for value in request.headers().values() {
        copy.extend_from_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    if let Ok(uri) = Uri::from_maybe_shared(copy.slice(..target)) {
        *request.uri_mut() = uri;
    }
    let mut at = target;
    for value in request.headers_mut().values_mut() {
        let end = at + value.len();
        if let Ok(mut owned) = HeaderValue::from_maybe_shared(copy.slice(at..end)) {
            owned.set_sensitive(value.is_sensitive());
            *value = owned;
        }
        at = end;
    }
}

/// Removes every `name` header: the first value, and how many there were (no allocation).
pub(super) fn take_header(headers: &mut HeaderMap, name: &str) -> (Option<HeaderValue>, usize) {
    let count = headers.get_all(name).iter().take(2).count();
    (headers.remove(name), count)
}

/// The id of a request: the client's `x-request-id` when there is exactly one and it is
/// acceptable (1-128 printable ASCII characters, no space: `ate_core::request_id::is_valid`),
/// as the router's own copy (`true`: the request already carries it); else a new random 128-bit
/// id in hex (`false`: the caller puts it on the request, replacing the client's). One small
/// allocation either way; a copy of the client's value rather than a slice of it, which would
/// keep hyper's read buffer shared (and make hyper allocate a new one) until the response.
pub(super) fn request_id(headers: &HeaderMap) -> (HeaderValue, bool) {
    let mut sent = headers.get_all(&REQUEST_ID).iter();
    if let (Some(value), None) = (sent.next(), sent.next())
        && ate_core::request_id::is_valid(value.as_bytes())
        && let Ok(own) =
            HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(value.as_bytes()))
    {
        return (own, true);
    }
    let id = ate_core::request_id::hex_id(rand::random());
    // One allocation, shared by the request and the response (clones are reference counts).
    let id = HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(id))
        .unwrap_or_else(|_| HeaderValue::from_static("0"));
    (id, false)
}

/// The request id a request carries (set before it is forwarded); empty if none.
pub(super) fn id_of<B>(request: &Request<B>) -> &str {
    request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

pub(super) fn uri_len(uri: &Uri) -> usize {
    uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len())
}

/// Does a comma-separated header contain `token` (case-insensitive)?
fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let mut named: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        if let Ok(value) = value.to_str() {
            for token in value.split(',') {
                let token = token.trim();
                if token.eq_ignore_ascii_case("keep-alive")
                    || token.eq_ignore_ascii_case("close")
                    || token.eq_ignore_ascii_case("upgrade")
                {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    named.push(name);
                }
            }
        }
    }
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        if keep_upgrade && (name == header::UPGRADE || name == header::CONNECTION) {
            continue;
        }
        headers.remove(name);
    }
}

/// Shapes the request for the tunnel. Host and `:authority` are never rewritten: an HTTP/2
/// client's `:authority` becomes the HTTP/1.1 `Host` the actor sees, as any h2→h1 proxy does.
pub(super) fn prepare_request(request: &mut Request<Incoming>, mode: Mode) {
    match mode {
        Mode::Grpc => {
            let keep_te = request
                .headers()
                .get(header::TE)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
            strip_hop_by_hop(request.headers_mut(), false);
            if keep_te {
                request
                    .headers_mut()
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
        }
        Mode::Http1 | Mode::Upgrade | Mode::H2WebSocket => {
            let upgrade = mode == Mode::Upgrade;
            strip_hop_by_hop(request.headers_mut(), upgrade);
            if upgrade {
                request
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            }
            if mode == Mode::H2WebSocket {
                // RFC 8441 §5: the extended CONNECT becomes the RFC 6455 opening handshake.
                *request.method_mut() = Method::GET;
                request.extensions_mut().remove::<Protocol>();
                let headers = request.headers_mut();
                headers.remove(header::CONTENT_LENGTH);
                headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                headers.insert(SEC_WEBSOCKET_KEY, websocket_key());
            }
            if !request.headers().contains_key(header::HOST)
                && let Some(authority) = request.uri().authority()
                && let Ok(host) = HeaderValue::from_str(authority.as_str())
            {
                request.headers_mut().insert(header::HOST, host);
            }
            // HTTP/1.1 to the actor takes the origin form; Host carries the authority.
            if request.uri().scheme().is_some() || request.uri().authority().is_some() {
                let origin = request
                    .uri()
                    .path_and_query()
                    .cloned()
                    .map(Uri::from)
                    .unwrap_or_else(|| Uri::from_static("/"));
                *request.uri_mut() = origin;
            }
            *request.version_mut() = Version::HTTP_11;
        }
    }
}

pub(super) fn finish_response(
    mut response: Response<RouterBody>,
    kind: ResumeKind,
) -> Response<RouterBody> {
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    strip_hop_by_hop(response.headers_mut(), switching);
    if switching {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    response
        .headers_mut()
        .insert(RESUME, HeaderValue::from_static(kind.header_value()));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("app.example"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[header::HOST], "app.example");
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn unshared_heads_keep_every_value_and_target() {
        // As hyper parses a head: every value a slice of one buffer.
        let head = Bytes::from_static(b"v1v2secret/x?y=1");
        for target in [
            "/a/b?c=d",
            "http://app.example:8080/p?q",
            "agent.team:7000",
            "*",
            "/",
        ] {
            let mut request = Request::builder().uri(target).body(()).unwrap();
            let headers = request.headers_mut();
            headers.append(
                "x-a",
                HeaderValue::from_maybe_shared(head.slice(0..2)).unwrap(),
            );
            headers.append(
                "x-a",
                HeaderValue::from_maybe_shared(head.slice(2..4)).unwrap(),
            );
            let mut secret = HeaderValue::from_maybe_shared(head.slice(4..10)).unwrap();
            secret.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, secret);
            let before = request.uri().clone();
            unshare_head(&mut request);
            assert_eq!(request.uri(), &before, "{target}");
            assert_eq!(request.uri().to_string(), before.to_string(), "{target}");
            let a: Vec<_> = request.headers().get_all("x-a").iter().collect();
            assert_eq!(a, ["v1", "v2"]);
            let auth = &request.headers()[header::AUTHORIZATION];
            assert_eq!(auth, "secret");
            assert!(auth.is_sensitive());
            // No value points into the old buffer any more.
            let old = head.as_ptr_range();
            for value in request.headers().values() {
                assert!(!old.contains(&value.as_bytes().as_ptr()));
            }
        }
    }

    #[test]
    fn upgrade_keeps_upgrade_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(has_token(&h, header::CONNECTION, "upgrade"));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::UPGRADE], "websocket");
    }
}
