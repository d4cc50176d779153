//! The objects the collector tracks, found in obmalloc's pools as the
//! arenas are read whole (`arenas.rs`) rather than by following the
//! generation lists one read per node: on a loaded 2-CPU VM that took
//! 15.5 s for 4.2 M objects, nearly all of it the kernel's cost of one
//! `pread` each.
//!
//! A pool block is a tracked object if it holds a PyGC_Head (at the block,
//! or 16 bytes in for a type with a managed dict or weakref pre-header)
//! followed by an object whose type is a checked GC type, and `_gc_next`
//! is not zero. It counts only if its link checks: its next node's
//! `_gc_prev` is itself, as a list walk would require. Most next nodes are
//! in the same arena, already in the buffer; a next node in another arena
//! becomes a claim, matched after the last arena against what that node's
//! prev said (a sort and a binary search, no read). Nodes outside the pools
//! (objects over 512 bytes, list heads) are followed by pointer from the
//! pool node or head before them, until the chain comes back into an arena
//! or to a head: those are the only reads per object. Without arenas (a
//! stripped build) every list is one such chain from its head, the walk
//! `gc.get_objects()` does. The permanent generation is found too: the
//! caller subtracts its walk (gc_lists.rs).

use std::collections::HashMap;
use std::time::Instant;

use super::gc_lists::{read_node, ListWalk, NODE_READ};
use super::sizes::{Sizes, NEEDED};
use super::types::Types;
use super::{plausible, word};
use crate::process::proc::Memory;

/// The flag bits in a PyGC_Head's words (prev's collecting flags, next's
/// unreachable and 3.14's old-space bits).
const FLAG_BITS: u64 = 3;

/// The four list heads (generations 0 to 2, the permanent one) and their
/// next and prev, read once before the arenas.
pub struct Heads {
    pub addrs: [u64; 4],
    pub nexts: [u64; 4],
    pub prevs: [u64; 4],
}

impl Heads {
    pub fn read(mem: &Memory, addrs: [u64; 4]) -> anyhow::Result<Self> {
        let (mut nexts, mut prevs) = ([0; 4], [0; 4]);
        for (i, &head) in addrs.iter().enumerate() {
            nexts[i] = mem.read_u64(head)? & !FLAG_BITS;
            prevs[i] = mem.read_u64(head + 8)? & !FLAG_BITS;
        }
        Ok(Self { addrs, nexts, prevs })
    }

    fn index(&self, addr: u64) -> Option<usize> {
        self.addrs.iter().position(|&h| h == addr)
    }
}

/// A node `from` whose next is `target`, with what `from` counts as if
/// `target`'s prev confirms it.
#[derive(Clone, Copy)]
struct Link {
    target: u64,
    from: u64,
    what: Option<(usize, u64)>,
    /// `from` is known to be on a list (a head, or a node whose own prev
    /// checked): a target that fails is a broken list. Else `from` is a pool
    /// block that only looked like a node (a buffer, a stale header).
    on_list: bool,
}

/// Tracked objects gathered while the arenas are read, and the links left
/// to check once every arena has been.
pub struct Scan {
    heads: Heads,
    /// The type flags that put a pre-header before the PyGC_Head.
    pre_header_flags: u64,
    out: ListWalk,
    /// (node, its prev) for pool nodes whose prev is outside their arena.
    facts: Vec<(u64, u64)>,
    /// Pool or outside nodes whose next is a pool node of another arena.
    claims: Vec<Link>,
    /// Pool nodes whose next is outside every arena and no head.
    starts: Vec<Link>,
}

impl Scan {
    pub fn new(heads: Heads, pre_header_flags: u64) -> Self {
        Self { heads, pre_header_flags, out: ListWalk::default(), facts: Vec::new(), claims: Vec::new(), starts: Vec::new() }
    }

    fn count(&mut self, what: Option<(usize, u64)>) {
        if let Some((t, bytes)) = what {
            let tally = self.out.by_type.entry(t).or_default();
            tally.count += 1;
            tally.bytes += bytes;
            self.out.objects += 1;
        }
    }

