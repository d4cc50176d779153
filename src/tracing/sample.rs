//! The `sample` BPF session (bpf/sample.bpf.c): a CPU-clock perf event on
//! every CPU; each sample of a target thread arrives with its Python frames
//! as addresses, which are resolved here, once per code object.

use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::rc::Rc;

use anyhow::{Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use super::{ensure_still_running, poll_until, privilege_hint, read_counters};
use crate::bpf::sample::types::{py_layout, py_sample, sample_counter, sample_target};
use crate::bpf::sample::{SampleSkel, SampleSkelBuilder};
use crate::native::merge::PythonStack;
use crate::native::{NativeStacks, UserStack};
use crate::python::code::{instruction_offset, Code};
use crate::python::layouts::NO_FIELD;
use crate::python::{Python, RUNTIME_SYMBOL};
use crate::target::proc::{self, Memory};

/// The caches of code objects and frames are emptied after this many
/// samples, so they do not grow with every address ever seen. (A code
/// object replaced at the same address is caught by `Code::still_at`.)
const CODE_CACHE_SAMPLES: usize = 2000;

/// A cached code object is trusted this long after its identity was last
/// checked. Checking costs two reads of the target; doing it for every frame
/// of every sample cost ~100 us a sample on a 100-deep stack (measured).
const TRUST_FOR: std::time::Duration = std::time::Duration::from_millis(5);

/// The ring buffer with --native, where each record carries 32 KiB of
/// stack: about 900 records, a second at 999 Hz on 2 CPUs even if user
/// space stalls.
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
}

/// One frame of a sample, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// `line` is the line running; `first_line` the function's first line,
    /// which with name and file tells one function from another.
    Python { name: String, file: String, line: u32, first_line: u32 },
    /// --native: a C function (its symbol, or its start address in a
    /// stripped file) and the file name of its module.
    Native { name: String, module: String },
    Kernel(String),
    /// A frame that could not be read (freed memory, a frame being torn
    /// down while the thread runs): shown, never guessed.
    Unreadable,
    /// The stack went on past what is recorded.
    Truncated,
    /// The thread was running no Python code.
    NoPython,
    /// With --all: the process, as the root frame.
    Process(String),
    /// A sample taken inside pytrace's own uprobes, while `calls` traces
    /// the same target (`pytrace compare` sets these apart).
    Probes,
    /// --native: the native stack ended early (copied stack too short, or
    /// code without unwind information); frames outside it follow.
    NativeIncomplete,
    /// --native: eval frames and Python calls disagreed; the native frames
    /// are below this marker, the Python frames above it, unpaired.
    NativeUnmatched,
    /// --native: no registers or stack for this sample.
    NativeUnavailable,
}

/// A sample: its process, thread and frames, outermost first.
#[derive(Debug, Clone)]
pub struct Sample {
    pub pid: u32,
    pub tid: u32,
    pub frames: Vec<Rc<Frame>>,
}

pub struct SampleData {
    pub samples: Vec<Sample>,
    pub counters: Vec<(&'static str, u64)>,
    /// The BPF program's total run time over the samples received, in ns,
    /// when kernel.bpf_stats_enabled is on.
    pub bpf_ns_per_sample: Option<u64>,
}

/// Minimal perf_event_attr (the kernel accepts any size it knows).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_freq: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    rest: [u64; 10],
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_FLAG_FREQ: u64 = 1 << 10;

fn open_cpu_clock(cpu: i32, hz: u64) -> std::io::Result<i32> {
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_freq: hz,
        flags: PERF_FLAG_FREQ,
        ..Default::default()
    };
    // SAFETY: perf_event_open with a valid attr; the fd is handed to libbpf.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr, -1i32, cpu, -1i32, 0u64) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd as i32)
}

fn online_cpus() -> Result<Vec<i32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").context("failed to read /sys/devices/system/cpu/online")?;
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<i32>()?..=b.parse::<i32>()?);
    }
    Ok(cpus)
}

