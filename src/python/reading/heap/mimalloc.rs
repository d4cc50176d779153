//! The free-threaded build's heap, read as CPython's own gc.get_objects()
//! visits it (gc_free_threading.c, mi_heap_visit_blocks): every thread
//! state's mimalloc heaps for objects, GC objects and GC objects with a
//! pre-header, each heap's page queues, and the segments threads that
//! exited abandoned to the interpreter's pool. A page's blocks are read
//! whole; those on none of its three free lists hold objects, and a GC
//! object is tracked when its `ob_gc_bits` say so (frozen ones, by
//! gc.freeze(), are counted apart, as gc.get_objects() leaves them out).
//!
//! Everything here comes from the target and may be garbage: a page
//! pointer must sit on a slice of its segment, a free-list link inside the
//! page on a block boundary and seen once, and `used` must agree with the
//! lists, or the page is skipped and counted; a page seen twice counts
//! once; every list is bounded by the process's size and the deadline.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::gc_lists::Tally;
use super::sizes::{Sizes, NEEDED};
use super::types::Types;
use super::{plausible, word, word32};
use crate::process::proc::Memory;
use crate::python::layouts::heap::mimalloc::*;
use crate::python::layouts::heap::HeapLayout;
use crate::python::Layout;

/// A page's blocks are read whole up to this; a larger page holds one
/// block (mimalloc's large and huge pages), of which only the start is read.
const MAX_AREA_READ: u64 = 1 << 22;
/// More threads than this is a garbage thread list.
const MAX_THREADS: u64 = 1 << 16;

/// What a walk of the pages found.
#[derive(Debug, Default)]
pub struct PageWalk {
    /// Tracked GC objects not frozen (gc.get_objects()'s), and objects of
    /// types without GC, by index in `Types::infos`.
    pub tracked: HashMap<usize, Tally>,
    pub plain: HashMap<usize, Tally>,
    pub tracked_objects: u64,
    pub frozen_objects: u64,
    pub plain_objects: u64,
    /// Blocks of the GC heaps whose type did not check.
    pub refused: u64,
    pub threads: u64,
    pub pages: u64,
    /// Pages whose header or free lists did not check: changed under the
    /// read, or garbage.
    pub pages_skipped: u64,
    pub abandoned_segments: u64,
    /// Bytes of the blocks that hold something.
    pub block_bytes: u64,
    /// Where a list (threads, pages, segments) broke or looped.
    pub broken: Option<String>,
    /// The deadline ended the walk.
    pub partial: bool,
}

/// Walks every page of the interpreter at `interp`; `max_pages` bounds
/// the pages and segments followed (the process's size over a page's).
#[allow(clippy::too_many_arguments)]
pub fn walk<'a>(mem: &Memory, layout: &Layout, heap: &HeapLayout, interp: u64, types: &mut Types<'a>, sizes: &Sizes<'a>, max_pages: u64, deadline: Instant) -> PageWalk {
    let mut walker = Walker { mem, layout, heap, types, sizes, deadline, max_pages, seen: HashSet::new(), out: PageWalk::default() };
    walker.threads(interp);
    walker.abandoned(interp);
    walker.out
}

/// The collector's young count: tracked objects allocated less freed since
/// it last ran, the global count plus every thread's buffered share.
/// None if a read fails, the thread list is garbage or the count never
/// held still.
pub fn young_count(mem: &Memory, layout: &Layout, interp: u64) -> Option<i64> {
    let global = || {
        let mut bytes = [0u8; 4];
        mem.read(interp + INTERP_YOUNG_COUNT, &mut bytes).ok().map(|_| i32::from_le_bytes(bytes))
    };
    let shares = || {
        let (states, broken) = thread_states(mem, layout, interp);
        if broken.is_some() {
            return None;
        }
        states.iter().try_fold(0i64, |sum, tstate| Some(sum.wrapping_add(mem.read_u64(tstate + TSTATE_ALLOC_COUNT).ok()? as i64)))
    };
    consistent_sum(global, shares)
}

/// How often young_count reads again when a flush fell between its reads.
const COUNT_READS: usize = 8;

