//! runc commands an earlier process of this worker left running: a worker killed in the middle
//! of a restore or a checkpoint leaves its `runc` (and the CRIU, hooks and half-restored tasks
//! under it) going on without anyone to answer to. A restarted worker ends them before it
//! touches any sandbox: an abandoned `runc restore` that fails later runs runc's own cleanup,
//! which removes the container's state dir — by then the state of the restore the new process
//! made of the same actor, whose sandbox a later restart could then not re-adopt (the fault
//! suite's kill-in-resume lost an actor's memory so).
//!
//! A `runc checkpoint` is given time to end on its own first: killed, its CRIU could be inside
//! the actor's processes (its parasite code injected), and the sandbox would not survive; left
//! to finish, the dump ends cleanly and the frozen sandbox is thawed and adopted.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::procfs::{command_line, process_table, tree_of};

/// How long a restarted worker waits for the commands it killed to be gone.
const GONE_WAIT: Duration = Duration::from_secs(2);
/// How long an earlier `runc checkpoint` may go on before it is killed too (a dump of a few
/// GiB takes seconds; a checkpoint stuck longer is not finishing).
const CHECKPOINT_WAIT: Duration = Duration::from_secs(10);

/// Kills every `runc` run with `--root root` that is not under `own` (this process), and every
/// process under each, then waits (bounded) until they are gone. Returns the command lines it
/// killed.
pub(super) async fn end_earlier_commands(runc: &Path, root: &Path, own: u32) -> Vec<String> {
    let root = root.to_string_lossy().into_owned();
    let runc = runc.to_path_buf();
    // Each earlier command with its command line and its process tree.
    let scan = move || {
        let table = process_table();
        earlier_commands(&table, command_line, &runc, &root, own)
            .into_iter()
            .map(|(pid, args)| {
                let tree: Vec<u32> = tree_of(pid, &table).iter().map(|(p, _)| *p).collect();
                (args, tree)
            })
            .collect::<Vec<_>>()
    };
    // Checkpoints first get their time to finish.
    let deadline = Instant::now() + CHECKPOINT_WAIT;
    let found = loop {
        let found = tokio::task::spawn_blocking(scan.clone())
            .await
            .unwrap_or_default();
        let checkpointing = found
            .iter()
            .any(|(args, _)| args.iter().any(|a| a == "checkpoint"));
        if !checkpointing || Instant::now() >= deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let pids: Vec<u32> = found.iter().flat_map(|(_, tree)| tree.clone()).collect();
    for pid in &pids {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let deadline = Instant::now() + GONE_WAIT;
    while !pids.is_empty() && Instant::now() < deadline {
        let table = tokio::task::spawn_blocking(process_table)
            .await
            .unwrap_or_default();
        if !table.iter().any(|(pid, _)| pids.contains(pid)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    found.into_iter().map(|(args, _)| args.join(" ")).collect()
}

/// Of the live processes `table` (`(pid, ppid)`), the `runc` commands (`args_of` gives a pid's
/// command line) run with `--root root`, except those under `own`, each with its command line.
fn earlier_commands(
    table: &[(u32, u32)],
    args_of: impl Fn(u32) -> Vec<String>,
    runc: &Path,
    root: &str,
    own: u32,
) -> Vec<(u32, Vec<String>)> {
    let is_runc = |program: &str| {
        Path::new(program) == runc || Path::new(program).file_name() == runc.file_name()
    };
    let under_own = |mut pid: u32| {
        for _ in 0..64 {
            if pid == own {
                return true;
            }
            match table.iter().find(|(p, _)| *p == pid) {
                Some((_, ppid)) if *ppid != 0 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    table
        .iter()
        .map(|(pid, _)| (*pid, args_of(*pid)))
        .filter(|(_, args)| {
            args.first().is_some_and(|p| is_runc(p))
                && args.windows(2).any(|w| w[0] == "--root" && w[1] == root)
        })
        .filter(|(pid, _)| !under_own(*pid))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runc_of_this_root_and_not_this_process() {
        // 1 init; 5 ate up; 10 the worker (own) with its runc 11; 20 an earlier runc restore
        // (reparented to ate up) and 21 its criu; 30 runc of another worker's root; 40 not runc.
        let table = [
            (1, 0),
            (5, 1),
            (10, 5),
            (11, 10),
            (20, 5),
            (21, 20),
            (30, 5),
            (40, 5),
        ];
        let args = |pid: u32| -> Vec<String> {
            let a: &[&str] = match pid {
                11 | 20 => &["/usr/sbin/runc", "--root", "/w/1/runc", "restore", "-d"],
                21 => &["criu", "swrk", "3"],
                30 => &["runc", "--root", "/w/2/runc", "restore"],
                40 => &["sleep", "--root", "/w/1/runc"],
                _ => &[],
            };
            a.iter().map(|s| s.to_string()).collect()
        };
        let found: Vec<u32> = earlier_commands(&table, args, Path::new("runc"), "/w/1/runc", 10)
            .into_iter()
            .map(|(pid, _)| pid)
            .collect();
        assert_eq!(found, [20]);
        let mut tree: Vec<u32> = tree_of(20, &table).iter().map(|(p, _)| *p).collect();
        tree.sort_unstable();
        assert_eq!(tree, [20, 21]);
    }

    /// A real process named runc with this root, and the child under it, are killed and gone;
    /// one with another root is left alone.
    #[tokio::test]
    async fn an_earlier_runc_and_its_children_are_ended() {
        use std::os::unix::process::CommandExt;
        let root = tempfile::tempdir().expect("tempdir");
        let root_text = root.path().to_string_lossy().into_owned();
        let spawn = |root: &str| {
            std::process::Command::new("/bin/sh")
                .arg0("runc")
                .args(["-c", "sleep 300 & wait", "sh", "--root", root, "restore"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn sh")
        };
        let mut earlier = spawn(&root_text);
        let mut other = spawn("/elsewhere/runc");
        // The child sleep appears once the shell has started it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while tree_of(earlier.id(), &process_table()).len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tree: Vec<u32> = tree_of(earlier.id(), &process_table())
            .iter()
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(tree.len(), 2, "sh and its sleep: {tree:?}");
        // `own` is no process here (the shells are this test's children).
        let ended = end_earlier_commands(Path::new("/usr/sbin/runc"), root.path(), u32::MAX).await;
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert!(ended[0].contains(&root_text), "{ended:?}");
        let status = earlier.wait().expect("wait");
        assert!(status.code().is_none(), "killed by a signal: {status:?}");
        let table = process_table();
        assert!(
            !tree.iter().any(|p| table.iter().any(|(q, _)| q == p)),
            "every process of the tree is gone"
        );
        assert!(
            other.try_wait().expect("try_wait").is_none(),
            "another root's runc runs on"
        );
        for (pid, _) in tree_of(other.id(), &process_table()) {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = other.wait();
    }
}
