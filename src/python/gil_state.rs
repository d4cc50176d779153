//! Where a CPython keeps its GIL's state, for `sample --gil`, which reads it
//! from outside: whether the GIL is locked and which thread state took it
//! last. Numbers from the versions' headers by scripts/gil-offsets.c
//! (pyenv's 3.9.18, 3.10.13, 3.11.7, 3.12.1, 3.13.0; Debian's 3.11.2 agrees).

use super::layouts::Layout;

/// Where the GIL is, in one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GilState {
    /// Offset of the GIL (struct _gil_runtime_state) in _PyRuntime: 3.9 to
    /// 3.11, where the runtime has one GIL.
    pub runtime_gil: Option<u32>,
    /// Offset in PyInterpreterState of the pointer to its GIL: 3.12+, where
    /// each interpreter may have its own.
    pub interp_gil: Option<u32>,
    /// In the GIL: the PyThreadState that took it last (take_gil sets it,
    /// drop_gil leaves it).
    pub last_holder: u32,
    /// In the GIL: an int, 1 while held.
    pub locked: u32,
    pub size: u32,
}

/// The GIL of a version, or None where there is none (free-threaded
/// builds) or none known.
pub fn for_layout(layout: &Layout) -> Option<GilState> {
    if layout.free_threaded {
        return None;
    }
    let (runtime_gil, interp_gil) = match layout.version {
        (3, 9) | (3, 10) => (Some(352), None),
        (3, 11) => (Some(360), None),
        (3, 12) => (None, Some(384)),
        // From 3.13 the interpreter starts with its struct _ceval_state,
        // whose GIL pointer follows a word and an int. 3.14 and 3.15 keep
        // that head (Include/internal/pycore_interp_structs.h); no headers
        // of theirs here to run scripts/gil-offsets.c on, so the sampler
        // checks what it reads (a GIL's locked is 0 or 1) and counts what
        // fails, and tests/gil.rs checks the result on Debian sid's.
        (3, 13..=15) => (None, Some(16)),
        _ => return None,
    };
    Some(GilState { runtime_gil, interp_gil, last_holder: 8, locked: 16, size: 208 })
}
