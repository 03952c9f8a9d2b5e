//! Fuzz targets (property tests, bounded: a fixed number of cases each, a few seconds in all) for
//! the snapshot manifest parser (`Manifest::from_json`), which reads `manifest.json` from local
//! disk and from object storage — input that may be truncated, corrupted or hostile.
//!
//! Properties: arbitrary bytes and arbitrary JSON values are refused with an error, never a
//! panic; a valid manifest round-trips through `to_json`/`from_json` with a stable checksum;
//! a damaged one is refused with an error that names the problem (the missing or unknown field,
//! the unsafe path, the bad checksum, the bad or misplaced chunk digests, the unsupported
//! version); a version 1 manifest (no chunk digests) still parses.
//! The unit tests in src/manifest.rs cover the fixed cases.

use ate_core::Fidelity;
use ate_snapshot::{CHUNK_BYTES, Error, FORMAT_VERSION, FileEntry, MANIFEST_FILE, Manifest};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Cases for the raw-input targets (cheap to generate) and for the ones that build a whole
/// manifest per case (unicode strings, file lists): a few seconds each in a debug build.
const RAW_CASES: u32 = 1024;
const MANIFEST_CASES: u32 = 256;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters: 1024,
        ..ProptestConfig::default()
    }
}

/// Every field of the manifest object (all required except `reason`).
const FIELDS: &[&str] = &[
    "format_version",
    "atespace",
    "name",
    "generation",
    "uuid",
    "fidelity",
    "template",
    "sandbox_class",
    "node",
    "boot_id",
    "created_unix_ms",
    "reason",
    "files",
];

fn fidelity() -> impl Strategy<Value = Fidelity> {
    prop::sample::select(vec![Fidelity::Memory, Fidelity::Rootfs, Fidelity::Volumes])
}

/// Distinct two-segment paths (so none is both a file and a directory, none is manifest.json).
fn files() -> impl Strategy<Value = Vec<FileEntry>> {
    prop::collection::btree_map(
        "[a-z0-9_.-]{0,6}[a-z0-9_]/[a-zA-Z0-9_.-]{0,10}[a-z0-9]",
        // At most 8 files: sizes up to 2^60 each never add up past u64.
        (0u64..=1 << 60, "[0-9a-f]{64}"),
        0..8,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(path, (size, sha256))| FileEntry {
                path,
                size,
                sha256,
                blake3_chunks: Vec::new(),
            })
            .collect()
    })
}

/// Memory images `criu/pages-<N>.img` (distinct N) of up to 8 chunks, with one digest per chunk.
fn pages_files() -> impl Strategy<Value = Vec<FileEntry>> {
    prop::collection::btree_set(0u32..1000, 0..3).prop_flat_map(|ns| {
        ns.into_iter()
            .map(|n| {
                (0u64..=8 * CHUNK_BYTES, "[0-9a-f]{64}").prop_flat_map(move |(size, sha256)| {
                    prop::collection::vec("[0-9a-f]{64}", size.div_ceil(CHUNK_BYTES) as usize)
                        .prop_map(move |blake3_chunks| FileEntry {
                            path: format!("criu/pages-{n}.img"),
                            size,
                            sha256: sha256.clone(),
                            blake3_chunks,
                        })
                })
            })
            .collect::<Vec<_>>()
    })
}

prop_compose! {
    fn manifest()(
        atespace in "\\PC{0,20}",
        name in "\\PC{0,20}",
        generation in any::<u64>(),
        uuid in "[0-9a-f-]{0,36}",
        fidelity in fidelity(),
        template in "\\PC{0,30}",
        sandbox_class in "[a-z]{0,8}",
        node in "\\PC{0,20}",
        boot_id in "\\PC{0,20}",
        created_unix_ms in any::<i64>(),
        reason in "\\PC{0,60}",
        files in files(),
        pages in pages_files(),
    ) -> Manifest {
        // A random path may happen to be one of the images'.
        let mut files: Vec<FileEntry> = files
            .into_iter()
            .filter(|f| pages.iter().all(|p| p.path != f.path))
            .collect();
        files.extend(pages);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Manifest {
            format_version: FORMAT_VERSION,
            atespace, name, generation, uuid, fidelity, template, sandbox_class, node,
            boot_id, created_unix_ms, reason, files, parent: None,
        }
    }
}

/// Any JSON value, nested a few levels, with object keys drawn partly from the manifest's own
/// field names so the parser gets past "not an object" often.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,20}".prop_map(Value::String),
        Just(json!(1)),
        Just(json!("FIDELITY_MEMORY")),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        prop::sample::select(FIELDS).prop_map(str::to_string),
                        Just("path".to_string()),
                        Just("size".to_string()),
                        Just("sha256".to_string()),
                        Just("blake3_chunks".to_string()),
                        "\\PC{0,10}",
                    ],
                    inner
                ),
                0..14
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn manifest_error(result: Result<Manifest, Error>) -> Result<String, TestCaseError> {
    match result {
        Ok(m) => Err(TestCaseError::fail(format!("accepted {m:?}"))),
        Err(e @ (Error::InvalidManifest(_) | Error::UnsupportedFormat { .. })) => {
            let text = e.to_string();
            prop_assert!(text.starts_with("manifest.json"), "{}", text);
            Ok(text)
        }
        Err(other) => Err(TestCaseError::fail(format!(
            "not a manifest error: {other:?}"
        ))),
    }
}

