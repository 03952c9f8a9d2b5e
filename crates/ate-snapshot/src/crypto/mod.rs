//! Snapshots encrypted at rest and authenticated: every object of the durable store (memory
//! chunks, compressed archives and files, manifests) is sealed with AES-256-GCM (aws-lc-rs)
//! under the store's data key, see docs/security.md ("Snapshots at rest").
//!
//! An object is
//!
//! ```text
//! "ATEENC1\0" | u8 id length | data key id | 32-byte salt | frame 0 | frame 1 | …
//! frame i = u32 LE length of what follows | AES-256-GCM(plaintext ≤ 1 MiB) ‖ 16-byte tag
//! ```
//!
//! Each object has its own key, HKDF-SHA256(data key, salt), so frame nonces are simply the
//! frame's index (never reused under one key). Every frame's associated data is the object's
//! path and the frame's index: a frame moved within an object, or an object copied to another
//! path (another actor's generation, an older generation's key, another chunk's name), fails to
//! open. A durable key is `<atespace>/<name>/<generation>-<uuid>`, so the manifest is bound to
//! the actor, its generation number and uuid. Truncation after a whole frame is caught by the
//! manifest (every file's size and checksum, every chunk's digest), whose own object is one
//! frame.
//!
//! Content-addressed chunk objects are named by a keyed BLAKE3 of the chunk's digest
//! ([`SnapshotKeys::chunk_name`]), so the bucket does not reveal which chunks hold which known
//! contents; equal chunks still get equal names within the data key's scope, which is what keeps
//! dedupe working.

pub(crate) mod file;
mod keys;
mod mapped;
mod store;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::hkdf::{HKDF_SHA256, Salt};
use bytes::{Buf, Bytes, BytesMut};

pub use keys::{
    DATA_KEY_FILE, FileKek, KEY_BYTES, KeyEncryptionKey, Rotation, SnapshotKeys, rotate,
};
pub(crate) use store::{EncryptedStore, open_error};

use crate::error::{Error, Result};

/// First bytes of every sealed object.
pub(crate) const MAGIC: &[u8; 8] = b"ATEENC1\0";
const SALT_BYTES: usize = 32;
/// Plaintext bytes per frame.
pub(crate) const FRAME_BYTES: usize = 1 << 20;
/// Plaintext bytes of a whole object's first frame ([`seal_object`]): a reader of an object's
/// first bytes (a chunk's delta header, `chunk_delta::PREFIX_BYTES`) fetches and opens this
/// much, not a whole 1 MiB frame (or the whole object). Objects sealed before this have a long
/// first frame; a ranged read of them falls back to the whole object.
pub(crate) const FIRST_FRAME_BYTES: usize = 4 << 10;
const TAG_BYTES: usize = 16;
/// The longest header: magic, id length, a 255-byte data key id, salt.
pub(crate) const MAX_HEADER_BYTES: usize = MAGIC.len() + 1 + 255 + SALT_BYTES;
/// Stored bytes that hold the header and a first frame of [`FIRST_FRAME_BYTES`].
pub(crate) const FIRST_FRAME_STORED_BYTES: usize =
    MAX_HEADER_BYTES + 4 + FIRST_FRAME_BYTES + TAG_BYTES;
const OBJECT_INFO: &[u8] = b"ate snapshot object v1";

/// HKDF-SHA256(ikm, salt) expanded to 32 bytes for `info`.
pub(crate) fn derive(ikm: &[u8], salt: &[u8], info: &[u8]) -> Result<[u8; KEY_BYTES]> {
    struct Len;
    impl aws_lc_rs::hkdf::KeyType for Len {
        fn len(&self) -> usize {
            KEY_BYTES
        }
    }
    let mut out = [0u8; KEY_BYTES];
    Salt::new(HKDF_SHA256, salt)
        .extract(ikm)
        .expand(&[info], Len)
        .and_then(|okm| okm.fill(&mut out))
        .map_err(|_| Error::Keys("key derivation failed".into()))?;
    Ok(out)
}

