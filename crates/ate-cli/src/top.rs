//! `ate top actors [-a A | -A]`: what each running actor uses now (CPU over its worker's last
//! 2 s window, its sandbox's memory, how long it has been active there, what it has open), most
//! CPU first — kubectl top's look. From the api's TopActors, which asks each node.

use std::process::ExitCode;

use ate_proto::v1;
use clap::Subcommand;

use crate::client::Clients;
use crate::render::Table;
use crate::verbs::Scope;

#[derive(Subcommand)]
pub enum TopCmd {
    /// Running actors with their CPU, memory and uptime.
    Actors {
        #[command(flatten)]
        scope: Scope,
    },
}

pub async fn run(c: &Clients, cmd: TopCmd) -> anyhow::Result<ExitCode> {
    let TopCmd::Actors { scope } = cmd;
    let reply = c
        .actors
        .clone()
        .top_actors(v1::TopActorsRequest {
            atespace: scope.filter(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{} ({:?})", s.message(), s.code()))?
        .into_inner();
    let now = ate_core::clock::now_ms();
    print!("{}", table(&reply.actors, now).render());
    if !reply.unreachable_workers.is_empty() {
        eprintln!(
            "warning: no answer about the actors of {}",
            reply.unreachable_workers.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn table(actors: &[v1::ActorUsage], now_ms: i64) -> Table {
    Table {
        header: vec![
            "ATESPACE", "NAME", "WORKER", "CPU", "MEMORY", "UPTIME", "OPEN", "IDLE",
        ],
        rows: actors
            .iter()
            .map(|a| {
                let (atespace, name) = a
                    .actor
                    .as_ref()
                    .map(|r| (r.atespace.clone(), r.name.clone()))
                    .unwrap_or_default();
                vec![
                    atespace,
                    name,
                    a.worker_id.clone(),
                    format!("{}m", a.cpu_millis),
                    memory(a.memory_bytes),
                    since(a.active_since_unix_ms, now_ms),
                    a.open_streams.to_string(),
                    since(a.last_activity_unix_ms, now_ms),
                ]
            })
            .collect(),
    }
}

/// Memory as kubectl top shows it: whole `Mi` (rounded), `Ki` below one `Mi`.
fn memory(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{}Mi", (bytes + (1 << 19)) >> 20)
    } else {
        format!("{}Ki", (bytes + (1 << 9)) >> 10)
    }
}

/// `3s`, `5m`, `2h`, `4d` since `then` (`-` when unknown).
pub(crate) fn since(then_ms: i64, now_ms: i64) -> String {
    if then_ms <= 0 {
        return "-".to_string();
    }
    let s = now_ms.saturating_sub(then_ms).max(0) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_like_kubectl_top() {
        let a = v1::ActorUsage {
            actor: Some(v1::ObjectRef {
                atespace: "ns".into(),
                name: "c".into(),
            }),
            worker_id: "worker-1".into(),
            cpu_millis: 1500,
            memory_bytes: (3 << 20) + 600_000,
            active_since_unix_ms: 1_000,
            open_streams: 2,
            last_activity_unix_ms: 0,
        };
        let t = table(&[a], 181_000);
        assert_eq!(
            t.rows,
            vec![vec!["ns", "c", "worker-1", "1500m", "4Mi", "3m", "2", "-"]]
        );
        assert_eq!(memory(5000), "5Ki");
        assert_eq!(since(0, 5), "-");
        assert_eq!(since(1, 90_001), "90s");
        assert_eq!(since(1, 7_200_001), "2h");
        assert_eq!(since(1, 172_800_001), "2d");
    }
}
