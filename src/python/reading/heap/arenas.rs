//! The small objects the collector does not track (str, int, float,
//! bytes...), found where obmalloc keeps every object of 512 bytes or
//! less: its arenas, each read whole in one read and parsed here. In each
//! pool (a pool_header, then blocks of one size) the allocated blocks are
//! those below `nextoffset` not on the free list; a pool whose count
//! disagrees changed under the read and is skipped. A block is a plain
//! object if its first word is a refcount and its second a checked non-GC
//! type; a block that is not goes to tracked.rs, which finds the GC
//! objects; raw buffers (list items, dict tables) are neither and count
//! only as the arenas' bytes.
//! bench/heap/read-rate.py is the prototype this follows.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use super::gc_lists::Tally;
use super::sizes::Sizes;
use super::tracked::Scan;
use super::types::Types;
use super::{word, word32};
use crate::process::proc::Memory;
use crate::python::layouts::heap::{HeapLayout, Obmalloc, ALIGNMENT, ARENA_OBJECT_SIZE, MGMT_ARENAS, MGMT_MAXARENAS, POOL_OVERHEAD};
use crate::python::Python;

/// More arena slots than this is a garbage table (2**20 arenas of 1 MiB
/// would be a terabyte of small objects).
const MAX_ARENAS: u64 = 1 << 20;
/// Blocks are at most 512 bytes: 32 size classes of 16.
const SIZE_CLASSES: u32 = 32;

/// The live arenas: (address, pool_address), sorted by address.
pub struct ArenaTable {
    pub arenas: Vec<(u64, u64)>,
    pub arena_size: u64,
    pub pool_size: u64,
    /// Slots in use that failed their checks.
    pub refused: u64,
}

impl ArenaTable {
    /// Whether `addr` is inside an arena.
    pub fn contains(&self, addr: u64) -> bool {
        let i = self.arenas.partition_point(|&(start, _)| start <= addr);
        i > 0 && addr < self.arenas[i - 1].0 + self.arena_size
    }

    /// Where obmalloc's arena table is in the target, and its slots. `interp`
    /// is the interpreter state's address; `bias` the interpreter file's.
    pub fn read(mem: &Memory, python: &Python, heap: &HeapLayout, interp: u64, bias: u64) -> Result<Self> {
        let (arenas, maxarenas) = match heap.obmalloc {
            Obmalloc::Symbols => {
                let arenas = python.symbol("arenas").context("obmalloc's `arenas` is not in the interpreter's symbols (a stripped build)")?;
                let maxarenas = python.symbol("maxarenas").context("obmalloc's `maxarenas` is not in the interpreter's symbols (a stripped build)")?;
                let mut count = [0u8; 4];
                mem.read(maxarenas.wrapping_add(bias), &mut count)?;
                (mem.read_u64(arenas.wrapping_add(bias))?, u32::from_le_bytes(count) as u64)
            }
            Obmalloc::Mimalloc => bail!("a free-threaded build has no obmalloc arenas"),
            Obmalloc::Inline(offset) | Obmalloc::Pointer(offset) => {
                let state = if matches!(heap.obmalloc, Obmalloc::Pointer(_)) { mem.read_u64_non_null(interp + offset as u64)? } else { interp + offset as u64 };
                let mut count = [0u8; 4];
                mem.read(state + MGMT_MAXARENAS, &mut count)?;
                (mem.read_u64(state + MGMT_ARENAS)?, u32::from_le_bytes(count) as u64)
            }
        };
        ensure!(arenas != 0 && maxarenas <= MAX_ARENAS, "obmalloc's arena table is not one (maxarenas = {maxarenas})");
        let mut table = vec![0u8; (maxarenas * ARENA_OBJECT_SIZE) as usize];
        mem.read(arenas, &mut table).context("obmalloc's arena table is unreadable")?;
        Ok(Self::parse(&table, 1 << heap.arena_bits, 1 << heap.pool_bits))
    }

    /// The slots of a table read from the target: a slot counts if it has an
    /// address, its pool_address is inside the arena and its pool counts
    /// are in bounds.
    pub fn parse(table: &[u8], arena_size: u64, pool_size: u64) -> Self {
        let mut out = Self { arenas: Vec::new(), arena_size, pool_size, refused: 0 };
        for slot in table.chunks_exact(ARENA_OBJECT_SIZE as usize) {
            let (address, pool_address) = (word(slot, 0), word(slot, 8));
            if address == 0 {
                continue;
            }
            let (nfree, ntotal) = (word32(slot, 16) as u64, word32(slot, 20) as u64);
            let fits = (address..=address + arena_size).contains(&pool_address) && nfree <= ntotal && ntotal <= arena_size / pool_size;
            if fits && address < super::USER_END {
                out.arenas.push((address, pool_address));
            } else {
                out.refused += 1;
            }
        }
        out.arenas.sort_unstable();
        out
    }
}

