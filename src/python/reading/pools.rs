//! The live view of `pytrace memory`: what is left in use of each pool and
//! chunk the byte sampler kept, read from the allocators' own headers in
//! batched, bounded `process_vm_readv` calls (a few dozen bytes an entry,
//! at most IOV_MAX entries a call). Nothing is written; a header is
//! trusted only if it still says what BPF saw when the block was kept
//! (the pool's size class, the chunk's size), else the block was emptied
//! or freed and reused since, and counts as gone.

// obmalloc's block sizes are multiples of its ALIGNMENT (64-bit builds).
use crate::python::layouts::heap::ALIGNMENT as BLOCK_ALIGNMENT;
use crate::python::probes::alloc_sites::{POOL_COUNT_OFFSET, POOL_HEADER_BYTES, POOL_SZIDX_OFFSET};

/// IOV_MAX on Linux.
const IOV_MAX: usize = 1024;

/// obmalloc's largest size class index (512-byte blocks).
const MAX_SZIDX: u32 = 31;

/// glibc's chunk header flags in the size word.
const PREV_INUSE: u64 = 1;
const IS_MMAPPED: u64 = 2;
const SIZE_FLAGS: u64 = 7;
/// A chunk's size word precedes its user memory by 8 bytes.
const SIZE_SZ: u64 = 8;

/// A block kept by BPF, as it was then.
#[derive(Debug, Clone, Copy)]
pub enum Kept {
    /// A pool at `address` opened for size class `szidx`.
    Pool { address: u64, szidx: u32, pool_size: u64 },
    /// A chunk at `address` (what malloc returned) of `size` usable bytes,
    /// as BPF read them from its header when it was made.
    Chunk { address: u64, size: u64 },
}

/// Bytes live now in each kept block, None where it is gone.
pub fn live_bytes(pid: u32, kept: &[Kept]) -> Vec<Option<u64>> {
    // First read: each pool's header up to szidx, each chunk's size word.
    let first: Vec<(u64, usize)> = kept
        .iter()
        .map(|k| match *k {
            Kept::Pool { address, .. } => (address, (POOL_SZIDX_OFFSET + 4) as usize),
            Kept::Chunk { address, .. } => (address.wrapping_sub(SIZE_SZ), 8),
        })
        .collect();
    let heads = read_batch(pid, &first);
    let mut out = vec![None; kept.len()];
    // Chunks in the heap need a second read: the next chunk's size word,
    // whose PREV_INUSE says whether this one is in use.
    let mut next: Vec<(usize, u64, u64)> = Vec::new();
    for (i, (k, head)) in kept.iter().zip(&heads).enumerate() {
        let Some(head) = head else { continue };
        match *k {
            Kept::Pool { szidx, pool_size, .. } => {
                let count = u32_at(head, POOL_COUNT_OFFSET as usize) as u64;
                let now = u32_at(head, POOL_SZIDX_OFFSET as usize);
                if now != szidx || szidx > MAX_SZIDX {
                    continue;
                }
                let block = (szidx as u64 + 1) * BLOCK_ALIGNMENT;
                // More blocks in use than the pool holds: not a pool's header.
                if count > (pool_size - POOL_HEADER_BYTES) / block {
                    continue;
                }
                out[i] = Some(count * block);
            }
            Kept::Chunk { address, size } => {
                let word = u64_at(head, 0);
                let chunk = word & !SIZE_FLAGS;
                if usable_size(word) != Some(size) {
                    continue;
                }
                if word & IS_MMAPPED != 0 {
                    // Its own mapping: live until unmapped (then unreadable).
                    out[i] = Some(size);
                } else {
                    next.push((i, address - 2 * SIZE_SZ + chunk + SIZE_SZ, size));
                }
            }
        }
    }
    let words = read_batch(pid, &next.iter().map(|&(_, at, _)| (at, 8)).collect::<Vec<_>>());
    for ((i, _, size), word) in next.into_iter().zip(words) {
        if word.is_some_and(|w| u64_at(&w, 0) & PREV_INUSE != 0) {
            out[i] = Some(size);
        }
    }
    out
}

/// glibc's malloc_usable_size from a chunk's size word (bpf/memory.bpf.c's
/// raw_returned reads the same): its size less the header, one word, or
/// two for an mmapped chunk.
fn usable_size(word: u64) -> Option<u64> {
    let overhead = if word & IS_MMAPPED != 0 { 2 * SIZE_SZ } else { SIZE_SZ };
    (word & !SIZE_FLAGS).checked_sub(overhead)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
}

/// Reads `len` bytes at each address (at most 64 each), in as few system
/// calls as the readable entries allow: process_vm_readv stops at the
/// first entry it cannot read, which is skipped.
fn read_batch(pid: u32, at: &[(u64, usize)]) -> Vec<Option<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = at.iter().map(|&(_, len)| vec![0u8; len.min(64)]).collect();
    let mut out = vec![None; at.len()];
    let mut i = 0;
    while i < at.len() {
        let end = (i + IOV_MAX).min(at.len());
        let local: Vec<libc::iovec> = bufs[i..end].iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
        let remote: Vec<libc::iovec> = at[i..end].iter().zip(&bufs[i..end]).map(|(&(a, _), b)| libc::iovec { iov_base: a as *mut libc::c_void, iov_len: b.len() }).collect();
        // SAFETY: each local iovec points into a buffer of `bufs` of its
        // length, which outlives the call; remote memory is only read.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, local.as_ptr(), local.len() as _, remote.as_ptr(), remote.len() as _, 0) };
        let mut left = if n > 0 { n as usize } else { 0 };
        let mut j = i;
        while j < end && left >= bufs[j].len() {
            left -= bufs[j].len();
            out[j] = Some(bufs[j].clone());
            j += 1;
        }
        // Entry j could not be read whole: skip it.
        i = j + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool header of this process, one with a size class that changed
    /// and an unreadable address, in one batch.
    #[test]
    fn reads_pool_headers_and_trusts_only_matching_classes() {
        let mut pool = vec![0u8; 16384];
        pool[0..4].copy_from_slice(&3u32.to_ne_bytes());
        pool[36..40].copy_from_slice(&1u32.to_ne_bytes());
        let address = pool.as_ptr() as u64;
        let kept = [
            Kept::Pool { address, szidx: 1, pool_size: 16384 },
            Kept::Pool { address, szidx: 2, pool_size: 16384 },
            Kept::Pool { address: 8, szidx: 1, pool_size: 16384 },
        ];
        assert_eq!(live_bytes(std::process::id(), &kept), vec![Some(3 * 32), None, None]);
    }

    /// A malloc'd chunk of this process, in the heap and mmapped, is live
    /// at the usable size glibc reports; kept at another size, it is not
    /// (freed and made again since).
    #[test]
    fn reads_a_live_chunk() {
        for len in [4000, 1 << 20] {
            let buffer: Vec<u8> = vec![7u8; len];
            // SAFETY: the pointer is malloc's (Rust's global allocator is
            // the system's) and live for the call.
            let usable = unsafe { libc::malloc_usable_size(buffer.as_ptr() as *mut libc::c_void) } as u64;
            assert!(usable >= len as u64 && usable < len as u64 + 4096, "{len}: usable {usable}");
            let kept = [Kept::Chunk { address: buffer.as_ptr() as u64, size: usable }, Kept::Chunk { address: buffer.as_ptr() as u64, size: usable + 16 }];
            assert_eq!(live_bytes(std::process::id(), &kept), vec![Some(usable), None], "{len}");
        }
    }
}
