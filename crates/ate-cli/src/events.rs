//! `ate get events [NAME] [-a A | -A] [--watch]` and `ate get actors --watch`: the actors'
//! recorded changes and why (kubectl's `get events`), and actors as they change (kubectl's
//! `get pods --watch`): a table first, then a row per change in the same columns, until
//! interrupted. With `-o json` a watch prints one JSON object per line, with `-o yaml` one
//! document per change.

use std::process::ExitCode;

use ate_core::ActorState;
use ate_proto::v1;
use serde::Serialize;

use crate::Format;
use crate::client::Clients;
use crate::render::{self, ActorView, Table};
use crate::verbs::Scope;

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub id: i64,
    /// RFC 3339 with milliseconds.
    pub time: String,
    #[serde(skip)]
    pub time_ms: i64,
    pub atespace: String,
    pub name: String,
    pub uid: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub from: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub to: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub worker: String,
    pub generation: u64,
    pub message: String,
}

impl From<&v1::ActorEvent> for EventView {
    fn from(e: &v1::ActorEvent) -> Self {
        let state = |n: i32| ActorState::from_wire(n).map_or(String::new(), |s| s.short().into());
        let (atespace, name) = e
            .actor
            .as_ref()
            .map(|r| (r.atespace.clone(), r.name.clone()))
            .unwrap_or_default();
        Self {
            id: e.id,
            time: rfc3339_millis(e.time_unix_ms),
            time_ms: e.time_unix_ms,
            atespace,
            name,
            uid: e.uid.clone(),
            kind: e.r#type.clone(),
            reason: e.reason.clone(),
            from: state(e.from_state),
            to: state(e.to_state),
            worker: e.worker_id.clone(),
            generation: e.generation,
            message: e.message.clone(),
        }
    }
}

/// kubectl's columns: LAST SEEN, TYPE, REASON, the object, MESSAGE.
pub fn events_table(events: &[EventView], now_ms: i64) -> Table {
    Table {
        header: vec!["LAST SEEN", "TYPE", "REASON", "ACTOR", "MESSAGE"],
        rows: events
            .iter()
            .map(|e| {
                vec![
                    crate::top::since(e.time_ms, now_ms),
                    e.kind.clone(),
                    e.reason.clone(),
                    format!("{}/{}", e.atespace, e.name),
                    e.message.clone(),
                ]
            })
            .collect(),
    }
}

/// Unix ms as RFC 3339 with milliseconds ("" before 1970): events of one second stay apart.
fn rfc3339_millis(ms: i64) -> String {
    u64::try_from(ms)
        .map(|ms| {
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        })
        .unwrap_or_default()
}

fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", s.message(), s.code())
}

/// One item of a watch in `out`'s form: a row in `widths` for a table, a line of JSON, a YAML
/// document.
fn print_item<T: Serialize>(item: &T, row: Vec<String>, widths: &[usize], out: Format) {
    let text = match out {
        Format::Table | Format::Wide => Table::line(widths, &row),
        Format::Json => serde_json::to_string(item).map_or_else(|e| format!("{e}\n"), |j| j + "\n"),
        Format::Yaml => {
            serde_saphyr::to_string(item).map_or_else(|e| format!("{e}\n"), |y| format!("---\n{y}"))
        }
    };
    print!("{text}");
}

pub async fn get_events(
    c: &Clients,
    name: Option<String>,
    scope: Scope,
    watch: bool,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let atespace = scope.filter();
    if name.is_some() && atespace.is_empty() {
        anyhow::bail!("the events of one actor need -a ATESPACE");
    }
    let name = name.unwrap_or_default();
    let listed = c
        .actors
        .clone()
        .list_events(v1::ListEventsRequest {
            atespace: atespace.clone(),
            name: name.clone(),
            after_id: 0,
            limit: 0,
        })
        .await
        .map_err(status)?
        .into_inner();
    let views: Vec<EventView> = listed.events.iter().map(EventView::from).collect();
    let now = ate_core::clock::now_ms();
    let table = events_table(&views, now);
    if !watch {
        print!(
            "{}",
            render::render_list(&views, |v| events_table(v, now), out)?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let widths = table.widths();
    if out.is_table() {
        print!("{}", table.render());
    } else {
        for (view, row) in views.iter().zip(table.rows) {
            print_item(view, row, &widths, out);
        }
    }
    let mut stream = c
        .actors
        .clone()
        .watch_events(v1::WatchEventsRequest {
            atespace,
            name,
            after_id: listed
                .newest_id
                .max(listed.events.last().map_or(0, |e| e.id)),
        })
        .await
        .map_err(status)?
        .into_inner();
    while let Some(e) = stream.message().await.map_err(status)? {
        let view = EventView::from(&e);
        let now = ate_core::clock::now_ms();
        let row = events_table(std::slice::from_ref(&view), now)
            .rows
            .remove(0);
        print_item(&view, row, &widths, out);
    }
    anyhow::bail!("the api ended the watch")
}

pub async fn watch_actors(c: &Clients, scope: Scope, out: Format) -> anyhow::Result<ExitCode> {
    let mut stream = c
        .actors
        .clone()
        .watch_actors(v1::WatchActorsRequest {
            atespace: scope.filter(),
        })
        .await
        .map_err(status)?
        .into_inner();
    let table_of: fn(&[ActorView]) -> Table = if out == Format::Wide {
        render::actors_wide_table
    } else {
        render::actors_table
    };
    let mut initial = Vec::new();
    let mut widths = None;
    while let Some(change) = stream.message().await.map_err(status)? {
        if change.synced {
            let views: Vec<ActorView> = initial.iter().map(ActorView::from).collect();
            let table = table_of(&views);
            widths = Some(table.widths());
            match out {
                Format::Table | Format::Wide => print!("{}", table.render()),
                _ => {
                    let w = table.widths();
                    for (view, row) in views.iter().zip(table.rows) {
                        print_item(view, row, &w, out);
                    }
                }
            }
            continue;
        }
        let Some(actor) = change.actor else {
            continue;
        };
        match &widths {
            None => initial.push(actor),
            Some(w) => {
                let mut view = ActorView::from(&actor);
                if change.deleted {
                    view.state = "DELETED".to_string();
                }
                let row = table_of(std::slice::from_ref(&view)).rows.remove(0);
                print_item(&view, row, w, out);
            }
        }
    }
    anyhow::bail!("the api ended the watch")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_like_kubectl_get_events() {
        let e = v1::ActorEvent {
            id: 7,
            time_unix_ms: 1_000,
            actor: Some(v1::ObjectRef {
                atespace: "ns".into(),
                name: "c".into(),
            }),
            uid: "u".into(),
            r#type: "Normal".into(),
            reason: "Suspended".into(),
            from_state: ActorState::Suspending.wire(),
            to_state: ActorState::Suspended.wire(),
            worker_id: "worker-1".into(),
            generation: 3,
            message: "idle; generation 3 (memory) written on node n1".into(),
        };
        let view = EventView::from(&e);
        assert_eq!(
            (view.from.as_str(), view.to.as_str()),
            ("SUSPENDING", "SUSPENDED")
        );
        let table = events_table(&[view], 61_000).render();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "LAST SEEN   TYPE     REASON      ACTOR   MESSAGE");
        assert_eq!(
            lines[1],
            "60s         Normal   Suspended   ns/c    idle; generation 3 (memory) written on node n1"
        );
    }
}