    /// The allocated block `block` of `arena`, read from
    /// `base`: a tracked object is counted now if its link checks in the
    /// buffer, else kept for `finish`. A block whose link fails is no node
    /// (a buffer whose bytes look like one, an object freed mid-read) and
    /// counts as nothing.
    pub fn block(&mut self, arena: &[u8], base: u64, block: std::ops::Range<usize>, types: &mut Types, sizes: &Sizes, in_arena: impl Fn(u64) -> bool + Copy) {
        let (at, size, pre_header_flags) = (block.start, block.len(), self.pre_header_flags);
        // The head at the block, or after a pre-header: the type says which.
        let Some((h, t)) = [0usize, 16].into_iter().filter(|&h| size >= h + 32).find_map(|h| {
            let t = types.check(word(arena, at + h + 24), in_arena)?;
            let info = &types.infos[t];
            (info.has_gc() && (info.flags & pre_header_flags != 0) == (h == 16)).then_some((at + h, t))
        }) else {
            return;
        };
        let next = word(arena, h) & !FLAG_BITS;
        if next == 0 {
            return; // untracked (a dict of atoms, a tuple of constants...)
        }
        let prev = word(arena, h + 8) & !FLAG_BITS;
        let node = base + h as u64;
        let object = &arena[h + 16..(h + 16 + NEEDED).min(arena.len())];
        let what = Some((t, sizes.bytes(&types.infos[t], node + 16, object)));
        let end = base + arena.len() as u64;
        if !(base..end).contains(&prev) {
            self.facts.push((node, prev));
        }
        if (base..end.saturating_sub(16)).contains(&next) {
            if word(arena, (next - base) as usize + 8) & !FLAG_BITS == node {
                self.count(what);
            }
        } else if let Some(i) = self.heads.index(next) {
            if self.heads.prevs[i] == node {
                self.count(what);
            }
        } else if in_arena(next) {
            self.claims.push(Link { target: next, from: node, what, on_list: false });
        } else {
            self.starts.push(Link { target: next, from: node, what, on_list: false });
        }
    }

