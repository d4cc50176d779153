//! Where `pytrace compare` writes: its own JSON (the table goes to standard
//! output unless that does) and, for a live run, the two reports it
//! compared. Every path is checked distinct from the others and from the
//! saved reports read, and made before anything is read or traced
//! (src/report/output.rs).

use std::path::Path;

use anyhow::Result;

use super::Comparison;
use crate::report::calls::CallsReport;
use crate::report::output::{check_distinct, Output};
use crate::report::profile::Profile;

pub struct CompareOutputs {
    json: Option<Output>,
    traced: Option<Output>,
    sampled: Option<Output>,
}

impl CompareOutputs {
    /// `inputs`: the saved reports read; `traced` and `sampled`: where a
    /// live run's two reports go, if anywhere.
    pub fn create(inputs: &[&Path], json: Option<&Path>, traced: Option<&Path>, sampled: Option<&Path>) -> Result<Self> {
        let outputs: Vec<&Path> = [traced, sampled, json].into_iter().flatten().collect();
        check_distinct(inputs, &outputs)?;
        let create = |path: Option<&Path>| path.map(Output::create).transpose();
        let json = create(json)?;
        Ok(CompareOutputs { json, traced: create(traced)?, sampled: create(sampled)? })
    }

    /// A live run's two reports, where they were asked for.
    pub fn write_compared(&mut self, traced: &CallsReport, sampled: &Profile) -> Result<()> {
        self.traced.as_mut().map(|out| out.write_all(traced.to_json().as_bytes())).transpose()?;
        self.sampled.as_mut().map(|out| out.write_all(sampled.to_json().as_bytes())).transpose()?;
        Ok(())
    }

    pub fn write(mut self, comparison: &Comparison, top: usize) -> Result<()> {
        crate::report::emit(self.json.as_mut(), || comparison.to_json(), || comparison.to_table(top))
    }
}
