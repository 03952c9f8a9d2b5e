//! Flattening an incremental dump: its pages left to the parent (`PE_PARENT` entries) copied
//! in from the parent's images, so the result stands alone (no `parent` link) and restores like
//! any whole dump (docs/incremental-suspend.md: a delta generation is flattened in the
//! background before anything but a restore uses it).
//!
//! Every `pagemap*.img` of the dump (tasks' and shared memory's) is rewritten: its entries in
//! address order as they were, each in-parent run replaced by runs that hold the parent's pages
//! (split where the parent's entries split), keeping the `PE_LAZY` flag the dump gave it; the
//! pages file is written anew in that order. Every other image is linked (or copied) as is.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use prost::Message;

use super::parse::{RawEntry, read_raw_pagemap};
use super::{
    IMG_COMMON_MAGIC, ImageError, PAGE_SIZE, PAGEMAP_MAGIC, PE_KNOWN, PE_LAZY, PE_PARENT,
    PE_PRESENT, PagemapEntry, PagemapHead, pages_file_name,
};

/// Name of CRIU's link from an incremental dump to its parent images.
pub const PARENT_LINK: &str = "parent";

/// One pagemap entry as CRIU wrote it.
type Run = RawEntry;

/// What [`flatten`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flattened {
    /// Pages taken from the dump itself.
    pub own_pages: u64,
    /// Pages copied in from the parent.
    pub parent_pages: u64,
}

fn format_err(path: &Path, message: impl Into<String>) -> ImageError {
    ImageError::Format {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A pagemap's pages id and its entries, checked: known flags, page-aligned, no overflow.
fn read_runs(path: &Path) -> Result<(u32, Vec<Run>), ImageError> {
    let (pages_id, runs) = read_raw_pagemap(path)?;
    for run in &runs {
        if run.flags & !PE_KNOWN != 0 || run.vaddr % PAGE_SIZE != 0 {
            return Err(format_err(
                path,
                format!("pagemap entry at {:#x}: flags {:#x}", run.vaddr, run.flags),
            ));
        }
        run.pages
            .checked_mul(PAGE_SIZE)
            .and_then(|len| run.vaddr.checked_add(len))
            .ok_or_else(|| format_err(path, format!("{} pages at {:#x}", run.pages, run.vaddr)))?;
    }
    Ok((pages_id, runs))
}

fn write_entry(out: &mut impl Write, bytes: &[u8], path: &Path) -> Result<(), ImageError> {
    let len = u32::try_from(bytes.len()).map_err(|_| format_err(path, "entry too large"))?;
    out.write_all(&len.to_ne_bytes()).map_err(io_err(path))?;
    out.write_all(bytes).map_err(io_err(path))
}

/// The parent's pages, by address: sorted `(run, byte offset in its pages file)` of its
/// `PE_PRESENT` entries. A parent that is itself incremental is refused: flatten it first.
fn parent_index(path: &Path) -> Result<(u32, Vec<(Run, u64)>), ImageError> {
    let (pages_id, runs) = read_runs(path)?;
    let mut offset = 0u64;
    let mut index = Vec::with_capacity(runs.len());
    for run in runs {
        if run.flags & PE_PARENT != 0 {
            return Err(ImageError::Unsupported {
                path: path.to_path_buf(),
                message: "the parent is itself incremental: flatten it first".into(),
            });
        }
        if run.flags & PE_PRESENT != 0 {
            index.push((run, offset));
            offset += run.pages * PAGE_SIZE;
        }
    }
    index.sort_unstable_by_key(|(r, _)| r.vaddr);
    Ok((pages_id, index))
}

/// Copies `len` bytes at `offset` of `from` to `to`.
fn copy_span(
    from: &mut File,
    from_path: &Path,
    offset: u64,
    len: u64,
    to: &mut impl Write,
    to_path: &Path,
) -> Result<(), ImageError> {
    from.seek(SeekFrom::Start(offset))
        .map_err(io_err(from_path))?;
    let copied = std::io::copy(&mut Read::by_ref(from).take(len), to).map_err(io_err(to_path))?;
    if copied != len {
        return Err(format_err(
            from_path,
            format!("{len} bytes at {offset} asked, the file ends after {copied}"),
        ));
    }
    Ok(())
}

/// Writes into `out` (an empty or new dir) a whole dump equal to the incremental dump `delta`
/// on top of the whole dump `parent`. Nothing in `delta` or `parent` changes; `out` is left
/// half written on error (the caller writes into a scratch dir and renames).
pub fn flatten(delta: &Path, parent: &Path, out: &Path) -> Result<Flattened, ImageError> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut done = Flattened::default();
    for dirent in std::fs::read_dir(delta).map_err(io_err(delta))? {
        let dirent = dirent.map_err(io_err(delta))?;
        let name = dirent.file_name();
        let Some(name) = name.to_str() else {
            return Err(format_err(delta, "an image whose name is not UTF-8"));
        };
        let src = dirent.path();
        if name == PARENT_LINK || (name.starts_with("pages-") && name.ends_with(".img")) {
            // The link goes; pages files are written below, from the pagemaps.
            continue;
        }
        if name.starts_with("pagemap") && name.ends_with(".img") {
            let got = flatten_pagemap(delta, parent, out, name)?;
            done.own_pages += got.own_pages;
            done.parent_pages += got.parent_pages;
            continue;
        }
        let dst = out.join(name);
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(io_err(&src))?;
        }
    }
    Ok(done)
}

