//! What the gc and imports sessions hand over as they happen: one record
//! per collection, one per import starting or ending.

/// One garbage collection: when it began (CLOCK_MONOTONIC), its pause,
/// what it collected, its generation.
#[derive(Debug, Clone, Copy)]
pub struct Collection {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub collected: i64,
    pub generation: u32,
}

/// An import starting (`start`) or ending on a thread; `found` says, at
/// its end, whether the module was found and loaded.
#[derive(Debug, Clone)]
pub struct ImportEvent {
    pub ts_ns: u64,
    pub tid: u32,
    pub start: bool,
    pub found: bool,
    pub name: String,
}
