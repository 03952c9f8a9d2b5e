//! Client verbs: each parses its arguments, calls one api RPC (or a few), and prints the result.

use std::process::ExitCode;

use ate_core::{ActorRef, SuspendMode};
use ate_proto::v1;
use clap::{Args, Subcommand};

use crate::Format;
use crate::client::Clients;
use crate::render::{
    self, ActorView, AlarmView, AtespaceView, GenerationView, TagView, WorkerView,
};

mod apply;
pub use apply::apply;

#[derive(Subcommand)]
pub enum CreateCmd {
    /// Create an atespace.
    Atespace { name: String },
    /// Create an actor (SUSPENDED until its first request).
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Template as NAMESPACE/NAME.
        #[arg(short = 't', long)]
        template: String,
        /// Worker label selector, k=v[,k=v].
        #[arg(long)]
        selector: Option<String>,
    },
    /// Tag an actor's snapshot generation.
    Tag {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Source actor as ATESPACE/NAME.
        #[arg(long)]
        actor: String,
        /// Generation (default: the newest).
        #[arg(long, default_value_t = 0)]
        generation: u64,
    },
}

// Which atespaces a `get` lists: one (-a) or all (-A, also what no flag gives). (A plain comment:
// a doc comment would become the about text of the commands that flatten it.)
#[derive(Args, Debug)]
pub struct Scope {
    /// Only this atespace.
    #[arg(short = 'a', long)]
    pub atespace: Option<String>,
    /// Every atespace (also what you get without -a).
    #[arg(short = 'A', long = "all-atespaces", conflicts_with = "atespace")]
    pub all: bool,
}

impl Scope {
    /// The list requests' filter: empty means every atespace.
    pub fn filter(&self) -> String {
        match (&self.atespace, self.all) {
            (Some(a), false) => a.clone(),
            _ => String::new(),
        }
    }
}

// How a long list is read (kubectl's chunking): pages of --chunk-size printed as they come, at
// most --limit items, starting after --continue's token.
#[derive(Args, Debug)]
pub struct Chunks {
    /// Items per request; the table is printed a page at a time, in the first page's widths.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub chunk_size: u32,
    /// Print at most this many; when more are left, the token to go on with is printed to stderr.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Start after the item this token names (from an earlier `--limit`).
    #[arg(long = "continue")]
    pub continue_token: Option<String>,
}

#[derive(Subcommand)]
pub enum GetCmd {
    /// Actors, or one actor by NAME (with -a). `-o wide` adds LAST ERROR.
    Actors {
        name: Option<String>,
        #[command(flatten)]
        scope: Scope,
        /// After the list, print each actor again as it changes, until interrupted.
        #[arg(short = 'w', long, conflicts_with = "name")]
        watch: bool,
        #[command(flatten)]
        chunks: Chunks,
    },
    /// What happened to actors and why (each change of state: resumed, suspended idle,
    /// crashed, reverted …), oldest first; of one actor with NAME and -a. Kept for the api's
    /// --event-retention (24 h by default).
    Events {
        /// Only this actor's events (needs -a).
        name: Option<String>,
        #[command(flatten)]
        scope: Scope,
        /// After the list, print each new event as it is recorded, until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Atespaces: how many actors each holds, how many run and what they book, against the
    /// atespace's quota where it has one (`in use/quota`).
    Atespaces,
    /// ActorTemplates (`-o yaml` prints documents `apply -f` takes back); one with NAME and -a.
    Templates {
        /// Only this template (needs -a).
        name: Option<String>,
        #[command(flatten)]
        scope: Scope,
    },
    /// Workers: status, slots, CPU and memory used of their capacity.
    Workers,
    /// Tags: names for an actor's snapshot generation.
    Tags {
        #[command(flatten)]
        scope: Scope,
    },
    /// Actors' alarms: when each is due, the path it POSTs to, failed tries (a FAILED alarm
    /// gave up after its last try and is not delivered again).
    Alarms {
        #[command(flatten)]
        scope: Scope,
    },
    /// An actor's generations, newest first: where each is kept, whether it is intact or was
    /// found damaged (and why), and which one the next resume restores (NEXT).
    Generations {
        #[command(subcommand)]
        of: ActorCmd,
    },
}

#[derive(Subcommand)]
pub enum ActorCmd {
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
    },
}

