//! A "test host": a network namespace this test creates, joined to the host by a veth pair
//! (host side 10.254.X.1/30, which thereby becomes a node address; the test host 10.254.X.2),
//! where a small Python server holds every connection open on two ports until its peer closes
//! it. Actors reach it only through their template's egress allow list (private ranges need an
//! explicit entry). Create it before `ate up`, so the workers' first read of the node addresses
//! has 10.254.X.1. Everything is removed on drop, also on panic. A test may also serve from the
//! test host itself: [`TestHost::listen`] makes a listener inside it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sched::{CloneFlags, setns};

pub fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace with a veth to the host and a holding server on two ports; removed on drop.
pub struct TestHost {
    pub netns: String,
    host_link: String,
    pub host_ip: Ipv4Addr,
    pub peer_ip: Ipv4Addr,
    pub ports: [u16; 2],
    server: Option<Child>,
}

impl TestHost {
    pub fn new() -> TestHost {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let seed = std::process::id() ^ nanos;
        let tag = format!("{:06x}", seed & 0xff_ffff);
        let third = (seed % 250 + 1) as u8;
        let base = 20000 + (seed % 20000) as u16;
        let mut h = TestHost {
            netns: format!("egt-{tag}"),
            host_link: format!("egth{tag}"),
            host_ip: Ipv4Addr::new(10, 254, third, 1),
            peer_ip: Ipv4Addr::new(10, 254, third, 2),
            ports: [base, base + 1],
            server: None,
        };
        let peer_link = format!("egtp{tag}");
        let (ns, host_link) = (h.netns.clone(), h.host_link.clone());
        run(&["ip", "netns", "add", &ns]);
        run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        run(&[
            "ip", "link", "add", &host_link, "type", "veth", "peer", "name", &peer_link,
        ]);
        run(&["ip", "link", "set", &peer_link, "netns", &ns]);
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", h.host_ip),
            "dev",
            &host_link,
        ]);
        run(&["ip", "link", "set", &host_link, "up"]);
        run(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/30", h.peer_ip),
            "dev",
            &peer_link,
        ]);
        run(&["ip", "-n", &ns, "link", "set", &peer_link, "up"]);
        let server = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c"])
            .arg(ate_test_support::hold_server::SCRIPT)
            .arg(h.peer_ip.to_string())
            .args(h.ports.iter().map(|p| p.to_string()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the test host's server");
        h.server = Some(server);
        // Ready when both ports accept (from the host, over the veth).
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in h.ports {
            let addr = SocketAddr::new(h.peer_ip.into(), p);
            while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "test host server not up on {addr}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        h
    }

    /// `ip:port` of the holding server's port `i` (0 or 1).
    pub fn peer(&self, i: usize) -> String {
        format!("{}:{}", self.peer_ip, self.ports[i])
    }

    /// A listener on the test host's address (`port` 0: any free port), made by a short-lived
    /// thread that enters the namespace: the socket keeps it, so any thread of this process
    /// serves it.
    pub fn listen(&self, port: u16) -> TcpListener {
        let path = format!("/run/netns/{}", self.netns);
        let addr = SocketAddr::new(self.peer_ip.into(), port);
        std::thread::spawn(move || -> std::io::Result<TcpListener> {
            let ns = std::fs::File::open(&path)?;
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
            TcpListener::bind(addr)
        })
        .join()
        .expect("the listening thread")
        .unwrap_or_else(|e| panic!("listen on {addr} in netns {}: {e}", self.netns))
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .stderr(Stdio::null())
            .status();
    }
}
