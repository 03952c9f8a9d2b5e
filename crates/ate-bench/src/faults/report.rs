//! One row per fault, the suite's table and its JSON.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::json;

use super::checks::SlotMismatch;
use super::lab::Lab;
use super::load::{CountEvent, Sample, count_events, longest_gap};
use super::{ATESPACE, Fault, FaultsArgs};

/// Reported target for the longest unavailability (marked, not failed).
const UNAVAILABILITY_TARGET_S: f64 = 10.0;

/// One fault's results.
pub(super) struct Row {
    fault: Fault,
    /// `kill-up-overlap`: seconds between the kill and the new `ate up`.
    pub(super) delay: Option<f64>,
    started: f64,
    injected: f64,
    recovered: Option<f64>,
    /// End of the window: the recovery plus `OBSERVE`.
    window_end: f64,
    pub(super) checked: f64,
    requests: usize,
    answers: BTreeMap<u16, usize>,
    unavailable: f64,
    unavailable_actor: String,
    lost: Vec<CountEvent>,
    /// Counts that went back to an actor's previous generation where the system said so (a
    /// suspend that lost its sandbox: `lastError` and the suspend's answer report it), which
    /// the kill-inside faults allow; not a state lost.
    rolled_back: Vec<CountEvent>,
    replies_lost: Vec<CountEvent>,
    pub(super) double: Vec<(String, Vec<String>)>,
    pub(super) double_seen: Vec<(String, Vec<String>)>,
    pub(super) slots: Vec<SlotMismatch>,
    pub(super) orphans: Vec<String>,
    /// Workers marked GONE while their sandboxes ran (during the window or at the checks).
    pub(super) gone: Vec<String>,
    pub(super) fault_errors: Vec<String>,
    pub(super) notes: Vec<String>,
}

impl Row {
    pub(super) fn new(
        fault: Fault,
        started: f64,
        injected: f64,
        recovered: Option<f64>,
        checked: f64,
    ) -> Row {
        Row {
            fault,
            delay: None,
            started,
            injected,
            recovered,
            window_end: checked,
            checked,
            requests: 0,
            answers: BTreeMap::new(),
            unavailable: 0.0,
            unavailable_actor: String::new(),
            lost: Vec::new(),
            rolled_back: Vec::new(),
            replies_lost: Vec::new(),
            double: Vec::new(),
            double_seen: Vec::new(),
            slots: Vec::new(),
            orphans: Vec::new(),
            gone: Vec::new(),
            fault_errors: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The fault's name, with the trial's delay for `kill-up-overlap`.
    fn label(&self) -> String {
        match self.delay {
            Some(d) => format!("{} {d:.2}s", self.fault.name()),
            None => self.fault.name().to_string(),
        }
    }

    /// Some actor did not answer 200 again within the recovery timeout.
    fn stuck(&self) -> bool {
        self.recovered.is_none()
    }

    /// Requests and answers of the window `[started, window_end]`, the longest unavailability,
    /// and the count events since the previous fault's checks (`segment_start`), so that none
    /// falls between two rows.
    pub(super) fn tally(
        &mut self,
        history: &[Vec<Sample>],
        actors: &[String],
        started: f64,
        window_end: f64,
        segment_start: f64,
    ) {
        self.window_end = window_end;
        for (actor, samples) in actors.iter().zip(history) {
            for s in samples
                .iter()
                .filter(|s| s.start >= started && s.start <= window_end)
            {
                self.requests += 1;
                *self.answers.entry(s.status).or_default() += 1;
            }
            let gap = longest_gap(samples, started, window_end);
            if gap > self.unavailable {
                self.unavailable = gap;
                self.unavailable_actor = actor.clone();
            }
            let in_segment = |e: &CountEvent| e.at > segment_start && e.at <= self.checked;
            let (lost, skipped) = count_events(actor, samples);
            self.lost.extend(lost.into_iter().filter(in_segment));
            self.replies_lost
                .extend(skipped.into_iter().filter(in_segment));
        }
    }

    /// Moves the state-lost events that fall in a reported rollback (actor, from, to) to the
    /// rolled-back list.
    pub(super) fn excuse_reported_rollbacks(&mut self, rollbacks: &[(String, f64, f64)]) {
        let (excused, lost): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.lost).into_iter().partition(|e| {
                rollbacks
                    .iter()
                    .any(|(a, from, to)| *a == e.actor && e.at >= *from && e.at <= *to)
            });
        self.lost = lost;
        self.rolled_back = excused;
    }

    /// Every target: no state lost, no actor running on two workers (after recovery or at any
    /// sample during the window), slots equal to real containers, no orphan, no worker marked
    /// gone while its sandboxes ran, every actor answering again.
    fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.double.is_empty()
            && self.double_seen.is_empty()
            && self.slots.is_empty()
            && self.orphans.is_empty()
            && self.gone.is_empty()
            && !self.stuck()
            && self.fault_errors.is_empty()
    }