/// Names one process's code objects, reading each from it once.
struct Resolver {
    layout: crate::python::Layout,
    mem: Option<Memory>,
    /// &PyCode_Type in the target, once its interpreter file is mapped.
    code_type: Option<u64>,
    /// Code objects by address, with when their identity was last checked.
    codes: HashMap<u64, (std::time::Instant, Option<Rc<Code>>)>,
    frames: HashMap<(u64, u32), Rc<Frame>>,
    unreadable: Rc<Frame>,
    since_flush: usize,
}

impl Resolver {
    fn new(layout: crate::python::Layout) -> Self {
        Resolver {
            layout,
            mem: None,
            code_type: None,
            codes: HashMap::new(),
            frames: HashMap::new(),
            unreadable: Rc::new(Frame::Unreadable),
            since_flush: 0,
        }
    }

    fn frame(&mut self, code_addr: u64, instr: u64) -> Rc<Frame> {
        let layout = &self.layout;
        let Some(mem) = &self.mem else { return self.unreadable.clone() };
        let now = std::time::Instant::now();
        let cached = self.codes.get_mut(&code_addr);
        let was_named = matches!(cached, Some((_, Some(_))));
        let code = match cached {
            Some((checked, Some(code))) if now.duration_since(*checked) < TRUST_FOR => Some(code.clone()),
            Some((checked, Some(code))) if code.still_at(mem, layout, code_addr) => {
                *checked = now;
                Some(code.clone())
            }
            _ => {
                // A frame caught while it is set up or torn down can point
                // at anything: only a real code object gets a name.
                let is_code = self.code_type.is_none_or(|t| mem.read_u64(code_addr + layout.object_type as u64).ok() == Some(t));
                let code = is_code.then(|| Code::read(mem, layout, code_addr).ok()).flatten().map(Rc::new);
                self.codes.insert(code_addr, (now, code.clone()));
                if was_named {
                    // Frames named after the code object that was here.
                    self.frames.retain(|(addr, _), _| *addr != code_addr);
                }
                code
            }
        };
        let Some(code) = code else { return self.unreadable.clone() };
        let line = code.line_at(instruction_offset(layout, code_addr, instr));
        self.frames
            .entry((code_addr, line))
            .or_insert_with(|| {
                Rc::new(Frame::Python { name: code.qualname.clone(), file: code.filename.clone(), line, first_line: code.firstlineno })
            })
            .clone()
    }

    fn tick(&mut self) {
        self.since_flush += 1;
        if self.since_flush >= CODE_CACHE_SAMPLES {
            self.codes.clear();
            self.frames.clear();
            self.since_flush = 0;
        }
    }
}

/// What to sample: one process, or every CPython on the machine.
pub enum Targets<'a> {
    One(u32, &'a Python),
    All,
}

/// A sampled process: its Python (borrowed for one target, found by
/// --all), the resolver for its code objects, its entry in the BPF map.
struct Process<'a> {
    python: PythonRef<'a>,
    resolver: Resolver,
    label: Rc<Frame>,
    /// Whether its interpreter's addresses are known and in the map.
    located: bool,
}

enum PythonRef<'a> {
    Borrowed(&'a Python),
    Owned(Box<Python>),
}

impl std::ops::Deref for PythonRef<'_> {
    type Target = Python;
    fn deref(&self) -> &Python {
        match self {
            PythonRef::Borrowed(p) => p,
            PythonRef::Owned(p) => p,
        }
    }
}

fn target_entry(python: &Python, interpreters_head: u64) -> sample_target {
    let l = &python.layout;
    sample_target {
        layout: super::py_layout!(py_layout, l),
        interpreters_head,
        frame_head: [l.frame_code, l.frame_previous, l.frame_instr, l.frame_owner, l.frame_is_entry]
            .into_iter()
            .filter(|&o| o != NO_FIELD)
            .map(|o| o + 8)
            .max()
            .unwrap_or(8),
        frame_previous: l.frame_previous,
        frame_instr: l.frame_instr,
        frame_is_entry: l.frame_is_entry,
        tstate_thread_id: l.tstate_thread_id,
        interp_threads_head: l.interp_threads_head,
        tstate_next: l.tstate_next,
        ..Default::default()
    }
}

