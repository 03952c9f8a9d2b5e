//! Free TCP ports on 127.0.0.1 for components a test starts.

use std::net::TcpListener;

/// A free TCP port on 127.0.0.1 (bound then released; the tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `N` distinct free ports: every listener is held until all are picked, so two picks cannot
/// return the same port (separate `free_port` calls can, and then two components of one
/// `ate up` race for it).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().expect("free port").port())
}
