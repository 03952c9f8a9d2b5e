//! Views of api objects and their table / JSON / YAML rendering.

use ate_core::template::{Metadata, TemplateDocument, format_cpu, format_memory};
use ate_core::{ActorState, Document, DurableStatus, Fidelity, TemplateSpec};
use ate_proto::v1;
use serde::Serialize;

use crate::Format;

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ActorView {
    pub atespace: String,
    pub name: String,
    pub uid: String,
    pub template: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    pub generation: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_error: String,
}

impl From<&v1::Actor> for ActorView {
    fn from(a: &v1::Actor) -> Self {
        Self {
            atespace: a.atespace.clone(),
            name: a.name.clone(),
            uid: a.uid.clone(),
            template: a.template.clone(),
            state: ActorState::from_wire(a.state)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|| "ACTOR_STATE_UNSPECIFIED".into()),
            worker: a.worker_assignment.as_ref().map(|w| w.worker_id.clone()),
            addresses: a
                .worker_assignment
                .as_ref()
                .map(|w| w.addresses.clone())
                .unwrap_or_default(),
            generation: a.generation,
            last_error: a.last_error.clone(),
        }
    }
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AtespaceView {
    pub name: String,
    pub actors: u64,
    /// Atespaces whose actors may call this one's (`spec.callers.allow`).
    pub callers_allow: Vec<String>,
    /// `spec.quota` (0 in a field: no limit).
    pub quota: QuotaView,
    /// What its actors hold now (on a worker).
    pub usage: QuotaView,
}

#[derive(Debug, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct QuotaView {
    pub running_actors: u32,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
}

impl From<Option<&v1::AtespaceQuota>> for QuotaView {
    fn from(q: Option<&v1::AtespaceQuota>) -> Self {
        q.map_or_else(QuotaView::default, |q| QuotaView {
            running_actors: q.running_actors,
            cpu_millis: q.cpu_millis,
            memory_bytes: q.memory_bytes,
        })
    }
}

