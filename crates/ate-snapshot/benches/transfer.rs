//! seal + upload + download of a 50 MiB generation through the local-directory durable store,
//! and the fetch of every memory chunk one by one (what a lazy restore from the durable copy
//! does), each without and with encryption (`DurableStore::with_keys`) in one run; and the
//! upload of a 64 MiB generation with 1 % of its pages changed since its parent (every chunk
//! goes as a delta), plaintext against sealed node-local generations and an encrypted store.
//! Run: `cargo bench -p ate-snapshot --bench transfer`.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use ate_snapshot::sealed::{self, Opening, Scratch};
use ate_snapshot::{DurableStore, SnapshotKeys, UploadPriority, seal_generation};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

mod common;
use common::meta;

const MIB: usize = 1 << 20;

/// Memory-image-like content: half pseudo-random pages, half zero pages.
fn pages(len: usize) -> Vec<u8> {
    let mut x = common::SEED;
    let mut out = vec![0u8; len];
    for (i, page) in out.chunks_mut(4096).enumerate() {
        if i % 2 == 0 {
            common::fill_random(page, &mut x);
        }
    }
    out
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

/// `image` with every 100th page changed (its first 8 bytes set to `n`): 1 % of the pages, in
/// every chunk.
fn dirtied(image: &[u8], n: usize) -> Vec<u8> {
    let mut out = image.to_vec();
    for page in out.chunks_mut(4096).step_by(100) {
        page[..8].copy_from_slice(&(n as u64).to_le_bytes());
    }
    out
}

/// A durable suspend's upload after 1 % of the pages changed: every chunk is new to the store and
/// goes as a delta against the parent's chunk (whole in the store). Plaintext node-local
/// generations and store, against sealed ones (opened as the node opens them for an upload) and
/// an encrypted store.
fn delta_upload(c: &mut Criterion) {
    const SIZE: usize = 64 * MIB;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let root = tempfile::tempdir().expect("tmp");
    let keys = SnapshotKeys::init(&root.path().join("keys")).expect("keys");
    assert!(sealed::configure(
        Some(keys.clone()),
        Path::new(sealed::DEFAULT_SCRATCH).to_path_buf()
    ));
    let image = pages(SIZE);
    let upper = root.path().join("upper");
    fs::create_dir_all(&upper).expect("mkdir");
    let mut g = c.benchmark_group("delta_upload_64MiB_1pct");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Bytes(SIZE as u64));
    let mut n = 0usize;
    for encrypted in [false, true] {
        let label = if encrypted { "encrypted" } else { "plain" };
        let store = DurableStore::from_url(
            &root
                .path()
                .join(format!("store-{label}"))
                .display()
                .to_string(),
        )
        .expect("store");
        let store = if encrypted {
            store.with_keys(keys.clone())
        } else {
            store
        };
        // The generation on the node as the node keeps it: plaintext, or sealed; and what the
        // upload reads (sealed: opened into a scratch dir, memory images read from the sealed
        // files).
        let on_node = |i: usize, image: &[u8]| -> (std::path::PathBuf, Option<Scratch>) {
            let plain = prepare(root.path(), i, image);
            rt.block_on(seal_generation(&plain, meta(), Some(&upper), &[]))
                .expect("seal");
            if !encrypted {
                return (plain, None);
            }
            let sealed_dir = root.path().join(format!("sealed-{i}"));
            rt.block_on(sealed::seal_into(&plain, &sealed_dir))
                .expect("seal_into");
            let _ = fs::remove_dir_all(&plain);
            let scratch = Scratch::new("bench-upload").expect("scratch");
            rt.block_on(sealed::open_into(
                &sealed_dir,
                scratch.path(),
                Opening::Small,
            ))
            .expect("open_into");
            (scratch.path().to_path_buf(), Some(scratch))
        };
        n += 1;
        let (parent, _parent_scratch) = on_node(n, &image);
        rt.block_on(store.upload(&parent, &format!("parent-{label}")))
            .expect("upload parent");
        g.bench_function(format!("upload_with_parent/{label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let (child, _scratch) = on_node(n, &dirtied(&image, n));
                    let key = format!("child-{n}");
                    let start = Instant::now();
                    let (_, stats) = rt
                        .block_on(store.upload_with_parents(
                            &child,
                            &key,
                            UploadPriority::Normal,
                            std::slice::from_ref(&parent),
                            &|_| None,
                        ))
                        .expect("upload");
                    total += start.elapsed();
                    assert_eq!(stats.chunks_delta, (SIZE / (2 * MIB)) as u64, "{stats:?}");
                    rt.block_on(store.delete(&key)).expect("delete");
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, delta_upload);
criterion_main!(benches);
