//! `pytrace compare`: `calls` and `sample` on one target at the same time,
//! or two saved reports, compared per function (src/report/compare/).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::report::compare::{live_reports, Comparison, SampledReport, TracedReport};
use crate::report::output::check_distinct;
use crate::report::{self, Output};
use crate::session::{self, TargetSpec};

pub enum Source {
    /// Trace and sample a target now; also write the two reports compared
    /// where asked.
    Live { target: TargetSpec, duration: Option<Duration>, hz: u64, traced_json: Option<PathBuf>, sampled_json: Option<PathBuf> },
    /// A `calls --json` and a `sample --json` report written before.
    Saved { traced: PathBuf, sampled: PathBuf },
}

pub struct Options {
    pub source: Source,
    pub top: usize,
    pub json: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let (inputs, outputs): (Vec<&Path>, Vec<&Path>) = match &opts.source {
        Source::Saved { traced, sampled } => (vec![traced, sampled], opts.json.as_deref().into_iter().collect()),
        Source::Live { traced_json, sampled_json, .. } => (vec![], [traced_json, sampled_json, &opts.json].into_iter().flatten().map(PathBuf::as_path).collect()),
    };
    check_distinct(&inputs, &outputs)?;
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let (traced, sampled, status) = match opts.source {
        Source::Saved { traced, sampled } => (TracedReport::read(&traced)?, SampledReport::read(&sampled)?, 0),
        Source::Live { target, duration, hz, traced_json, sampled_json } => {
            let mut traced_out = traced_json.as_deref().map(Output::create).transpose()?;
            let mut sampled_out = sampled_json.as_deref().map(Output::create).transpose()?;
            let run = session::trace_and_sample(target, duration, hz)?;
            let status = run.exit_code;
            let (traced, sampled) = live_reports(run);
            traced_out.as_mut().map(|out| out.write_all(traced.to_json().as_bytes())).transpose()?;
            sampled_out.as_mut().map(|out| out.write_all(sampled.to_json().as_bytes())).transpose()?;
            // The same numbers a saved pair of these reports gives.
            (TracedReport::from(&traced), SampledReport::from(&sampled), status)
        }
    };
    let comparison = Comparison::new(&traced, &sampled);
    report::emit(json.as_mut(), || comparison.to_json(), || comparison.to_table(opts.top))?;
    Ok(status)
}
