//! Kills inside a suspend, a resume or a delete (`kill-in-suspend`, `kill-in-resume`,
//! `kill-in-delete`): trials with random timing, each killing one process that the operation
//! runs through — `runc`, `criu`, the page source of a lazy restore, the worker or the node
//! agent — while it runs. Whatever dies and whenever, the actor must end RUNNING with its memory
//! or SUSPENDED at its previous generation (the load client then resumes it): it must answer 200
//! again within [`STUCK_AFTER`], its count never going back (the row's state-lost check), with
//! nothing left behind (the row's checks). A deleted actor must be gone, sandbox and all.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use ate_proto::v1;
use nix::sys::signal::Signal;

use super::inject::Component;
use super::lab::{Lab, cmdline, signal};
use super::load::Load;
use super::{ATESPACE, KillKind};

/// `ate up` gives up on a component that exits more than 10 times in 5 minutes: kills of the
/// worker or the node agent are spaced at least this much.
const COMPONENT_KILL_SPACING: Duration = Duration::from_secs(32);

/// When a worker, and the node agent, were last killed by a trial.
static LAST_KILLS: std::sync::Mutex<Option<(Option<Instant>, Option<Instant>)>> =
    std::sync::Mutex::new(None);

/// Waits until `target` (the worker or the node agent) may be killed again without `ate up`
/// giving up on it, and notes that it is about to be.
async fn pace_component_kill(target: Target) {
    let slot = |k: &mut (Option<Instant>, Option<Instant>)| -> Option<Instant> {
        match target {
            Target::Worker => k.0,
            Target::Node => k.1,
            _ => None,
        }
    };
    let last = LAST_KILLS
        .lock()
        .ok()
        .and_then(|mut k| slot(k.get_or_insert((None, None))));
    if let Some(at) = last {
        let wait = COMPONENT_KILL_SPACING.saturating_sub(at.elapsed());
        tokio::time::sleep(wait).await;
    }
    if let Ok(mut k) = LAST_KILLS.lock() {
        let k = k.get_or_insert((None, None));
        match target {
            Target::Worker => k.0 = Some(Instant::now()),
            Target::Node => k.1 = Some(Instant::now()),
            _ => {}
        }
    }
}

/// An actor that has not answered 200 this long after its trial is stuck.
const STUCK_AFTER: Duration = Duration::from_secs(60);
/// How long a trial waits for the process it is to kill to appear.
const APPEAR_WAIT: Duration = Duration::from_secs(15);

/// What a trial kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// `runc checkpoint` (the dump), at a random moment of its life.
    RuncCheckpoint,
    /// The `criu` that `runc checkpoint` runs.
    CriuDump,
    /// `runc restore`.
    RuncRestore,
    /// The `criu` that `runc restore` runs.
    CriuRestore,
    /// `runc delete` of a stop.
    RuncDelete,
    /// `ate page-source` of a lazy restore (it outlives the restore's start; killed early).
    PageSource,
    /// The worker holding the actor, a random moment after the operation began.
    Worker,
    /// The node agent, a random moment after the operation began.
    Node,
}

impl Target {
    pub(super) const IN_SUSPEND: [Target; 4] = [
        Target::RuncCheckpoint,
        Target::CriuDump,
        Target::Worker,
        Target::Node,
    ];
    pub(super) const IN_RESUME: [Target; 5] = [
        Target::RuncRestore,
        Target::CriuRestore,
        Target::PageSource,
        Target::Worker,
        Target::Node,
    ];

    pub(super) const IN_DELETE: [Target; 3] = [Target::RuncDelete, Target::Worker, Target::Node];

    /// The `--kill` kind this target is.
    fn kind(self) -> KillKind {
        match self {
            Target::RuncCheckpoint | Target::RuncRestore | Target::RuncDelete => KillKind::Runc,
            Target::CriuDump | Target::CriuRestore => KillKind::Criu,
            Target::PageSource => KillKind::PageSource,
            Target::Worker => KillKind::Worker,
            Target::Node => KillKind::Node,
        }
    }

    /// Of `all`, those `--kill` allows (`only` empty: every one).
    fn chosen(all: &[Target], only: &[KillKind]) -> Vec<Target> {
        all.iter()
            .copied()
            .filter(|t| only.is_empty() || only.contains(&t.kind()))
            .collect()
    }

