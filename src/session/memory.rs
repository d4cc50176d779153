//! A `memory` run from start to end: the target found or started, its
//! allocator's probe sites found (a build pytrace cannot measure never
//! runs), the memory program attached, and the live view read at the end
//! of the traced window while the target still runs (the session's
//! `before_detach`).

use std::time::Duration;

use anyhow::Result;

use super::{Run, Target, TargetSpec};
use crate::model::memory::MemoryData;
use crate::tracing::memory::{self, Options};

/// A stop signal (Ctrl-C) ends the traced window here, before the driver
/// would pass it on to a command pytrace started: the live view is read
/// while the command still holds its memory, and the command is stopped
/// after (`Target::end_command`), not while it is read.
pub fn trace_memory(spec: TargetSpec, duration: Option<Duration>, opts: Options) -> Result<(Run, MemoryData)> {
    let (target, python) = Target::prepare(spec)?;
    // Refused here, before the command runs, if the build has no sites or
    // the process does not allocate through obmalloc: PYTHONMALLOC is read
    // once, at startup, from the environment the process was started with.
    let sites = python.alloc_sites().map_err(anyhow::Error::msg)?;
    if let Some(allocator) = crate::process::elf::environment_variable(target.pid, "PYTHONMALLOC") {
        if !allocator.is_empty() && !allocator.starts_with("pymalloc") {
            anyhow::bail!(
                "process {} runs with PYTHONMALLOC={allocator}: its objects do not come from obmalloc's pools, which `pytrace memory` watches",
                target.pid
            );
        }
    }
    crate::python::probes::alloc_sites::check_guards(&python, &sites, target.pid).map_err(anyhow::Error::msg)?;
    let allocation_sites = if opts.allocations { Some(python.allocation_sites().map_err(anyhow::Error::msg)?) } else { None };
    let release = |session: &memory::Session, target: &mut Target| {
        target.release()?;
        session.locate_soon()
    };
    let plan = memory::Plan { pid: target.pid, python: &python, opts };
    let (mut run, data) = target.trace(&python, "memory", duration, plan, release, |_, _| Ok(!super::stop_requested()))?;
    run.mode = "uprobes at obmalloc's pool openings and big allocations".into();
    if let Some(sites) = allocation_sites {
        run.mode += &format!(" and at its {}", crate::tracing::allocations::describe(&sites));
    }
    Ok((run, data))
}
