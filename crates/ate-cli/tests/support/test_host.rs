//! A "test host" an actor may reach through its egress allow list: a network namespace with a
//! veth pair, the host side at 10.254.X.1/30 (which thereby becomes a node address, always
//! denied to actors) and the namespace side at 10.254.X.2. Create it before `System::up`, so the
//! workers' first read of the node addresses has 10.254.X.1. Removed on drop, also on panic.
//! Traffic to it stays on this machine, inside a namespace the test created.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sched::{CloneFlags, setns};

fn run(args: &[&str]) {
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

pub struct TestHost {
    pub netns: String,
    pub host_link: String,
    pub host_ip: Ipv4Addr,
    pub peer_ip: Ipv4Addr,
    /// A number derived from this process and the clock, for ports and names of its own.
    pub seed: u32,
}

impl TestHost {
    /// `prefix` (at most 4 characters) starts the names of the namespace and the links.
    pub fn new(prefix: &str) -> TestHost {
        assert!(
            prefix.len() <= 4,
            "interface names have 15 characters at most"
        );
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let seed = std::process::id() ^ nanos;
        let tag = format!("{:06x}", seed & 0xff_ffff);
        let third = (seed % 250 + 1) as u8;
        let h = TestHost {
            netns: format!("{prefix}-{tag}"),
            host_link: format!("{prefix}h{tag}"),
            host_ip: Ipv4Addr::new(10, 254, third, 1),
            peer_ip: Ipv4Addr::new(10, 254, third, 2),
            seed,
        };
        let peer_link = format!("{prefix}p{tag}");
        let (ns, host_link) = (h.netns.as_str(), h.host_link.as_str());
        // From here on, drop removes whatever was made (also when a step below fails).
        run(&["ip", "netns", "add", ns]);
        run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        run(&[
            "ip", "link", "add", host_link, "type", "veth", "peer", "name", &peer_link,
        ]);
        run(&["ip", "link", "set", &peer_link, "netns", ns]);
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", h.host_ip),
            "dev",
            host_link,
        ]);
        run(&["ip", "link", "set", host_link, "up"]);
        run(&[
            "ip",
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/30", h.peer_ip),
            "dev",
            &peer_link,
        ]);
        run(&["ip", "-n", ns, "link", "set", &peer_link, "up"]);
        h
    }

    /// A listener on the namespace side (`port` 0: any free port), made by a short-lived thread
    /// that enters the namespace: the socket keeps it, so any thread of this process serves it.
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
