//! The `memory` BPF session (bpf/memory.bpf.c): uprobes at obmalloc's
//! pool openings and big allocations (src/python/probes/alloc_sites.rs),
//! byte-sampled in the kernel, each kept event's Python stack walked by
//! sample's walker and its bytes summed per stack there. Here the stacks
//! are named with the sampler's own code (sample/stacks.rs), and at the
//! end of the traced window, while the target still runs, the kept pools'
//! and chunks' headers are read (python/reading/pools.rs): the live view.

use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use super::sample::discovery::{Processes, PythonRef, TargetMaps};
use super::sample::stacks::Stacks;
use super::{attach_error, ensure_still_running, read_counters, Links, Tracing};
use crate::bpf::memory::types::{kept_block, memory_alignment, memory_counter, memory_growth, memory_key, memory_objects, memory_place, memory_source, sample_counter};
use crate::bpf::memory::{MemorySkel, MemorySkelBuilder};
use crate::model::counters::Kind::{Informational, Lost};
use crate::model::memory::{AllocatedStack, Estimate, MemoryData, MemoryStack, Source};
use crate::python::probes::alloc_sites::{self, AllocSites, POOL_SZIDX_OFFSET};
use crate::python::probes::allocation_sites::Site;
use crate::python::reading::pools::{self, Kept};
use crate::python::Python;

/// obmalloc's block size per size class step (bpf/memory.h).
const BLOCK_ALIGNMENT: f64 = crate::python::layouts::heap::ALIGNMENT as f64;
// The BPF side's copy (memory.h) is the same obmalloc ALIGNMENT.
const _: () = assert!(memory_alignment::BLOCK_ALIGNMENT.0 as u64 == crate::python::layouts::heap::ALIGNMENT);

const CHECK_EVERY: Duration = Duration::from_millis(250);

/// How long `locate_soon` waits for the interpreter to be mapped.
const LOCATE_AT_MOST: Duration = Duration::from_secs(2);

/// T, the mean bytes between kept events, unless --every says otherwise:
/// the design's 512 KiB keeps one pool opening in 32.
pub const DEFAULT_EVERY: u64 = 512 << 10;

#[derive(Clone, Copy)]
pub struct Options {
    /// T: an event of b bytes is kept with probability 1 - e^(-b/T).
    pub every: u64,
    /// How often the live view is read while the target runs: the last
    /// read stands for the end when the target exits by itself (its
    /// memory is gone by the end).
    pub interval: Duration,
    /// --allocations: also every allocation's bytes per stack (allocations.rs).
    pub allocations: bool,
}

pub struct Session<'obj, 'a> {
    skel: MemorySkel<'obj>,
    links: Links,
    pid: u32,
    opts: Options,
    pool_size: u64,
    processes: RefCell<Processes<'a>>,
    stacks: RefCell<Stacks>,
    /// The live view, read at each `interval` and at the end of the
    /// traced window if the target still runs then.
    live: RefCell<Option<LiveView>>,
    last_read: std::cell::Cell<std::time::Instant>,
}

pub struct Plan<'a> {
    pub pid: u32,
    pub python: &'a Python,
    pub opts: Options,
    /// The probe sites, found once before the run (a stripped build's
    /// search reads and decodes its whole .text).
    pub sites: &'a AllocSites,
    /// With --allocations, the allocator entry points.
    pub allocation_sites: Option<&'a [Site]>,
}

impl<'a> super::Start for Plan<'a> {
    type Data = MemoryData;
    type Objects = super::Object;
    type Session<'obj> = Session<'obj, 'a>;

    fn start<'obj>(self, object: &'obj mut MaybeUninit<OpenObject>) -> Result<Session<'obj, 'a>> {
        Session::start(object, &self)
    }
}

/// Per kept block's stack and source: live bytes estimated.
struct LiveView {
    by_stack: HashMap<(u64, u32), Estimate>,
    read: u64,
    gone: u64,
}

