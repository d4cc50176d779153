//! The `calls` BPF session (bpf/calls.bpf.c): load it for one target, attach
//! it in uprobe or USDT mode, and turn its maps into per-function totals.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBufferBuilder, UprobeOpts};

use super::{attach_entry_and_return, attach_error, entry_probe_offset, ensure_still_running, has_uprobe_sessions, monotonic_ns, read_counters, CounterRow, Links, Tracing};
use crate::bpf::calls::types::{bss, calls_counter, edge_key, edge_stats, func_key, func_stats, new_function, py_layout, slot_flag, thread_stack};
use crate::bpf::calls::{CallsSkel, CallsSkelBuilder};
use crate::model::counters::Kind::{Informational, Lost, Refused};
use crate::model::functions::{CallEdge, CallsData, EdgeStats, Function, FunctionId, FunctionStats};
use crate::model::latency::{self, Latency};
use crate::python::layouts::NO_FIELD;
use crate::python::probes::eval_entry::EvalProbe;
use crate::python::probes::generator_close::CloseProbe;
use crate::python::probes::inlined_init::InitProbe;
use crate::python::reading::strings;
use crate::python::{Python, EVAL_FRAME_SYMBOL};

pub use super::Mode;

/// Counters from bpf/calls.h's enum calls_counter: name, kind, meaning.
const COUNTERS: [CounterRow; 17] = [
    ("new_function_lost", Lost, "functions' names lost (ring buffer full)", calls_counter::CALLS_NEW_FUNCTION_LOST.0),
    ("function_map_full", Lost, "calls of functions past the function map's size (or that the kernel had no memory to add), not counted", calls_counter::CALLS_FUNCTION_MAP_FULL.0),
    ("thread_map_full", Lost, "calls on threads past the thread map's size: not timed, and not counted where the eval-frame probe saw them", calls_counter::CALLS_THREAD_MAP_FULL.0),
    ("bad_code_object", Refused, "evaluations of unreadable code objects", calls_counter::CALLS_BAD_CODE.0),
    ("unmatched_return", Refused, "returns from calls made before tracing began", calls_counter::CALLS_UNMATCHED_RETURN.0),
    ("deep_untimed_calls", Informational, "calls deeper than the timed stack, counted but not timed", calls_counter::CALLS_DEEP_UNTIMED.0),
    ("stop_failed", Refused, "failures to stop the command at its first evaluation", calls_counter::CALLS_STOP_FAILED.0),
    ("inferred_returns", Informational, "returns no probe saw, timed to the thread's next event", calls_counter::CALLS_INFERRED_RETURN.0),
    ("stack_resyncs", Informational, "times the shadow stack was resynchronised with the interpreter's", calls_counter::CALLS_STACK_RESYNC.0),
    ("inlined_init_calls", Informational, "__init__ calls run inline, counted untimed", calls_counter::CALLS_INLINED_INIT.0),
    ("inlined_getitem_calls", Informational, "__getitem__ calls run inline, timed to the next event", calls_counter::CALLS_INLINED_CALL.0),
    ("skipped_close_calls", Informational, "generator frames close() skipped, counted untimed", calls_counter::CALLS_SKIPPED_CLOSE.0),
    ("evaluations", Informational, "frame evaluations", calls_counter::CALLS_EVALUATIONS.0),
    ("child_map_full", Refused, "forked children not followed (child map full)", calls_counter::CALLS_CHILD_MAP_FULL.0),
    ("thread_exits", Informational, "threads that exited", calls_counter::CALLS_THREAD_EXITS.0),
    ("edge_map_full", Lost, "calls in no caller edge (edge map full)", calls_counter::CALLS_EDGE_MAP_FULL.0),
    ("edge_no_caller", Lost, "calls in no caller edge (caller deeper than the timed stack)", calls_counter::CALLS_EDGE_NO_CALLER.0),
];

/// A calls session to start (`Start`): on `pid`, whose Python is `python`,
/// seen in `mode`.
pub struct Plan<'a> {
    pub pid: u32,
    pub python: &'a Python,
    pub mode: Mode,
    /// Stop the target at its first frame evaluation, so the eval-frame hook
    /// can be set before any Python code runs (see bpf/calls.h).
    pub stop_at_first_eval: bool,
    /// Attach programs that return at once (scripts/bench.sh's floor).
    pub empty_probe: bool,
    /// Count caller->callee edges too (`calls --pstats`): a hash lookup
    /// more at each call and return.
    pub count_edges: bool,
    /// Told of the processes the target forks while traced. Owned, so that
    /// a plan outlives whoever made it (a pair of plans is made by one
    /// caller and started by the driver).
    pub children: Box<dyn ChildWatch>,
}

