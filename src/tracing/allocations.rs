//! `memory --allocations`: the uprobes on the object and mem domains'
//! entry points (src/python/probes/allocation_sites.rs), attached beside
//! the memory session's own, and what their programs summed per stack
//! (bpf/memory.bpf.c's `allocation_*`, SOURCE_ALLOCATED in `growth`).

use anyhow::Result;
use libbpf_rs::Link;

use crate::bpf::memory::MemorySkel;
use crate::python::probes::allocation_sites::{Kind, Site};
use crate::python::Python;

/// Attaches each of `sites` to its kind's program in process `pid`, the
/// way memory.rs attaches its own (`attach_sites`).
pub fn attach(skel: &MemorySkel<'_>, python: &Python, pid: u32, sites: &[Site], multi: bool) -> Result<Vec<Link>> {
    let mut links = Vec::with_capacity(sites.len());
    for site in sites {
        let prog = match site.kind {
            Kind::Malloc => &skel.progs.allocation_malloc,
            Kind::Calloc => &skel.progs.allocation_calloc,
            Kind::Realloc => &skel.progs.allocation_realloc,
        };
        links.extend(super::memory::attach_sites(prog, python, pid, &[site.at], multi, site.function)?);
    }
    Ok(links)
}

/// The sites for the run's mode line: "6 allocator entry points (0
/// single-stepped)"; the others are at an emulated jump.
pub fn describe(sites: &[Site]) -> String {
    let stepped = sites.iter().filter(|s| s.stepped).count();
    format!("{} allocator entry points ({} single-stepped)", sites.len(), stepped)
}