#[derive(Subcommand)]
pub enum RevertCmd {
    /// Return a CRASHED actor to SUSPENDED: its next resume restores the newest generation
    /// that was not found damaged (or, with --generation, the one named).
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// The generation the next resume restores (see `ate get generations actor NAME -a
        /// ATESPACE`); newer ones are kept but skipped. Also for a SUSPENDED actor.
        #[arg(long)]
        generation: Option<u64>,
    },
}

#[derive(Subcommand)]
pub enum UpdateCmd {
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Worker label selector, k=v[,k=v]; empty clears it.
        #[arg(long)]
        selector: String,
    },
}

#[derive(Subcommand)]
pub enum SuspendCmd {
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Return only after the snapshot's durable copy is uploaded.
        #[arg(long)]
        durable: bool,
        /// How long requests in flight may take to finish before the suspend cuts them (new
        /// ones wait and resume the actor afterwards; WebSockets get a close frame, 1001).
        /// Default: the worker's `--suspend-grace` (5s).
        #[arg(long, value_parser = ate_router::config::parse_duration)]
        grace: Option<std::time::Duration>,
    },
}

#[derive(Subcommand)]
pub enum DeleteCmd {
    Actor {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
        /// Also delete a running actor: its sandbox is stopped without a snapshot, so what it
        /// did since its last suspend is lost.
        #[arg(long)]
        force: bool,
        /// Also delete the actor's external volume directories (`spec.volumes[].external`),
        /// which a delete keeps otherwise.
        #[arg(long)]
        purge_volumes: bool,
    },
    Atespace {
        name: String,
    },
    /// Template as NAMESPACE/NAME.
    Template {
        name: String,
    },
    Tag {
        name: String,
        #[arg(short = 'a', long)]
        atespace: String,
    },
}

/// gRPC errors print their message and make the command exit non-zero.
fn rpc<T>(r: Result<tonic::Response<T>, tonic::Status>) -> anyhow::Result<T> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| anyhow::anyhow!("{} ({:?})", s.message(), s.code()))
}

fn obj(atespace: &str, name: &str) -> Option<v1::ObjectRef> {
    Some(v1::ObjectRef {
        atespace: atespace.to_string(),
        name: name.to_string(),
    })
}

/// `ate get actors` of a whole atespace (or all): page by page, so a million actors start
/// printing at once and never sit in memory together (a table only; JSON and YAML are one
/// document, read whole).
async fn list_actors(
    c: &Clients,
    atespace: &str,
    chunks: &Chunks,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let mut page_token = chunks.continue_token.clone().unwrap_or_default();
    let mut left = chunks.limit.unwrap_or(u64::MAX);
    let mut all = Vec::new();
    let mut widths: Option<Vec<usize>> = None;
    let table = if out == Format::Wide {
        render::actors_wide_table
    } else {
        render::actors_table
    };
    let mut stdout = std::io::stdout().lock();
    loop {
        let size = u64::from(chunks.chunk_size).min(left);
        let page = rpc(c
            .actors
            .clone()
            .list_actors(v1::ListActorsRequest {
                atespace: atespace.to_string(),
                page_size: u32::try_from(size).unwrap_or(chunks.chunk_size),
                page_token,
            })
            .await)?;
        left = left.saturating_sub(page.actors.len() as u64);
        if out.is_table() {
            let views: Vec<ActorView> = page.actors.iter().map(ActorView::from).collect();
            let t = table(&views);
            use std::io::Write as _;
            match &widths {
                None => {
                    write!(stdout, "{}", t.render())?;
                    widths = Some(t.widths());
                }
                Some(w) => {
                    for row in &t.rows {
                        write!(stdout, "{}", render::Table::line(w, row))?;
                    }
                }
            }
        } else {
            all.extend(page.actors);
        }
        page_token = page.next_page_token;
        if page_token.is_empty() {
            break;
        }
        if left == 0 {
            eprintln!("more actors: go on with --continue {page_token}");
            break;
        }
    }
    if out.is_table() {
        return Ok(ExitCode::SUCCESS);
    }
    print_actors(&all, out)
}