fn flatten_pagemap(
    delta: &Path,
    parent: &Path,
    out: &Path,
    name: &str,
) -> Result<Flattened, ImageError> {
    let path = delta.join(name);
    let (pages_id, runs) = read_runs(&path)?;
    let mut done = Flattened::default();
    let in_parent = runs.iter().any(|r| r.flags & PE_PARENT != 0);
    let (parent_pages_id, index) = if in_parent {
        parent_index(&parent.join(name))?
    } else {
        (0, Vec::new())
    };
    let own_path = delta.join(pages_file_name(pages_id));
    let mut own = File::open(&own_path).map_err(io_err(&own_path))?;
    let parent_pages_path = parent.join(pages_file_name(parent_pages_id));
    let mut parent_pages = if in_parent {
        Some(File::open(&parent_pages_path).map_err(io_err(&parent_pages_path))?)
    } else {
        None
    };
    let out_pages_path = out.join(pages_file_name(pages_id));
    let mut out_pages =
        BufWriter::new(File::create(&out_pages_path).map_err(io_err(&out_pages_path))?);
    let out_map_path = out.join(name);
    let mut out_map = BufWriter::new(File::create(&out_map_path).map_err(io_err(&out_map_path))?);
    out_map
        .write_all(&IMG_COMMON_MAGIC.to_ne_bytes())
        .and_then(|()| out_map.write_all(&PAGEMAP_MAGIC.to_ne_bytes()))
        .map_err(io_err(&out_map_path))?;
    write_entry(
        &mut out_map,
        &PagemapHead { pages_id }.encode_to_vec(),
        &out_map_path,
    )?;
    let entry = |vaddr: u64, pages: u64, flags: u32| PagemapEntry {
        vaddr,
        // CRIU writes nr_pages and a compat count that fits (criu/page-xfer.c).
        compat_nr_pages: u32::try_from(pages).unwrap_or(u32::MAX),
        in_parent: None,
        flags: Some(flags),
        nr_pages: Some(pages),
    };
    // Offsets in the dump's own pages file follow its PE_PRESENT entries in pagemap order.
    let mut own_offset = 0u64;
    for run in runs {
        if run.flags & PE_PRESENT != 0 {
            let len = run.pages * PAGE_SIZE;
            copy_span(
                &mut own,
                &own_path,
                own_offset,
                len,
                &mut out_pages,
                &out_pages_path,
            )?;
            own_offset += len;
            done.own_pages += run.pages;
            write_entry(
                &mut out_map,
                &entry(run.vaddr, run.pages, run.flags).encode_to_vec(),
                &out_map_path,
            )?;
            continue;
        }
        if run.flags & PE_PARENT == 0 {
            // Neither here nor in the parent: CRIU writes no such entry.
            return Err(format_err(
                &path,
                format!(
                    "pagemap entry at {:#x} is neither present nor in the parent",
                    run.vaddr
                ),
            ));
        }
        let Some(parent_file) = parent_pages.as_mut() else {
            return Err(format_err(
                &path,
                "in-parent pages without a parent pagemap",
            ));
        };
        // Cover [vaddr, end) from the parent's entries, in address order.
        let (mut at, end) = (run.vaddr, run.end());
        while at < end {
            let i = index.partition_point(|(r, _)| r.end() <= at);
            let Some(&(p, p_offset)) = index.get(i).filter(|(r, _)| r.vaddr <= at) else {
                return Err(format_err(
                    &path,
                    format!("page {at:#x} is left to the parent, which does not hold it"),
                ));
            };
            let piece_end = end.min(p.end());
            let len = piece_end - at;
            copy_span(
                parent_file,
                &parent_pages_path,
                p_offset + (at - p.vaddr),
                len,
                &mut out_pages,
                &out_pages_path,
            )?;
            done.parent_pages += len / PAGE_SIZE;
            write_entry(
                &mut out_map,
                &entry(at, len / PAGE_SIZE, PE_PRESENT | (run.flags & PE_LAZY)).encode_to_vec(),
                &out_map_path,
            )?;
            at = piece_end;
        }
    }
    out_pages
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .map_err(io_err(&out_pages_path))?;
    out_map
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .map_err(io_err(&out_map_path))?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    fn write_pagemap(dir: &Path, name: &str, pages_id: u32, runs: &[(u64, u64, u32)]) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&IMG_COMMON_MAGIC.to_ne_bytes());
        bytes.extend_from_slice(&PAGEMAP_MAGIC.to_ne_bytes());
        let mut push = |b: Vec<u8>| {
            bytes.extend_from_slice(&(b.len() as u32).to_ne_bytes());
            bytes.extend_from_slice(&b);
        };
        push(PagemapHead { pages_id }.encode_to_vec());
        for &(vaddr, pages, flags) in runs {
            push(
                PagemapEntry {
                    vaddr,
                    compat_nr_pages: pages as u32,
                    in_parent: None,
                    flags: Some(flags),
                    nr_pages: Some(pages),
                }
                .encode_to_vec(),
            );
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    /// Pages filled with one byte each, named by `tag` and the page's address.
    fn pages(tag: u8, vaddrs: impl IntoIterator<Item = u64>) -> Vec<u8> {
        vaddrs
            .into_iter()
            .flat_map(|v| std::iter::repeat_n(tag ^ (v / P) as u8, P as usize))
            .collect()
    }

    #[test]
    fn in_parent_runs_are_filled_from_the_parent_and_flags_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (parent, delta, out) = (
            dir.path().join("p"),
            dir.path().join("d"),
            dir.path().join("o"),
        );
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::create_dir_all(&delta).unwrap();
        // Parent: pages 10..14 eager, 20..30 lazy (in two entries), stored in that order.
        let lazy = PE_PRESENT | PE_LAZY;
        write_pagemap(
            &parent,
            "pagemap-1.img",
            7,
            &[
                (10 * P, 4, PE_PRESENT),
                (20 * P, 6, lazy),
                (26 * P, 4, lazy),
            ],
        );
        let parent_pages = pages(0xA0, (10..14).chain(20..30).map(|p| p * P));
        std::fs::write(parent.join("pages-7.img"), &parent_pages).unwrap();
        // Delta: 10..14 rewritten (eager), 20..24 in parent, 24 rewritten, 25..30 in parent
        // (across the parent's two entries).
        write_pagemap(
            &delta,
            "pagemap-1.img",
            3,
            &[
                (10 * P, 4, PE_PRESENT),
                (20 * P, 4, PE_PARENT | PE_LAZY),
                (24 * P, 1, lazy),
                (25 * P, 5, PE_PARENT | PE_LAZY),
            ],
        );
        let own = pages(0xB0, (10..14).chain(24..25).map(|p| p * P));
        std::fs::write(delta.join("pages-3.img"), &own).unwrap();
        std::fs::write(delta.join("core-1.img"), b"core").unwrap();
        std::os::unix::fs::symlink("../p", delta.join(PARENT_LINK)).unwrap();

        let done = flatten(&delta, &parent, &out).unwrap();
        assert_eq!(
            done,
            Flattened {
                own_pages: 5,
                parent_pages: 9
            }
        );
        assert!(!out.join(PARENT_LINK).exists());
        assert_eq!(std::fs::read(out.join("core-1.img")).unwrap(), b"core");
        let (id, runs) = read_runs(&out.join("pagemap-1.img")).unwrap();
        assert_eq!(id, 3);
        assert!(runs.iter().all(|r| r.flags & PE_PARENT == 0));
        assert_eq!(
            runs,
            vec![
                Run {
                    vaddr: 10 * P,
                    pages: 4,
                    flags: PE_PRESENT
                },
                Run {
                    vaddr: 20 * P,
                    pages: 4,
                    flags: lazy
                },
                Run {
                    vaddr: 24 * P,
                    pages: 1,
                    flags: lazy
                },
                Run {
                    vaddr: 25 * P,
                    pages: 1,
                    flags: lazy
                },
                Run {
                    vaddr: 26 * P,
                    pages: 4,
                    flags: lazy
                },
            ]
        );
        let mut expected = pages(0xB0, (10..14).map(|p| p * P));
        expected.extend(pages(0xA0, (20..24).map(|p| p * P)));
        expected.extend(pages(0xB0, [24 * P]));
        expected.extend(pages(0xA0, (25..30).map(|p| p * P)));
        assert_eq!(std::fs::read(out.join("pages-3.img")).unwrap(), expected);
        // The inputs are untouched.
        assert_eq!(
            std::fs::read(parent.join("pages-7.img")).unwrap(),
            parent_pages
        );
        assert_eq!(std::fs::read(delta.join("pages-3.img")).unwrap(), own);
    }

    #[test]
    fn a_page_the_parent_lacks_or_an_incremental_parent_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (parent, delta) = (dir.path().join("p"), dir.path().join("d"));
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::create_dir_all(&delta).unwrap();
        write_pagemap(&parent, "pagemap-1.img", 1, &[(10 * P, 2, PE_PRESENT)]);
        std::fs::write(parent.join("pages-1.img"), pages(1, [10 * P, 11 * P])).unwrap();
        write_pagemap(&delta, "pagemap-1.img", 2, &[(11 * P, 2, PE_PARENT)]);
        std::fs::write(delta.join("pages-2.img"), b"").unwrap();
        let err = flatten(&delta, &parent, &dir.path().join("o1")).unwrap_err();
        assert!(err.to_string().contains("does not hold it"), "{err}");

        write_pagemap(&parent, "pagemap-1.img", 1, &[(10 * P, 2, PE_PARENT)]);
        write_pagemap(&delta, "pagemap-1.img", 2, &[(10 * P, 2, PE_PARENT)]);
        let err = flatten(&delta, &parent, &dir.path().join("o2")).unwrap_err();
        assert!(err.to_string().contains("flatten it first"), "{err}");
    }
}
