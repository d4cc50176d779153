//! The `sample` BPF session (bpf/sample.bpf.c): a CPU-clock perf event on
//! every CPU, fired at randomised instants (clock.rs); the program counts
//! samples per stack in the kernel and sends each stack's frames once; here
//! they are named (resolve.rs, kernel_symbols.rs), the counts read every
//! DRAIN_EVERY (counts.rs) and added up (stacks.rs), for one target or,
//! with --all, for every CPython found (discovery.rs).

mod async_tasks;
mod clock;
mod counts;
pub(crate) mod discovery;
mod idle_pacer;
mod kernel_symbols;
mod resolve;
pub(crate) mod stacks;
mod thread_states;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::os::fd::IntoRawFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{Link, MapCore, OpenObject, RingBufferBuilder};

use super::{ensure_still_running, privilege_hint, read_counters, Tracing};
use crate::model::counters::Counters;
use crate::model::counters::Kind::{Informational, Lost};
use crate::bpf::sample::types::{sample_counter, stack_key};
use crate::bpf::sample::{SampleSkel, SampleSkelBuilder};
use crate::python::Python;
use crate::model::samples::{Frame, Sample};
use counts::CountsReader;
use discovery::{Processes, PythonRef, TargetMaps};
use stacks::Stacks;

/// How often the counts are read from BPF, and the code objects of the
/// stacks counted checked again. A read costs a few system calls, a wait
/// for running programs and a pass over the stacks counted: at 1000 Hz on
/// a deep workload, 4 reads a second cost about 7 ms of CPU a second, as
/// much as everything else. The counts map is sized to hold a read's worth
/// even if every sample is a new stack, so reading less often loses
/// nothing; `top` reads the counts itself when it redraws.
const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// --idle reads its one counts map (no swap, no wait) more often: every
/// thread is a sample at every tick, so a second of 999 Hz over many
/// threads with distinct stacks would not fit.
const IDLE_DRAIN_EVERY: Duration = Duration::from_millis(250);

/// How often the session driver looks at the target, the duration and
/// Ctrl-C (a signal cuts the wait short).
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The ring buffer with --native, where each record carries 64 KiB of
/// stack: about 500 records, half a second at 999 Hz on 2 CPUs even if user
/// space stalls (the unwind tables are read before the first tick, so the
/// first records do not wait for them).
const NATIVE_RING_BYTES: u32 = 32 << 20;

#[derive(Clone, Copy)]
pub struct Options {
    pub hz: u64,
    pub kernel: bool,
    /// Sample every thread at each tick, running or not (wall-clock view),
    /// instead of the threads a CPU is running.
    pub idle: bool,
    /// Also unwind each thread's native stack and merge it with the Python
    /// frames.
    pub native: bool,
    /// Keep samples apart per thread.
    pub threads: bool,
    /// Count only the samples of threads holding the GIL.
    pub gil: bool,
    /// --idle: put each sample under its thread's state (running, waiting
    /// for the GIL, released in a system call).
    pub states: bool,
    /// Put each sample of a thread running an asyncio task under the task
    /// and the tasks awaiting it (3.14+).
    pub async_tasks: bool,
}

pub struct SampleData {
    /// One per stack and thread (thread 0 without --threads).
    pub samples: Vec<Sample>,
    pub counters: Counters,
    /// The BPF program's total run time over the samples received, in ns,
    /// when kernel.bpf_stats_enabled is on.
    pub bpf_ns_per_sample: Option<u64>,
    /// `snapshot` only: each thread's PyThreadState as the walk found and
    /// checked it, by TID (where `dump --async` finds each thread's tasks).
    pub thread_states: Vec<(u32, u64)>,
}

/// What to sample: one process, or every CPython on the machine.
pub enum Targets<'a> {
    One(u32, &'a Python),
    All,
}

/// The sampler loaded and attached, in steps that the session driver
/// (src/session/driver.rs) runs, alone or beside the calls program.
pub struct Session<'obj, 'a> {
    skel: SampleSkel<'obj>,
    links: RefCell<Vec<Link>>,
    clock: RefCell<Option<clock::Rearming>>,
    opts: Options,
    processes: RefCell<Processes<'a>>,
    stacks: RefCell<Stacks>,
    reader: RefCell<CountsReader>,
    drained: RefCell<Vec<(stack_key, u64)>>,
    last_drain: Cell<Instant>,
    /// --idle: one pass of the iterator over every thread is one round of
    /// samples, at jittered ticks (clock.rs), taken by the pacer's thread
    /// (idle_pacer.rs) from the first poll to the detach; here before and
    /// after.
    ticks: RefCell<Option<clock::IdleTicks>>,
    pacer: RefCell<Option<idle_pacer::IdlePacer>>,
    /// Whether the pacer ran at real-time priority (None: it never ran).
    pacer_realtime: Cell<Option<bool>>,
    /// The pass that failed and ended the pacer's passes.
    pacer_failed: RefCell<Option<String>>,
    /// Held by the pacer during a pass and here while counts are taken.
    counts_lock: Arc<Mutex<()>>,
}

