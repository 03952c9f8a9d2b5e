//! The upload side of delta chunks (`chunk_delta`): which pages of a new chunk can be named as
//! pages of chunks the store holds whole, found through the actor's earlier generations on this
//! node.
//!
//! For each page of a new chunk: its virtual address (the new generation's [`MemoryLayout`]),
//! the page at that address in a parent generation (the parent's layout; without layouts, the
//! same offset of the same image), the parent's chunk holding it, and how the store holds that
//! chunk: whole (the page is page N of it) or as a delta (the page is wherever that delta takes
//! it from, or a literal of it, which cannot be named). A page equal to its parent's page is
//! named; every other is a literal. The parent's chunk is read from the parent's local copy and
//! checked against its digest first, so a named page is the page the store holds.
//!
//! Bases must be younger than a quarter of the store's grace age, like reused chunks (see
//! `chunks/`): a sweep cannot take them before this upload's manifest references the delta
//! (whose markers then keep them).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use object_store::ObjectStoreExt;

use crate::chunk_delta::{self, CHUNK_PAGES, DeltaHeader, PAGE, PageFrom};
use crate::durable::DurableStore;
use crate::layout::MemoryLayout;
use crate::manifest::{CHUNK_BYTES, FileEntry, Manifest};

/// An earlier generation on this node whose pages a new generation's chunks may name.
#[derive(Debug, Clone)]
pub(crate) struct Parent {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub layout: Option<MemoryLayout>,
    /// A download for a lazy restore from this store (`DURABLE_SOURCE_FILE`): its memory images
    /// hold only the chunks its page source wrote back (none on a node that seals its
    /// generations), so a chunk it lacks is fetched from the store for the comparison.
    pub partial: bool,
}

/// What one upload knows for its deltas: the new generation's layout, its parents, and how the
/// store holds the parents' chunks (looked up once per upload).
pub(crate) struct DeltaSources {
    pub layout: Option<MemoryLayout>,
    pub parents: Vec<Parent>,
    stored: Mutex<HashMap<String, Stored>>,
}

/// How the store holds a chunk, as far as a delta naming its pages cares.
#[derive(Debug, Clone)]
enum Stored {
    /// Whole, and recent enough to be a base.
    Whole,
    /// A delta whose bases are all recent enough.
    Delta(Arc<DeltaHeader>),
    /// Missing, old, or unreadable: its pages are not named.
    Unusable,
}

/// The page of a parent's chunk that a page of the new chunk is compared with.
#[derive(Debug, Clone, Copy)]
struct ParentPage {
    parent: usize,
    chunk: u64,
    page: usize,
}

/// A delta worked out before the chunk is read: per page of the new chunk, the parent page it
/// may equal and the base page that holds it.
pub(crate) struct DeltaPlan {
    pages: Vec<Option<(ParentPage, String, u16)>>,
    parents: Vec<(PathBuf, FileEntry)>,
    /// Parent chunks fetched from the store (a partial parent lacked them): `(parent, chunk)`.
    fetched: HashMap<(usize, u64), Vec<u8>>,
}

impl Default for DeltaSources {
    /// No parents: every chunk goes whole.
    fn default() -> Self {
        DeltaSources::new(None, Vec::new())
    }
}

impl DeltaSources {
    pub(crate) fn new(layout: Option<MemoryLayout>, parents: Vec<Parent>) -> Self {
        DeltaSources {
            layout,
            parents,
            stored: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// Where page `offset` of image `path` of the new generation is in `parent`'s image of the
    /// same path: by address when both have layouts, else the same offset.
    fn parent_offset(&self, parent: &Parent, path: &str, offset: u64) -> Option<u64> {
        match (&self.layout, &parent.layout) {
            (Some(new), Some(old)) => old.offset_of(path, new.vaddr_at(path, offset)?),
            _ => Some(offset),
        }
    }

    fn stored(&self, digest: &str) -> Option<Stored> {
        self.stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .cloned()
    }

    fn remember(&self, digest: &str, s: Stored) {
        self.stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), s);
    }
}

