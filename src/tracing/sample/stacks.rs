//! From what BPF sends to the profile: the stacks it reports once each
//! (their frames as addresses, named here as they arrive), the counts it
//! aggregates per stack (read at each drain), and the profile they add up
//! to, with every sample that could not be named or kept counted.
//!
//! Memory is bounded whatever the targets do: the stacks BPF reported are
//! kept up to RAW_BYTES (the least recently counted are forgotten, and BPF
//! is told to send them again if they come back), the profile up to
//! PROFILE_BYTES (past it, samples of new stacks are counted, not kept).

use foldhash::{HashMap, HashSet};
use std::rc::Rc;

use libbpf_rs::MapCore;

use super::counts::{samples_of, SAMPLE_WEIGHT};
use super::discovery::Processes;
use super::kernel_symbols::KernelFrames;
use super::resolve::CodeKey;
use crate::bpf::sample::types::{native_end, native_record, py_frame_ref, sample_stack, stack_key};
use crate::native::merge::PythonStack;
use crate::native::{KernelStack, NativeStacks, UserStack};
use crate::model::samples::{Frame, Sample};

/// Bytes of reported stacks kept (frames as addresses and as names).
const RAW_BYTES: usize = 32 << 20;

/// Bytes the profile may hold: its distinct stacks and their frames' names.
pub const PROFILE_BYTES: usize = 128 << 20;

/// What a stack costs beyond its frames.
const STACK_OVERHEAD: usize = 128;

/// A stack as BPF reported it, and its frames as last named.
struct RawStack {
    /// Innermost first.
    python: Vec<py_frame_ref>,
    entry: [u64; 4],
    truncated: bool,
    no_python: bool,
    /// --idle --states: the thread's state, the root (under the process).
    state: Option<Rc<Frame>>,
    /// --async: the asyncio task the thread ran (0: none), and its root
    /// frames as named on arrival (the task, then the tasks awaiting it).
    task: u64,
    task_frames: Rc<[Rc<Frame>]>,
    /// The drain in which the task's names were last read.
    task_checked: u64,
    /// Named on arrival, innermost first.
    kernel: Vec<Rc<Frame>>,
    /// The Python frames as named on arrival, innermost first, and the
    /// generation of the code object each was named after (0: unreadable).
    named: Vec<Rc<Frame>>,
    generations: Vec<u64>,
    /// The drain in which the code objects were last checked, and the
    /// process's cache `reads` then (CodeResolver::reads).
    checked: u64,
    reads_seen: u64,
    /// One of them changed: BPF was told to send this stack again.
    retired: bool,
    /// --async: what changed was the task's name.
    task_renamed: bool,
    /// The profile's stack for these frames (not with --native, where each
    /// sample's native frames differ).
    interned: Option<StackId>,
    /// The last drain that counted this stack.
    used: u64,
}

impl RawStack {
    fn bytes(&self) -> usize {
        STACK_OVERHEAD + self.python.len() * (24 + 8 + 8) + self.kernel.len() * 8
    }

    fn is_entry(&self, i: usize) -> bool {
        (self.entry[(i / 64) % 4] >> (i % 64)) & 1 == 1
    }
}

type StackId = u32;

/// Interned stacks and their sample counts, as weights (counts.rs:
/// SAMPLE_WEIGHT per sample at the mean period), turned into samples when
/// the profile is read.
#[derive(Default)]
struct Profile {
    /// By StackId: the process and the frames, outermost first.
    stacks: Vec<(u32, Rc<[Rc<Frame>]>)>,
    /// Stacks by their frames' identities (frames are shared Rcs, so equal
    /// pointers mean equal frames; equal frames under different pointers
    /// only cost a duplicate, merged when the report is made).
    index: HashMap<(u32, Vec<usize>), StackId>,
    /// Frames already counted in `bytes`.
    frames_seen: HashSet<usize>,
    counts: HashMap<(u32, StackId), u64>,
    bytes: usize,
    total: u64,
}

