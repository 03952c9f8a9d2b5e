//! docs/images.md, run as written: its build-and-push script (a one-layer OCI image of the demo
//! counter, pushed with curl) against a real registry on loopback (Debian's `docker-registry`,
//! started by the test), its template (the registry address swapped for the test's), `ate up
//! --insecure-registry` and its `ate` lines against a whole system, and a 200 through the router.
//! Then the doc's "When the start fails": a command missing from the image and a script whose
//! interpreter is missing both crash the actor at once with the `lastError` the doc quotes.
//!
//! The blocks are taken from the doc by their `<!-- images_doc: NAME -->` markers, so the doc
//! cannot drift from what runs. Skipped with a message when `docker-registry` is not installed
//! and `CI` is unset.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ate_core::{Document, TemplateSpec};
use ate_test_support::registry as registry_fixture;
use registry_fixture::Registry;
use serde_json::Value;
use support::*;

const DOC: &str = include_str!("../../../docs/images.md");
/// The registry the doc's example names; the tests swap in their own.
const DOC_REGISTRY: &str = "127.0.0.1:5000";

/// The fenced block right after `<!-- images_doc: NAME -->`, without its fence and without the
/// indentation of a block inside a list item.
fn block(name: &str) -> String {
    let marker = format!("<!-- images_doc: {name} -->");
    let at = DOC
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/images.md has no {marker}"));
    let mut lines = DOC[at + marker.len()..].lines().skip(1);
    let fence = lines.next().unwrap_or_default();
    let indent = fence.len() - fence.trim_start().len();
    assert!(
        fence.trim_start().starts_with("```"),
        "{marker} is not followed by a fenced block: {fence:?}"
    );
    let mut out = String::new();
    for line in lines {
        if line.trim_start().starts_with("```") {
            return out;
        }
        out.push_str(line.get(indent..).unwrap_or(line.trim_start()));
        out.push('\n');
    }
    panic!("{marker}: the block is not closed");
}

/// The doc's template with the test's registry.
fn template(registry: &str) -> String {
    block("template").replace(DOC_REGISTRY, registry)
}

/// The demo counter's binary, out of its OCI layout (the same image the other tests use).
fn counter_binary(dir: &Path) -> PathBuf {
    let layout = images_dir().join("counter");
    let read_json = |p: PathBuf| -> Value {
        serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{p:?}: {e}")))
            .expect("layout JSON")
    };
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let index = read_json(layout.join("index.json"));
    let manifest = read_json(blob(
        index["manifests"][0]["digest"].as_str().expect("manifest"),
    ));
    let layer = blob(manifest["layers"][0]["digest"].as_str().expect("layer"));
    let mut tar = Command::new("tar");
    tar.arg("-xzf")
        .arg(&layer)
        .arg("-C")
        .arg(dir)
        .arg("counter");
    run_ok(&mut tar, "tar");
    dir.join("counter")
}

/// Runs the doc's build-and-push script in `dir` (which holds `server`) for `registry` and `tag`;
/// returns the manifest digest it printed.
fn build_and_push(dir: &Path, registry: &str, tag: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(block("build-and-push"))
        .current_dir(dir)
        .env("REGISTRY", registry)
        .env("TAG", tag)
        .output()
        .expect("run the doc's build-and-push script");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "build-and-push failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = format!("pushed {registry}/demo/hello:{tag} as ");
    let digest = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"));
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    digest.to_string()
}

fn registry_up() -> Option<Registry> {
    registry_fixture::available("images_doc").then(Registry::start)
}

fn system(registry: &str) -> System {
    System::up(UpOptions {
        up_args: vec!["--insecure-registry".into(), registry.into()],
        ..UpOptions::bare(1)
    })
}

fn actor(sys: &System, ns: &str, name: &str) -> Value {
    let json = sys.ate_ok(&["get", "actors", name, "-a", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&json).expect("json");
    v[0].clone()
}

#[test]
fn the_doc_blocks_fit_together() {
    // The template is valid as it stands and names the image the script pushes by default.
    let docs: Vec<Document> =
        serde_saphyr::from_multiple(&block("template")).expect("the template block is YAML");
    let spec = docs
        .iter()
        .find_map(|d| match d {
            Document::ActorTemplate(t) => Some(&t.spec),
            _ => None,
        })
        .expect("an ActorTemplate in the template block");
    let spec = TemplateSpec::from_document(spec).expect("the template validates");
    assert_eq!(spec.containers[0].image, "127.0.0.1:5000/demo/hello:v1");
    assert!(
        spec.containers[0].command.is_empty(),
        "the example runs the image's own entrypoint"
    );
    let script = block("build-and-push");
    for default in [
        "REGISTRY=${REGISTRY:-127.0.0.1:5000}",
        "REPO=${REPO:-demo/hello}",
        "TAG=${TAG:-v1}",
    ] {
        assert!(script.contains(default), "the script sets {default}");
    }
    // The commands the worked example runs below, as the doc writes them.
    assert_eq!(
        block("run").lines().collect::<Vec<_>>(),
        [
            "ate up --insecure-registry 127.0.0.1:5000",
            "ate apply -f hello.yaml",
            "ate create actor hello-1 -a demo -t demo/hello",
            "curl -H 'ate-target-actor: demo/hello-1' http://127.0.0.1:8080/",
        ]
    );
}

#[test]
fn the_worked_example_runs_as_written() {
    let Some(reg) = registry_up() else { return };
    let host = reg.host();
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::rename(counter_binary(work.path()), work.path().join("server")).expect("server");
    let digest = build_and_push(work.path(), &host, "v1");

    // `ate up --insecure-registry <host>` (the harness adds its private ports and state dir).
    let sys = system(&host);
    std::fs::write(work.path().join("hello.yaml"), template(&host)).expect("hello.yaml");
    let run = block("run");
    for line in run
        .lines()
        .filter(|l| l.starts_with("ate ") && !l.starts_with("ate up"))
    {
        let path = work.path().join("hello.yaml");
        let args: Vec<&str> = line
            .split_whitespace()
            .skip(1)
            .map(|a| {
                if a == "hello.yaml" {
                    path.to_str().expect("utf-8 path")
                } else {
                    a
                }
            })
            .collect();
        sys.ate_ok(&args);
    }

    // The curl line: the router, the actor header, `/`.
    let (status, head, body) = get(sys.router_addr, "demo/hello-1", "/");
    assert_eq!(
        status,
        200,
        "{head}\n{body}\nworker log:\n{}\nregistry log:\n{}",
        sys.log("worker-1"),
        reg.log()
    );
    // The answer the doc gives, word for word.
    let answer =
        "preserved memory count: 1 | preserved file counter: 1 | preserved rootfs counter: 1";
    let doc: String = DOC.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        doc.contains(&format!("`{answer}`")),
        "the doc quotes {answer:?}"
    );
    assert!(body.contains(answer), "{body}");
    let log = sys.log("worker-1");
    assert!(
        log.lines()
            .any(|l| l.contains("image reference resolved") && l.contains(&digest)),
        "the worker log names the digest the script printed ({digest}):\n{log}"
    );
    let a = actor(&sys, "demo", "hello-1");
    assert_eq!(a["state"], "ACTOR_STATE_RUNNING", "{a}");
}