/// Who is told of the processes the target forks while traced: they
/// inherit the eval-frame hook, which the hook's guardian
/// (src/session/hook.rs) must put back in them too.
pub trait ChildWatch {
    /// Given the map of followed children once loaded, before anything is
    /// attached: the guardian keeps it, so it knows every child the moment
    /// the fork happens, not at the next poll.
    fn share_map(&self, map: std::os::fd::BorrowedFd<'_>);

    /// Told each child as the poll loop finds it.
    fn forked(&self, child: u32);
}

impl super::Start for Plan<'_> {
    type Data = CallsData;
    type Objects = super::Object;
    type Session<'obj> = Session<'obj>;

    fn start<'obj>(self, object: &'obj mut MaybeUninit<OpenObject>) -> Result<Session<'obj>> {
        Session::start(object, self)
    }
}

type Names = HashMap<(u64, u64, u32), (String, String)>;

/// How long a probe that saw `counting` set just before it was cleared
/// may still be changing the maps: one program run is microseconds, so
/// this is many times that even for a preempted one on a loaded machine.
const PROBES_SETTLE: Duration = Duration::from_millis(5);

/// The calls program loaded and attached to one target, in steps that the
/// session driver (src/session/driver.rs) runs, alone or beside the sampler.
pub struct Session<'obj> {
    skel: CallsSkel<'obj>,
    links: Links,
    /// The stop at a command's first evaluation, on the eval function's
    /// entry, where the hook points at a jump to it (attach_first_eval).
    first_eval: RefCell<Option<Link>>,
    names: RefCell<Names>,
    /// Children of the target already told to `children`.
    children_seen: RefCell<std::collections::HashSet<u32>>,
    children: Box<dyn ChildWatch>,
    /// The program's .bss, where `counting` opens and closes the window.
    bss: RefCell<&'obj mut bss>,
    /// When counting stopped (CLOCK_MONOTONIC ns): the calls still open
    /// then are closed there. 0 while it runs.
    stopped_ns: Cell<u64>,
    pid: u32,
}

