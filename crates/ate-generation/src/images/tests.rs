//! Unit tests of reading CRIU's pagemap and pages images for the page source.

use super::fixtures::{framed as frame, image};
use super::*;

const P: u64 = PAGE_SIZE;

fn pe(vaddr: u64, nr_pages: u64, flags: u32) -> PagemapEntry {
    PagemapEntry {
        vaddr,
        compat_nr_pages: 0,
        in_parent: None,
        flags: Some(flags),
        nr_pages: Some(nr_pages),
    }
}

fn write_pagemap(dir: &Path, pid: i32, pages_id: u32, entries: &[PagemapEntry]) {
    let mut framed = vec![frame(&PagemapHead { pages_id })];
    framed.extend(entries.iter().map(frame));
    std::fs::write(
        dir.join(format!("pagemap-{pid}.img")),
        image(PAGEMAP_MAGIC, &framed),
    )
    .unwrap();
}

fn write_mm(dir: &Path, pid: i32, vmas: &[(u64, u64)]) {
    let mm = MmEntry {
        vmas: vmas
            .iter()
            .map(|&(start, end)| VmaEntry {
                start,
                end,
                status: 1 | (1 << 9),
            })
            .collect(),
    };
    std::fs::write(
        dir.join(format!("mm-{pid}.img")),
        image(MM_MAGIC, &[frame(&mm)]),
    )
    .unwrap();
}

fn r(start: u64, end: u64, img_offset: u64) -> ImageRange {
    ImageRange {
        start,
        end,
        img_offset,
    }
}

const LP: u32 = PE_LAZY | PE_PRESENT;

#[test]
fn offsets_and_eager_lazy_separation() {
    let dir = tempfile::tempdir().unwrap();
    write_pagemap(
        dir.path(),
        42,
        7,
        &[
            pe(0x10000, 2, PE_PRESENT),
            pe(0x20000, 3, LP),
            pe(0x40000, 1, PE_PRESENT),
            pe(0x50000, 4, LP),
        ],
    );
    write_mm(dir.path(), 42, &[(0x10000, 0x12000), (0x20000, 0x60000)]);
    let tp = read_task_pages(dir.path(), 42).unwrap();
    assert_eq!(tp.pages_id, 7);
    assert_eq!(
        tp.eager,
        vec![r(0x10000, 0x12000, 0), r(0x40000, 0x41000, 5 * P)]
    );
    assert_eq!(
        tp.lazy,
        vec![r(0x20000, 0x23000, 2 * P), r(0x50000, 0x54000, 6 * P)]
    );
    assert_eq!(tp.lazy[1].pages(), 4);
    assert_eq!(tp.lazy[1].img_end(), 10 * P);
    assert_eq!(pages_file_name(tp.pages_id), "pages-7.img");
}

#[test]
fn lazy_split_at_vma_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    write_pagemap(
        dir.path(),
        1,
        1,
        &[pe(0x10000, 1, PE_PRESENT), pe(0x11000, 15, LP)],
    );
    // Unsorted on purpose; adjacent VMAs.
    write_mm(
        dir.path(),
        1,
        &[(0x15000, 0x30000), (0x10000, 0x12000), (0x12000, 0x15000)],
    );
    let tp = read_task_pages(dir.path(), 1).unwrap();
    assert_eq!(
        tp.lazy,
        vec![
            r(0x11000, 0x12000, P),
            r(0x12000, 0x15000, 2 * P),
            r(0x15000, 0x20000, 5 * P),
        ]
    );
    assert_eq!(tp.eager, vec![r(0x10000, 0x11000, 0)]);
}

#[test]
fn lazy_outside_vmas_is_format_error() {
    let dir = tempfile::tempdir().unwrap();
    write_pagemap(dir.path(), 1, 1, &[pe(0x10000, 4, LP)]);
    // Hole at 0x12000.
    write_mm(dir.path(), 1, &[(0x10000, 0x12000), (0x13000, 0x20000)]);
    let err = read_task_pages(dir.path(), 1).unwrap_err();
    assert!(matches!(err, ImageError::Format { .. }), "{err}");
    assert!(err.to_string().contains("0x12000"), "{err}");

    write_mm(dir.path(), 1, &[(0x20000, 0x30000)]);
    let err = read_task_pages(dir.path(), 1).unwrap_err();
    assert!(matches!(err, ImageError::Format { .. }), "{err}");

    // Overlapping VMAs.
    write_mm(dir.path(), 1, &[(0x10000, 0x20000), (0x18000, 0x30000)]);
    let err = read_task_pages(dir.path(), 1).unwrap_err();
    assert!(matches!(err, ImageError::Format { .. }), "{err}");
}