fn object_key(keys: &SnapshotKeys, salt: &[u8]) -> Result<LessSafeKey> {
    let k = derive(&keys.data_key, salt, OBJECT_INFO)?;
    UnboundKey::new(&AES_256_GCM, &k)
        .map(LessSafeKey::new)
        .map_err(|_| Error::Keys("not an AES-256 key".into()))
}

/// The key of an object whose header names data key `id` and carries `salt`; refused when `id`
/// is not the data key this process holds.
fn header_key(
    keys: &SnapshotKeys,
    id: &[u8],
    salt: &[u8],
) -> std::result::Result<LessSafeKey, OpenError> {
    if id != keys.data_key_id.as_bytes() {
        return Err(OpenError::OtherKey {
            found: String::from_utf8_lossy(id).into_owned(),
            held: keys.data_key_id.clone(),
        });
    }
    object_key(keys, salt).map_err(|e| OpenError::Key(e.to_string()))
}

/// The key and the header's length of the object `stored` starts (it starts with [`MAGIC`]);
/// `None` while `stored` is shorter than its header.
fn read_header(
    keys: &SnapshotKeys,
    stored: &[u8],
) -> std::result::Result<Option<(LessSafeKey, usize)>, OpenError> {
    let Some(&id_len) = stored.get(MAGIC.len()) else {
        return Ok(None);
    };
    let id_end = MAGIC.len() + 1 + usize::from(id_len);
    let Some(salt) = stored.get(id_end..id_end + SALT_BYTES) else {
        return Ok(None);
    };
    let key = header_key(keys, &stored[MAGIC.len() + 1..id_end], salt)?;
    Ok(Some((key, id_end + SALT_BYTES)))
}

/// Opens frame `index` of the object at `path` (`sealed`: its ciphertext, then its tag) out of
/// place into `plain`, which is as long as the ciphertext.
fn open_frame_into(
    key: &LessSafeKey,
    path: &str,
    index: u64,
    sealed: &[u8],
    plain: &mut [u8],
) -> std::result::Result<(), OpenError> {
    let frame = || OpenError::Frame(index);
    let (ciphertext, tag) = sealed
        .split_at_checked(sealed.len().checked_sub(TAG_BYTES).ok_or_else(frame)?)
        .ok_or_else(frame)?;
    key.open_separate_gather(
        nonce(index),
        Aad::from(aad(path, index)),
        ciphertext,
        tag,
        plain,
    )
    .map_err(|_| frame())
}

fn nonce(index: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&index.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aad(path: &str, index: u64) -> Vec<u8> {
    let mut a = Vec::with_capacity(path.len() + 9);
    a.extend_from_slice(path.as_bytes());
    a.push(0);
    a.extend_from_slice(&index.to_be_bytes());
    a
}

impl SnapshotKeys {
    /// The name of the content-addressed object of the chunk with BLAKE3 `digest`: 64 hex digits,
    /// a keyed BLAKE3 of the digest under this scope's name key.
    pub fn chunk_name(&self, digest: &str) -> String {
        blake3::keyed_hash(&self.name_key, digest.as_bytes())
            .to_hex()
            .to_string()
    }
}

/// Seals the object at `path`, frame by frame; [`Sealer::header`] first.
pub(crate) struct Sealer {
    key: LessSafeKey,
    path: String,
    header: Vec<u8>,
    next: u64,
}

impl Sealer {
    pub(crate) fn new(keys: &SnapshotKeys, path: &str) -> Result<Self> {
        let salt = random_salt()?;
        let id = keys.data_key_id.as_bytes();
        let mut header = Vec::with_capacity(MAGIC.len() + 1 + id.len() + SALT_BYTES);
        header.extend_from_slice(MAGIC);
        header.push(id.len() as u8);
        header.extend_from_slice(id);
        header.extend_from_slice(&salt);
        Ok(Self {
            key: object_key(keys, &salt)?,
            path: path.to_string(),
            header,
            next: 0,
        })
    }

    pub(crate) fn header(&self) -> &[u8] {
        &self.header
    }

    /// Seals `plain` as frames of at most [`FRAME_BYTES`], appended to `out`.
    /// Nothing to seal still makes one (empty) frame: an object always has at least one.
    pub(crate) fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let empty: [&[u8]; 1] = [&[]];
        let pieces: Box<dyn Iterator<Item = &[u8]>> = if plain.is_empty() {
            Box::new(empty.into_iter())
        } else {
            Box::new(plain.chunks(FRAME_BYTES))
        };
        for piece in pieces {
            // The piece is copied once, into `out`, and sealed where it lies.
            out.reserve(4 + piece.len() + TAG_BYTES);
            out.extend_from_slice(&((piece.len() + TAG_BYTES) as u32).to_le_bytes());
            let at = out.len();
            out.extend_from_slice(piece);
            let tag = self
                .key
                .seal_in_place_separate_tag(
                    nonce(self.next),
                    Aad::from(aad(&self.path, self.next)),
                    &mut out[at..],
                )
                .map_err(|_| Error::Keys("seal failed".into()))?;
            out.extend_from_slice(tag.as_ref());
            self.next += 1;
        }
        Ok(())
    }
}

