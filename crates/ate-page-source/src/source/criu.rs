//! CRIU's side of the lazy-pages socket: each restored task's pid and userfaultfd, then "finished".

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use super::{RESTORE_FINISHED, SourceError, io_err};

pub(super) enum RestoreMessage {
    Task { pid: i32, uffd: OwnedFd },
    Zombie,
    Finished,
    Closed,
}

/// One message of CRIU's side of the lazy-pages socket: a 4-byte pid followed by a 1-byte
/// message carrying the task's userfaultfd (SCM_RIGHTS), a negative pid (a zombie, no
/// descriptor), or the restore-finished marker.
pub(super) fn read_restore_message(client: &mut UnixStream) -> Result<RestoreMessage, SourceError> {
    let mut word = [0u8; 4];
    let mut got = 0;
    while got < word.len() {
        match client.read(&mut word[got..]) {
            Ok(0) if got == 0 => return Ok(RestoreMessage::Closed),
            Ok(0) => {
                return Err(SourceError::Protocol(
                    "CRIU closed the lazy-pages socket mid-message".into(),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("read from CRIU")(e)),
        }
    }
    let value = i32::from_ne_bytes(word);
    if value == RESTORE_FINISHED {
        return Ok(RestoreMessage::Finished);
    }
    if value < 0 {
        return Ok(RestoreMessage::Zombie);
    }
    let fd = receive_fd(client.as_raw_fd())?;
    Ok(RestoreMessage::Task {
        pid: value,
        uffd: fd,
    })
}

fn receive_fd(sock: RawFd) -> Result<OwnedFd, SourceError> {
    receive_criu_fd(sock)
        .map_err(io_err("receive a userfaultfd from CRIU"))?
        .ok_or_else(|| SourceError::Protocol("CRIU sent a task without its userfaultfd".into()))
}

/// Receives the one descriptor CRIU's `send_fd` passes (with a one-byte message): a lazy
/// restore's userfaultfd, an image streamer's pipe. `None` when the message carried none.
pub fn receive_criu_fd(sock: RawFd) -> io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut received = None;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: SCM_RIGHTS installed these descriptors in our table for us to own.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                received.get_or_insert(owned);
            }
        }
    }
    Ok(received)
}
