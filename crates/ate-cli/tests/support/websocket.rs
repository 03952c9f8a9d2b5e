//! A WebSocket client over a std TcpStream, just enough for the tests: the upgrade to `/ws`,
//! masked client frames, server frames read back.

use std::io::{Read, Write};
use std::net::TcpStream;

/// Sends the upgrade of `/ws` (`Host: host`, and `ate-target-actor: actor` when given) and
/// reads the answer's head, through its blank line.
pub fn handshake(s: &mut TcpStream, host: &str, actor: Option<&str>) -> String {
    let target = actor
        .map(|a| format!("ate-target-actor: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!(
            "GET /ws HTTP/1.1\r\nHost: {host}\r\n{target}Upgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .expect("handshake");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).expect("read handshake");
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A masked client frame (`opcode` 1 text, 9 ping, 8 close).
pub fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [9u8, 8, 7, 6];
    let mut f = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads one unmasked server frame: (first byte, payload).
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head)?;
    let mut len = u64::from(head[1] & 0x7f);
    if len == 126 {
        let mut ext = [0u8; 2];
        s.read_exact(&mut ext)?;
        len = u64::from(u16::from_be_bytes(ext));
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload)?;
    Ok((head[0], payload))
}