impl From<&v1::Atespace> for AtespaceView {
    fn from(a: &v1::Atespace) -> Self {
        Self {
            name: a.name.clone(),
            actors: a.actor_count,
            callers_allow: a.callers_allow.clone(),
            quota: a.quota.as_ref().into(),
            usage: a.usage.as_ref().into(),
        }
    }
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerView {
    pub id: String,
    pub node: String,
    pub status: String,
    pub addresses: Vec<String>,
    pub sandbox_class: String,
    pub can_restore_memory: bool,
    /// Restore capabilities (`memory:criu`, `userns:off`, …): what the scheduler matches
    /// against what an actor's newest generation needs.
    pub capabilities: Vec<String>,
    pub slots_used: u32,
    pub slots: u32,
    /// CPU booked by its actors' templates (what admission counts).
    pub cpu_millis_used: u32,
    /// CPU admission books against: the machine's × the worker's overcommit.
    pub cpu_millis: u32,
    /// The machine's CPU before overcommit (0: not reported).
    pub cpu_physical_millis: u32,
    /// CPU its actors really used lately (from their cgroups, as of the last heartbeat).
    pub cpu_usage_millis: u32,
    pub memory_bytes_used: u64,
    pub memory_bytes: u64,
    pub epoch: u64,
}

impl From<&v1::Worker> for WorkerView {
    fn from(w: &v1::Worker) -> Self {
        let cap = w.capacity.unwrap_or_default();
        let used = w.used.unwrap_or_default();
        Self {
            id: w.id.clone(),
            node: w.node.clone(),
            status: w.status.clone(),
            addresses: w.addresses.clone(),
            sandbox_class: w.sandbox_class.clone(),
            can_restore_memory: w.can_restore_memory,
            capabilities: w.capabilities.clone(),
            slots_used: used.actor_slots,
            slots: cap.actor_slots,
            cpu_millis_used: used.cpu_millis,
            cpu_millis: cap.cpu_millis,
            cpu_physical_millis: w.cpu_physical_millis,
            cpu_usage_millis: w.cpu_usage_millis,
            memory_bytes_used: used.memory_bytes,
            memory_bytes: cap.memory_bytes,
            epoch: w.epoch,
        }
    }
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AlarmView {
    pub actor: String,
    /// RFC 3339.
    pub due: String,
    pub path: String,
    pub attempts: u32,
    /// RFC 3339 of the next try ("" once failed).
    pub next_attempt: String,
    pub last_error: String,
    pub failed: bool,
}

/// Unix ms as RFC 3339 (seconds), "" for a time before 1970.
fn rfc3339_ms(ms: i64) -> String {
    u64::try_from(ms)
        .map(|ms| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        })
        .unwrap_or_default()
}

impl From<&v1::Alarm> for AlarmView {
    fn from(a: &v1::Alarm) -> Self {
        Self {
            actor: a
                .actor
                .as_ref()
                .map(|r| format!("{}/{}", r.atespace, r.name))
                .unwrap_or_default(),
            due: rfc3339_ms(a.due_unix_ms),
            path: a.path.clone(),
            attempts: a.attempts,
            next_attempt: if a.failed {
                String::new()
            } else {
                rfc3339_ms(a.next_attempt_unix_ms)
            },
            last_error: a.last_error.clone(),
            failed: a.failed,
        }
    }
}

pub fn alarms_table(rows: &[AlarmView]) -> Table {
    Table {
        header: vec!["ACTOR", "DUE", "PATH", "TRIES", "STATUS", "LAST ERROR"],
        rows: rows
            .iter()
            .map(|a| {
                let status = if a.failed {
                    "FAILED".to_string()
                } else if a.attempts > 0 {
                    format!("retry at {}", a.next_attempt)
                } else {
                    "pending".to_string()
                };
                vec![
                    a.actor.clone(),
                    a.due.clone(),
                    a.path.clone(),
                    a.attempts.to_string(),
                    status,
                    if a.last_error.is_empty() {
                        "-".to_string()
                    } else {
                        a.last_error.clone()
                    },
                ]
            })
            .collect(),
    }
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TagView {
    pub atespace: String,
    pub name: String,
    pub actor: String,
    pub generation: u64,
    pub fidelity: String,
    pub uuid: String,
}

impl From<&v1::Tag> for TagView {
    fn from(t: &v1::Tag) -> Self {
        let s = t.snapshot.clone().unwrap_or_default();
        let actor = s
            .actor
            .as_ref()
            .map(|a| format!("{}/{}", a.atespace, a.name))
            .unwrap_or_default();
        Self {
            atespace: t.atespace.clone(),
            name: t.name.clone(),
            actor,
            generation: s.generation,
            fidelity: Fidelity::from_wire(s.fidelity)
                .map(|f| f.short().to_string())
                .unwrap_or_default(),
            uuid: s.uuid.clone(),
        }
    }
}

/// One of an actor's generations (`ate get generations`).
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GenerationView {
    pub generation: u64,
    /// RFC 3339, UTC.
    pub created: String,
    pub fidelity: String,
    pub uuid: String,
    /// The node that wrote it (and keeps its node-local copy, if it still has one).
    pub node: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_path: String,
    /// The node-local copy can be restored now.
    pub local_usable: bool,
    /// COMPLETED, PENDING or FAILED; absent: no durable copy was asked for.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub durable: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub durable_uri: String,
    pub size_bytes: u64,
    /// `intact`, or `damaged` (no copy left intact), or `damaged (… copy intact)`.
    pub status: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_damage: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub durable_damage: String,
    /// A revert chose an older generation: no resume restores this one.
    pub skipped: bool,
    /// The next resume restores this one.
    pub next: bool,
    /// Why its fidelity is lower than the template asked for, if it is.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl From<&v1::Generation> for GenerationView {
    fn from(g: &v1::Generation) -> Self {
        let s = g.snapshot.clone().unwrap_or_default();
        let durable_status = DurableStatus::from_wire(s.durable_status);
        let durable = durable_status
            .map(|d| d.as_str().trim_start_matches("DURABLE_STATUS_").to_string())
            .unwrap_or_default();
        let local_intact = !s.local_path.is_empty() && g.local_damage.is_empty();
        let durable_intact =
            durable_status == Some(DurableStatus::Completed) && g.durable_damage.is_empty();
        let status = match (g.local_damage.is_empty(), g.durable_damage.is_empty()) {
            (true, true) => "intact",
            _ if local_intact => "damaged (node-local copy intact)",
            _ if durable_intact => "damaged (durable copy intact)",
            _ => "damaged",
        };
        let created = u64::try_from(s.create_time_unix_ms)
            .map(|ms| {
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                humantime::format_rfc3339_seconds(at).to_string()
            })
            .unwrap_or_default();
        Self {
            generation: s.generation,
            created,
            fidelity: Fidelity::from_wire(s.fidelity)
                .map(|f| f.short().to_string())
                .unwrap_or_default(),
            uuid: s.uuid,
            node: s.node,
            local_path: s.local_path,
            local_usable: g.local_usable,
            durable,
            durable_uri: s.durable_uri,
            size_bytes: s.size_bytes,
            status: status.to_string(),
            local_damage: g.local_damage.clone(),
            durable_damage: g.durable_damage.clone(),
            skipped: g.skipped,
            next: g.next,
            reason: s.reason,
        }
    }
}

/// A template as the document `ate apply -f` accepts.
pub fn template_document(t: &v1::ActorTemplate) -> anyhow::Result<Document> {
    let spec = t.spec.as_ref().map(ate_proto::spec_from_wire).transpose()?;
    let spec =
        spec.ok_or_else(|| anyhow::anyhow!("template {}/{} has no spec", t.namespace, t.name))?;
    Ok(Document::ActorTemplate(Box::new(TemplateDocument {
        api_version: ate_core::template::API_VERSION.to_string(),
        metadata: Metadata {
            namespace: t.namespace.clone(),
            name: t.name.clone(),
        },
        spec: spec.to_document(),
    })))
}

/// Columns and rows of a table.
pub struct Table {
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// kubectl-style: left-aligned columns separated by three spaces, no trailing spaces.
    pub fn render(&self) -> String {
        let widths = self.widths();
        let mut out = Self::line(
            &widths,
            &self
                .header
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>(),
        );
        for row in &self.rows {
            out.push_str(&Self::line(&widths, row));
        }
        out
    }

    /// Each column's width: its widest cell or header.
    pub fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        widths
    }

    /// One row laid out in `widths` (a watch prints later rows in the first batch's widths,
    /// as kubectl does).
    pub fn line(widths: &[usize], cells: &[String]) -> String {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let w = widths.get(i).copied().unwrap_or(0);
                s.push_str(&format!("{cell:<w$}   "));
            }
        }
        s.trim_end().to_string() + "\n"
    }
}

