//! The side-by-side baseline of `ate bench warm --baseline nginx`: Debian's nginx as a plain
//! reverse proxy to the same actor's listener, reached the way atunnel reaches it.
//!
//! atunnel dials `169.254.17.2:<port>` inside the actor's network namespace, which nothing outside
//! that namespace can route to. So nginx runs inside it (`nsenter --net=/var/run/netns/<ns>`),
//! and its listening socket is made here, on the host's loopback, and handed over with nginx's
//! own inheritance mechanism (the `NGINX` variable its binary upgrade uses): clients of both
//! paths connect to 127.0.0.1 in the same namespace, and nginx's upstream connections are the
//! same hop as atunnel's.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How the baseline listens: the protocol the load generator speaks to both paths.
#[derive(Debug, Clone)]
pub enum Listen {
    /// HTTP/1.1 in the clear.
    Http1,
    /// HTTP/2 with prior knowledge in the clear (nginx's `listen … http2` without `ssl`).
    H2c,
    /// TLS with this certificate and key (ALPN h2 and http/1.1).
    Tls { cert: PathBuf, key: PathBuf },
}

/// A running nginx; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    pub addr: SocketAddr,
}

/// The nginx binary: `explicit`, else `nginx` on PATH, else Debian's `/usr/sbin/nginx`.
pub fn binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        anyhow::ensure!(path.is_file(), "--nginx {}: no such file", path.display());
        return Ok(path.to_path_buf());
    }
    crate::find_program("nginx", "/usr/sbin/nginx").ok_or_else(|| {
        anyhow::anyhow!(
            "--baseline nginx: nginx is not installed (Debian: apt-get install nginx-light; \
             scripts/setup.sh installs it) — or name the binary with --nginx"
        )
    })
}

/// The network namespace of `atespace/name` on this machine: `<state>/workers/*/actors/<ns>/<name>`
/// whose namespace (named after that directory, as the worker names it) exists.
pub fn actor_netns(state_dir: &Path, atespace: &str, name: &str) -> anyhow::Result<PathBuf> {
    let workers = state_dir.join("workers");
    let entries = std::fs::read_dir(&workers)
        .with_context(|| format!("cannot list the workers under {}", workers.display()))?;
    for entry in entries.flatten() {
        let dir = entry.path().join("actors").join(atespace).join(name);
        if !dir.is_dir() {
            continue;
        }
        let netns = ate_netns::netns_path(&ate_netns::netns_name(&dir.to_string_lossy()));
        if netns.exists() {
            return Ok(netns);
        }
    }
    anyhow::bail!(
        "no network namespace of {atespace}/{name} under {} (is the actor running on this \
         machine, and is --state-dir the system's?)",
        workers.display()
    )
}

fn config(dir: &Path, addr: SocketAddr, upstream: SocketAddr, listen: &Listen) -> String {
    let (flags, tls) = match listen {
        Listen::Http1 => ("", String::new()),
        Listen::H2c => (" http2", String::new()),
        Listen::Tls { cert, key } => (
            " ssl http2",
            format!(
                "    ssl_certificate {};\n    ssl_certificate_key {};\n",
                cert.display(),
                key.display()
            ),
        ),
    };
    let dir = dir.display();
    // Debian's defaults where they matter (one worker per core, keep-alive to the client), a
    // keep-alive upstream pool (without it every request would dial the actor), the Host header
    // passed through as the router does, and no cap on requests per connection either way (the
    // router has none; nginx's default of 1000 closes a busy connection every 1000 requests).
    format!(
        "daemon off;
worker_processes auto;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  upstream actor {{ server {upstream}; keepalive 256; keepalive_requests 100000000; }}
  server {{
    listen {addr}{flags};
    keepalive_requests 100000000;
{tls}    location / {{
      proxy_pass http://actor;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_set_header Host $http_host;
    }}
  }}
}}
"
    )
}

impl Nginx {
    /// Starts nginx in the namespace `netns`, proxying to `upstream` there, listening on a fresh
    /// port of 127.0.0.1; returns once its master has written its pid file (it is serving then).
    pub fn start(
        binary: &Path,
        netns: &Path,
        upstream: SocketAddr,
        listen: Listen,
        dir: PathBuf,
    ) -> anyhow::Result<Nginx> {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let listener = TcpListener::bind("127.0.0.1:0").context("nginx baseline: bind")?;
        let addr = listener.local_addr()?;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(&dir, addr, upstream, &listen))
            .with_context(|| format!("cannot write {}", conf.display()))?;
        let fd = listener.as_raw_fd();
        // nginx adopts the descriptors named in NGINX: this one must survive the exec.
        nix::fcntl::fcntl(
            &listener,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .context("nginx baseline: clear close-on-exec")?;
        let log = std::fs::File::create(dir.join("stderr.log"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .arg(binary)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .env("NGINX", format!("{fd};"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("nginx baseline: cannot run nsenter")?;
        // Our copy: nginx holds its own now.
        drop(listener);
        let mut nginx = Nginx { child, dir, addr };
        let pid_file = nginx.dir.join("nginx.pid");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pid_file.exists() {
            if let Some(status) = nginx.child.try_wait()? {
                anyhow::bail!("nginx exited at start ({status}): {}", nginx.logs().trim());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "nginx did not start within 10 s: {}",
                nginx.logs().trim()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nginx)
    }

    fn logs(&self) -> String {
        ["stderr.log", "error.log"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.join(f)).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // nsenter execs nginx, so this is nginx's master; SIGTERM makes it stop its workers.
        let Ok(raw) = i32::try_from(self.child.id()) else {
            return;
        };
        let pid = Pid::from_raw(raw);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("warning: nginx (pid {raw}) did not stop on SIGTERM; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_per_listen_mode() {
        let dir = Path::new("/tmp/x");
        let addr: SocketAddr = "127.0.0.1:1234".parse().unwrap();
        let up: SocketAddr = "169.254.17.2:80".parse().unwrap();
        let plain = config(dir, addr, up, &Listen::Http1);
        assert!(plain.contains("listen 127.0.0.1:1234;"));
        assert!(plain.contains("server 169.254.17.2:80; keepalive"));
        assert!(!plain.contains("ssl"));
        assert!(config(dir, addr, up, &Listen::H2c).contains("listen 127.0.0.1:1234 http2;"));
        let tls = config(
            dir,
            addr,
            up,
            &Listen::Tls {
                cert: "/c.crt".into(),
                key: "/c.key".into(),
            },
        );
        assert!(tls.contains("listen 127.0.0.1:1234 ssl http2;"));
        assert!(tls.contains("ssl_certificate /c.crt;"));
        assert!(tls.contains("ssl_certificate_key /c.key;"));
    }

    #[test]
    fn actor_netns_names_the_missing_actor() {
        let dir = std::env::temp_dir().join(format!("ate-nginx-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("workers/w1/actors/ns/a")).unwrap();
        let err = actor_netns(&dir, "ns", "a").unwrap_err().to_string();
        assert!(err.contains("no network namespace of ns/a"), "{err}");
        let err = actor_netns(&dir.join("nope"), "ns", "a")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot list the workers"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
