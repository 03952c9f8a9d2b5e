//! DNS-1123 label validation, the `<atespace>/<name>` actor reference and the
//! `<namespace>/<name>` template reference.

use std::fmt;

/// A value that failed validation; `field` names where it came from (e.g. `spec.containers[0].image`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {message}")]
pub struct ValidationError {
    pub field: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;

/// Checks `value` is a DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn validate_label(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(ValidationError::new(
            field,
            format!(
                "{:?} is longer than {MAX_LABEL_LEN} characters",
                truncate(value)
            ),
        ));
    }
    if !is_label(value) {
        return Err(ValidationError::new(
            field,
            format!(
                "{:?} is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)",
                truncate(value)
            ),
        ));
    }
    Ok(())
}

/// True when `value` is a DNS-1123 label. Allocation-free; used on the router's hot path.
pub fn is_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_LABEL_LEN {
        return false;
    }
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    alnum(bytes[0]) && alnum(bytes[bytes.len() - 1]) && bytes.iter().all(|&b| alnum(b) || b == b'-')
}

fn truncate(value: &str) -> String {
    value.chars().take(80).collect()
}

/// An actor's address: `<atespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorRef {
    pub atespace: String,
    pub name: String,
}

impl ActorRef {
    pub fn new(atespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            atespace: atespace.into(),
            name: name.into(),
        }
    }

    /// Parses `<atespace>/<name>` with both halves DNS-1123 labels.
    pub fn parse(value: &str) -> Result<Self, ValidationError> {
        let (atespace, name) = value.split_once('/').ok_or_else(|| {
            ValidationError::new(
                "actor",
                format!("{:?} is not of the form <atespace>/<name>", truncate(value)),
            )
        })?;
        validate_label("atespace", atespace)?;
        validate_label("actor name", name)?;
        Ok(Self::new(atespace, name))
    }

    /// Validates both halves.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_label("atespace", &self.atespace)?;
        validate_label("actor name", &self.name)
    }

    /// Key of the lease that serialises work on this actor.
    pub fn lease_key(&self) -> String {
        format!("lease:actor:{}:{}", self.atespace, self.name)
    }
}

impl fmt::Display for ActorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.atespace, self.name)
    }
}

/// A template's address: `<namespace>/<name>`, the namespace being the atespace the template
/// lives in. Shown (and stored) as `ns/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateRef {
    pub namespace: String,
    pub name: String,
}

impl TemplateRef {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `<namespace>/<name>` with both halves DNS-1123 labels; errors name `field`.
    pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
        let (namespace, name) = parse_namespaced(field, value)?;
        Ok(Self { namespace, name })
    }
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Parses `<namespace>/<name>` of a template (or tag) reference.
pub fn parse_namespaced(field: &str, value: &str) -> Result<(String, String), ValidationError> {
    let (ns, name) = value.split_once('/').ok_or_else(|| {
        ValidationError::new(
            field,
            format!(
                "{:?} is not of the form <namespace>/<name>",
                truncate(value)
            ),
        )
    })?;
    validate_label(&format!("{field} namespace"), ns)?;
    validate_label(&format!("{field} name"), name)?;
    Ok((ns.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "a1", "ate-demo", "0", &"x".repeat(63)] {
            assert!(validate_label("f", ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é", &"x".repeat(64)] {
            let err = validate_label("f", bad).unwrap_err();
            assert_eq!(err.field, "f");
        }
    }

    #[test]
    fn actor_ref() {
        let r = ActorRef::parse("ate-demo/counter-1").unwrap();
        assert_eq!(r.to_string(), "ate-demo/counter-1");
        assert_eq!(r.lease_key(), "lease:actor:ate-demo:counter-1");
        assert!(ActorRef::parse("nohalf").is_err());
        assert!(ActorRef::parse("a/b/c").is_err());
        assert!(ActorRef::parse("/b").is_err());
        assert_eq!(ActorRef::parse("a/B").unwrap_err().field, "actor name");
    }

    #[test]
    fn template_ref() {
        let t = TemplateRef::parse("template", "team-a/web").unwrap();
        assert_eq!(t, TemplateRef::new("team-a", "web"));
        assert_eq!(t.to_string(), "team-a/web");
        let e = TemplateRef::parse("template", "no-slash").unwrap_err();
        assert_eq!(e.field, "template");
        assert!(e.message.contains("<namespace>/<name>"), "{e}");
        assert_eq!(
            TemplateRef::parse("template", "a/B").unwrap_err().field,
            "template name"
        );
    }
}
