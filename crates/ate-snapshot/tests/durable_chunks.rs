//! Memory images in the durable store as content-addressed chunks: upload without re-sending
//! what the store holds, whole and lazy downloads, damaged and missing chunks, and the sweep of
//! chunks no generation references (DurableStore over a local directory).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ate_snapshot::{
    CHUNK_BYTES, DURABLE_SOURCE_FILE, DurableStore, Error, FileEntry, Manifest, UploadPriority,
    durable_source, verify,
};
use common::*;

const PAGES: &str = "criu/pages-1.img";
/// 2.5 chunks of noise.
const BIG: usize = (CHUNK_BYTES * 5 / 2) as usize;

async fn seal(fx: &Fixture) -> Manifest {
    fx.seal_memory().await.expect("seal")
}

fn pages_entry(m: &Manifest) -> FileEntry {
    m.file(PAGES).expect("pages image listed").clone()
}

fn chunk_file(store_dir: &Path, digest: &str) -> PathBuf {
    store_dir
        .join("_chunks")
        .join(&digest[..2])
        .join(format!("{digest}.zst"))
}

/// Every stored chunk object (sweep announcements left out).
fn chunk_files(store_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let root = store_dir.join("_chunks");
    let Ok(rd) = fs::read_dir(&root) else {
        return out;
    };
    for fan in rd.flatten() {
        if fan.file_name() == "_sweeps" {
            continue;
        }
        for f in fs::read_dir(fan.path()).expect("read_dir").flatten() {
            out.push(f.path());
        }
    }
    out.sort();
    out
}

fn original_chunk(fx: &Fixture, index: u64) -> Vec<u8> {
    let all = fs::read(fx.gen_dir.join(PAGES)).expect("read");
    let start = (index * CHUNK_BYTES) as usize;
    let end = (start + CHUNK_BYTES as usize).min(all.len());
    all[start..end].to_vec()
}

#[tokio::test]
async fn memory_images_go_up_as_shared_chunks_and_come_back_whole() {
    let fx = fixture(BIG);
    let m = seal(&fx).await;
    let (store, dir) = store_of(&fx);
    let entry = pages_entry(&m);
    assert_eq!(entry.chunk_count(), 3);

    let (_, first) = store
        .upload_with_stats(&fx.gen_dir, "default/counter/7-a")
        .await
        .expect("upload");
    assert_eq!(first.chunks_reused, 0);
    // Noise does not compress: the chunks alone are about the image's size.
    assert!(first.sent_bytes >= entry.size, "{first:?}");
    let objects = store
        .list_objects("default/counter/7-a")
        .await
        .expect("list");
    assert!(
        !objects.iter().any(|o| o.contains("pages-")),
        "the memory image is not one object: {objects:?}"
    );
    assert_eq!(objects.len(), m.files.len(), "{objects:?}"); // others + manifest
    assert_eq!(chunk_files(&dir).len(), 3);

    // The same memory under another key: nothing of it is sent again.
    let (_, second) = store
        .upload_with_stats(&fx.gen_dir, "default/counter/8-b")
        .await
        .expect("upload again");
    assert_eq!(second.chunks_reused, 3);
    assert!(
        second.sent_bytes < first.sent_bytes - entry.size + 4096,
        "{second:?} vs {first:?}"
    );
    assert_eq!(chunk_files(&dir).len(), 3);

    // Deleting one generation keeps the chunks the other references; it downloads whole.
    store.delete("default/counter/7-a").await.expect("delete");
    assert_eq!(chunk_files(&dir).len(), 3);
    let target = fx.root.path().join("node-b/gen");
    assert_eq!(download_ok(&store, "default/counter/8-b", &target).await, m);
    assert_eq!(verify(&target).await.expect("verified"), m);
    assert_eq!(
        fs::read(target.join(PAGES)).expect("read"),
        fs::read(fx.gen_dir.join(PAGES)).expect("read")
    );
}