pub fn actors_table(actors: &[ActorView]) -> Table {
    Table {
        header: vec![
            "ATESPACE",
            "NAME",
            "STATE",
            "TEMPLATE",
            "WORKER",
            "GENERATION",
        ],
        rows: actors
            .iter()
            .map(|a| {
                vec![
                    a.atespace.clone(),
                    a.name.clone(),
                    a.state.trim_start_matches("ACTOR_STATE_").to_string(),
                    a.template.clone(),
                    a.worker.clone().unwrap_or_else(|| "-".into()),
                    a.generation.to_string(),
                ]
            })
            .collect(),
    }
}

/// `-o wide`: [`actors_table`] plus LAST ERROR, cut to one short line (`-o json` has it whole).
pub fn actors_wide_table(actors: &[ActorView]) -> Table {
    let mut t = actors_table(actors);
    t.header.push("LAST ERROR");
    for (row, a) in t.rows.iter_mut().zip(actors) {
        row.push(short_error(&a.last_error));
    }
    t
}

/// Longest LAST ERROR cell, in characters: room for the first line of the usual reasons.
const LAST_ERROR_CHARS: usize = 80;

/// The first line of an error, whitespace collapsed, at most [`LAST_ERROR_CHARS`]; `…` when
/// something was left out (more lines, such as the log tail an exit reason carries, or a longer
/// line). `-` when there is none.
pub fn short_error(error: &str) -> String {
    let mut lines = error.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else {
        return "-".into();
    };
    let first = first.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut = first.chars().count() > LAST_ERROR_CHARS;
    let mut s: String = if cut {
        first.chars().take(LAST_ERROR_CHARS - 1).collect()
    } else {
        first
    };
    if cut || lines.next().is_some() {
        s.push('…');
    }
    s
}

