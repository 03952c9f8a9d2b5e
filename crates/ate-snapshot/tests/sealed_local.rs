//! Node-local generations sealed at rest (`ate_snapshot::sealed`): written in plaintext into a
//! scratch dir, sealed into the generation dir, opened again for use. Nothing of the plaintext
//! is left in the sealed copy; a file that was flipped, moved in from another generation or
//! truncated, and a swapped manifest, are refused naming the file.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Once;

use ate_core::Fidelity;
use ate_snapshot::sealed::{self, Opening, Scratch};
use common::{fixture, meta};

const SECRET: &[u8] = b"sk-live-0123456789abcdef-SECRET";

fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Keys loaded from a directory, as a worker's are: a page source can load them too.
        let dir = std::env::temp_dir().join(format!("ate-keys-test-{}", std::process::id()));
        let keys = ate_snapshot::SnapshotKeys::init(&dir).expect("keys");
        let scratch = std::env::temp_dir().join(format!("ate-scratch-test-{}", std::process::id()));
        assert!(sealed::configure(Some(keys), scratch));
        // Loaded: nothing here reads the directory again (no page source runs).
        let _ = fs::remove_dir_all(&dir);
    });
}

/// A plaintext generation (memory image holding SECRET, archives) sealed into
/// `<root>/snapshots/ns/counter/<dir>`.
async fn sealed_generation(dir: &str) -> (common::Fixture, PathBuf) {
    configure();
    let f = fixture(3 * 1024 * 1024 + 17);
    let mut pages = fs::read(f.gen_dir.join("criu/pages-1.img")).expect("read");
    pages[1_000_000..1_000_000 + SECRET.len()].copy_from_slice(SECRET);
    fs::write(f.gen_dir.join("criu/pages-1.img"), &pages).expect("write");
    f.seal_memory().await.expect("seal plaintext");
    let gen_dir = f.root.path().join("snapshots/ns/counter").join(dir);
    let m = sealed::seal_into(&f.gen_dir, &gen_dir)
        .await
        .expect("seal_into");
    assert_eq!(m.generation, 7);
    (f, gen_dir)
}

fn contains(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    for e in walk(dir) {
        if fs::read(&e).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
            hits.push(e);
        }
    }
    hits
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A scratch dir (named after `label`) with `gen_dir` opened into it as `opening` says; panics
/// with `what` if it cannot be.
async fn opened(gen_dir: &Path, label: &str, opening: Opening, what: &str) -> Scratch {
    let scratch = Scratch::new(label).expect("scratch");
    sealed::open_into(gen_dir, scratch.path(), opening)
        .await
        .expect(what);
    scratch
}

