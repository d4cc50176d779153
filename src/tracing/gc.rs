//! The `gc` BPF session (bpf/gc.bpf.c): one event per garbage collection,
//! from CPython's USDT probes or, without them, a hardware watchpoint on the
//! collector's `collecting` flag (src/tracing/watchpoint.rs).

use std::cell::RefCell;
use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{Link, OpenObject, RingBufferBuilder};

use super::{attach_error, ensure_still_running, read_counters, watchpoint, CounterRow, Links, Tracing};
use crate::model::counters::Counters;
use crate::model::events::Collection;
use crate::model::counters::Kind::{Informational, Lost, Refused};
use crate::bpf::gc::types::{bss, gc_counter, gc_event, gc_watch_target};
use crate::bpf::gc::{GcSkel, GcSkelBuilder};
use crate::python::{Python, EVAL_FRAME_SYMBOL, RUNTIME_SYMBOL};
use crate::process::proc::Memory;

/// How `gc` sees collections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// CPython's gc__start/gc__done USDT probes.
    Usdt,
    /// A hardware watchpoint on the main interpreter's gc.collecting, and
    /// the generations' running totals read at each start and end.
    Watchpoint,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Usdt => "usdt",
            Mode::Watchpoint => "watchpoint",
        }
    }
}

/// The mode `gc` uses for this interpreter (`requested` by --mode, else the
/// probes where they exist), and why.
pub fn choose_mode(python: &Python, requested: Option<Mode>) -> Result<(Mode, &'static str)> {
    let elf = &python.elf;
    let probes = elf.has_usdt("python", "gc__start") && elf.has_usdt("python", "gc__done");
    match requested {
        Some(Mode::Usdt) if !probes => bail!(
            "--mode usdt needs the gc__start and gc__done USDT probes, which {} does not have (built without --with-dtrace); use --mode watchpoint",
            python.target_path
        ),
        Some(Mode::Usdt) | None if probes => Ok((Mode::Usdt, "the gc__start and gc__done probes")),
        Some(Mode::Watchpoint) => Ok((Mode::Watchpoint, "asked for with --mode watchpoint: a hardware watchpoint on the main interpreter's gc.collecting")),
        _ => Ok((Mode::Watchpoint, "no gc probes: a hardware watchpoint on the main interpreter's gc.collecting")),
    }
}

/// Counters from bpf/gc.h's enum gc_counter: name, kind, meaning (Lost are
/// collections not reported).
const COUNTERS: [CounterRow; 5] = [
    ("event_lost", Lost, "collections lost (ring buffer full)", gc_counter::GC_EVENT_LOST.0),
    ("unmatched_done", Refused, "collection ends without their start (begun before tracing)", gc_counter::GC_UNMATCHED_DONE.0),
    ("stats_unreadable", Lost, "collections whose totals could not be read", gc_counter::GC_STATS_UNREADABLE.0),
    ("empty_brackets", Informational, "times `collecting` was set and cleared with no collection", gc_counter::GC_EMPTY_BRACKET.0),
    ("merged_collections", Informational, "collections inside another's pause", gc_counter::GC_MERGED.0),
];

/// What the session read from the program (collections go to
/// `on_collection` as they come).
pub struct GcData {
    pub counters: Counters,
}

/// The gc program loaded and attached to one target, in steps that the
/// session driver (src/session/driver.rs) runs. Each collection goes to
/// `on_collection` as it arrives.
pub struct Session<'obj, 'a> {
    skel: GcSkel<'obj>,
    /// The program's .bss, where the watchpoint's target goes: out of the
    /// skeleton, so that it can be set while the ring buffer is read.
    bss: RefCell<Option<&'obj mut bss>>,
    links: Links,
    /// Watchpoint mode on a command pytrace started: the probe that stops
    /// it at its first frame evaluation, until `released`.
    first_eval: RefCell<Option<Link>>,
    pid: u32,
    python: &'a Python,
    cas: bool,
    on_collection: &'a dyn Fn(Collection),
}

/// A gc session to start (`Start`): the arguments of `Session::start`.
pub struct Plan<'a> {
    pub pid: u32,
    pub python: &'a Python,
    pub mode: Mode,
    pub started_by_us: bool,
    pub on_collection: &'a dyn Fn(Collection),
}

impl<'a> super::Start for Plan<'a> {
    type Data = GcData;
    type Objects = super::Object;
    type Session<'obj> = Session<'obj, 'a>;

    fn start<'obj>(self, object: &'obj mut MaybeUninit<OpenObject>) -> Result<Session<'obj, 'a>> {
        Session::start(object, self.pid, self.python, self.mode, self.started_by_us, self.on_collection)
    }
}

