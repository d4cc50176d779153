//! The free-threaded build's census of one mimalloc page, from bytes read
//! whole: which blocks hold objects (every block below `capacity` not on
//! one of the page's three free lists) and which of those the collector
//! tracks (`ob_gc_bits`), as CPython's gc_free_threading.c visits them.
//! Finding the pages (thread states, heaps, page queues, abandoned
//! segments) is not built yet; `heap` still refuses a free-threaded target.
//!
//! The page header and its blocks come from the target and may be garbage:
//! a free-list link outside the page, off a block boundary, seen twice, or
//! a `used` count that disagrees with the lists rejects the whole page
//! (the caller counts it as skipped), and no walk runs longer than the
//! page's capacity.

use super::{word, word32};
use crate::python::layouts::heap::mimalloc::*;

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
    if header.len() < PAGE_HEADER_LEN {
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

/// Whether the object at `offset` in `blocks` is tracked by the collector.
pub fn tracked(blocks: &[u8], offset: u64) -> bool {
    blocks.get(offset as usize + OB_GC_BITS).is_some_and(|bits| bits & GC_BITS_TRACKED != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u64 = 0x7f00_0000_0000;
    const BLOCK: u64 = 32;

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
        let tracked_blocks: Vec<u64> = live.offsets.iter().copied().filter(|&o| tracked(&blocks, o)).map(|o| o / BLOCK).collect();
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
}
