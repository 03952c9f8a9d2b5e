//! What `/proc` says about processes: a process's name and state, whether it still runs, the
//! table of parents and a process's tree.

pub use ate_worker_client::host::{name_and_state, process_running};

/// `(pid, ppid)` of every live (not zombie) process.
pub(crate) fn process_table() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat(&stat)
                .filter(|(_, state)| *state != 'Z' && *state != 'X')
                .map(|(ppid, _)| (pid, ppid))
        })
        .collect()
}

/// `(ppid, state)` from a `/proc/<pid>/stat` line (the name may hold spaces and parentheses).
fn parse_stat(stat: &str) -> Option<(u32, char)> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// `root` and its descendants in `table` (`(pid, ppid)`), each with its parent; empty when
/// `root` is not in the table.
pub(crate) fn tree_of(root: u32, table: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let Some(&first) = table.iter().find(|(pid, _)| *pid == root) else {
        return Vec::new();
    };
    let mut tree = vec![first];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i].0;
        tree.extend(
            table
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && *pid != root),
        );
        i += 1;
    }
    tree
}

/// The command line of `pid` (its arguments), empty when it cannot be read (gone, or a kernel
/// thread).
pub(crate) fn command_line(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        assert_eq!(
            parse_stat("42 (a (weird) name) S 7 42 42 0 -1"),
            Some((7, 'S'))
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_tree_is_its_root_and_descendants() {
        let table = [(1, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1)];
        let mut pids: Vec<u32> = tree_of(10, &table).iter().map(|(p, _)| *p).collect();
        pids.sort_unstable();
        assert_eq!(pids, [10, 11, 12, 13]);
        assert!(tree_of(99, &table).is_empty());
    }

    #[test]
    fn own_command_line() {
        let own = command_line(std::process::id());
        assert!(!own.is_empty(), "{own:?}");
    }
}