/// The global count plus the threads' shares, as of one moment. A thread
/// flushes its share (every 512 allocations) by adding it to the global
/// count and then zeroing it; a flush between the read of the global
/// count and that of the shares would lose the share (or count it twice),
/// off by up to 512. So the global count is read on both sides of the
/// shares, and the sum is taken only when no flush moved it in between.
/// What this cannot see is a thread stopped between its flush's two
/// stores, a window of one instruction.
fn consistent_sum(mut global: impl FnMut() -> Option<i32>, mut shares: impl FnMut() -> Option<i64>) -> Option<i64> {
    let mut before = global()?;
    for _ in 0..COUNT_READS {
        let sum = shares()?;
        let after = global()?;
        if after == before {
            return Some(i64::from(before).wrapping_add(sum));
        }
        before = after;
    }
    None
}

/// The interpreter's thread states, in list order, as far as the list
/// reads, and where it broke or looped if it did.
fn thread_states(mem: &Memory, layout: &Layout, interp: u64) -> (Vec<u64>, Option<String>) {
    let mut states = Vec::new();
    let Ok(mut tstate) = mem.read_u64(interp + u64::from(layout.interp_threads_head)) else {
        return (states, Some("the interpreter's thread list is unreadable".into()));
    };
    let mut seen = HashSet::new();
    while tstate != 0 {
        if !plausible(tstate) || !seen.insert(tstate) || seen.len() as u64 > MAX_THREADS {
            return (states, Some(format!("the thread list breaks or loops at {tstate:#x}")));
        }
        states.push(tstate);
        match mem.read_u64(tstate + u64::from(layout.tstate_next)) {
            Ok(next) => tstate = next,
            Err(_) => return (states, Some(format!("thread state {tstate:#x} is unreadable"))),
        }
    }
    (states, None)
}

struct Walker<'w, 'a> {
    mem: &'w Memory,
    layout: &'w Layout,
    heap: &'w HeapLayout,
    types: &'w mut Types<'a>,
    sizes: &'w Sizes<'a>,
    deadline: Instant,
    max_pages: u64,
    /// Pages counted so far: one met twice (a list that changed) counts once.
    seen: HashSet<u64>,
    out: PageWalk,
}

impl Walker<'_, '_> {
    fn out_of_time(&mut self) -> bool {
        if Instant::now() > self.deadline {
            self.out.partial = true;
        }
        self.out.partial
    }

    fn broken(&mut self, why: String) {
        self.out.broken.get_or_insert(why);
    }

    /// Each thread state's three object heaps, queue by queue.
    fn threads(&mut self, interp: u64) {
        let (states, broken) = thread_states(self.mem, self.layout, interp);
        if let Some(why) = broken {
            self.broken(why);
        }
        for tstate in states {
            if self.out_of_time() {
                return;
            }
            self.out.threads += 1;
            for tag in [TAG_OBJECT, TAG_GC, TAG_GC_PRE] {
                let heap = tstate + TSTATE_HEAPS + u64::from(tag) * HEAP_SIZE;
                let mut queues = vec![0u8; (BIN_FULL + 1) * PAGE_QUEUE_SIZE];
                if self.mem.read(heap + HEAP_PAGES, &mut queues).is_err() {
                    self.broken(format!("thread state {tstate:#x}'s heap {tag} is unreadable"));
                    continue;
                }
                for queue in queues.chunks_exact(PAGE_QUEUE_SIZE) {
                    let mut page = word(queue, 0);
                    while page != 0 && !self.out_of_time() {
                        if self.seen.len() as u64 >= self.max_pages {
                            self.broken(format!("more pages than the process's size holds, in heap {tag} of thread state {tstate:#x}"));
                            return;
                        }
                        let mut header = [0u8; PAGE_HEADER_LEN];
                        if !plausible(page) || self.mem.read(page, &mut header).is_err() {
                            self.broken(format!("a page queue of thread state {tstate:#x} leads to {page:#x}, no page"));
                            break;
                        }
                        if !self.seen.insert(page) {
                            // Met before: this queue changed under the walk, or loops.
                            break;
                        }
                        self.page(page, &header, tag);
                        page = word(&header, PAGE_NEXT);
                    }
                }
            }
        }
    }