pub fn atespaces_table(rows: &[AtespaceView]) -> Table {
    Table {
        header: vec![
            "NAME",
            "ACTORS",
            "RUNNING",
            "CPU",
            "MEMORY",
            "CALLERS ALLOWED",
        ],
        rows: rows
            .iter()
            .map(|a| {
                let allowed = if a.callers_allow.is_empty() {
                    "-".to_string()
                } else {
                    a.callers_allow.join(",")
                };
                // In use, then `/quota` when there is one (kubectl's `used/hard`).
                let of = |used: String, limit: u64, show: String| {
                    if limit == 0 {
                        used
                    } else {
                        format!("{used}/{show}")
                    }
                };
                let (q, u) = (&a.quota, &a.usage);
                vec![
                    a.name.clone(),
                    a.actors.to_string(),
                    of(
                        u.running_actors.to_string(),
                        q.running_actors.into(),
                        q.running_actors.to_string(),
                    ),
                    of(
                        format_cpu(u.cpu_millis),
                        q.cpu_millis.into(),
                        format_cpu(q.cpu_millis),
                    ),
                    of(
                        format_memory(u.memory_bytes),
                        q.memory_bytes,
                        format_memory(q.memory_bytes),
                    ),
                    allowed,
                ]
            })
            .collect(),
    }
}

pub fn templates_table(rows: &[(String, String, TemplateSpec)]) -> Table {
    Table {
        header: vec![
            "ATESPACE",
            "NAME",
            "IMAGE",
            "CPU",
            "MEMORY",
            "FIDELITY",
            "IDLE-TIMEOUT",
        ],
        rows: rows
            .iter()
            .map(|(ns, name, s)| {
                vec![
                    ns.clone(),
                    name.clone(),
                    s.containers
                        .first()
                        .map(|c| c.image.clone())
                        .unwrap_or_default(),
                    format_cpu(s.resources.cpu_millis),
                    format_memory(s.resources.memory_bytes),
                    s.fidelity.short().to_string(),
                    if s.idle_timeout_seconds == 0 {
                        "-".into()
                    } else {
                        format!("{}s", s.idle_timeout_seconds)
                    },
                ]
            })
            .collect(),
    }
}

pub fn workers_table(rows: &[WorkerView]) -> Table {
    Table {
        header: vec![
            "ID", "NODE", "STATUS", "ADDRESS", "SLOTS", "CPU REQ", "CPU USED", "CPU CAP", "MEMORY",
            "EPOCH",
        ],
        rows: rows
            .iter()
            .map(|w| {
                vec![
                    w.id.clone(),
                    w.node.clone(),
                    w.status.clone(),
                    w.addresses.first().cloned().unwrap_or_default(),
                    format!("{}/{}", w.slots_used, w.slots),
                    format_cpu(w.cpu_millis_used),
                    format_cpu(w.cpu_usage_millis),
                    cpu_capacity(w.cpu_millis, w.cpu_physical_millis),
                    format!(
                        "{}/{}",
                        format_memory(w.memory_bytes_used),
                        format_memory(w.memory_bytes)
                    ),
                    w.epoch.to_string(),
                ]
            })
            .collect(),
    }
}