fn as_object(m: &Manifest) -> Result<Map<String, Value>, TestCaseError> {
    match serde_json::from_slice::<Value>(&m.to_json()) {
        Ok(Value::Object(o)) => Ok(o),
        other => Err(TestCaseError::fail(format!("to_json gave {other:?}"))),
    }
}

fn bytes_of(o: Map<String, Value>) -> Vec<u8> {
    Value::Object(o).to_string().into_bytes()
}

proptest! {
    #![proptest_config(config(RAW_CASES))]

    #[test]
    fn fuzz_manifest_arbitrary_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        manifest_error(Manifest::from_json(&bytes))?;
    }

    #[test]
    fn fuzz_manifest_arbitrary_json_is_refused(v in json_value()) {
        manifest_error(Manifest::from_json(v.to_string().as_bytes()))?;
    }
}

proptest! {
    #![proptest_config(config(MANIFEST_CASES))]

    #[test]
    fn fuzz_manifest_valid_round_trips(m in manifest()) {
        let json = m.to_json();
        let back = Manifest::from_json(&json).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(back.to_json(), json);
        prop_assert_eq!(back.checksum(), m.checksum());
        prop_assert_eq!(m.total_size(), m.files.iter().map(|f| f.size).sum::<u64>());
        // Compact JSON (what another writer might produce) parses to the same manifest.
        let compact = serde_json::to_vec(&m).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Manifest::from_json(&compact).ok(), Some(m));
    }

    #[test]
    fn fuzz_manifest_truncated_or_flipped_never_panics(m in manifest(), cut in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let json = m.to_json();
        // Any proper prefix is incomplete JSON (the object closes at the very end).
        let short = &json[..cut.index(json.len() - 1)];
        manifest_error(Manifest::from_json(short))?;
        let mut flipped = json.clone();
        let i = at.index(flipped.len());
        flipped[i] = byte;
        if let Ok(parsed) = Manifest::from_json(&flipped) {
            // A flip inside a string or number can still leave a valid manifest; it must then
            // be a consistent one.
            prop_assert_eq!(Manifest::from_json(&parsed.to_json()).ok(), Some(parsed));
        }
    }

    #[test]
    fn fuzz_manifest_missing_field_is_named(m in manifest(), field in prop::sample::select(FIELDS)) {
        let mut o = as_object(&m)?;
        o.remove(field);
        let result = Manifest::from_json(&bytes_of(o));
        if field == "reason" {
            // The only optional field.
            prop_assert!(result.is_ok(), "{:?}", result);
        } else {
            let text = manifest_error(result)?;
            prop_assert!(text.contains(field), "{}: {}", field, text);
        }
    }

    #[test]
    fn fuzz_manifest_unknown_field_is_named(m in manifest(), field in "[a-z_]{1,12}", v in json_value()) {
        prop_assume!(!FIELDS.contains(&field.as_str()));
        let mut o = as_object(&m)?;
        o.insert(field.clone(), v);
        let text = manifest_error(Manifest::from_json(&bytes_of(o)))?;
        prop_assert!(text.contains(&field), "{}: {}", field, text);
    }

    #[test]
    fn fuzz_manifest_other_versions_are_unsupported(m in manifest(), version in any::<u64>()) {
        // This build reads 1 ..= FORMAT_VERSION.
        prop_assume!(version == 0 || version > u64::from(FORMAT_VERSION));
        let mut o = as_object(&m)?;
        o.insert("format_version".into(), json!(version));
        match Manifest::from_json(&bytes_of(o)) {
            Err(Error::UnsupportedFormat { found, supported }) => {
                prop_assert_eq!(found, version);
                prop_assert_eq!(supported, FORMAT_VERSION);
            }
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
    }

    #[test]
    fn fuzz_manifest_unsafe_path_is_named(
        m in manifest(),
        path in prop_oneof![
            "\\.\\./[a-z]{1,8}",
            "[a-z]{1,8}/\\.\\./\\.\\./[a-z]{1,8}",
            "/[a-z]{1,8}(/[a-z]{1,8}){0,2}",
            "[a-z]{1,8}//[a-z]{1,8}",
            "\\./[a-z]{1,8}",
            "[a-z]{1,8}/\\.",
            "[a-z]{1,8}/",
            "[a-z]{0,4}\\\\[a-z]{1,4}",
            "[a-z]{0,4}\u{0}[a-z]{0,4}",
            Just(String::new()),
            Just(MANIFEST_FILE.to_string()),
            "[a-z]{8}".prop_map(|s| s.repeat(513)),
        ],
    ) {
        let mut m = m;
        m.files.push(FileEntry { path: path.clone(), size: 1, sha256: "0".repeat(64), blake3_chunks: Vec::new() });
        let text = manifest_error(Manifest::from_json(&m.to_json()))?;
        let shown = format!("{path:?}");
        // Long paths are named too (the message quotes the whole path).
        prop_assert!(
            text.contains(&shown) || (path == MANIFEST_FILE && text.contains("lists itself")),
            "{}: {}", shown, text
        );
    }

    #[test]
    fn fuzz_manifest_overflowing_sizes_are_refused(m in manifest(), a in (1u64 << 63)..=u64::MAX, b in (1u64 << 63)..=u64::MAX) {
        let mut m = m;
        let sha256 = "0".repeat(64);
        m.files.push(FileEntry { path: "zz/huge-1".into(), size: a, sha256: sha256.clone(), blake3_chunks: Vec::new() });
        m.files.push(FileEntry { path: "zz/huge-2".into(), size: b, sha256, blake3_chunks: Vec::new() });
        prop_assume!(m.file("zz/huge-1").is_some_and(|f| f.size == a));
        let text = manifest_error(Manifest::from_json(&m.to_json()))?;
        prop_assert!(text.contains("sizes"), "{}", text);
        // Hand-built (unvalidated), the total saturates instead of overflowing.
        prop_assert_eq!(m.total_size(), u64::MAX);
    }

    #[test]
    fn fuzz_manifest_bad_checksum_is_named(m in manifest(), sha in prop_oneof!["[0-9a-f]{0,63}", "[0-9a-f]{65,70}", "[0-9a-fA-Z]{64}", "\\PC{0,64}"]) {
        prop_assume!(sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        prop_assume!(m.file("zz/bad").is_none());
        let mut m = m;
        m.files.push(FileEntry { path: "zz/bad".into(), size: 1, sha256: sha.clone(), blake3_chunks: Vec::new() });
        let text = manifest_error(Manifest::from_json(&m.to_json()))?;
        prop_assert!(text.contains("sha256") && text.contains("\"zz/bad\""), "{}", text);
    }

    #[test]
    fn fuzz_manifest_duplicate_or_file_and_dir_is_named(m in manifest(), idx in any::<prop::sample::Index>(), as_dir in any::<bool>()) {
        prop_assume!(!m.files.is_empty());
        let mut m = m;
        let f = m.files[idx.index(m.files.len())].clone();
        let extra = if as_dir {
            // Not a memory image: no chunk digests.
            FileEntry { path: format!("{}/inner", f.path), blake3_chunks: Vec::new(), ..f.clone() }
        } else {
            f.clone()
        };
        m.files.push(extra);
        let text = manifest_error(Manifest::from_json(&m.to_json()))?;
        prop_assert!(text.contains(&format!("{:?}", f.path)), "{}", text);
        prop_assert!(text.contains(if as_dir { "both a file and a directory" } else { "duplicate" }), "{}", text);
    }

    #[test]
    fn fuzz_manifest_version_1_parses_without_chunk_digests(m in manifest()) {
        let mut m = m;
        m.format_version = 1;
        let had_chunks = m.files.iter().any(FileEntry::has_chunk_digests);
        if had_chunks {
            // A version 1 writer never wrote them.
            let text = manifest_error(Manifest::from_json(&m.to_json()))?;
            prop_assert!(text.contains("blake3_chunks"), "{}", text);
        }
        for f in &mut m.files {
            f.blake3_chunks.clear();
        }
        let json = m.to_json();
        let back = Manifest::from_json(&json).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back.format_version, 1);
        prop_assert_eq!(back.to_json(), json);
        prop_assert_eq!(back, m);
    }

    #[test]
    fn fuzz_manifest_bad_chunk_digests_are_named(
        m in manifest(),
        idx in any::<prop::sample::Index>(),
        how in 0u8..5,
        bad in prop_oneof!["[0-9a-f]{0,63}", "[0-9a-f]{65,70}", "[0-9a-fA-Z]{64}", "\\PC{0,64}"],
        moved_to in "[a-z]{1,6}/[a-z]{1,6}",
    ) {
        let chunked: Vec<usize> = (0..m.files.len()).filter(|&i| m.files[i].has_chunk_digests()).collect();
        prop_assume!(!chunked.is_empty());
        let mut m = m;
        let i = chunked[idx.index(chunked.len())];
        let f = &mut m.files[i];
        let n = f.blake3_chunks.len();
        match how {
            // One digest too many, one too few (none left is fine: digests are optional).
            0 => f.blake3_chunks.push("0".repeat(64)),
            1 => {
                prop_assume!(n > 1);
                f.blake3_chunks.pop();
            }
            // A malformed digest.
            2 => {
                prop_assume!(bad.len() != 64 || !bad.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
                f.blake3_chunks[idx.index(n)] = bad;
            }
            // Digests on a file that is not a memory image.
            3 => {
                prop_assume!(m.files.iter().all(|g| g.path.split('/').next() != moved_to.split('/').next()));
                m.files[i].path = moved_to;
            }
            // The size no longer fits the number of chunks.
            _ => f.size = (n as u64 + 1) * CHUNK_BYTES,
        }
        let path = m.files[i].path.clone();
        let text = manifest_error(Manifest::from_json(&m.to_json()))?;
        prop_assert!(text.contains("blake3_chunks") && text.contains(&format!("{path:?}")), "{}", text);
    }
}
