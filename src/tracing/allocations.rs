//! `memory --allocations`: the uprobes on the object and mem domains'
//! entry points (src/python/probes/allocation_sites.rs), attached beside
//! the memory session's own, and what their programs summed per stack
//! (bpf/memory.bpf.c's `allocation_*`, SOURCE_ALLOCATED in `growth`).

use anyhow::Result;
use libbpf_rs::{Link, UprobeOpts};

use crate::bpf::memory::MemorySkel;
use crate::python::probes::alloc_sites::CopySize;
use crate::python::probes::allocation_sites::{Kind, Site};
use crate::python::Python;

/// Which programs `sites` need loaded: the wrappers' (by symbol), the
/// inlined copies' (stripped builds).
pub fn programs_needed(sites: &[Site]) -> (bool, bool) {
    let copy = |s: &Site| matches!(s.kind, Kind::Copy(_));
    (sites.iter().any(|s| !copy(s)), sites.iter().any(copy))
}

/// Attaches each of `sites` to its kind's program in process `pid`, the
/// way memory.rs attaches its own (`attach_sites`); the copies all to one
/// program, each with its size's place in the cookie.
pub fn attach(skel: &MemorySkel<'_>, python: &Python, pid: u32, sites: &[Site], multi: bool) -> Result<Vec<Link>> {
    let mut links = Vec::with_capacity(sites.len());
    let mut copies = Vec::new();
    for site in sites {
        let prog = match site.kind {
            Kind::Malloc => &skel.progs.allocation_malloc,
            Kind::Calloc => &skel.progs.allocation_calloc,
            Kind::Realloc => &skel.progs.allocation_realloc,
            Kind::Copy(size) => {
                copies.push((site.at, cookie(size)));
                continue;
            }
        };
        links.extend(super::memory::attach_sites(prog, python, pid, &[site.at], multi, site.function)?);
    }
    if !copies.is_empty() {
        links.extend(attach_copies(&skel.progs.allocation_copy, python, pid, &copies, multi)?);
    }

    Ok(links)
}

/// bpf/memory.bpf.c's `allocation_copy` cookie: a register's number (bits
/// 0-7) and whether it holds the size less one (bit 8) or twice the size
/// class (bit 10), or a constant size (bit 9, the size in bits 16-31).
fn cookie(size: CopySize) -> u64 {
    match size {
        CopySize::Register { number, plus_one } => number as u64 | (plus_one as u64) << 8,
        CopySize::Constant { bytes, .. } => 1 << 9 | (bytes as u64 & 0xffff) << 16,
        CopySize::PoolIndex { number } => number as u64 | 1 << 10,
    }
}

fn attach_copies(prog: &libbpf_rs::ProgramMut<'_>, python: &Python, pid: u32, copies: &[(u64, u64)], multi: bool) -> Result<Vec<Link>> {
    let failed = |e: libbpf_rs::Error| super::attach_error(pid, e).context(format!("failed to attach to obmalloc's inlined copies in {}", python.target_path));
    let offsets = copies.iter().map(|&(at, _)| Ok(python.elf.file_offset(at)? as usize)).collect::<Result<Vec<usize>>>()?;
    let cookies: Vec<u64> = copies.iter().map(|&(_, c)| c).collect();
    let path = &python.elf.path;
    if multi {
        let opts = libbpf_rs::UprobeMultiOpts { offsets, cookies, ..Default::default() };
        return Ok(vec![prog.attach_uprobe_multi_with_opts(pid as i32, path, "", opts).map_err(failed)?]);
    }
    offsets.into_iter().zip(cookies).map(|(offset, cookie)| prog.attach_uprobe_with_opts(pid as i32, path, offset, UprobeOpts { cookie, ..Default::default() }).map_err(failed)).collect()
}

/// The sites for the run's mode line: "6 allocator entry points (0
/// single-stepped)", the others at an emulated jump; on a stripped build
/// the inlined copies probed, and how many were not (`hidden`: their
/// code does not show the size), whose calls of up to 512 bytes are not
/// seen.
pub fn describe(sites: &[Site], hidden: usize) -> String {
    let copies = sites.iter().filter(|s| matches!(s.kind, Kind::Copy(_))).count();
    let reallocs = sites.iter().filter(|s| matches!(s.kind, Kind::Realloc)).count();
    if copies > 0 {
        return format!(
            "{copies} inlined copies of the allocator, at a jump each, at its big allocations and its {reallocs} calls of realloc; {hidden} copies whose code hides the size are not probed, and their allocations of up to 512 bytes are not seen"
        );
    }
    let stepped = sites.iter().filter(|s| s.stepped).count();
    format!("{} allocator entry points ({} single-stepped)", sites.len(), stepped)
}