#[derive(Debug, Default)]
pub struct ArenaWalk {
    /// Plain objects by index in `Types::infos`.
    pub by_type: HashMap<usize, Tally>,
    pub arenas_read: u64,
    pub arenas_unreadable: u64,
    pub pools: u64,
    /// Pools whose free list disagreed with their count: changed mid-read.
    pub pools_changed: u64,
    /// Bytes of allocated blocks in the arenas, and those that were plain objects.
    pub block_bytes: u64,
    pub plain_objects: u64,
    /// The deadline ended the walk.
    pub partial: bool,
}

/// Reads every arena of `table` and counts its plain objects; the other
/// blocks go to `scan`, which finds the GC objects among them.
pub fn walk(mem: &Memory, table: &ArenaTable, types: &mut Types, sizes: &Sizes, scan: &mut Scan, deadline: Instant) -> ArenaWalk {
    let in_arena = |a: u64| table.contains(a);
    let mut out = ArenaWalk::default();
    let mut arena = vec![0u8; table.arena_size as usize];
    for &(address, pool_address) in &table.arenas {
        if Instant::now() > deadline {
            out.partial = true;
            break;
        }
        if mem.read(address, &mut arena).is_err() {
            // Freed since the table was read, or garbage.
            out.arenas_unreadable += 1;
            continue;
        }
        out.arenas_read += 1;
        let first = (address + table.pool_size - 1) & !(table.pool_size - 1);
        let end = pool_address.min(address + table.arena_size);
        let mut pool = first;
        while pool + table.pool_size <= address + table.arena_size && pool < end {
            let at = (pool - address) as usize;
            match allocated_blocks(&arena[at..at + table.pool_size as usize], pool) {
                Ok(None) => {}
                Ok(Some((size, blocks))) => {
                    out.pools += 1;
                    for offset in blocks {
                        out.block_bytes += size;
                        let start = at + offset as usize;
                        let block = &arena[start..start + size as usize];
                        if !count_plain(block, address + start as u64, table, types, sizes, &mut out) {
                            scan.block(&arena, address, start..start + size as usize, types, sizes, in_arena);
                        }
                    }
                }
                Err(_) => out.pools_changed += 1,
            }
            pool += table.pool_size;
        }
    }
    out
}

/// Whether the block holds a refcount and then a checked type without GC
/// (counted then).
fn count_plain(block: &[u8], block_address: u64, table: &ArenaTable, types: &mut Types, sizes: &Sizes, out: &mut ArenaWalk) -> bool {
    let refcount = word(block, 0);
    // A refcount (3.14+: with ob_flags in its top 16 bits) is never above
    // 2**32, where a pointer (a buffer's first item, a free block's link) is.
    if refcount as u32 == 0 || (refcount >> 32) & 0xffff != 0 {
        return false;
    }
    let Some(t) = types.check(word(block, 8), |a| table.contains(a)) else { return false };
    let info = &types.infos[t];
    if info.has_gc() {
        return false;
    }
    let tally = out.by_type.entry(t).or_default();
    tally.count += 1;
    tally.bytes += sizes.bytes(info, block_address, block);
    out.plain_objects += 1;
    true
}

