//! Who may use the ingress (`--ingress-auth-mode`).
//!
//! - `none`: no client authentication (`ate up`'s quickstart on loopback).
//! - `mtls`: the TLS listener (`--tls-listen`) requires a client certificate that chains to the
//!   CA and whose SPIFFE ID (URI SAN) is on `--ingress-allowed-spiffe-ids`; anything else is
//!   refused in the handshake, before any HTTP exists (the spec's Envoy router). Requests that
//!   reach the plain `--listen` listener carry no certificate and get 401.
//! - `jwt`: every request carries a bearer token, verified like the api's `--auth-mode=jwt`
//!   (the shared `ate-jwt` verifier: JWKS file, issuer, audience, expiry). A missing or bad
//!   token gets 401 with `WWW-Authenticate: Bearer` naming the problem; a token whose
//!   `ate_atespaces` does not include the actor's atespace, or whose role is not `client` or
//!   `admin`, gets 403. With `--ingress-allowed-spiffe-ids` also set, a TLS client whose
//!   certificate is on the list needs no token (a certificate not on the list is still refused
//!   in the handshake).
//!
//! The token is read from `Proxy-Authorization: Bearer …` if present, else from
//! `Authorization: Bearer …`, and the header it came from is removed before the request is
//! forwarded: actor code must never see a credential it could replay against other actors. An
//! actor that wants its own `Authorization` header gets it untouched when clients send the
//! ingress token in `Proxy-Authorization`.

use ate_jwt::{JwtVerifier, TokenClaims, TokenRole};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::body::RouterBody;
use crate::proxy::text;

/// `--ingress-auth-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IngressAuthMode {
    /// No client authentication.
    None,
    /// TLS client certificates whose SPIFFE ID is on `--ingress-allowed-spiffe-ids`.
    Mtls,
    /// Bearer tokens (JWT) verified against `--ingress-jwt-jwks-file`.
    Jwt,
}

impl IngressAuthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            IngressAuthMode::None => "none",
            IngressAuthMode::Mtls => "mtls",
            IngressAuthMode::Jwt => "jwt",
        }
    }
}

/// What a client connection proved before its first request; set by the listener on every
/// request as an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnAuth {
    /// The plain `--listen` listener: no TLS, no certificate.
    Plain,
    /// The TLS listener; `allowed_cert`: the client presented a certificate the handshake
    /// verified against the allow-list.
    Tls { allowed_cert: bool },
    /// An internal listener (`--internal-socket`, `--internal-listen`): a worker sending its
    /// actors' calls. The ingress policy does not apply; each request must name its caller
    /// instead ([`crate::callers`]). `IngressAuth::check` refuses it (the proxy never asks).
    Worker,
}

/// The ingress policy of one router.
#[derive(Debug)]
pub struct IngressAuth {
    mode: IngressAuthMode,
    jwt: Option<JwtVerifier>,
    /// Certificates on the allow-list also pass in jwt mode.
    certs_allowed: bool,
}

/// A refused request: its status, body and (for 401) challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// The `error` of the `WWW-Authenticate: Bearer` challenge (RFC 6750), jwt mode only.
    pub bearer_error: Option<&'static str>,
}

impl Refusal {
    fn unauthorized(message: String, bearer_error: Option<&'static str>) -> Self {
        Refusal {
            status: StatusCode::UNAUTHORIZED,
            message,
            bearer_error,
        }
    }

    fn forbidden(message: String) -> Self {
        Refusal {
            status: StatusCode::FORBIDDEN,
            message,
            bearer_error: None,
        }
    }

    /// The response: one line of text naming the problem; 401s in jwt mode carry
    /// `WWW-Authenticate: Bearer realm="ate-router"[, error="…"]`.
    pub fn response(&self, jwt_mode: bool) -> Response<RouterBody> {
        let mut response = text(self.status, self.message.clone());
        if self.status == StatusCode::UNAUTHORIZED {
            let challenge = if jwt_mode {
                match self.bearer_error {
                    Some(error) => format!("Bearer realm=\"ate-router\", error=\"{error}\""),
                    None => "Bearer realm=\"ate-router\"".to_string(),
                }
            } else {
                // mtls mode: there is no HTTP challenge that helps; the client must use TLS.
                String::new()
            };
            if let Ok(value) = HeaderValue::from_str(&challenge)
                && !challenge.is_empty()
            {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, value);
            }
        }
        response
    }
}

