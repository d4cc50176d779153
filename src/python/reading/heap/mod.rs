//! Reading a target's heap for `pytrace heap`, without writing anything:
//! a free-threaded build's mimalloc pages (`mimalloc.rs`), or else
//! obmalloc's arenas read whole (`arenas.rs`), in which the objects the
//! collector tracks are found with their list links checked (`tracked.rs`;
//! the lists' heads and the permanent generation: `gc_lists.rs`) and the
//! small objects it does not track (str, int, float, bytes...),
//! each object's type checked before it counts (`types.rs`) and its size
//! as `sys.getsizeof` counts it (`sizes.rs`).
//!
//! Every pointer comes from the target and may be garbage: a type counts
//! only if it is a type (its own type reaches PyType_Type, its sizes in
//! bounds), a list node only if its neighbours point back at it, a pool
//! only if its free list agrees with its count; whatever fails is counted
//! as skipped, never followed.

pub mod arenas;
pub mod gc_lists;
pub mod mimalloc;
pub mod sizes;
pub mod tracked;
pub mod types;

/// The largest user-space address on x86-64 (47 bits).
pub const USER_END: u64 = 1 << 47;

/// Whether `addr` could be an object or type pointer: non-null, 8-aligned,
/// in user space.
pub fn plausible(addr: u64) -> bool {
    addr != 0 && addr.is_multiple_of(8) && addr < USER_END
}

/// A little-endian u64 at `at` in `bytes` (the caller bounds `at`).
pub fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// A little-endian u32 at `at` in `bytes`.
pub fn word32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}
