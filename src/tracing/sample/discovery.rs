//! The processes being sampled, and the BPF map that tells the program
//! about them: one target, or with --all every CPython on the machine,
//! found again every second as processes start and removed as they exit,
//! so the map never fills with the dead. A process that finds the map full
//! anyway is counted, not fatal.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use super::async_tasks::TaskNames;
use super::resolve::{CacheCounts, CodeResolver};
use crate::bpf::sample::types::{py_layout, sample_target};
use crate::python::layouts::NO_FIELD;
use crate::python::{Python, RUNTIME_SYMBOL};
use crate::model::samples::Frame;
use crate::process::proc::{self, Memory};

/// Where BPF finds the processes to sample: `by_pid` holds them all (the
/// --idle iterator and --all look each task's process up there); with a
/// single target, `only` holds it again at index 0, for the perf-event
/// program, whose look-up of a one-entry array the verifier inlines where
/// a hash map's is a helper call, on every tick of every CPU.
pub struct TargetMaps<'m> {
    pub by_pid: &'m dyn MapCore,
    pub only: Option<&'m dyn MapCore>,
}

/// --all looks for new Pythons, and for exited ones, this often.
const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// A process not located yet is looked for this often, for its first
/// LOCATE_FAST_FOR: a command pytrace started is held at its exec, before
/// the dynamic loader maps a shared libpython, and every sample until it
/// is located has no thread state (at CHECK_EVERY, the first quarter
/// second of a script's samples were lost).
pub const LOCATE_EVERY: Duration = Duration::from_millis(2);
const LOCATE_FAST_FOR: Duration = Duration::from_secs(2);

/// An exited process is forgotten this many drains after its exit was
/// seen, so that the samples it left in the counts map and the ring
/// buffer are still named with its caches.
const KEEP_EXITED_DRAINS: u64 = 2;

pub enum PythonRef<'a> {
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

/// A sampled process: its Python, the cache naming its code objects, its
/// label as the root frame with --all.
pub struct Process<'a> {
    python: PythonRef<'a>,
    pub resolver: CodeResolver,
    pub label: Rc<Frame>,
    /// Whether its interpreter's addresses are known and in the map.
    located: bool,
    /// When it was added to the run.
    added: Instant,
    /// When it started (/proc/PID/stat), to tell it from a later process
    /// given the same PID.
    started: Option<u64>,
    /// The drain at which its exit was seen.
    exited_at: Option<u64>,
    /// --async: the names of the asyncio tasks its threads ran.
    pub tasks: TaskNames,
}

impl Process<'_> {
    /// Its Python's version, as `info` shows it.
    pub fn version(&self) -> String {
        self.python.version.to_string()
    }

    /// --async: the root frames of a stack whose thread ran the asyncio
    /// task at `task` in this process (`pid`); `naming` a new stack.
    pub fn task_frames(&mut self, pid: u32, task: u64, naming: bool) -> Rc<[Rc<Frame>]> {
        self.tasks.frames(pid, &self.python, task, naming)
    }
}

/// What happened to processes over the run, for the report's counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCounts {
    /// --all: Pythons not sampled because the map was full.
    pub not_sampled: u64,
    /// --all: sampled processes that exited during the run.
    pub exited: u64,
    /// The code caches of processes already forgotten.
    pub forgotten_caches: CacheCounts,
}

pub struct Processes<'a> {
    pub by_pid: HashMap<u32, Process<'a>>,
    all: bool,
    /// --all: every PID looked at, Python or not, with the inode number of
    /// its /proc/PID directory then, so that each rescan reads only new
    /// processes' files (see `live_pids`).
    checked: HashMap<u32, u64>,
    last_scan: Instant,
    pub counts: ProcessCounts,
}

impl<'a> Processes<'a> {
    pub fn new(all: bool) -> Self {
        Processes { by_pid: HashMap::new(), all, checked: HashMap::new(), last_scan: Instant::now(), counts: ProcessCounts::default() }
    }

