//! A `memory` run from start to end: the target found or started, its
//! allocator's probe sites found (a build pytrace cannot measure never
//! runs), the memory program attached, and the live view read at the end
//! of the traced window while the target still runs (the session's
//! `before_detach`); for `top --memory`, also read once a second while it
//! runs (`MemoryTarget::watch`).

use std::time::Duration;

use anyhow::Result;

use super::{Run, Target, TargetSpec};
use crate::model::memory::MemoryData;
use crate::python::probes::alloc_sites::AllocSites;
use crate::python::probes::allocation_sites::Site;
use crate::python::Python;
use crate::tracing::memory::{self, Options};

pub fn trace_memory(spec: TargetSpec, duration: Option<Duration>, opts: Options) -> Result<(Run, MemoryData)> {
    let (target, python) = MemoryTarget::prepare(spec, &opts)?;
    target.trace(&python, duration, opts, |_, _| Ok(true))
}

/// A target made ready for a memory run: found or started (and held),
/// and found measurable: its build has the probe sites, and its objects
/// come from obmalloc.
pub struct MemoryTarget {
    target: Target,
    /// The probe sites, found once here and attached by the run.
    sites: AllocSites,
    /// With --allocations, the allocator entry points.
    allocation_sites: Option<Vec<Site>>,
}

impl MemoryTarget {
    /// Refuses here, before a command runs, a build with no sites or a
    /// process that does not allocate through obmalloc: PYTHONMALLOC is
    /// read once, at startup, from the environment the process was started
    /// with.
    pub fn prepare(spec: TargetSpec, opts: &Options) -> Result<(Self, Python)> {
        let (target, python) = Target::prepare(spec)?;
        let sites = python.alloc_sites().map_err(anyhow::Error::msg)?;
        if let Some(allocator) = crate::process::elf::environment_variable(target.pid, "PYTHONMALLOC") {
            if !allocator.is_empty() && !allocator.starts_with("pymalloc") {
                anyhow::bail!(
                    "process {} runs with PYTHONMALLOC={allocator}: its objects do not come from obmalloc's pools, which `pytrace memory` watches",
                    target.pid
                );
            }
        }
        // A preloaded malloc (jemalloc, tcmalloc, mimalloc) replaces glibc's
        // for the interpreter too.
        let exe_dir = std::path::Path::new(&python.target_path).parent().unwrap_or(std::path::Path::new("/"));
        if let Some(library) = crate::process::elf::preloaded_definer(&python.elf, exe_dir, "malloc", target.pid) {
            anyhow::bail!(
                "process {} preloads {library}, which replaces glibc's malloc: `pytrace memory` reads allocation sizes from glibc's chunk headers",
                target.pid
            );
        }
        crate::python::probes::alloc_sites::check_guards(&python, &sites, target.pid).map_err(anyhow::Error::msg)?;
        let allocation_sites = match opts.allocations {
            true => Some(python.allocation_sites(&sites).map_err(anyhow::Error::msg)?),
            false => None,
        };
        Ok((MemoryTarget { target, sites, allocation_sites }, python))
    }

    pub fn pid(&self) -> u32 {
        self.target.pid
    }

    pub fn cwd(&self) -> Option<String> {
        self.target.cwd()
    }

    /// `pytrace top --memory`: the run, with `each` given between polls a
    /// read of the rows so far (`read_rows`: the live view read then, the
    /// growth so far) and the time run so far; it ends the run by
    /// returning false. What the run gathered at its end is not kept: the
    /// view showed it.
    pub fn watch(self, python: &Python, duration: Option<Duration>, opts: Options, mut each: impl FnMut(&dyn Fn() -> Result<MemoryData>, Duration) -> Result<bool>) -> Result<Run> {
        let (run, _) = self.trace(python, duration, opts, |session, elapsed| each(&|| session.so_far(), elapsed))?;
        Ok(run)
    }

    /// A stop signal (Ctrl-C) ends the traced window here, before the
    /// driver would pass it on to a command pytrace started: the live view
    /// is read while the command still holds its memory, and the command is
    /// stopped after (`Target::end_command`), not while it is read.
    fn trace(self, python: &Python, duration: Option<Duration>, opts: Options, mut each: impl FnMut(&memory::Session<'_, '_>, Duration) -> Result<bool>) -> Result<(Run, MemoryData)> {
        let release = |session: &memory::Session, target: &mut Target| {
            target.release()?;
            session.locate_soon()
        };
        let hidden = self.sites.object_unsized;
        let plan = memory::Plan { pid: self.target.pid, python, opts, sites: &self.sites, allocation_sites: self.allocation_sites.as_deref() };
        let each = |session: &memory::Session, elapsed| Ok(each(session, elapsed)? && !super::stop_requested());
        let (mut run, data) = self.target.trace(python, "memory", duration, plan, release, each)?;
        run.mode = "uprobes at obmalloc's pool openings and big allocations".into();
        if let Some(sites) = &self.allocation_sites {
            run.mode += &format!(" and at its {}", crate::tracing::allocations::describe(sites, hidden));
        }
        Ok((run, data))
    }
}