impl<'obj> Session<'obj> {
    /// Loads the program into `object` and attaches it: from here on every
    /// call of the target is seen.
    pub fn start(object: &'obj mut MaybeUninit<OpenObject>, plan: Plan<'_>) -> Result<Self> {
        let mut open = CallsSkelBuilder::default().open(object).context("failed to open the calls BPF program")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the calls BPF program has no rodata")?;
        rodata.cfg.layout = super::py_layout!(py_layout, &plan.python.layout);
        // How much of a frame and of a code object covers every field read.
        let end = |offsets: &[u32]| offsets.iter().filter(|&&o| o != NO_FIELD).map(|o| o + 8).max().unwrap_or(8);
        let l = &plan.python.layout;
        rodata.cfg.frame_head = end(&[l.frame_code, l.frame_owner]);
        rodata.cfg.code_head = end(&[l.object_type, l.code_flags, l.code_firstlineno, l.code_qualname, l.code_filename]);
        rodata.cfg.tgid = plan.pid;
        rodata.cfg.code_type = plan.python.code_type_address().unwrap_or(0);
        rodata.cfg.stop_at_first_eval = plan.stop_at_first_eval as u64;
        rodata.cfg.empty_probe = plan.empty_probe as u64;
        rodata.cfg.heaptype_spec_init = l.heaptype_spec_init;
        rodata.cfg.function_code = l.function_code;
        rodata.cfg.gen_iframe = l.gen_iframe;
        rodata.cfg.count_edges = plan.count_edges as u32;
        if !plan.count_edges {
            // Preallocated: 13 MB for nothing.
            open.maps.edges.set_max_entries(1).context("failed to size the calls edge map")?;
        }
        // Load only the programs this kernel and mode can run: a session
        // program does not load where the kernel has no uprobe sessions,
        // nor one with a compare-and-swap before Linux 5.12 (those kernels
        // get the *_no_cas twins).
        let sessions = has_uprobe_sessions();
        let cas = has_compare_and_swap();
        let uprobe_mode = plan.mode == Mode::Uprobe;
        open.progs.eval_frame.set_autoload(uprobe_mode && sessions);
        open.progs.eval_entry.set_autoload(uprobe_mode && !sessions && cas);
        open.progs.eval_return.set_autoload(uprobe_mode && !sessions && cas);
        open.progs.eval_entry_no_cas.set_autoload(uprobe_mode && !sessions && !cas);
        open.progs.eval_return_no_cas.set_autoload(uprobe_mode && !sessions && !cas);
        open.progs.usdt_function_entry.set_autoload(!uprobe_mode && cas);
        open.progs.usdt_function_return.set_autoload(!uprobe_mode && cas);
        open.progs.usdt_function_entry_no_cas.set_autoload(!uprobe_mode && !cas);
        open.progs.usdt_function_return_no_cas.set_autoload(!uprobe_mode && !cas);
        let inlined_init = plan.python.inlined_init_probe().filter(|_| uprobe_mode);
        open.progs.inlined_init.set_autoload(inlined_init.is_some());
        let cookies = has_attach_cookies();
        open.progs.inline_frame.set_autoload(uprobe_mode && cookies && plan.python.inlined_getitem_probe().is_some());
        open.progs.skipped_close.set_autoload(uprobe_mode && cookies && matches!(plan.python.skipped_close_probe(), CloseProbe::Sites(_)));
        let stop_at_entry = uprobe_mode && plan.stop_at_first_eval && matches!(plan.python.eval_probe(), EvalProbe::TailJump(_));
        open.progs.first_eval.set_autoload(stop_at_entry);
        let mut skel = crate::bpf::load::load("calls", open)?;
        plan.children.share_map(std::os::fd::AsFd::as_fd(&skel.maps.children));
        let bss = skel.maps.bss_data.take().context("the calls BPF program has no .bss")?;
        let links = attach(&skel.progs, &plan)?;
        let first_eval = match stop_at_entry {
            true => Some(attach_first_eval(&skel.progs, &plan)?),
            false => None,
        };
        Ok(Session {
            skel,
            links: Links::new(links),
            first_eval: RefCell::new(first_eval),
            names: RefCell::new(HashMap::new()),
            children_seen: RefCell::new(Default::default()),
            children: plan.children,
            bss: RefCell::new(bss),
            stopped_ns: Cell::new(0),
            pid: plan.pid,
        })
    }

    /// Opens the window: calls are counted from here on (once the hook is
    /// set, on an interpreter that needs it).
    pub fn start_counting(&self) {
        let mut bss = self.bss.borrow_mut();
        // SAFETY: a mapped .bss field the probes read; volatile so that the
        // store is made, now.
        unsafe { std::ptr::write_volatile(&mut bss.counting, 1) };
    }

    /// Closes the window: no probe changes anything after this returns
    /// (PROBES_SETTLE), though the probes stay attached. Idempotent.
    pub fn stop_counting(&self) {
        if self.stopped_ns.get() != 0 {
            return;
        }
        {
            let mut bss = self.bss.borrow_mut();
            // SAFETY: as in start_counting.
            unsafe { std::ptr::write_volatile(&mut bss.counting, 0) };
        }
        self.stopped_ns.set(monotonic_ns());
        std::thread::sleep(PROBES_SETTLE);
    }

    /// Between polls: tells `plan.children` of the target's new children.
    pub fn between_polls(&self) {
        for key in self.skel.maps.children.keys() {
            let Ok(bytes) = <[u8; 4]>::try_from(key.as_slice()) else { continue };
            let child = u32::from_ne_bytes(bytes);
            if self.children_seen.borrow_mut().insert(child) {
                self.children.forked(child);
            }
        }
    }

    /// Adds this session's ring buffer (new functions' names) to `builder`.
    pub fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        builder.add(&self.skel.maps.new_functions, |bytes: &[u8]| {
            record_name(&mut self.names.borrow_mut(), bytes);
            0
        })?;
        Ok(())
    }

    /// The totals so far, while the probes run (`pytrace top --calls`).
    pub fn functions_so_far(&self) -> Result<Vec<Function>> {
        functions(&self.skel, &self.names.borrow())
    }

    /// Events lost or refused so far.
    pub fn lost_so_far(&self) -> Result<u64> {
        Ok(read_counters(&self.skel.maps.counters, &COUNTERS)?.lost())
    }
}