#[test]
fn a_failed_exec_is_the_last_error() {
    let Some(reg) = registry_up() else { return };
    let host = reg.host();
    let work = tempfile::tempdir().expect("tempdir");
    let good = work.path().join("good");
    let script = work.path().join("script");
    std::fs::create_dir_all(&good).expect("mkdir");
    std::fs::create_dir_all(&script).expect("mkdir");
    std::fs::rename(counter_binary(&good), good.join("server")).expect("server");
    build_and_push(&good, &host, "v1");
    // v2: `/app/server` is a shell script, and the image has no /bin/sh.
    std::fs::write(script.join("server"), "#!/bin/sh\nexec /app/real-server\n").expect("script");
    build_and_push(&script, &host, "v2");

    let sys = system(&host);
    // The doc's template, under other names, with a probe long enough that only an early
    // failure can answer within the router's 10 s.
    // The doc's template under another name, changed by `edit`, with a probe long enough that
    // only an early failure can answer within the router's 10 s.
    let variant = |name: &str, edit: &dyn Fn(String) -> String| {
        let t = edit(
            template(&host)
                .replace("  name: hello\nspec:", &format!("  name: {name}\nspec:"))
                .replace("timeoutSeconds: 10", "timeoutSeconds: 60"),
        );
        let path = work.path().join(format!("{name}.yaml"));
        std::fs::write(&path, t).expect("template");
        sys.ate_ok(&["apply", "-f", path.to_str().expect("utf-8 path")]);
        sys.ate_ok(&create_actor_args(name, "demo", &format!("demo/{name}")));
    };
    let image_line = format!("      image: {host}/demo/hello:v1\n");
    variant("nope", &|t| {
        let with_command = format!("{image_line}      command: [\"/app/nope\"]\n");
        let t = t.replace(&image_line, &with_command);
        assert!(t.contains("/app/nope"), "{t}");
        t
    });
    variant("script", &|t| t.replace(":v1\n", ":v2\n"));
    // The counter exits (code 2) when BIND_ADDR is not an address.
    variant("early-exit", &|t| {
        let env = "          value: /state\n";
        let t = t.replace(
            env,
            &format!("{env}        - name: BIND_ADDR\n          value: nowhere\n"),
        );
        assert!(t.contains("BIND_ADDR"), "{t}");
        t
    });

    // The first request: a 503 at once, with the reason; then the actor is CRASHED.
    let crash = |name: &str| -> (String, String) {
        let begun = Instant::now();
        let (status, head, body) = get(sys.router_addr, &format!("demo/{name}"), "/");
        let took = begun.elapsed();
        eprintln!("{name}: {status} in {took:?}: {body}");
        assert_eq!(
            status,
            503,
            "{name}: {head}\n{body}\n{}",
            sys.log("worker-1")
        );
        assert!(
            took < Duration::from_secs(8),
            "{name}: answered after {took:?}, not at once"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let a = loop {
            let a = actor(&sys, "demo", name);
            if a["state"] == "ACTOR_STATE_CRASHED" || Instant::now() > deadline {
                break a;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(a["state"], "ACTOR_STATE_CRASHED", "{a}");
        let why = a["lastError"].as_str().unwrap_or_default().to_string();
        (body, why)
    };
    for (name, expected) in [
        ("nope", block("exec-failed")),
        ("script", block("exec-failed-after-start")),
    ] {
        let (body, why) = crash(name);
        assert!(body.contains("exec failed"), "{name}: {body}");
        assert_eq!(why, expected.trim(), "{name}: the lastError the doc quotes");
    }
    let (body, why) = crash("early-exit");
    let phrase = "exited (code 2) before its wakeup probe passed:";
    // The client sees the program's last words; the lastError has the log lines too.
    assert!(
        body.contains(&format!("{phrase} invalid BIND_ADDR")),
        "{body}"
    );
    assert!(
        why.contains(&format!("`/app/server` {phrase} invalid BIND_ADDR"))
            && why.contains("--- last log lines ---\n"),
        "lastError: {why}"
    );
    // The doc says so, in the same words.
    let doc: String = DOC.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        doc.contains(&phrase.replace("code 2", "code N")),
        "docs/images.md describes an early exit as {phrase:?}"
    );
}
