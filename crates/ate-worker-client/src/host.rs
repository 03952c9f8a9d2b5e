//! What `/proc` says about a process (its name and state, whether it still runs) and about the
//! host's memory.

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

/// The host's MemAvailable as a percentage of its memory (`/proc/meminfo`); None when it cannot
/// be read.
pub fn host_memory_available_percent() -> Option<u8> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| available_percent(&t))
}

/// MemAvailable as a percentage of MemTotal in a `/proc/meminfo` text.
fn available_percent(meminfo: &str) -> Option<u8> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    let total = field("MemTotal:").filter(|t| *t > 0)?;
    let available = field("MemAvailable:")?;
    u8::try_from(available.min(total) * 100 / total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_percent_reads_meminfo() {
        let text = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n";
        assert_eq!(available_percent(text), Some(25));
        assert_eq!(
            available_percent("MemTotal: 0 kB\nMemAvailable: 1 kB\n"),
            None
        );
        assert_eq!(available_percent("MemTotal: 10 kB\n"), None);
        assert_eq!(available_percent(""), None);
    }
}
