//! What a `pytrace memory` run measures, as plain data: per stack and
//! allocator, the bytes it made the heap grow by and the bytes of it still
//! live, each a Horvitz-Thompson estimate from the events kept by the
//! byte sampler, with its variance (so its 95 % interval) and how many
//! kept events it rests on.

use std::rc::Rc;

use serde::Serialize;

use super::counters::Counters;
use super::samples::Frame;

/// An estimate of a sum of bytes over every event from the kept ones:
/// Σ b/p, and its variance Σ (1 − p) b² / p².
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Estimate {
    pub bytes: f64,
    pub variance: f64,
    /// Kept events (pools, chunks) the estimate rests on.
    pub kept: u64,
    /// The same estimate in objects, as obmalloc counts them: a chunk is
    /// one, a pool its blocks (all of them for growth, those in use for
    /// the live view). pprof's alloc_objects and inuse_objects.
    pub objects: f64,
}

impl Estimate {
    pub fn add(&mut self, other: &Estimate) {
        self.bytes += other.bytes;
        self.variance += other.variance;
        self.kept += other.kept;
        self.objects += other.objects;
    }

    /// Half the width of the 95 % interval (normal approximation).
    pub fn interval95(&self) -> f64 {
        1.96 * self.variance.max(0.0).sqrt()
    }
}

/// Which allocator path the bytes came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// obmalloc's pools (objects of up to 512 bytes): a pool opened.
    Pool,
    /// Over 512 bytes: obmalloc's call of the raw allocator (malloc).
    Big,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Pool => "pool",
            Source::Big => "malloc",
        }
    }
}

/// One stack's bytes through one allocator path.
#[derive(Debug, Clone)]
pub struct MemoryStack {
    /// Outermost first.
    pub frames: Vec<Rc<Frame>>,
    pub source: Source,
    /// Bytes the heap grew by through this stack during the run.
    pub grown: Estimate,
    /// Of those, bytes still live at the last read.
    pub live: Estimate,
}

#[derive(Debug, Clone)]
pub struct MemoryData {
    pub stacks: Vec<MemoryStack>,
    /// T: the mean bytes between kept events (--every).
    pub every: u64,
    /// Kept pools and chunks read at the last read of the live view, and
    /// those found freed (or reused for another size) since they were kept.
    pub blocks_read: u64,
    pub blocks_gone: u64,
    pub counters: Counters,
    /// --allocations: every allocation's bytes per stack, freed or not.
    pub allocations: Option<Vec<AllocatedStack>>,
}

/// What one stack allocated during the run (`--allocations`): every call
/// of the object and mem allocators counted at the size asked, freed or
/// not; `objects` are those calls.
#[derive(Debug, Clone)]
pub struct AllocatedStack {
    /// Outermost first.
    pub frames: Vec<Rc<Frame>>,
    pub allocated: Estimate,
}