fn put_target(map: &dyn MapCore, pid: u32, entry: &sample_target) -> Result<()> {
    // SAFETY: a plain integer struct generated from bpf/sample.h.
    let bytes = unsafe { std::slice::from_raw_parts((entry as *const sample_target).cast::<u8>(), std::mem::size_of::<sample_target>()) };
    map.update(&pid.to_ne_bytes(), bytes, MapFlags::ANY).with_context(|| format!("failed to add process {pid} to the sampler"))
}

/// The CPython processes on the machine not looked at yet (`checked`
/// remembers every PID looked at, Python or not, so each rescan reads only
/// new processes' files).
fn find_pythons(checked: &mut std::collections::HashSet<u32>) -> Vec<(u32, Python)> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && checked.insert(pid))
        .filter_map(|pid| Python::from_pid(pid).ok().map(|p| (pid, p)))
        .collect()
}

/// The sampler loaded and attached. Split into steps (`start`, `add_to`,
/// `between_polls`, `detach`, `finish`) so that another session can run
/// beside it on the same ring-buffer poll (`pytrace compare`); `run` is the
/// whole of it for `pytrace sample`.
pub struct Session<'obj, 'a> {
    skel: SampleSkel<'obj>,
    links: RefCell<Vec<Link>>,
    opts: Options,
    all: bool,
    /// Every PID looked at by --all, Python or not.
    checked: RefCell<std::collections::HashSet<u32>>,
    processes: RefCell<HashMap<u32, Process<'a>>>,
    kernel_frames: RefCell<HashMap<i32, Vec<u64>>>,
    samples: RefCell<Vec<Sample>>,
    /// --native: unwinders and symbols per process.
    native: RefCell<Option<NativeStacks>>,
    truncated: Rc<Frame>,
    no_python: Rc<Frame>,
    last_scan: std::cell::Cell<std::time::Instant>,
    bpf_ns_per_sample: std::cell::Cell<Option<u64>>,
}

impl<'obj, 'a> Session<'obj, 'a> {
    /// Loads the program into `object` and attaches it: from here on the
    /// targets are sampled (once their interpreter is located, see
    /// `between_polls`).
    pub fn start(object: &'obj mut MaybeUninit<OpenObject>, targets: Targets<'a>, opts: &Options) -> Result<Self> {
        let mut open = SampleSkelBuilder::default().open(object).context("failed to open the sample BPF program")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the sample BPF program has no rodata")?;
        rodata.cfg.kernel_stacks = opts.kernel as u8;
        rodata.cfg.native = opts.native as u8;
        if opts.native {
            open.maps.samples.set_max_entries(NATIVE_RING_BYTES).context("failed to size the sample ring buffer")?;
        }
        // --idle reads every thread through a sleepable task iterator; without
        // it, the perf-event program samples threads on CPU.
        open.progs.sample_all_threads.set_autoload(opts.idle);
        open.progs.sample_thread.set_autoload(!opts.idle);
        let skel = crate::bpf::load::load("sample", open)?;
        let session = Session {
            skel,
            links: RefCell::new(Vec::new()),
            opts: *opts,
            all: matches!(targets, Targets::All),
            checked: RefCell::new(std::collections::HashSet::new()),
            processes: RefCell::new(HashMap::new()),
            kernel_frames: RefCell::new(HashMap::new()),
            samples: RefCell::new(Vec::new()),
            native: RefCell::new(opts.native.then(NativeStacks::default)),
            truncated: Rc::new(Frame::Truncated),
            no_python: Rc::new(Frame::NoPython),
            last_scan: std::cell::Cell::new(std::time::Instant::now()),
            bpf_ns_per_sample: std::cell::Cell::new(None),
        };
        match targets {
            Targets::One(pid, python) => session.add_process(pid, PythonRef::Borrowed(python))?,
            Targets::All => session.add_new_pythons()?,
        }

        let mut links = session.links.borrow_mut();
        if opts.idle {
            links.push(
                session
                    .skel
                    .progs
                    .sample_all_threads
                    .attach_iter_with_opts(libbpf_rs::IterOpts::None)
                    .map_err(privilege_hint)
                    .context("failed to attach the thread iterator")?,
            );
        } else {
            for cpu in online_cpus()? {
                let fd = open_cpu_clock(cpu, opts.hz).with_context(|| format!("failed to open a CPU-clock perf event on CPU {cpu}"))?;
                links.push(session.skel.progs.sample_thread.attach_perf_event(fd).map_err(privilege_hint).context("failed to attach the sampler")?);
            }
        }
        drop(links);
        if let Some(&pid) = session.processes.borrow().keys().next().filter(|_| !session.all) {
            ensure_still_running(pid)?;
        }
        Ok(session)
    }