/// A pool's block size and its allocated blocks' offsets (`pool` is the
/// pool's bytes, read from `pool_address`); None for an
/// empty pool; an error if its header or free list is not consistent.
pub fn allocated_blocks(pool: &[u8], pool_address: u64) -> Result<Option<(u64, Vec<u64>)>> {
    let pool_size = pool.len() as u64;
    let count = word32(pool, 0) as u64;
    if count == 0 {
        return Ok(None);
    }
    let (szidx, nextoffset, maxnextoffset) = (word32(pool, 36), word32(pool, 40) as u64, word32(pool, 44) as u64);
    ensure!(szidx < SIZE_CLASSES && nextoffset <= pool_size && maxnextoffset <= pool_size, "not a pool header");
    let size = (szidx as u64 + 1) * ALIGNMENT;
    let capacity = (pool_size - POOL_OVERHEAD) / size;
    // The free blocks below nextoffset, on block boundaries, each once.
    let mut free = vec![false; capacity as usize];
    let mut link = word(pool, 8);
    let mut steps = 0;
    while link != 0 {
        let Some(offset) = link.checked_sub(pool_address) else { bail!("free block outside its pool") };
        ensure!(offset >= POOL_OVERHEAD && offset + size <= pool_size && (offset - POOL_OVERHEAD).is_multiple_of(size), "free block off its boundaries");
        let index = ((offset - POOL_OVERHEAD) / size) as usize;
        ensure!(!free[index] && steps <= capacity, "free list loops");
        free[index] = true;
        steps += 1;
        link = word(pool, offset as usize);
    }
    let top = nextoffset.min(pool_size - size + 1);
    let blocks: Vec<u64> = (0..capacity).map(|i| POOL_OVERHEAD + i * size).filter(|&o| o < top).filter(|&o| !free[((o - POOL_OVERHEAD) / size) as usize]).collect();
    ensure!(blocks.len() as u64 == count, "pool changed during the read");
    Ok(Some((size, blocks)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: u64 = 0x7f00_0000_4000;
    const SIZE: usize = 16 * 1024;

    /// A pool of 32-byte blocks (szidx 1) with `count` allocated, blocks
    /// carved up to `nextoffset`, and the free list `free` (offsets).
    fn pool(count: u32, nextoffset: u32, free: &[u64]) -> Vec<u8> {
        let mut p = vec![0u8; SIZE];
        p[0..4].copy_from_slice(&count.to_le_bytes());
        p[8..16].copy_from_slice(&free.first().map_or(0, |o| POOL + o).to_le_bytes());
        for (i, &o) in free.iter().enumerate() {
            let next = free.get(i + 1).map_or(0, |n| POOL + n);
            p[o as usize..o as usize + 8].copy_from_slice(&next.to_le_bytes());
        }
        p[36..40].copy_from_slice(&1u32.to_le_bytes());
        p[40..44].copy_from_slice(&nextoffset.to_le_bytes());
        p[44..48].copy_from_slice(&(SIZE as u32 - 32).to_le_bytes());
        p
    }

    #[test]
    fn allocated_blocks_are_the_carved_ones_not_free() {
        // Blocks at 48, 80, 112, 144 carved; 80 freed.
        let (size, blocks) = allocated_blocks(&pool(3, 176, &[80]), POOL).unwrap().unwrap();
        assert_eq!((size, blocks), (32, vec![48, 112, 144]));
        assert!(allocated_blocks(&pool(0, 176, &[]), POOL).unwrap().is_none(), "an empty pool");
    }

    #[test]
    fn a_pool_that_disagrees_or_loops_is_refused() {
        assert!(allocated_blocks(&pool(4, 176, &[80]), POOL).is_err(), "count says 4, 3 allocated: it changed");
        let mut looping = pool(2, 176, &[80, 112]);
        looping[112..120].copy_from_slice(&(POOL + 80).to_le_bytes());
        assert!(allocated_blocks(&looping, POOL).is_err(), "a free list that loops");
        assert!(allocated_blocks(&pool(3, 176, &[81]), POOL).is_err(), "a free block off its boundary");
        let mut outside = pool(3, 176, &[]);
        outside[8..16].copy_from_slice(&(POOL + 2 * SIZE as u64).to_le_bytes());
        assert!(allocated_blocks(&outside, POOL).is_err(), "a free block outside its pool");
        let mut garbage = pool(3, 176, &[]);
        garbage[36..40].copy_from_slice(&99u32.to_le_bytes());
        assert!(allocated_blocks(&garbage, POOL).is_err(), "a size class past 512 bytes");
    }

    #[test]
    fn arena_slots_out_of_bounds_are_refused() {
        let mut table = vec![0u8; 3 * ARENA_OBJECT_SIZE as usize];
        let slot = |t: &mut Vec<u8>, i: usize, address: u64, pool_address: u64, nfree: u32, ntotal: u32| {
            let at = i * ARENA_OBJECT_SIZE as usize;
            t[at..at + 8].copy_from_slice(&address.to_le_bytes());
            t[at + 8..at + 16].copy_from_slice(&pool_address.to_le_bytes());
            t[at + 16..at + 20].copy_from_slice(&nfree.to_le_bytes());
            t[at + 20..at + 24].copy_from_slice(&ntotal.to_le_bytes());
        };
        slot(&mut table, 0, 0x7f00_0010_0000, 0x7f00_0010_8000, 1, 63);
        slot(&mut table, 1, 0x7f00_0020_0000, 0x7f00_0040_0000, 1, 63); // pool_address past the arena
        slot(&mut table, 2, 0x7f00_0030_0000, 0x7f00_0030_0000, 70, 63); // more free pools than pools
        let t = ArenaTable::parse(&table, 1 << 20, 1 << 14);
        assert_eq!((t.arenas.len(), t.refused), (1, 2));
        assert!(t.contains(0x7f00_0010_0040) && !t.contains(0x7f00_0020_0040));
    }
}