impl Tracing for Session<'_> {
    type Data = CallsData;

    fn what(&self) -> String {
        "calls".into()
    }

    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        Session::add_to(self, builder)
    }

    fn between_polls(&self) -> Result<()> {
        Session::between_polls(self);
        Ok(())
    }

    fn links(&self) -> Option<&Links> {
        Some(&self.links)
    }

    fn start_counting(&self) {
        Session::start_counting(self)
    }

    fn hook_set(&self) {
        drop(self.first_eval.borrow_mut().take());
    }

    fn stop_counting(&self) {
        Session::stop_counting(self)
    }

    /// The totals, with the calls still open when counting stopped closed
    /// there (as cProfile closes them when it is disabled).
    fn finish(self) -> Result<CallsData> {
        collect(&self.skel, &self.names.into_inner(), self.pid, self.stopped_ns.get())
    }
}

/// The probe that stops a command pytrace starts at its first frame
/// evaluation, on the eval function's own entry, where the hook points at
/// a jump to it (first_eval in bpf/calls.bpf.c): dropped once the hook is
/// set (`hook_set`).
fn attach_first_eval(progs: &crate::bpf::calls::CallsProgs, plan: &Plan) -> Result<Link> {
    let python = plan.python;
    let addr = python.symbol(EVAL_FRAME_SYMBOL)?;
    let offset = python.elf.file_offset(addr)? as usize;
    progs
        .first_eval
        .attach_uprobe(false, plan.pid as i32, &python.elf.path, offset)
        .map_err(|e| attach_error(plan.pid, e))
        .with_context(|| format!("failed to attach to {EVAL_FRAME_SYMBOL}'s entry in {}", python.target_path))
}

fn attach(progs: &crate::bpf::calls::CallsProgs, plan: &Plan) -> Result<Vec<Link>> {
    let python = plan.python;
    let path = &python.elf.path;
    let pid = plan.pid as i32;
    let exited = |e| attach_error(plan.pid, e);
    let links = match plan.mode {
        Mode::Uprobe => {
            // The function's entry, or the jump to it that the hook points
            // at where the entry would be single-stepped (eval_entry.rs).
            let offset = match python.eval_probe() {
                EvalProbe::TailJump(at) => python.elf.file_offset(at)? as usize,
                EvalProbe::Entry { .. } => {
                    let addr = python.symbol(EVAL_FRAME_SYMBOL)?;
                    entry_probe_offset(python.elf.read_static(addr, 8)?, python.elf.file_offset(addr)? as usize)
                }
            };
            let what = || format!("failed to attach to {EVAL_FRAME_SYMBOL} in {}", python.target_path);
            // See eval_frame in bpf/calls.bpf.c for why a session.
            let (entry, ret) = if has_compare_and_swap() { (&progs.eval_entry, &progs.eval_return) } else { (&progs.eval_entry_no_cas, &progs.eval_return_no_cas) };
            let mut links = attach_entry_and_return(&progs.eval_frame, entry, ret, plan.pid, path, offset).with_context(what)?;
            if let Some(probe) = python.inlined_init_probe() {
                let offset = match probe {
                    InitProbe::Function(addr) => entry_probe_offset(python.elf.read_static(addr, 8)?, python.elf.file_offset(addr)? as usize),
                    // A call instruction: the kernel emulates it.
                    InitProbe::CallSite(addr) => python.elf.file_offset(addr)? as usize,
                };
                links.push(
                    progs
                        .inlined_init
                        .attach_uprobe(false, pid, path, offset)
                        .map_err(exited)
                        .with_context(|| format!("failed to attach to the allocation of inlined __init__ calls in {}", python.target_path))?,
                );
            }
            // Calls some builds run without entering the eval function
            // (the kernel emulates the branches these sit on).
            let with_cookie = |cookie| UprobeOpts { cookie, ..Default::default() };
            if let Some(probe) = python.inlined_getitem_probe().filter(|_| has_attach_cookies()) {
                let offset = python.elf.file_offset(probe.address)? as usize;
                links.push(
                    progs
                        .inline_frame
                        .attach_uprobe_with_opts(pid, path, offset, with_cookie(probe.frame_register as u64))
                        .map_err(exited)
                        .with_context(|| format!("failed to attach to BINARY_SUBSCR_GETITEM's inlined calls in {}", python.target_path))?,
                );
            }
            if let (CloseProbe::Sites(sites), true) = (python.skipped_close_probe(), has_attach_cookies()) {
                for site in sites {
                    let offset = python.elf.file_offset(site.address)? as usize;
                    let cookie = site.gen_register as u64 | (site.fast_when_zf as u64) << 8;
                    links.push(
                        progs
                            .skipped_close
                            .attach_uprobe_with_opts(pid, path, offset, with_cookie(cookie))
                            .map_err(exited)
                            .with_context(|| format!("failed to attach to generator close()'s fast path in {}", python.target_path))?,
                    );
                }
            }
            links
        }
        Mode::Usdt => {
            let what = |probe| format!("failed to attach to the USDT probe python:{probe} in {}", python.target_path);
            let (entry, ret) = if has_compare_and_swap() {
                (&progs.usdt_function_entry, &progs.usdt_function_return)
            } else {
                (&progs.usdt_function_entry_no_cas, &progs.usdt_function_return_no_cas)
            };
            vec![
                entry
                    .attach_usdt(pid, path, "python", "function__entry")
                    .map_err(exited)
                    .with_context(|| what("function__entry"))?,
                ret
                    .attach_usdt(pid, path, "python", "function__return")
                    .map_err(exited)
                    .with_context(|| what("function__return"))?,
            ]
        }
    };
    // Every mode: exited threads leave the thread map, forks are followed.
    let mut links = links;
    links.push(progs.task_exited.attach().context("failed to attach to the sched_process_exit tracepoint")?);
    links.push(progs.target_forked.attach().context("failed to attach to the sched_process_fork tracepoint")?);
    ensure_still_running(plan.pid)?;
    Ok(links)
}

