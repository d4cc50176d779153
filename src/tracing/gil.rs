//! The `gil` BPF session (bpf/gil.bpf.c): uprobes where CPython takes and
//! drops the GIL, per-thread sums in BPF maps, read once at the end.

use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use super::{attach_error, ensure_still_running, entry_probe_offset, monotonic_ns, read_counters, Links, Tracing};
use crate::bpf::gil::types::{bss, gil_blame_key, gil_counter, gil_function, gil_state, gil_thread, gil_wait_key, gil_window, py_layout};
use crate::bpf::gil::{GilSkel, GilSkelBuilder};
use crate::model::counters::Counters;
use crate::model::counters::Kind::{Lost, Refused};
use crate::model::latency;
use crate::process::proc::Memory;
use crate::python::reading::code::Code;
use crate::python::probes::gil_sites::GilSites;
use crate::python::layouts::NO_FIELD;
use crate::python::Python;

/// The static functions of Python/ceval_gil.c every GIL hand-over goes
/// through, in every supported version: the only caller of
/// pthread_cond_timedwait (take_gil) and the one that unlocks (drop_gil).
const TAKE_GIL: &str = "take_gil";
const DROP_GIL: &str = "drop_gil";

/// Where the probes go (link-time addresses in the interpreter's file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GilProbes {
    /// A build whose symbol table names both functions: their entries and
    /// returns.
    Symbols { take_gil: u64, drop_gil: u64 },
    /// A stripped build (python/probes/gil_sites.rs): both functions found by
    /// their exported callers, and the copies of drop_gil inlined elsewhere
    /// seen where they signal the GIL's condition variable.
    CodeSearch(GilSites),
}

impl GilProbes {
    /// How the report names the way it saw the GIL.
    pub fn describe(&self) -> &'static str {
        match self {
            GilProbes::Symbols { .. } => "uprobes on take_gil and drop_gil",
            GilProbes::CodeSearch(_) => "uprobes on take_gil, drop_gil and the GIL's condition variable, found by code search",
        }
    }

    /// Where the probes go, for `info`.
    pub fn sites(&self) -> String {
        match self {
            GilProbes::Symbols { take_gil, drop_gil } => format!("take_gil at {take_gil:#x}, drop_gil at {drop_gil:#x}, by symbol"),
            GilProbes::CodeSearch(s) => {
                let signals = match s.signal_calls.len() {
                    0 => format!("pthread_cond_signal's PLT stub at {:#x}", s.cond_signal),
                    n => format!("the {n} calls of pthread_cond_signal's PLT stub at {:#x}", s.cond_signal),
                };
                format!("take_gil at {:#x}, drop_gil at {:#x}, {signals}, pthread_cond_wait's stub at {:#x}", s.take_gil, s.drop_gil, s.cond_wait)
            }
        }
    }

    fn take_gil(&self) -> u64 {
        match self {
            GilProbes::Symbols { take_gil, .. } | GilProbes::CodeSearch(GilSites { take_gil, .. }) => *take_gil,
        }
    }

    fn drop_gil(&self) -> u64 {
        match self {
            GilProbes::Symbols { drop_gil, .. } | GilProbes::CodeSearch(GilSites { drop_gil, .. }) => *drop_gil,
        }
    }
}

/// The probe points in this interpreter, or the one sentence saying why
/// `gil` cannot measure it.
pub fn probe_points(python: &Python) -> Result<GilProbes> {
    if python.free_threaded {
        bail!(
            "Python {} ({}) is a free-threaded build: it has no GIL, so there is nothing for `pytrace gil` to measure",
            python.version,
            python.target_path
        );
    }
    if let (Some(take_gil), Some(drop_gil)) = (python.elf.symbol(TAKE_GIL), python.elf.symbol(DROP_GIL)) {
        return Ok(GilProbes::Symbols { take_gil, drop_gil });
    }
    match python.gil_sites() {
        Ok(sites) => Ok(GilProbes::CodeSearch(sites)),
        Err(missing) => bail!(
            "{} (Python {}) has no symbol table naming {TAKE_GIL} and {DROP_GIL}, and its code does not show them either ({missing}), so `pytrace gil` probes nothing rather than guess; `pytrace sample --idle --states` shows who runs and who waits for the GIL, sampled",
            python.target_path,
            python.version
        ),
    }
}

/// A bucket of the wait distribution: (lowest value, width, count) in ns.
pub type WaitBucket = (u64, u64, u64);