#[test]
fn mm_not_needed_without_lazy_pages() {
    let dir = tempfile::tempdir().unwrap();
    write_pagemap(dir.path(), 3, 2, &[pe(0x10000, 1, PE_PRESENT)]);
    let tp = read_task_pages(dir.path(), 3).unwrap();
    assert!(tp.lazy.is_empty());
    assert_eq!(tp.eager, vec![r(0x10000, 0x11000, 0)]);

    write_pagemap(dir.path(), 3, 2, &[pe(0x10000, 1, LP)]);
    let err = read_task_pages(dir.path(), 3).unwrap_err();
    assert!(matches!(err, ImageError::Io { .. }), "{err}");
}

#[test]
fn compat_fields() {
    let dir = tempfile::tempdir().unwrap();
    let old = |vaddr, compat_nr_pages| PagemapEntry {
        vaddr,
        compat_nr_pages,
        in_parent: None,
        flags: None,
        nr_pages: None,
    };
    let mut both = pe(0x30000, 2, LP);
    both.compat_nr_pages = 9; // nr_pages wins
    let mut not_in_parent = old(0x40000, 1);
    not_in_parent.in_parent = Some(false);
    write_pagemap(dir.path(), 5, 3, &[old(0x10000, 3), both, not_in_parent]);
    write_mm(dir.path(), 5, &[(0x10000, 0x50000)]);
    let tp = read_task_pages(dir.path(), 5).unwrap();
    assert_eq!(
        tp.eager,
        vec![r(0x10000, 0x13000, 0), r(0x40000, 0x41000, 5 * P)]
    );
    assert_eq!(tp.lazy, vec![r(0x30000, 0x32000, 3 * P)]);
}

#[test]
fn parent_and_non_present_are_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    write_mm(dir.path(), 1, &[(0, 0x100000)]);
    let mut in_parent = pe(0x10000, 1, PE_PRESENT);
    in_parent.in_parent = Some(true);
    in_parent.flags = None;
    for bad in [
        pe(0x10000, 1, PE_PARENT),
        pe(0x10000, 1, PE_PARENT | PE_LAZY),
        in_parent,
        pe(0x10000, 1, PE_LAZY),
        pe(0x10000, 1, 0),
        pe(0x10000, 1, PE_PRESENT | 0x100),
    ] {
        write_pagemap(dir.path(), 1, 1, &[pe(0x1000, 1, PE_PRESENT), bad.clone()]);
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(
            matches!(err, ImageError::Unsupported { .. }),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn bad_ranges_are_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_mm(dir.path(), 1, &[(0, 0x100000)]);
    for entries in [
        vec![pe(0x10001, 1, PE_PRESENT)],
        vec![pe(u64::MAX - 0xfff, 1, PE_PRESENT)],
        vec![pe(0x10000, u64::MAX, LP)],
        vec![pe(0x10000, u64::MAX / P, PE_PRESENT)],
        vec![pe(0, 1 << 51, PE_PRESENT), pe(0, 1 << 51, PE_PRESENT)],
        vec![pe(0x10000, 4, PE_PRESENT), pe(0x12000, 1, LP)],
        vec![pe(0x12000, 1, LP), pe(0x10000, 4, LP)],
    ] {
        write_pagemap(dir.path(), 1, 1, &entries);
        let err = read_task_pages(dir.path(), 1).unwrap_err();
        assert!(
            matches!(err, ImageError::Format { .. }),
            "{entries:?}: {err}"
        );
    }
}

#[test]
fn unsorted_pagemap_is_sorted_with_pagemap_order_offsets() {
    let dir = tempfile::tempdir().unwrap();
    write_pagemap(
        dir.path(),
        1,
        1,
        &[
            pe(0x30000, 1, LP),
            pe(0x20000, 2, PE_PRESENT),
            pe(0x10000, 1, LP),
            pe(0x00000, 0, LP),
        ],
    );
    write_mm(dir.path(), 1, &[(0x10000, 0x40000)]);
    let tp = read_task_pages(dir.path(), 1).unwrap();
    assert_eq!(
        tp.lazy,
        vec![r(0x10000, 0x11000, 3 * P), r(0x30000, 0x31000, 0)]
    );
    assert_eq!(tp.eager, vec![r(0x20000, 0x22000, P)]);
}

fn expect_format(bytes: &[u8], what: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pagemap-1.img"), bytes).unwrap();
    let err = read_task_pages(dir.path(), 1).unwrap_err();
    assert!(matches!(err, ImageError::Format { .. }), "{what}: {err}");
}

#[test]
fn framing_errors() {
    let head = frame(&PagemapHead { pages_id: 1 });
    let entry = frame(&pe(0x10000, 1, PE_PRESENT));
    let good = image(PAGEMAP_MAGIC, &[head.clone(), entry]);
    let head_only = image(PAGEMAP_MAGIC, std::slice::from_ref(&head));
    {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pagemap-1.img"), &good).unwrap();
        assert!(read_task_pages(dir.path(), 1).is_ok());
    }

    expect_format(&[], "empty file");
    expect_format(&good[..6], "short magic");
    expect_format(
        &image(MM_MAGIC, std::slice::from_ref(&head)),
        "mm magic in pagemap",
    );
    let mut bad_common = good.clone();
    bad_common[0] ^= 1;
    expect_format(&bad_common, "bad common magic");
    expect_format(&image(PAGEMAP_MAGIC, &[]), "no head");
    expect_format(&good[..good.len() - 1], "truncated body");
    let mut short_len = head_only.clone();
    short_len.extend([3, 0]);
    expect_format(&short_len, "truncated length");
    let mut huge = head_only.clone();
    huge.extend((MAX_ENTRY_BYTES + 1).to_ne_bytes());
    huge.extend([0; 16]);
    expect_format(&huge, "oversized entry");
    let mut max = head_only.clone();
    max.extend(u32::MAX.to_ne_bytes());
    expect_format(&max, "u32::MAX entry");
    let mut garbage = head_only.clone();
    garbage.extend([3, 0, 0, 0, 0xff, 0xff, 0xff]);
    expect_format(&garbage, "undecodable protobuf");
}

#[test]
fn mm_framing_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_pagemap(dir.path(), 1, 1, &[pe(0x10000, 1, LP)]);
    let mm_path = dir.path().join("mm-1.img");
    std::fs::write(&mm_path, image(PAGEMAP_MAGIC, &[])).unwrap();
    let err = read_task_pages(dir.path(), 1).unwrap_err();
    assert!(matches!(err, ImageError::Format { .. }), "{err}");
    std::fs::write(&mm_path, image(MM_MAGIC, &[])).unwrap();
    let err = read_task_pages(dir.path(), 1).unwrap_err();
    assert!(matches!(err, ImageError::Format { .. }), "{err}");
}