    /// The segments on the interpreter's abandoned pool: their pages in use
    /// whose tag is an object heap's.
    fn abandoned(&mut self, interp: u64) {
        let pool = interp + INTERP_ABANDONED_POOL;
        let (Ok(visited), Ok(tagged)) = (self.mem.read_u64(pool + POOL_ABANDONED_VISITED), self.mem.read_u64(pool + POOL_ABANDONED)) else {
            self.broken("the abandoned segments' pool is unreadable".into());
            return;
        };
        let mut segments = HashSet::new();
        for head in [visited, tagged & !(SEGMENT_SIZE - 1)] {
            let mut segment = head;
            while segment != 0 && !self.out_of_time() {
                if !segment.is_multiple_of(SEGMENT_SIZE) || !plausible(segment) || !segments.insert(segment) || segments.len() as u64 > self.max_pages {
                    self.broken(format!("the abandoned segments' list breaks or loops at {segment:#x}"));
                    return;
                }
                let mut head = vec![0u8; (SEGMENT_SLICES + (SLICES_PER_SEGMENT + 1) * SLICE_STRUCT_SIZE) as usize];
                if self.mem.read(segment, &mut head).is_err() {
                    self.broken(format!("abandoned segment {segment:#x} is unreadable"));
                    return;
                }
                self.out.abandoned_segments += 1;
                let entries = (word(&head, SEGMENT_SLICE_ENTRIES)).min(SLICES_PER_SEGMENT + 1);
                let mut slice = 0;
                while slice < entries {
                    let at = (SEGMENT_SLICES + slice * SLICE_STRUCT_SIZE) as usize;
                    let header = &head[at..at + PAGE_HEADER_LEN];
                    let count = u64::from(word32(header, PAGE_SLICE_COUNT));
                    let tag = (header[PAGE_TAG_BYTE] >> 3) & 0xf;
                    let in_use = word32(header, PAGE_SLICE_OFFSET) == 0 && word32(header, PAGE_XBLOCK_SIZE) != 0;
                    let page = segment + at as u64;
                    if in_use && matches!(tag, TAG_OBJECT | TAG_GC | TAG_GC_PRE) && self.seen.insert(page) {
                        self.page(page, header, tag);
                    }
                    slice += count.max(1);
                }
                segment = word(&head, SEGMENT_ABANDONED_NEXT as usize);
            }
        }
    }

    /// Counts the objects of the page at `page` (its header read), of the
    /// heap tagged `tag`.
    fn page(&mut self, page: u64, header: &[u8], tag: u8) {
        let Some((start, block_size, capacity)) = blocks_of(page, header) else {
            self.out.pages_skipped += 1;
            return;
        };
        let area = capacity * block_size;
        let (blocks, live) = if area <= MAX_AREA_READ {
            let mut blocks = vec![0u8; area as usize];
            if self.mem.read(start, &mut blocks).is_err() {
                self.out.pages_skipped += 1;
                return;
            }
            match live_blocks(header, start, &blocks) {
                Ok(live) => (blocks, live.offsets),
                Err(_) => {
                    self.out.pages_skipped += 1;
                    return;
                }
            }
        } else {
            // A large or huge page: one block, live when `used` says so and
            // no free list holds it.
            let free = word(header, PAGE_FREE) | word(header, PAGE_LOCAL_FREE) | (word(header, PAGE_XTHREAD_FREE) & !3);
            if capacity != 1 || word32(header, PAGE_USED) > 1 {
                self.out.pages_skipped += 1;
                return;
            }
            let mut head = vec![0u8; PRE_HEADER as usize + NEEDED + self.heap.object_shift as usize];
            if word32(header, PAGE_USED) == 0 || free != 0 || self.mem.read(start, &mut head).is_err() {
                self.out.pages += 1;
                return;
            }
            // Its real size: the page's slices (xblock_size is a marker).
            let page_bytes = u64::from(word32(header, PAGE_SLICE_COUNT)) * SLICE_SIZE;
            self.out.pages += 1;
            self.out.block_bytes += page_bytes;
            self.count_objects(start, &head, &[0], page_bytes, tag);
            return;
        };
        self.out.pages += 1;
        self.out.block_bytes += live.len() as u64 * block_size;
        self.count_objects(start, &blocks, &live, block_size, tag);
    }