    /// Starts sampling a process (its interpreter is located later, once
    /// mapped). With --all a full map only skips the process, counted;
    /// for the one target it is an error.
    pub fn add(&mut self, maps: &TargetMaps, pid: u32, python: PythonRef<'a>) -> Result<()> {
        if let Err(e) = put_target(maps, pid, &target_entry(&python, 0)) {
            if self.all {
                self.counts.not_sampled += 1;
                return Ok(());
            }
            return Err(e);
        }
        let label = Rc::new(Frame::Process(format!("{} ({pid})", proc::command_name(pid))));
        let resolver = CodeResolver::new(pid, python.layout.clone());
        let started = start_time(pid);
        self.by_pid.insert(pid, Process { python, resolver, label, located: false, added: Instant::now(), started, exited_at: None, tasks: TaskNames::default() });
        Ok(())
    }

    /// Tells BPF where each new target's interpreter is as soon as it can
    /// be known (with `--`, libpython may be mapped only now).
    pub fn locate(&mut self, maps: &TargetMaps) -> Result<()> {
        for (&pid, p) in self.by_pid.iter_mut().filter(|(_, p)| !p.located && p.exited_at.is_none()) {
            if let Ok((head, code_type)) = runtime_addresses(pid, &p.python) {
                put_target(maps, pid, &target_entry(&p.python, head))?;
                p.resolver.located(Memory::open(pid).ok(), code_type);
                p.located = true;
            }
        }
        Ok(())
    }

    /// --all, at most every second: adds the Pythons started since, and
    /// removes from the map those that exited (forgetting them
    /// KEEP_EXITED_DRAINS drains later). Returns the PIDs forgotten now.
    pub fn rescan(&mut self, maps: &TargetMaps, drain: u64) -> Vec<u32> {
        if !self.all {
            return Vec::new();
        }
        let forgotten = self.forget_exited(drain);
        if self.last_scan.elapsed() < RESCAN_EVERY {
            return forgotten;
        }
        self.last_scan = Instant::now();
        let live = live_pids();
        self.prune(maps.by_pid, drain, &live);
        let me = std::process::id();
        let new: Vec<(u32, u64)> = live.into_iter().filter(|&(pid, _)| pid != me && !self.checked.contains_key(&pid)).collect();
        for (pid, inode) in new {
            self.checked.insert(pid, inode);
            if let Ok(python) = Python::from_pid(pid) {
                let _ = self.add(maps, pid, PythonRef::Owned(Box::new(python)));
            }
        }
        forgotten
    }

    /// Takes the processes that exited out of the map, so that it never
    /// fills with the dead: a process is gone when its PID is not `live`,
    /// is a zombie, or belongs to a later process (another start time).
    fn prune(&mut self, map: &dyn MapCore, drain: u64, live: &HashMap<u32, u64>) {
        for (&pid, p) in self.by_pid.iter_mut().filter(|(_, p)| p.exited_at.is_none()) {
            // The few sampled processes are checked exactly: one read of
            // their stat, for the state and the start time.
            let running_since = live.contains_key(&pid).then(|| running_start_time(pid)).flatten();
            if running_since.is_none() || running_since != p.started {
                let _ = map.delete(&pid.to_ne_bytes());
                p.exited_at = Some(drain);
                self.counts.exited += 1;
                // Looked at again if the PID comes back.
                self.checked.remove(&pid);
            }
        }
        // Forget the non-Python PIDs that are gone, or were reused: their
        // directory's inode changed. No file is read for them, which on a
        // host of hundreds of processes was most of the agent's CPU.
        self.checked.retain(|pid, inode| live.get(pid) == Some(inode));
    }

    /// Drops the processes that exited KEEP_EXITED_DRAINS drains ago (their
    /// last samples are named by now); returns their PIDs.
    fn forget_exited(&mut self, drain: u64) -> Vec<u32> {
        let mut forgotten = Vec::new();
        let caches = &mut self.counts.forgotten_caches;
        self.by_pid.retain(|&pid, p| {
            let gone = p.exited_at.is_some_and(|at| drain >= at + KEEP_EXITED_DRAINS);
            if gone {
                forgotten.push(pid);
                caches.add(&p.resolver.counts);
            }
            !gone
        });
        forgotten
    }