impl DurableStore {
    /// How the store holds chunk `digest` (cached in `sources` for the upload).
    async fn stored_form(&self, digest: &str, sources: &DeltaSources) -> Stored {
        if let Some(s) = sources.stored(digest) {
            return s;
        }
        let s = self.look_up_stored_form(digest, sources).await;
        sources.remember(digest, s.clone());
        s
    }

    async fn look_up_stored_form(&self, digest: &str, sources: &DeltaSources) -> Stored {
        let obj = self.chunk_object(digest);
        let opts = object_store::GetOptions {
            range: Some((0..chunk_delta::PREFIX_BYTES as u64).into()),
            ..Default::default()
        };
        let Ok(got) = self.store.get_opts(&obj, opts).await else {
            return Stored::Unusable;
        };
        let written: SystemTime = got.meta.last_modified.into();
        let Ok(prefix) = got.bytes().await else {
            return Stored::Unusable;
        };
        match chunk_delta::parse_header(&prefix, obj.as_ref()) {
            Ok(None) if !self.chunk_needs_renewal(written) => Stored::Whole,
            Ok(Some(h)) => {
                for base in &h.bases {
                    // A base of a delta is whole unless replaced since; only its age counts.
                    let young = match sources.stored(base) {
                        Some(Stored::Whole) => true,
                        Some(_) => false,
                        None => match self.store.head(&self.chunk_object(base)).await {
                            Ok(m) => !self.chunk_needs_renewal(m.last_modified.into()),
                            Err(_) => false,
                        },
                    };
                    if !young {
                        return Stored::Unusable;
                    }
                }
                Stored::Delta(Arc::new(h))
            }
            _ => Stored::Unusable,
        }
    }

    /// The plan for storing chunk `index` of `entry` as a delta, or `None` when too few of its
    /// pages could be named (no parent holds them, or the store does not hold their chunks in a
    /// usable way) for a delta to be worth it.
    pub(crate) async fn plan_delta(
        &self,
        entry: &FileEntry,
        index: u64,
        sources: &DeltaSources,
    ) -> Option<DeltaPlan> {
        let (start, end) = entry.chunk_range(index)?;
        let len = (end - start) as usize;
        let n = chunk_delta::pages_in(len);
        let mut candidates: Vec<Option<ParentPage>> = vec![None; n];
        let mut parents: Vec<(PathBuf, FileEntry)> = Vec::new();
        let mut partial: Vec<bool> = Vec::new();
        let mut entries: BTreeMap<usize, usize> = BTreeMap::new();
        for (p, slot) in candidates.iter_mut().enumerate() {
            let offset = start + (p * PAGE) as u64;
            let page_len = ((end - offset) as usize).min(PAGE) as u64;
            for (pi, parent) in sources.parents.iter().enumerate() {
                let Some(pentry) = parent.manifest.file(&entry.path) else {
                    continue;
                };
                let Some(poff) = sources.parent_offset(parent, &entry.path, offset) else {
                    continue;
                };
                if poff % PAGE as u64 != 0 || poff + page_len > pentry.size {
                    continue;
                }
                let chunk = poff / CHUNK_BYTES;
                if pentry.chunk_digest(chunk).is_none() {
                    continue;
                }
                let slot_index = *entries.entry(pi).or_insert_with(|| {
                    parents.push((parent.dir.clone(), pentry.clone()));
                    partial.push(parent.partial);
                    parents.len() - 1
                });
                *slot = Some(ParentPage {
                    parent: slot_index,
                    chunk,
                    page: ((poff % CHUNK_BYTES) as usize) / PAGE,
                });
                break;
            }
        }
        if candidates.iter().filter(|c| c.is_none()).count() > chunk_delta::MAX_DELTA_PAGES {
            return None;
        }
        let mut pages = Vec::with_capacity(n);
        for c in candidates {
            let Some(c) = c else {
                pages.push(None);
                continue;
            };
            let pentry = &parents[c.parent].1;
            let Some(pdigest) = pentry.chunk_digest(c.chunk) else {
                pages.push(None);
                continue;
            };
            let named = match self.stored_form(pdigest, sources).await {
                Stored::Whole => Some((pdigest.to_string(), c.page as u16)),
                Stored::Delta(h) => match h.pages.get(c.page) {
                    Some(PageFrom::Base { base, page }) => {
                        h.bases.get(usize::from(*base)).map(|b| (b.clone(), *page))
                    }
                    _ => None,
                },
                Stored::Unusable => None,
            };
            pages.push(named.map(|(base, page)| (c, base, page)));
        }
        if pages.iter().filter(|p| p.is_none()).count() > chunk_delta::MAX_DELTA_PAGES {
            return None;
        }
        let mut fetched = HashMap::new();
        let wanted: std::collections::BTreeSet<(usize, u64)> = pages
            .iter()
            .flatten()
            .map(|(c, ..)| (c.parent, c.chunk))
            .filter(|(parent, _)| partial[*parent])
            .collect();
        for (parent, chunk) in wanted {
            let (dir, pentry) = parents[parent].clone();
            let local =
                tokio::task::spawn_blocking(move || read_parent_chunk(&dir, &pentry, chunk))
                    .await
                    .ok()
                    .flatten();
            // Fetched chunks are verified against their digest like local ones; one that does
            // not arrive only leaves its pages literal.
            let data = match local {
                Some(data) => Some(data),
                None => self.fetch_chunk(&parents[parent].1, chunk).await.ok(),
            };
            if let Some(data) = data {
                fetched.insert((parent, chunk), data);
            }
        }
        Some(DeltaPlan {
            pages,
            parents,
            fetched,
        })
    }
}

