//! Network namespaces against the real kernel and iproute2 (root). The spare-netns pool
//! (src/pool.rs): a named spare is set up exactly like a namespace made on demand, the pool
//! refills behind the one it gave, and spares, being only descriptors of this process, are gone
//! once the pool is. An actor's namespace does not reach the host's loopback.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use ate_netns::pool::NetnsPool;

/// Deletes the test's named namespaces however the test ends.
struct Named(Vec<String>);

impl Drop for Named {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "delete", n]).status();
        }
    }
}

fn ip_in(netns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["-n", netns])
        .args(args)
        .output()
        .expect("run ip");
    assert!(out.status.success(), "ip -n {netns} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `ip` shows of an actor namespace: lo up, the actor address, the default route.
fn setup_of(netns: &str) -> (bool, bool, bool) {
    let lo = ip_in(netns, &["-o", "link", "show", "lo"]);
    let addrs = ip_in(netns, &["-o", "-4", "addr", "show"]);
    let routes = ip_in(netns, &["route", "show"]);
    (
        lo.contains("UP"),
        addrs.contains(&format!("{}/32", ate_netns::ACTOR_IP)),
        routes.contains(&format!("default dev {}", ate_netns::ACTOR_LINK)),
    )
}

/// Namespace descriptors this process holds (`/proc/self/fd/* -> net:[…]`).
fn netns_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|t| t.to_string_lossy().starts_with("net:["))
                .count()
        })
        .unwrap_or(0)
}

fn wait_ready(pool: &NetnsPool, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.ready() < n {
        assert!(
            Instant::now() < deadline,
            "pool has {} of {n} spares",
            pool.ready()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spares_are_set_up_like_made_ones_refill_and_leave_nothing_behind() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "netns tests need root (ip netns, mounts)"
    );
    let id = std::process::id();
    let made = format!("ate-tpool-{id}-m");
    let spare = format!("ate-tpool-{id}-s");
    let _cleanup = Named(vec![made.clone(), spare.clone()]);

    // On demand (no spares): also sets up /var/run/netns the way `ip netns add` does.
    let empty = NetnsPool::new(0);
    empty.create(&made).await.expect("made on demand");
    assert_eq!(empty.ready(), 0);
    let on_demand = setup_of(&made);
    assert_eq!(on_demand, (true, true, true), "{made}");

    let fds_before = netns_fds();
    let pool = NetnsPool::new(2);
    wait_ready(&pool, 2);
    assert_eq!(
        netns_fds(),
        fds_before + 2,
        "spares are held as descriptors"
    );

    // A spare, named: the same setup, found by name like any other.
    pool.create(&spare).await.expect("named from a spare");
    assert!(ate_netns::exists(&spare));
    assert_eq!(setup_of(&spare), on_demand, "{spare}");
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(
        listed
            .lines()
            .filter(|l| l.contains(&format!("ate-tpool-{id}")))
            .count(),
        2,
        "only the two named ones are listed (spares are unnamed):\n{listed}"
    );

    // Naming a namespace again replaces it (a stale one of the same name goes first).
    pool.create(&spare).await.expect("named again");
    assert_eq!(setup_of(&spare), on_demand);

    // The pool refills behind what it gave; dropped, it holds nothing.
    wait_ready(&pool, 2);
    drop(pool);
    // (A refill thread that has just pushed the last spare may hold the pool a moment longer.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while netns_fds() != fds_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(netns_fds(), fds_before, "spares are gone with the pool");

    ate_netns::delete(&spare).await.expect("delete");
    ate_netns::delete(&made).await.expect("delete");
    assert!(!ate_netns::exists(&spare) && !ate_netns::exists(&made));
}

/// Mount entries at `/run/netns` (where `/var/run/netns` leads) in this mount namespace, with
/// whether each is shared.
fn netns_dir_mounts() -> Vec<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some("/run/netns"))
        .map(|l| l.contains(" shared:"))
        .collect()
}

#[test]
fn a_namespace_bound_outside_ip_netns_add_stays_deletable() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "netns tests need root (ip netns, mounts)"
    );
    // What every worker does at start; twice must not stack a second bind.
    ate_netns::prepare_dir().expect("prepare the netns dir");
    ate_netns::prepare_dir().expect("prepare the netns dir again");
    assert_eq!(
        netns_dir_mounts(),
        vec![true],
        "one shared mount at /run/netns"
    );

    let id = std::process::id();
    let bound = format!("ate-tprep-{id}-b");
    let added = format!("ate-tprep-{id}-a");
    let _cleanup = Named(vec![bound.clone(), added.clone()]);
    // As the user-namespace hook names a namespace: a bind of the namespace at the file.
    let file = ate_netns::netns_path(&bound);
    std::fs::write(&file, b"").expect("create the namespace file");
    let ok = Command::new("unshare")
        .arg(format!("--net={}", file.display()))
        .arg("true")
        .status()
        .expect("run unshare");
    assert!(ok.success(), "unshare --net={}", file.display());
    // `ip netns add` afterwards used to bind the directory over it and hide it for good.
    let ok = Command::new("ip")
        .args(["netns", "add", &added])
        .status()
        .expect("run ip");
    assert!(ok.success(), "ip netns add {added}");
    for name in [&bound, &added] {
        let out = Command::new("ip")
            .args(["netns", "delete", name])
            .output()
            .expect("run ip");
        assert!(
            out.status.success(),
            "ip netns delete {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!ate_netns::exists(name), "{name} still exists");
    }
    assert_eq!(netns_dir_mounts(), vec![true], "still one shared mount");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_netns_cannot_reach_host_loopback() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "netns tests need root (ip netns, mounts)"
    );
    let host = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("host listener");
    let port = host.local_addr().expect("addr").port();
    // Sanity: reachable from the host namespace.
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("host connect");

    let ns = format!("ate-i{:x}", std::process::id());
    let _cleanup = Named(vec![ns.clone()]);
    ate_netns::create(&ns).await.expect("create netns");
    let target: SocketAddr = ([127, 0, 0, 1], port).into();
    let r = ate_netns::connect_in_netns_timeout(&ns, target, Duration::from_secs(2)).await;
    let err = r.expect_err("host loopback must not be reachable from the actor netns");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    // The calling thread is still in the host namespace (setns ran on a side thread).
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("host connect after");
    ate_netns::delete(&ns).await.expect("delete netns");
    assert!(!ate_netns::exists(&ns), "{ns} still exists");
}