/// One thread's time with the GIL inside the session.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct ThreadGil {
    pub tid: u32,
    pub name: String,
    pub held_ns: u64,
    pub wait_ns: u64,
    pub released_ns: u64,
    /// From its first moment in the session (the start, or its creation) to
    /// its exit or the end: held + wait + released.
    pub lifetime_ns: u64,
    pub exited: bool,
    pub acquisitions: u64,
    pub switches: u64,
    pub drops: u64,
    /// Reported as the distribution's max.
    #[serde(skip)]
    pub max_wait_ns: u64,
    /// The waits before each acquisition, by lowest value (wait_bucket in
    /// bpf/histogram.bpf.h); reported as percentiles.
    #[serde(skip)]
    pub wait_buckets: Vec<WaitBucket>,
}

/// A Python function, as its code object names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionName {
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// Where a thread was when it asked for the GIL, or let it go: a
/// function, or why none is named.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    Function(FunctionName),
    /// No Python frame was running (a thread starting, C code with no
    /// Python caller) or the thread's first event came before it could be
    /// read.
    NoFrame,
    /// The frame pointed at something that is not (or no longer) a code
    /// object when pytrace read it.
    Unreadable,
}

/// Per function: the GIL waits of calls that asked for it there, the
/// holding periods that ended there, and who held the GIL meanwhile.
#[derive(Debug, Clone, Default)]
pub struct FunctionGil {
    pub wait_ns: u64,
    pub held_ns: u64,
    pub blocked_by: HashMap<Place, u64>,
}

pub struct GilData {
    pub threads: Vec<ThreadGil>,
    pub functions: HashMap<Place, FunctionGil>,
    pub counters: Counters,
    /// The session's window, CLOCK_MONOTONIC.
    pub window_ns: u64,
}

/// A loaded and attached gil program. Nothing is counted until `open`
/// (called as the target is let run) opens the window, once every probe is
/// attached: no thread is cut at an entry whose return was missed.
pub struct Session<'obj, 'p> {
    skel: GilSkel<'obj>,
    /// The program's .bss, where the window goes: out of the skeleton, so
    /// that it can be set while the session is driven.
    bss: RefCell<Option<&'obj mut bss>>,
    links: Links,
    /// Code objects are named while the target lives (it may exit first).
    names: RefCell<CodeNames<'p>>,
    /// To 3.11 on a stripped build: the runtime's GIL, whose condition
    /// variables the drop probes look for, once the target maps it.
    runtime_gil: RefCell<Option<RuntimeGil<'p>>>,
    /// TID → threading.Thread.name, as last read while the target ran: a
    /// thread that ended (always, by the end of a `--` command) is gone
    /// from `threading._active`, and one reading can fail (a dict caught
    /// mid-resize is refused), so the names are read at every poll and
    /// each one kept from the last reading that had it.
    thread_names: RefCell<HashMap<u32, String>>,
}

/// The runtime's one GIL (3.9 to 3.11), at its run-time address: known
/// once the interpreter's file is mapped (a launched command with a shared
/// libpython maps it only as it starts; until then drops go unseen, and
/// are counted as such).
struct RuntimeGil<'p> {
    pid: u32,
    python: &'p Python,
}

impl Session<'_, '_> {
    /// Reads the threads' Python names now, keeping every earlier one the
    /// reading lacks (a thread that ended; nothing, when it failed).
    fn read_thread_names(&self) {
        let names = self.names.borrow();
        if let Ok(found) = crate::python::reading::thread_names::read(names.pid, names.python) {
            self.thread_names.borrow_mut().extend(found.names);
        }
    }
}

impl RuntimeGil<'_> {
    fn address(&self) -> Option<u64> {
        let runtime = self.python.elf.symbol(crate::python::RUNTIME_SYMBOL)?;
        Some(runtime.wrapping_add(self.python.load_bias_in(self.pid).ok()?).wrapping_add(self.python.layout.gil_in_runtime as u64))
    }
}

/// A gil session to start (`Start`): on `pid`, whose Python is `python`,
/// probed at `probes`.
pub struct Plan<'p> {
    pub pid: u32,
    pub python: &'p Python,
    pub probes: GilProbes,
}

impl<'p> super::Start for Plan<'p> {
    type Data = GilData;
    type Objects = super::Object;
    type Session<'obj> = Session<'obj, 'p>;

    fn start<'obj>(self, object: &'obj mut MaybeUninit<OpenObject>) -> Result<Session<'obj, 'p>> {
        Session::start(object, self.pid, self.python, self.probes)
    }
}

