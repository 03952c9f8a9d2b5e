//! seal + upload + download of a 50 MiB generation through the local-directory durable store,
//! and the fetch of every memory chunk one by one (what a lazy restore from the durable copy
//! does), each without and with encryption (`DurableStore::with_keys`) in one run.
//! Run: `cargo bench -p ate-snapshot --bench transfer`.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use ate_core::Fidelity;
use ate_snapshot::{DurableStore, GenerationMeta, SnapshotKeys, seal_generation};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const MIB: usize = 1 << 20;

/// Memory-image-like content: half pseudo-random pages, half zero pages.
fn pages(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = vec![0u8; len];
    for (i, page) in out.chunks_mut(4096).enumerate() {
        if i % 2 == 0 {
            for b in page.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = b.len();
                b.copy_from_slice(&x.to_le_bytes()[..n]);
            }
        }
    }
    out
}

fn meta() -> GenerationMeta {
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
    }
}

fn prepare(root: &Path, i: usize, image: &[u8]) -> std::path::PathBuf {
    let gen_dir = root.join(format!("gen-{i}"));
    fs::create_dir_all(gen_dir.join("criu")).expect("mkdir");
    fs::write(gen_dir.join("criu/pages-1.img"), image).expect("write");
    fs::write(gen_dir.join("criu/inventory.img"), b"inv").expect("write");
    gen_dir
}

/// `image` with `n` written at the start of every 2 MiB chunk: every chunk is new to the store.
fn fresh(image: &[u8], n: usize) -> Vec<u8> {
    let mut out = image.to_vec();
    for chunk in out.chunks_mut(2 * MIB) {
        chunk[..8].copy_from_slice(&(n as u64).to_le_bytes());
    }
    out
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let root = tempfile::tempdir().expect("tmp");
    let image = pages(40 * MIB);
    let upper = root.path().join("upper");
    fs::create_dir_all(upper.join("data")).expect("mkdir");
    fs::write(upper.join("data/blob"), pages(10 * MIB)).expect("write");
    let keys = SnapshotKeys::init(&root.path().join("keys")).expect("keys");
    let stores = [
        (
            "plain",
            DurableStore::from_url(&root.path().join("store").display().to_string())
                .expect("store"),
        ),
        (
            "encrypted",
            DurableStore::from_url(&root.path().join("store-enc").display().to_string())
                .expect("store")
                .with_keys(keys),
        ),
    ];

    let mut g = c.benchmark_group("generation_50MiB");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Bytes(50 * MIB as u64));
    let mut n = 0usize;
    for (label, store) in &stores {
        g.bench_function(format!("seal_upload_download/{label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let gen_dir = prepare(root.path(), n, &fresh(&image, n));
                    let target = root.path().join(format!("dl-{n}"));
                    let key = format!("k{n}");
                    let start = Instant::now();
                    rt.block_on(async {
                        let t0 = Instant::now();
                        seal_generation(&gen_dir, meta(), Some(&upper), &[])
                            .await
                            .expect("seal");
                        let t1 = Instant::now();
                        store.upload(&gen_dir, &key).await.expect("upload");
                        let t2 = Instant::now();
                        store.download(&key, &target).await.expect("download");
                        let t3 = Instant::now();
                        eprintln!(
                            "{label}: seal {:?} upload {:?} download {:?}",
                            t1 - t0,
                            t2 - t1,
                            t3 - t2
                        );
                    });
                    total += start.elapsed();
                    let _ = fs::remove_dir_all(&gen_dir);
                    let _ = fs::remove_dir_all(&target);
                    rt.block_on(store.delete(&key)).expect("delete");
                }
                total
            })
        });
    }
    g.finish();

    // Every chunk of a 40 MiB memory image fetched one at a time, as page faults would.
    let mut g = c.benchmark_group("fetch_chunks_40MiB");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Bytes(40 * MIB as u64));
    for (label, store) in &stores {
        n += 1;
        let gen_dir = prepare(root.path(), n, &fresh(&image, n));
        let manifest = rt
            .block_on(seal_generation(&gen_dir, meta(), Some(&upper), &[]))
            .expect("seal");
        let key = format!("fetch-{label}");
        rt.block_on(store.upload(&gen_dir, &key)).expect("upload");
        let entry = manifest
            .file("criu/pages-1.img")
            .expect("pages image")
            .clone();
        g.bench_function(format!("one_by_one/{label}"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    for i in 0..entry.chunk_count() {
                        store.fetch_chunk(&entry, i).await.expect("fetch");
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
