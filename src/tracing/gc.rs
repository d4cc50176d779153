//! The `gc` BPF session (bpf/gc.bpf.c): one event per garbage collection.

use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{Link, RingBufferBuilder};

use super::{attach_entry_and_return, attach_error, entry_probe_offset, ensure_still_running, has_uprobe_sessions, poll_until, read_counters};
use crate::bpf::gc::types::{gc_counter, gc_event};
use crate::bpf::gc::GcSkelBuilder;
use crate::python::Python;

/// The collector's main function in 3.9 to 3.12, whose second argument is
/// the generation and whose return value is what gc__done reports.
const GC_FUNCTION: &str = "gc_collect_main";

pub use super::Mode;

/// The mode `gc` uses for this interpreter, and why.
pub fn choose_mode(python: &Python) -> Result<(Mode, &'static str)> {
    let elf = &python.elf;
    if elf.has_usdt("python", "gc__start") && elf.has_usdt("python", "gc__done") {
        return Ok((Mode::Usdt, "the gc__start and gc__done probes"));
    }
    // 3.13 passes -1 (GENERATION_AUTO) for automatic collections and picks
    // the generation inside (measured on pyenv's 3.13.0); 3.14 has no
    // gc_collect_main.
    if python.version.minor <= 12 && elf.symbol(GC_FUNCTION).is_some() {
        return Ok((Mode::Uprobe, "no gc probes; gc_collect_main is in the symbol table"));
    }
    bail!(
        "{} has neither the gc__start/gc__done USDT probes (built without --with-dtrace) nor a symbol table naming {GC_FUNCTION} (stripped): pytrace gc cannot see its collections",
        python.target_path
    )
}

#[derive(Debug, Clone, Copy)]
pub struct Collection {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub collected: i64,
    pub generation: u32,
}

pub struct GcData {
    pub counters: Vec<(&'static str, u64)>,
}

impl GcData {
    pub fn lost_events(&self) -> u64 {
        self.counters.iter().filter(|(n, _)| *n == "event_lost").map(|(_, v)| v).sum()
    }
}

/// Loads and attaches, calls `attached` once live, hands each collection to
/// `on_collection` as it arrives, until `keep_going` says stop.
pub fn run(
    pid: u32,
    python: &Python,
    mode: Mode,
    attached: impl FnOnce() -> Result<()>,
    keep_going: impl FnMut() -> Result<bool>,
    mut on_collection: impl FnMut(Collection),
) -> Result<GcData> {
    let mut object = MaybeUninit::uninit();
    let mut open = GcSkelBuilder::default().open(&mut object).context("failed to open the gc BPF program")?;
    let sessions = has_uprobe_sessions();
    open.progs.usdt_gc_start.set_autoload(mode == Mode::Usdt);
    open.progs.usdt_gc_done.set_autoload(mode == Mode::Usdt);
    open.progs.gc_collect_main.set_autoload(mode == Mode::Uprobe && sessions);
    open.progs.gc_collect_main_entry.set_autoload(mode == Mode::Uprobe && !sessions);
    open.progs.gc_collect_main_return.set_autoload(mode == Mode::Uprobe && !sessions);
    let skel = crate::bpf::load::load("gc", open)?;

    let path = &python.elf.path;
    let what = || format!("failed to attach to the garbage collector of {}", python.target_path);
    let links: Vec<Link> = match mode {
        Mode::Usdt => vec![
            skel.progs.usdt_gc_start.attach_usdt(pid as i32, path, "python", "gc__start").map_err(|e| attach_error(pid, e)).with_context(what)?,
            skel.progs.usdt_gc_done.attach_usdt(pid as i32, path, "python", "gc__done").map_err(|e| attach_error(pid, e)).with_context(what)?,
        ],
        Mode::Uprobe => {
            let addr = python.symbol(GC_FUNCTION)?;
            let offset = entry_probe_offset(python.elf.read_static(addr, 8)?, python.elf.file_offset(addr)? as usize);
            let p = &skel.progs;
            attach_entry_and_return(&p.gc_collect_main, &p.gc_collect_main_entry, &p.gc_collect_main_return, pid, path, offset)
                .with_context(what)?
        }
    };
    ensure_still_running(pid)?;

    let mut builder = RingBufferBuilder::new();
    builder.add(&skel.maps.events, |bytes: &[u8]| {
        let mut ev = gc_event::default();
        if plain::copy_from_bytes(&mut ev, bytes).is_ok() {
            on_collection(Collection {
                start_ns: ev.start_ns,
                duration_ns: ev.duration_ns,
                collected: ev.collected,
                generation: ev.generation,
            });
        }
        0
    })?;
    let ring = builder.build()?;
    attached()?;
    let polled = poll_until(&ring, "gc", keep_going);
    drop(links);
    polled?;
    ring.consume().context("failed to drain the gc ring buffer")?;
    drop(ring);
    let counters = read_counters(
        &skel.maps.counters,
        &[("event_lost", gc_counter::GC_EVENT_LOST.0), ("unmatched_done", gc_counter::GC_UNMATCHED_DONE.0)],
    )?;
    Ok(GcData { counters })
}

// SAFETY: a plain integer struct generated from bpf/gc.h.
unsafe impl plain::Plain for gc_event {}