impl Profile {
    /// The id of a stack, interning it if new; None past PROFILE_BYTES.
    fn intern(&mut self, pid: u32, frames: Vec<Rc<Frame>>) -> Option<StackId> {
        let key = (pid, frames.iter().map(|f| Rc::as_ptr(f) as usize).collect::<Vec<_>>());
        if let Some(&id) = self.index.get(&key) {
            return Some(id);
        }
        let mut added = STACK_OVERHEAD + frames.len() * 16;
        for f in &frames {
            if self.frames_seen.insert(Rc::as_ptr(f) as usize) {
                added += frame_bytes(f);
            }
        }
        if self.bytes + added > PROFILE_BYTES {
            return None;
        }
        self.bytes += added;
        let id = self.stacks.len() as StackId;
        self.stacks.push((pid, frames.into()));
        self.index.insert(key, id);
        Some(id)
    }

    fn add(&mut self, tid: u32, id: StackId, n: u64) {
        if n == 0 {
            return;
        }
        let before = self.counts.len();
        *self.counts.entry((tid, id)).or_insert(0) += n;
        if self.counts.len() > before {
            self.bytes += 48;
        }
        self.total += n;
    }
}

fn frame_bytes(f: &Frame) -> usize {
    96 + match f {
        Frame::Python { name, file, .. } => name.len() + file.len(),
        Frame::Native { name, module } => name.len() + module.len(),
        Frame::Kernel(name) | Frame::Process(name) => name.len(),
        _ => 0,
    }
}

/// What could not be named or kept, for the report's counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct StackCounts {
    /// Samples (as weights) of a stack whose frames never reached user space.
    pub unresolved: u64,
    /// Samples (as weights) of new stacks once the profile held PROFILE_BYTES.
    pub profile_full: u64,
    /// Reported stacks forgotten to stay under RAW_BYTES.
    pub forgotten: u64,
    /// Stacks whose code object was replaced by another at its address
    /// since they were named: sent again, named again.
    pub renamed: u64,
    /// --async: of those, stacks whose task has another name now (it
    /// ended and another task was made at its address, or was renamed).
    pub tasks_renamed: u64,
}

pub struct Stacks {
    raw: HashMap<(u32, u64), RawStack>,
    raw_bytes: usize,
    /// Stacks to retire at the end of this drain (see end_drain), and those
    /// BPF forgot at the end of the last one.
    to_retire: Vec<(u32, u64)>,
    retiring: Vec<(u32, u64)>,
    profile: Profile,
    kernel: Option<KernelFrames>,
    pub native: Option<NativeStacks>,
    /// Root every stack at its process (--all).
    label_processes: bool,
    /// Counts read before their stack's frames arrived.
    pending: Vec<(stack_key, u64)>,
    /// Stacks received but not named yet (see name_new).
    unnamed: Vec<(u32, u64)>,
    drain: u64,
    markers: Markers,
    pub counts: StackCounts,
}

struct Markers {
    truncated: Rc<Frame>,
    no_python: Rc<Frame>,
    native_thread: Rc<Frame>,
    unreadable: Rc<Frame>,
}

impl Stacks {
    pub fn new(kernel: bool, native: bool, label_processes: bool) -> Self {
        Stacks {
            raw: HashMap::default(),
            raw_bytes: 0,
            to_retire: Vec::new(),
            retiring: Vec::new(),
            profile: Profile::default(),
            kernel: kernel.then(KernelFrames::load),
            native: native.then(NativeStacks::default),
            label_processes,
            pending: Vec::new(),
            unnamed: Vec::new(),
            drain: 0,
            markers: Markers { truncated: Rc::new(Frame::Truncated), no_python: Rc::new(Frame::NoPython), native_thread: Rc::new(Frame::NativeThread), unreadable: Rc::new(Frame::Unreadable) },
            counts: StackCounts::default(),
        }
    }

    /// Samples in the profile so far.
    pub fn total(&self) -> u64 {
        samples_of(self.profile.total)
    }

    /// A ring-buffer record: a stack seen for the first time, or a --native
    /// sample.
    pub fn receive(&mut self, bytes: &[u8], processes: &mut Processes) {
        let Some(kind) = bytes.get(..4).map(|k| u32::from_ne_bytes(k.try_into().unwrap())) else { return };
        if kind == crate::bpf::sample::types::record_kind::RECORD_STACK.0 {
            self.receive_stack(bytes, processes);
        } else if kind == crate::bpf::sample::types::record_kind::RECORD_NATIVE.0 {
            self.receive_native(bytes, processes);
        }
    }