#[tokio::test]
async fn a_lazy_download_brings_the_small_files_and_the_chunks_criu_reads() {
    let fx = fixture(BIG);
    let m = seal(&fx).await;
    let (store, _) = store_of(&fx);
    let uri = store
        .upload(&fx.gen_dir, "default/counter/7-a")
        .await
        .expect("upload");

    let target = fx.root.path().join("cache/7-a.lazy");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let got = store
        .download_for_lazy_restore(&uri, &target, move |dir| {
            // The small files are in when the eager chunks are chosen (CRIU's images).
            *seen2.lock().expect("lock") = Some(dir.join("criu/inventory.img").is_file());
            Ok(vec![(PAGES.to_string(), 1)])
        })
        .await
        .expect("lazy download");
    assert_eq!(got, m);
    assert_eq!(*seen.lock().expect("lock"), Some(true));
    let source = durable_source(&target)
        .expect("read")
        .expect("a durable source");
    assert_eq!(source.uri, uri);
    assert_eq!(source.store, store.url());
    // Full size, chunk 1 in place, the others not fetched (zeros).
    let local = fs::read(target.join(PAGES)).expect("read");
    assert_eq!(local.len() as u64, pages_entry(&m).size);
    let c = CHUNK_BYTES as usize;
    assert_eq!(&local[c..2 * c], original_chunk(&fx, 1).as_slice());
    assert!(local[..c].iter().all(|b| *b == 0));
    for f in m.files.iter().filter(|f| f.path != PAGES) {
        assert_eq!(
            fs::read(target.join(&f.path)).expect("read"),
            fs::read(fx.gen_dir.join(&f.path)).expect("read"),
            "{}",
            f.path
        );
    }
    assert!(target.join(DURABLE_SOURCE_FILE).is_file());
    // What the page source does for the rest.
    let entry = pages_entry(&m);
    for i in [0, 2] {
        assert_eq!(
            store.fetch_chunk(&entry, i).await.expect("fetch"),
            original_chunk(&fx, i)
        );
    }
    // A complete generation has no durable source.
    assert_eq!(durable_source(&fx.gen_dir).expect("read"), None);

    // An error choosing the eager chunks leaves nothing behind.
    let other = fx.root.path().join("cache/7-b.lazy");
    let err = store
        .download_for_lazy_restore(&uri, &other, |_| {
            Err(Error::InvalidInput("no pagemap".into()))
        })
        .await
        .expect_err("eager chunks unknown");
    assert!(err.to_string().contains("no pagemap"), "{err}");
    assert!(!other.exists());
    assert!(no_temp_siblings(&other));
}

#[tokio::test]
async fn damaged_or_missing_chunks_are_refused_by_name() {
    let fx = fixture(BIG);
    let m = seal(&fx).await;
    let (store, dir) = uploaded_7a(&fx).await;
    let entry = pages_entry(&m);
    let obj = chunk_file(&dir, entry.chunk_digest(1).expect("digest"));
    let saved = fs::read(&obj).expect("read");

    // A flipped byte: the zstd frame checksum or the BLAKE3 digest catches it.
    flip_byte(&obj);
    let err = store.fetch_chunk(&entry, 1).await.expect_err("damaged");
    assert!(
        matches!(err, Error::Decompress { .. } | Error::ChunkMismatch { .. }),
        "{err}"
    );
    // Valid zstd, other bytes of the right length: the digest names file and chunk.
    let mut other = original_chunk(&fx, 1);
    other[7] ^= 1;
    fs::write(&obj, zstd::encode_all(other.as_slice(), 3).expect("zstd")).expect("write");
    match store.fetch_chunk(&entry, 1).await.expect_err("wrong bytes") {
        Error::ChunkMismatch { file, chunk, .. } => {
            assert_eq!(file, PAGES);
            assert_eq!(chunk, 1);
        }
        other => panic!("expected a chunk mismatch, got {other}"),
    }
    let target = fx.root.path().join("node-b/gen");
    let err = store
        .download("default/counter/7-a", &target)
        .await
        .expect_err("damaged chunk");
    assert!(err.to_string().contains(PAGES), "{err}");
    assert!(!target.exists());
    assert!(no_temp_siblings(&target));

    // A missing chunk is named too, and nothing is left.
    fs::remove_file(&obj).expect("rm");
    let err = store.fetch_chunk(&entry, 1).await.expect_err("missing");
    assert!(
        matches!(&err, Error::MissingFile { file } if file.contains(PAGES) && file.contains("chunk 1")),
        "{err}"
    );
    let err = store
        .download("default/counter/7-a", &target)
        .await
        .expect_err("missing chunk");
    assert!(matches!(err, Error::MissingFile { .. }), "{err}");
    assert!(!target.exists());

    // A new upload of the generation writes the missing chunk back.
    fs::write(&obj, saved).expect("restore");
    fs::remove_file(&obj).expect("rm again");
    store
        .upload(&fx.gen_dir, "default/counter/8-b")
        .await
        .expect("upload");
    assert!(obj.is_file());
    assert_eq!(download_ok(&store, "default/counter/7-a", &target).await, m);
}