    /// Counts the objects in the blocks at `live` (offsets into `blocks`,
    /// read from `start`) of a heap tagged `tag`.
    fn count_objects(&mut self, start: u64, blocks: &[u8], live: &[u64], block_size: u64, tag: u8) {
        let pre = if tag == TAG_GC_PRE { PRE_HEADER } else { 0 };
        for &offset in live {
            let object = (offset + pre) as usize;
            let end = blocks.len().min((offset + block_size) as usize);
            if object + self.layout.object_type as usize + 8 > end {
                continue;
            }
            let Some(t) = self.types.check(word(blocks, object + self.layout.object_type as usize), |_| false) else {
                if tag != TAG_OBJECT {
                    self.out.refused += 1;
                }
                continue;
            };
            let info = &self.types.infos[t];
            let bytes = || self.sizes.bytes(info, start + object as u64, &blocks[object..end]);
            if tag == TAG_OBJECT {
                // The object heap also holds PyObject_Malloc's raw buffers:
                // a block counts only under a checked type without GC.
                if !info.has_gc() {
                    let b = bytes();
                    let tally = self.out.plain.entry(t).or_default();
                    tally.count += 1;
                    tally.bytes += b;
                    self.out.plain_objects += 1;
                }
                continue;
            }
            let bits = blocks[object + OB_GC_BITS];
            if !info.has_gc() {
                self.out.refused += 1;
            } else if bits & GC_BITS_TRACKED == 0 {
                // Untracked (a tuple of atoms, say): not gc.get_objects()'s.
            } else if bits & GC_BITS_FROZEN != 0 {
                self.out.frozen_objects += 1;
            } else {
                let b = bytes();
                let tally = self.out.tracked.entry(t).or_default();
                tally.count += 1;
                tally.bytes += b;
                self.out.tracked_objects += 1;
            }
        }
    }
}

/// Where the page whose header is `header` has its blocks: (the first
/// block's address, the block size, the capacity), as
/// _mi_segment_page_start_from_slice places them (a small block's page
/// starts 3 blocks in, a medium one's 1, to spread pages over cache sets);
/// None if the page is not on a slice of its segment.
fn blocks_of(page: u64, header: &[u8]) -> Option<(u64, u64, u64)> {
    let segment = page & !(SEGMENT_SIZE - 1);
    let at = page.checked_sub(segment + SEGMENT_SLICES)?;
    let slice = at / SLICE_STRUCT_SIZE;
    if !at.is_multiple_of(SLICE_STRUCT_SIZE) || slice > SLICES_PER_SEGMENT {
        return None;
    }
    let block_size = u64::from(word32(header, PAGE_XBLOCK_SIZE));
    let capacity = u64::from(u16::from_le_bytes([header[PAGE_CAPACITY], header[PAGE_CAPACITY + 1]]));
    if block_size < 16 {
        return None;
    }
    let start_offset = match block_size {
        8..=64 => 3 * block_size,
        65..=512 => block_size,
        _ => 0,
    };
    Some((segment + slice * SLICE_SIZE + start_offset, block_size, capacity))
}

/// One page's blocks that hold objects.
#[derive(Debug, PartialEq, Eq)]
pub struct LiveBlocks {
    /// Their offsets from the page's first block.
    pub offsets: Vec<u64>,
}

/// Why a page was not counted.
#[derive(Debug, PartialEq, Eq)]
pub enum PageSkip {
    /// Its header is short, its block size zero, or its blocks would not
    /// fit in what was read.
    Header,
    /// A free list leaves the page, lands between blocks, or loops.
    FreeList,
    /// `used` is not capacity minus the local free lists.
    UsedCount,
}

