//! The objects the collector tracks, walked along its three generation
//! lists as `gc.get_objects()` does: each node is its PyGC_Head (next,
//! prev with flag bits) followed by the object. A node counts only if its
//! prev is the node before it (so a loop that does not come back to the
//! head breaks the walk there, and a node freed mid-walk fails) and its
//! type is a checked GC type; the walk is bounded in steps and by a
//! deadline. One read per node: used for the permanent generation (a few
//! hundred objects, subtracted from what the pools gave); the others'
//! objects are found in the pools (tracked.rs).

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
pub const NODE_READ: usize = 16 + NEEDED;

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

/// The three generation heads and the permanent generation's in the
/// collector's state at `gc_state`: the first candidate layout whose four
/// heads are each a list (the first node's prev and the last node's next
/// are the head).
pub fn heads(mem: &Memory, gc_state: u64, candidates: &[(u32, u32)]) -> Result<([u64; 3], u64)> {
    for &(generations, permanent) in candidates {
        let heads = [0, 1, 2].map(|g| gc_state + generations as u64 + g * GENERATION_SIZE);
        let permanent = gc_state + permanent as u64;
        if heads.iter().chain([&permanent]).all(|&head| is_list_head(mem, head)) {
            return Ok((heads, permanent));
        }
    }
    bail!("the collector's generation lists are not where this version keeps them (tried offsets {candidates:?} in its state)")
}

fn is_list_head(mem: &Memory, head: u64) -> bool {
    let (Ok(next), Ok(prev)) = (mem.read_u64(head), mem.read_u64(head + 8)) else { return false };
    let (next, prev) = (next & !FLAG_BITS, prev & !FLAG_BITS);
    // A head is only 4-byte aligned where PyGC_Head is (sid's 3.13.18): an
    // empty list's next and prev are the head itself.
    let head_like = |a: u64| a != 0 && a.is_multiple_of(4) && a < super::USER_END;
    if !(head_like(next) && head_like(prev)) {
        return false;
    }
    let back = mem.read_u64(next + 8).map(|p| p & !FLAG_BITS).ok();
    let forward = mem.read_u64(prev).map(|n| n & !FLAG_BITS).ok();
    back == Some(head) && forward == Some(head)
}

/// Walks the lists from `heads` (each with the name a message gives it:
/// "generation 0"), at most `max_steps` nodes in all.
pub fn walk(
    mem: &Memory,
    types: &mut Types,
    sizes: &Sizes,
    heads: &[(u64, &str)],
    max_steps: u64,
    deadline: Instant,
    in_arena: impl Fn(u64) -> bool + Copy,
) -> ListWalk {
    let mut out = ListWalk::default();
    let mut steps = 0u64;
    let mut node_bytes = [0u8; NODE_READ];
    for &(head, generation) in heads {
        let mut previous = head;
        let Ok(mut node) = mem.read_u64(head).map(|n| n & !FLAG_BITS) else {
            out.broken = Some(format!("{generation}'s list head at {head:#x} is unreadable"));
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
                out.broken = Some(format!("{generation}'s list breaks at {node:#x} after {walked} objects"));
                break;
            }
            let next = word(&node_bytes, 0) & !FLAG_BITS;
            let object = &node_bytes[16..];
            match types.check(word(object, 8), in_arena) {
                Some(t) if types.infos[t].has_gc() => {
                    let tally = out.by_type.entry(t).or_default();
                    tally.count += 1;
                    tally.bytes += sizes.bytes(&types.infos[t], node + 16, object);
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
pub fn read_node(mem: &Memory, node: u64, buf: &mut [u8; NODE_READ]) -> Option<()> {
    if mem.read(node, buf).is_ok() {
        return Some(());
    }
    buf.fill(0);
    mem.read(node, &mut buf[..32]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layouts::{for_build, heap::for_version};
    use crate::python::reading::heap::types::HAVE_GC;

    /// Crafted lists in this process's own memory, read through
    /// /proc/self/mem as a target's would be: a fake GC type whose type is
    /// itself (standing for PyType_Type), and nodes of 8 words: next, prev,
    /// refcount, type.
    struct Crafted {
        ty: Vec<u64>,
        name: Vec<u8>,
        head: Box<[u64; 3]>,
        nodes: Vec<[u64; 8]>,
    }

    impl Crafted {
        fn new(n: usize) -> Self {
            let mut c = Crafted { ty: vec![0; 32], name: b"Fake\0".to_vec(), head: Box::new([0; 3]), nodes: vec![[0; 8]; n] };
            let ty = c.ty.as_ptr() as u64;
            c.ty[1] = ty;
            c.ty[3] = c.name.as_ptr() as u64;
            c.ty[4] = 32;
            c.ty[21] = HAVE_GC;
            for node in c.nodes.iter_mut() {
                node[2] = 1;
                node[3] = ty;
            }
            c
        }
        fn head(&self) -> u64 {
            self.head.as_ptr() as u64
        }
        fn node(&self, i: usize) -> u64 {
            self.nodes[i].as_ptr() as u64
        }
        /// head -> 0 -> 1 -> ... -> head, each prev the one before.
        fn link(&mut self) {
            let n = self.nodes.len();
            let (head, addrs): (u64, Vec<u64>) = (self.head(), (0..n).map(|i| self.node(i)).collect());
            self.head[0] = addrs[0];
            self.head[1] = addrs[n - 1];
            for i in 0..n {
                self.nodes[i][0] = if i + 1 < n { addrs[i + 1] } else { head };
                self.nodes[i][1] = if i > 0 { addrs[i - 1] } else { head };
            }
        }
        /// Walks the one list at `head` (the other two generations empty).
        fn walk(&self) -> ListWalk {
            let layout = for_build(3, 12, false).unwrap();
            let heap = for_version((3, 12)).unwrap();
            let mem = Memory::open(std::process::id()).unwrap();
            let mut types = Types::new(&mem, layout, heap, None, self.ty.as_ptr() as u64);
            let sizes = Sizes::new(layout, heap, 0, 0, 0);
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            let mut out = walk(&mem, &mut types, &sizes, &[(self.head(), "generation 0"), (self.head(), "generation 1"), (self.head(), "generation 2")], 1000, deadline, |_| false);
            // The same list stands for all three generations: one walk's worth.
            out.objects /= 3;
            out.refused /= 3;
            out
        }
    }

    #[test]
    fn a_whole_list_counts_every_node() {
        let mut c = Crafted::new(4);
        c.link();
        let out = c.walk();
        assert_eq!((out.objects, out.refused, out.broken.as_deref()), (4, 0, None));
    }

    #[test]
    fn a_list_that_loops_back_into_itself_stops_there() {
        let mut c = Crafted::new(4);
        c.link();
        // 3's next is 1 again: 1's prev (0) is not 3, so the walk stops at 1.
        c.nodes[3][0] = c.node(1);
        let out = c.walk();
        assert_eq!(out.objects, 4);
        let broken = out.broken.unwrap();
        assert!(broken.contains(&format!("breaks at {:#x} after 4 objects", c.node(1))), "{broken}");
    }

    #[test]
    fn a_node_of_no_gc_type_is_refused_and_a_garbage_pointer_breaks() {
        let mut c = Crafted::new(3);
        c.link();
        c.nodes[1][3] = 0x1234; // no type there
        c.nodes[2][0] = 0xdead_0000_0008; // next is unmapped
        let out = c.walk();
        assert_eq!((out.objects, out.refused), (2, 1));
        assert!(out.broken.unwrap().contains("breaks at 0xdead00000008"));
    }
}