    /// `200:812 502:2 err:1` (err = transport error or timeout).
    fn answers_text(&self) -> String {
        self.answers
            .iter()
            .map(|(status, n)| format!("{}:{n}", status_key(*status)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(super) fn summary(&self) -> String {
        format!(
            "{}: {} requests ({}), longest unavailability {:.2} s, states lost {}, double \
             activations {}, slot mismatches {}, orphans {}, gone with sandboxes {}{}{}",
            if self.passed() { "pass" } else { "FAIL" },
            self.requests,
            self.answers_text(),
            self.unavailable,
            self.lost.len(),
            self.double.len(),
            self.slots.len(),
            self.orphans.len(),
            self.gone.len(),
            if self.stuck() { ", NOT RECOVERED" } else { "" },
            if self.fault_errors.is_empty() {
                String::new()
            } else {
                format!("; {}", self.fault_errors.join("; "))
            }
        )
    }

    fn json(&self) -> serde_json::Value {
        let events = |v: &[CountEvent]| {
            v.iter()
                .map(|e| json!({"actor": e.actor, "at_s": round2(e.at), "previous": e.previous, "got": e.got}))
                .collect::<Vec<_>>()
        };
        let pairs = |v: &[(String, Vec<String>)]| {
            v.iter()
                .map(|(a, ws)| json!({"actor": a, "workers": ws}))
                .collect::<Vec<_>>()
        };
        json!({
            "fault": self.fault.name(),
            "delay_s": self.delay.map(round2),
            "started_s": round2(self.started),
            "injected_s": round2(self.injected),
            "recovered_s": self.recovered.map(round2),
            "window_end_s": round2(self.window_end),
            "checked_s": round2(self.checked),
            "requests": self.requests,
            "answers": self.answers.iter().map(|(s, n)| (status_key(*s), json!(n))).collect::<serde_json::Map<_, _>>(),
            "longest_unavailable_s": round2(self.unavailable),
            "longest_unavailable_actor": self.unavailable_actor,
            "over_unavailability_target": self.unavailable > UNAVAILABILITY_TARGET_S,
            "states_lost": self.lost.len(),
            "states_lost_events": events(&self.lost),
            "rolled_back_reported": self.rolled_back.len(),
            "rolled_back_events": events(&self.rolled_back),
            "replies_lost": self.replies_lost.len(),
            "replies_lost_events": events(&self.replies_lost),
            "double_activations": self.double.len(),
            "double_activation_actors": pairs(&self.double),
            "double_activations_sampled_during_window": pairs(&self.double_seen),
            "slot_mismatches": self.slots.len(),
            "slot_mismatch_workers": self.slots.iter().map(|m| json!({"worker": m.worker, "used": m.used, "running": m.running})).collect::<Vec<_>>(),
            "orphans": self.orphans.len(),
            "orphan_details": self.orphans,
            "gone_with_sandboxes": self.gone.len(),
            "gone_with_sandboxes_details": self.gone,
            "stuck": self.stuck(),
            "fault_errors": self.fault_errors,
            "notes": self.notes,
            "pass": self.passed(),
        })
    }
}

/// An HTTP status as text; `err` for a transport error or timeout (status 0).
fn status_key(status: u16) -> String {
    match status {
        0 => "err".into(),
        s => s.to_string(),
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Every fault's row.
pub(super) struct Suite {
    pub(super) rows: Vec<Row>,
    pub(super) seconds: f64,
    /// Seed of the `kill-up-overlap` delays.
    pub(super) seed: u64,
    /// Why the suite stopped before its last fault (the system died), failing it.
    pub(super) aborted: Option<String>,
    pub(super) store: &'static str,
}

impl Suite {
    pub(super) fn passed(&self) -> bool {
        self.aborted.is_none() && self.rows.iter().all(Row::passed)
    }

    pub(super) fn table(&self) -> String {
        let mut out = format!(
            "{:<22} {:>8}  {:<34} {:>10} {:>5} {:>6} {:>5} {:>7} {:>4}  {}\n",
            "fault",
            "requests",
            "answers",
            "unavail s",
            "lost",
            "double",
            "slots",
            "orphans",
            "gone",
            "result"
        );
        let mut notes = Vec::new();
        for r in &self.rows {
            let mark = if r.unavailable > UNAVAILABILITY_TARGET_S {
                "*"
            } else {
                " "
            };
            out.push_str(&format!(
                "{:<22} {:>8}  {:<34} {:>9.2}{mark} {:>5} {:>6} {:>5} {:>7} {:>4}  {}\n",
                r.label(),
                r.requests,
                r.answers_text(),
                r.unavailable,
                r.lost.len(),
                r.double.len().max(r.double_seen.len()),
                r.slots.len(),
                r.orphans.len(),
                r.gone.len(),
                if r.passed() { "pass" } else { "FAIL" }
            ));
            notes.extend(row_notes(r));
        }
        if self
            .rows
            .iter()
            .any(|r| r.unavailable > UNAVAILABILITY_TARGET_S)
        {
            out.push_str(&format!(
                "* longest unavailability over the {UNAVAILABILITY_TARGET_S:.0} s target (reported, not failed)\n"
            ));
        }
        for n in notes {
            out.push_str(&format!("  {n}\n"));
        }
        if let Some(t) = self.trials() {
            out.push_str(&format!("  {}\n", t.line()));
        }
        if let Some(why) = &self.aborted {
            out.push_str(&format!("  ABORTED: {why}\n"));
        }
        out.push_str(&format!(
            "{} in {:.0} s on {}\n",
            if self.passed() {
                "all targets met"
            } else {
                "TARGETS MISSED"
            },
            self.seconds,
            self.store
        ));
        out
    }

    pub(super) fn json(&self, a: &FaultsArgs, lab: &Lab) -> serde_json::Value {
        json!({
            "kind": "faults",
            "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs(),
            "actors": a.actors,
            "workers": a.workers,
            "store": self.store,
            "state_dir": lab.state.display().to_string(),
            "seconds": round2(self.seconds),
            "kill_up_overlap_seed": self.seed,
            "kill_up_overlap_trials": self.trials().map(|t| t.json()),
            "unavailability_target_s": UNAVAILABILITY_TARGET_S,
            "pass": self.passed(),
            "aborted": self.aborted,
            "faults": self.rows.iter().map(Row::json).collect::<Vec<_>>(),
        })
    }
}

/// The `kill-up-overlap` trials of a suite, summed up.
pub(super) struct Trials {
    trials: usize,
    delays: Vec<f64>,
    /// Trials with a state lost, a double activation, a stuck actor, a worker gone with its
    /// sandboxes, an orphan; each counted once per trial.
    lost: usize,
    double: usize,
    stuck: usize,
    gone: usize,
    leftovers: usize,
    passed: usize,
    /// Longest unavailability of an actor: median and worst over the trials.
    unavailable_median: f64,
    unavailable_max: f64,
    /// Answers of every trial's window by status.
    answers: BTreeMap<u16, usize>,
}

impl Trials {
    fn line(&self) -> String {
        format!(
            "kill-up-overlap: {} trials (delays {}): passed {}, with states lost {}, double \
             activations {}, stuck {}, gone with sandboxes {}, leftovers {}; longest \
             unavailability median {:.2} s, worst {:.2} s; answers {}",
            self.trials,
            self.delays
                .iter()
                .map(|d| format!("{d:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
            self.passed,
            self.lost,
            self.double,
            self.stuck,
            self.gone,
            self.leftovers,
            self.unavailable_median,
            self.unavailable_max,
            self.answers
                .iter()
                .map(|(s, n)| format!("{}:{n}", status_key(*s)))
                .collect::<Vec<_>>()
                .join(" ")
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "trials": self.trials,
            "delays_s": self.delays.iter().copied().map(round2).collect::<Vec<_>>(),
            "passed": self.passed,
            "with_states_lost": self.lost,
            "with_double_activations": self.double,
            "stuck": self.stuck,
            "with_gone_workers": self.gone,
            "with_leftovers": self.leftovers,
            "longest_unavailable_median_s": round2(self.unavailable_median),
            "longest_unavailable_max_s": round2(self.unavailable_max),
            "answers": self.answers.iter().map(|(s, n)| (status_key(*s), json!(n))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

impl Suite {
    /// The `kill-up-overlap` rows summed up, if the suite ran any.
    fn trials(&self) -> Option<Trials> {
        let rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.fault == Fault::KillUpOverlap)
            .collect();
        if rows.is_empty() {
            return None;
        }
        let count = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count();
        let mut gaps: Vec<f64> = rows.iter().map(|r| r.unavailable).collect();
        gaps.sort_by(f64::total_cmp);
        let mut answers = BTreeMap::new();
        for r in &rows {
            for (s, n) in &r.answers {
                *answers.entry(*s).or_default() += n;
            }
        }
        Some(Trials {
            trials: rows.len(),
            delays: rows.iter().filter_map(|r| r.delay).collect(),
            lost: count(&|r| !r.lost.is_empty()),
            double: count(&|r| !r.double.is_empty() || !r.double_seen.is_empty()),
            stuck: count(&|r| r.stuck()),
            gone: count(&|r| !r.gone.is_empty()),
            leftovers: count(&|r| !r.orphans.is_empty()),
            passed: count(&|r| r.passed()),
            unavailable_median: gaps[gaps.len() / 2],
            unavailable_max: gaps.last().copied().unwrap_or_default(),
            answers,
        })
    }
}

/// The detail lines under the table for one row: what failed, and the notes.
fn row_notes(r: &Row) -> Vec<String> {
    let f = r.label();
    let mut out = Vec::new();
    for e in &r.lost {
        out.push(format!(
            "{f}: STATE LOST {ATESPACE}/{} at {:.2} s: count {} after {}",
            e.actor, e.at, e.got, e.previous
        ));
    }
    for e in &r.rolled_back {
        out.push(format!(
            "{f}: rolled back (reported) {ATESPACE}/{} at {:.2} s: count {} after {}",
            e.actor, e.at, e.got, e.previous
        ));
    }
    for (a, ws) in &r.double {
        out.push(format!(
            "{f}: DOUBLE ACTIVATION {ATESPACE}/{a} running on {}",
            ws.join(", ")
        ));
    }
    for (a, ws) in &r.double_seen {
        out.push(format!(
            "{f}: {ATESPACE}/{a} was seen running on {} during the window",
            ws.join(", ")
        ));
    }
    for m in &r.slots {
        out.push(format!(
            "{f}: SLOTS {}: api says {} used, runc runs {}",
            m.worker, m.used, m.running
        ));
    }
    for o in &r.orphans {
        out.push(format!("{f}: ORPHAN {o}"));
    }
    for g in &r.gone {
        out.push(format!("{f}: GONE {g}"));
    }
    for e in &r.fault_errors {
        out.push(format!("{f}: FAILED {e}"));
    }
    if !r.replies_lost.is_empty() {
        out.push(format!(
            "{f}: {} replies lost (executed, answer never came back)",
            r.replies_lost.len()
        ));
    }
    out.extend(r.notes.iter().map(|n| format!("{f}: {n}")));
    out
}

pub(super) fn write_json(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("==> wrote {}", path.display());
    Ok(())
}
