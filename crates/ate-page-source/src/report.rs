//! Messages from a page source to its worker over a `SOCK_SEQPACKET` pair (one message per
//! datagram): a tag byte, then text or a descriptor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

const LISTENING: u8 = b'L';
const UFFD: u8 = b'U';
const DONE: u8 = b'D';
const FAILED: u8 = b'E';
const DAMAGED: u8 = b'X';
const TRACKING: u8 = b'T';
/// The worker's request (one byte, worker to page source): handle every queued event and answer
/// with [`Report::Tracking`].
pub const BARRIER: u8 = b'B';
/// Longest text a report carries (an error message); longer ones are cut.
const MAX_TEXT: usize = 4096;

#[derive(Debug)]
pub enum Report {
    /// The socket CRIU connects to is ready: the restore may start.
    Listening,
    /// A copy of a task's userfaultfd (sending side: the descriptor number to send).
    Uffd(RawFd),
    /// Every page is in; a summary of the counters.
    Done(String),
    /// The page source gives up (the actor must not run on).
    Failed(String),
    /// It gives up because the generation is damaged: a memory chunk does not match its digest
    /// in the manifest (the actor must not run on, and no restore of that copy can succeed).
    Damaged(String),
    /// The answer to a barrier: `since_us=N` (tracking holds since CLOCK_BOOTTIME N µs) or
    /// `lost: why`.
    Tracking(String),
}

/// What the worker receives.
#[derive(Debug)]
pub enum Received {
    Listening,
    Uffd(OwnedFd),
    Done(String),
    Failed(String),
    Damaged(String),
    Tracking(String),
    /// The page source closed its end (it exited).
    Closed,
}

/// A connected `SOCK_SEQPACKET` pair, both ends close-on-exec.
pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (a, b) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    // std's UnixStream works on any connected unix socket descriptor; only send/recv are used.
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

pub fn send_report(sock: &UnixStream, report: &Report) -> io::Result<()> {
    let (tag, text, fd) = match report {
        Report::Listening => (LISTENING, "", None),
        Report::Uffd(fd) => (UFFD, "", Some(*fd)),
        Report::Done(t) => (DONE, t.as_str(), None),
        Report::Failed(t) => (FAILED, t.as_str(), None),
        Report::Damaged(t) => (DAMAGED, t.as_str(), None),
        Report::Tracking(t) => (TRACKING, t.as_str(), None),
    };
    let mut bytes = Vec::with_capacity(1 + text.len().min(MAX_TEXT));
    bytes.push(tag);
    bytes.extend_from_slice(&text.as_bytes()[..text.len().min(MAX_TEXT)]);
    let iov = [io::IoSlice::new(&bytes)];
    let fds;
    let cmsgs: Vec<ControlMessage<'_>> = match fd {
        Some(fd) => {
            fds = [fd];
            vec![ControlMessage::ScmRights(&fds)]
        }
        None => Vec::new(),
    };
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map(|_| ())
        .map_err(io::Error::from)
}

/// Blocks for the next report.
pub fn receive_report(sock: &UnixStream) -> io::Result<Received> {
    let mut buf = vec![0u8; 1 + MAX_TEXT];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => break m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
    };
    let n = msg.bytes;
    let mut fd = None;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: SCM_RIGHTS installed these descriptors in our table for us to own.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if fd.is_none() {
                    fd = Some(owned);
                }
            }
        }
    }
    if n == 0 {
        return Ok(Received::Closed);
    }
    let text = String::from_utf8_lossy(&buf[1..n]).into_owned();
    Ok(match (buf[0], fd) {
        (LISTENING, _) => Received::Listening,
        (UFFD, Some(fd)) => Received::Uffd(fd),
        (DONE, _) => Received::Done(text),
        (FAILED, _) => Received::Failed(text),
        (DAMAGED, _) => Received::Damaged(text),
        (TRACKING, _) => Received::Tracking(text),
        (tag, _) => Received::Failed(format!("page source sent an unknown report {tag:#x}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_and_descriptors_cross_the_pair() {
        let (a, b) = pair().unwrap();
        send_report(&a, &Report::Listening).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        send_report(&a, &Report::Uffd(file.as_raw_fd())).unwrap();
        send_report(&a, &Report::Done("faults=3".into())).unwrap();
        send_report(&a, &Report::Failed("chunk 2 damaged".into())).unwrap();
        send_report(&a, &Report::Damaged("chunk 3: checksum mismatch".into())).unwrap();
        drop(a);
        assert!(matches!(receive_report(&b).unwrap(), Received::Listening));
        match receive_report(&b).unwrap() {
            Received::Uffd(fd) => assert!(fd.as_raw_fd() >= 0),
            other => panic!("expected a descriptor, got {other:?}"),
        }
        assert!(matches!(receive_report(&b).unwrap(), Received::Done(t) if t == "faults=3"));
        assert!(
            matches!(receive_report(&b).unwrap(), Received::Failed(t) if t == "chunk 2 damaged")
        );
        assert!(matches!(
            receive_report(&b).unwrap(),
            Received::Damaged(t) if t == "chunk 3: checksum mismatch"
        ));
        assert!(matches!(receive_report(&b).unwrap(), Received::Closed));
    }
}