    /// --all at start: every Python on the machine now.
    pub fn add_every_python(&mut self, maps: &TargetMaps) {
        self.last_scan = Instant::now() - RESCAN_EVERY;
        self.rescan(maps, 0);
    }

    /// What every process's code cache had to give up.
    pub fn cache_counts(&self) -> CacheCounts {
        let mut total = self.counts.forgotten_caches;
        for p in self.by_pid.values() {
            total.add(&p.resolver.counts);
        }
        total
    }

    /// Whether every process added has its interpreter located (BPF can
    /// walk its threads).
    /// Whether a process added lately is still to be located (see
    /// LOCATE_EVERY).
    pub fn locating(&self) -> bool {
        self.by_pid.values().any(|p| !p.located && p.exited_at.is_none() && p.added.elapsed() < LOCATE_FAST_FOR)
    }

    pub fn all_located(&self) -> bool {
        self.by_pid.values().all(|p| p.located)
    }

    /// The one target's PID (not --all).
    pub fn only(&self) -> Option<u32> {
        (!self.all).then(|| self.by_pid.keys().next().copied()).flatten()
    }
}

/// Every PID in /proc, with the inode number of its directory, which
/// readdir gives at no extra cost. That number names one process: the
/// kernel drops a process's /proc dentries when it is reaped
/// (proc_flush_pid), so a later process with the same PID gets a new inode
/// and number. A dentry evicted and made again for the same process also
/// gets a new one: that process is then looked at again, which is only
/// work, never a process missed.
fn live_pids() -> HashMap<u32, u64> {
    use std::os::unix::fs::DirEntryExt;
    let Ok(entries) = std::fs::read_dir("/proc") else { return HashMap::new() };
    entries.flatten().filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.ino()))).collect()
}

/// A process's start time (field 22 of /proc/PID/stat, after the command
/// name, which may hold spaces and parentheses).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// A process's start time if it is running (not a zombie), from one read
/// of its stat: the state is the field after the command name.
fn running_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next()?, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The BPF map entry for a process: its layout, and where its frames'
/// fields are within the bytes the walk reads of each frame.
fn target_entry(python: &Python, interpreters_head: u64) -> sample_target {
    let l = &python.layout;
    let fields = [l.frame_code, l.frame_previous, l.frame_instr, l.frame_globals, l.frame_owner, l.frame_is_entry];
    let present = || fields.into_iter().filter(|&o| o != NO_FIELD);
    // From the 8-byte word holding the first field to the end of the last
    // (8-byte fields; the one-byte ones end before an 8-byte boundary).
    let start = present().min().unwrap_or(0) & !7;
    let end = present().map(|o| o + 8).max().unwrap_or(8);
    let relative = |o: u32| if o == NO_FIELD { NO_FIELD } else { o - start };
    let tstate = FieldsRead::tstate(l);
    let names = FieldsRead::names(l);
    sample_target {
        layout: super::super::py_layout!(py_layout, l),
        interpreters_head,
        frame_read_start: start,
        frame_read_size: end - start,
        frame_code: relative(l.frame_code),
        frame_previous: relative(l.frame_previous),
        frame_instr: relative(l.frame_instr),
        frame_globals: relative(l.frame_globals),
        frame_owner: relative(l.frame_owner),
        frame_is_entry: relative(l.frame_is_entry),
        // From 3.11 frames live on the thread's data stack (bar generators'),
        // each caller's right below its callee's.
        frames_contiguous: (l.frame_owner != NO_FIELD) as u32,
        names_read_start: names.start,
        names_read_size: names.size,
        name_in_read: l.code_qualname - names.start,
        file_in_read: l.code_filename - names.start,
        tstate_thread_id: l.tstate_thread_id,
        tstate_read_start: tstate.start,
        tstate_read_size: tstate.size,
        tstate_id_in_read: l.tstate_thread_id - tstate.start,
        tstate_current_in_read: l.tstate_current - tstate.start,
        interp_threads_head: l.interp_threads_head,
        tstate_next: l.tstate_next,
        tstate_running_task: l.tstate_asyncio_running_task,
        ..gil_fields(l, interpreters_head)
    }
}