/// A sampler to start (`Start`): on `targets`, as `opts` say.
pub struct Plan<'a> {
    pub targets: Targets<'a>,
    pub opts: &'a Options,
}

impl<'a> super::Start for Plan<'a> {
    type Data = SampleData;
    type Objects = super::Object;
    type Session<'obj> = Session<'obj, 'a>;

    fn start<'obj>(self, object: &'obj mut MaybeUninit<OpenObject>) -> Result<Session<'obj, 'a>> {
        Session::start(object, self.targets, self.opts)
    }
}

impl<'obj, 'a> Session<'obj, 'a> {
    /// Loads the program into `object` and attaches it: from here on the
    /// targets are sampled (once their interpreter is located, see
    /// `between_polls`).
    pub fn start(object: &'obj mut MaybeUninit<OpenObject>, targets: Targets<'a>, opts: &Options) -> Result<Self> {
        Self::start_reading(object, targets, opts, false)
    }

    /// `start`, with `once` (a snapshot): each thread's stack is read in
    /// the first pass that reads it whole, and left alone by later passes.
    fn start_reading(object: &'obj mut MaybeUninit<OpenObject>, targets: Targets<'a>, opts: &Options, once: bool) -> Result<Self> {
        if let (true, Targets::One(_, python)) = (opts.gil, &targets) {
            if python.layout.free_threaded {
                anyhow::bail!(
                    "Python {} is a free-threaded build: it has no GIL, so `sample --gil` would keep no sample; sample without --gil",
                    python.version
                );
            }
        }
        if let (true, Targets::One(_, python)) = (opts.async_tasks, &targets) {
            if let Some(refusal) = crate::python::reading::asyncio_tasks::unsupported(python, "sample --async") {
                anyhow::bail!(refusal);
            }
        }
        let mut open = SampleSkelBuilder::default().open(object).context("failed to open the sample BPF program")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the sample BPF program has no rodata")?;
        rodata.cfg.kernel_stacks = opts.kernel as u8;
        rodata.cfg.native = opts.native as u8;
        rodata.cfg.per_thread = opts.threads as u8;
        rodata.cfg.gil_only = opts.gil as u8;
        rodata.cfg.thread_states = (opts.idle && opts.states) as u8;
        rodata.cfg.async_tasks = opts.async_tasks as u8;
        rodata.cfg.once = once as u8;
        rodata.cfg.task_pt_regs = crate::kernel::Kernel::get().has(crate::kernel::Feature::TaskPtRegs) as u8;
        if let Targets::One(pid, _) = targets {
            rodata.only_pid = pid;
        }
        if opts.native {
            open.maps.records.set_max_entries(NATIVE_RING_BYTES).context("failed to size the sample ring buffer")?;
            // --idle unwinds nothing in the kernel (its iterator copies the
            // stacks whole).
            if !opts.idle {
                open.maps.unwind_rows.set_max_entries(crate::native::kernel_tables::UNWIND_ROWS).context("failed to size the unwind rows map")?;
                open.maps.native_mappings.set_max_entries(crate::native::kernel_tables::NATIVE_PROCESSES).context("failed to size the native mappings map")?;
            }
        }
        // Reading a hash map visits every bucket: size the counts maps to
        // what one drain can gather (every sample a distinct stack, twice
        // over), not more.
        let per_drain = if opts.idle { 1 << 14 } else { (opts.hz as f64 * clock::online_cpus()?.len() as f64 * DRAIN_EVERY.as_secs_f64() * 2.0) as u32 };
        let counted = per_drain.clamp(1 << 12, 1 << 16).next_power_of_two();
        open.maps.counts_a.set_max_entries(counted).context("failed to size the sample counts")?;
        open.maps.counts_b.set_max_entries(counted).context("failed to size the sample counts")?;
        // --idle reads every thread through a sleepable task iterator; without
        // it, the perf-event program samples threads on CPU.
        open.progs.sample_all_threads.set_autoload(opts.idle);
        let loops = uses_bpf_loop();
        open.progs.sample_thread.set_autoload(!opts.idle && !loops);
        open.progs.sample_thread_loops.set_autoload(!opts.idle && loops);
        // Before bpf_loop, the sampler tail-calls --native's unwinding.
        let native_tail = opts.native && !opts.idle && !loops;
        open.progs.sample_native_tail.set_autoload(native_tail);
        let skel = crate::bpf::load::load("sample", open)?;
        if native_tail {
            use std::os::fd::{AsFd, AsRawFd};
            let fd = skel.progs.sample_native_tail.as_fd().as_raw_fd();
            skel.maps.native_tail.update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), libbpf_rs::MapFlags::ANY).context("failed to set the native unwinding's tail call")?;
        }
        let all = matches!(targets, Targets::All);
        if all {
            keep_large_buffers_apart();
        }
        let session = Session {
            skel,
            links: RefCell::new(Vec::new()),
            clock: RefCell::new(None),
            opts: *opts,
            processes: RefCell::new(Processes::new(all)),
            stacks: RefCell::new(Stacks::new(opts.kernel, opts.native, all)),
            reader: RefCell::new(CountsReader::new()),
            drained: RefCell::new(Vec::new()),
            last_drain: Cell::new(Instant::now()),
            ticks: RefCell::new(opts.idle.then(|| clock::IdleTicks::new(opts.hz))),
            pacer: RefCell::new(None),
            pacer_realtime: Cell::new(None),
            pacer_failed: RefCell::new(None),
            counts_lock: Arc::new(Mutex::new(())),
        };
        match targets {
            Targets::One(pid, python) => session.processes.borrow_mut().add(&session.target_maps(), pid, PythonRef::Borrowed(python))?,
            Targets::All => session.processes.borrow_mut().add_every_python(&session.target_maps()),
        }
        // Located now, not at the first poll: a process found at start is
        // walked from the run's first tick, not counted without a thread
        // state until then (a second or more under emulation).
        session.processes.borrow_mut().locate(&session.target_maps())?;
        if let Some(native) = session.stacks.borrow_mut().native.as_mut() {
            if !opts.idle {
                let maps = &session.skel.maps;
                native.kernel = Some(crate::native::kernel_tables::KernelTables::new(&maps.unwind_rows, &maps.native_slots, &maps.native_mappings)?);
            }
            if let Some(pid) = session.processes.borrow().only() {
                native.prepare(pid);
            }
        }
        session.attach()?;
        if let Some(pid) = session.processes.borrow().only() {
            ensure_still_running(pid)?;
        }
        Ok(session)
    }

    /// The maps BPF finds the sampled processes in: with one target, the
    /// perf-event program reads it from `only_target`.
    fn target_maps(&self) -> TargetMaps<'_> {
        let one = self.skel.maps.rodata_data.as_ref().is_some_and(|r| r.only_pid != 0);
        TargetMaps { by_pid: &self.skel.maps.processes, only: one.then_some(&self.skel.maps.only_target as &dyn MapCore) }
    }

    /// The perf-event sampler this kernel loaded (see `uses_bpf_loop`).
    fn on_cpu_program(&self) -> &libbpf_rs::ProgramMut<'obj> {
        if uses_bpf_loop() {
            &self.skel.progs.sample_thread_loops
        } else {
            &self.skel.progs.sample_thread
        }
    }

    fn attach(&self) -> Result<()> {
        let mut links = self.links.borrow_mut();
        if self.opts.idle {
            let program = &self.skel.progs.sample_all_threads;
            let only = self.processes.borrow().only().and_then(|pid| threads_of(program, pid));
            let iter = match only {
                Some(link) => link,
                None => program.attach_iter_with_opts(libbpf_rs::IterOpts::None).map_err(privilege_hint).context("failed to attach the thread iterator")?,
            };
            links.push(iter);
            return Ok(());
        }
        let mut rearmed = Vec::new();
        for cpu in clock::online_cpus()? {
            let event = clock::open_cpu_clock(cpu, clock::period_ns(self.opts.hz))
                .with_context(|| format!("failed to open a CPU-clock perf event on CPU {cpu}"))?;
            rearmed.push((cpu, event.try_clone().context("failed to duplicate a perf event descriptor")?));
            // The link closes the event's descriptor when dropped.
            let link = self.on_cpu_program().attach_perf_event(event.into_raw_fd());
            links.push(link.map_err(privilege_hint).context("failed to attach the sampler")?);
        }
        let weights = std::os::fd::AsFd::as_fd(&self.skel.maps.sample_weights).try_clone_to_owned().context("failed to duplicate a map descriptor")?;
        *self.clock.borrow_mut() = Some(clock::Rearming::start(rearmed, self.opts.hz, weights)?);
        Ok(())
    }

    /// Adds this session's ring buffer (new stacks, --native samples) to
    /// `builder`.
    pub fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        builder.add(&self.skel.maps.records, |bytes: &[u8]| {
            self.stacks.borrow_mut().receive(bytes, &mut self.processes.borrow_mut());
            0
        })?;
        Ok(())
    }

    /// Between two polls of the ring buffer: tells BPF where each target's
    /// interpreter is as soon as it can be known, reads the counts every
    /// DRAIN_EVERY, and with --all follows processes starting and exiting.
    /// Returns the samples counted so far.
    pub fn between_polls(&self) -> Result<u64> {
        self.after_poll();
        self.processes.borrow_mut().locate(&self.target_maps())?;
        if self.last_drain.get().elapsed() >= if self.opts.idle { IDLE_DRAIN_EVERY } else { DRAIN_EVERY } {
            self.drain(false)?;
        }
        self.follow_processes();
        Ok(self.stacks.borrow().total())
    }

    /// After reading the ring buffer: names the new stacks it held, all at
    /// once (each batch checks the cached code objects it uses, in two
    /// system calls). BPF does not wake user space for new stacks (only
    /// once the ring is half full): the driver reads them at each check
    /// (CHECK_EVERY).
    pub fn after_poll(&self) {
        self.stacks.borrow_mut().name_new(&mut self.processes.borrow_mut());
    }

    /// Reads the counts BPF gathered since the last drain into the profile.
    /// `last`: nothing counts any more, both maps are read, and a stack whose
    /// frames have not arrived by now never will.
    fn drain(&self, last: bool) -> Result<()> {
        self.last_drain.set(Instant::now());
        let maps = &self.skel.maps;
        let mut reader = self.reader.borrow_mut();
        let mut drained = self.drained.borrow_mut();
        drained.clear();
        if last {
            reader.take(&maps.counts_a, &mut drained)?;
            reader.take(&maps.counts_b, &mut drained)?;
        } else if self.opts.idle {
            // The pacer's passes add to counts_a: never during the take,
            // whose deletes would lose their increments.
            let _held = self.counts_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            reader.take(&maps.counts_a, &mut drained)?;
        } else {
            let old = reader.swap(&maps.counts, &maps.counts_a, &maps.counts_b)?;
            reader.take(old, &mut drained)?;
        }
        let mut stacks = self.stacks.borrow_mut();
        let mut processes = self.processes.borrow_mut();
        stacks.begin_drain();
        stacks.add_counts(&drained, &mut processes, last);
        stacks.end_drain(&maps.known_stacks);
        Ok(())
    }

    /// --all: picks up the Pythons started since the last look and takes
    /// out those that exited (each at most every second, apart from the
    /// reads of the counts), forgetting their stacks KEEP_EXITED_DRAINS
    /// reads later, once their last counts are in.
    fn follow_processes(&self) {
        let mut stacks = self.stacks.borrow_mut();
        let mut processes = self.processes.borrow_mut();
        let forgotten = processes.rescan(&self.target_maps(), stacks.drains());
        for &pid in &forgotten {
            stacks.forget_process(pid, &self.skel.maps.known_stacks);
            if let Some(native) = stacks.native.as_mut() {
                native.forget(pid);
            }
        }
        if !forgotten.is_empty() {
            // Hand what the exited processes' caches held back to the system.
            // SAFETY: malloc_trim only releases free memory.
            unsafe { libc::malloc_trim(0) };
        }
    }

    /// The samples counted so far, by stack, the counts read now. (A
    /// failed read is reported by the next `between_polls`, which reads
    /// again.)
    pub fn samples_so_far(&self) -> Vec<Sample> {
        let _ = self.drain(false);
        self.stacks.borrow().samples_so_far()
    }

    /// What was counted since the last take (all of it read now), and
    /// counting afresh: the agent cuts its intervals with it. A failed read
    /// is the caller's error, not a short interval passed off as whole.
    pub fn take_samples(&self) -> Result<Vec<Sample>> {
        self.drain(false)?;
        Ok(self.stacks.borrow_mut().take_samples())
    }

    /// Each process sampled now, with its Python's version.
    pub fn python_versions(&self) -> HashMap<u32, String> {
        self.processes.borrow().by_pid.iter().map(|(&pid, p)| (pid, p.version())).collect()
    }

    /// The samples counted so far.
    pub fn total(&self) -> u64 {
        self.stacks.borrow().total()
    }

    /// Each thread's PyThreadState, as the walk cached it (the map holds
    /// only the sampled processes' threads; an entry the walk could not
    /// check again is read anyway, so its reader checks what it reads).
    fn thread_states(&self) -> Vec<(u32, u64)> {
        let map = &self.skel.maps.thread_states;
        let word = |bytes: &[u8]| bytes.try_into().ok().map(u64::from_ne_bytes);
        libbpf_rs::MapCore::keys(map)
            .filter_map(|key| {
                let tid = u32::from_ne_bytes(key.as_slice().try_into().ok()?);
                let value = libbpf_rs::MapCore::lookup(map, &key, libbpf_rs::MapFlags::ANY).ok()??;
                Some((tid, word(&value)?))
            })
            .collect()
    }

    /// A snapshot's threads of `pid` that no pass has read yet (torn each
    /// time), of those alive now.
    fn threads_unread(&self, pid: u32) -> Vec<u32> {
        let read: std::collections::HashSet<u32> = libbpf_rs::MapCore::keys(&self.skel.maps.threads_read)
            .filter_map(|key| Some(u32::from_ne_bytes(key.as_slice().try_into().ok()?)))
            .collect();
        let mut alive = std::collections::HashMap::new();
        crate::process::proc::thread_names(pid, &mut alive);
        let mut unread: Vec<u32> = alive.into_keys().filter(|tid| !read.contains(tid)).collect();
        unread.sort_unstable();
        unread
    }

    /// --idle: one pass of the thread iterator, one round of samples.
    fn sample_every_thread(&self) -> Result<()> {
        let links = self.links.borrow();
        let iter = links.first().context("the thread iterator is not attached")?;
        let mut pass = libbpf_rs::Iter::new(iter).context("failed to start a pass over the threads")?;
        std::io::Read::read_to_end(&mut pass, &mut Vec::new()).context("failed to sample the threads")?;
        Ok(())
    }

    /// Stops sampling; the maps stay readable. Once this returns no program
    /// runs any more, so the ring buffer holds every record there will be.
    pub fn detach(&self) {
        if self.links.borrow().is_empty() {
            return;
        }
        drop(self.clock.borrow_mut().take());
        self.stop_pacer();
        self.links.borrow_mut().clear();
        if !self.opts.idle {
            // A swap waits for the programs still running.
            let maps = &self.skel.maps;
            let _ = self.reader.borrow_mut().swap(&maps.counts, &maps.counts_a, &maps.counts_b);
        }
    }

    /// --idle: starts the pacer's passes (at the first poll: the traced
    /// window has begun).
    fn start_pacer(&self) -> Result<()> {
        let Some(ticks) = self.ticks.borrow_mut().take() else { return Ok(()) };
        let links = self.links.borrow();
        let iter = links.first().context("the thread iterator is not attached")?;
        let pacer = idle_pacer::IdlePacer::start(std::os::fd::AsFd::as_fd(iter), ticks, self.counts_lock.clone())?;
        *self.pacer.borrow_mut() = Some(pacer);
        Ok(())
    }

    /// --idle: ends the passes, keeping the pacer's account of its ticks.
    fn stop_pacer(&self) {
        let Some(pacer) = self.pacer.borrow_mut().take() else { return };
        if let Some(end) = pacer.finish() {
            self.pacer_realtime.set(Some(end.realtime));
            if let Some(failed) = end.failed {
                self.pacer_failed.replace(Some(failed));
            }
            *self.ticks.borrow_mut() = Some(end.ticks);
        }
    }

    /// Detaches (if not yet done), reads the last counts and returns the
    /// profile. The ring buffer built with `add_to` must have been drained
    /// and dropped.
    pub fn finish(self) -> Result<SampleData> {
        self.detach();
        if let Some(failed) = self.pacer_failed.borrow_mut().take() {
            anyhow::bail!("{failed}");
        }
        self.drain(true)?;
        let total = self.stacks.borrow().total();
        let program = if self.opts.idle { &self.skel.progs.sample_all_threads } else { self.on_cpu_program() };
        // Per sample received, so the program's runs for other processes (it
        // fires on every CPU and returns at once for them) count too.
        let bpf_ns_per_sample = super::bpf_run_stats(program).map(|(ns, _)| ns / total.max(1));
        let counters = self.counters()?;
        Ok(SampleData { samples: self.stacks.into_inner().into_samples(), counters, bpf_ns_per_sample, thread_states: Vec::new() })
    }

    /// Every counter so far: the kernel's (read from its map) and user
    /// space's. The agent reads them at each interval, for /metrics.
    pub fn counters(&self) -> Result<Counters> {
        // Lost: samples taken and not in the profile. The others say what
        // a sample in it lacks, or what a cache had to give up.
        let mut names = vec![
            ("lost", Lost, "samples lost (ring buffer full)", sample_counter::SAMPLE_LOST.0),
            ("bad_frame", Informational, "frames that could not be read (stacks end there)", sample_counter::SAMPLE_BAD_FRAME.0),
            ("no_thread_state", Informational, "samples of threads without a Python thread state yet", sample_counter::SAMPLE_NO_THREAD.0),
            ("counts_map_full", Lost, "samples lost (the kernel's count map was full until the next read)", sample_counter::SAMPLE_COUNTS_FULL.0),
        ];
        if self.opts.kernel {
            names.push(("kernel_stack_failed", Informational, "samples without their kernel frames", sample_counter::SAMPLE_KERNEL_STACK_FAILED.0));
        }
        if self.opts.gil {
            names.push(("gil_not_held", Informational, "--gil: samples left out, their thread not holding the GIL", sample_counter::SAMPLE_GIL_NOT_HELD.0));
            names.push(("gil_unreadable", Lost, "--gil: samples lost, the GIL's state unreadable or not a GIL's", sample_counter::SAMPLE_GIL_UNREADABLE.0));
        }
        if self.opts.native {
            names.push(("native_no_user_regs", Informational, "samples with no user registers: no native frames", sample_counter::SAMPLE_NO_USER_REGS.0));
            names.push(("native_on_cpu", Informational, "--idle samples of threads running on another CPU: no native frames", sample_counter::SAMPLE_NATIVE_ON_CPU.0));
        }
        if self.opts.idle {
            names.push(("torn", Lost, "--idle: samples lost, their thread's stack changed while it was read (read again, it differed)", sample_counter::SAMPLE_TORN.0));
        }
        if self.opts.async_tasks && self.opts.idle {
            names.push(("task_switched", Lost, "--async --idle: samples lost, their thread switched asyncio tasks while it was read", sample_counter::SAMPLE_TASK_SWITCHED.0));
        }
        let mut counters = read_counters(&self.skel.maps.counters, &names)?;
        if let Some(ticks) = self.ticks.borrow().as_ref() {
            counters.push("idle_ticks_missed", Informational, "--idle: ticks skipped, pytrace itself late (a busy machine): what the target ran meanwhile is under-sampled", ticks.missed);
        }
        if self.pacer_realtime.get() == Some(false) {
            counters.push("idle_not_realtime", Informational, "--idle: the sampling thread could not have real-time priority (no CAP_SYS_NICE): on a busy machine, code that runs is under-sampled", 1);
        }
        let stacks = self.stacks.borrow();
        let processes = self.processes.borrow();
        let c = stacks.counts;
        counters.push("unresolved_stacks", Lost, "samples lost (their frames never reached pytrace)", counts::samples_of(c.unresolved));
        counters.push("profile_full", Lost, "samples lost (new stacks past the profile's memory cap)", counts::samples_of(c.profile_full));
        counters.push("stacks_forgotten", Informational, "stacks forgotten to bound memory, sent again when seen", c.forgotten);
        counters.push("stacks_renamed", Informational, "stacks named again (a code object freed and another made at its address)", c.renamed);
        if self.opts.async_tasks {
            let unreadable = processes.by_pid.values().map(|p| p.tasks.unreadable).sum();
            counters.push("tasks_unreadable", Informational, "--async: asyncio tasks that could not be named (shown as `task unreadable`)", unreadable);
            counters.push("tasks_renamed", Informational, "--async: stacks named again, their task renamed or ended", c.tasks_renamed);
        }
        let cache = processes.cache_counts();
        counters.push("line_tables_not_kept", Informational, "line tables too large to cache, read again when needed", cache.line_tables_not_kept);
        counters.push("code_cache_flushes", Informational, "code object caches emptied at their memory cap", cache.code_cache_flushes);
        if processes.only().is_none() {
            counters.push("processes_not_sampled", Informational, "processes left out (--all: the process map was full)", processes.counts.not_sampled);
            counters.push("processes_exited", Informational, "processes that exited during the run", processes.counts.exited);
        }
        if let Some(native) = &stacks.native {
            if let Some(kernel) = &native.kernel {
                use crate::bpf::sample::types::native_end as e;
                let ends = [
                    ("native_kernel_complete", "native stacks BPF unwound to their first frame", e::NATIVE_COMPLETE.0),
                    ("native_kernel_frame_cap", "native stacks BPF cut at its frame limit", e::NATIVE_FRAME_CAP.0),
                    ("native_kernel_unsupported", "native stacks BPF ended at an unwind rule it does not follow", e::NATIVE_UNSUPPORTED.0),
                    ("native_kernel_read_failed", "native stacks BPF ended at a stack word it could not read", e::NATIVE_READ_FAILED.0),
                    ("native_kernel_bad_return_address", "native stacks BPF ended at a CFA or return address outside user space", e::NATIVE_BAD_RETURN_ADDRESS.0),
                    ("native_kernel_sp_not_rising", "native stacks BPF ended where the stack would not unwind upwards", e::NATIVE_SP_NOT_RISING.0),
                    ("native_kernel_stack_copied", "native stacks BPF sent the rest of for user space to unwind (no mapping, no table, or no unwind information and no frame pointer)", e::NATIVE_STACK_COPY.0),
                ];
                let names: Vec<_> = ends.iter().map(|&(name, what, index)| (name, Informational, what, index)).collect();
                counters.extend(read_counters(&self.skel.maps.native_ends, &names)?.iter().cloned());
                let t = kernel.counts;
                counters.push("native_files_without_table", Informational, "mapped files BPF has no unwind table for (too large, or none built): their samples unwound in user space", t.files_without_table);
                counters.push("native_mappings_left_out", Informational, "executable mappings past what BPF holds per process", t.mappings_left_out);
                counters.push("native_processes_left_out", Informational, "processes past those whose mappings BPF holds at once", t.processes_left_out);
            }
            let c = native.counts;
            counters.push("native_unavailable", Informational, "samples without native frames", c.unavailable);
            counters.push("native_stack_cut", Informational, "native stacks deeper than the copy", c.stack_cut);
            counters.push("native_unwind_lost", Informational, "native stacks whose unwinding failed", c.unwind_lost);
            counters.push("native_no_unwind_info", Informational, "native stacks ended at code without unwind information, no caller found by a stack scan", c.no_unwind_info);
            counters.push("native_threads", Informational, "samples of threads started by native code, with no Python caller (shown as `[thread started by native code]`)", c.native_threads);
            counters.push("native_scanned", Informational, "callers of code without unwind information found by a checked stack scan", c.scanned);
            counters.push("native_scan_us", Informational, "microseconds spent on stack scans, the unwinds that checked them included", c.scan_time.as_micros() as u64);
            counters.push("native_unmatched", Informational, "native and Python frames not paired", c.unmatched);
        }
        Ok(counters)
    }
}

