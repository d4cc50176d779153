//! Where `sample` writes its profile: each format asked for to its own
//! file or standard output, and the table to the terminal unless a format
//! already took standard output.

use std::path::PathBuf;

use anyhow::Result;

use super::{Format, Profile};
use crate::report::output::{all_written, check_distinct, Output};

/// Every output of one run, created before sampling starts so that a bad
/// path fails at once, in the order given.
pub struct Outputs(Vec<(Format, Output)>);

impl Outputs {
    /// Refuses a path given twice, then creates each output.
    pub fn create(wanted: &[(Format, PathBuf)]) -> Result<Self> {
        let outputs: Vec<(Format, Output)> = wanted.iter().map(|(format, path)| Ok((*format, Output::create(path)?))).collect::<Result<_>>()?;
        check_distinct(&[], &outputs.iter().map(|(_, out)| out).collect::<Vec<_>>())?;
        Ok(Outputs(outputs))
    }

    /// Writes `profile` in every format, then the top `top` functions as a
    /// table on standard output unless a format went there: all of them
    /// even when one fails, each failure its own sentence.
    pub fn write(mut self, profile: &Profile, top: usize) -> Result<()> {
        // Files first: a reader of standard output that went away (`| head`)
        // fails the run, but not before every file is written.
        self.0.sort_by_key(|(_, out)| matches!(out, Output::Stdout));
        let mut table_on_stdout = true;
        let mut results = Vec::new();
        for (format, mut out) in self.0 {
            table_on_stdout &= !matches!(out, Output::Stdout);
            results.push(format.render(profile, top).and_then(|bytes| out.write_all(&bytes)));
        }
        if table_on_stdout {
            results.push(
                Format::Table.render(profile, top).and_then(|bytes| crate::console::out(&String::from_utf8_lossy(&bytes))),
            );
        }
        all_written(results)
    }
}