fn print_actors(actors: &[v1::Actor], out: Format) -> anyhow::Result<ExitCode> {
    let views: Vec<ActorView> = actors.iter().map(ActorView::from).collect();
    let table = if out == Format::Wide {
        render::actors_wide_table
    } else {
        render::actors_table
    };
    print!("{}", render::render_list(&views, table, out)?);
    Ok(ExitCode::SUCCESS)
}

pub async fn create(c: &Clients, cmd: CreateCmd, out: Format) -> anyhow::Result<ExitCode> {
    match cmd {
        CreateCmd::Atespace { name } => {
            let a = rpc(c
                .atespaces
                .clone()
                .create_atespace(v1::CreateAtespaceRequest {
                    name,
                    callers_allow: Vec::new(),
                })
                .await)?;
            print!(
                "{}",
                render::render_list(&[AtespaceView::from(&a)], render::atespaces_table, out)?
            );
        }
        CreateCmd::Actor {
            name,
            atespace,
            template,
            selector,
        } => {
            let worker_selector = match selector {
                Some(s) => ate_core::selector::parse("--selector", &s)?
                    .into_iter()
                    .collect(),
                None => Default::default(),
            };
            let a = rpc(c
                .actors
                .clone()
                .create_actor(v1::CreateActorRequest {
                    atespace,
                    name,
                    template,
                    worker_selector,
                })
                .await)?;
            return print_actors(&[a], out);
        }
        CreateCmd::Tag {
            name,
            atespace,
            actor,
            generation,
        } => {
            let source = ActorRef::parse(&actor)?;
            let t = rpc(c
                .tags
                .clone()
                .create_tag(v1::CreateTagRequest {
                    atespace,
                    name,
                    actor: obj(&source.atespace, &source.name),
                    generation,
                })
                .await)?;
            print!(
                "{}",
                render::render_list(&[TagView::from(&t)], render::tags_table, out)?
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn get(c: &Clients, cmd: GetCmd, out: Format) -> anyhow::Result<ExitCode> {
    match cmd {
        GetCmd::Events { name, scope, watch } => {
            crate::events::get_events(c, name, scope, watch, out).await
        }
        GetCmd::Actors {
            scope, watch: true, ..
        } => crate::events::watch_actors(c, scope, out).await,
        GetCmd::Actors {
            name,
            scope,
            chunks,
            ..
        } => {
            if let Some(name) = name {
                let atespace = scope
                    .atespace
                    .ok_or_else(|| anyhow::anyhow!("getting one actor needs -a ATESPACE"))?;
                let a = rpc(c
                    .actors
                    .clone()
                    .get_actor(v1::GetActorRequest {
                        actor: obj(&atespace, &name),
                    })
                    .await)?;
                return print_actors(&[a], out);
            }
            list_actors(c, &scope.filter(), &chunks, out).await
        }
        GetCmd::Atespaces => {
            let list = rpc(c
                .atespaces
                .clone()
                .list_atespaces(v1::ListAtespacesRequest {})
                .await)?;
            let views: Vec<AtespaceView> = list.atespaces.iter().map(AtespaceView::from).collect();
            print!(
                "{}",
                render::render_list(&views, render::atespaces_table, out)?
            );
            Ok(ExitCode::SUCCESS)
        }
        GetCmd::Templates { name, scope } => {
            let list = match name {
                Some(name) => {
                    let namespace = scope
                        .atespace
                        .ok_or_else(|| anyhow::anyhow!("getting one template needs -a ATESPACE"))?;
                    let one = rpc(c
                        .templates
                        .clone()
                        .get_template(v1::GetTemplateRequest { namespace, name })
                        .await)?;
                    v1::ListTemplatesResponse {
                        templates: vec![one],
                    }
                }
                None => rpc(c
                    .templates
                    .clone()
                    .list_templates(v1::ListTemplatesRequest {
                        namespace: scope.filter(),
                    })
                    .await)?,
            };
            if out.is_table() {
                let rows = list
                    .templates
                    .iter()
                    .map(|t| {
                        Ok((
                            t.namespace.clone(),
                            t.name.clone(),
                            ate_proto::spec_from_wire(&t.spec.clone().unwrap_or_default())?,
                        ))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                print!("{}", render::templates_table(&rows).render());
            } else {
                let docs = list
                    .templates
                    .iter()
                    .map(render::template_document)
                    .collect::<anyhow::Result<Vec<_>>>()?;
                print!("{}", render::render_documents(&docs, out)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        GetCmd::Workers => {
            let list = rpc(c
                .fleet
                .clone()
                .list_workers(v1::ListWorkersRequest {})
                .await)?;
            let views: Vec<WorkerView> = list.workers.iter().map(WorkerView::from).collect();
            print!(
                "{}",
                render::render_list(&views, render::workers_table, out)?
            );
            Ok(ExitCode::SUCCESS)
        }
        GetCmd::Generations {
            of: ActorCmd::Actor { name, atespace },
        } => {
            let list = rpc(c
                .actors
                .clone()
                .list_generations(v1::ListGenerationsRequest {
                    actor: obj(&atespace, &name),
                })
                .await)?;
            if list.generations.is_empty() && out.is_table() {
                println!("actor {atespace}/{name} has no generation yet");
                return Ok(ExitCode::SUCCESS);
            }
            let views: Vec<GenerationView> =
                list.generations.iter().map(GenerationView::from).collect();
            print!(
                "{}",
                render::render_list(&views, render::generations_table, out)?
            );
            Ok(ExitCode::SUCCESS)
        }
        GetCmd::Alarms { scope } => {
            let list = rpc(c
                .alarms
                .clone()
                .list_alarms(v1::ListAlarmsRequest {
                    atespace: scope.filter(),
                })
                .await)?;
            let views: Vec<AlarmView> = list.alarms.iter().map(AlarmView::from).collect();
            if views.is_empty() && out.is_table() {
                println!("no alarms");
                return Ok(ExitCode::SUCCESS);
            }
            print!(
                "{}",
                render::render_list(&views, render::alarms_table, out)?
            );
            Ok(ExitCode::SUCCESS)
        }
        GetCmd::Tags { scope } => {
            let list = rpc(c
                .tags
                .clone()
                .list_tags(v1::ListTagsRequest {
                    atespace: scope.filter(),
                })
                .await)?;
            let views: Vec<TagView> = list.tags.iter().map(TagView::from).collect();
            print!("{}", render::render_list(&views, render::tags_table, out)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub async fn update(c: &Clients, cmd: UpdateCmd, out: Format) -> anyhow::Result<ExitCode> {
    let UpdateCmd::Actor {
        name,
        atespace,
        selector,
    } = cmd;
    let worker_selector = ate_core::selector::parse("--selector", &selector)?
        .into_iter()
        .collect();
    let a = rpc(c
        .actors
        .clone()
        .update_actor(v1::UpdateActorRequest {
            actor: obj(&atespace, &name),
            worker_selector,
        })
        .await)?;
    print_actors(&[a], out)
}

pub async fn resume(c: &Clients, cmd: ActorCmd, out: Format) -> anyhow::Result<ExitCode> {
    let ActorCmd::Actor { name, atespace } = cmd;
    let reply = rpc(c
        .actors
        .clone()
        .resume_actor(v1::ResumeActorRequest {
            actor: obj(&atespace, &name),
        })
        .await)?;
    let actor = reply
        .actor
        .ok_or_else(|| anyhow::anyhow!("api returned no actor"))?;
    print_actors(&[actor], out)
}

pub async fn suspend(c: &Clients, cmd: SuspendCmd, out: Format) -> anyhow::Result<ExitCode> {
    let SuspendCmd::Actor {
        name,
        atespace,
        durable,
        grace,
    } = cmd;
    let grace_ms = match grace {
        None => 0,
        Some(g) if g.is_zero() => anyhow::bail!("--grace must be at least 1ms"),
        Some(g) => u32::try_from(g.as_millis())
            .map_err(|_| anyhow::anyhow!("--grace {g:?} is too long (at most 10m)"))?,
    };
    let mode = if durable {
        SuspendMode::Durable
    } else {
        SuspendMode::Async
    };
    let a = rpc(c
        .actors
        .clone()
        .suspend_actor(v1::SuspendActorRequest {
            actor: obj(&atespace, &name),
            mode: mode.wire(),
            grace_ms,
            reason: String::new(),
        })
        .await)?;
    // A suspend that succeeded carries its generation's reason as lastError, which is only
    // set when it captured less than the template asked for (snapshots.onMemoryFailure).
    if !a.last_error.is_empty() {
        eprintln!("warning: {}/{}: {}", a.atespace, a.name, a.last_error);
    }
    print_actors(&[a], out)
}

pub async fn revert(c: &Clients, cmd: RevertCmd, out: Format) -> anyhow::Result<ExitCode> {
    let RevertCmd::Actor {
        name,
        atespace,
        generation,
    } = cmd;
    // 0 on the wire means "no choice": refused here rather than taken as one.
    if generation == Some(0) {
        anyhow::bail!("--generation must be at least 1 (generations are numbered from 1)");
    }
    let a = rpc(c
        .actors
        .clone()
        .revert_actor(v1::RevertActorRequest {
            actor: obj(&atespace, &name),
            generation: generation.unwrap_or(0),
        })
        .await)?;
    print_actors(&[a], out)
}

pub async fn delete(c: &Clients, cmd: DeleteCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        DeleteCmd::Actor {
            name,
            atespace,
            force,
            purge_volumes,
        } => {
            let reply = rpc(c
                .actors
                .clone()
                .delete_actor(v1::DeleteActorRequest {
                    actor: obj(&atespace, &name),
                    force,
                    purge_volumes,
                })
                .await)?;
            if reply.stopped {
                println!(
                    "actor/{atespace}/{name} deleted (it was running: stopped without a snapshot)"
                );
            } else {
                println!("actor/{atespace}/{name} deleted");
            }
            if purge_volumes {
                println!(
                    "external volume directories purged: {}",
                    reply.volumes_purged
                );
            }
        }
        DeleteCmd::Atespace { name } => {
            rpc(c
                .atespaces
                .clone()
                .delete_atespace(v1::DeleteAtespaceRequest { name: name.clone() })
                .await)?;
            println!("atespace/{name} deleted");
        }
        DeleteCmd::Template { name } => {
            let (namespace, tname) = ate_core::names::parse_namespaced("template", &name)?;
            rpc(c
                .templates
                .clone()
                .delete_template(v1::DeleteTemplateRequest {
                    namespace,
                    name: tname,
                })
                .await)?;
            println!("actortemplate/{name} deleted");
        }
        DeleteCmd::Tag { name, atespace } => {
            rpc(c
                .tags
                .clone()
                .delete_tag(v1::DeleteTagRequest {
                    atespace: atespace.clone(),
                    name: name.clone(),
                })
                .await)?;
            println!("tag/{atespace}/{name} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}
