//! What each CPython version does that pytrace must know and its headers
//! do not say: which calls escape which probe, measured on each version.
//! One row per minor version, next to the generated rows of table.rs
//! (which also hold what the headers do say: frame owners, tag bits, the
//! line table's format): a new CPython is a generated row there and a row
//! here (a unit test fails until both exist), and no code compares versions.

#[derive(Debug, PartialEq, Eq)]
pub struct VersionFacts {
    pub version: (u32, u32),
    /// Python-to-Python calls run inside the caller's
    /// _PyEval_EvalFrameDefault (3.11+), unless interp->eval_frame is set:
    /// calls' uprobe mode sets it (src/python/target_writes/eval_hook.rs).
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
    /// src/python/probes/inlined_init.rs counts those calls.
    pub init_inlined_past_hook: bool,
    /// BINARY_SUBSCR_GETITEM runs `__getitem__` inline even with the hook
    /// set, in patch releases before this one (3.11 before 3.11.4,
    /// gh-104405): src/python/probes/inlined_getitem.rs.
    pub getitem_inlined_past_hook_before: Option<u32>,
    /// close() of a generator suspended outside any try block may skip its
    /// frame (3.13+, `_PyEval_NoToolsForUnwind`'s fast path):
    /// src/python/probes/generator_close.rs.
    pub close_may_skip_frame: bool,
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
    },
    VersionFacts {
        version: (3, 10),
        inlines_calls: false,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: false,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: false,
    },
    VersionFacts {
        version: (3, 11),
        inlines_calls: true,
        function_entry_misses_inlined: true,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: Some(4),
        close_may_skip_frame: false,
    },
    VersionFacts {
        version: (3, 12),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: false,
    },
    VersionFacts {
        version: (3, 13),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: true,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: true,
    },
    VersionFacts {
        version: (3, 14),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: true,
    },
    VersionFacts {
        version: (3, 15),
        inlines_calls: true,
        function_entry_misses_inlined: false,
        function_entry_at_generator_creation: true,
        init_inlined_past_hook: false,
        getitem_inlined_past_hook_before: None,
        close_may_skip_frame: true,
    },
];

/// The row of `version`, if pytrace knows it.
pub fn for_version(version: (u32, u32)) -> Option<&'static VersionFacts> {
    FACTS.iter().find(|f| f.version == version)
}