impl<'obj, 'a> Session<'obj, 'a> {
    pub fn start(object: &'obj mut MaybeUninit<OpenObject>, plan: &Plan<'a>) -> Result<Self> {
        let Plan { pid, python, opts, sites, allocation_sites } = *plan;
        let pool_size = alloc_sites::pool_size(python);
        let mut open = MemorySkelBuilder::default().open(object).context("failed to open the memory BPF program")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the memory BPF program has no rodata")?;
        rodata.memory_cfg.every = opts.every.max(1);
        rodata.memory_cfg.pool_size = pool_size;
        rodata.memory_cfg.pool_szidx = POOL_SZIDX_OFFSET;
        // --allocations' programs, verified only when used: by symbol the
        // wrappers', on a stripped build the copies' (which need cookies),
        // which count big allocations from the raw sites' events.
        let (wrappers, copies) = super::allocations::programs_needed(allocation_sites.unwrap_or(&[]));
        rodata.memory_cfg.big_allocated = copies as u32;
        // e^(-2^(k - 20)) in units of 2^-32, for each bit k of b/T.
        let data = open.maps.bss_data.as_deref_mut().context("the memory BPF program has no bss")?;
        for (k, slot) in data.exp_bits.iter_mut().enumerate() {
            let x = 2f64.powi(k as i32 - crate::bpf::memory::types::memory_exp::EXP_FRACTION_BITS.0 as i32);
            *slot = ((-x).exp() * 4294967296.0).min(4294967295.0) as u64;
        }
        // The walker this kernel verifies fastest (see uses_bpf_loop), and
        // how the probes attach (uses_uprobe_multi): chosen before the load,
        // which fixes each program's attach type (a tail call's target must
        // have its caller's).
        let loops = uses_bpf_loop();
        let multi = uses_uprobe_multi();
        open.progs.walk_kept.set_autoload(!loops);
        open.progs.walk_kept_loops.set_autoload(loops);
        for prog in [&mut open.progs.allocation_malloc, &mut open.progs.allocation_calloc, &mut open.progs.allocation_realloc] {
            prog.set_autoload(wrappers);
        }
        open.progs.allocation_copy.set_autoload(copies);
        if multi {
            for mut prog in open.open_object_mut().progs_mut() {
                prog.set_attach_type(libbpf_rs::ProgramAttachType::TraceUprobeMulti);
            }
        }
        let skel = crate::bpf::load::load("memory", open)?;
        let walker = if loops { &skel.progs.walk_kept_loops } else { &skel.progs.walk_kept };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(walker)) as u32;
        skel.maps.walkers.update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY).context("failed to hand the memory walker to its probes")?;
        let attaching = std::time::Instant::now();
        let mut links = attach(&skel, python, pid, sites, multi)?;
        if let Some(sites) = allocation_sites {
            links.extend(super::allocations::attach(&skel, python, pid, sites, multi)?);
        }
        crate::bpf::load::say_attach_stats("memory", links.len(), attaching.elapsed());
        let session = Session {
            skel,
            links: Links::new(links),
            pid,
            opts,
            pool_size,
            processes: RefCell::new(Processes::new(false)),
            stacks: RefCell::new(Stacks::new(false, false, false)),
            live: RefCell::new(None),
            last_read: std::cell::Cell::new(std::time::Instant::now()),
        };
        session.processes.borrow_mut().add(&session.target_maps(), pid, PythonRef::Borrowed(python))?;
        ensure_still_running(pid)?;
        Ok(session)
    }

    /// The map BPF finds the target in (memory's programs look it up by
    /// PID, once per event they keep).
    fn target_maps(&self) -> TargetMaps<'_> {
        TargetMaps { by_pid: &self.skel.maps.processes, only: None }
    }

    /// Tells BPF where the target's interpreter is as soon as it is
    /// mapped, waiting for it at most LOCATE_AT_MOST: a command started by
    /// pytrace (`--`) may allocate most of what it keeps in its first
    /// fraction of a second, and an event met before is counted without
    /// its stack (no_thread_state).
    pub fn locate_soon(&self) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            self.processes.borrow_mut().locate(&self.target_maps())?;
            if self.processes.borrow().all_located() || started.elapsed() > LOCATE_AT_MOST {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Reads the live view now, unless the target has exited (whose
    /// blocks all read as gone): the last read then stands.
    fn read_live_if_running(&self) {
        self.last_read.set(std::time::Instant::now());
        if !crate::process::proc::is_running(self.pid) {
            return;
        }
        let view = self.read_live();
        // A read racing the exit finds every block gone: keep the last.
        if view.read > 0 && view.gone == view.read && self.live.borrow().is_some() {
            return;
        }
        *self.live.borrow_mut() = Some(view);
    }

    /// Reads every kept block's header now: bytes live per stack and source.
    fn read_live(&self) -> LiveView {
        let map = &self.skel.maps.kept_blocks;
        let mut places = Vec::new();
        let mut kept = Vec::new();
        for key in map.keys() {
            let Ok(Some(value)) = map.lookup(&key, MapFlags::ANY) else { continue };
            let (Some(place), Some(block)) = (plain::<memory_place>(&key), plain::<kept_block>(&value)) else { continue };
            if place.pid != self.pid {
                continue;
            }
            kept.push(if block.source == memory_source::SOURCE_POOL.0 {
                Kept::Pool { address: place.address, szidx: block.szidx, pool_size: self.pool_size }
            } else {
                Kept::Chunk { address: place.address, size: block.bytes }
            });
            places.push(block);
        }
        let live = pools::live_bytes(self.pid, &kept);
        let mut view = LiveView { by_stack: HashMap::new(), read: kept.len() as u64, gone: 0 };
        for (block, bytes) in places.iter().zip(live) {
            let Some(bytes) = bytes else {
                view.gone += 1;
                continue;
            };
            let p = if block.p == 0 { 1.0 } else { block.p as f64 / 4294967296.0 };
            let x = bytes as f64;
            // A chunk is one object; a pool's are its blocks in use.
            let objects = if block.source == memory_source::SOURCE_POOL.0 { x / ((block.szidx as f64 + 1.0) * BLOCK_ALIGNMENT) } else { 1.0 };
            let e = view.by_stack.entry((block.hash, block.source)).or_default();
            e.add(&Estimate { bytes: x / p, variance: (1.0 - p) * x * x / (p * p), kept: 1, objects: objects / p });
        }
        view
    }

    fn growth(&self) -> Vec<(memory_key, memory_growth)> {
        let map = &self.skel.maps.growth;
        map.keys()
            .filter_map(|key| {
                let value = map.lookup(&key, MapFlags::ANY).ok()??;
                Some((plain::<memory_key>(&key)?, plain::<memory_growth>(&value)?))
            })
            .collect()
    }

    pub fn finish(self) -> Result<MemoryData> {
        self.links.clear();
        let live = self.live.borrow_mut().take().unwrap_or_else(|| self.read_live());
        self.rows(&live)
    }

    /// The rows so far, while the probes still count (`pytrace top
    /// --memory`, once a second): the live view read now, unless the target
    /// has exited (the last read then stands), beside the growth so far.
    pub fn so_far(&self) -> Result<MemoryData> {
        self.read_live_if_running();
        match &*self.live.borrow() {
            Some(live) => self.rows(live),
            None => self.rows(&self.read_live()),
        }
    }

    /// Every stack's growth and live bytes, named, with the counters now.
    fn rows(&self, live: &LiveView) -> Result<MemoryData> {
        let growth = self.growth();
        let mut stacks = self.stacks.borrow_mut();
        let mut processes = self.processes.borrow_mut();
        let mut rows: HashMap<(u64, u32), MemoryStack> = HashMap::new();
        let mut unnamed = 0;
        let source_of = |s: u32| if s == memory_source::SOURCE_POOL.0 { Source::Pool } else { Source::Big };
        let mut allocated = Vec::new();
        for (key, g) in growth {
            let Some(frames) = stacks.frames_of(key.pid, key.hash, &mut processes) else {
                unnamed += g.kept;
                continue;
            };
            let objects = g.objects as f64 / (1u64 << memory_objects::OBJECTS_FRACTION_BITS.0) as f64;
            let grown = Estimate { bytes: g.estimate as f64, variance: g.variance as f64, kept: g.kept, objects };
            if key.source == memory_source::SOURCE_ALLOCATED.0 {
                allocated.push(AllocatedStack { frames, allocated: grown });
                continue;
            }
            let live = live.by_stack.get(&(key.hash, key.source)).copied().unwrap_or_default();
            rows.insert((key.hash, key.source), MemoryStack { frames, source: source_of(key.source), grown, live });
        }
        let names = [
            ("lost", Lost, "kept events lost (ring buffer full: their stack could not be sent)", sample_counter::SAMPLE_LOST.0),
            ("bad_frame", Informational, "frames that could not be read (stacks end there)", sample_counter::SAMPLE_BAD_FRAME.0),
            ("no_thread_state", Informational, "events of threads without a Python thread state", sample_counter::SAMPLE_NO_THREAD.0),
            ("events", Informational, "pool openings and allocations over 512 bytes seen", memory_counter::MEMORY_EVENTS.0),
            ("not_kept", Informational, "of those, not kept by the byte sampler (their bytes are in the estimates)", memory_counter::MEMORY_NOT_KEPT.0),
            ("growth_map_full", Lost, "kept events lost (the kernel's map of stacks was full)", memory_counter::MEMORY_GROWTH_FULL.0),
            ("kept_map_full", Lost, "kept blocks not followed for the live view (the kernel's map was full)", memory_counter::MEMORY_KEPT_FULL.0),
            ("bad_chunks", Lost, "raw allocations whose header was not a glibc chunk's (another malloc preloaded, or a debug hook)", memory_counter::MEMORY_BAD_CHUNK.0),
            ("bad_pool", Lost, "pool openings whose header could not be read", memory_counter::MEMORY_BAD_POOL.0),
            ("allocation_events", Informational, "allocations seen (--allocations)", memory_counter::MEMORY_ALLOC_EVENTS.0),
            ("allocation_not_kept", Informational, "of those, not kept by the byte sampler (their bytes are in the estimates)", memory_counter::MEMORY_ALLOC_NOT_KEPT.0),
            ("not_walked", Lost, "kept events lost (the probe's tail call to the stack walker failed)", memory_counter::MEMORY_NOT_WALKED.0),
        ];
        let mut counters = read_counters(&self.skel.maps.counters, &names)?;
        counters.push("unnamed_stacks", Lost, "kept events whose stack's frames never reached pytrace", unnamed);
        let allocations = self.opts.allocations.then_some(allocated);
        Ok(MemoryData { stacks: rows.into_values().collect(), every: self.opts.every, blocks_read: live.read, blocks_gone: live.gone, counters, allocations })
    }
}

/// Attaches every probe site of `sites` to its program: one uprobe_multi
/// link per program with `multi`, else a perf-event uprobe per site.
fn attach<'obj>(skel: &MemorySkel<'obj>, python: &Python, pid: u32, sites: &alloc_sites::AllocSites, multi: bool) -> Result<Vec<Link>> {
    let p = &skel.progs;
    // malloc's and calloc's returns run one program: one link.
    let raw_returned: Vec<u64> = sites.raw_returned.iter().chain(&sites.calloc_returned).copied().collect();
    let probes = [
        (&p.raw_returned, &raw_returned, "the return of obmalloc's calls of the raw malloc and calloc"),
        (&p.pool_opened, &sites.pool_opened, "the return of allocate_from_new_pool"),
    ];
    let mut links = Vec::new();
    for (prog, at, what) in probes {
        links.extend(attach_sites(prog, python, pid, at, multi, what)?);
    }
    Ok(links)
}