    fn receive_stack(&mut self, bytes: &[u8], processes: &mut Processes) {
        let header = std::mem::offset_of!(sample_stack, frame);
        let Some(head) = bytes.get(..header) else { return };
        // SAFETY: the start of a sample_stack the BPF program wrote (only the
        // frames it filled follow); read unaligned, since ring-buffer
        // records are only 8-byte aligned.
        let mut rec: sample_stack = unsafe { std::mem::zeroed() };
        unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), (&mut rec as *mut sample_stack).cast::<u8>(), header) };
        if !processes.by_pid.contains_key(&rec.pid) {
            return;
        }
        let n = (rec.frames as usize).min(rec.frame.len()).min((bytes.len() - header) / std::mem::size_of::<py_frame_ref>());
        let python: Vec<py_frame_ref> = (0..n)
            .map(|i| {
                let at = header + i * std::mem::size_of::<py_frame_ref>();
                // SAFETY: in bounds (n is limited by the record's length).
                unsafe { std::ptr::read_unaligned(bytes[at..].as_ptr().cast::<py_frame_ref>()) }
            })
            .collect();
        let kernel = match &mut self.kernel {
            Some(k) if rec.kernel_frames > 0 => {
                rec.kernel[..(rec.kernel_frames as usize).min(rec.kernel.len())].iter().map(|&ip| k.frame(ip)).collect()
            }
            _ => Vec::new(),
        };
        let stack = RawStack {
            python,
            entry: rec.entry,
            truncated: rec.truncated != 0,
            no_python: rec.no_python != 0,
            state: super::thread_states::label(rec.thread_state, rec.syscall).map(|s| Rc::new(Frame::ThreadState(s))),
            task: rec.running_task,
            task_frames: Rc::from([]),
            task_checked: self.drain,
            kernel,
            // Named by name_new, with the other stacks of this read of the ring.
            named: Vec::new(),
            generations: Vec::new(),
            checked: self.drain,
            reads_seen: 0,
            retired: false,
            task_renamed: false,
            interned: None,
            used: self.drain,
        };
        self.unnamed.push((rec.pid, rec.hash));
        self.raw_bytes += stack.bytes();
        if let Some(old) = self.raw.insert((rec.pid, rec.hash), stack) {
            self.raw_bytes -= old.bytes();
        }
    }

    /// Names the stacks received since the last call, while their code
    /// objects are most likely alive: a cached object is used only if it
    /// has the name BPF read from the sampled one (another may have been
    /// made at a freed one's address since it was cached), else read again.
    pub fn name_new(&mut self, processes: &mut Processes) {
        if self.unnamed.is_empty() {
            return;
        }
        let mut unnamed = std::mem::take(&mut self.unnamed);
        unnamed.sort_unstable();
        unnamed.dedup();
        for group in unnamed.chunk_by(|a, b| a.0 == b.0) {
            let pid = group[0].0;
            let Some(process) = processes.by_pid.get_mut(&pid) else { continue };
            process.tasks.forget_reads();
            let frames = group.iter().filter_map(|k| self.raw.get(k)).flat_map(|s| s.python.iter().map(|f| (code_key(f), f.name, f.file)));
            process.resolver.refresh_sampled(frames);
            for key in group {
                let Some(stack) = self.raw.get_mut(key) else { continue };
                let (named, generations) = stack
                    .python
                    .iter()
                    .map(|f| process.resolver.frame(code_key(f), f.instr, f.name, f.file).unwrap_or_else(|| (self.markers.unreadable.clone(), 0)))
                    .unzip();
                stack.named = named;
                stack.generations = generations;
                if stack.task != 0 {
                    stack.task_frames = process.task_frames(pid, stack.task, true);
                }
                stack.reads_seen = process.resolver.reads();
            }
        }
    }

    fn receive_native(&mut self, bytes: &[u8], processes: &mut Processes) {
        // Its stack record came before it.
        self.name_new(processes);
        // The record is cut after the frames BPF filled, unless a stack
        // copy follows them.
        let header = std::mem::size_of::<native_record>();
        let first_frame = std::mem::offset_of!(native_record, frame);
        if bytes.len() < first_frame {
            return;
        }
        let filled = bytes.len().min(header);
        // SAFETY: the start of a native_record the BPF program wrote (all
        // zeroes is a valid one), copied unaligned.
        let mut r: native_record = unsafe { std::mem::zeroed() };
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut r as *mut native_record).cast::<u8>(), filled) };
        let Some(process) = processes.by_pid.get_mut(&r.pid) else { return };
        let label = process.label.clone();
        let drain = self.drain;
        // --native samples come one record each, at the mean weight.
        let Some(raw) = self.raw.get_mut(&(r.pid, r.hash)) else {
            self.counts.unresolved += SAMPLE_WEIGHT;
            return;
        };
        raw.used = drain;
        if stale(raw, drain, process) {
            self.counts.renamed += 1;
            self.retire(r.pid, r.hash);
        }
        let Some(raw) = self.raw.get(&(r.pid, r.hash)) else { return };
        let entry: Vec<bool> = (0..raw.named.len()).map(|i| raw.is_entry(i)).collect();
        let python = PythonStack { frames: &raw.named, entry: &entry, truncated: raw.truncated };
        let Some(native) = self.native.as_mut() else { return };
        let mut frames: Vec<Rc<Frame>> = raw.kernel.clone();
        let (native_frames, whole) = if r.native == 0 {
            native.frames(r.pid, &python, None)
        } else {
            let sent = (r.frames as usize).min((filled - first_frame) / 8);
            // With a copy, the stack follows the whole frame array.
            let stack = bytes.get(header..).unwrap_or_default();
            let len = (r.stack_len as usize).min(stack.len());
            let copy = (r.copy != 0).then(|| UserStack {
                ip: r.user_ip,
                sp: r.user_sp,
                bp: r.user_bp,
                start: r.stack_start,
                bytes: &stack[..len],
                full: len == stack.len(),
            });
            let complete = r.end == native_end::NATIVE_COMPLETE.0 as u8;
            native.kernel_frames(r.pid, &python, &KernelStack { frames: &r.frame[..sent], complete, copy })
        };
        frames.extend(native_frames);
        if raw.no_python && whole && r.tid != r.pid {
            // A thread native code started (its stack ends in the thread
            // start, with no Python code on it): it has no Python caller.
            native.counts.native_threads += 1;
            frames.push(self.markers.native_thread.clone());
        } else if raw.no_python {
            // Whatever native code the thread runs, under one root.
            frames.push(self.markers.no_python.clone());
        }
        frames.extend(raw.state.clone());
        if self.label_processes {
            frames.push(label);
        }
        frames.reverse();
        match self.profile.intern(r.pid, frames) {
            Some(id) => self.profile.add(r.tid, id, SAMPLE_WEIGHT),
            None => self.counts.profile_full += SAMPLE_WEIGHT,
        }
    }

    /// A drain begins: cached names are checked again at their next use.
    pub fn begin_drain(&mut self) {
        self.drain += 1;
    }

    /// The drains begun so far.
    pub fn drains(&self) -> u64 {
        self.drain
    }

    /// Adds the counts read from BPF at this drain. A count whose stack's
    /// frames have not arrived yet (they may still be in the ring buffer,
    /// read after this) waits for the next drain; at the `last` one it is
    /// counted unresolved.
    pub fn add_counts(&mut self, counts: &[(stack_key, u64)], processes: &mut Processes, last: bool) {
        self.name_new(processes);
        let drain = self.drain;
        // Each process's cached code objects checked at once, before its
        // stacks are (see `stale`).
        let mut pids: Vec<u32> = counts.iter().map(|(k, _)| k.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            if let Some(process) = processes.by_pid.get_mut(&pid) {
                process.resolver.check_all(drain);
                process.tasks.forget_reads();
            }
        }
        let waiting = std::mem::take(&mut self.pending);
        for (key, n) in waiting.iter().chain(counts) {
            let (Some(process), Some(raw)) = (processes.by_pid.get_mut(&key.pid), self.raw.get_mut(&(key.pid, key.hash))) else {
                if last || waiting.iter().any(|(k, _)| k.pid == key.pid && k.hash == key.hash && k.tid == key.tid) {
                    self.counts.unresolved += n;
                } else {
                    self.pending.push((*key, *n));
                }
                continue;
            };
            raw.used = drain;
            // Counted under the names it had: its samples were taken before
            // the change was seen (or soon after, if the new code object runs
            // at the very same addresses: BPF then sends it again).
            let retire = stale(raw, drain, process) || task_renamed(raw, drain, process, key.pid);
            if raw.interned.is_none() {
                raw.interned = self.profile.intern(key.pid, full_stack(raw, &self.markers, self.label_processes.then(|| process.label.clone())));
            }
            match raw.interned {
                Some(id) => self.profile.add(key.tid, id, *n),
                None => self.counts.profile_full += n,
            }
            if retire {
                self.counts.renamed += 1;
                self.counts.tasks_renamed += raw.task_renamed as u64;
                self.retire(key.pid, key.hash);
            }
        }
    }

    /// Tells BPF to send a stack again the next time it is sampled; its
    /// frames here are dropped after the next drain, so that the counts
    /// taken until then still find them (see end_drain).
    fn retire(&mut self, pid: u32, hash: u64) {
        self.to_retire.push((pid, hash));
    }

    /// After a drain: drops the stacks retired at the last one (unless BPF
    /// sent them again since), and if the reported stacks hold more than
    /// RAW_BYTES, retires the least recently counted half. A stack is
    /// retired in two steps: BPF forgets it now (in `known`), so it sends it
    /// again if it is sampled again (once it is not in the counts map BPF
    /// counts into: BPF asks `known` only for stacks not counted there yet,
    /// so a stack counted since the last swap is sent again after the next
    /// one); its frames here are dropped at the next drain, once the counts
    /// taken before BPF forgot it have been read.
    pub fn end_drain(&mut self, known: &dyn MapCore) {
        for key in std::mem::take(&mut self.retiring) {
            if self.raw.get(&key).is_some_and(|s| s.retired) {
                let old = self.raw.remove(&key).expect("just found");
                self.raw_bytes -= old.bytes();
            }
        }
        if self.raw_bytes > RAW_BYTES {
            let mut by_use: Vec<(u64, (u32, u64))> = self.raw.iter().filter(|(_, s)| !s.retired).map(|(k, s)| (s.used, *k)).collect();
            by_use.sort_unstable();
            let half = by_use.len() / 2;
            self.counts.forgotten += half as u64;
            self.to_retire.extend(by_use.into_iter().take(half).map(|(_, k)| k));
        }
        for key in std::mem::take(&mut self.to_retire) {
            if let Some(s) = self.raw.get_mut(&key) {
                s.retired = true;
                let _ = known.delete(&known_key(key));
                self.retiring.push(key);
            }
        }
    }

    /// Forgets an exited process's stacks (and tells BPF to).
    pub fn forget_process(&mut self, pid: u32, known: &dyn MapCore) {
        let keys: Vec<(u32, u64)> = self.raw.keys().filter(|k| k.0 == pid).copied().collect();
        for key in keys {
            let _ = known.delete(&known_key(key));
            if let Some(old) = self.raw.remove(&key) {
                self.raw_bytes -= old.bytes();
            }
        }
    }

    /// The frames of stack `hash` of `pid`, outermost first, as the
    /// profile names them (None: its frames never arrived). `pytrace
    /// memory` counts its own weights per stack and names them here.
    pub fn frames_of(&mut self, pid: u32, hash: u64, processes: &mut Processes) -> Option<Vec<Rc<Frame>>> {
        self.name_new(processes);
        let raw = self.raw.get(&(pid, hash))?;
        let label = self.label_processes.then(|| processes.by_pid.get(&pid).map(|p| p.label.clone())).flatten();
        Some(full_stack(raw, &self.markers, label))
    }

    /// The profile so far, one Sample per stack and thread (`pytrace top`
    /// reads it while sampling goes on).
    pub fn samples_so_far(&self) -> Vec<Sample> {
        self.profile
            .counts
            .iter()
            .map(|(&(tid, id), &count)| {
                let (pid, frames) = &self.profile.stacks[id as usize];
                Sample { pid: *pid, tid, frames: frames.to_vec(), count: samples_of(count) }
            })
            .collect()
    }

    /// The profile counted since the last take, one Sample per stack and
    /// thread, and a fresh profile in its place (the agent's intervals): a
    /// profile kept for the life of a long run would hold every stack of
    /// every process that ever ran, each copied at every cut, and stop
    /// taking new stacks at PROFILE_BYTES. Stacks are interned again as
    /// they are counted again.
    pub fn take_samples(&mut self) -> Vec<Sample> {
        for raw in self.raw.values_mut() {
            raw.interned = None;
        }
        std::mem::take(&mut self.profile).into_samples()
    }

    /// The profile, one Sample per stack and thread.
    pub fn into_samples(self) -> Vec<Sample> {
        self.profile.into_samples()
    }
}

