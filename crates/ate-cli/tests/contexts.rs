//! CLI contexts: each `ate up` adds a context for its state dir; the first becomes current, a
//! later one does not take the CLI over until `ate config use-context`.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::*;

/// `ate ARGS` as a user with config dir `home` and no other hint of which api to use.
fn ate_as_user(home: &Path, args: &[&str]) -> Output {
    Command::new(ATE)
        .args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env_remove("ATE_STATE_DIR")
        .env_remove("ATE_API")
        .env_remove("ATE_CERT")
        .env_remove("ATE_KEY")
        .env_remove("ATE_CA")
        .output()
        .expect("run ate")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "ate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_second_system_does_not_take_the_cli_over() {
    let home = tempfile::tempdir().expect("tempdir");
    let config = home.path().join("config");
    let config = config.to_str().expect("utf-8");
    let opts = || UpOptions::bare(0);
    let first = System::up_with_env(opts(), &[("XDG_CONFIG_HOME", config)]);
    let second = System::up_with_env(opts(), &[("XDG_CONFIG_HOME", config)]);
    first.ate_ok(&["create", "atespace", "only-in-first"]);

    let list = ok(ate_as_user(home.path(), &["config", "get-contexts"]));
    let lines: Vec<&str> = list.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{list}");
    let current = ok(ate_as_user(home.path(), &["config", "current-context"]));
    let current = current.trim();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with('*') && l.contains(current) && l.contains(&first.api)),
        "the first system is current: {list}"
    );
    let spaces = ok(ate_as_user(home.path(), &["get", "atespaces"]));
    assert!(spaces.contains("only-in-first"), "{spaces}");

    let other = lines
        .iter()
        .find(|l| l.contains(&second.api))
        .and_then(|l| l.split_whitespace().find(|w| *w != "*"))
        .expect("the second system's context")
        .to_string();
    ok(ate_as_user(home.path(), &["config", "use-context", &other]));
    let spaces = ok(ate_as_user(home.path(), &["get", "atespaces"]));
    assert!(!spaces.contains("only-in-first"), "{spaces}");

    let missing = ate_as_user(home.path(), &["config", "use-context", "nope"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("get-contexts"));
}