    fn name(self) -> &'static str {
        match self {
            Target::RuncDelete => "runc delete",
            Target::RuncCheckpoint => "runc checkpoint",
            Target::CriuDump => "criu (dump)",
            Target::RuncRestore => "runc restore",
            Target::CriuRestore => "criu (restore)",
            Target::PageSource => "page source",
            Target::Worker => "worker",
            Target::Node => "node agent",
        }
    }

    /// The random delay before the kill: after the process appeared (runc, criu, page source),
    /// or after the operation began (worker, node), so the kill lands anywhere in it.
    fn delay(self) -> Duration {
        let max_ms = match self {
            Target::RuncCheckpoint | Target::RuncRestore => 250,
            Target::RuncDelete => 30,
            Target::CriuDump | Target::CriuRestore => 40,
            Target::PageSource => 150,
            Target::Worker | Target::Node => 500,
        };
        Duration::from_millis(rand::random_range(0..=max_ms))
    }
}

/// One process of the host: pid, parent, name (comm) and command line.
struct Proc {
    pid: i32,
    ppid: i32,
    comm: String,
    args: Vec<String>,
}

fn processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let open = stat.find('(')?;
            let close = stat.rfind(')')?;
            let comm = stat.get(open + 1..close)?.to_string();
            let ppid = stat
                .get(close + 1..)?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(Proc {
                pid,
                ppid,
                comm,
                args: cmdline(pid),
            })
        })
        .collect()
}

/// The pid of the process `target` names, among the descendants of `ate up` (`up`).
fn find(target: Target, up: i32) -> Option<i32> {
    let procs = processes();
    let by_pid: HashMap<i32, &Proc> = procs.iter().map(|p| (p.pid, p)).collect();
    let under_up = |mut pid: i32| {
        for _ in 0..16 {
            match by_pid.get(&pid) {
                Some(p) if p.ppid == up => return true,
                Some(p) => pid = p.ppid,
                None => return false,
            }
        }
        false
    };
    let runc = |p: &Proc, verb: &str| {
        p.args
            .first()
            .is_some_and(|a| a == "runc" || a.ends_with("/runc"))
            && p.args.iter().any(|a| a == verb)
    };
    let criu_of = |p: &Proc, verb: &str| {
        p.comm == "criu" && by_pid.get(&p.ppid).is_some_and(|parent| runc(parent, verb))
    };
    procs
        .iter()
        .filter(|p| under_up(p.pid))
        .find(|p| match target {
            Target::RuncCheckpoint => runc(p, "checkpoint"),
            Target::RuncRestore => runc(p, "restore"),
            Target::CriuDump => criu_of(p, "checkpoint"),
            Target::CriuRestore => criu_of(p, "restore"),
            Target::RuncDelete => runc(p, "delete"),
            Target::PageSource => p.args.iter().any(|a| a == "page-source"),
            Target::Worker | Target::Node => false,
        })
        .map(|p| p.pid)
}

