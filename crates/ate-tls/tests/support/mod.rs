//! Loopback TLS echo server and client used by the integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use ate_tls::rustls::{ClientConfig, ServerConfig};
use ate_tls::{PeerIdentity, SpiffeId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// What the server saw for one connection: the client's ID, or the handshake error.
pub type AcceptResult = Result<Option<SpiffeId>, String>;

pub struct EchoServer {
    pub addr: SocketAddr,
    pub accepted: mpsc::UnboundedReceiver<AcceptResult>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EchoServer {
    /// The next connection's outcome on the server side.
    pub async fn next(&mut self) -> AcceptResult {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.accepted.recv())
            .await
            .expect("server outcome within 10 s")
            .expect("server running")
    }
}

/// Echoes bytes back on every accepted TLS connection.
pub async fn echo_server(config: ServerConfig) -> EchoServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let (tx, accepted) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                    Ok(mut tls) => {
                        let _ = tx.send(Ok(tls.peer_spiffe_id()));
                        let mut buf = [0u8; 256];
                        loop {
                            match tls.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    if tls.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    EchoServer {
        addr,
        accepted,
        task,
    }
}

pub type ClientStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Connects and completes one echo round trip; any failure as a string.
pub async fn round_trip(config: &ClientConfig, addr: SocketAddr) -> Result<ClientStream, String> {
    let mut tls = ate_tls::connect(Arc::new(config.clone()), "127.0.0.1", addr.port())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    ping(&mut tls).await?;
    Ok(tls)
}

pub async fn ping(tls: &mut ClientStream) -> Result<(), String> {
    tls.write_all(b"ping")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if &buf != b"ping" {
        return Err(format!("bad echo {buf:?}"));
    }
    Ok(())
}

/// Serial of the certificate the server presented on this connection.
pub fn served_serial(tls: &ClientStream) -> Vec<u8> {
    let certs = tls.get_ref().1.peer_certificates().expect("server cert");
    let (_, cert) = x509_parser::parse_x509_certificate(&certs[0]).unwrap();
    cert.raw_serial().to_vec()
}
