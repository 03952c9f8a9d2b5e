//! `ate apply`: every document of a file checked before anything changes, then applied in order
//! (atespaces before templates), one line per object.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use ate_client::parse_documents;
use ate_core::Document;
use ate_core::template::TemplateSpec;
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
                let allow = a.spec.as_ref().map(|s| s.callers.allow.clone());
                if let Some(allow) = &allow {
                    ate_core::validate_callers_allow(allow)
                        .with_context(|| format!("document {i} ({})", a.metadata.name))?;
                }
                atespaces.push((a.metadata.name.clone(), allow));
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
    for (name, allow) in atespaces {
        let mut atespaces = c.atespaces.clone();
        let created = atespaces
            .create_atespace(v1::CreateAtespaceRequest {
                name: name.clone(),
                callers_allow: allow.clone().unwrap_or_default(),
            })
            .await;
        match (created, allow) {
            (Ok(_), _) => lines.push(format!("atespace/{name} created")),
            (Err(s), None) if s.code() == tonic::Code::AlreadyExists => {
                lines.push(format!("atespace/{name} unchanged"))
            }
            (Err(s), Some(allow)) if s.code() == tonic::Code::AlreadyExists => {
                // There already: its settings become the document's.
                let now = rpc(atespaces
                    .get_atespace(v1::GetAtespaceRequest { name: name.clone() })
                    .await)?;
                if now.callers_allow == allow {
                    lines.push(format!("atespace/{name} unchanged"));
                } else {
                    rpc(atespaces
                        .update_atespace(v1::UpdateAtespaceRequest {
                            name: name.clone(),
                            callers_allow: allow,
                        })
                        .await)
                    .with_context(|| format!("atespace {name}"))?;
                    lines.push(format!("atespace/{name} configured"));
                }
            }
            (Err(s), _) => return Err(anyhow::anyhow!("atespace {name}: {}", s.message())),
        }
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