/// A whole object sealed in one go (header and frames): a first frame of at most
/// [`FIRST_FRAME_BYTES`], then frames of [`FRAME_BYTES`].
pub(crate) fn seal_object(keys: &SnapshotKeys, path: &str, plain: &[u8]) -> Result<Vec<u8>> {
    let mut s = Sealer::new(keys, path)?;
    let (first, rest) = plain.split_at(plain.len().min(FIRST_FRAME_BYTES));
    let frames = 1 + rest.len().div_ceil(FRAME_BYTES);
    let mut out = Vec::with_capacity(s.header().len() + plain.len() + frames * (TAG_BYTES + 4));
    out.extend_from_slice(s.header());
    s.seal(first, &mut out)?;
    if !rest.is_empty() {
        s.seal(rest, &mut out)?;
    }
    Ok(out)
}

fn random_salt() -> Result<[u8; SALT_BYTES]> {
    let mut salt = [0u8; SALT_BYTES];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| Error::Keys("no random bytes".into()))?;
    Ok(salt)
}

/// Why an object does not open: it is not what this store wrote at that path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error(
        "not encrypted (no header): written before snapshot encryption or by someone else; refused (restart the node with --snapshot-legacy-plaintext to read generations written before encryption)"
    )]
    Plaintext,
    #[error("sealed under data key {found:?}, this node holds {held:?}")]
    OtherKey { found: String, held: String },
    #[error("frame {0} fails authentication: damaged, tampered with, or moved from another object")]
    Frame(u64),
    #[error("truncated ({0})")]
    Truncated(&'static str),
    #[error("{0}")]
    Key(String),
}

enum State {
    Header,
    Frames(LessSafeKey),
    /// Legacy plaintext, passed through.
    Plain,
}

/// Opens a sealed object as it streams in ([`Opener::push`] each piece, [`Opener::finish`] at
/// the end).
pub(crate) struct Opener {
    keys: SnapshotKeys,
    path: String,
    buf: BytesMut,
    state: State,
    next: u64,
}

impl Opener {
    pub(crate) fn new(keys: &SnapshotKeys, path: &str) -> Self {
        Self {
            keys: keys.clone(),
            path: path.to_string(),
            buf: BytesMut::new(),
            state: State::Header,
            next: 0,
        }
    }