    /// Follows the chains outside the pools (at most `max_steps` reads),
    /// then matches the claims across arenas.
    pub fn finish(mut self, mem: &Memory, types: &mut Types, sizes: &Sizes, max_steps: u64, deadline: Instant, in_arena: impl Fn(u64) -> bool + Copy) -> ListWalk {
        let heads = std::mem::replace(&mut self.heads, Heads { addrs: [0; 4], nexts: [0; 4], prevs: [0; 4] });
        let mut pending = std::mem::take(&mut self.starts);
        for i in 0..4 {
            let next = heads.nexts[i];
            if heads.index(next).is_none() && !in_arena(next) {
                pending.push(Link { target: next, from: heads.addrs[i], what: None, on_list: true });
            }
        }
        // Each outside node read, by its prev: a second link into it is checked
        // against that, not followed again (a crafted loop ends here).
        let mut seen: HashMap<u64, u64> = HashMap::new();
        let mut node_bytes = [0u8; NODE_READ];
        let mut steps = 0u64;
        while let Some(link) = pending.pop() {
            steps += 1;
            if steps > max_steps || (steps.is_multiple_of(4096) && Instant::now() > deadline) {
                self.out.partial = true;
                break;
            }
            let node = link.target;
            if let Some(&prev) = seen.get(&node) {
                if prev == link.from {
                    self.count(link.what);
                }
                continue;
            }
            if !plausible(node) || read_node(mem, node, &mut node_bytes).is_none() {
                if link.on_list {
                    self.out.broken.get_or_insert_with(|| format!("a list breaks at {node:#x}, unreadable, after {:#x}", link.from));
                }
                continue;
            }
            let prev = word(&node_bytes, 8) & !FLAG_BITS;
            seen.insert(node, prev);
            if prev != link.from {
                if link.on_list {
                    self.out.broken.get_or_insert_with(|| format!("a list breaks at {node:#x}: its prev is {prev:#x}, not {:#x}", link.from));
                }
                continue;
            }
            self.count(link.what);
            let object = &node_bytes[16..];
            let what = match types.check(word(object, 8), in_arena) {
                Some(t) if types.infos[t].has_gc() => Some((t, sizes.bytes(&types.infos[t], node + 16, object))),
                _ => {
                    self.out.refused += 1;
                    None
                }
            };
            let next = word(&node_bytes, 0) & !FLAG_BITS;
            if let Some(i) = heads.index(next) {
                if heads.prevs[i] == node {
                    self.count(what);
                }
            } else if in_arena(next) {
                self.claims.push(Link { target: next, from: node, what, on_list: true });
            } else {
                pending.push(Link { target: next, from: node, what, on_list: true });
            }
        }
        // Facts come in address order (the arenas are sorted, blocks read
        // in order); sorting again is cheap and makes it certain.
        self.facts.sort_unstable();
        for link in std::mem::take(&mut self.claims) {
            let confirmed = self.facts.binary_search_by_key(&link.target, |&(n, _)| n).is_ok_and(|i| self.facts[i].1 == link.from);
            if confirmed {
                self.count(link.what);
            } else if link.on_list {
                self.out.broken.get_or_insert_with(|| format!("a list breaks at {:#x}: its prev is not {:#x}", link.target, link.from));
            }
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layouts::{for_build, heap::for_version};
    use crate::python::reading::heap::types::HAVE_GC;

    const A: u64 = 0x7f00_0010_0000;
    const B: u64 = 0x7f00_0020_0000;
    const HEADS: u64 = 0x7f00_0030_0000;

    fn put(buf: &mut [u8], at: u64, value: u64) {
        buf[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// A node at `at` of `buf`: next, prev, refcount 1, type `ty`.
    fn node(buf: &mut [u8], at: u64, next: u64, prev: u64, ty: u64) {
        put(buf, at, next);
        put(buf, at + 8, prev);
        put(buf, at + 16, 1);
        put(buf, at + 24, ty);
    }

    /// Two crafted arenas (never read: they are buffers here) and a fake GC
    /// type in this process's memory, read through /proc/self/mem as a
    /// target's would be. Generation 0's list: head, A+0, A+64, B+0, head;
    /// A+128 looks like a node but A+192 (untracked) does not point back.
    /// `m0_prev` is what B+0 says its prev is (A+64 when the list is whole).
    fn census(m0_prev: u64) -> u64 {
        let name = b"Fake\0".to_vec();
        let mut ty = vec![0u64; 32];
        ty[1] = ty.as_ptr() as u64;
        ty[3] = name.as_ptr() as u64;
        ty[4] = 32;
        ty[21] = HAVE_GC;
        let t = ty.as_ptr() as u64;
        let (mut a, mut b) = (vec![0u8; 256], vec![0u8; 256]);
        node(&mut a, 0, A + 64, HEADS, t);
        node(&mut a, 64, B, A, t);
        node(&mut a, 128, A + 192, A, t);
        node(&mut a, 192, 0, 0, t);
        node(&mut b, 0, HEADS, m0_prev, t);
        let addrs = [0, 1, 2, 3].map(|i| HEADS + i * 24);
        let heads = Heads { addrs, nexts: [A, addrs[1], addrs[2], addrs[3]], prevs: [B, addrs[1], addrs[2], addrs[3]] };

        let layout = for_build(3, 12, false).unwrap();
        let heap = for_version((3, 12)).unwrap();
        let mem = Memory::open(std::process::id()).unwrap();
        let mut types = Types::new(&mem, layout, heap, None, t);
        let sizes = Sizes::new(layout, heap, 0, 0, 0);
        let in_arena = |x: u64| (A..A + 256).contains(&x) || (B..B + 256).contains(&x);
        let mut scan = Scan::new(heads, heap.pre_header_flags);
        for (buf, base) in [(&a, A), (&b, B)] {
            for at in (0..256).step_by(64) {
                scan.block(buf, base, at..at + 64, &mut types, &sizes, in_arena);
            }
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let out = scan.finish(&mem, &mut types, &sizes, 1000, deadline, in_arena);
        assert_eq!(out.broken, None);
        out.objects
    }

    #[test]
    fn pool_nodes_count_when_their_links_check_in_the_buffer_across_arenas_and_at_the_head() {
        // A+0 (checked in A's buffer), A+64 (its next in B: matched by the
        // sort), B+0 (its next the head, whose prev is B+0); not A+128.
        assert_eq!(census(A + 64), 3);
    }

    #[test]
    fn a_node_whose_next_in_another_arena_does_not_point_back_is_not_counted() {
        assert_eq!(census(A + 128), 2);
    }
}
