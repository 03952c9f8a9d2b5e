//! Durable copies encrypted at rest and authenticated (`DurableStore::with_keys`): no stored byte
//! reveals the generation's contents; tampered, swapped, foreign and plaintext objects are
//! refused as damage naming the object; whole, lazy and chunk-by-chunk reads still work.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use ate_snapshot::{
    CHUNK_BYTES, DurableStore, Error, Manifest, SnapshotKeys, durable_source, verify,
};
use common::*;

const SECRET: &[u8] = b"sk-live-THIS-IS-THE-ACTORS-SECRET-4f9c2";
const PAGES: &str = "criu/pages-1.img";

/// A generation whose memory image, rootfs and volume all hold [`SECRET`], several times.
async fn sealed_with_secret(fx: &Fixture) -> Manifest {
    let pages = fx.gen_dir.join(PAGES);
    let mut bytes = fs::read(&pages).expect("read pages");
    for at in [
        100usize,
        CHUNK_BYTES as usize + 7,
        bytes.len() - SECRET.len(),
    ] {
        bytes[at..at + SECRET.len()].copy_from_slice(SECRET);
    }
    fs::write(&pages, bytes).expect("write pages");
    fs::write(fx.upper.join("etc/secret.env"), SECRET).expect("write");
    fs::write(fx.volumes[0].1.join("token"), SECRET.repeat(100)).expect("write");
    fx.seal_memory().await.expect("seal")
}

fn keys(dir: &Path) -> SnapshotKeys {
    SnapshotKeys::init(&dir.join("keys")).expect("keys")
}