/// Waits for `target`'s process to appear (for the worker: for the api to name the worker that
/// holds `actor`), then kills it after its random delay. Returns what was done, for the notes,
/// and the component killed, which `ate up` restarts.
async fn kill_when_seen(lab: &Lab, target: Target, actor: &str) -> (String, Option<Component>) {
    let delay = target.delay();
    let deadline = Instant::now() + APPEAR_WAIT;
    match target {
        Target::Worker | Target::Node => {
            let component = if target == Target::Node {
                Component::Node
            } else {
                loop {
                    if let Some(i) = worker_of(lab, actor).await {
                        break Component::Worker(i);
                    }
                    if Instant::now() >= deadline {
                        return ("no worker held the actor".into(), None);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            tokio::time::sleep(delay).await;
            let killed = match lab.component_pid(component).await {
                Ok(pid) => signal(pid, Signal::SIGKILL),
                Err(e) => Err(e),
            };
            match killed {
                Ok(()) => (
                    format!("{} killed {} ms in", target.name(), delay.as_millis()),
                    Some(component),
                ),
                Err(e) => (format!("{e:#}"), None),
            }
        }
        _ => {
            let Some(up) = lab.up_pid() else {
                return ("ate up is not running".into(), None);
            };
            let pid = loop {
                if let Some(pid) = find(target, up) {
                    break pid;
                }
                if Instant::now() >= deadline {
                    return (format!("{} never appeared", target.name()), None);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            tokio::time::sleep(delay).await;
            let note = match signal(pid, Signal::SIGKILL) {
                Ok(()) => format!(
                    "{} killed {} ms after it appeared",
                    target.name(),
                    delay.as_millis()
                ),
                // It ended before the delay did: the operation went through untouched.
                Err(_) => format!("{} ended before the kill", target.name()),
            };
            (note, None)
        }
    }
}

/// `kill-in-suspend`: `trials` suspends, each with one of [`Target::IN_SUSPEND`] killed inside
/// it. Returns the failed expectations (stuck actors).
pub(super) async fn kill_in_suspend(
    lab: &Lab,
    load: &Load,
    actors: &[String],
    trials: usize,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let mut failed = Vec::new();
    let targets = Target::chosen(&Target::IN_SUSPEND, &lab.kill);
    for trial in 0..trials {
        let actor = &actors[trial % actors.len()];
        let Some(&target) = targets.get(trial % targets.len().max(1)) else {
            notes.push("no process of this fault is among --kill".into());
            break;
        };
        pace_component_kill(target).await;
        let began = lab.clock.now();
        let reported_before = rollbacks_reported(lab, actor);
        let (suspended, killed) =
            tokio::join!(lab.suspend(actor), kill_when_seen(lab, target, actor));
        let outcome = match suspended {
            Ok(()) => "suspended".to_string(),
            Err(e) => format!("suspend failed: {}", first_line(&format!("{e:#}"))),
        };
        settle(
            lab,
            load,
            actor,
            target,
            trial,
            &killed,
            &outcome,
            notes,
            &mut failed,
        )
        .await?;
        // The one loss these kills may cause, and only where the system says so: a CRIU killed
        // inside the actor's processes can take them with it; the actor is then back at its
        // previous generation (the suspend's answer, lastError and the api's log say so).
        if rollbacks_reported(lab, actor) > reported_before {
            notes.push(format!(
                "trial {trial}: {actor}'s sandbox did not survive; back at its previous generation (reported)"
            ));
            if let Ok(mut r) = lab.reported_rollbacks.lock() {
                r.push((actor.clone(), began, lab.clock.now()));
            }
        }
    }
    Ok(failed)
}

/// How many times the api has logged that a suspend of `actor` lost its sandbox (the actor
/// went back to its previous generation).
fn rollbacks_reported(lab: &Lab, actor: &str) -> usize {
    let needle = format!("actor={ATESPACE}/{actor} ");
    std::fs::read_to_string(lab.state.join("logs").join("api.log"))
        .map(|log| {
            log.lines()
                .filter(|l| l.contains("suspend lost the sandbox") && l.contains(&needle))
                .count()
        })
        .unwrap_or(0)
}

/// `kill-in-resume`: `trials` times, an actor suspended and then resumed by its load client's
/// next request, with one of [`Target::IN_RESUME`] killed inside the resume.
pub(super) async fn kill_in_resume(
    lab: &Lab,
    load: &Load,
    actors: &[String],
    trials: usize,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let mut failed = Vec::new();
    let targets = Target::chosen(&Target::IN_RESUME, &lab.kill);
    for trial in 0..trials {
        let actor = &actors[trial % actors.len()];
        let Some(&target) = targets.get(trial % targets.len().max(1)) else {
            notes.push("no process of this fault is among --kill".into());
            break;
        };
        pace_component_kill(target).await;
        // Pinned to the worker it is not on, so the resume restores the generation there (a
        // real CRIU restore, lazy) rather than thawing a frozen copy in place.
        if let Err(e) = pin_elsewhere(lab, actor).await {
            notes.push(format!(
                "trial {trial}: could not pin {actor} to another worker: {e:#}"
            ));
        }
        if let Err(e) = lab.suspend(actor).await {
            notes.push(format!(
                "trial {trial}: the suspend before the resume failed: {}",
                first_line(&format!("{e:#}"))
            ));
            continue;
        }
        // The load client asks again at once: the resume is under way.
        let killed = kill_when_seen(lab, target, actor).await;
        settle(
            lab,
            load,
            actor,
            target,
            trial,
            &killed,
            "resumed",
            notes,
            &mut failed,
        )
        .await?;
    }
    Ok(failed)
}

/// `kill-in-delete`: `trials` actors made for the trial, each resumed, then deleted with one of
/// [`Target::IN_DELETE`] killed inside the delete. The delete is asked again until it succeeds
/// (as a user would after an error); then the actor must be unknown to the api and nothing of it
/// left on the host. Returns the failed expectations.
pub(super) async fn kill_in_delete(
    lab: &Lab,
    trials: usize,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let mut failed = Vec::new();
    let targets = Target::chosen(&Target::IN_DELETE, &lab.kill);
    for trial in 0..trials {
        let actor = format!("deleted-{trial}");
        let Some(&target) = targets.get(trial % targets.len().max(1)) else {
            notes.push("no process of this fault is among --kill".into());
            break;
        };
        lab.create_actors(std::slice::from_ref(&actor)).await?;
        if let Err(e) = resume(lab, &actor).await {
            notes.push(format!("trial {trial}: could not resume {actor}: {e:#}"));
            continue;
        }
        pace_component_kill(target).await;
        let ((deleted, attempts), killed) = tokio::join!(
            delete_until_done(lab, &actor),
            kill_when_seen(lab, target, &actor)
        );
        if let Some(component) = killed.1 {
            lab.component_pid(component)
                .await
                .with_context(|| format!("{} did not come back", target.name()))?;
        }
        let outcome = match deleted {
            Ok(()) => format!("deleted ({attempts} asks)"),
            Err(e) => {
                failed.push(format!(
                    "trial {trial} ({}): {actor} could not be deleted within {} s: {e:#}",
                    target.name(),
                    STUCK_AFTER.as_secs()
                ));
                format!("NOT DELETED: {}", first_line(&format!("{e:#}")))
            }
        };
        if let Some(a) = get_actor(lab, &actor).await {
            failed.push(format!(
                "trial {trial}: {actor} still exists after its delete ({})",
                a.state().as_str_name()
            ));
        }
        // The node discards a copy the api no longer names when its worker registers again.
        let layout = lab.layout(std::slice::from_ref(&actor));
        let deadline = Instant::now() + STUCK_AFTER;
        let left = loop {
            let left = layout.anything_left().await?;
            if left.is_empty() || Instant::now() >= deadline {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        if !left.is_empty() {
            failed.push(format!(
                "trial {trial} ({}): left behind by the delete of {actor}: {}",
                target.name(),
                left.join("; ")
            ));
        }
        notes.push(format!(
            "trial {trial}: {actor}, {}; {outcome}; {}",
            killed.0,
            if left.is_empty() {
                "nothing left".to_string()
            } else {
                format!("LEFT: {}", left.join("; "))
            }
        ));
    }
    Ok(failed)
}

/// Resumes `actor`, asking again after Unavailable for up to 20 s as the router would (a node
/// agent restarted by the previous trial registers its workers again first), and waits until
/// the api says it is RUNNING.
async fn resume(lab: &Lab, actor: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut actors = lab.api().await?.actors;
        match actors
            .resume_actor(v1::ResumeActorRequest {
                actor: Some(object_ref(actor)),
            })
            .await
        {
            Ok(_) => break,
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(s) => anyhow::bail!("resume {actor}: {:?}: {}", s.code(), s.message()),
        }
    }
    let state = lab.wait_state(actor, v1::ActorState::Running).await;
    anyhow::ensure!(
        state == v1::ActorState::Running.as_str_name(),
        "{actor} is {state} after its resume"
    );
    Ok(())
}

/// Deletes `actor`, asking again after each error (the api or node restarting, the delete
/// interrupted) until it succeeds or the actor is gone, for at most [`STUCK_AFTER`]. Returns
/// the outcome and how many times it asked.
async fn delete_until_done(lab: &Lab, actor: &str) -> (anyhow::Result<()>, u32) {
    let deadline = Instant::now() + STUCK_AFTER;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let result = async {
            let mut actors = lab.api().await?.actors;
            match actors
                .delete_actor(v1::DeleteActorRequest {
                    actor: Some(object_ref(actor)),
                    // A running actor's sandbox is stopped (the trial made it for this).
                    force: true,
                    purge_volumes: false,
                })
                .await
            {
                Ok(_) => Ok(()),
                Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
                Err(s) => Err(anyhow::anyhow!("{:?}: {}", s.code(), s.message())),
            }
        }
        .await;
        match result {
            Ok(()) => return (Ok(()), attempts),
            Err(e) if Instant::now() >= deadline => return (Err(e), attempts),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn object_ref(actor: &str) -> v1::ObjectRef {
    v1::ObjectRef {
        atespace: ATESPACE.into(),
        name: actor.into(),
    }
}

/// After a trial's kill: the actor must answer 200 again (resumed by its load client if the
/// operation left it SUSPENDED), and a killed component must be back before the next trial.
#[allow(clippy::too_many_arguments)]
async fn settle(
    lab: &Lab,
    load: &Load,
    actor: &str,
    target: Target,
    trial: usize,
    (killed, component): &(String, Option<Component>),
    outcome: &str,
    notes: &mut Vec<String>,
    failed: &mut Vec<String>,
) -> anyhow::Result<()> {
    let after = lab.clock.now();
    let answered = load
        .wait_answered_by(&[actor.to_string()], after, STUCK_AFTER)
        .await;
    let back = match answered {
        Ok(t) => format!("answered again {:.2} s later", (t - after).max(0.0)),
        Err(_) => {
            let state = lab.wait_state(actor, v1::ActorState::Running).await;
            failed.push(format!(
                "trial {trial} ({}): {actor} did not answer 200 within {} s ({state})",
                target.name(),
                STUCK_AFTER.as_secs()
            ));
            format!("STUCK ({state})")
        }
    };
    notes.push(format!(
        "trial {trial}: {actor}, {killed}; {outcome}; {back}"
    ));
    if let Some(component) = component {
        // `ate up` restarts what was killed; the next trial needs it.
        lab.component_pid(*component)
            .await
            .with_context(|| format!("{} did not come back", target.name()))?;
    }
    Ok(())
}

/// The number N of `worker-N`, the worker the api says runs `actor`.
async fn worker_of(lab: &Lab, actor: &str) -> Option<u32> {
    let a = get_actor(lab, actor).await?;
    worker_number(&a.worker_assignment?.worker_id)
}

/// Sets `actor`'s worker selector to the other worker of two (`ate.dev/worker=worker-N`, as
/// `ate up` labels them).
async fn pin_elsewhere(lab: &Lab, actor: &str) -> anyhow::Result<()> {
    let now = worker_of(lab, actor).await.unwrap_or(2);
    let other = if now == 1 { 2 } else { 1 };
    let c = lab.api().await?;
    c.actors
        .clone()
        .update_actor(v1::UpdateActorRequest {
            actor: Some(v1::ObjectRef {
                atespace: ATESPACE.into(),
                name: actor.into(),
            }),
            worker_selector: [("ate.dev/worker".to_string(), format!("worker-{other}"))].into(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{} ({:?})", s.message(), s.code()))?;
    Ok(())
}

async fn get_actor(lab: &Lab, actor: &str) -> Option<v1::Actor> {
    let c = lab.api().await.ok()?;
    c.actors
        .clone()
        .get_actor(v1::GetActorRequest {
            actor: Some(object_ref(actor)),
        })
        .await
        .ok()
        .map(tonic::Response::into_inner)
}

fn worker_number(id: &str) -> Option<u32> {
    id.strip_prefix("worker-")?.parse().ok()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_numbers_come_from_ate_up_worker_ids() {
        assert_eq!(worker_number("worker-2"), Some(2));
        assert_eq!(worker_number("w-2"), None);
    }

    #[test]
    fn kill_delays_stay_within_their_bounds() {
        for _ in 0..100 {
            assert!(Target::CriuDump.delay() <= Duration::from_millis(120));
            assert!(Target::Worker.delay() <= Duration::from_millis(500));
        }
    }
}