/// Chunk `index` of a parent's image, read where the parent holds it and checked (a plain one
/// against its digest, a sealed one by opening it: `MemoryFile::read_trusted_chunk`); `None`
/// when it does not hold it (a partial download) or it does not check. Blocking.
fn read_parent_chunk(dir: &std::path::Path, entry: &FileEntry, index: u64) -> Option<Vec<u8>> {
    let file = crate::generation::MemoryFile::open(dir, entry).ok()?;
    let mut buf = Vec::new();
    file.read_trusted_chunk(entry, index, &mut buf).ok()?;
    Some(buf)
}

/// The delta object for `new` (chunk `digest`) following `plan`, and its bases; `None` when it
/// would hold too many literal pages or take from too many bases, or a parent's chunk does not
/// read back with its digest (a lazy restore's partial download). Blocking.
pub(crate) fn encode_planned(
    plan: &DeltaPlan,
    digest: &str,
    new: &[u8],
    level: i32,
) -> Option<(Vec<u8>, Vec<String>)> {
    // Parent chunks read so far: (parent, chunk) → contents, None when unusable.
    let mut read: HashMap<(usize, u64), Option<Vec<u8>>> = HashMap::new();
    let mut bases: Vec<String> = Vec::new();
    let mut table = Vec::with_capacity(plan.pages.len());
    for (p, slot) in plan.pages.iter().enumerate() {
        let from = slot.as_ref().and_then(|(pp, base, page)| {
            let chunk = read.entry((pp.parent, pp.chunk)).or_insert_with(|| {
                if let Some(data) = plan.fetched.get(&(pp.parent, pp.chunk)) {
                    return Some(data.clone());
                }
                let (dir, pentry) = &plan.parents[pp.parent];
                read_parent_chunk(dir, pentry, pp.chunk)
            });
            let start = p * PAGE;
            let n = (new.len() - start).min(PAGE);
            let old = chunk.as_ref()?.get(pp.page * PAGE..pp.page * PAGE + n)?;
            if old != &new[start..start + n] || base == digest {
                return None;
            }
            let b = match bases.iter().position(|x| x == base) {
                Some(b) => b,
                None if bases.len() < chunk_delta::MAX_BASES => {
                    bases.push(base.clone());
                    bases.len() - 1
                }
                None => return None,
            };
            Some(PageFrom::Base {
                base: b as u8,
                page: *page,
            })
        });
        table.push(from.unwrap_or(PageFrom::Literal));
    }
    let h = DeltaHeader {
        len: new.len(),
        bases,
        pages: table,
    };
    if h.bases.is_empty()
        || h.literals() > chunk_delta::MAX_DELTA_PAGES
        || h.pages.len() > CHUNK_PAGES
    {
        return None;
    }
    let obj = chunk_delta::encode(&h, new, level).ok()?;
    Some((obj, h.bases))
}
