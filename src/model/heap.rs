//! A heap census: the live objects of a process by type, with what the
//! walk covered and what it skipped, as `pytrace heap` gathers it.

use serde::{Deserialize, Serialize};

/// One type's live objects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TypeRow {
    /// `type(o).__module__` and `type(o).__qualname__`.
    pub module: String,
    pub qualname: String,
    /// Whether the collector tracks these objects (found on its lists) or
    /// they are small untracked objects (found in the allocator's arenas).
    pub tracked: bool,
    pub count: u64,
    /// The sum of their `sys.getsizeof` (docs/commands/heap.md: exact for
    /// most types, a lower bound for those that allocate beside the object).
    pub bytes: u64,
}

impl TypeRow {
    /// `module.qualname`, the name rows are keyed by.
    pub fn name(&self) -> String {
        format!("{}.{}", self.module, self.qualname)
    }
}

/// One walk of a process's heap.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Census {
    /// Sorted by bytes, largest first.
    pub rows: Vec<TypeRow>,
    /// Objects counted from the collector's lists, and list nodes whose
    /// type was not a GC type (freed mid-walk, or garbage).
    pub tracked_objects: u64,
    pub tracked_refused: u64,
    /// Objects in the permanent generation (`gc.freeze()`), which
    /// gc.get_objects() and the rows leave out.
    pub frozen_objects: u64,
    /// Where a list broke or looped, if one did.
    pub list_broken: Option<String>,
    /// Small untracked objects found in the arenas; None in `arenas_not_read`
    /// says they were covered.
    pub untracked_objects: u64,
    pub arenas_not_read: Option<String>,
    pub arenas: u64,
    pub arenas_unreadable: u64,
    pub arena_bytes: u64,
    /// Bytes of allocated blocks in the arenas (objects and buffers).
    pub block_bytes: u64,
    pub pools: u64,
    /// Pools whose free list disagreed with their count: changed during the read.
    pub pools_changed: u64,
    /// Heap types whose `__module__` or `__qualname__` could not be read.
    pub types_unnamed: u64,
    /// Dicts, sets and frozensets whose table could not be read or was out
    /// of bounds: sized without it, a lower bound.
    #[serde(default)]
    pub tables_unread: u64,
    /// The collector's young-generation count just after the walk less
    /// just before it: tracked objects allocated less those freed while
    /// the walk ran (0 with --stop). Negative: more were freed, or a
    /// collection ran during it. None: the count could not be read.
    #[serde(default)]
    pub young_change: Option<i64>,
    /// The deadline or a step bound ended the walk before its end.
    pub partial: bool,
    /// How long the walk took, and how long the target was stopped (--stop).
    pub walk_ns: u64,
    pub stopped_ns: Option<u64>,
    /// The process's resident memory (VmRSS) when the walk ended.
    pub rss_bytes: u64,
    /// A free-threaded build's walk, of mimalloc's pages (no arenas nor
    /// collector lists); None for a default build.
    #[serde(default)]
    pub pages_read: Option<PagesRead>,
}

/// What a walk of a free-threaded build's mimalloc pages read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PagesRead {
    /// Thread states whose object heaps were read.
    pub threads: u64,
    /// Pages read, and those skipped: their header or free lists did not
    /// check (changed during the read, or garbage).
    pub pages: u64,
    pub pages_skipped: u64,
    /// Segments of exited threads, on the interpreter's abandoned pool.
    pub abandoned_segments: u64,
}
