//! `memory --allocations`: the uprobes on the object and mem domains'
//! entry points (src/python/probes/allocation_sites.rs), attached beside
//! the memory session's own, and what their programs summed per stack
//! (bpf/memory.bpf.c's `allocation_*`, SOURCE_ALLOCATED in `growth`).

use anyhow::{Context, Result};
use libbpf_rs::Link;

use super::attach_error;
use crate::bpf::memory::MemorySkel;
use crate::python::probes::allocation_sites::{Kind, Site};
use crate::python::Python;

/// Attaches a program at each of `sites` in process `pid`: as uprobe_multi
/// links with `multi`, the attach type every memory program was loaded
/// with then (memory.rs: a tail call's target must have its caller's).
pub fn attach(skel: &MemorySkel<'_>, python: &Python, pid: u32, sites: &[Site], multi: bool) -> Result<Vec<Link>> {
    let path = &python.elf.path;
    let mut links = Vec::with_capacity(sites.len());
    for site in sites {
        let prog = match site.kind {
            Kind::Malloc => &skel.progs.allocation_malloc,
            Kind::Calloc => &skel.progs.allocation_calloc,
            Kind::Realloc => &skel.progs.allocation_realloc,
        };
        let offset = python.elf.file_offset(site.at)? as usize;
        let link = match multi {
            true => prog.attach_uprobe_multi_with_opts(pid as i32, path, "", libbpf_rs::UprobeMultiOpts { offsets: vec![offset], ..Default::default() }),
            false => prog.attach_uprobe(false, pid as i32, path, offset),
        };
        let link = link
            .map_err(|e| attach_error(pid, e))
            .with_context(|| format!("failed to attach to {} in {}", site.function, python.target_path))?;
        links.push(link);
    }
    Ok(links)
}

/// The sites for the run's mode line: "6 allocator entry points (0
/// single-stepped)"; the others are at an emulated jump.
pub fn describe(sites: &[Site]) -> String {
    let stepped = sites.iter().filter(|s| s.stepped).count();
    format!("{} allocator entry points ({} single-stepped)", sites.len(), stepped)
}