/// The blocks of the page whose header is `header` and whose blocks,
/// starting at target address `start`, are `blocks`.
pub fn live_blocks(header: &[u8], start: u64, blocks: &[u8]) -> Result<LiveBlocks, PageSkip> {
    if header.len() < PAGE_XTHREAD_FREE + 8 {
        return Err(PageSkip::Header);
    }
    let capacity = u64::from(u16::from_le_bytes([header[PAGE_CAPACITY], header[PAGE_CAPACITY + 1]]));
    let block_size = u64::from(word32(header, PAGE_XBLOCK_SIZE));
    if block_size < 16 || capacity.checked_mul(block_size).is_none_or(|len| len > blocks.len() as u64) {
        return Err(PageSkip::Header);
    }
    let mut free = vec![false; capacity as usize];
    let mut local = 0u64;
    for head in [word(header, PAGE_FREE), word(header, PAGE_LOCAL_FREE)] {
        local += mark_free(head, start, block_size, blocks, &mut free)?;
    }
    if u64::from(word32(header, PAGE_USED)) != capacity - local {
        return Err(PageSkip::UsedCount);
    }
    // Blocks freed by other threads stay in `used` until collected.
    mark_free(word(header, PAGE_XTHREAD_FREE) & !3, start, block_size, blocks, &mut free)?;
    let offsets = (0..capacity).filter(|&i| !free[i as usize]).map(|i| i * block_size).collect();
    Ok(LiveBlocks { offsets })
}