impl<'obj, 'p> Session<'obj, 'p> {
    pub fn start(object: &'obj mut MaybeUninit<OpenObject>, pid: u32, python: &'p Python, probes: GilProbes) -> Result<Self> {
        let mut open = GilSkelBuilder::default().open(object).context("failed to open the gil BPF program")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the gil BPF program has no rodata")?;
        rodata.target_tgid = pid;
        rodata.layout = super::py_layout!(py_layout, &python.layout);
        rodata.gil_cond_offset = python.layout.gil_cond;
        rodata.gil_switch_cond_offset = python.layout.gil_switch_cond;
        rodata.interp_gil_offset = python.layout.gil_pointer_in_interp;
        let mut skel = crate::bpf::load::load("gil", open)?;

        let path = &python.elf.path;
        let offset_of = |addr: u64| -> Result<usize> { Ok(entry_probe_offset(python.elf.read_static(addr, 8)?, python.elf.file_offset(addr)? as usize)) };
        let what = |f: &str| format!("failed to attach to {f} in {}", python.target_path);
        let attach = |prog: &libbpf_rs::ProgramMut<'obj>, retprobe: bool, offset: usize, name: &str| -> Result<Link> {
            prog.attach_uprobe(retprobe, pid as i32, path, offset).map_err(|e| attach_error(pid, e)).with_context(|| what(name))
        };
        let p = &skel.progs;
        let (take_gil, drop_gil) = (offset_of(probes.take_gil())?, offset_of(probes.drop_gil())?);
        // Returns first: an entry seen without its return would leave a
        // thread waiting for ever.
        let mut links: Vec<Link> = vec![attach(&p.take_gil_return, true, take_gil, TAKE_GIL)?];
        if let GilProbes::CodeSearch(sites) = &probes {
            // The PLT jumps themselves, as found (not past a push: a stub has none).
            let cond_wait = python.elf.file_offset(sites.cond_wait)? as usize;
            links.push(attach(&p.gil_switch_wait_return, true, cond_wait, "pthread_cond_wait's PLT stub")?);
            links.push(attach(&p.gil_switch_wait, false, cond_wait, "pthread_cond_wait's PLT stub")?);
            // The signal's calls, which the kernel emulates, rather than the
            // stub's indirect jump, which it single-steps (gil_sites.rs).
            let signals = if sites.signal_calls.is_empty() { std::slice::from_ref(&sites.cond_signal) } else { &sites.signal_calls[..] };
            for &site in signals {
                links.push(attach(&p.gil_cond_signal, false, python.elf.file_offset(site)? as usize, "pthread_cond_signal's calls")?);
            }
        }
        links.push(attach(&p.drop_gil_return, true, drop_gil, DROP_GIL)?);
        links.push(attach(&p.drop_gil_entry, false, drop_gil, DROP_GIL)?);
        links.push(attach(&p.take_gil_entry, false, take_gil, TAKE_GIL)?);
        links.push(p.thread_exited.attach().map_err(|e| attach_error(pid, e)).context("failed to attach to the sched_process_exit tracepoint")?);
        ensure_still_running(pid)?;
        let bss = skel.maps.bss_data.take();
        let in_runtime = matches!(probes, GilProbes::CodeSearch(_)) && python.layout.gil_in_runtime != NO_FIELD;
        let runtime_gil = RefCell::new(in_runtime.then_some(RuntimeGil { pid, python }));
        Ok(Session { skel, bss: RefCell::new(bss), links: Links::new(links), names: RefCell::new(CodeNames::new(pid, python)), runtime_gil, thread_names: RefCell::default() })
    }

    /// Opens the window: every sum starts now.
    pub fn open(&self) -> Result<()> {
        self.set_runtime_gil()?;
        self.bss.borrow_mut().as_mut().context("the gil BPF program has no .bss")?.window = gil_window { start_ns: monotonic_ns(), stop_ns: 0 };
        Ok(())
    }

    /// Gives the drop probes the runtime's GIL once it is known.
    fn set_runtime_gil(&self) -> Result<()> {
        let mut pending = self.runtime_gil.borrow_mut();
        if let Some(address) = pending.as_ref().and_then(RuntimeGil::address) {
            self.bss.borrow_mut().as_mut().context("the gil BPF program has no .bss")?.known_gil = address;
            *pending = None;
        }
        Ok(())
    }
}

impl Tracing for Session<'_, '_> {
    type Data = GilData;

    fn what(&self) -> String {
        "gil".into()
    }