impl Profile {
    fn into_samples(self) -> Vec<Sample> {
        let Profile { stacks, counts, .. } = self;
        counts
            .into_iter()
            .map(|((tid, id), count)| {
                let (pid, frames) = &stacks[id as usize];
                Sample { pid: *pid, tid, frames: frames.to_vec(), count: samples_of(count) }
            })
            .collect()
    }
}

/// What names a sampled frame in its process's code cache.
fn code_key(frame: &py_frame_ref) -> CodeKey {
    CodeKey { code: frame.code, globals: frame.globals }
}

/// Whether a stack's code objects changed since it was named (checked once
/// per drain): a code object freed and another made at its address, or a
/// frame unreadable then that can be read now. A retired stack is not
/// checked again. When nothing was read into its process's cache since the
/// stack was last compared with it, and the cache was checked against the
/// target in this drain (CodeResolver::check_all), nothing changed: the
/// common case costs no look-up per frame.
fn stale(raw: &mut RawStack, drain: u64, process: &mut super::discovery::Process) -> bool {
    if raw.checked == drain || raw.retired {
        return false;
    }
    raw.checked = drain;
    if raw.reads_seen == process.resolver.reads() {
        return false;
    }
    // Reads the frames' objects that are not cached (a flushed cache).
    process.resolver.refresh(raw.python.iter().map(code_key), drain);
    // A code object freed since (nothing readable there now) changes
    // nothing: the samples were taken while it lived.
    let changed = raw.python.iter().zip(&raw.generations).any(|(f, &g)| process.resolver.generation(code_key(f)).is_some_and(|now| now != g));
    raw.retired = changed;
    raw.reads_seen = process.resolver.reads();
    changed
}