/// A worker's CPU capacity with its overcommit: `64 (2×32)` (the machine's 2 cores booked 32
/// times over), or just the capacity when nothing is overcommitted or the worker did not say.
fn cpu_capacity(capacity: u32, physical: u32) -> String {
    if physical == 0 || physical == capacity {
        return format_cpu(capacity);
    }
    let factor = f64::from(capacity) / f64::from(physical);
    let factor = format!("{factor:.2}");
    let factor = factor.trim_end_matches('0').trim_end_matches('.');
    format!(
        "{} ({}×{factor})",
        format_cpu(capacity),
        format_cpu(physical)
    )
}

/// `ate get generations`: where each generation is kept (LOCAL: the node with its node-local
/// copy; DURABLE: the durable copy's status), whether it is intact, which one the next resume
/// restores (NEXT) and, in REASON, what was found damaged (or why it is skipped).
pub fn generations_table(rows: &[GenerationView]) -> Table {
    Table {
        header: vec![
            "GENERATION",
            "CREATED",
            "FIDELITY",
            "LOCAL",
            "DURABLE",
            "STATUS",
            "NEXT",
            "REASON",
        ],
        rows: rows
            .iter()
            .map(|g| {
                let local = match (g.local_path.is_empty(), g.local_damage.is_empty()) {
                    (true, _) => "-".to_string(),
                    (false, false) => format!("{} (damaged)", g.node),
                    (false, true) if g.local_usable => g.node.clone(),
                    (false, true) => format!("{} (unreachable)", g.node),
                };
                let durable = match (g.durable.is_empty(), g.durable_damage.is_empty()) {
                    (true, _) => "-".to_string(),
                    (false, false) => format!("{} (damaged)", g.durable),
                    (false, true) => g.durable.clone(),
                };
                let mut status = g.status.clone();
                if g.skipped {
                    status.push_str(", skipped");
                }
                let mut reasons = Vec::new();
                if !g.local_damage.is_empty() {
                    reasons.push(format!("node-local: {}", g.local_damage));
                }
                if !g.durable_damage.is_empty() {
                    reasons.push(format!("durable: {}", g.durable_damage));
                }
                if reasons.is_empty() && g.skipped {
                    reasons.push("a revert chose an older generation".to_string());
                }
                if reasons.is_empty() {
                    reasons.push(g.reason.clone());
                }
                vec![
                    g.generation.to_string(),
                    g.created.clone(),
                    g.fidelity.clone(),
                    local,
                    durable,
                    status,
                    if g.next { "*".into() } else { String::new() },
                    short_error(&reasons.join("; ")),
                ]
            })
            .collect(),
    }
}

pub fn tags_table(rows: &[TagView]) -> Table {
    Table {
        header: vec!["ATESPACE", "NAME", "ACTOR", "GENERATION", "FIDELITY"],
        rows: rows
            .iter()
            .map(|t| {
                vec![
                    t.atespace.clone(),
                    t.name.clone(),
                    t.actor.clone(),
                    t.generation.to_string(),
                    t.fidelity.clone(),
                ]
            })
            .collect(),
    }
}

/// Renders a list: a table, a JSON array, or a YAML sequence.
pub fn render_list<T: Serialize>(
    items: &[T],
    table: impl FnOnce(&[T]) -> Table,
    format: Format,
) -> anyhow::Result<String> {
    Ok(match format {
        // Lists without a wider view show their usual table.
        Format::Table | Format::Wide => table(items).render(),
        Format::Json => serde_json::to_string_pretty(items)? + "\n",
        Format::Yaml => serde_saphyr::to_string(&items)?,
    })
}

/// Renders YAML documents separated by `---` (what `apply -f` reads back).
pub fn render_documents(docs: &[Document], format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(docs)? + "\n",
        _ => {
            let mut out = String::new();
            for (i, d) in docs.iter().enumerate() {
                if i > 0 {
                    out.push_str("---\n");
                }
                out.push_str(&serde_saphyr::to_string(d)?);
            }
            out
        }
    })
}

#[cfg(test)]
mod tests;