/// Marks the blocks on the list from `head` free; how many it marked.
fn mark_free(mut head: u64, start: u64, block_size: u64, blocks: &[u8], free: &mut [bool]) -> Result<u64, PageSkip> {
    let mut marked = 0;
    while head != 0 {
        let offset = head.checked_sub(start).ok_or(PageSkip::FreeList)?;
        let index = offset / block_size;
        if !offset.is_multiple_of(block_size) || index >= free.len() as u64 || free[index as usize] {
            return Err(PageSkip::FreeList);
        }
        free[index as usize] = true;
        marked += 1;
        head = word(blocks, offset as usize);
    }
    Ok(marked)
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u64 = 0x7f00_0000_0000;
    const BLOCK: u64 = 32;

    /// A thread that flushes its share of 511 between the global count's
    /// read and its own: the first pair is torn (it would lose 511), the
    /// second holds still and is the count. A count that never holds
    /// still is no count.
    #[test]
    fn a_flush_between_the_reads_is_read_again() {
        use std::cell::Cell;
        let (global, share) = (Cell::new(1000), Cell::new(511));
        let reads = Cell::new(0);
        let read_global = || Some(global.get());
        let read_shares = || {
            reads.set(reads.get() + 1);
            if reads.get() == 1 {
                global.set(global.get() + share.get());
                share.set(0);
            }
            Some(i64::from(share.get()))
        };
        assert_eq!(consistent_sum(read_global, read_shares), Some(1511));
        assert_eq!(reads.get(), 2);
        let ticking = Cell::new(0);
        let moving = || {
            ticking.set(ticking.get() + 512);
            Some(ticking.get())
        };
        assert_eq!(consistent_sum(moving, || Some(0)), None);
    }

    /// A page of `capacity` blocks with the given free lists (block indexes,
    /// in list order) and `used`; object blocks get ob_gc_bits from `gc_bits`.
    fn page(capacity: u16, free: &[u64], local: &[u64], xthread: &[u64], used: u32, gc_bits: &[(u64, u8)]) -> (Vec<u8>, Vec<u8>) {
        let mut header = vec![0u8; PAGE_HEADER_LEN];
        let mut blocks = vec![0u8; usize::from(capacity) * BLOCK as usize];
        header[PAGE_CAPACITY..PAGE_CAPACITY + 2].copy_from_slice(&capacity.to_le_bytes());
        header[PAGE_USED..PAGE_USED + 4].copy_from_slice(&used.to_le_bytes());
        header[PAGE_XBLOCK_SIZE..PAGE_XBLOCK_SIZE + 4].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        for (field, list, flags) in [(PAGE_FREE, free, 0), (PAGE_LOCAL_FREE, local, 0), (PAGE_XTHREAD_FREE, xthread, 1)] {
            let head = list.first().map_or(0, |i| START + i * BLOCK);
            header[field..field + 8].copy_from_slice(&(head | if head != 0 { flags } else { 0 }).to_le_bytes());
            for pair in list.windows(2) {
                let at = (pair[0] * BLOCK) as usize;
                blocks[at..at + 8].copy_from_slice(&(START + pair[1] * BLOCK).to_le_bytes());
            }
        }
        for &(index, bits) in gc_bits {
            blocks[(index * BLOCK) as usize + OB_GC_BITS] = bits;
        }
        (header, blocks)
    }

    #[test]
    fn blocks_on_no_free_list_are_live_and_tracked_by_their_bit() {
        // 8 blocks: 2 free, 1 local free, 1 freed by another thread (still
        // in `used`), so 8 - 3 = 5 used and 4 live: 0, 2, 5, 7.
        let (header, blocks) = page(8, &[1, 6], &[3], &[4], 5, &[(0, 1), (2, 0), (5, 1), (7, 2)]);
        let live = live_blocks(&header, START, &blocks).unwrap();
        assert_eq!(live.offsets, [0, 2, 5, 7].map(|i| i * BLOCK));
        let tracked_blocks: Vec<u64> = live.offsets.iter().copied().filter(|&o| blocks[o as usize + OB_GC_BITS] & GC_BITS_TRACKED != 0).map(|o| o / BLOCK).collect();
        assert_eq!(tracked_blocks, [0, 5]);
    }

    #[test]
    fn a_used_count_that_disagrees_skips_the_page() {
        let (header, blocks) = page(4, &[1], &[], &[], 4, &[]);
        assert_eq!(live_blocks(&header, START, &blocks), Err(PageSkip::UsedCount));
    }

    #[test]
    fn a_looping_or_stray_free_list_skips_the_page() {
        let (header, mut blocks) = page(4, &[1, 2], &[], &[], 2, &[]);
        // Block 2 links back to block 1: a loop.
        blocks[(2 * BLOCK) as usize..(2 * BLOCK) as usize + 8].copy_from_slice(&(START + BLOCK).to_le_bytes());
        assert_eq!(live_blocks(&header, START, &blocks), Err(PageSkip::FreeList));
        // Block 2 links between blocks.
        blocks[(2 * BLOCK) as usize..(2 * BLOCK) as usize + 8].copy_from_slice(&(START + 8).to_le_bytes());
        assert_eq!(live_blocks(&header, START, &blocks), Err(PageSkip::FreeList));
        // Block 2 links outside the page.
        blocks[(2 * BLOCK) as usize..(2 * BLOCK) as usize + 8].copy_from_slice(&(START + 64 * BLOCK).to_le_bytes());
        assert_eq!(live_blocks(&header, START, &blocks), Err(PageSkip::FreeList));
    }

    #[test]
    fn a_header_whose_blocks_overrun_what_was_read_skips_the_page() {
        let (header, blocks) = page(4, &[], &[], &[], 4, &[]);
        assert_eq!(live_blocks(&header, START, &blocks[..64]), Err(PageSkip::Header));
        assert_eq!(live_blocks(&header[..20], START, &blocks), Err(PageSkip::Header));
    }

    #[test]
    fn a_page_finds_its_blocks_on_its_slice_and_nothing_off_one() {
        let segment = 0x7f00_0000_0000u64;
        let header = |block: u32, capacity: u16| {
            let mut h = vec![0u8; PAGE_HEADER_LEN];
            h[PAGE_XBLOCK_SIZE..PAGE_XBLOCK_SIZE + 4].copy_from_slice(&block.to_le_bytes());
            h[PAGE_CAPACITY..PAGE_CAPACITY + 2].copy_from_slice(&capacity.to_le_bytes());
            h
        };
        let slice = |i: u64| segment + SEGMENT_SLICES + i * SLICE_STRUCT_SIZE;
        // Small blocks start 3 blocks into the slice, medium ones 1, large ones at it.
        assert_eq!(blocks_of(slice(2), &header(32, 10)), Some((segment + 2 * SLICE_SIZE + 96, 32, 10)));
        assert_eq!(blocks_of(slice(5), &header(256, 4)), Some((segment + 5 * SLICE_SIZE + 256, 256, 4)));
        assert_eq!(blocks_of(slice(0), &header(4096, 2)), Some((segment, 4096, 2)));
        // A pointer between two slices, before the slices, past the last, or a block of 8 bytes.
        assert_eq!(blocks_of(slice(2) + 8, &header(32, 10)), None);
        assert_eq!(blocks_of(segment + 64, &header(32, 10)), None);
        assert_eq!(blocks_of(slice(SLICES_PER_SEGMENT + 1), &header(32, 10)), None);
        assert_eq!(blocks_of(slice(1), &header(8, 10)), None);
    }
}