#[tokio::test]
async fn the_sweep_deletes_old_chunks_no_generation_references_and_nothing_else() {
    let two_hours = Duration::from_secs(2 * 3600);
    let fx = fixture(BIG);
    let a = seal(&fx).await;
    let (store, dir) = uploaded_7a(&fx).await;

    // Generation b: the same memory but its first chunk changed (shares chunks 1 and 2).
    let fx_b = fixture(BIG);
    let pages_b = fx_b.gen_dir.join(PAGES);
    let mut bytes = fs::read(&pages_b).expect("read");
    bytes[100] ^= 0xff;
    fs::write(&pages_b, bytes).expect("write");
    let b = seal(&fx_b).await;
    let (_, stats) = store
        .upload_with_stats(&fx_b.gen_dir, "default/counter/8-b")
        .await
        .expect("upload b");
    assert_eq!(stats.chunks_reused, 2, "{stats:?}");
    assert_eq!(chunk_files(&dir).len(), 4);

    // a is deleted (retention, say): its first chunk is now referenced by nobody.
    store.delete("default/counter/7-a").await.expect("delete a");
    let only_a = chunk_file(&dir, pages_entry(&a).chunk_digest(0).expect("digest"));
    // A young unreferenced chunk (an upload in flight) stays.
    let young = chunk_file(&dir, &"ab".repeat(32));
    fs::create_dir_all(young.parent().expect("parent")).expect("mkdir");
    fs::write(&young, b"in flight").expect("write");
    for f in chunk_files(&dir) {
        if f != young {
            age_file(&f, two_hours);
        }
    }
    assert_eq!(
        store
            .sweep_unreferenced_chunks("node-a")
            .await
            .expect("sweep"),
        1
    );
    assert!(!only_a.exists());
    assert!(young.exists());
    assert_eq!(chunk_files(&dir).len(), 4); // b's three + the young one
    // The sweep announced itself.
    assert!(dir.join("_chunks/_sweeps/node-a").is_file());
    // The partial-upload sweep never takes chunks.
    let partial = store.sweep_partial_uploads(3).await.expect("partial sweep");
    assert_eq!(partial.objects_deleted, 0, "{partial:?}");
    // b is whole.
    let target = fx.root.path().join("node-b/gen");
    assert_eq!(download_ok(&store, "default/counter/8-b", &target).await, b);
    // Idempotent.
    assert_eq!(
        store
            .sweep_unreferenced_chunks("node-b")
            .await
            .expect("again"),
        0
    );

    // An upload that would reuse old chunks writes them again (renewing them), so a sweep
    // cannot take them before its manifest is written.
    let (_, renewed) = store
        .upload_with_stats(&fx_b.gen_dir, "default/counter/9-c")
        .await
        .expect("upload c");
    assert_eq!(renewed.chunks_reused, 0, "{renewed:?}");
    assert!(renewed.sent_bytes >= pages_entry(&b).size, "{renewed:?}");

    // With a grace age of zero the sweep is refused.
    let err = store
        .clone()
        .with_partial_grace(Duration::ZERO)
        .sweep_unreferenced_chunks("node-a")
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
}