/// The bytes from one 8-byte field to another, in either order, read at
/// once: a PyThreadState's thread id and current frame pointer (finding a
/// thread's state and its running frame cost one read of the target; larger
/// than bpf/sample.h's SAMPLE_TSTATE_HEAD, BPF would find no thread state
/// and count it), and a code object's qualified name and file name
/// pointers (a new stack's frame named in one read; NAMES_READ).
struct FieldsRead {
    start: u32,
    size: u32,
}

impl FieldsRead {
    fn covering(a: u32, b: u32) -> Self {
        let start = a.min(b);
        FieldsRead { start, size: a.max(b) + 8 - start }
    }

    fn tstate(l: &crate::python::Layout) -> Self {
        Self::covering(l.tstate_thread_id, l.tstate_current)
    }

    fn names(l: &crate::python::Layout) -> Self {
        Self::covering(l.code_qualname, l.code_filename)
    }
}

/// --gil: where the sampler finds the GIL, from the layout row (none in
/// a free-threaded build, and none to 3.11 until the runtime's address is
/// known: gil_size 0).
fn gil_fields(l: &crate::python::Layout, interpreters_head: u64) -> sample_target {
    let in_runtime = l.gil_in_runtime != NO_FIELD;
    if l.free_threaded || (in_runtime && interpreters_head == 0) {
        return sample_target::default();
    }
    let runtime = interpreters_head.wrapping_sub(l.runtime_interpreters_head as u64);
    sample_target {
        gil_address: if in_runtime { runtime + l.gil_in_runtime as u64 } else { 0 },
        interp_gil: l.gil_pointer_in_interp,
        gil_last_holder: l.gil_last_holder,
        gil_locked: l.gil_locked,
        gil_size: l.gil_size,
        ..Default::default()
    }
}

fn put_target(maps: &TargetMaps, pid: u32, entry: &sample_target) -> Result<()> {
    // SAFETY: a plain integer struct generated from bpf/sample.h.
    let bytes = unsafe { std::slice::from_raw_parts((entry as *const sample_target).cast::<u8>(), std::mem::size_of::<sample_target>()) };
    maps.by_pid.update(&pid.to_ne_bytes(), bytes, MapFlags::ANY).with_context(|| format!("failed to add process {pid} to the sampler"))?;
    if let Some(only) = maps.only {
        only.update(&0u32.to_ne_bytes(), bytes, MapFlags::ANY).with_context(|| format!("failed to add process {pid} to the sampler"))?;
    }
    Ok(())
}