impl IngressAuth {
    /// No client authentication.
    pub fn none() -> Self {
        IngressAuth {
            mode: IngressAuthMode::None,
            jwt: None,
            certs_allowed: false,
        }
    }

    /// Client certificates on the allow-list (checked in the handshake).
    pub fn mtls() -> Self {
        IngressAuth {
            mode: IngressAuthMode::Mtls,
            jwt: None,
            certs_allowed: true,
        }
    }

    /// Bearer tokens; with `certs_allowed`, TLS clients whose certificate is on the allow-list
    /// need none.
    pub fn jwt(verifier: JwtVerifier, certs_allowed: bool) -> Self {
        IngressAuth {
            mode: IngressAuthMode::Jwt,
            jwt: Some(verifier),
            certs_allowed,
        }
    }

    pub fn mode(&self) -> IngressAuthMode {
        self.mode
    }

    /// Admits or refuses one request. `atespace`: the atespace of the actor the request names,
    /// when its `ate-target-actor` is valid (a token limited to other atespaces is refused).
    /// In jwt mode the header the token came from is removed from `headers`.
    pub fn check(
        &self,
        headers: &mut HeaderMap,
        conn: ConnAuth,
        atespace: Option<&str>,
    ) -> Result<Option<TokenClaims>, Refusal> {
        match self.mode {
            IngressAuthMode::None => Ok(None),
            IngressAuthMode::Mtls => match conn {
                ConnAuth::Tls { allowed_cert: true } => Ok(None),
                // The TLS listener refuses such clients in the handshake; this is the plain
                // listener (or a TLS connection that somehow had no certificate).
                _ => Err(Refusal::unauthorized(
                    "client certificate required: this router admits only TLS clients whose SPIFFE ID is on --ingress-allowed-spiffe-ids".to_string(),
                    None,
                )),
            },
            IngressAuthMode::Jwt => {
                let token = take_bearer(headers);
                if self.certs_allowed && conn == (ConnAuth::Tls { allowed_cert: true }) {
                    return Ok(None);
                }
                let Some(verifier) = &self.jwt else {
                    return Err(Refusal::unauthorized(
                        "bearer token verification is not configured".to_string(),
                        None,
                    ));
                };
                let token = match token {
                    Ok(Some(token)) => token,
                    Ok(None) => {
                        return Err(Refusal::unauthorized(
                            "missing bearer token: send Authorization: Bearer <jwt>".to_string(),
                            None,
                        ));
                    }
                    Err(reason) => {
                        return Err(Refusal::unauthorized(reason, Some("invalid_request")));
                    }
                };
                let claims = verifier
                    .verify(&token)
                    .map_err(|e| Refusal::unauthorized(e.to_string(), Some("invalid_token")))?;
                authorize(&claims, atespace)?;
                Ok(Some(claims))
            }
        }
    }
}

/// Roles and atespaces a verified token may reach.
fn authorize(claims: &TokenClaims, atespace: Option<&str>) -> Result<(), Refusal> {
    match claims.role {
        TokenRole::Client | TokenRole::Admin => {}
        TokenRole::IngressRouter | TokenRole::NodeAgent => {
            return Err(Refusal::forbidden(format!(
                "bearer token of {:?} has role {}, which may not call actors (client or admin)",
                claims.subject,
                role_name(&claims.role)
            )));
        }
    }
    if claims.role == TokenRole::Admin {
        return Ok(());
    }
    if let (Some(allowed), Some(atespace)) = (&claims.atespaces, atespace)
        && !allowed.iter().any(|a| a == atespace)
    {
        return Err(Refusal::forbidden(format!(
            "bearer token of {:?} does not grant atespace {atespace} (ate_atespaces)",
            claims.subject
        )));
    }
    Ok(())
}

fn role_name(role: &TokenRole) -> &'static str {
    match role {
        TokenRole::Admin => "admin",
        TokenRole::Client => "client",
        TokenRole::IngressRouter => "ingress_router",
        TokenRole::NodeAgent => "node_agent",
    }
}