#[tokio::test]
async fn an_upload_during_a_sweep_checks_its_chunks_before_its_manifest() {
    let fx = fixture(BIG);
    let m = seal(&fx).await;
    let (store, dir) = store_of(&fx);
    // A sweep is (said to be) deleting right now.
    let marker = dir.join("_chunks/_sweeps/node-z");
    fs::create_dir_all(marker.parent().expect("parent")).expect("mkdir");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    fs::write(
        &marker,
        format!(
            r#"{{"started_ms":{},"ends_by_ms":{}}}"#,
            now_ms - 1000,
            now_ms + 60_000
        ),
    )
    .expect("write");
    let begun = std::time::Instant::now();
    store
        .upload(&fx.gen_dir, "default/counter/7-a")
        .await
        .expect("upload");
    // It waited past any delete the sweep could still send, then checked every chunk.
    assert!(
        begun.elapsed() >= Duration::from_secs(1),
        "{:?}",
        begun.elapsed()
    );
    for (i, digest) in pages_entry(&m).blake3_chunks.iter().enumerate() {
        assert!(chunk_file(&dir, digest).is_file(), "chunk {i}");
    }
}

/// A copy of the fixture's generation with bytes flipped at `(chunk, page)` positions, sealed.
async fn changed(pages: &[(u64, usize)]) -> (Fixture, Manifest) {
    let fx = fixture(BIG);
    let path = fx.gen_dir.join(PAGES);
    let mut bytes = fs::read(&path).expect("read");
    for (chunk, page) in pages {
        bytes[(*chunk * CHUNK_BYTES) as usize + page * 4096 + 17] ^= 0x5a;
    }
    fs::write(&path, bytes).expect("write");
    let m = seal(&fx).await;
    (fx, m)
}

/// No pagemaps: pages are matched by offset.
/// The durable store of `fx` (and its directory) with `fx`'s generation uploaded as
/// `default/counter/7-a`.
async fn uploaded_7a(fx: &Fixture) -> (DurableStore, PathBuf) {
    let (store, dir) = store_of(fx);
    store
        .upload(&fx.gen_dir, "default/counter/7-a")
        .await
        .expect("upload default/counter/7-a");
    (store, dir)
}

/// Uploads `fx`'s generation as `key` (normal priority) against the generations `parents`, no
/// memory layouts known.
async fn upload_over(
    store: &DurableStore,
    fx: &Fixture,
    key: &str,
    parents: &[&Path],
) -> (String, ate_snapshot::TransferStats) {
    upload_by(store, fx, key, parents, &no_layout).await
}

/// [`upload_over`], the memory layouts of the generations from `layout_of`.
async fn upload_by(
    store: &DurableStore,
    fx: &Fixture,
    key: &str,
    parents: &[&Path],
    layout_of: &(dyn Fn(&Path) -> Option<ate_snapshot::MemoryLayout> + Send + Sync),
) -> (String, ate_snapshot::TransferStats) {
    let parents: Vec<PathBuf> = parents.iter().map(|p| p.to_path_buf()).collect();
    store
        .upload_with_parents(
            &fx.gen_dir,
            key,
            UploadPriority::Normal,
            &parents,
            layout_of,
        )
        .await
        .unwrap_or_else(|e| panic!("upload {key}: {e}"))
}

fn no_layout(_: &Path) -> Option<ate_snapshot::MemoryLayout> {
    None
}

/// Whether the stored object of `digest` is a delta (a zstd skippable frame first).
fn is_delta(store_dir: &Path, digest: &str) -> bool {
    let bytes = fs::read(chunk_file(store_dir, digest)).expect("chunk object");
    bytes[..4] == 0x184D_2A50u32.to_le_bytes()
}

fn marker_files(store_dir: &Path) -> Vec<PathBuf> {
    chunk_files(store_dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".base-"))
        .collect()
}