    fn add_process(&self, pid: u32, python: PythonRef<'a>) -> Result<()> {
        put_target(&self.skel.maps.processes, pid, &target_entry(&python, 0))?;
        let label = Rc::new(Frame::Process(format!("{} ({pid})", proc::command_name(pid))));
        let resolver = Resolver::new(python.layout.clone());
        self.processes.borrow_mut().insert(pid, Process { python, resolver, label, located: false });
        Ok(())
    }

    /// --all: the Pythons not seen yet.
    fn add_new_pythons(&self) -> Result<()> {
        let found = find_pythons(&mut self.checked.borrow_mut());
        for (pid, python) in found {
            self.add_process(pid, PythonRef::Owned(Box::new(python)))?;
        }
        Ok(())
    }

    /// Adds this session's ring buffer (the samples) to `builder`.
    pub fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        builder.add(&self.skel.maps.samples, |bytes: &[u8]| {
            self.receive(bytes);
            0
        })?;
        Ok(())
    }

    fn receive(&self, bytes: &[u8]) {
        let header = std::mem::size_of::<py_sample>();
        let Some(s) = bytes.get(..header) else { return };
        // SAFETY: the record is a py_sample written by the BPF program; it is
        // read unaligned because ring-buffer records are only 8-byte aligned.
        let s: py_sample = unsafe { std::ptr::read_unaligned(s.as_ptr().cast()) };
        let mut processes = self.processes.borrow_mut();
        let Some(process) = processes.get_mut(&s.pid) else { return };
        let r = &mut process.resolver;
        r.tick();
        let mut frames = Vec::new();
        if s.kernel_stack >= 0 {
            self.kernel_frames.borrow_mut().entry(s.kernel_stack).or_default();
            frames.push(Rc::new(Frame::Kernel(format!("#stack{}", s.kernel_stack))));
        }
        let n = (s.frames as usize).min(s.code.len());
        if let Some(native) = self.native.borrow_mut().as_mut() {
            let python: Vec<Rc<Frame>> = (0..n).map(|i| r.frame(s.code[i], s.instr[i])).collect();
            let entry: Vec<bool> = (0..n).map(|i| (s.entry[i / 64] >> (i % 64)) & 1 == 1).collect();
            // The stack bytes follow the record; BPF reserved room for as
            // many as the record is long.
            let stack = &bytes[header..];
            let len = (s.stack_len as usize).min(stack.len());
            let user = (s.native != 0).then(|| UserStack {
                ip: s.user_ip,
                sp: s.user_sp,
                bp: s.user_bp,
                start: s.stack_start,
                bytes: &stack[..len],
                full: len == stack.len(),
            });
            let python = PythonStack { frames: &python, entry: &entry, truncated: s.truncated != 0 };
            frames.extend(native.frames(s.pid, &python, user.as_ref()));
            if s.no_python != 0 {
                // Whatever native code the thread runs, under one root.
                frames.push(self.no_python.clone());
            }
        } else {
            if s.no_python != 0 {
                frames.push(self.no_python.clone());
            }
            for i in 0..n {
                frames.push(r.frame(s.code[i], s.instr[i]));
            }
            if s.truncated != 0 {
                frames.push(self.truncated.clone());
            }
        }
        if self.all {
            frames.push(process.label.clone());
        }
        frames.reverse();
        self.samples.borrow_mut().push(Sample { pid: s.pid, tid: s.tid, frames });
    }

    /// Between two polls of the ring buffer: tells BPF where each target's
    /// interpreter is as soon as it can be known, and with --all picks up
    /// new Pythons. Returns the samples received so far.
    pub fn between_polls(&self) -> Result<usize> {
        // With `--`, libpython may be mapped only now.
        for (&pid, p) in self.processes.borrow_mut().iter_mut().filter(|(_, p)| !p.located) {
            if let Ok((head, code_type)) = runtime_addresses(pid, &p.python) {
                put_target(&self.skel.maps.processes, pid, &target_entry(&p.python, head))?;
                p.resolver.mem = Memory::open(pid).ok();
                p.resolver.code_type = code_type;
                p.located = true;
            }
        }
        // --all: Pythons started since are sampled too.
        if self.all && self.last_scan.get().elapsed() >= std::time::Duration::from_secs(1) {
            self.last_scan.set(std::time::Instant::now());
            self.add_new_pythons()?;
        }
        Ok(self.samples.borrow().len())
    }

    /// --idle: one pass of the thread iterator, one round of samples.
    fn sample_every_thread(&self) -> Result<()> {
        let links = self.links.borrow();
        let iter = links.first().context("the thread iterator is not attached")?;
        let mut pass = libbpf_rs::Iter::new(iter).context("failed to start a pass over the threads")?;
        std::io::Read::read_to_end(&mut pass, &mut Vec::new()).context("failed to sample the threads")?;
        Ok(())
    }

    /// Stops sampling; the maps stay readable.
    pub fn detach(&self) {
        if self.links.borrow().is_empty() {
            return;
        }
        // Per sample received, so the program's runs for other processes (it
        // fires on every CPU and returns at once for them) count too.
        let received = self.samples.borrow().len().max(1) as u64;
        let program = if self.opts.idle { &self.skel.progs.sample_all_threads } else { &self.skel.progs.sample_thread };
        self.bpf_ns_per_sample.set(super::bpf_run_stats(program).map(|(ns, _)| ns / received));
        self.links.borrow_mut().clear();
    }

    /// Detaches (if not yet done), names kernel frames and returns every
    /// sample. The ring buffer built with `add_to` must have been drained
    /// and dropped.
    pub fn finish(self) -> Result<SampleData> {
        self.detach();
        let kernel = self.opts.kernel.then(|| resolve_kernel_stacks(&self.skel.maps.kernel_stacks, &self.kernel_frames.borrow()));
        let mut samples = self.samples.into_inner();
        if let Some(kernel) = kernel {
            expand_kernel_frames(&mut samples, &kernel);
        }
        let mut names = vec![
            ("lost", sample_counter::SAMPLE_LOST.0),
            ("bad_frame", sample_counter::SAMPLE_BAD_FRAME.0),
            ("no_thread_state", sample_counter::SAMPLE_NO_THREAD.0),
        ];
        if self.opts.native {
            names.push(("native_no_user_regs", sample_counter::SAMPLE_NO_USER_REGS.0));
            names.push(("native_on_cpu", sample_counter::SAMPLE_NATIVE_ON_CPU.0));
        }
        let mut counters = read_counters(&self.skel.maps.counters, &names)?;
        if let Some(native) = self.native.into_inner() {
            let c = native.counts;
            counters.extend([
                ("native_unavailable", c.unavailable),
                ("native_stack_cut", c.stack_cut),
                ("native_unwind_lost", c.unwind_lost),
                ("native_unmatched", c.unmatched),
            ]);
        }
        Ok(SampleData { samples, counters, bpf_ns_per_sample: self.bpf_ns_per_sample.get() })
    }
}