fn store(dir: &Path, keys: Option<SnapshotKeys>) -> DurableStore {
    let s = DurableStore::from_url(&format!("file://{}", dir.display())).expect("store");
    match keys {
        Some(k) => s.with_keys(k),
        None => s,
    }
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every stored file whose bytes contain `needle`.
fn files_with(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    all_files(dir, &mut files);
    files
        .into_iter()
        .filter(|f| holds(&fs::read(f).expect("read"), needle))
        .collect()
}

const KEY_A: &str = "ns/alice/3-5f0e0c4a-1b2c-4d3e-8f00-0123456789ab";
const KEY_B: &str = "ns/bob/3-aaaaaaaa-1b2c-4d3e-8f00-0123456789ab";

#[tokio::test]
async fn nothing_stored_reveals_the_generation_and_every_read_path_works() {
    let fx = fixture((CHUNK_BYTES * 5 / 2) as usize);
    let m = sealed_with_secret(&fx).await;
    let durable = fx.root.path().join("durable");
    let k = keys(fx.root.path());
    let s = store(&durable, Some(k.clone()));
    let uri = s.upload(&fx.gen_dir, KEY_A).await.expect("upload");

    // The control: the secret is in the node-local generation, and an unencrypted store
    // would hold it.
    assert!(!files_with(&fx.gen_dir, SECRET).is_empty());
    let plain_dir = fx.root.path().join("plain");
    store(&plain_dir, None)
        .upload(&fx.gen_dir, KEY_A)
        .await
        .expect("plain upload");
    assert!(
        !files_with(&plain_dir, b"\"atespace\"").is_empty(),
        "an unencrypted store holds a readable manifest"
    );
    let compressible_in_plain = files_with(&plain_dir, b"sk-live-");
    assert!(
        !compressible_in_plain.is_empty(),
        "the secret is visible in an unencrypted store"
    );

    // Encrypted: neither the secret, nor the manifest's JSON, nor a chunk's plain digest.
    assert_eq!(files_with(&durable, SECRET), Vec::<PathBuf>::new());
    assert_eq!(files_with(&durable, b"sk-live-"), Vec::<PathBuf>::new());
    assert_eq!(files_with(&durable, b"\"atespace\""), Vec::<PathBuf>::new());
    let pages = m.file(PAGES).expect("pages").clone();
    let mut names = Vec::new();
    all_files(&durable, &mut names);
    for d in &pages.blake3_chunks {
        assert!(
            !names
                .iter()
                .any(|n| n.to_string_lossy().contains(d.as_str())),
            "chunk digest {d} visible in an object name"
        );
    }
    // Keys are not in the store.
    let key_text = fs::read(fx.root.path().join("keys/data-key.json")).expect("key file");
    assert!(!key_text.is_empty());

    // Whole download.
    let back = fx.root.path().join("back");
    let got = download_ok(&s, &uri, &back).await;
    assert_eq!(got, m);
    verify(&back).await.expect("verify the download");
    assert_eq!(
        fs::read(back.join(PAGES)).expect("read"),
        fs::read(fx.gen_dir.join(PAGES)).expect("read")
    );
    // One chunk, as a page source fetches it.
    let c1 = s.fetch_chunk(&pages, 1).await.expect("fetch chunk");
    let all = fs::read(fx.gen_dir.join(PAGES)).expect("read");
    assert_eq!(c1, all[CHUNK_BYTES as usize..2 * CHUNK_BYTES as usize]);
    // Lazy: the partial copy names the keys, and a store opened from it reads the chunks.
    let lazy = fx.root.path().join("lazy");
    s.download_for_lazy_restore(&uri, &lazy, |_| Ok(vec![(PAGES.to_string(), 0)]))
        .await
        .expect("lazy download");
    let source = durable_source(&lazy).expect("read").expect("partial copy");
    assert_eq!(
        source.keys.as_deref(),
        Some(fx.root.path().join("keys").as_path())
    );
    let from_source = source
        .open_store()
        .expect("open the store the page source way");
    assert_eq!(
        from_source.fetch_chunk(&pages, 2).await.expect("fetch"),
        all[2 * CHUNK_BYTES as usize..]
    );
    // Another upload of the same generation under another key dedupes every chunk.
    let (_, stats) = s
        .upload_with_stats(&fx.gen_dir, KEY_B)
        .await
        .expect("second upload");
    assert_eq!(stats.chunks_reused, pages.blake3_chunks.len() as u64);
}

fn object_file(durable: &Path, key: &str, rel: &str) -> PathBuf {
    durable.join(key).join(rel)
}

#[tokio::test]
async fn swapped_tampered_foreign_and_plaintext_objects_are_refused_naming_them() {
    let fx = fixture((CHUNK_BYTES * 3 / 2) as usize);
    sealed_with_secret(&fx).await;
    let durable = fx.root.path().join("durable");
    let k = keys(fx.root.path());
    let s = store(&durable, Some(k.clone()));
    s.upload(&fx.gen_dir, KEY_A).await.expect("upload a");
    s.upload(&fx.gen_dir, KEY_B).await.expect("upload b");

    let refused = |e: &Error, what: &str| {
        assert!(e.is_corrupt(), "{what}: not reported as damage: {e}");
        assert!(
            matches!(e, Error::Unauthentic { .. }),
            "{what}: not an authentication failure: {e}"
        );
    };

    // Bob's manifest put in Alice's place (another actor, generation and uuid).
    let ma = object_file(&durable, KEY_A, "manifest.json");
    let mb = object_file(&durable, KEY_B, "manifest.json");
    let original = fs::read(&ma).expect("read");
    fs::copy(&mb, &ma).expect("swap");
    let err = s
        .download(KEY_A, &fx.root.path().join("t1"))
        .await
        .expect_err("swapped manifest");
    refused(&err, "swapped manifest");
    assert_eq!(
        err.corrupt_file(),
        Some(format!("{KEY_A}/manifest.json").as_str())
    );
    assert!(err.to_string().contains("manifest.json"), "{err}");
    fs::write(&ma, &original).expect("restore");

    // One flipped bit in the rootfs archive.
    let rootfs = object_file(&durable, KEY_A, "rootfs.tar.zst");
    let good = fs::read(&rootfs).expect("read");
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    fs::write(&rootfs, &bad).expect("tamper");
    let err = s
        .download(KEY_A, &fx.root.path().join("t2"))
        .await
        .expect_err("tampered archive");
    refused(&err, "tampered archive");
    assert!(err.to_string().contains("rootfs.tar.zst"), "{err}");
    fs::write(&rootfs, &good).expect("restore");

    // A tampered memory chunk, found by a page source's fetch.
    let m = s
        .download(KEY_A, &fx.root.path().join("ok"))
        .await
        .expect("intact again");
    let pages = m.file(PAGES).expect("pages").clone();
    let name = k.chunk_name(&pages.blake3_chunks[0]);
    let chunk = durable
        .join("_chunks")
        .join(&name[..2])
        .join(format!("{name}.zst"));
    let good = fs::read(&chunk).expect("read chunk");
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    fs::write(&chunk, &bad).expect("tamper");
    let err = s.fetch_chunk(&pages, 0).await.expect_err("tampered chunk");
    assert!(err.is_corrupt(), "{err}");
    assert!(
        err.to_string().contains(&name),
        "names the chunk object: {err}"
    );
    fs::write(&chunk, &good).expect("restore");

    // Another deployment's keys open nothing.
    let other = store(&durable, Some(keys(&fx.root.path().join("elsewhere"))));
    let err = other
        .download(KEY_A, &fx.root.path().join("t3"))
        .await
        .expect_err("another data key");
    // Refused, but not counted as damage: the copy is intact, the node holds the wrong keys.
    assert!(matches!(err, Error::ForeignKey { .. }), "{err}");
    assert!(!err.is_corrupt(), "{err}");
    assert!(err.to_string().contains("sealed under data key"), "{err}");

    // A plaintext (pre-encryption, or planted) generation: refused unless legacy is allowed.
    let legacy_key = "ns/carol/1-bbbbbbbb-1b2c-4d3e-8f00-0123456789ab";
    store(&durable, None)
        .upload(&fx.gen_dir, legacy_key)
        .await
        .expect("plaintext upload");
    let err = s
        .download(legacy_key, &fx.root.path().join("t4"))
        .await
        .expect_err("plaintext refused");
    refused(&err, "plaintext");
    assert!(err.to_string().contains("not encrypted"), "{err}");
    assert!(
        err.to_string().contains("--snapshot-legacy-plaintext"),
        "{err}"
    );
    let legacy = store(&durable, Some(k.with_legacy_plaintext(true)));
    let m2 = legacy
        .download(legacy_key, &fx.root.path().join("t5"))
        .await
        .expect("a generation written before encryption, read with --snapshot-legacy-plaintext");
    assert_eq!(m2.files, m.files);
}

#[tokio::test]
async fn big_files_go_up_as_sealed_multipart_uploads() {
    // 9 MiB of noise in a file without chunk digests: more than one 8 MiB part.
    let fx = fixture_with_big_file(9 << 20, "big.img");
    fs::write(fx.upper.join("etc/secret.env"), SECRET).expect("write");
    let m = fx.seal_memory().await.expect("seal");
    let durable = fx.root.path().join("durable");
    let s = store(&durable, Some(keys(fx.root.path())));
    s.upload(&fx.gen_dir, KEY_A).await.expect("upload");
    let big = object_file(&durable, KEY_A, "criu/big.img.zst");
    assert!(fs::metadata(&big).expect("stat").len() > 8 << 20);
    let back = fx.root.path().join("back");
    assert_eq!(download_ok(&s, KEY_A, &back).await, m);
    assert_eq!(
        fs::read(back.join("criu/big.img")).expect("read"),
        fs::read(fx.gen_dir.join("criu/big.img")).expect("read")
    );
    assert_eq!(files_with(&durable, SECRET), Vec::<PathBuf>::new());
}

/// The chunk object files of an encrypted store (sweep announcements left out).
fn chunk_files(durable: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    all_files(&durable.join("_chunks"), &mut out);
    out.retain(|p| !p.to_string_lossy().contains("/_sweeps/"));
    out.sort();
    out
}

#[tokio::test]
async fn the_sweep_of_an_encrypted_store_keeps_referenced_chunks_and_takes_the_rest() {
    let two_hours = std::time::Duration::from_secs(2 * 3600);
    let fx = fixture((CHUNK_BYTES * 5 / 2) as usize);
    let a = fx.seal_memory().await.expect("seal a");
    let durable = fx.root.path().join("durable");
    let k = keys(fx.root.path());
    let s = store(&durable, Some(k.clone()));
    s.upload(&fx.gen_dir, KEY_A).await.expect("upload a");

    // b: the same memory but its first chunk changed (shares chunks 1 and 2 with a).
    let fx_b = fixture((CHUNK_BYTES * 5 / 2) as usize);
    let pages_b = fx_b.gen_dir.join(PAGES);
    let mut bytes = fs::read(&pages_b).expect("read");
    bytes[100] ^= 0xff;
    fs::write(&pages_b, bytes).expect("write");
    let b = fx_b.seal_memory().await.expect("seal b");
    let (_, stats) = s
        .upload_with_stats(&fx_b.gen_dir, KEY_B)
        .await
        .expect("upload b");
    assert_eq!(stats.chunks_reused, 2, "{stats:?}");
    assert_eq!(chunk_files(&durable).len(), 4);

    s.delete(KEY_A).await.expect("delete a");
    let only_a = k.chunk_name(
        a.file(PAGES)
            .expect("pages")
            .chunk_digest(0)
            .expect("digest"),
    );
    for f in chunk_files(&durable) {
        age_file(&f, two_hours);
    }
    assert_eq!(
        s.sweep_unreferenced_chunks("node-a").await.expect("sweep"),
        1
    );
    let left = chunk_files(&durable);
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(
        !left.iter().any(|p| p.to_string_lossy().contains(&only_a)),
        "a's own chunk is gone"
    );
    let back = fx.root.path().join("b-back");
    assert_eq!(download_ok(&s, KEY_B, &back).await, b);
}