/// Whether the kernel's BPF has compare-and-swap (Linux 5.12+), which keeps
/// each function's maximum latency exact (see close_top in bpf/calls_open_close.bpf.h).
fn has_compare_and_swap() -> bool {
    crate::kernel::Kernel::get().has(crate::kernel::Feature::AtomicCompareExchange)
}

/// Whether uprobes carry a BPF cookie (Linux 5.15+): the probes inside the
/// eval loop (inline_frame, skipped_close) learn their site's registers
/// from it.
fn has_attach_cookies() -> bool {
    crate::kernel::Kernel::get().has(crate::kernel::Feature::AttachCookie)
}

fn record_name(names: &mut Names, bytes: &[u8]) {
    let mut event = new_function::default();
    if plain::copy_from_bytes(&mut event, bytes).is_err() {
        return;
    }
    let as_bytes = |chars: &[i8]| chars.iter().map(|&c| c as u8).collect::<Vec<u8>>();
    let name = strings::decode(event.name_kind, event.name_len, &as_bytes(&event.name));
    let file = strings::decode(event.file_kind, event.file_len, &as_bytes(&event.file));
    let k = &event.key;
    names.insert(
        (k.id, k.aux, k.line),
        (name.unwrap_or_else(|| "<unreadable name>".into()), file.unwrap_or_else(|| "<unreadable file>".into())),
    );
}

fn collect(skel: &crate::bpf::calls::CallsSkel, names: &Names, pid: u32, stopped_ns: u64) -> Result<CallsData> {
    let mut edge_map = HashMap::new();
    for key_bytes in skel.maps.edges.keys() {
        let Some(value) = skel.maps.edges.lookup(&key_bytes, MapFlags::ANY)? else { continue };
        let mut key = edge_key::default();
        plain::copy_from_bytes(&mut key, &key_bytes).map_err(|_| anyhow::anyhow!("bad edge key size"))?;
        let mut stats = edge_stats::default();
        plain::copy_from_bytes(&mut stats, &value).map_err(|_| anyhow::anyhow!("bad edge value size"))?;
        edge_map.insert((id_of(&key.callee), id_of(&key.caller)), (key, stats));
    }
    // Only the functions with a call still open are held whole while their
    // calls are closed: the stats map's values are KiBs each (the latency
    // buckets), and 16,384 of them held at once were 100 MB.
    let mut adjusted = HashMap::new();
    if stopped_ns != 0 {
        close_open_calls(skel, pid, stopped_ns, &mut adjusted, &mut edge_map)?;
    }
    let functions = functions_with(skel, names, &adjusted)?;
    let mut edges = Vec::new();
    for (key, stats) in edge_map.into_values() {
        edges.push(CallEdge {
            caller: function_id(names, &key.caller),
            callee: function_id(names, &key.callee),
            stats: EdgeStats { calls: stats.calls, primitive_calls: stats.primitive_calls, self_ns: stats.self_ns, total_ns: stats.total_ns },
        });
    }

    let counters = read_counters(&skel.maps.counters, &COUNTERS)?;
    Ok(CallsData { functions, edges, counters })
}