/// --all runs for hours and reads each new executable it meets whole (to
/// tell whether it is a Python; an interpreter's is held until its last
/// process is gone), then frees it: with glibc's default the first such
/// buffer freed raises the size below which buffers come from the heap, up
/// to 32 MiB, and the next ones may stay in the heap for good. A fixed
/// threshold keeps every buffer of 1 MiB or more in its own mapping,
/// returned to the system when freed.
fn keep_large_buffers_apart() {
    // SAFETY: mallopt only changes the allocator's tuning.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
}

/// How long `snapshot` waits for the target's interpreter to be located
/// (a process started a moment ago may not have one yet).
const LOCATE_AT_MOST: Duration = Duration::from_secs(2);

/// One pass over every thread of the target, running or not, as
/// `pytrace dump` shows it: each thread's stack at this instant. `opts`
/// must ask for --idle's thread iterator (and --threads).
/// The thread iterator over process `pid`'s threads alone (the task
/// iterator's filter, Linux 6.1+), so that a pass visits that process's
/// threads rather than every task of the machine and runs the program on
/// each: the machine's tasks cost a one-thread target's `--idle` most of
/// its CPU (bench/results.md, "Fixed cost"). None where the kernel has no
/// filter (before 6.1 it refuses the longer link info): then the whole
/// iterator, whose program skips other processes' threads itself.
fn threads_of(program: &libbpf_rs::ProgramMut<'_>, pid: u32) -> Option<Link> {
    use libbpf_rs::libbpf_sys::{bpf_iter_attach_opts, bpf_iter_link_info, bpf_program__attach_iter};
    use libbpf_rs::AsRawLibbpf;
    let mut info = bpf_iter_link_info::default();
    info.task.pid = pid;
    let opts = bpf_iter_attach_opts {
        sz: std::mem::size_of::<bpf_iter_attach_opts>() as _,
        link_info: &mut info,
        link_info_len: std::mem::size_of::<bpf_iter_link_info>() as _,
        ..Default::default()
    };
    // SAFETY: the program is loaded, and `opts` and `info` outlive the
    // call, which copies them; libbpf returns NULL (errno set) on failure.
    let link = unsafe { bpf_program__attach_iter(program.as_libbpf_object().as_ptr(), &opts) };
    // SAFETY: a non-NULL return is a link libbpf made, now owned here.
    std::ptr::NonNull::new(link).map(|link| unsafe { Link::from_ptr(link) })
}

