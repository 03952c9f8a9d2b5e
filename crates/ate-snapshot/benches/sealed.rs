//! Node-local generations sealed at rest (`ate_snapshot::sealed`), against plaintext in the same
//! run: what a suspend adds (seal the scratch dir into the generation dir), what an eager
//! restore adds (open it whole into a scratch dir on the tmpfs, or stream it into a pipe as CRIU
//! reads it), and what a lazy restore's page
//! source pays per chunk (`MemoryFile::read_trusted_chunk`, sealed frames vs a plain file).
//! Run: `cargo bench -p ate-snapshot --bench sealed` (256 MiB; needs /dev/shm).

use std::fs;
use std::path::Path;
use std::time::Duration;

use ate_snapshot::sealed::{self, Opening, Scratch};
use ate_snapshot::{MemoryFile, PipeSink, SnapshotKeys, seal_generation};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

mod common;
use common::meta;

const MIB: usize = 1 << 20;
const SIZE: usize = 256 * MIB;

/// Memory-image-like content: pseudo-random pages.
fn pages(len: usize) -> Vec<u8> {
    let mut x = common::SEED;
    let mut out = vec![0u8; len];
    common::fill_random(&mut out, &mut x);
    out
}

/// Hands `feed` the write end of a fresh pipe (1 MiB, as the worker's image streamer asks for)
/// while another thread drains the read end into `sink` (as CRIU reads into the restored
/// memory); returns once `feed` has closed its end and `sink` is full.
fn through_pipe(sink: &mut [u8], feed: impl FnOnce(fs::File)) {
    let (read, write) = std::io::pipe().expect("pipe");
    std::thread::scope(|s| {
        let drain = s.spawn(|| {
            use std::io::Read;
            let mut read = read;
            read.read_exact(sink).expect("drain");
        });
        let write = fs::File::from(std::os::fd::OwnedFd::from(write));
        let _ = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        feed(write);
        drain.join().expect("drain thread");
    })
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for e in fs::read_dir(from).expect("read_dir").flatten() {
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            fs::copy(e.path(), &dst).expect("copy");
        }
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let root = tempfile::tempdir().expect("tmp");
    let keys = SnapshotKeys::init(&root.path().join("keys")).expect("keys");
    assert!(sealed::configure(
        Some(keys),
        Path::new(sealed::DEFAULT_SCRATCH).to_path_buf()
    ));
    // The plaintext generation, on the tmpfs as a worker's dump is.
    let plain = Scratch::new("bench-plain").expect("scratch");
    fs::create_dir_all(plain.path().join("criu")).expect("mkdir");
    fs::write(plain.path().join("criu/pages-1.img"), pages(SIZE)).expect("write");
    fs::write(plain.path().join("criu/inventory.img"), b"inv").expect("write");
    let upper = root.path().join("upper");
    fs::create_dir_all(&upper).expect("mkdir");
    let manifest = rt
        .block_on(seal_generation(plain.path(), meta(), Some(&upper), &[]))
        .expect("seal plaintext");
    let entry = manifest.file("criu/pages-1.img").expect("listed").clone();
    // Each side's node-local generation on the disk.
    let on_disk = root.path().join("snapshots/bench/actor");
    let plain_gen = on_disk.join("1-plain");
    copy_dir(plain.path(), &plain_gen);
    let sealed_gen = on_disk.join("1-sealed");
    rt.block_on(sealed::seal_into(plain.path(), &sealed_gen))
        .expect("seal_into");

    let mut g = c.benchmark_group("node_local_256MiB");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(15))
        .throughput(Throughput::Bytes(SIZE as u64));
    let mut n = 0;
    g.bench_function("suspend_write/plain_copy", |b| {
        b.iter(|| {
            n += 1;
            let to = on_disk.join(format!("w-{n}"));
            copy_dir(plain.path(), &to);
            fs::remove_dir_all(&to).expect("rm");
        })
    });
    g.bench_function("suspend_write/seal_into", |b| {
        b.iter(|| {
            n += 1;
            let to = on_disk.join(format!("w-{n}"));
            rt.block_on(sealed::seal_into(plain.path(), &to))
                .expect("seal_into");
            fs::remove_dir_all(&to).expect("rm");
        })
    });
    g.bench_function("eager_open/plain_in_place", |b| {
        // A plaintext generation is read where it is: the baseline is one read of it.
        b.iter(|| {
            fs::read(plain_gen.join("criu/pages-1.img"))
                .expect("read")
                .len()
        })
    });
    g.bench_function("eager_open/open_into_scratch", |b| {
        b.iter(|| {
            let s = Scratch::new("bench-open").expect("scratch");
            rt.block_on(sealed::open_into(&sealed_gen, s.path(), Opening::All))
                .expect("open");
        })
    });
    // An eager restore through CRIU's image streamer: the memory image written into a pipe
    // that another thread drains into one buffer (as CRIU reads into the restored memory), from
    // a plaintext generation (the bare pipe) and opened from the sealed one.
    for (label, dir) in [("plain", &plain_gen), ("sealed", &sealed_gen)] {
        g.bench_function(format!("eager_stream_to_pipe/{label}"), |b| {
            let file = MemoryFile::open(dir, &entry).expect("open");
            let mut sink = vec![0u8; SIZE];
            b.iter(|| {
                through_pipe(&mut sink, |mut write| {
                    file.stream_to(&entry, &mut write, Path::new("pipe"), 2)
                        .expect("stream");
                })
            })
        });
    }
    // The same, the opened pages handed to the pipe by reference (what the worker does).
    g.bench_function("eager_stream_to_pipe/sealed_vmsplice", |b| {
        let file = MemoryFile::open(&sealed_gen, &entry).expect("open");
        let mut sink = vec![0u8; SIZE];
        b.iter(|| {
            through_pipe(&mut sink, |write| {
                let mut pipe = PipeSink::new(write);
                file.stream_to(&entry, &mut pipe, Path::new("pipe"), 2)
                    .expect("stream");
                pipe.finish().expect("finish");
            })
        })
    });
    for (label, dir) in [("plain", &plain_gen), ("sealed", &sealed_gen)] {
        g.bench_function(format!("page_source_chunks/{label}"), |b| {
            let file = MemoryFile::open(dir, &entry).expect("open");
            let mut buf = Vec::new();
            b.iter(|| {
                for i in 0..entry.chunk_count() {
                    file.read_trusted_chunk(&entry, i, &mut buf).expect("chunk");
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
