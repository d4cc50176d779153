//! The objects the collector tracks, walked along its three generation
//! lists as `gc.get_objects()` does: each node is its PyGC_Head (next,
//! prev with flag bits) followed by the object. A node counts only if its
//! prev is the node before it (so a loop that does not come back to the
//! head breaks the walk there, and a node freed mid-walk fails) and its
//! type is a checked GC type; the walk is bounded in steps and by a
//! deadline. One read per node: batching them is left to do (the design's
//! allocator walk finds in-pool nodes without following them).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{bail, Result};

use super::sizes::{Sizes, NEEDED};
use super::types::Types;
use super::{plausible, word};
use crate::process::proc::Memory;
use crate::python::layouts::heap::GENERATION_SIZE;

/// The flag bits in a PyGC_Head's words (prev's collecting flags, next's
/// unreachable and 3.14's old-space bits).
const FLAG_BITS: u64 = 3;
/// A node's PyGC_Head and the object's first NEEDED bytes.
const NODE_READ: usize = 16 + NEEDED;

/// Count and bytes of one type.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub count: u64,
    pub bytes: u64,
}

#[derive(Debug, Default)]
pub struct ListWalk {
    /// By index in `Types::infos`.
    pub by_type: HashMap<usize, Tally>,
    pub objects: u64,
    /// Nodes whose type was no GC type (freed and reused mid-walk, or garbage).
    pub refused: u64,
    /// Where a list broke or looped, if one did: the walk of that
    /// generation stopped there.
    pub broken: Option<String>,
    /// The deadline or step bound ended the walk.
    pub partial: bool,
}

/// The three generation heads in the collector's state at `gc_state`: the
/// first candidate offset whose three heads are each a list (the first
/// node's prev and the last node's next are the head).
pub fn heads(mem: &Memory, gc_state: u64, candidates: &[u32]) -> Result<[u64; 3]> {
    'candidate: for &offset in candidates {
        let mut heads = [0; 3];
        for (g, head) in heads.iter_mut().enumerate() {
            *head = gc_state + offset as u64 + g as u64 * GENERATION_SIZE;
            let Ok(next) = mem.read_u64(*head).map(|n| n & !FLAG_BITS) else { continue 'candidate };
            let Ok(prev) = mem.read_u64(*head + 8).map(|p| p & !FLAG_BITS) else { continue 'candidate };
            if !(plausible(next) && plausible(prev)) {
                continue 'candidate;
            }
            let back = mem.read_u64(next + 8).map(|p| p & !FLAG_BITS).ok();
            let forward = mem.read_u64(prev).map(|n| n & !FLAG_BITS).ok();
            if back != Some(*head) || forward != Some(*head) {
                continue 'candidate;
            }
        }
        return Ok(heads);
    }
    bail!("the collector's generation lists are not where this version keeps them (tried offsets {candidates:?} in its state)")
}

/// Walks the three lists from `heads`, at most `max_steps` nodes in all.
pub fn walk(
    mem: &Memory,
    types: &mut Types,
    sizes: &Sizes,
    heads: [u64; 3],
    max_steps: u64,
    deadline: Instant,
    in_arena: impl Fn(u64) -> bool + Copy,
) -> ListWalk {
    let mut out = ListWalk::default();
    let mut steps = 0u64;
    let mut node_bytes = [0u8; NODE_READ];
    for (generation, &head) in heads.iter().enumerate() {
        let mut previous = head;
        let Ok(mut node) = mem.read_u64(head).map(|n| n & !FLAG_BITS) else {
            out.broken = Some(format!("generation {generation}'s list head at {head:#x} is unreadable"));
            continue;
        };
        let mut walked = 0u64;
        while node != head {
            steps += 1;
            if steps > max_steps || (steps.is_multiple_of(4096) && Instant::now() > deadline) {
                out.partial = true;
                return out;
            }
            let ok = plausible(node) && read_node(mem, node, &mut node_bytes).is_some();
            if !ok || word(&node_bytes, 8) & !FLAG_BITS != previous {
                out.broken = Some(format!("generation {generation}'s list breaks at {node:#x} after {walked} objects"));
                break;
            }
            let next = word(&node_bytes, 0) & !FLAG_BITS;
            let object = &node_bytes[16..];
            match types.check(word(object, 8), in_arena) {
                Some(t) if types.infos[t].has_gc() => {
                    let tally = out.by_type.entry(t).or_default();
                    tally.count += 1;
                    tally.bytes += sizes.bytes(&types.infos[t], object);
                    out.objects += 1;
                }
                _ => out.refused += 1,
            }
            walked += 1;
            previous = node;
            node = next;
        }
    }
    out
}

/// The node's head and object, or as much as is mapped (a small object at
/// the very end of a mapping): at least its head and type.
fn read_node(mem: &Memory, node: u64, buf: &mut [u8; NODE_READ]) -> Option<()> {
    if mem.read(node, buf).is_ok() {
        return Some(());
    }
    buf.fill(0);
    mem.read(node, &mut buf[..32]).ok()
}