/// The bearer token of a request, taken out of `Proxy-Authorization` (first) or
/// `Authorization`. `Ok(None)`: neither header carries a bearer token (a non-bearer
/// `Authorization` is left for the actor). `Err`: a bearer header that cannot be used.
fn take_bearer(headers: &mut HeaderMap) -> Result<Option<String>, String> {
    for name in [header::PROXY_AUTHORIZATION, header::AUTHORIZATION] {
        match bearer_of(headers, &name) {
            Ok(None) => continue,
            Ok(Some(token)) => {
                headers.remove(&name);
                return Ok(Some(token));
            }
            Err(e) => {
                headers.remove(&name);
                return Err(e);
            }
        }
    }
    Ok(None)
}

fn bearer_of(headers: &HeaderMap, name: &HeaderName) -> Result<Option<String>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let Ok(text) = value.to_str() else {
        return Err(format!("malformed {name} header"));
    };
    let Some((scheme, token)) = text.trim().split_once(' ') else {
        return if text.trim().eq_ignore_ascii_case("bearer") {
            Err(format!("empty bearer token in {name}"))
        } else {
            Ok(None)
        };
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Ok(None);
    }
    if values.next().is_some() {
        return Err(format!("more than one {name} header"));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(format!("empty bearer token in {name}"));
    }
    Ok(Some(token.to_string()))
}

impl IngressAuth {
    /// The policy in words, for the startup log line.
    pub fn describe(&self) -> &'static str {
        match self.mode {
            IngressAuthMode::None => "no client authentication",
            IngressAuthMode::Mtls => {
                "client certificates on --ingress-allowed-spiffe-ids (checked in the TLS handshake)"
            }
            IngressAuthMode::Jwt if self.certs_allowed => {
                "bearer tokens, or client certificates on --ingress-allowed-spiffe-ids"
            }
            IngressAuthMode::Jwt => "bearer tokens (JWT)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn bearer_from_proxy_authorization_first_and_removed() {
        let mut h = headers(&[
            ("proxy-authorization", "Bearer abc"),
            ("authorization", "Basic dXNlcjpwdw=="),
        ]);
        assert_eq!(take_bearer(&mut h), Ok(Some("abc".to_string())));
        assert!(h.get("proxy-authorization").is_none());
        // The actor's own credentials pass through.
        assert_eq!(h.get("authorization").unwrap(), "Basic dXNlcjpwdw==");

        let mut h = headers(&[("authorization", "bearer  xyz ")]);
        assert_eq!(take_bearer(&mut h), Ok(Some("xyz".to_string())));
        assert!(h.get("authorization").is_none());

        let mut h = headers(&[("authorization", "Basic dXNlcjpwdw==")]);
        assert_eq!(take_bearer(&mut h), Ok(None));
        assert!(h.get("authorization").is_some());

        let mut h = headers(&[("authorization", "Bearer")]);
        assert!(
            take_bearer(&mut h)
                .unwrap_err()
                .contains("empty bearer token")
        );
        let mut h = headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert!(take_bearer(&mut h).unwrap_err().contains("more than one"));
    }

    #[test]
    fn mtls_mode_refuses_plain_connections() {
        let auth = IngressAuth::mtls();
        let mut h = HeaderMap::new();
        assert_eq!(
            auth.check(&mut h, ConnAuth::Tls { allowed_cert: true }, None),
            Ok(None)
        );
        let refused = auth.check(&mut h, ConnAuth::Plain, None).unwrap_err();
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert!(refused.message.contains("--ingress-allowed-spiffe-ids"));
        assert_eq!(
            IngressAuth::none().check(&mut h, ConnAuth::Plain, None),
            Ok(None)
        );
    }

    fn claims(role: TokenRole, atespaces: Option<Vec<String>>) -> TokenClaims {
        TokenClaims {
            issuer: "i".into(),
            subject: "alice".into(),
            role,
            atespaces,
            node: None,
        }
    }

    #[test]
    fn token_scope() {
        let team_a = Some(vec!["team-a".to_string()]);
        assert!(authorize(&claims(TokenRole::Client, team_a.clone()), Some("team-a")).is_ok());
        let refused =
            authorize(&claims(TokenRole::Client, team_a.clone()), Some("team-b")).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(refused.message.contains("team-b"), "{}", refused.message);
        assert!(authorize(&claims(TokenRole::Client, None), Some("team-b")).is_ok());
        assert!(authorize(&claims(TokenRole::Admin, Some(vec![])), Some("team-b")).is_ok());
        let refused = authorize(&claims(TokenRole::NodeAgent, None), Some("x")).unwrap_err();
        assert!(refused.message.contains("node_agent"));
    }
}