/// Incremental uploads: a generation that changed a few pages sends those pages (deltas on its
/// parent's chunks); a chain of generations keeps one base per chunk; the parents can be
/// deleted (their generations and their local copies) and the newest still comes back whole.
#[tokio::test]
async fn changed_pages_go_up_as_deltas_that_outlive_their_parents() {
    let two_hours = Duration::from_secs(2 * 3600);
    let (fx1, g1) = changed(&[]).await;
    let (store, dir) = uploaded_7a(&fx1).await;

    // g2: three pages changed in chunks 0 and 1; chunk 2 as in g1. A parent that is not a
    // generation is passed over.
    let (fx2, g2) = changed(&[(0, 0), (0, 100), (1, 3)]).await;
    let missing = fx1.root.path().join("no-such-generation");
    let (_, s2) = upload_over(
        &store,
        &fx2,
        "default/counter/8-b",
        &[&missing, &fx1.gen_dir],
    )
    .await;
    assert_eq!((s2.chunks_reused, s2.chunks_delta), (1, 2), "{s2:?}");
    // Three pages and the small files, of a 5 MiB generation.
    assert!(s2.sent_bytes < 128 * 1024, "{s2:?}");
    let e1 = pages_entry(&g1);
    let e2 = pages_entry(&g2);
    for i in 0..2 {
        assert!(
            is_delta(&dir, e2.chunk_digest(i).expect("digest")),
            "chunk {i}"
        );
    }
    assert_eq!(marker_files(&dir).len(), 2);
    assert_eq!(
        store
            .fetch_chunk(&e2, 0)
            .await
            .expect("fetch a delta chunk"),
        fs::read(fx2.gen_dir.join(PAGES)).expect("read")[..CHUNK_BYTES as usize]
    );

    // g3: one more page in chunk 0. Its delta stays on g1's chunk (carrying g2's pages), so a
    // read takes two objects however long the chain.
    let (fx3, g3) = changed(&[(0, 0), (0, 100), (1, 3), (0, 200)]).await;
    let (_, s3) = upload_over(&store, &fx3, "default/counter/9-c", &[&fx2.gen_dir]).await;
    assert_eq!((s3.chunks_reused, s3.chunks_delta), (2, 1), "{s3:?}");
    let e3 = pages_entry(&g3);
    let obj = fs::read(chunk_file(&dir, e3.chunk_digest(0).expect("digest"))).expect("read");
    let base = e1.chunk_digest(0).expect("digest");
    assert!(
        obj.windows(64).any(|w| w == base.as_bytes()),
        "g3's chunk 0 is a delta on g1's chunk 0"
    );

    // The parents go: their generations from the store, their local copies from the node.
    store
        .delete("default/counter/7-a")
        .await
        .expect("delete g1");
    store
        .delete("default/counter/8-b")
        .await
        .expect("delete g2");
    fs::remove_dir_all(&fx1.gen_dir).expect("rm g1's local copy");
    fs::remove_dir_all(&fx2.gen_dir).expect("rm g2's local copy");
    for f in chunk_files(&dir) {
        age_file(&f, two_hours);
    }
    // Only g2's own chunk 0 (no manifest references it, no kept delta needs it) goes, with its
    // marker; g1's chunks 0 and 1 stay as the bases of g3's deltas.
    assert_eq!(
        store
            .sweep_unreferenced_chunks("node-a")
            .await
            .expect("sweep"),
        1
    );
    assert!(!chunk_file(&dir, e2.chunk_digest(0).expect("digest")).exists());
    assert!(chunk_file(&dir, base).exists());
    assert!(chunk_file(&dir, e1.chunk_digest(1).expect("digest")).exists());
    assert_eq!(marker_files(&dir).len(), 2, "g3's two deltas keep theirs");
    let target = fx3.root.path().join("node-b/gen");
    assert_eq!(
        download_ok(&store, "default/counter/9-c", &target).await,
        g3
    );
    assert_eq!(verify(&target).await.expect("verified"), g3);
    assert_eq!(
        fs::read(target.join(PAGES)).expect("read"),
        fs::read(fx3.gen_dir.join(PAGES)).expect("read")
    );

    // Once g3 goes too, everything goes: deltas, their bases, the markers.
    store
        .delete("default/counter/9-c")
        .await
        .expect("delete g3");
    for f in chunk_files(&dir) {
        age_file(&f, two_hours);
    }
    store
        .sweep_unreferenced_chunks("node-a")
        .await
        .expect("sweep");
    assert_eq!(chunk_files(&dir), Vec::<PathBuf>::new());
}