#[tokio::test]
async fn a_sealed_generation_shows_no_plaintext_and_opens_whole() {
    let (f, gen_dir) = sealed_generation("7-abc").await;
    assert!(sealed::is_encrypted(&gen_dir));
    assert!(!sealed::is_encrypted(&f.gen_dir));
    assert!(
        !contains(&f.gen_dir, SECRET).is_empty(),
        "the fixture holds the secret"
    );
    assert_eq!(contains(&gen_dir, SECRET), Vec::<PathBuf>::new());
    assert_eq!(
        contains(&gen_dir, b"counter=41").len(),
        0,
        "archives are sealed too"
    );
    assert_eq!(
        contains(&gen_dir, b"default/counter").len(),
        0,
        "the manifest too"
    );

    // Read in place: the manifest opens, every file verifies through its frames.
    let m = ate_snapshot::read_manifest(&gen_dir)
        .await
        .expect("manifest");
    assert_eq!(m.name, "counter");
    ate_snapshot::verify(&gen_dir).await.expect("verify sealed");

    // Opened into a scratch dir: the same bytes as the plaintext generation.
    let scratch = opened(&gen_dir, "test", Opening::All, "open").await;
    common::assert_same_files(&m, scratch.path(), &f.gen_dir);
    ate_snapshot::verify(scratch.path())
        .await
        .expect("verify opened");
    // Without the memory images: their chunks are read from the sealed files on demand.
    let small = opened(&gen_dir, "test", Opening::Small, "open small").await;
    assert!(!small.path().join("criu/pages-1.img").exists());
    assert!(small.path().join("rootfs.tar").is_file());
    let source = ate_snapshot::sealed_source(small.path())
        .expect("marker")
        .expect("a sealed source");
    assert_eq!(source.generation, gen_dir);
    let pages = m.file("criu/pages-1.img").expect("listed");
    let plain_pages = fs::read(f.gen_dir.join("criu/pages-1.img")).expect("plain");
    let file = ate_snapshot::MemoryFile::open(small.path(), pages).expect("open chunks");
    assert!(file.is_sealed());
    let mut buf = Vec::new();
    for index in 0..pages.chunk_count() {
        file.read_verified_chunk(pages, index, &mut buf)
            .expect("chunk");
        let (start, end) = pages.chunk_range(index).expect("range");
        assert_eq!(
            buf,
            plain_pages[start as usize..end as usize],
            "chunk {index}"
        );
    }
    ate_snapshot::verify(small.path())
        .await
        .expect("verify small, memory where it is sealed");
    assert!(contains(small.path(), SECRET).is_empty(), "no memory in it");

    // For a lazy restore: the chunks CRIU reads itself in a sparse image of the full size.
    let lazy = Scratch::new("test").expect("scratch");
    sealed::open_for_lazy_restore(&gen_dir, lazy.path(), |dir| {
        assert!(
            dir.join("criu/inventory.img").is_file(),
            "small files first"
        );
        Ok(vec![("criu/pages-1.img".to_string(), 1)])
    })
    .await
    .expect("open for a lazy restore");
    let sparse = fs::read(lazy.path().join("criu/pages-1.img")).expect("sparse image");
    assert_eq!(sparse.len(), plain_pages.len());
    let (start, end) = pages.chunk_range(1).expect("range");
    assert_eq!(
        sparse[start as usize..end as usize],
        plain_pages[start as usize..end as usize]
    );
    assert!(
        sparse[..start as usize].iter().all(|b| *b == 0),
        "chunk 0 left to the page source"
    );
    assert!(
        ate_snapshot::sealed_source(lazy.path())
            .expect("marker")
            .is_some()
    );
    assert!(
        contains(lazy.path(), SECRET).is_empty(),
        "chunk 0 holds the secret"
    );
    let path = scratch.path().to_path_buf();
    drop(scratch);
    assert!(!path.exists(), "a scratch dir goes when dropped");
}

#[tokio::test]
async fn flipped_moved_truncated_or_swapped_files_are_refused_naming_them() {
    let (_f, gen_dir) = sealed_generation("7-abc").await;
    let (_g, other) = sealed_generation("6-def").await;
    let refused = |e: ate_snapshot::Error, file: &str| {
        assert!(e.is_corrupt(), "{e}");
        assert_eq!(e.corrupt_file(), Some(file), "{e}");
    };
    let open = |dir: PathBuf| async move {
        let s = Scratch::new("test").expect("scratch");
        sealed::open_into(&dir, s.path(), Opening::All)
            .await
            .map(|_| ())
    };

    // A flipped bit in a memory image.
    let pages = gen_dir.join("criu/pages-1.img");
    let good = fs::read(&pages).expect("read");
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    fs::write(&pages, &bad).expect("write");
    refused(
        open(gen_dir.clone()).await.expect_err("flipped"),
        "criu/pages-1.img",
    );
    refused(
        ate_snapshot::verify(&gen_dir).await.expect_err("flipped"),
        "criu/pages-1.img",
    );
    // Read chunk by chunk through a scratch dir opened without it (an upload, a page source):
    // the chunk holding the flipped byte is refused naming the file, the other one reads.
    let small = Scratch::new("test").expect("scratch");
    let m = sealed::open_into(&gen_dir, small.path(), Opening::Small)
        .await
        .expect("the small files are intact");
    let entry = m.file("criu/pages-1.img").expect("listed");
    let file = ate_snapshot::MemoryFile::open(small.path(), entry).expect("header intact");
    let mut buf = Vec::new();
    let flipped_chunk = (good.len() / 2) as u64 / ate_snapshot::CHUNK_BYTES;
    let e = file
        .read_verified_chunk(entry, flipped_chunk, &mut buf)
        .expect_err("flipped chunk");
    assert!(e.is_corrupt(), "{e}");
    assert_eq!(e.corrupt_file(), Some("criu/pages-1.img"), "{e}");
    file.read_verified_chunk(entry, 1 - flipped_chunk, &mut buf)
        .expect("the other chunk");
    // Another generation's copy of the same file (same keys, same size): bound to its path.
    fs::copy(other.join("criu/pages-1.img"), &pages).expect("copy");
    refused(
        open(gen_dir.clone()).await.expect_err("moved"),
        "criu/pages-1.img",
    );
    // Cut short.
    fs::write(&pages, &good[..good.len() - 100]).expect("write");
    let e = open(gen_dir.clone()).await.expect_err("truncated");
    assert!(e.is_corrupt(), "{e}");
    fs::write(&pages, &good).expect("write");
    open(gen_dir.clone()).await.expect("intact again");

    // The manifest of another generation put in its place (a roll-back or a swap).
    let manifest = gen_dir.join("manifest.json");
    fs::copy(other.join("manifest.json"), &manifest).expect("copy");
    refused(
        ate_snapshot::read_manifest(&gen_dir)
            .await
            .expect_err("swapped"),
        "manifest.json",
    );
    refused(
        open(gen_dir.clone()).await.expect_err("swapped"),
        "manifest.json",
    );
}