/// One record per code object the stats map holds.
fn functions(skel: &crate::bpf::calls::CallsSkel, names: &Names) -> Result<Vec<Function>> {
    functions_with(skel, names, &HashMap::new())
}

/// One record per code object the stats map holds, each read and turned
/// into its compact record in turn, those in `adjusted` taken from there.
fn functions_with(skel: &crate::bpf::calls::CallsSkel, names: &Names, adjusted: &HashMap<KeyId, (func_key, func_stats)>) -> Result<Vec<Function>> {
    let mut functions = Vec::new();
    for key_bytes in skel.maps.stats.keys() {
        let mut key = func_key::default();
        plain::copy_from_bytes(&mut key, &key_bytes).map_err(|_| anyhow::anyhow!("bad key size"))?;
        if let Some((_, stats)) = adjusted.get(&id_of(&key)) {
            functions.push(function(names, &key, stats));
            continue;
        }
        let Some(value) = skel.maps.stats.lookup(&key_bytes, MapFlags::ANY)? else { continue };
        let mut stats = func_stats::default();
        plain::copy_from_bytes(&mut stats, &value).map_err(|_| anyhow::anyhow!("bad value size"))?;
        functions.push(function(names, &key, &stats));
    }
    Ok(functions)
}

type KeyId = (u64, u64, u32, u32);

fn id_of(key: &func_key) -> KeyId {
    (key.id, key.aux, key.line, key.tgid)
}

/// `key`'s stats, read from the map into `adjusted` the first time it is
/// asked for; None for a function the map has no row for.
fn adjusted_stats<'m>(
    skel: &crate::bpf::calls::CallsSkel,
    adjusted: &'m mut HashMap<KeyId, (func_key, func_stats)>,
    key: &func_key,
) -> Result<Option<&'m mut (func_key, func_stats)>> {
    let vacant = match adjusted.entry(id_of(key)) {
        std::collections::hash_map::Entry::Occupied(read) => return Ok(Some(read.into_mut())),
        std::collections::hash_map::Entry::Vacant(vacant) => vacant,
    };
    // SAFETY: func_key is plain data (four integers, no padding), copied
    // whole out of a map record, so every byte is initialised.
    let key_bytes = unsafe { std::slice::from_raw_parts((key as *const func_key).cast::<u8>(), std::mem::size_of::<func_key>()) };
    let Some(value) = skel.maps.stats.lookup(key_bytes, MapFlags::ANY)? else { return Ok(None) };
    let mut stats = func_stats::default();
    plain::copy_from_bytes(&mut stats, &value).map_err(|_| anyhow::anyhow!("bad value size"))?;
    Ok(Some(vacant.insert((*key, stats))))
}

fn function(names: &Names, key: &func_key, stats: &func_stats) -> Function {
    let FunctionId { name, file, line } = function_id(names, key);
    Function { name, file, line, stats: FunctionStats::from(stats) }
}

/// Closes, at `stopped_ns`, every call still open on a thread's shadow
/// stack when counting stopped, top first, as close_top in
/// bpf/calls_open_close.bpf.h would have at their return: without it a recursive
/// function open at the end had its inner calls' self time and not its
/// outer call's total (self above total), and a caller lacked the time of
/// its open callees.
fn close_open_calls(
    skel: &crate::bpf::calls::CallsSkel,
    pid: u32,
    stopped_ns: u64,
    adjusted: &mut HashMap<KeyId, (func_key, func_stats)>,
    edges: &mut HashMap<(KeyId, KeyId), (edge_key, edge_stats)>,
) -> Result<()> {
    let flag = |f: slot_flag| f.0;
    for tid in skel.maps.stacks.keys() {
        let Some(value) = skel.maps.stacks.lookup(&tid, MapFlags::ANY)? else { continue };
        let mut stack = Box::<thread_stack>::default();
        plain::copy_from_bytes(&mut *stack, &value).map_err(|_| anyhow::anyhow!("bad thread stack size"))?;
        // The thread's context switches now (a little after the stop: an
        // upper bound); unknown for a thread that is gone.
        let switches = <[u8; 4]>::try_from(tid.as_slice()).ok().and_then(|t| context_switches(pid, u32::from_ne_bytes(t)));
        // Calls past the slots have no time to close.
        let depth = (stack.depth as usize).min(stack.slots.len());
        for d in (0..depth).rev() {
            let slot = stack.slots[d];
            if slot.flags & flag(slot_flag::SLOT_COUNTED) == 0 {
                continue;
            }
            let elapsed = stopped_ns.saturating_sub(slot.start_ns);
            let self_ns = elapsed.saturating_sub(slot.child_ns);
            if d > 0 {
                stack.slots[d - 1].child_ns += elapsed;
                if slot.flags & flag(slot_flag::SLOT_EDGE) != 0 {
                    if let Some((_, es)) = edges.get_mut(&(id_of(&slot.key), id_of(&slot.caller))) {
                        es.self_ns += self_ns;
                        if slot.flags & flag(slot_flag::SLOT_EDGE_OUTERMOST) != 0 {
                            es.total_ns += elapsed;
                        }
                    }
                }
            }
            let Some((_, st)) = adjusted_stats(skel, adjusted, &slot.key)? else { continue };
            st.timed_calls += 1;
            if slot.flags & flag(slot_flag::SLOT_OUTERMOST) != 0 {
                st.total_ns += elapsed;
                st.outermost_calls += 1;
                st.nested_calls += stack.entries.saturating_sub(slot.entries_at_start);
            }
            st.self_ns += self_ns;
            st.child_calls += slot.children as u64;
            if switches.is_some_and(|now| now != slot.switches_at_start) {
                st.off_cpu_calls += 1;
            }
            let bucket = latency::bucket_of(elapsed).min(st.hist.len() - 1);
            st.hist[bucket] += 1;
            st.max_ns = st.max_ns.max(elapsed);
        }
    }
    Ok(())
}