/// --async: whether the task a stack was named after is named otherwise
/// now, read once per drain as code objects are checked (`stale`): per-request
/// tasks end, and a new one made at a freed task's address would run the
/// same code, so BPF would count its samples under the old stack. Caught
/// here, the stack is sent again and named anew, its samples until this
/// drain staying under the name they were taken under. A task that ended
/// reads as unreadable: its stack is retired too, and sent again only if
/// its address runs a task again.
fn task_renamed(raw: &mut RawStack, drain: u64, process: &mut super::discovery::Process, pid: u32) -> bool {
    if raw.task == 0 || raw.retired || raw.task_checked == drain {
        return false;
    }
    raw.task_checked = drain;
    let now = process.task_frames(pid, raw.task, false);
    let changed = now.len() != raw.task_frames.len() || now.iter().zip(raw.task_frames.iter()).any(|(a, b)| a != b);
    raw.retired = changed;
    raw.task_renamed = changed;
    changed
}

/// A stack's frames, outermost first: its process (with --all), its asyncio
/// task and the tasks awaiting it (--async), its thread's state (--states), the truncation marker, the Python frames, the no-Python marker, the kernel
/// frames.
fn full_stack(raw: &RawStack, markers: &Markers, label: Option<Rc<Frame>>) -> Vec<Rc<Frame>> {
    let mut frames = Vec::with_capacity(raw.named.len() + raw.kernel.len() + 3);
    frames.extend(label);
    frames.extend(raw.task_frames.iter().cloned());
    frames.extend(raw.state.clone());
    if raw.truncated {
        frames.push(markers.truncated.clone());
    }
    frames.extend(raw.named.iter().rev().cloned());
    if raw.no_python {
        frames.push(markers.no_python.clone());
    }
    frames.extend(raw.kernel.iter().rev().cloned());
    frames
}

fn known_key((pid, hash): (u32, u64)) -> Vec<u8> {
    let key = stack_key { pid, tid: 0, hash };
    // SAFETY: a plain integer struct generated from bpf/sample.h.
    unsafe { std::slice::from_raw_parts((&key as *const stack_key).cast::<u8>(), std::mem::size_of::<stack_key>()) }.to_vec()
}