/// Loads and attaches, calls `attached` once live, samples until
/// `keep_going` says stop; `progress` sees the sample count as it grows.
pub fn run<'a>(
    targets: Targets<'a>,
    opts: &Options,
    attached: impl FnOnce() -> Result<()>,
    mut keep_going: impl FnMut(usize) -> Result<bool>,
) -> Result<SampleData> {
    let mut object = MaybeUninit::uninit();
    let session = Session::start(&mut object, targets, opts)?;
    let mut builder = RingBufferBuilder::new();
    session.add_to(&mut builder)?;
    let ring = builder.build()?;

    attached()?;
    let mut between_polls = || -> Result<bool> {
        let samples = session.between_polls()?;
        keep_going(samples)
    };
    let polled = if opts.idle {
        // One pass of the iterator over every thread is one round of
        // samples; run it at the sampling rate.
        let period = std::time::Duration::from_secs_f64(1.0 / opts.hz as f64);
        let mut next = std::time::Instant::now();
        let mut run = || -> Result<()> {
            let mut last_check = std::time::Instant::now();
            let mut go = between_polls()?;
            while go {
                let now = std::time::Instant::now();
                if now >= next {
                    session.sample_every_thread()?;
                    next += period;
                    if next < now {
                        next = now + period;
                    }
                }
                let _ = ring.poll(next.saturating_duration_since(std::time::Instant::now()));
                ring.consume()?;
                if last_check.elapsed() >= std::time::Duration::from_millis(100) {
                    last_check = std::time::Instant::now();
                    go = between_polls()?;
                }
            }
            ring.consume()?;
            Ok(())
        };
        run()
    } else {
        poll_until(&ring, "sample", between_polls)
    };
    session.detach();
    polled?;
    drop(ring);
    session.finish()
}

