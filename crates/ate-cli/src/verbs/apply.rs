//! `ate apply`: every document of a file checked before anything changes, then applied in order
//! (atespaces before templates), one line per object.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use ate_client::parse_documents;
use ate_core::Document;
use ate_core::template::{Quota, TemplateSpec};
use ate_proto::v1;

use super::rpc;
use crate::Format;
use crate::client::Clients;

pub async fn apply(c: &Clients, file: &Path, out: Format) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let docs = parse_documents(&text).with_context(|| format!("in {}", file.display()))?;
    // Validate everything before changing anything, so a bad file applies nothing.
    let mut atespaces = Vec::new();
    let mut templates = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        match d {
            Document::Atespace(a) => {
                check_api_version(i, &a.api_version)?;
                ate_core::validate_label("metadata.name", &a.metadata.name)
                    .with_context(|| format!("document {i}"))?;
                // No `spec`: the atespace's settings are left as they are (a template file's
                // Atespace document only makes sure it exists).
                let settings = match &a.spec {
                    None => None,
                    Some(spec) => {
                        let what = || format!("document {i} ({})", a.metadata.name);
                        ate_core::validate_callers_allow(&spec.callers.allow).with_context(what)?;
                        let quota = match &spec.quota {
                            Some(q) => q.parse().with_context(what)?,
                            None => Quota::default(),
                        };
                        Some((spec.callers.allow.clone(), quota))
                    }
                };
                atespaces.push((a.metadata.name.clone(), settings));
            }
            Document::ActorTemplate(t) => {
                check_api_version(i, &t.api_version)?;
                ate_core::validate_label("metadata.namespace", &t.metadata.namespace)
                    .with_context(|| format!("document {i}"))?;
                ate_core::validate_label("metadata.name", &t.metadata.name)
                    .with_context(|| format!("document {i}"))?;
                let spec = TemplateSpec::from_document(&t.spec).with_context(|| {
                    format!(
                        "document {i} ({}/{})",
                        t.metadata.namespace, t.metadata.name
                    )
                })?;
                templates.push((t.metadata.namespace.clone(), t.metadata.name.clone(), spec));
            }
        }
    }
    let mut lines = Vec::new();
    for (name, settings) in atespaces {
        let word = apply_atespace(c, &name, settings)
            .await
            .with_context(|| format!("atespace {name}"))?;
        lines.push(format!("atespace/{name} {word}"));
    }
    for (ns, name, spec) in templates {
        let word = apply_template(c, &ns, &name, &spec)
            .await
            .with_context(|| format!("template {ns}/{name}"))?;
        lines.push(format!("actortemplate/{ns}/{name} {word}"));
    }
    if out.is_table() {
        for l in lines {
            println!("{l}");
        }
    } else {
        println!("{}", serde_json::to_string_pretty(&lines)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Creates the atespace or, when the document has a `spec`, makes its settings (callers allowed,
/// quota) the document's; says `created`, `configured` or `unchanged`. The quota is set only when
/// it differs (SetAtespaceQuota is for admins: a tenant applying its unchanged document works).
async fn apply_atespace(
    c: &Clients,
    name: &str,
    settings: Option<(Vec<String>, Quota)>,
) -> anyhow::Result<&'static str> {
    let mut atespaces = c.atespaces.clone();
    let set_quota = |quota: Quota| {
        let mut atespaces = c.atespaces.clone();
        let name = name.to_string();
        async move {
            rpc(atespaces
                .set_atespace_quota(v1::SetAtespaceQuotaRequest {
                    name,
                    quota: Some(quota_to_wire(quota)),
                })
                .await)
        }
    };
    let created = atespaces
        .create_atespace(v1::CreateAtespaceRequest {
            name: name.to_string(),
            callers_allow: settings.as_ref().map(|s| s.0.clone()).unwrap_or_default(),
        })
        .await;
    match (created, settings) {
        (Ok(_), Some((_, quota))) if quota != Quota::default() => {
            set_quota(quota).await?;
            Ok("created")
        }
        (Ok(_), _) => Ok("created"),
        (Err(s), None) if s.code() == tonic::Code::AlreadyExists => Ok("unchanged"),
        (Err(s), Some((allow, quota))) if s.code() == tonic::Code::AlreadyExists => {
            // There already: its settings become the document's.
            let now = rpc(atespaces
                .get_atespace(v1::GetAtespaceRequest {
                    name: name.to_string(),
                })
                .await)?;
            let mut word = "unchanged";
            if now.callers_allow != allow {
                rpc(atespaces
                    .update_atespace(v1::UpdateAtespaceRequest {
                        name: name.to_string(),
                        callers_allow: allow,
                    })
                    .await)?;
                word = "configured";
            }
            if now.quota.unwrap_or_default() != quota_to_wire(quota) {
                set_quota(quota).await?;
                word = "configured";
            }
            Ok(word)
        }
        (Err(s), _) => Err(anyhow::anyhow!("{}", s.message())),
    }
}

fn quota_to_wire(q: Quota) -> v1::AtespaceQuota {
    v1::AtespaceQuota {
        running_actors: q.running_actors,
        cpu_millis: q.cpu_millis,
        memory_bytes: q.memory_bytes,
    }
}

/// Applies one template and says what it did, from a Get just before: `created` (there was
/// none), `unchanged` (the same spec: nothing is written) or `configured`. A concurrent apply
/// can make the word stale (it describes the Get's view), never an error: a Get that fails
/// otherwise than NotFound just leaves the Apply to report the problem.
async fn apply_template(
    c: &Clients,
    ns: &str,
    name: &str,
    spec: &TemplateSpec,
) -> anyhow::Result<&'static str> {
    let before = c
        .templates
        .clone()
        .get_template(v1::GetTemplateRequest {
            namespace: ns.to_string(),
            name: name.to_string(),
        })
        .await;
    let word = match before {
        Err(s) if s.code() == tonic::Code::NotFound => "created",
        Ok(t) if same_spec(t.get_ref(), spec) => return Ok("unchanged"),
        _ => "configured",
    };
    let template = v1::ActorTemplate {
        namespace: ns.to_string(),
        name: name.to_string(),
        spec: Some(ate_proto::spec_to_wire(spec)),
        ..Default::default()
    };
    rpc(c
        .templates
        .clone()
        .apply_template(v1::ApplyTemplateRequest {
            template: Some(template),
        })
        .await)?;
    Ok(word)
}

/// Whether a stored template already has `spec` (compared validated, so wire details such as
/// map order do not count as a change).
fn same_spec(stored: &v1::ActorTemplate, spec: &TemplateSpec) -> bool {
    stored
        .spec
        .as_ref()
        .and_then(|w| ate_proto::spec_from_wire(w).ok())
        .is_some_and(|s| &s == spec)
}

fn check_api_version(i: usize, v: &str) -> anyhow::Result<()> {
    if v != ate_core::template::API_VERSION {
        anyhow::bail!(
            "document {i}: apiVersion {v:?} is not {}",
            ate_core::template::API_VERSION
        );
    }
    Ok(())
}