/// Attaches `prog` at the interpreter's link-time addresses `at` in
/// process `pid`: one uprobe_multi link with `multi` (the attach type
/// every memory program was then loaded with), else a perf-event uprobe
/// per site. `what` names the sites in the sentence of a failure.
pub(super) fn attach_sites(prog: &libbpf_rs::ProgramMut<'_>, python: &Python, pid: u32, at: &[u64], multi: bool, what: &str) -> Result<Vec<Link>> {
    let path = &python.elf.path;
    let failed = |e: libbpf_rs::Error| attach_error(pid, e).context(format!("failed to attach to {what} in {}", python.target_path));
    let offsets = at.iter().map(|&at| Ok(python.elf.file_offset(at)? as usize)).collect::<Result<Vec<usize>>>()?;
    if multi && !offsets.is_empty() {
        let opts = libbpf_rs::UprobeMultiOpts { offsets, ..Default::default() };
        return Ok(vec![prog.attach_uprobe_multi_with_opts(pid as i32, path, "", opts).map_err(failed)?]);
    }
    offsets.into_iter().map(|offset| prog.attach_uprobe(false, pid as i32, path, offset).map_err(failed)).collect()
}

/// A skeleton type from a map's bytes (they are that C struct's).
fn plain<T: Copy + Default>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != std::mem::size_of::<T>() {
        return None;
    }
    let mut value = T::default();
    // SAFETY: T is a plain C struct of the skeleton (integers only) and
    // `bytes` is exactly its size.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut value as *mut T).cast::<u8>(), bytes.len()) };
    Some(value)
}

