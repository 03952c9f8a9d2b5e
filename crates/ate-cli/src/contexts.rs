//! CLI contexts, kubectl-style: each system `ate up` starts adds (or updates) a context named
//! after its state dir — `<config>/ate/contexts/<name>/` with the api address and the admin
//! certificate — and the CLI talks to the current one (`<config>/ate/current-context`). A second
//! `ate up` on the same host no longer silently takes the CLI over: it becomes current only when
//! there is no usable current context.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use crate::client::{API_ADDRESS_FILE, config_dir};

const CONTEXTS_DIR: &str = "contexts";
const CURRENT_FILE: &str = "current-context";

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// List the contexts (`*` marks the current one).
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
    /// Make NAME the current context.
    UseContext { name: String },
    /// Remove a context (not the system it points to).
    DeleteContext { name: String },
}

/// `<config>/ate/contexts`.
fn contexts_dir() -> Option<PathBuf> {
    config_dir().map(|d| d.join(CONTEXTS_DIR))
}

/// The directory of context `name`.
pub fn context_dir(name: &str) -> Option<PathBuf> {
    contexts_dir().map(|d| d.join(name))
}

/// The current context's name, if one is set.
pub fn current() -> Option<String> {
    let file = config_dir()?.join(CURRENT_FILE);
    let name = std::fs::read_to_string(file).ok()?.trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// The current context's directory, if it names one that exists.
pub fn current_dir() -> Option<PathBuf> {
    let dir = context_dir(&current()?)?;
    dir.is_dir().then_some(dir)
}

/// A context name for a state dir: its path with `/` → `-` (`/var/lib/ate` → `var-lib-ate`),
/// lower-case letters, digits and `-`, at most 63 characters.
pub fn name_for_state_dir(state_dir: &Path) -> String {
    let abs = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let mut name: String = abs
        .display()
        .to_string()
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .collect();
    while name.contains("--") {
        name = name.replace("--", "-");
    }
    let name = name.trim_matches('-');
    let name = if name.len() > 63 {
        &name[name.len() - 63..]
    } else {
        name
    };
    let name = name.trim_matches('-');
    if name.is_empty() {
        "local".to_string()
    } else {
        name.to_string()
    }
}

/// Writes context `name` with `api_addr` (the admin certificate is copied by the caller into
/// [`context_dir`]). Makes it current when there is no usable current context or it is this
/// one; otherwise says how to switch. Returns whether it is current.
pub fn publish(name: &str, api_addr: &str) -> anyhow::Result<bool> {
    let dir = context_dir(name).context("no config dir (set HOME or XDG_CONFIG_HOME)")?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    crate::serve::write_atomically(&dir.join(API_ADDRESS_FILE), api_addr)?;
    let usable =
        current().filter(|c| context_dir(c).is_some_and(|d| d.join(API_ADDRESS_FILE).is_file()));
    match usable {
        Some(c) if c != name => {
            eprintln!(
                "ate up: CLI context {name:?} added; the CLI still talks to {c:?} (switch with `ate config use-context {name}`)"
            );
            Ok(false)
        }
        _ => {
            set_current(name)?;
            Ok(true)
        }
    }
}

fn set_current(name: &str) -> anyhow::Result<()> {
    let base = config_dir().context("no config dir (set HOME or XDG_CONFIG_HOME)")?;
    std::fs::create_dir_all(&base).with_context(|| format!("cannot create {}", base.display()))?;
    crate::serve::write_atomically(&base.join(CURRENT_FILE), name)
}

fn names() -> Vec<String> {
    let Some(dir) = contexts_dir() else {
        return Vec::new();
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub fn run(cmd: ConfigCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCmd::GetContexts => {
            let current = current();
            println!("{:<8} {:<40} API", "CURRENT", "NAME");
            for n in names() {
                let api = context_dir(&n)
                    .and_then(|d| std::fs::read_to_string(d.join(API_ADDRESS_FILE)).ok())
                    .map(|a| a.trim().to_string())
                    .unwrap_or_else(|| "-".into());
                let mark = if current.as_deref() == Some(n.as_str()) {
                    "*"
                } else {
                    ""
                };
                println!("{mark:<8} {n:<40} {api}");
            }
        }
        ConfigCmd::CurrentContext => match current() {
            Some(c) => println!("{c}"),
            None => anyhow::bail!(
                "no current context (`ate up` adds one; `ate config get-contexts` lists them)"
            ),
        },
        ConfigCmd::UseContext { name } => {
            if !names().contains(&name) {
                anyhow::bail!("no context {name:?}; `ate config get-contexts` lists them");
            }
            set_current(&name)?;
            println!("switched to context {name:?}");
        }
        ConfigCmd::DeleteContext { name } => {
            let dir = context_dir(&name).filter(|d| d.is_dir());
            let Some(dir) = dir else {
                anyhow::bail!("no context {name:?}");
            };
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove {}", dir.display()))?;
            if current().as_deref() == Some(name.as_str())
                && let Some(base) = config_dir()
            {
                let _ = std::fs::remove_file(base.join(CURRENT_FILE));
            }
            println!("context {name:?} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_state_dirs() {
        assert_eq!(name_for_state_dir(Path::new("/var/lib/ate")), "var-lib-ate");
        assert_eq!(
            name_for_state_dir(Path::new("/tmp/My State_dir/")),
            "tmp-my-state-dir"
        );
        let long = format!("/{}", "a/".repeat(60));
        assert!(name_for_state_dir(Path::new(&long)).len() <= 63);
        assert_eq!(name_for_state_dir(Path::new("/")), "local");
    }
}