    /// Takes the next piece of the stored object; returns the plaintext it completes, one
    /// piece per frame.
    pub(crate) fn push(&mut self, piece: &[u8]) -> std::result::Result<Vec<Bytes>, OpenError> {
        if let State::Plain = self.state {
            return Ok(vec![Bytes::copy_from_slice(piece)]);
        }
        self.buf.extend_from_slice(piece);
        if let State::Header = self.state {
            let n = self.buf.len().min(MAGIC.len());
            if self.buf[..n] != MAGIC[..n] {
                if self.keys.legacy_plaintext {
                    self.state = State::Plain;
                    return Ok(vec![self.buf.split().freeze()]);
                }
                return Err(OpenError::Plaintext);
            }
            let Some((key, need)) = read_header(&self.keys, &self.buf)? else {
                return Ok(Vec::new());
            };
            self.buf.advance(need);
            self.state = State::Frames(key);
        }
        let State::Frames(key) = &self.state else {
            return Ok(Vec::new());
        };
        // Each frame is opened in place and handed on without a copy; several are joined.
        let mut frames: Vec<Bytes> = Vec::new();
        loop {
            if self.buf.len() < 4 {
                break;
            }
            let len =
                u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            if !(TAG_BYTES..=FRAME_BYTES + TAG_BYTES).contains(&len) {
                return Err(OpenError::Frame(self.next));
            }
            if self.buf.len() < 4 + len {
                break;
            }
            self.buf.advance(4);
            let mut frame = self.buf.split_to(len);
            let n = key
                .open_in_place(
                    nonce(self.next),
                    Aad::from(aad(&self.path, self.next)),
                    &mut frame,
                )
                .map_err(|_| OpenError::Frame(self.next))?
                .len();
            frame.truncate(n);
            frames.push(frame.freeze());
            self.next += 1;
        }
        Ok(frames)
    }

    /// The object ended: anything left over is a torn frame.
    pub(crate) fn finish(&self) -> std::result::Result<(), OpenError> {
        match self.state {
            State::Plain => Ok(()),
            State::Header => {
                if self.buf.is_empty() && !self.keys.legacy_plaintext {
                    // An empty object: nothing sealed it.
                    Err(OpenError::Plaintext)
                } else if self.buf.is_empty() {
                    Ok(())
                } else {
                    Err(OpenError::Truncated("header"))
                }
            }
            State::Frames(_) if self.buf.is_empty() && self.next > 0 => Ok(()),
            State::Frames(_) => Err(OpenError::Truncated("frame")),
        }
    }
}

/// The pieces [`Opener::push`] returned, as one.
pub(crate) fn join(pieces: Vec<Bytes>) -> Bytes {
    match pieces.len() {
        0 => Bytes::new(),
        1 => pieces.into_iter().next().unwrap_or_default(),
        _ => {
            let mut out = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
            for p in &pieces {
                out.extend_from_slice(p);
            }
            out.freeze()
        }
    }
}