impl Tracing for Session<'_, '_> {
    type Data = MemoryData;

    fn what(&self) -> String {
        "memory".into()
    }

    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        builder.add(&self.skel.maps.records, |bytes: &[u8]| {
            self.stacks.borrow_mut().receive(bytes, &mut self.processes.borrow_mut());
            0
        })?;
        Ok(())
    }

    fn check_every(&self) -> Duration {
        CHECK_EVERY
    }

    fn between_polls(&self) -> Result<()> {
        self.processes.borrow_mut().locate(&self.target_maps())?;
        if self.last_read.get().elapsed() >= self.opts.interval {
            self.read_live_if_running();
        }
        Ok(())
    }

    fn after_poll(&self) {
        self.stacks.borrow_mut().name_new(&mut self.processes.borrow_mut());
    }

    fn links(&self) -> Option<&Links> {
        Some(&self.links)
    }

    /// The live view, read while the target still runs and the probes
    /// still count (a block opened again since it was kept is seen); if
    /// it exited, the last read before stands.
    fn before_detach(&self) {
        self.read_live_if_running();
    }

    fn finish(self) -> Result<MemoryData> {
        Session::finish(self)
    }
}

/// Whether the walker uses bpf_loop (5.17+), as sample's perf-event
/// sampler does: the same program as the bounded-loop one, which the
/// verifier checks pass by pass (409,000 instructions, 0.6 s of CPU at
/// every start on 6.18; 700,000 and 12-24 s in the 5.10 VM) where it
/// checks bpf_loop's bodies once.
fn uses_bpf_loop() -> bool {
    crate::kernel::Kernel::get().has(crate::kernel::Feature::BpfLoop)
}

/// Whether the probes attach as one uprobe_multi link per program (6.10+,
/// where such a link given a PID fires for every thread of the process):
/// a stripped build's 500-odd sites otherwise take a perf event each, and
/// closing each waits for the tracing event mutex and, from 6.12, a grace
/// period of its own, serialised with every other perf-event uprobe opened
/// or closed on the host (measured on 6.18: 8-15 s to attach while earlier
/// runs' closes were under way, 2 minutes and more for those closes).
fn uses_uprobe_multi() -> bool {
    let kernel = crate::kernel::Kernel::get();
    kernel.has(crate::kernel::Feature::UprobeMulti) && kernel.has(crate::kernel::Feature::UprobeMultiByProcess)
}
