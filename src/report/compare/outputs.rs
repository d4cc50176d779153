//! Where `pytrace compare` writes: its own JSON (the table goes to standard
//! output unless that does) and, for a live run, the two reports it
//! compared. Every path is checked distinct from the others and from the
//! saved reports read, and made before anything is read or traced
//! (src/report/output.rs).

use std::path::Path;

use anyhow::Result;

use super::Comparison;
use crate::report::calls::CallsReport;
use crate::report::output::{all_written, check_distinct, Output};
use crate::report::profile::Profile;

pub struct CompareOutputs {
    json: Option<Output>,
    traced: Option<Output>,
    sampled: Option<Output>,
    /// What failed of write_compared.
    failed: Vec<anyhow::Error>,
}

impl CompareOutputs {
    /// `inputs`: the saved reports read; `traced` and `sampled`: where a
    /// live run's two reports go, if anywhere.
    pub fn create(inputs: &[&Path], json: Option<&Path>, traced: Option<&Path>, sampled: Option<&Path>) -> Result<Self> {
        let create = |path: Option<&Path>| path.map(Output::create).transpose();
        let outputs = CompareOutputs { traced: create(traced)?, sampled: create(sampled)?, json: create(json)?, failed: Vec::new() };
        check_distinct(inputs, &[&outputs.traced, &outputs.sampled, &outputs.json].into_iter().flatten().collect::<Vec<_>>())?;
        Ok(outputs)
    }

    /// A live run's two reports, where they were asked for; a failure is
    /// kept for the end, so that the comparison is still written.
    pub fn write_compared(&mut self, traced: &CallsReport, sampled: &Profile) {
        let traced = self.traced.as_mut().map(|out| out.write_all(traced.to_json().as_bytes()));
        let sampled = self.sampled.as_mut().map(|out| out.write_all(sampled.to_json().as_bytes()));
        self.failed.extend([traced, sampled].into_iter().flatten().filter_map(Result::err));
    }

    pub fn write(mut self, comparison: &Comparison, top: usize) -> Result<()> {
        let json = crate::report::emit(self.json.as_mut(), || comparison.to_json(), || comparison.to_table(top));
        all_written(self.failed.drain(..).map(Err).chain([json]))
    }
}