/// A thread's voluntary plus involuntary context switches, as the kernel
/// counts them (the BPF side reads the same two counters).
fn context_switches(pid: u32, tid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let count = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse::<u64>().ok());
    Some(count("voluntary_ctxt_switches:")? + count("nonvoluntary_ctxt_switches:")?)
}

/// A function's name, file and first line, as its new_function event said.
fn function_id(names: &Names, key: &func_key) -> FunctionId {
    let (name, file) = match names.get(&(key.id, key.aux, key.line)) {
        Some(n) => n.clone(),
        None if key.id == 0 => ("<unreadable code object>".into(), String::new()),
        None => (format!("<function at {:#x}, name lost>", key.id), String::new()),
    };
    FunctionId { name, file, line: key.line }
}

/// The BPF edge: the kernel's record (bpf/calls.h) into the model's.
impl From<&func_stats> for FunctionStats {
    fn from(s: &func_stats) -> Self {
        FunctionStats {
            calls: s.calls,
            primitive_calls: s.primitive_calls,
            timed_calls: s.timed_calls,
            total_ns: s.total_ns,
            self_ns: s.self_ns,
            max_ns: s.max_ns,
            child_calls: s.child_calls,
            outermost_calls: s.outermost_calls,
            nested_calls: s.nested_calls,
            off_cpu_calls: s.off_cpu_calls,
            latency: Latency::from_kernel(&s.hist),
        }
    }
}

// SAFETY: plain integer structs generated from bpf/calls.h; any bytes are valid.
unsafe impl plain::Plain for func_key {}
unsafe impl plain::Plain for func_stats {}
unsafe impl plain::Plain for edge_key {}
unsafe impl plain::Plain for edge_stats {}
unsafe impl plain::Plain for new_function {}
unsafe impl plain::Plain for thread_stack {}

