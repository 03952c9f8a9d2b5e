//! Unit tests of the OCI runtime spec the worker writes for runc.

use super::*;
use crate::runtime::SidecarSpec;
use ate_core::template::{ExitPolicy, Resources, Volume};
use ate_image::UnpackedImage;
use serde_json::{Value, json};

fn spec() -> SandboxSpec {
    SandboxSpec {
        image: UnpackedImage {
            manifest_digest: "sha256:00".into(),
            rootfs: "/cache/x/rootfs".into(),
            config: ImageConfig {
                entrypoint: vec!["/counter".into()],
                cmd: vec![],
                env: vec!["PATH=/bin".into(), "A=1".into()],
                working_dir: String::new(),
            },
        },
        command: vec![],
        env: vec![("A".into(), "2".into())],
        port: 8080,
        volumes: vec![Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            external: None,
        }],
        mounts: vec![Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            external: None,
        }],
        resources: Resources {
            cpu_millis: 500,
            memory_bytes: 64 << 20,
        },
        name: "counter".into(),
        exit_policy: Default::default(),
        sidecars: vec![],
    }
}

/// Specs covering every branch of [`oci_config`]: limits or none, volumes mounted or not,
/// a template command and working dir, sidecars (with and without their own mounts), cold
/// start or restore.
fn fixture_cases() -> Vec<(&'static str, ActorSandbox, SandboxSpec, bool, &'static str)> {
    let actor = ActorSandbox::new("team", "c1", "u1", "/var/lib/ate/actors/team/c1");
    let shared_criu = "/var/lib/ate/runc/criu.conf";
    let own_criu = "/var/lib/ate/actors/team/c1/criu.conf";
    let mut bare = spec();
    bare.command = vec!["/bin/server".into(), "--port".into(), "80".into()];
    bare.image.config.working_dir = "/srv".into();
    bare.image.config.env = vec!["LANG=C".into()];
    bare.env = vec![("PORT".into(), "9000".into())];
    bare.volumes = vec![];
    bare.mounts = vec![];
    bare.resources = Resources {
        cpu_millis: 0,
        memory_bytes: 0,
    };
    let mut pod = spec();
    pod.sidecars = vec![
        SidecarSpec {
            name: "side".into(),
            image: UnpackedImage {
                manifest_digest: "sha256:01".into(),
                rootfs: "/cache/y/rootfs".into(),
                config: ImageConfig {
                    entrypoint: vec!["/side".into()],
                    cmd: vec!["-v".into()],
                    env: vec![],
                    working_dir: "/w".into(),
                },
            },
            command: vec![],
            env: vec![("MODE".into(), "x".into())],
            exit_policy: ExitPolicy::Ignore,
            mounts: vec![Volume {
                name: "data".into(),
                mount_path: "/srv/data".into(),
                external: None,
            }],
        },
        SidecarSpec {
            name: "logs".into(),
            image: spec().image,
            command: vec!["/tail".into()],
            env: vec![],
            exit_policy: ExitPolicy::Stop,
            mounts: vec![],
        },
    ];
    let mut pod_memory_only = pod.clone();
    pod_memory_only.resources.cpu_millis = 0;
    vec![
        ("single", actor.clone(), spec(), false, shared_criu),
        ("single-restoring", actor.clone(), spec(), true, shared_criu),
        ("bare", actor.clone(), bare.clone(), false, shared_criu),
        ("bare-restoring", actor.clone(), bare, true, shared_criu),
        ("sidecars", actor.clone(), pod, false, own_criu),
        ("sidecars-restoring", actor, pod_memory_only, true, own_criu),
    ]
}

fn fixture_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/runc/testdata")
        .join(format!("{name}.json"))
}

/// The config as compared with a fixture: capability sets sorted (they are sets; their
/// order means nothing to runc), and the seccomp architectures of this build in place of
/// the fixtures' x86_64 ones.
fn normalized(mut config: Value) -> Value {
    if let Some(caps) = config
        .pointer_mut("/process/capabilities")
        .and_then(Value::as_object_mut)
    {
        for set in caps.values_mut() {
            if let Some(list) = set.as_array_mut() {
                list.sort_by_key(|c| c.as_str().map(str::to_string));
            }
        }
    }
    if let Some(seccomp) = config
        .pointer_mut("/linux/seccomp")
        .and_then(Value::as_object_mut)
    {
        seccomp.remove("architectures");
    }
    config
}

/// `config.json` field for field as the untyped (`serde_json::json!`) builder wrote it
/// before the config was built from `oci-spec` types: the fixtures are its output.
#[test]
fn config_matches_the_fixtures() {
    for (name, actor, spec, restoring, criu_conf) in fixture_cases() {
        let config = config_value(&actor, &spec, restoring, criu_conf);
        let path = fixture_path(name);
        let expected: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if std::env::consts::ARCH == "x86_64" {
            assert_eq!(
                config["linux"]["seccomp"]["architectures"],
                expected["linux"]["seccomp"]["architectures"],
                "{name}"
            );
        }
        assert_eq!(normalized(config), normalized(expected), "{name}");
    }
}

#[test]
fn env_merges_template_over_image() {
    assert_eq!(build_env(&spec()), vec!["PATH=/bin", "A=2", "PORT=8080"]);
}