pub fn snapshot(targets: Targets, opts: &Options) -> Result<SampleData> {
    anyhow::ensure!(opts.idle && opts.threads, "a snapshot reads every thread, each apart");
    let pid = pid_of(&targets);
    let mut object = MaybeUninit::uninit();
    let session = Session::start_reading(&mut object, targets, opts, true)?;
    let mut builder = RingBufferBuilder::new();
    session.add_to(&mut builder)?;
    let ring = builder.build()?;
    let started = Instant::now();
    loop {
        session.between_polls()?;
        if session.processes.borrow().all_located() {
            break;
        }
        if started.elapsed() > LOCATE_AT_MOST {
            anyhow::bail!("the target's Python interpreter was not found running within {} s (not initialised yet?)", LOCATE_AT_MOST.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // A thread running on another CPU may change its stack while it is
    // read; the program then leaves it out (see stack_unchanged in
    // bpf/sample_walk.bpf.h) and it is read again in the next pass, until
    // every thread is read whole or the passes run out.
    let mut unread = Vec::new();
    let passes_started = Instant::now();
    for _ in 0..SNAPSHOT_PASSES {
        session.sample_every_thread()?;
        unread = session.threads_unread(pid);
        if unread.is_empty() || passes_started.elapsed() > SNAPSHOT_PASSES_FOR {
            break;
        }
        std::thread::yield_now();
    }
    session.detach();
    ring.consume().context("failed to read the sample ring buffer")?;
    session.after_poll();
    drop(ring);
    let thread_states = session.thread_states();
    let mut data = SampleData { thread_states, ..session.finish()? };
    data.samples.extend(unread.into_iter().map(|tid| Sample { pid, tid, frames: vec![Rc::new(Frame::Unsettled)], count: 1 }));
    Ok(data)
}

/// Passes a snapshot makes at most, for threads whose stack changed while
/// read (a thread in a tight recursion changes it every microsecond): a
/// torn read is a few percent of a running thread's, so a few passes read
/// nearly every one.
const SNAPSHOT_PASSES: u32 = 200;
const SNAPSHOT_PASSES_FOR: Duration = Duration::from_millis(150);

fn pid_of(targets: &Targets) -> u32 {
    match targets {
        Targets::One(pid, _) => *pid,
        Targets::All => 0,
    }
}

impl Tracing for Session<'_, '_> {
    type Data = SampleData;

    fn what(&self) -> String {
        "sample".into()
    }

    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        Session::add_to(self, builder)
    }

    fn check_every(&self) -> Duration {
        if self.processes.borrow().locating() {
            discovery::LOCATE_EVERY
        } else {
            CHECK_EVERY
        }
    }

    fn between_polls(&self) -> Result<()> {
        Session::between_polls(self).map(drop)
    }

    fn after_poll(&self) {
        Session::after_poll(self)
    }

    /// --idle: the pacer's start, at the first poll.
    fn next_due(&self) -> Option<Instant> {
        self.ticks.borrow().as_ref().filter(|_| self.pacer_realtime.get().is_none()).map(clock::IdleTicks::next)
    }

    /// --idle: starts the pacer, whose thread passes over every thread at
    /// each tick from now to the detach.
    fn run_due(&self) -> Result<()> {
        self.start_pacer()
    }

    /// None: its own `detach` drops them, the clock that rearms them first.
    fn links(&self) -> Option<&super::Links> {
        None
    }

    fn detach(&self) {
        Session::detach(self)
    }

    fn finish(self) -> Result<SampleData> {
        Session::finish(self)
    }
}

/// Whether the perf-event sampler walks with bpf_loop (5.17+): the same
/// program as the bounded-loop one, which the verifier checks pass by pass
/// (338,000 instructions, about half a second of CPU at every start on
/// 6.18) where it checks bpf_loop's bodies once (2,900).
fn uses_bpf_loop() -> bool {
    crate::kernel::Kernel::get().has(crate::kernel::Feature::BpfLoop)
}