/// What a report in this mode on this interpreter cannot be exact about,
/// one sentence each, shown with the results.
pub fn caveats(python: &Python, mode: Mode) -> Vec<String> {
    let facts = python.layout.facts();
    let mut out = Vec::new();
    let no_cookies = || crate::kernel::Kernel::get().lacks(crate::kernel::Feature::AttachCookie, "counting them");
    if mode == Mode::Uprobe && facts.init_inlined_past_hook && !python.layout.free_threaded {
        // 3.14 respects the hook there. Without the allocator probe, 1 of
        // 20 such calls was seen on Debian's 3.13.18.
        out.push(match python.inlined_init_probe() {
            Some(_) => format!("CPython {} runs a class's __init__ inline at call sites it has specialized (CALL_ALLOC_AND_ENTER_INIT) even with the eval-frame hook set: those calls are counted (at the instance's allocation) but not timed, so __init__'s timed_calls is below its calls and their time is in the caller's self time", python.version),
            None => format!("CPython {} runs a class's __init__ inline at call sites it has specialized (CALL_ALLOC_AND_ENTER_INIT) even with the eval-frame hook set, and pytrace found no place to count them at: __init__ counts are lower bounds", python.version),
        });
    }
    if mode == Mode::Uprobe && python.inlines_getitem_unhooked() {
        out.push(match python.inlined_getitem_probe() {
            Some(_) if !has_attach_cookies() => format!("CPython {} runs __getitem__ inline at `obj[i]` sites it has specialized (BINARY_SUBSCR_GETITEM) even with the eval-frame hook set (fixed in 3.11.4), and {}: __getitem__ counts are lower bounds, and what __getitem__ calls is attributed to its caller", python.version, no_cookies()),
            Some(_) => format!("CPython {} runs __getitem__ inline at `obj[i]` sites it has specialized (BINARY_SUBSCR_GETITEM) even with the eval-frame hook set (fixed in 3.11.4): those calls are counted where the instruction starts them, but no probe sees them return, so each ends at the thread's next traced event: the time of such a __getitem__ is an upper bound, and its caller's self time short by as much", python.version),
            None => format!("CPython {} runs __getitem__ inline at `obj[i]` sites it has specialized (BINARY_SUBSCR_GETITEM) even with the eval-frame hook set (fixed in 3.11.4), and pytrace found no place to count them at: __getitem__ counts are lower bounds, and what __getitem__ calls is attributed to its caller", python.version),
        });
    }
    if mode == Mode::Uprobe {
        match python.skipped_close_probe() {
            CloseProbe::Sites(_) if !has_attach_cookies() => out.push(format!("close() of a generator or coroutine suspended outside any try block skips its frame (cProfile, which runs it, counts a call), and {}: generator and coroutine counts are lower bounds (by one per such close)", no_cookies())),
            CloseProbe::Sites(_) => out.push("close() of a generator or coroutine suspended outside any try block skips its frame (cProfile, which runs it, counts a call): those calls are counted, untimed".into()),
            CloseProbe::Unknown => out.push(format!("CPython {} may skip the frame of a generator or coroutine on close() where cProfile runs it and counts a call, and pytrace found no place to count those at: generator and coroutine counts are lower bounds (by one per such close)", python.version)),
            CloseProbe::NotNeeded => {}
        }
    }
    if mode == Mode::Usdt && facts.function_entry_at_generator_creation {
        out.push("function__entry fires when a generator is created as well as when it resumes, so generator rows count one call more per generator".into());
    }
    if mode == Mode::Usdt {
        out.push("the probes name a resumed generator by the line it resumes at, so a generator may have one row per line".into());
    }
    out
}

/// The mode `calls` uses for this interpreter, and why. Uprobe mode is the
/// default everywhere: it identifies a call by its code object. The
/// function__entry probe passes the frame's current line instead of the
/// function's first line, so on 3.9 and 3.10 a resumed generator shows up
/// under its `yield` line (measured on Debian's 3.9: countdown split into
/// rows for lines 41 and 43); on 3.11 it misses inlined calls altogether.
pub fn choose_mode(python: &Python, requested: Option<Mode>) -> Result<(Mode, &'static str)> {
    use crate::python::FunctionProbes::*;
    match (requested, python.function_probes()) {
        (Some(Mode::Usdt), Working) => Ok((Mode::Usdt, "asked for with --mode usdt (resumed generators are named by their current line)")),
        (Some(Mode::Usdt), EntryBroken) => bail!(
            "--mode usdt would miss calls on Python {}: its function__entry probe fires only for calls the interpreter does not inline (almost none); use --mode uprobe",
            python.version
        ),
        (Some(Mode::Usdt), Missing) => bail!(
            "--mode usdt needs the function__entry and function__return USDT probes, which {} does not have; use --mode uprobe",
            python.target_path
        ),
        (Some(Mode::Uprobe), _) => Ok((Mode::Uprobe, "asked for with --mode uprobe")),
        (None, _) if python.inlines_calls() => {
            Ok((Mode::Uprobe, "reads each call's code object; the eval-frame hook stops inlining"))
        }
        (None, _) => Ok((Mode::Uprobe, "reads each call's code object from the frame being evaluated")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn latency_buckets_match_the_kernel_array_length() {
        let stats = crate::bpf::calls::types::func_stats::default();
        assert_eq!(stats.hist.len(), crate::model::latency::BUCKETS);
        // What user space buckets an open call in is the array's last at most.
        assert_eq!(crate::model::latency::bucket_of(u64::MAX), stats.hist.len() - 1);
    }
}
