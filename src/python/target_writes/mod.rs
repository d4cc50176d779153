//! The one code path that writes into a target, kept apart from every
//! reader: the eval-frame hook set and put back (eval_hook.rs, with the
//! guardian that puts it back if pytrace dies), the lock that gives a
//! process's hook one owner (hook_owner.rs), and where the written field
//! sits (eval_frame_offset.rs).

pub mod eval_frame_offset;
pub mod eval_hook;
pub mod hook_owner;
