//! Certificate rotation under steady traffic, end to end through `ate up` (mTLS on every hop).
//!
//! The issue's acceptance, "60 s certificates rotate during a 3-minute test with zero failed
//! requests", is [`sixty_second_certificates_rotate_during_three_minutes_of_traffic`]; the same
//! test scaled down by 10 (6 s certificates, each re-issued at 4 s, children re-reading their
//! files every 500 ms, ~20 s of traffic) runs beside it, so every component's certificate
//! rotates several times and the first ones expire mid-test either way.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

/// Serial of the certificate in `<tls>/<name>.crt`.
fn serial(rt: &tokio::runtime::Runtime, tls: &Path, name: &str) -> Vec<u8> {
    rt.block_on(async {
        let files = ate_tls::PemFiles::in_dir(tls, name);
        ate_tls::CertSource::from_files(files, Duration::from_secs(60))
            .expect("read certificate")
            .current()
            .serial
            .clone()
    })
}

#[test]
fn certificates_rotate_under_steady_traffic_without_failures() {
    rotate_under_traffic(Duration::from_secs(6), Duration::from_secs(20));
}

#[test]
fn sixty_second_certificates_rotate_during_three_minutes_of_traffic() {
    rotate_under_traffic(Duration::from_secs(60), Duration::from_secs(180));
}

/// Certificates of `lifetime` under `run` of steady traffic through the router plus a fresh CLI
/// connection every 2 s: zero failures, every certificate replaced, every child re-read its files.
fn rotate_under_traffic(lifetime: Duration, run: Duration) {
    let sys = System::up(UpOptions {
        workers: 1,
        up_args: vec!["--cert-lifetime".into(), format!("{}s", lifetime.as_secs())],
        ..Default::default()
    });
    let tls = sys.state_dir().join("tls");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let names = ["api", "node", "router", "worker-1", "admin"];
    let before: Vec<Vec<u8>> = names.iter().map(|n| serial(&rt, &tls, n)).collect();

    sys.ate_ok(&create_actor_args("rot", "ate-demo", "ate-demo/counter"));
    let started = Instant::now();
    let (mut ok, mut failed, mut cli_calls) = (0u32, Vec::new(), 0u32);
    let mut last_cli = Instant::now() - Duration::from_secs(10);
    while started.elapsed() < run {
        let (status, head, body) = get(sys.router_addr, "ate-demo/rot", "/");
        if status == 200 {
            ok += 1;
        } else {
            failed.push(format!("{:?}: {status} {head} {body}", started.elapsed()));
        }
        // A new CLI → api connection every 2 s: a fresh handshake with rotated certificates.
        if last_cli.elapsed() > Duration::from_secs(2) {
            let out = sys.ate(&["get", "actors", "rot", "-a", "ate-demo"]);
            assert!(
                out.status.success(),
                "ate get at {:?}: {}",
                started.elapsed(),
                String::from_utf8_lossy(&out.stderr)
            );
            cli_calls += 1;
            last_cli = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during rotation:\n{}\nrouter log:\n{}",
        failed.len(),
        ok as usize + failed.len(),
        failed.join("\n"),
        sys.log("router")
    );
    let secs = run.as_secs();
    assert!(u64::from(ok) > secs * 2, "only {ok} requests in {secs} s");
    assert!(u64::from(cli_calls) >= secs / 3);

    let after: Vec<Vec<u8>> = names.iter().map(|n| serial(&rt, &tls, n)).collect();
    for ((name, b), a) in names.iter().zip(&before).zip(&after) {
        assert_ne!(b, a, "the {name} certificate was not rotated");
    }
    // Each child re-read its rotated files (one load at start, then one per rotation: a
    // certificate is re-issued at 2/3 of its lifetime).
    let rotations = (run.as_secs() * 3 / (lifetime.as_secs() * 2)).saturating_sub(1) as usize;
    for component in ["api", "node", "router", "worker-1"] {
        let loads = sys.log(component).matches("certificate updated").count();
        assert!(
            loads >= rotations,
            "{component} loaded its certificate only {loads} times in {} s of {} s certificates",
            run.as_secs(),
            lifetime.as_secs()
        );
    }
}