/// A damaged base is named; the delta chunk is not rebuilt from it.
#[tokio::test]
async fn a_delta_on_a_damaged_base_is_refused() {
    let (fx1, g1) = changed(&[]).await;
    let (store, dir) = uploaded_7a(&fx1).await;
    let (fx2, g2) = changed(&[(0, 5)]).await;
    upload_over(&store, &fx2, "default/counter/8-b", &[&fx1.gen_dir]).await;
    let base = pages_entry(&g1)
        .chunk_digest(0)
        .expect("digest")
        .to_string();
    // The base replaced by a valid zstd frame of other bytes.
    fs::write(
        chunk_file(&dir, &base),
        zstd::bulk::compress(&vec![7u8; CHUNK_BYTES as usize], 3).expect("compress"),
    )
    .expect("write");
    let err = store
        .fetch_chunk(&pages_entry(&g2), 0)
        .await
        .expect_err("damaged base");
    assert!(err.to_string().contains(&base), "{err}");
    let target = fx2.root.path().join("node-b/gen");
    store
        .download("default/counter/8-b", &target)
        .await
        .expect_err("no download from a damaged base");
    assert!(!target.exists());
}

/// A page added in front of the memory moves every page of the image; matched by address (the
/// generations' layouts), the chunks still go up as deltas, each taking its pages from the two
/// parent chunks it now straddles.
#[tokio::test]
async fn a_shifted_image_goes_up_as_deltas_when_pages_are_matched_by_address() {
    const VADDR: u64 = 0x7f00_0000_0000;
    let (fx1, g1) = changed(&[]).await;
    let (store, dir) = uploaded_7a(&fx1).await;
    // g2: one new page before g1's pages (one page lower in the address space).
    let fx2 = fixture(BIG);
    let path = fx2.gen_dir.join(PAGES);
    let mut shifted = vec![0xabu8; 4096];
    shifted.extend(fs::read(&path).expect("read"));
    fs::write(&path, &shifted).expect("write");
    let g2 = seal(&fx2).await;
    let pages = |dir: &Path, first: u64, n: u64| {
        let mut l = ate_snapshot::MemoryLayout::default();
        l.add(
            PAGES.to_string(),
            [ate_snapshot::PageRun {
                vaddr: first,
                img_offset: 0,
                pages: n,
            }],
        );
        (dir.to_path_buf(), l)
    };
    let layouts = [
        pages(&fx1.gen_dir, VADDR, BIG as u64 / 4096),
        pages(&fx2.gen_dir, VADDR - 4096, BIG as u64 / 4096 + 1),
    ];
    let by_address = |d: &Path| layouts.iter().find(|(p, _)| p == d).map(|(_, l)| l.clone());
    // By offset, nothing matches: whole chunks.
    let (_, whole) = upload_over(&store, &fx2, "default/counter/8-b", &[&fx1.gen_dir]).await;
    assert_eq!(whole.chunks_delta, 0, "{whole:?}");
    store.delete("default/counter/8-b").await.expect("delete");
    for f in chunk_files(&dir) {
        if !pages_entry(&g1)
            .blake3_chunks
            .iter()
            .any(|d| f == chunk_file(&dir, d))
        {
            fs::remove_file(f).expect("drop g2's whole chunks");
        }
    }
    // By address: every chunk is a delta holding at most the one new page.
    let (_, s2) = upload_by(
        &store,
        &fx2,
        "default/counter/9-c",
        &[&fx1.gen_dir],
        &by_address,
    )
    .await;
    assert_eq!(s2.chunks_delta, 3, "{s2:?}");
    assert!(s2.sent_bytes < whole.sent_bytes / 20, "{s2:?} vs {whole:?}");
    let target = fx2.root.path().join("node-b/gen");
    assert_eq!(
        download_ok(&store, "default/counter/9-c", &target).await,
        g2
    );
    assert_eq!(fs::read(target.join(PAGES)).expect("read"), shifted);
}
