//! The warm bench's paths (sides): connecting to each, the load on it, and the in-process
//! baseline server.

use super::*;

/// A counter-like server in this process (the direct baseline; HTTP/1.1 and h2c): `/healthz` →
/// `ok`, anything else counts in memory.
pub(super) async fn baseline_server() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let count = count.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let body = if req.uri().path() == "/healthz" {
                            "ok".to_string()
                        } else {
                            let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                            format!(
                                "preserved memory count: {n} | preserved file counter: {n} | preserved rootfs counter: {n}"
                            )
                        };
                        async move {
                            hyper::Response::builder()
                                .header("content-type", "text/plain; charset=utf-8")
                                .body(Full::new(Bytes::from(body)))
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// What a side is, for the comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Direct,
    Router,
    RouterTls,
    Nginx,
    NginxTls,
    Other,
}

/// One path measured by the warm bench: where to connect, and how.
#[derive(Clone)]
pub(super) struct Side {
    pub(super) name: String,
    pub(super) role: Role,
    /// The URL as given (h2load's target, with the bench's path).
    pub(super) url: String,
    pub(super) addr: SocketAddr,
    /// `Host` of every request (the URL's authority).
    pub(super) host: String,
    /// The `ate-target-actor` header (none for the baselines).
    pub(super) actor: Option<String>,
    /// TLS (server checked by hostname against `ate up`'s CA).
    pub(super) tls: Option<(ate_tls::tokio_rustls::TlsConnector, ServerName<'static>)>,
}

impl Side {
    pub(super) fn new(
        name: &str,
        role: Role,
        url: &str,
        actor: Option<String>,
        tls: Option<&Arc<ate_tls::rustls::ClientConfig>>,
    ) -> anyhow::Result<Side> {
        let uri: hyper::Uri = url.parse().with_context(|| format!("URL {url:?}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .with_context(|| format!("URL {url:?} has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let ip: std::net::IpAddr = match host.parse() {
            Ok(ip) => ip,
            Err(_) if host == "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
            Err(_) => anyhow::bail!("URL {url:?}: the bench needs an IP address or localhost"),
        };
        let tls = match (https, tls) {
            (false, _) => None,
            (true, None) => anyhow::bail!("{url}: https needs the CA (--tls-ca)"),
            (true, Some(config)) => {
                let name = ServerName::try_from(host.clone())
                    .with_context(|| format!("URL {url:?}: server name"))?;
                Some((
                    ate_tls::tokio_rustls::TlsConnector::from(config.clone()),
                    name,
                ))
            }
        };
        let authority = uri
            .authority()
            .map_or_else(|| host.clone(), |a| a.as_str().to_string());
        Ok(Side {
            name: name.to_string(),
            role,
            url: format!("{}://{authority}", if https { "https" } else { "http" }),
            addr: SocketAddr::new(ip, port),
            host: authority,
            actor,
            tls,
        })
    }

    /// A keep-alive HTTP/1.1 connection (TCP, or TLS over TCP).
    pub(super) async fn connect(
        &self,
    ) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let sender = match &self.tls {
            None => {
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
                tokio::spawn(conn);
                sender
            }
            Some((connector, name)) => {
                let tls = connector.connect(name.clone(), tcp).await?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
                tokio::spawn(conn);
                sender
            }
        };
        Ok(sender)
    }

    /// One GET on `sender`; true for a 200 with its body read.
    pub(super) async fn get(
        &self,
        sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
        path: &str,
    ) -> anyhow::Result<bool> {
        let mut req = hyper::Request::get(path).header(hyper::header::HOST, &self.host);
        if let Some(actor) = &self.actor {
            req = req.header(ate_core::TARGET_ACTOR_HEADER, actor);
        }
        sender.ready().await?;
        let resp = sender.send_request(req.body(Empty::new())?).await?;
        let ok = resp.status() == hyper::StatusCode::OK;
        resp.into_body().collect().await?;
        Ok(ok)
    }
}

/// One measurement of one side.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    pub(super) requests: usize,
    pub(super) errors: usize,
    pub(super) rps: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
}

impl Load {
    /// From the latencies of the answered requests (ms, any order).
    pub fn from_latencies(latencies: Vec<f64>, errors: usize, rps: f64) -> Load {
        let lat = sorted(latencies);
        Load {
            requests: lat.len(),
            errors,
            rps,
            p50_ms: pct(&lat, 0.5),
            p99_ms: pct(&lat, 0.99),
            max_ms: lat.last().copied().unwrap_or(0.0),
        }
    }

    pub(super) fn json(&self) -> serde_json::Value {
        json!({"requests": self.requests, "errors": self.errors, "rps": self.rps,
               "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms})
    }
}

/// The builtin generator: `conc` keep-alive connections, one request in flight each: one second
/// of warm-up (connections open, caches fill), then `secs` measured.
pub(super) async fn load(side: &Side, path: &str, conc: usize, secs: u64) -> Load {
    let started = Instant::now();
    let measure_from = started + Duration::from_secs(1);
    let deadline = measure_from + Duration::from_secs(secs);
    let mut set = JoinSet::new();
    for _ in 0..conc {
        let (side, path) = (side.clone(), path.to_string());
        set.spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), 0usize);
            let mut sender = None;
            while Instant::now() < deadline {
                let s = match sender.as_mut() {
                    Some(s) => s,
                    None => match side.connect().await {
                        Ok(s) => sender.insert(s),
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                let t = Instant::now();
                let ok = side.get(s, &path).await;
                if t < measure_from {
                    continue;
                }
                match ok {
                    Ok(true) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
                    Ok(false) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        sender = None;
                    }
                }
            }
            (lat, errors)
        });
    }
    let results = set.join_all().await;
    let elapsed = measure_from.elapsed().as_secs_f64();
    let errors = results.iter().map(|(_, e)| e).sum();
    let lat: Vec<f64> = results.into_iter().flat_map(|(l, _)| l).collect();
    let rps = lat.len() as f64 / elapsed;
    Load::from_latencies(lat, errors, rps)
}

/// Medians over the rounds of one side (the max is the largest of any round).
pub(super) fn medians(rounds: &[Load]) -> Load {
    let m = |f: fn(&Load) -> f64| median(&sorted(rounds.iter().map(f).collect()));
    Load {
        requests: rounds.iter().map(|l| l.requests).sum(),
        errors: rounds.iter().map(|l| l.errors).sum(),
        rps: m(|l| l.rps),
        p50_ms: m(|l| l.p50_ms),
        p99_ms: m(|l| l.p99_ms),
        max_ms: rounds.iter().map(|l| l.max_ms).fold(0.0, f64::max),
    }
}
