//! Per-version CPython layouts: the offsets of the few fields pytrace reads.
//! Generated from each version's own headers by scripts/layout-offsets.sh
//! (never counted by hand); within a minor version they have not changed
//! (3.11.2 and 3.11.7 give the same table). Everything version-specific that
//! the BPF programs need is here, so they never name a version.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: (u32, u32),
    pub runtime_interpreters_head: u32,
    pub interp_next: u32,
    pub interp_eval_frame: u32,
    pub interp_threads_head: u32,
    pub tstate_next: u32,
    pub tstate_interp: u32,
    pub tstate_thread_id: u32,
    /// Where a thread's running frame is: tstate->cframe (3.11, 3.12), then
    /// ->current_frame; or the frame itself (tstate->frame before 3.11).
    pub tstate_current: u32,
    pub cframe_current_frame: u32,
    /// The frame's current instruction: a pointer into the bytecode from
    /// 3.11 (prev_instr, then instr_ptr), f_lasti before.
    pub frame_instr: u32,
    /// Where a code object's bytecode starts (3.11+), else NO_FIELD.
    pub code_code: u32,
    /// The line table: co_linetable from 3.10, co_lnotab before.
    pub code_linetable: u32,
    pub bytes_size: u32,
    pub bytes_data: u32,
    /// _PyInterpreterFrame.owner (3.11+), else NO_FIELD.
    pub frame_owner: u32,
    /// _PyInterpreterFrame.is_entry (3.11 only): the frame began a C-level
    /// _PyEval_EvalFrameDefault call. Before 3.11 every frame does; from
    /// 3.12 a shim frame with a non-code owner marks where a call began.
    pub frame_is_entry: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub object_type: u32,
    pub code_flags: u32,
    pub code_filename: u32,
    pub code_name: u32,
    pub code_qualname: u32,
    pub code_firstlineno: u32,
    pub unicode_length: u32,
    pub unicode_hash: u32,
    pub unicode_state: u32,
    pub unicode_ascii_data: u32,
    pub unicode_compact_data: u32,
}

/// The offset of a field this version does not have.
pub const NO_FIELD: u32 = u32::MAX;

pub static LAYOUTS: &[Layout] = &[
    // CPython 3.9.18, from its headers by scripts/layout-offsets.sh
    Layout {
        version: (3, 9),
        runtime_interpreters_head: 32,
        interp_next: 0,
        interp_eval_frame: 1400,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_thread_id: 176,
        tstate_current: 24,
        cframe_current_frame: NO_FIELD,
        frame_instr: 104,
        code_code: NO_FIELD,
        code_linetable: 120,
        bytes_size: 16,
        bytes_data: 32,
        frame_owner: NO_FIELD,
        frame_is_entry: NO_FIELD,
        frame_code: 32,
        frame_previous: 24,
        object_type: 8,
        code_flags: 36,
        code_filename: 104,
        code_name: 112,
        code_qualname: 112,
        code_firstlineno: 40,
        unicode_length: 16,
        unicode_hash: 24,
        unicode_state: 32,
        unicode_ascii_data: 48,
        unicode_compact_data: 72,
    },
    // CPython 3.10.13, from its headers by scripts/layout-offsets.sh
    Layout {
        version: (3, 10),
        runtime_interpreters_head: 32,
        interp_next: 0,
        interp_eval_frame: 1368,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_thread_id: 176,
        tstate_current: 24,
        cframe_current_frame: NO_FIELD,
        frame_instr: 96,
        code_code: NO_FIELD,
        code_linetable: 120,
        bytes_size: 16,
        bytes_data: 32,
        frame_owner: NO_FIELD,
        frame_is_entry: NO_FIELD,
        frame_code: 32,
        frame_previous: 24,
        object_type: 8,
        code_flags: 36,
        code_filename: 104,
        code_name: 112,
        code_qualname: 112,
        code_firstlineno: 40,
        unicode_length: 16,
        unicode_hash: 24,
        unicode_state: 32,
        unicode_ascii_data: 48,
        unicode_compact_data: 72,
    },
    // CPython 3.11.2, from its headers by scripts/layout-offsets.sh
    Layout {
        version: (3, 11),
        runtime_interpreters_head: 40,
        interp_next: 0,
        interp_eval_frame: 1424,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_thread_id: 152,
        tstate_current: 56,
        cframe_current_frame: 8,
        frame_instr: 56,
        code_code: 184,
        code_linetable: 136,
        bytes_size: 16,
        bytes_data: 32,
        frame_owner: 69,
        frame_is_entry: 68,
        frame_code: 32,
        frame_previous: 48,
        object_type: 8,
        code_flags: 48,
        code_filename: 112,
        code_name: 120,
        code_qualname: 128,
        code_firstlineno: 72,
        unicode_length: 16,
        unicode_hash: 24,
        unicode_state: 32,
        unicode_ascii_data: 48,
        unicode_compact_data: 72,
    },
    // CPython 3.12.1, from its headers by scripts/layout-offsets.sh
    Layout {
        version: (3, 12),
        runtime_interpreters_head: 40,
        interp_next: 0,
        interp_eval_frame: 1744,
        interp_threads_head: 72,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_thread_id: 136,
        tstate_current: 56,
        cframe_current_frame: 0,
        frame_instr: 56,
        code_code: 192,
        code_linetable: 136,
        bytes_size: 16,
        bytes_data: 32,
        frame_owner: 70,
        frame_is_entry: NO_FIELD,
        frame_code: 0,
        frame_previous: 8,
        object_type: 8,
        code_flags: 48,
        code_filename: 112,
        code_name: 120,
        code_qualname: 128,
        code_firstlineno: 68,
        unicode_length: 16,
        unicode_hash: 24,
        unicode_state: 32,
        unicode_ascii_data: 40,
        unicode_compact_data: 56,
    },
];

pub fn for_version(major: u32, minor: u32) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.version == (major, minor))
}

/// "3.9 to 3.12", for error messages.
pub fn supported_range() -> String {
    let first = LAYOUTS.first().map(|l| l.version).unwrap_or_default();
    let last = LAYOUTS.last().map(|l| l.version).unwrap_or_default();
    format!("{}.{} to {}.{}", first.0, first.1, last.0, last.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_sorted_and_unique() {
        for pair in LAYOUTS.windows(2) {
            assert!(pair[0].version < pair[1].version, "{:?} before {:?}", pair[0].version, pair[1].version);
        }
        assert_eq!(supported_range(), "3.9 to 3.12");
    }
}
