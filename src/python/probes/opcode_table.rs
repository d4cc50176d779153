//! The interpreter's table of opcode handlers (`opcode_targets`: 256
//! addresses into `_PyEval_EvalFrameDefault`, one per opcode, for its
//! computed gotos). Where a specialized instruction runs a call without
//! entering `_PyEval_EvalFrameDefault`, its handler is where pytrace can
//! count that call; a stripped build names neither the table nor the
//! handlers, so they are found here by shape.
//!
//! In a non-PIE executable the table is a static initialiser: the file holds
//! the addresses. In a PIE executable or a shared libpython it holds zeros
//! and the loader writes each entry from an R_X86_64_RELATIVE relocation,
//! whose addend is the same link-time address (ElfFile::segment_words).

use crate::python::Python;

/// Entries in the table: one per possible opcode byte.
pub const TABLE_LEN: usize = 256;

impl Python {
    /// The one answer `find` gives for every candidate table that gives
    /// one; None if none does or two disagree (a wrong probe site would
    /// count calls that were not made). Candidates are every 256
    /// consecutive words that all point into the segment holding
    /// `_PyEval_EvalFrameDefault`: the handler table, and whatever else has
    /// that shape (a longer run of code addresses gives a window at each
    /// position, since the table may sit next to other code pointers).
    pub fn agreed_by_handler_tables<T: PartialEq>(&self, mut find: impl FnMut(&[u64]) -> Option<T>) -> Option<T> {
        let eval = self.elf.symbol(crate::python::EVAL_FRAME_SYMBOL)?;
        let code = self.elf.segment_range(eval)?;
        let mut found = None;
        for (_, words) in self.elf.segment_words() {
            let mut run = 0;
            for (i, w) in words.iter().enumerate() {
                run = if code.contains(w) { run + 1 } else { 0 };
                if run < TABLE_LEN {
                    continue;
                }
                let Some(answer) = find(&words[i + 1 - TABLE_LEN..=i]) else { continue };
                match &found {
                    None => found = Some(answer),
                    Some(other) if *other == answer => {}
                    Some(_) => return None,
                }
            }
        }
        found
    }
}
