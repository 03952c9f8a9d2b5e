//! What the ate-snapshot benches share: memory-image-like content and the generation metadata
//! they seal under.

use ate_core::Fidelity;
use ate_snapshot::GenerationMeta;

/// Fills `out` with pseudo-random bytes (xorshift from `x`, which it advances): a page that does
/// not compress.
pub fn fill_random(out: &mut [u8], x: &mut u64) {
    for b in out.chunks_mut(8) {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        let n = b.len();
        b.copy_from_slice(&x.to_le_bytes()[..n]);
    }
}

/// The seed both benches start their pseudo-random pages from.
pub const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The metadata of the one generation a bench seals.
pub fn meta() -> GenerationMeta {
    GenerationMeta {
        atespace: "bench".into(),
        name: "actor".into(),
        generation: 1,
        uuid: "00000000-0000-4000-8000-000000000001".into(),
        fidelity: Fidelity::Memory,
        template: "bench/t".into(),
        sandbox_class: "runc".into(),
        node: "n".into(),
        boot_id: "b".into(),
        created_unix_ms: 0,
        reason: String::new(),
        parent: None,
    }
}
