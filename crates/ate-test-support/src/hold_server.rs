//! A TCP server that holds connections open, for tests of what an open connection does (keeps an
//! actor awake, survives a suspend): run inside a network namespace as
//! `python3 -c SCRIPT ADDR PORT...`.

/// Accepts on every port given, at ADDR (`""`: every address), and holds each connection until
/// the peer closes it.
pub const SCRIPT: &str = r#"
import socket, sys, threading
def hold(c):
    try:
        c.recv(1)
    finally:
        c.close()
def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], port))
    s.listen(64)
    while True:
        c, _ = s.accept()
        threading.Thread(target=hold, args=(c,), daemon=True).start()
for p in sys.argv[2:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
threading.Event().wait()
"#;