    /// Nothing is sent per event: the sums stay in maps until the end.
    fn add_to<'s>(&'s self, _builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        Ok(())
    }

    fn has_records(&self) -> bool {
        false
    }

    fn check_every(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn between_polls(&self) -> Result<()> {
        self.set_runtime_gil()?;
        self.names.borrow_mut().name_new(&self.skel.maps.functions);
        self.read_thread_names();
        Ok(())
    }

    fn links(&self) -> Option<&Links> {
        Some(&self.links)
    }

    /// Closes the window: every sum stops here; the maps are read after.
    fn before_detach(&self) {
        if let Some(bss) = self.bss.borrow_mut().as_mut() {
            if bss.window.stop_ns == 0 {
                bss.window.stop_ns = monotonic_ns();
            }
        }
    }

    fn finish(self) -> Result<GilData> {
        let window = self.bss.borrow().as_ref().context("the gil BPF program has no .bss")?.window;
        let (start_ns, stop_ns) = (window.start_ns, window.stop_ns);
        let mut threads = read_threads(&self.skel.maps.threads, stop_ns)?;
        let buckets = read_wait_buckets(&self.skel.maps.waits)?;
        for t in &mut threads {
            if let Some(b) = buckets.get(&t.tid) {
                t.wait_buckets = b.clone();
            }
        }
        // threading.Thread.name as last read (the BPF program saw comm).
        self.read_thread_names();
        let thread_names = self.thread_names.take();
        for t in &mut threads {
            if let Some(name) = thread_names.get(&t.tid) {
                t.name = name.clone();
            }
        }
        let mut names = self.names.into_inner();
        names.name_new(&self.skel.maps.functions);
        let functions = read_functions(&self.skel.maps.functions, &self.skel.maps.blame, &names)?;
        let counters = read_counters(
            &self.skel.maps.counters,
            &[
                ("threads_untracked", Lost, "threads not measured (thread map full)", gil_counter::GIL_THREADS_FULL.0),
                ("waits_unbucketed", Lost, "waits left out of the distribution (its map full)", gil_counter::GIL_HISTOGRAM_FULL.0),
                ("functions_untracked", Lost, "waits or holds not counted per function (function map full)", gil_counter::GIL_FUNCTIONS_FULL.0),
                ("blame_untracked", Lost, "holders' shares of a wait not counted (blame map full)", gil_counter::GIL_BLAME_FULL.0),
                ("blame_truncated", Refused, "waits longer than the last 64 hand-overs (their oldest holders not blamed)", gil_counter::GIL_BLAME_TRUNCATED.0),
                ("takes_unseen", Lost, "GIL drops by a thread no probe saw take it (held time counted as released)", gil_counter::GIL_TAKE_UNSEEN.0),
                ("drops_unseen", Lost, "GIL requests by a thread no probe saw let it go (released time counted as held)", gil_counter::GIL_DROP_UNSEEN.0),
            ],
        )?;
        Ok(GilData { threads, functions, counters, window_ns: stop_ns.saturating_sub(start_ns) })
    }
}

/// Each thread's sums, its open state closed at `stop_ns`.
fn read_threads(map: &dyn MapCore, stop_ns: u64) -> Result<Vec<ThreadGil>> {
    let mut threads = Vec::new();
    for key in map.keys() {
        let Some(value) = map.lookup(&key, MapFlags::ANY)? else { continue };
        let mut t = gil_thread::default();
        if plain::copy_from_bytes(&mut t, &value).is_err() || key.len() != 4 {
            continue;
        }
        let tid = u32::from_ne_bytes(key[..4].try_into().unwrap());
        let open = stop_ns.saturating_sub(t.since_ns);
        match t.state {
            s if s == gil_state::GIL_HELD.0 => t.held_ns += open,
            s if s == gil_state::GIL_WAITING.0 => t.wait_ns += open,
            s if s == gil_state::GIL_RELEASED.0 => t.released_ns += open,
            _ => {}
        }
        let end = if t.exit_ns != 0 { t.exit_ns } else { stop_ns };
        let name_bytes: Vec<u8> = t.comm.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
        threads.push(ThreadGil {
            tid,
            name: String::from_utf8_lossy(&name_bytes).into_owned(),
            held_ns: t.held_ns,
            wait_ns: t.wait_ns,
            released_ns: t.released_ns,
            lifetime_ns: end.saturating_sub(t.first_ns),
            exited: t.exit_ns != 0,
            acquisitions: t.acquisitions,
            switches: t.switches,
            drops: t.drops,
            max_wait_ns: t.max_wait_ns,
            wait_buckets: Vec::new(),
        });
    }
    threads.sort_by_key(|t| t.tid);
    Ok(threads)
}

/// Names of the code objects the probes saw, read from the target's memory
/// when first seen (only a real code object, by its type, is named).
struct CodeNames<'p> {
    pid: u32,
    python: &'p Python,
    layout: crate::python::Layout,
    code_type: Option<u64>,
    mem: Option<Memory>,
    names: HashMap<u64, Place>,
}