#[test]
fn config_has_netns_path_and_limits() {
    let actor = ActorSandbox::new("team", "c1", "u1", "/var/lib/ate/actors/c1");
    let c = config_value(&actor, &spec(), false, "/var/lib/ate/criu.conf");
    let ns = &c["linux"]["namespaces"][1];
    assert_eq!(ns["type"], "network");
    assert_eq!(ns["path"], format!("/var/run/netns/{}", actor.netns()));
    assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
    assert_eq!(c["linux"]["resources"]["memory"]["limit"], 64u64 << 20);
    assert_eq!(c["process"]["args"], json!(["/counter"]));
    assert_eq!(c["root"]["path"], "/var/lib/ate/actors/c1/rootfs");
    assert_eq!(c["process"]["noNewPrivileges"], true);
    let seccomp = serde_json::to_value(hardening::seccomp().unwrap()).unwrap();
    assert_eq!(c["linux"]["seccomp"], seccomp);
    for set in ["bounding", "effective", "permitted"] {
        assert_eq!(
            c["process"]["capabilities"][set],
            json!(["CAP_NET_BIND_SERVICE"])
        );
    }
    assert!(c["process"]["capabilities"]["inheritable"].is_null());
    assert!(c["process"]["capabilities"]["ambient"].is_null());
    assert_eq!(
        c["linux"]["resources"]["pids"]["limit"],
        hardening::PIDS_LIMIT
    );
    assert_eq!(c["linux"]["maskedPaths"], json!(hardening::MASKED_PATHS));
    assert_eq!(
        c["linux"]["readonlyPaths"],
        json!(hardening::READONLY_PATHS)
    );
}

fn config_value(
    actor: &ActorSandbox,
    spec: &SandboxSpec,
    restoring: bool,
    criu_conf: &str,
) -> Value {
    let config = oci_config(actor, spec, restoring, Path::new(criu_conf)).unwrap();
    serde_json::to_value(&config).unwrap()
}

#[test]
fn the_config_runs_init_with_each_sidecars_mounts_and_masks() {
    let (_, actor, s, _, _) = fixture_cases().remove(4);
    let config = config_value(&actor, &s, false, "/criu.conf");
    assert!(
        config["process"]["capabilities"]["effective"]
            .as_array()
            .unwrap()
            .contains(&json!("CAP_SYS_CHROOT"))
    );
    assert_eq!(
        config["process"]["args"],
        json!([sidecars::INIT_PATH, sidecars::PLAN_PATH])
    );
    let dests: Vec<&str> = config["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .collect();
    for d in [
        "/.ate/containers/side",
        "/.ate/containers/side/proc",
        "/.ate/containers/side/dev/null",
        "/.ate/containers/side/etc/ate",
        "/.ate/containers/side/srv/data",
    ] {
        assert!(dests.contains(&d), "{d} not mounted: {dests:?}");
    }
    assert!(!dests.contains(&"/.ate/containers/side/data"), "{dests:?}");
    let masked = config["linux"]["maskedPaths"].as_array().unwrap();
    assert!(masked.contains(&json!("/.ate/containers/side/proc/kcore")));
    assert!(masked.contains(&json!("/proc/kcore")));
    let denied = config["linux"]["seccomp"]["syscalls"][0]["names"]
        .as_array()
        .unwrap();
    assert!(!denied.contains(&json!("chroot")));
    assert!(denied.contains(&json!("pivot_root")));
}

#[test]
fn rejects_escaping_volumes() {
    let actor = ActorSandbox::new("team", "c1", "u1", "/x");
    let mut s = spec();
    s.volumes = vec![Volume {
        name: "../x".into(),
        mount_path: "/data".into(),
        external: None,
    }];
    assert!(validate_spec(&actor, &s).is_err());
    s.volumes = vec![Volume {
        name: "x".into(),
        mount_path: "/etc/ate".into(),
        external: None,
    }];
    assert!(validate_spec(&actor, &s).is_err());
    s.volumes = vec![Volume {
        name: "x".into(),
        mount_path: "data".into(),
        external: None,
    }];
    assert!(validate_spec(&actor, &s).is_err());
}

#[test]
fn exec_failures_from_runc_output() {
    let line = |msg: &str| format!("time=\"2026-01-01T00:00:00Z\" level=error msg=\"{msg}\"");
    let cases = [
        (
            r#"runc run failed: unable to start container process: exec: \"/nope\": stat /nope: no such file or directory"#,
            "stat /nope: no such file or directory",
        ),
        (
            r#"runc run failed: unable to start container process: exec: \"/data\": permission denied"#,
            "permission denied",
        ),
        (
            r#"runc run failed: unable to start container process: error during container init: exec: \"nope\": executable file not found in $PATH"#,
            "executable file not found in $PATH",
        ),
    ];
    for (msg, reason) in cases {
        let out = format!("earlier output\n{}\n", line(msg));
        assert_eq!(runc_exec_failure(&out).as_deref(), Some(reason), "{msg}");
    }
    let mount = line(
        r#"runc run failed: unable to start container process: error during container init: error mounting \"/v\" to rootfs at \"/proc\": not of type proc"#,
    );
    assert_eq!(runc_exec_failure(&mount), None);
    assert_eq!(runc_exec_failure("exec: \"/x\": nope"), None);
}

#[test]
fn the_image_command_is_used_without_a_template_command() {
    let mut s = spec();
    s.image.config.cmd = vec!["--flag".into()];
    assert_eq!(process_args(&s), vec!["/counter", "--flag"]);
    s.command = vec!["/other".into()];
    assert_eq!(process_args(&s), vec!["/other"]);
    let long = vec!["x".repeat(300)];
    assert!(render_args(&long).len() < 210);
}