/// &_PyRuntime.interpreters.head and &PyCode_Type in the target, once its
/// interpreter file is mapped.
fn runtime_addresses(pid: u32, python: &Python) -> Result<(u64, Option<u64>)> {
    let bias = python.load_bias_in(pid).context("interpreter not mapped yet")?;
    let head = python.symbol(RUNTIME_SYMBOL)?.wrapping_add(bias) + python.layout.runtime_interpreters_head as u64;
    Ok((head, python.elf.symbol("PyCode_Type").map(|t| t.wrapping_add(bias))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A python3.11 that sleeps, killed when dropped.
    struct Sleeper(std::process::Child);

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn sleeper() -> (u32, Sleeper) {
        let child = std::process::Command::new("/usr/bin/python3.11").args(["-c", "import time; print(1, flush=True); time.sleep(60)"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut child = Sleeper(child);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.0.stdout.as_mut().unwrap()), &mut line).unwrap();
        (child.0.id(), child)
    }

    /// --all with the map full: the process that does not fit is counted
    /// and skipped (the run goes on); once a sampled process exits, its
    /// entry leaves the map and the next process fits. A real BPF map of
    /// two entries, real Pythons.
    #[test]
    fn a_full_map_skips_processes_and_exits_free_their_entries() {
        let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts { sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _, ..Default::default() };
        let map = libbpf_rs::MapHandle::create(libbpf_rs::MapType::Hash, Some("test_processes"), 4, std::mem::size_of::<sample_target>() as u32, 2, &opts).unwrap();
        let (a, mut first) = sleeper();
        let (b, _second) = sleeper();
        let (c, _third) = sleeper();
        let mut processes = Processes::new(true);
        let maps = TargetMaps { by_pid: &map, only: None };
        for pid in [a, b, c] {
            processes.add(&maps, pid, PythonRef::Owned(Box::new(Python::from_pid(pid).unwrap()))).unwrap();
        }
        assert_eq!((processes.by_pid.len(), processes.counts.not_sampled), (2, 1));
        assert!(!processes.by_pid.contains_key(&c));

        let _ = first.0.kill();
        let _ = first.0.wait();
        processes.prune(&map, 1, &live_pids());
        assert_eq!(processes.counts.exited, 1);
        assert_eq!(map.keys().count(), 1, "the exited process left the map");
        processes.add(&maps, c, PythonRef::Owned(Box::new(Python::from_pid(c).unwrap()))).unwrap();
        assert_eq!(map.keys().count(), 2);
        assert!(processes.by_pid.contains_key(&c));

        assert!(processes.forget_exited(2).is_empty(), "kept until its last samples are named");
        assert_eq!(processes.forget_exited(1 + KEEP_EXITED_DRAINS), vec![a]);
        assert_eq!(processes.by_pid.len(), 2);
    }

    /// Each version's frame fields, read in one go, lie inside the bytes read.
    #[test]
    fn frame_reads_cover_every_field_and_no_more() {
        for l in crate::python::layouts::LAYOUTS {
            let fields = [l.frame_code, l.frame_previous, l.frame_instr, l.frame_globals, l.frame_owner, l.frame_is_entry];
            let start = fields.iter().copied().filter(|&o| o != NO_FIELD).min().unwrap() & !7;
            let end = fields.iter().copied().filter(|&o| o != NO_FIELD).map(|o| o + 8).max().unwrap();
            assert!(end - start <= 128, "{:?}: {} bytes", l.version, end - start);
            for f in [l.frame_code, l.frame_previous, l.frame_instr, l.frame_globals] {
                assert_eq!((f - start) % 8, 0, "{:?}: 8-byte fields stay aligned", l.version);
            }
        }
    }

    /// Each version's two-field reads fit their buffers in bpf/sample.h
    /// and hold both fields as 8-byte words: a thread's id and current
    /// frame pointer in SAMPLE_TSTATE_HEAD (256 bytes), a code object's
    /// name and file name pointers in NAMES_READ (32 bytes).
    #[test]
    fn two_field_reads_fit_and_hold_both_fields() {
        for l in crate::python::layouts::LAYOUTS {
            let reads = [
                (FieldsRead::tstate(l), [l.tstate_thread_id, l.tstate_current], 256),
                (FieldsRead::names(l), [l.code_qualname, l.code_filename], 32),
            ];
            for (read, fields, most) in reads {
                assert!(read.size >= 8 && read.size <= most, "{:?}: {} bytes", l.version, read.size);
                for f in fields {
                    assert!(f >= read.start && f + 8 <= read.start + read.size, "{:?}", l.version);
                    assert!((f - read.start).is_multiple_of(8), "{:?}: 8-byte fields stay aligned", l.version);
                }
            }
        }
    }

    /// The identity a rescan keeps for each PID, without reading its files:
    /// readdir's inode number is the one a stat of /proc/PID gives; a
    /// running process's start time is the one read alone, and a zombie
    /// (exited, not yet reaped) has none.
    #[test]
    fn a_pid_is_known_by_its_proc_inode_and_a_zombie_is_not_running() {
        use std::os::unix::fs::MetadataExt;
        let (pid, _sleeper) = sleeper();
        let live = live_pids();
        assert_eq!(live.get(&pid), Some(&std::fs::metadata(format!("/proc/{pid}")).unwrap().ino()));
        assert_eq!(running_start_time(pid), start_time(pid));
        assert!(running_start_time(pid).is_some());
        let mut zombie = std::process::Command::new("/bin/true").spawn().unwrap();
        let zpid = zombie.id();
        let waited = Instant::now();
        while proc::is_running(zpid) && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(start_time(zpid).is_some(), "the zombie is still in /proc");
        assert_eq!(running_start_time(zpid), None);
        zombie.wait().unwrap();
        assert_eq!(running_start_time(zpid), None);
    }
}
