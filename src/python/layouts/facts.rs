//! What each CPython version does that pytrace must know and no offset
//! says: which calls escape which probe, and the values its frames and
//! stack references use. One row per minor version, next to the generated
//! offsets of table.rs: a new CPython is a row there and a row here (a
//! unit test fails until both exist), and no code compares versions.

use super::NO_FIELD;

#[derive(Debug, PartialEq, Eq)]
pub struct VersionFacts {
    pub version: (u32, u32),
    /// Python-to-Python calls run inside the caller's
    /// _PyEval_EvalFrameDefault (3.11+), unless interp->eval_frame is set:
    /// calls' uprobe mode sets it (src/python/eval_hook.rs).
    pub inlines_calls: bool,
    /// function__entry fires only on the rare call the interpreter does not
    /// inline (3.11: 5 times in 4 million calls, measured), so `calls --mode
    /// usdt` would miss nearly every call.
    pub function_entry_misses_inlined: bool,
    /// function__entry fires when a generator is created as well as when
    /// it resumes (3.11+), so usdt mode counts a generator's call more.
    pub function_entry_at_generator_creation: bool,
    /// CALL_ALLOC_AND_ENTER_INIT runs `__init__` inline at a specialized
    /// site even with the eval-frame hook set (3.13's default build; 3.14
    /// respects the hook there; a free-threaded 3.13 does not specialize):
    /// src/python/inlined_init.rs counts those calls.
    pub init_inlined_past_hook: bool,
    /// BINARY_SUBSCR_GETITEM runs `__getitem__` inline even with the hook
    /// set, in patch releases before this one (3.11 before 3.11.4,
    /// gh-104405): src/python/inlined_getitem.rs.
    pub getitem_inlined_past_hook_before: Option<u32>,
    /// close() of a generator suspended outside any try block may skip its
    /// frame (3.13+, `_PyEval_NoToolsForUnwind`'s fast path):
    /// src/python/generator_close.rs.
    pub close_may_skip_frame: bool,
    /// `_PyInterpreterFrame.owner` (3.11+) of a frame the calling thread
    /// runs (FRAME_OWNED_BY_THREAD), and the first owner value of frames
    /// that run no Python code: the C stack's shim frames
    /// (FRAME_OWNED_BY_CSTACK, 3 in 3.12 and 3.13) and from 3.14 the
    /// interpreter's base frame (FRAME_OWNED_BY_INTERPRETER, 3; the shims
    /// are 4). 3.11 has neither: one past its last owner. NO_FIELD where
    /// frames have no owner.
    pub frame_owned_by_thread: u32,
    pub frame_owned_not_code: u32,
    /// The low bits of a frame's code reference that are flags, not
    /// address: 3.14 makes `f_executable` a tagged _PyStackRef
    /// (Py_TAG_BITS: 1 in 3.14, 3 in 3.15); before, a plain pointer.
    pub code_tag_bits: u64,
}

pub static FACTS: &[VersionFacts] = &[
    VersionFacts {
        version: (3, 9),
        inlines_calls: false,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: false,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: false,
        frame_owned_by_thread: NO_FIELD,
        frame_owned_not_code: NO_FIELD,
        code_tag_bits: 0,
    },
    VersionFacts {
        version: (3, 10),
        inlines_calls: false,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: false,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: false,
        frame_owned_by_thread: NO_FIELD,
        frame_owned_not_code: NO_FIELD,
        code_tag_bits: 0,
    },
    VersionFacts {
        version: (3, 11),
        inlines_calls: true,
        function_entry_misses_inlined: true,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: Some(4),
        close_may_skip_frame: false,
        frame_owned_by_thread: 0,
        frame_owned_not_code: 3,
        code_tag_bits: 0,
    },
    VersionFacts {
        version: (3, 12),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: false,
        frame_owned_by_thread: 0,
        frame_owned_not_code: 3,
        code_tag_bits: 0,
    },
    VersionFacts {
        version: (3, 13),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: true,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: true,
        frame_owned_by_thread: 0,
        frame_owned_not_code: 3,
        code_tag_bits: 0,
    },
    VersionFacts {
        version: (3, 14),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: true,
        frame_owned_by_thread: 0,
        frame_owned_not_code: 3,
        code_tag_bits: 1,
    },
    VersionFacts {
        version: (3, 15),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: true,
        frame_owned_by_thread: 0,
        frame_owned_not_code: 3,
        code_tag_bits: 3,
    },
];

/// The row of `version`, if pytrace knows it.
pub fn for_version(version: (u32, u32)) -> Option<&'static VersionFacts> {
    FACTS.iter().find(|f| f.version == version)
}
