//! Reading the target's memory from user space: code objects and their
//! line tables, str objects, thread names, asyncio tasks, the heap. Everything read
//! here is the target's and may be garbage: sizes are bounded, pointers
//! checked before they are followed. Nothing here writes.

pub mod asyncio_tasks;
pub mod code;
pub mod strings;
pub mod thread_names;
pub mod pools;
pub mod heap;