/// Opens a whole stored object, each frame out of place into one plaintext buffer: the
/// ciphertext is read once (by AES-GCM) and nothing is copied to join frames. Refuses what
/// [`Opener`] refuses, with the same errors.
pub(crate) fn open_object(
    keys: &SnapshotKeys,
    path: &str,
    stored: &[u8],
) -> std::result::Result<Bytes, OpenError> {
    if !stored.starts_with(MAGIC) {
        // Plaintext, or too short to tell: the streaming opener's rules.
        let mut o = Opener::new(keys, path);
        let out = join(o.push(stored)?);
        o.finish()?;
        return Ok(out);
    }
    let (key, need) = read_header(keys, stored)?.ok_or(OpenError::Truncated("header"))?;
    // Every frame's place, checked for shape before anything is opened.
    let mut frames = Vec::new();
    let (mut at, mut plain_len) = (need, 0usize);
    while at < stored.len() {
        let len = stored
            .get(at..at + 4)
            .and_then(|p| p.first_chunk::<4>())
            .map(|p| u32::from_le_bytes(*p) as usize)
            .ok_or(OpenError::Truncated("frame"))?;
        if !(TAG_BYTES..=FRAME_BYTES + TAG_BYTES).contains(&len) {
            return Err(OpenError::Frame(frames.len() as u64));
        }
        let frame = stored
            .get(at + 4..at + 4 + len)
            .ok_or(OpenError::Truncated("frame"))?;
        plain_len += len - TAG_BYTES;
        frames.push(frame);
        at += 4 + len;
    }
    if frames.is_empty() {
        return Err(OpenError::Truncated("frame"));
    }
    let mut out = vec![0u8; plain_len];
    let mut written = 0;
    for (index, frame) in (0u64..).zip(frames) {
        let n = frame.len() - TAG_BYTES;
        open_frame_into(&key, path, index, frame, &mut out[written..written + n])?;
        written += n;
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> SnapshotKeys {
        SnapshotKeys::from_data_key("dk-test", &[7u8; 32]).expect("keys")
    }

    #[test]
    fn round_trip_in_any_pieces() {
        let k = keys();
        let plain: Vec<u8> = (0..(FRAME_BYTES * 2 + 12345))
            .map(|i| (i % 251) as u8)
            .collect();
        let sealed = seal_object(&k, "a/b/1-u/rootfs.tar.zst", &plain).expect("seal");
        assert!(
            !sealed.windows(64).any(|w| w == &plain[1000..1064]),
            "plaintext visible in the sealed object"
        );
        for piece in [1usize, 7, 4096, FRAME_BYTES + 3, sealed.len()] {
            let mut o = Opener::new(&k, "a/b/1-u/rootfs.tar.zst");
            let mut out = Vec::new();
            for p in sealed.chunks(piece) {
                for f in o.push(p).expect("push") {
                    out.extend_from_slice(&f);
                }
            }
            o.finish().expect("finish");
            assert_eq!(out, plain, "piece {piece}");
        }
        // An empty object seals to one frame and opens to nothing.
        let empty = seal_object(&k, "x", b"").expect("seal");
        assert!(open_object(&k, "x", &empty).expect("open").is_empty());
    }

    #[test]
    fn moved_tampered_truncated_or_foreign_objects_do_not_open() {
        let k = keys();
        let plain = vec![42u8; FRAME_BYTES + 10];
        let sealed = seal_object(&k, "ns/a/2-u/manifest.json", &plain).expect("seal");
        // Another path (another actor, an older generation).
        assert!(matches!(
            open_object(&k, "ns/b/2-u/manifest.json", &sealed),
            Err(OpenError::Frame(0))
        ));
        assert!(matches!(
            open_object(&k, "ns/a/1-v/manifest.json", &sealed),
            Err(OpenError::Frame(0))
        ));
        // A flipped bit (in the second frame: a short first one, then the rest).
        let mut bad = sealed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(matches!(
            open_object(&k, "ns/a/2-u/manifest.json", &bad),
            Err(OpenError::Frame(1))
        ));
        // Torn in the middle of a frame.
        assert!(matches!(
            open_object(&k, "ns/a/2-u/manifest.json", &sealed[..sealed.len() - 5]),
            Err(OpenError::Truncated(_))
        ));
        // Another data key.
        let other = SnapshotKeys::from_data_key("dk-other", &[8u8; 32]).expect("keys");
        assert!(matches!(
            open_object(&other, "ns/a/2-u/manifest.json", &sealed),
            Err(OpenError::OtherKey { .. })
        ));
        let same_id = SnapshotKeys::from_data_key("dk-test", &[9u8; 32]).expect("keys");
        assert!(open_object(&same_id, "ns/a/2-u/manifest.json", &sealed).is_err());
        // Plaintext: refused unless legacy objects are allowed.
        assert!(matches!(
            open_object(&k, "p", b"{\"format_version\":3}"),
            Err(OpenError::Plaintext)
        ));
        let legacy = k.clone().with_legacy_plaintext(true);
        assert_eq!(
            &open_object(&legacy, "p", b"{\"format_version\":3}").expect("legacy")[..],
            b"{\"format_version\":3}"
        );
    }

    #[test]
    fn chunk_names_are_keyed() {
        let k = keys();
        let d = "ab".repeat(32);
        let n = k.chunk_name(&d);
        assert_eq!(n.len(), 64);
        assert_ne!(n, d);
        assert_eq!(n, k.chunk_name(&d), "deterministic within a scope");
        let other = SnapshotKeys::from_data_key("dk-other", &[8u8; 32]).expect("keys");
        assert_ne!(n, other.chunk_name(&d), "another scope, another name");
    }
}
