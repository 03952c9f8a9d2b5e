//! Test fixtures: CRIU image files (framed protobuf entries) built in memory.

use prost::Message;

use super::*;

/// One entry as CRIU frames it: a native-endian u32 length, then the protobuf.
pub fn framed(msg: &impl Message) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut out = (body.len() as u32).to_ne_bytes().to_vec();
    out.extend(body);
    out
}

/// An image file: the common magic, the image's magic, the framed entries.
pub fn image(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = IMG_COMMON_MAGIC.to_ne_bytes().to_vec();
    out.extend(magic.to_ne_bytes());
    for e in entries {
        out.extend(e);
    }
    out
}

/// `pagemap-<pid>.img` with one lazy, present entry of `pages` pages at `vaddr`, and
/// `mm-<pid>.img` with one VMA covering exactly that range.
pub fn write_one_lazy_range(criu_dir: &Path, pid: i32, pages_id: u32, vaddr: u64, pages: u64) {
    let entries = vec![
        framed(&PagemapHead { pages_id }),
        framed(&PagemapEntry {
            vaddr,
            compat_nr_pages: 0,
            in_parent: None,
            flags: Some(PE_LAZY | PE_PRESENT),
            nr_pages: Some(pages),
        }),
    ];
    std::fs::write(
        criu_dir.join(format!("pagemap-{pid}.img")),
        image(PAGEMAP_MAGIC, &entries),
    )
    .unwrap();
    let mm = MmEntry {
        vmas: vec![VmaEntry {
            start: vaddr,
            end: vaddr + pages * PAGE_SIZE,
            status: 0,
        }],
    };
    std::fs::write(
        criu_dir.join(format!("mm-{pid}.img")),
        image(MM_MAGIC, &[framed(&mm)]),
    )
    .unwrap();
}
