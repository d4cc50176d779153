//! `pytrace memory`: the bytes each Python stack made the heap grow by and
//! still holds, sampled by bytes (docs/commands/memory.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::report::memory::{live_profile, to_pprof, MemoryReport};
use crate::report::output::{all_written, check_distinct};
use crate::report::profile::Format;
use crate::report::{self, Output};
use crate::session::{self, TargetSpec};
use crate::tracing::memory::Options as MemoryOptions;

/// A file of the profile's, besides the table and JSON.
#[derive(Clone, Copy)]
pub enum File {
    /// sample's stack formats, weighted by live bytes.
    Stacks(Format),
    /// Go's heap profile.
    Pprof,
}

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub memory: MemoryOptions,
    pub top: usize,
    pub json: Option<PathBuf>,
    /// Folded stacks, flamegraph, speedscope, pprof: each to its file.
    pub files: Vec<(File, PathBuf)>,
}

pub fn run(opts: Options) -> Result<i32> {
    // Created before the run, so that a bad path fails at once.
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let files: Vec<(File, Output)> = opts.files.iter().map(|(kind, path)| Ok((*kind, Output::create(path)?))).collect::<Result<_>>()?;
    check_distinct(&[], &json.iter().chain(files.iter().map(|(_, out)| out)).collect::<Vec<_>>())?;
    let (run, data) = session::trace_memory(opts.target, opts.duration, opts.memory)?;
    let duration_ns = run.elapsed.as_nanos() as u64;
    let profile = live_profile(run.pid, run.python_info(), duration_ns, &data);
    let subject = format!("PID {}, Python {}", run.pid, run.python_info().version);
    let written: Vec<Result<()>> = files
        .into_iter()
        .map(|(kind, mut out)| {
            let bytes = match kind {
                File::Stacks(format) => format.render(&profile, 0)?,
                File::Pprof => to_pprof(&data, duration_ns, &subject)?,
            };
            out.write_all(&bytes)
        })
        .collect();
    all_written(written)?;
    let report = MemoryReport::new(run.pid, run.python_info(), duration_ns, data);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table(opts.top))?;
    Ok(run.exit_code())
}
