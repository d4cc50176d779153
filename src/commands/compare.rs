//! `pytrace compare`: `calls` and `sample` on one target at the same time,
//! or two saved reports, compared per function (src/report/compare/).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::compare::{live_reports, CompareOutputs, Comparison, SampledReport, TracedReport};
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
    let (inputs, traced_json, sampled_json) = match &opts.source {
        Source::Saved { traced, sampled } => (vec![traced.as_path(), sampled.as_path()], None, None),
        Source::Live { traced_json, sampled_json, .. } => (vec![], traced_json.as_deref(), sampled_json.as_deref()),
    };
    let mut outputs = CompareOutputs::create(&inputs, opts.json.as_deref(), traced_json, sampled_json)?;
    let (traced, sampled, status) = match opts.source {
        Source::Saved { traced, sampled } => (TracedReport::read(&traced)?, SampledReport::read(&sampled)?, 0),
        Source::Live { target, duration, hz, .. } => {
            let run = session::trace_and_sample(target, duration, hz)?;
            let status = run.exit_code;
            let (traced, sampled) = live_reports(run);
            outputs.write_compared(&traced, &sampled);
            // The same numbers a saved pair of these reports gives.
            (TracedReport::from(&traced), SampledReport::from(&sampled), status)
        }
    };
    outputs.write(&Comparison::new(&traced, &sampled), opts.top)?;
    Ok(status)
}