#[test]
fn missing_pagemap_is_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = read_task_pages(dir.path(), 9).unwrap_err();
    assert!(matches!(err, ImageError::Io { .. }), "{err}");
    let err = image_pids(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(err, ImageError::Io { .. }), "{err}");
}

#[test]
fn pids_from_file_names() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "pagemap-12.img",
        "pagemap-3.img",
        "pagemap-shmem-5.img",
        "pagemap-+6.img",
        "pagemap-0.img",
        "pagemap-99999999999.img",
        "pagemap-.img",
        "pagemap-7.img.bak",
        "mm-4.img",
        "pages-1.img",
    ] {
        std::fs::write(dir.path().join(name), b"").unwrap();
    }
    assert_eq!(image_pids(dir.path()).unwrap(), vec![3, 12]);
}

#[test]
fn eager_chunks_over_tasks() {
    let dir = tempfile::tempdir().unwrap();
    // pid 1, pages 1: eager at img [0, 2P), lazy [2P, 6P), eager [6P, 7P).
    write_pagemap(
        dir.path(),
        1,
        1,
        &[
            pe(0x10000, 2, PE_PRESENT),
            pe(0x20000, 4, LP),
            pe(0x30000, 1, PE_PRESENT),
        ],
    );
    // pid 2, pages 2: lazy [0, 8P), eager [8P, 17P).
    write_pagemap(
        dir.path(),
        2,
        2,
        &[pe(0x10000, 8, LP), pe(0x20000, 9, PE_PRESENT)],
    );
    let chunks = eager_chunks(dir.path(), 4 * P).unwrap();
    let expect: BTreeSet<(u32, u64)> = [(1, 0), (1, 1), (2, 2), (2, 3), (2, 4)].into();
    assert_eq!(chunks, expect);
    assert!(matches!(
        eager_chunks(dir.path(), 0),
        Err(ImageError::Unsupported { .. })
    ));
}
