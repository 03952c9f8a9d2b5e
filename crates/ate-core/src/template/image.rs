//! Image references: the registry grammar the workers' client parses, and `oci-layout:`.

use crate::names::ValidationError;

/// Accepts `oci-layout:<dir>[:<tag>]` and registry references (`[host/]repo[:tag][@sha256:<hex>]`).
pub fn validate_image(field: &str, image: &str) -> Result<(), ValidationError> {
    if image.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if image.len() > 1024 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("{image:?} is not an image reference"),
        ));
    }
    if let Some(rest) = image.strip_prefix("oci-layout:") {
        if !rest.starts_with('/') {
            return Err(ValidationError::new(
                field,
                format!("{image:?}: oci-layout needs an absolute directory"),
            ));
        }
        return Ok(());
    }
    let bad = |why: &str| {
        ValidationError::new(
            field,
            format!(
                "{image:?} is not an image reference ({why}); use host[:port]/repo[:tag], \
                 host[:port]/repo@sha256:<hex> or oci-layout:/dir[:tag]"
            ),
        )
    };
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(ValidationError::new(
                field,
                format!("{image:?} has a malformed sha256 digest"),
            ));
        }
    }
    let ok_chars = name_tag
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._/:".contains(&b));
    if name_tag.is_empty() || !ok_chars {
        return Err(bad("lower-case letters, digits and -._/: only"));
    }
    // The grammar the workers' registry client parses (distribution's reference regexp), so a
    // reference that passes here is never refused at pull time for its form. A ':' after the
    // last '/' starts the tag; otherwise it is a registry port.
    let (name, tag) = match name_tag.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (name_tag, None),
    };
    if let Some(t) = tag {
        let first_ok = t
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !first_ok || t.len() > 128 {
            return Err(bad(
                "a tag is 1-128 of [a-z0-9_.-], not starting with '.' or '-'",
            ));
        }
    }
    let parts: Vec<&str> = name.split('/').collect();
    let path_ok = |from: usize| parts[from..].iter().all(|c| is_path_component(c));
    let with_registry = parts.len() > 1 && is_registry(parts[0]) && path_ok(1);
    if !with_registry && !path_ok(0) {
        return Err(bad(
            "repository parts are [a-z0-9] runs joined by '.', '_', '__' or dashes; \
             a registry is host[:port]",
        ));
    }
    // The repository without its registry, as the registry client splits it (`busybox` is
    // `docker.io/library/busybox`), is limited to 255 characters.
    let explicit_registry =
        parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost");
    let repository_len = match (explicit_registry, parts.len()) {
        (true, _) => name.len() - parts[0].len() - 1,
        (false, 1) => "library/".len() + name.len(),
        (false, _) => name.len(),
    };
    if repository_len > 255 {
        return Err(bad("the repository name is longer than 255 characters"));
    }
    Ok(())
}

/// `[a-z0-9]+` runs joined by one separator each: `.`, `_`, `__` or any number of `-`.
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `host[:port]`: dot-separated labels of letters, digits and inner dashes, then digits.
fn is_registry(c: &str) -> bool {
    let (host, port) = match c.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (c, None),
    };
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
    };
    host.split('.').all(label_ok)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_follow_the_registry_grammar() {
        let digest = format!("sha256:{}", "0".repeat(64));
        let good = [
            "busybox".to_string(),
            "busybox:1.36".to_string(),
            "library/busybox:latest".to_string(),
            "registry.local:5000/ate/counter:v1".to_string(),
            "127.0.0.1:5000/demo/counter:v1".to_string(),
            "localhost/x".to_string(),
            "my_repo/a__b/c-d--e.f:_tag.1-x".to_string(),
            format!("127.0.0.1:5000/demo/counter@{digest}"),
            format!("127.0.0.1:5000/demo/counter:v1@{digest}"),
            "oci-layout:/var/lib/ate/images/counter:latest".to_string(),
            format!("r.example/{}", "a".repeat(255)),
        ];
        for image in &good {
            assert!(validate_image("f", image).is_ok(), "{image}");
        }
        let bad = [
            "a//b".to_string(),
            "a/b:".to_string(),
            "a/b:-x".to_string(),
            "a/b:.x".to_string(),
            "a/b:x:y".to_string(),
            "a/-b".to_string(),
            "a/b-".to_string(),
            "a..b/c".to_string(),
            "a/b___c".to_string(),
            "a/b._c".to_string(),
            "-host/x".to_string(),
            "host:port/x".to_string(),
            "host:/x".to_string(),
            "host:5000/".to_string(),
            "/x".to_string(),
            "Upper/x".to_string(),
            format!("a/b:{}", "t".repeat(129)),
            format!("r.example/{}", "a".repeat(256)),
            "a".repeat(248),
            "a/b@sha256:00".to_string(),
            format!("a/b@sha512:{}", "0".repeat(128)),
            "oci-layout:relative/dir".to_string(),
        ];
        for image in &bad {
            assert!(validate_image("f", image).is_err(), "{image}");
        }
        let err = validate_image("spec.containers[0].image", "a/b:").unwrap_err();
        assert_eq!(err.field, "spec.containers[0].image");
        assert!(err.message.contains("a tag is"), "{err}");
    }
}