/// &_PyRuntime.interpreters.head and &PyCode_Type in the target, once its
/// interpreter file is mapped.
fn runtime_addresses(pid: u32, python: &Python) -> Result<(u64, Option<u64>)> {
    let maps = proc::file_mappings(pid)?;
    let first = maps
        .iter()
        .find(|m| m.path == python.target_path && m.offset == 0)
        .context("interpreter not mapped yet")?;
    let bias = python.elf.load_bias(first.start)?;
    let head = python.symbol(RUNTIME_SYMBOL)?.wrapping_add(bias) + python.layout.runtime_interpreters_head as u64;
    Ok((head, python.elf.symbol("PyCode_Type").map(|t| t.wrapping_add(bias))))
}

/// Kernel stack ids to function names, innermost first.
fn resolve_kernel_stacks(map: &dyn MapCore, ids: &HashMap<i32, Vec<u64>>) -> HashMap<i32, Vec<String>> {
    let symbols = KernelSymbols::load();
    let mut out = HashMap::new();
    for &id in ids.keys() {
        let Ok(Some(bytes)) = map.lookup(&(id as u32).to_ne_bytes(), MapFlags::ANY) else { continue };
        let names = bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .take_while(|&ip| ip != 0)
            .map(|ip| symbols.name(ip))
            .collect();
        out.insert(id, names);
    }
    out
}

fn expand_kernel_frames(samples: &mut [Sample], kernel: &HashMap<i32, Vec<String>>) {
    let mut cache: HashMap<i32, Vec<Rc<Frame>>> = HashMap::new();
    for s in samples.iter_mut() {
        let Some(Frame::Kernel(label)) = s.frames.last().map(|f| f.as_ref()) else { continue };
        let Some(id) = label.strip_prefix("#stack").and_then(|n| n.parse::<i32>().ok()) else { continue };
        s.frames.pop();
        let frames = cache.entry(id).or_insert_with(|| {
            // Outermost (syscall entry) first, like the Python frames.
            kernel.get(&id).map(|names| names.iter().rev().map(|n| Rc::new(Frame::Kernel(n.clone()))).collect()).unwrap_or_default()
        });
        s.frames.extend(frames.iter().cloned());
    }
}

/// /proc/kallsyms, for kernel stacks.
struct KernelSymbols {
    sorted: Vec<(u64, String)>,
}

impl KernelSymbols {
    fn load() -> Self {
        let mut sorted: Vec<(u64, String)> = std::fs::read_to_string("/proc/kallsyms")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then(|| (addr, name.to_string()))
            })
            .collect();
        sorted.sort();
        Self { sorted }
    }

    fn name(&self, ip: u64) -> String {
        match self.sorted.partition_point(|(a, _)| *a <= ip) {
            0 => format!("{ip:#x}"),
            i => self.sorted[i - 1].1.clone(),
        }
    }
}