#[tokio::test]
async fn scratch_dirs_of_gone_processes_are_swept() {
    configure();
    let mine = Scratch::new("restore").expect("scratch");
    let root = mine.path().parent().expect("root").to_path_buf();
    // pid 0x7ffffffe is never a live process here.
    let orphan = root.join("restore-2147483646-deadbeef");
    fs::create_dir_all(orphan.join("criu")).expect("mkdir");
    assert!(sealed::sweep_scratch() >= 1);
    assert!(!orphan.exists());
    assert!(mine.path().is_dir(), "a live process's scratch stays");
}

/// A suspend with snapshot keys hashes and seals the dump in one read
/// (`seal_actor_generation_into`): the manifest pins the same chunk digests and sizes as the
/// plaintext seal of the same dump, the sealed copy shows no plaintext, and it opens to the
/// same bytes. An empty memory image (no chunks) keeps its sha256.
#[tokio::test]
async fn a_dump_sealed_in_one_read_matches_the_plaintext_seal() {
    configure();
    let f = fixture(5 * 1024 * 1024 + 4099);
    let mut pages = fs::read(f.gen_dir.join("criu/pages-1.img")).expect("read");
    pages[3_000_000..3_000_000 + SECRET.len()].copy_from_slice(SECRET);
    fs::write(f.gen_dir.join("criu/pages-1.img"), &pages).expect("write");
    fs::write(f.gen_dir.join("criu/pages-2.img"), b"").expect("write");
    // The same dump twice: one sealed in plaintext, one (a scratch dir) sealed at rest.
    let dump = f.root.path().join("scratch-dump");
    fs::create_dir_all(dump.join("criu/sub")).expect("mkdir");
    for rel in walk(&f.gen_dir.join("criu")) {
        let to = dump.join(rel.strip_prefix(&f.gen_dir).expect("under"));
        fs::copy(&rel, &to).expect("copy");
    }
    let plain = f.seal_memory().await.expect("seal plaintext");
    let gen_dir = f.root.path().join("snapshots/ns/counter/7-onepass");
    let at_rest = sealed::seal_actor_generation_into(
        &dump,
        &gen_dir,
        meta(Fidelity::Memory),
        Some(&f.upper),
        &[],
        &f.volumes,
    )
    .await
    .expect("seal at rest");

    let by_path = |m: &ate_snapshot::Manifest| {
        m.files
            .iter()
            .map(|e| (e.path.clone(), e.size, e.blake3_chunks.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(by_path(&at_rest), by_path(&plain));
    let memory = at_rest
        .files
        .iter()
        .find(|e| e.path == "criu/pages-1.img")
        .expect("memory image");
    assert_eq!(
        memory.blake3_chunks.len(),
        3,
        "5 MiB + 4099 bytes: 3 chunks"
    );
    assert!(memory.sha256.is_empty(), "pinned by its chunks alone");
    let empty = at_rest
        .files
        .iter()
        .find(|e| e.path == "criu/pages-2.img")
        .expect("empty memory image");
    let plain_empty = plain
        .files
        .iter()
        .find(|e| e.path == "criu/pages-2.img")
        .expect("empty memory image");
    assert_eq!(
        (empty.sha256.as_str(), empty.blake3_chunks.len()),
        (plain_empty.sha256.as_str(), 0)
    );
    assert!(!empty.sha256.is_empty());

    assert!(sealed::is_encrypted(&gen_dir));
    assert_eq!(contains(&gen_dir, SECRET), Vec::<PathBuf>::new());
    assert!(
        !dump.join("manifest.json").exists(),
        "no plaintext manifest"
    );
    ate_snapshot::verify(&gen_dir).await.expect("verify sealed");
    let scratch = opened(&gen_dir, "test", Opening::All, "open").await;
    assert_eq!(
        fs::read(scratch.path().join("criu/pages-1.img")).expect("opened"),
        pages
    );
    // Sealing into a sealed generation is refused and changes nothing.
    let again = sealed::seal_actor_generation_into(
        &dump,
        &gen_dir,
        meta(Fidelity::Memory),
        Some(&f.upper),
        &[],
        &f.volumes,
    )
    .await;
    assert!(
        matches!(again, Err(ate_snapshot::Error::AlreadySealed { .. })),
        "{again:?}"
    );
    ate_snapshot::verify(&gen_dir).await.expect("still intact");
}

/// A writer that takes `left` bytes, then fails as a pipe whose reader is gone.
struct HungUp {
    left: usize,
}

impl std::io::Write for HungUp {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let n = buf.len().min(self.left);
        self.left -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_memory_image_streams_whole_in_order_and_stops_at_a_bad_chunk() {
    let (f, gen_dir) = sealed_generation("7-abc").await;
    let plain = fs::read(f.gen_dir.join("criu/pages-1.img")).expect("read");
    let small = Scratch::new("test").expect("scratch");
    let m = sealed::open_into(&gen_dir, small.path(), Opening::Small)
        .await
        .expect("open the small files");
    let entry = m.file("criu/pages-1.img").expect("listed");
    assert!(entry.chunk_count() >= 2, "the test needs several chunks");
    let shown = Path::new("pipe");
    // Sealed (through the scratch dir's marker) and plain give the same bytes, whatever the
    // number of threads.
    for threads in [1, 2, 3] {
        let file = ate_snapshot::MemoryFile::open(small.path(), entry).expect("sealed");
        assert!(file.is_sealed());
        let mut out = Vec::new();
        file.stream_to(entry, &mut out, shown, threads)
            .expect("stream");
        assert!(out == plain, "{threads} threads: streamed bytes differ");
    }
    // Through a pipe that takes the pages by reference (the worker's image streamer), read
    // slowly in small pieces: a buffer is not filled again before its bytes are read.
    for pipe_bytes in [64 << 10, 1 << 20, 8 << 20] {
        let file = ate_snapshot::MemoryFile::open(small.path(), entry).expect("sealed");
        let (mut read, write) = std::io::pipe().expect("pipe");
        let write = fs::File::from(std::os::fd::OwnedFd::from(write));
        let _ = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(pipe_bytes));
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut out = Vec::new();
            let mut piece = vec![0u8; 3000];
            loop {
                let n = read.read(&mut piece).expect("read");
                if n == 0 {
                    return out;
                }
                out.extend_from_slice(&piece[..n]);
                if out.len() % (64 << 10) < 3000 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        });
        let mut sink = ate_snapshot::PipeSink::new(write);
        file.stream_to(entry, &mut sink, shown, 2)
            .expect("stream into the pipe");
        sink.finish().expect("the reader read it all");
        let out = reader.join().expect("reader");
        assert!(
            out == plain,
            "a {pipe_bytes}-byte pipe: streamed bytes differ"
        );
    }
    let plain_file = ate_snapshot::MemoryFile::open(&f.gen_dir, entry).expect("plain");
    let mut out = Vec::new();
    plain_file
        .stream_to(entry, &mut out, shown, 2)
        .expect("stream plain");
    assert!(out == plain);

    // A reader that hangs up is an I/O error naming the output, and no thread is left waiting.
    let file = ate_snapshot::MemoryFile::open(small.path(), entry).expect("sealed");
    let e = file
        .stream_to(entry, &mut HungUp { left: 3000 }, shown, 2)
        .expect_err("hung up");
    assert!(e.to_string().contains("pipe"), "{e}");

    // A flipped byte in the second chunk: the first chunk is written, nothing of the second,
    // and the error names the file.
    let pages = gen_dir.join("criu/pages-1.img");
    let good = fs::read(&pages).expect("read");
    let mut bad = good.clone();
    let at = (ate_snapshot::CHUNK_BYTES + 4096) as usize;
    bad[at] ^= 0x01;
    fs::write(&pages, &bad).expect("write");
    let file = ate_snapshot::MemoryFile::open(small.path(), entry).expect("header intact");
    let mut out = Vec::new();
    let e = file
        .stream_to(entry, &mut out, shown, 2)
        .expect_err("flipped");
    assert!(e.is_corrupt(), "{e}");
    assert_eq!(e.corrupt_file(), Some("criu/pages-1.img"), "{e}");
    assert_eq!(out.len() as u64, ate_snapshot::CHUNK_BYTES);
    assert!(out[..] == plain[..out.len()]);
}

/// An incremental generation made whole (`replace_memory`): its memory images are replaced by
/// the flat ones, sealed and bound to the same directory, every other file is the same sealed
/// file, the manifest names no parent any more, and the whole opens and verifies; the
/// replacement leaves nothing beside it.
#[tokio::test]
async fn replacing_the_memory_of_a_sealed_generation_keeps_the_rest_and_drops_the_parent() {
    let (f, gen_dir) = sealed_generation("7-aaaa").await;
    // The same generation, as an incremental one would be sealed (its manifest names a parent).
    let plain = opened(&gen_dir, "test-delta", Opening::All, "open").await;
    let delta_dir = f.root.path().join("snapshots/ns/counter/8-bbbb");
    let mut meta = meta(Fidelity::Memory);
    meta.generation = 8;
    meta.parent = Some(ate_snapshot::ParentGeneration {
        dir: "7-aaaa".into(),
        generation: 7,
        uuid: meta.uuid.clone(),
    });
    let delta = sealed::seal_actor_generation_into(
        plain.path(),
        &delta_dir,
        meta,
        Some(&f.upper),
        &[],
        &f.volumes,
    )
    .await
    .expect("seal the delta");
    assert!(delta.parent.is_some());
    let rootfs_before = fs::read(delta_dir.join("rootfs.tar")).expect("sealed rootfs");

    // The flat images: a different memory image.
    let flat = Scratch::new("test-flat").expect("scratch");
    fs::create_dir_all(flat.path().join("criu")).expect("mkdir");
    let pages = common::noise(5 * 1024 * 1024 + 3, 9);
    fs::write(flat.path().join("criu/pages-1.img"), &pages).expect("write");
    fs::write(flat.path().join("criu/inventory.img"), b"flat inventory").expect("write");
    let m = ate_snapshot::replace_memory(&delta_dir, flat.path())
        .await
        .expect("replace");
    assert_eq!(m.parent, None);
    assert_eq!(m.generation, 8);
    assert_eq!(
        m.file("criu/pages-1.img").map(|e| e.size),
        Some(pages.len() as u64)
    );
    assert_eq!(m.file("criu/sub/extra.img"), None, "old images are gone");
    assert_eq!(
        fs::read(delta_dir.join("rootfs.tar")).expect("sealed rootfs"),
        rootfs_before,
        "the rootfs archive is the same sealed file"
    );
    assert_eq!(
        ate_snapshot::read_manifest(&delta_dir)
            .await
            .expect("manifest"),
        m
    );
    ate_snapshot::verify(&delta_dir)
        .await
        .expect("verifies whole");
    let opened = opened(&delta_dir, "test-opened", Opening::All, "opens whole").await;
    assert_eq!(
        fs::read(opened.path().join("criu/pages-1.img")).expect("read"),
        pages
    );
    let beside: Vec<_> = fs::read_dir(delta_dir.parent().expect("parent"))
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        beside.len(),
        2,
        "only the two generations remain: {beside:?}"
    );
}