impl<'obj, 'a> Session<'obj, 'a> {
    /// Loads the program into `object` and attaches it. In watchpoint mode
    /// on a command pytrace started (`started_by_us`) the interpreter does
    /// not exist yet: the watchpoint is set at its first frame evaluation
    /// (`waits_for_first_eval`, `watch_at_first_eval`).
    pub fn start(
        object: &'obj mut MaybeUninit<OpenObject>,
        pid: u32,
        python: &'a Python,
        mode: Mode,
        started_by_us: bool,
        on_collection: &'a dyn Fn(Collection),
    ) -> Result<Self> {
        let mut open = GcSkelBuilder::default().open(object).context("failed to open the gc BPF program")?;
        let watch = mode == Mode::Watchpoint;
        open.progs.usdt_gc_start.set_autoload(mode == Mode::Usdt);
        open.progs.usdt_gc_done.set_autoload(mode == Mode::Usdt);
        // Kernels before 5.12 have no compare-and-swap: a twin without it.
        let cas = crate::kernel::Kernel::get().has(crate::kernel::Feature::AtomicCompareExchange);
        open.progs.collecting_written.set_autoload(watch && cas);
        open.progs.collecting_written_no_cas.set_autoload(watch && !cas);
        open.progs.first_eval.set_autoload(watch && started_by_us);
        let mut skel = crate::bpf::load::load("gc", open)?;
        let bss = skel.maps.bss_data.take();
        let session = Session {
            skel,
            bss: RefCell::new(bss),
            links: Links::default(),
            first_eval: RefCell::new(None),
            pid,
            python,
            cas,
            on_collection,
        };

        let path = &python.elf.path;
        let what = || format!("failed to attach to the garbage collector of {}", python.target_path);
        let progs = &session.skel.progs;
        match mode {
            Mode::Usdt => {
                session.links.extend([
                    progs.usdt_gc_start.attach_usdt(pid as i32, path, "python", "gc__start").map_err(|e| attach_error(pid, e)).with_context(what)?,
                    progs.usdt_gc_done.attach_usdt(pid as i32, path, "python", "gc__done").map_err(|e| attach_error(pid, e)).with_context(what)?,
                ]);
            }
            Mode::Watchpoint if started_by_us => {
                let offset = python.elf.file_offset(python.symbol(EVAL_FRAME_SYMBOL)?)? as usize;
                let probe = progs.first_eval.attach_uprobe(false, pid as i32, path, offset).map_err(|e| attach_error(pid, e)).with_context(what)?;
                *session.first_eval.borrow_mut() = Some(probe);
            }
            Mode::Watchpoint => session.watch()?,
        }
        ensure_still_running(pid)?;
        Ok(session)
    }

    /// Whether the target must be let go only until its first frame
    /// evaluation, where it stops, and `watch_at_first_eval` run there.
    pub fn waits_for_first_eval(&self) -> bool {
        self.first_eval.borrow().is_some()
    }

    /// At the target's first frame evaluation: sets the watchpoint, which
    /// needs the interpreter to exist.
    pub fn watch_at_first_eval(&self) -> Result<()> {
        self.watch()
    }

    /// Once the target runs: the first-evaluation probe goes.
    pub fn released(&self) {
        drop(self.first_eval.borrow_mut().take());
    }

    /// Points the program at the collector and sets the watchpoint on its
    /// `collecting` flag.
    fn watch(&self) -> Result<()> {
        let target = watch_target(self.pid, self.python)?;
        self.bss.borrow_mut().as_mut().context("the gc BPF program has no .bss")?.target = target;
        let prog = if self.cas { &self.skel.progs.collecting_written } else { &self.skel.progs.collecting_written_no_cas };
        self.links.extend(watchpoint::watch_writes(prog, self.pid, target.collecting, 4)?);
        Ok(())
    }
}

impl Tracing for Session<'_, '_> {
    type Data = GcData;

    fn what(&self) -> String {
        "gc".into()
    }

    /// The ring buffer of collections.
    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        builder.add(&self.skel.maps.events, |bytes: &[u8]| {
            let mut ev = gc_event::default();
            if plain::copy_from_bytes(&mut ev, bytes).is_ok() {
                (self.on_collection)(Collection {
                    start_ns: ev.start_ns,
                    duration_ns: ev.duration_ns,
                    collected: ev.collected,
                    generation: ev.generation,
                });
            }
            0
        })?;
        Ok(())
    }

    fn links(&self) -> Option<&Links> {
        Some(&self.links)
    }

    /// The first-evaluation probe too, if the target was never released.
    fn before_detach(&self) {
        self.released();
    }

    fn finish(self) -> Result<GcData> {
        Ok(GcData { counters: read_counters(&self.skel.maps.counters, &COUNTERS)? })
    }
}

/// Where the watchpoint program finds the main interpreter's collector:
/// its `collecting` flag and its generations' totals, from the layout and
/// the interpreter's address, read now. Fails, saying so, if the
/// interpreter does not exist yet or its state is not a collector's.
fn watch_target(pid: u32, python: &Python) -> Result<gc_watch_target> {
    let l = &python.layout;
    let bias = python.load_bias_in(pid)?;
    let mem = Memory::open(pid)?;
    let runtime = python.symbol(RUNTIME_SYMBOL)?.wrapping_add(bias);
    let interp = mem.read_u64(runtime + l.runtime_interpreters_main as u64).context("failed to read the main interpreter's address")?;
    if interp == 0 {
        bail!("process {pid} has no main interpreter yet (_PyRuntime.interpreters.main is NULL)");
    }
    let gc = interp + l.interp_gc as u64;
    let collecting = gc + l.gc_collecting as u64;
    let mut flag = [0u8; 4];
    mem.read(collecting, &mut flag).context("failed to read the collector's state")?;
    if u32::from_ne_bytes(flag) > 1 {
        bail!("the main interpreter of process {pid} does not hold a collector's state where its layout says (gc.collecting = {:#x})", u32::from_ne_bytes(flag));
    }
    Ok(gc_watch_target {
        collecting,
        stats: gc + l.gc_stats as u64,
        tgid: pid,
        stats_indirect: l.gc_stats_indirect as u32,
        generation_items: l.gc_generation_items,
        generation_ring: l.gc_generation_ring,
        generation_index: l.gc_generation_index,
        item_size: l.gc_item_size,
        item_collections: l.gc_item_collections,
        item_collected: l.gc_item_collected,
        item_uncollectable: l.gc_item_uncollectable,
        ..Default::default()
    })
}

// SAFETY: a plain integer struct generated from bpf/gc.h.
unsafe impl plain::Plain for gc_event {}