impl<'p> CodeNames<'p> {
    fn new(pid: u32, python: &'p Python) -> Self {
        CodeNames { pid, python, layout: python.layout.clone(), code_type: None, mem: None, names: HashMap::new() }
    }

    /// Names every code object in `functions` not named yet.
    fn name_new(&mut self, functions: &dyn MapCore) {
        if self.mem.is_none() {
            self.mem = Memory::open(self.pid).ok();
        }
        // A command pytrace started maps its libpython only once it runs.
        if self.code_type.is_none() {
            self.code_type = self.python.elf.symbol("PyCode_Type").and_then(|t| Some(t.wrapping_add(self.python.load_bias_in(self.pid).ok()?)));
        }
        for key in functions.keys() {
            let Ok(addr) = <[u8; 8]>::try_from(&key[..]).map(u64::from_ne_bytes) else { continue };
            if self.names.contains_key(&addr) {
                continue;
            }
            let place = self.read(addr);
            // A process gone leaves later codes to be called unreadable at the end.
            if place != Place::Unreadable || !crate::process::proc::is_running(self.pid) {
                self.names.insert(addr, place);
            }
        }
    }

    fn read(&self, addr: u64) -> Place {
        if addr == 0 {
            return Place::NoFrame;
        }
        let Some(mem) = &self.mem else { return Place::Unreadable };
        let is_code = self.code_type.is_some_and(|t| mem.read_u64(addr + self.layout.object_type as u64).ok() == Some(t));
        match Code::read(mem, &self.layout, addr) {
            Ok(code) if is_code => Place::Function(FunctionName { name: code.qualname, file: code.filename, line: code.firstlineno }),
            _ => Place::Unreadable,
        }
    }

    fn place(&self, addr: u64) -> Place {
        self.names.get(&addr).cloned().unwrap_or(if addr == 0 { Place::NoFrame } else { Place::Unreadable })
    }
}

/// The functions' sums and blame, merged by name (several code objects
/// can name one function, and unreadable ones are one row).
fn read_functions(functions: &dyn MapCore, blame: &dyn MapCore, names: &CodeNames) -> Result<HashMap<Place, FunctionGil>> {
    let mut by_place: HashMap<Place, FunctionGil> = HashMap::new();
    for key in functions.keys() {
        let Ok(addr) = <[u8; 8]>::try_from(&key[..]).map(u64::from_ne_bytes) else { continue };
        let Some(value) = functions.lookup(&key, MapFlags::ANY)? else { continue };
        let mut f = gil_function::default();
        if plain::copy_from_bytes(&mut f, &value).is_err() {
            continue;
        }
        let row = by_place.entry(names.place(addr)).or_default();
        row.wait_ns += f.wait_ns;
        row.held_ns += f.held_ns;
    }
    for key in blame.keys() {
        let mut k = gil_blame_key::default();
        if plain::copy_from_bytes(&mut k, &key).is_err() {
            continue;
        }
        let Some(value) = blame.lookup(&key, MapFlags::ANY)? else { continue };
        let Ok(ns) = <[u8; 8]>::try_from(&value[..]).map(u64::from_ne_bytes) else { continue };
        *by_place.entry(names.place(k.waiter_code)).or_default().blocked_by.entry(names.place(k.holder_code)).or_default() += ns;
    }
    Ok(by_place)
}

/// The wait distribution of every thread, by TID.
fn read_wait_buckets(map: &dyn MapCore) -> Result<HashMap<u32, Vec<WaitBucket>>> {
    let mut by_thread: HashMap<u32, Vec<WaitBucket>> = HashMap::new();
    for key in map.keys() {
        let mut k = gil_wait_key::default();
        if plain::copy_from_bytes(&mut k, &key).is_err() {
            continue;
        }
        let Some(value) = map.lookup(&key, MapFlags::ANY)? else { continue };
        let Ok(count) = <[u8; 8]>::try_from(&value[..]) else { continue };
        let (low, width) = latency::bucket_range(k.bucket as usize);
        by_thread.entry(k.tid).or_default().push((low, width, u64::from_ne_bytes(count)));
    }
    for buckets in by_thread.values_mut() {
        buckets.sort_unstable();
    }
    Ok(by_thread)
}

// SAFETY: plain integer structs generated from bpf/gil.h.
unsafe impl plain::Plain for gil_thread {}
unsafe impl plain::Plain for gil_wait_key {}
unsafe impl plain::Plain for gil_function {}
unsafe impl plain::Plain for gil_blame_key {}
