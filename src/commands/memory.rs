//! `pytrace memory`: the bytes each Python stack made the heap grow by and
//! still holds, sampled by bytes (docs/commands/memory.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::model::samples::Sample;
use crate::report::memory::MemoryReport;
use crate::report::profile::{Format, Profile};
use crate::report::{self, Output};
use crate::session::{self, TargetSpec};
use crate::tracing::memory::Options as MemoryOptions;

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub memory: MemoryOptions,
    pub top: usize,
    pub json: Option<PathBuf>,
    /// Folded stacks weighted by live bytes.
    pub folded: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let mut folded = opts.folded.as_deref().map(Output::create).transpose()?;
    let (run, data) = session::trace_memory(opts.target, opts.duration, opts.memory)?;
    if let Some(out) = &mut folded {
        // sample's folded writer, each stack weighted by its live bytes.
        let samples: Vec<Sample> = data.stacks.iter().map(|s| Sample { pid: run.pid, tid: 0, frames: s.frames.clone(), count: s.live.bytes.round() as u64 }).filter(|s| s.count > 0).collect();
        let profile = Profile::new(run.pid, run.python_info(), 0, run.elapsed.as_nanos() as u64, data.counters.clone(), &samples, None);
        out.write_all(&Format::Folded.render(&profile, 0)?)?;
    }
    let report = MemoryReport::new(run.pid, run.python_info(), run.elapsed.as_nanos() as u64, data);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table(opts.top))?;
    Ok(run.exit_code())
}
