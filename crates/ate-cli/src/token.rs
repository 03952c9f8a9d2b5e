//! `ate token`: join tokens for machines that join the fleet (`ate up --role node --join … --token …`).

use std::process::ExitCode;
use std::time::Duration;

use ate_proto::v1;
use clap::Subcommand;

use crate::Format;
use crate::client::Clients;

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a join token and print it (shown once; it holds a secret).
    Create {
        /// How long the token may be used to join (at most 30 days).
        #[arg(long, default_value = "1h", value_parser = ate_router::config::parse_duration)]
        ttl: Duration,
        /// A note for `ate token list` (e.g. which machines it is for).
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List join tokens (ids, expiry, the nodes that joined with each; never the secrets).
    List,
    /// Delete (revoke) a join token by id. Nodes that joined with it keep their certificates.
    Delete { id: String },
}

pub async fn run(c: &Clients, cmd: TokenCmd, out: Format) -> anyhow::Result<ExitCode> {
    let mut join = c.join.clone();
    match cmd {
        TokenCmd::Create { ttl, description } => {
            let ttl_seconds = u32::try_from(ttl.as_secs())
                .map_err(|_| anyhow::anyhow!("--ttl {ttl:?} is too long (at most 30 days)"))?;
            if ttl_seconds == 0 {
                anyhow::bail!("--ttl must be at least 1s");
            }
            let created = rpc(join
                .create_join_token(v1::CreateJoinTokenRequest {
                    ttl_seconds,
                    description,
                })
                .await)?;
            match out {
                Format::Table => println!("{}", created.token),
                _ => print_doc(
                    &serde_json::json!({
                        "token": created.token,
                        "info": created.info.as_ref().map(info_json),
                    }),
                    out,
                )?,
            }
        }
        TokenCmd::List => {
            let list = rpc(join.list_join_tokens(v1::ListJoinTokensRequest {}).await)?;
            match out {
                Format::Table => {
                    let now = ate_core::clock::now_ms();
                    println!(
                        "{:<10} {:<22} {:<24} DESCRIPTION",
                        "ID", "EXPIRES", "USED BY"
                    );
                    for t in &list.tokens {
                        let expires = if t.expires_at_ms <= now {
                            "expired".to_string()
                        } else {
                            format!("in {}", human((t.expires_at_ms - now) / 1000))
                        };
                        let used = if t.used_by.is_empty() {
                            "-".to_string()
                        } else {
                            t.used_by.join(",")
                        };
                        println!(
                            "{:<10} {:<22} {:<24} {}",
                            t.id, expires, used, t.description
                        );
                    }
                }
                _ => print_doc(
                    &serde_json::Value::Array(list.tokens.iter().map(info_json).collect()),
                    out,
                )?,
            }
        }
        TokenCmd::Delete { id } => {
            rpc(join
                .delete_join_token(v1::DeleteJoinTokenRequest { id: id.clone() })
                .await)?;
            println!("token/{id} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn rpc<T>(r: Result<tonic::Response<T>, tonic::Status>) -> anyhow::Result<T> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| anyhow::anyhow!("{} ({:?})", s.message(), s.code()))
}

fn info_json(t: &v1::JoinTokenInfo) -> serde_json::Value {
    serde_json::json!({
        "id": t.id,
        "description": t.description,
        "createdAtMs": t.created_at_ms,
        "expiresAtMs": t.expires_at_ms,
        "usedBy": t.used_by,
    })
}

fn print_doc(v: &serde_json::Value, out: Format) -> anyhow::Result<()> {
    match out {
        Format::Yaml => print!("{}", serde_saphyr::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

/// `3h12m`, `45m`, `30s`.
fn human(secs: i64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m"),
        _ => format!("{h}h{m}m"),
    }
}
