//! What `/proc` says about a process: its name and state, whether it still runs.

/// `(name, state)` of a process from its `/proc/<pid>/stat`.
pub fn name_and_state(pid: u32) -> Option<(String, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let state = stat
        .get(close + 1..)?
        .split_whitespace()
        .next()?
        .to_string();
    Some((name, state))
}

/// The process exists and is not a zombie (its state in `/proc/<pid>/stat` is not `Z`).
pub fn process_running(pid: u32) -> bool {
    name_and_state(pid).is_some_and(|(_, state)| state != "Z")
}
