//! `pytrace heap`'s run: one walk of a target's heap (or one every
//! interval), read from outside with no BPF and nothing written into the
//! target. With `stop`, every thread is held in a ptrace stop for the
//! walk (PTRACE_SEIZE + PTRACE_INTERRUPT, never SIGSTOP): the guard
//! detaches on every path, and if pytrace dies the kernel detaches its
//! tracees, so the target always runs on.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use crate::model::heap::{Census, PagesRead, TypeRow};
use crate::process::proc::{self, Memory};
use crate::python::layouts::heap::{self, Obmalloc};
use crate::python::reading::heap::arenas::{self, ArenaTable};
use crate::python::reading::heap::gc_lists::{self, Tally};
use crate::python::reading::heap::mimalloc;
use crate::python::reading::heap::sizes::{Sizes, Tables};
use crate::python::reading::heap::tracked::{Heads, Scan};
use crate::python::reading::heap::types::Types;
use crate::python::reading::thread_names;
use crate::python::{Python, RUNTIME_SYMBOL};

pub struct HeapOptions {
    pub pid: u32,
    /// Hold the target stopped during each walk.
    pub stop: bool,
    /// A walk that takes longer ends there, marked partial.
    pub timeout: Duration,
}

/// Which Python the census is of, and the census.
pub struct HeapRun {
    pub version: String,
    pub census: Census,
    /// When the walk started: its young-generation count was read then.
    pub started_at: SystemTime,
}

/// Whether `pid` is gone, or goes within a moment: a process being
/// killed loses its memory (so a read fails) before /proc shows it dead,
/// and a walk that failed then must say the process exited, not blame
/// the layout. Only on a failure's path, so the wait costs a report
/// nothing.
fn exited_soon(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_millis(500);
    while proc::is_running(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// One census of `opts.pid`.
pub fn heap_census(opts: &HeapOptions) -> Result<HeapRun> {
    let python = Python::from_pid(opts.pid)?;
    let version = (python.version.major, python.version.minor);
    let layout = if python.free_threaded { heap::for_free_threaded(version) } else { heap::for_version(version) };
    let Some(layout) = layout else {
        let build = if python.free_threaded { "free-threaded " } else { "" };
        bail!("pytrace heap does not know the heap layout of Python {}'s {build}build yet", python.version);
    };
    let (census, started_at) = walk(opts, &python, layout).map_err(|e| {
        if exited_soon(opts.pid) && !e.to_string().contains("exited during the heap walk") {
            anyhow::anyhow!("process {} exited during the heap walk", opts.pid)
        } else {
            e
        }
    })?;
    Ok(HeapRun { version: python.version.to_string(), census, started_at })
}

fn walk(opts: &HeapOptions, python: &Python, heap: &heap::HeapLayout) -> Result<(Census, SystemTime)> {
    let pid = opts.pid;
    let mem = Memory::open(pid)?;
    let bias = python.load_bias_in(pid)?;
    let at = |name: &str| python.symbol(name).map(|a| a.wrapping_add(bias));
    let runtime = at(RUNTIME_SYMBOL)?;
    let layout = &python.layout;
    let tables = Tables { mem: &mem, dict_type: at("PyDict_Type")?, set_type: at("PySet_Type")?, frozenset_type: at("PyFrozenSet_Type")? };
    let sizes = Sizes::new(layout, heap, at("PyUnicode_Type")?, at("PyLong_Type")?, at("PyList_Type")?).with_tables(tables);
    let pytype = at("PyType_Type")?;
    // A list walk is at most one node per 32 bytes of the process's memory.
    let max_steps = rss_bytes(pid).max(1 << 20) / 32;

    let paused = if opts.stop { Some(Paused::stop(pid)?) } else { None };
    let interp = mem.read_u64_non_null(runtime + layout.runtime_interpreters_main as u64).context("no main interpreter")?;
    anyhow::ensure!(interp != 0, "the interpreter has not started");
    if heap.obmalloc == Obmalloc::Mimalloc {
        let types = Types::new(&mem, layout, heap, thread_names::dict_reader(pid, python).ok(), pytype);
        return walk_pages(pid, &mem, heap, layout, interp, runtime, types, &sizes, paused, opts.timeout);
    }
    let (generations, permanent) = gc_lists::heads(&mem, interp + layout.interp_gc as u64, heap.generations)?;
    // How far the heap changed during the walk: the young generation's
    // count before and after it (read_young_count). The walk's start and
    // length are those of the span between the two reads, so a change can
    // be checked against what the target did in that span.
    let (started, started_at) = (Instant::now(), SystemTime::now());
    let young_before = read_young_count(&mem, generations[0]);
    let deadline = started + opts.timeout;
    let heads = Heads::read(&mem, [generations[0], generations[1], generations[2], permanent])?;
    let table = ArenaTable::read(&mem, python, heap, interp, bias);
    let in_arena = |a: u64| table.as_ref().is_ok_and(|t| t.contains(a));
    let mut types = Types::new(&mem, layout, heap, thread_names::dict_reader(pid, python).ok(), pytype);
    // The tracked objects come from the pools with the plain ones (and,
    // without arenas, from the lists followed by pointer): tracked.rs.
    let mut scan = Scan::new(heads, heap.pre_header_flags);
    let plain = table.as_ref().ok().map(|t| arenas::walk(&mem, t, &mut types, &sizes, &mut scan, deadline));
    let mut lists = scan.finish(&mem, &mut types, &sizes, max_steps, deadline, in_arena);
    // gc.freeze()'s objects were found with the rest, but gc.get_objects()
    // leaves them out, and so do the rows: walked by pointer (375 objects
    // at a 3.12's start) and taken out; their number is said beside them.
    let frozen = gc_lists::walk(&mem, &mut types, &sizes, &[(permanent, "the permanent generation")], max_steps, deadline, in_arena);
    for (t, f) in &frozen.by_type {
        if let Some(tally) = lists.by_type.get_mut(t) {
            tally.count = tally.count.saturating_sub(f.count);
            tally.bytes = tally.bytes.saturating_sub(f.bytes);
        }
    }
    lists.by_type.retain(|_, tally| tally.count > 0);
    lists.objects = lists.objects.saturating_sub(frozen.objects);
    let young_after = read_young_count(&mem, generations[0]);
    let walk_ns = started.elapsed().as_nanos() as u64;
    let stopped_ns = paused.map(|p| p.resume());
    // A target that ended under the walk leaves a census of half a heap:
    // an error, not a report. One that is exiting may not be a zombie yet,
    // but its memory is gone already.
    if !proc::is_running(pid) || mem.read_u64(runtime).is_err() {
        let (read, all) = match (&table, &plain) {
            (Ok(t), Some(w)) => (w.arenas_read, t.arenas.len()),
            _ => (0, 0),
        };
        bail!("process {pid} exited during the heap walk, after {read} of {all} arenas and {} objects on the collector's lists", lists.objects);
    }

    let types_unnamed = unnamed_types(&types.infos, lists.by_type.keys().chain(plain.iter().flat_map(|w| w.by_type.keys())));
    let mut census = Census {
        tracked_objects: lists.objects,
        tracked_refused: lists.refused + frozen.refused,
        list_broken: lists.broken.or(frozen.broken),
        partial: lists.partial || frozen.partial,
        frozen_objects: frozen.objects,
        types_unnamed,
        tables_unread: sizes.tables_unread.get(),
        young_change: young_before.zip(young_after).map(|(before, after)| after as i64 - before as i64),
        walk_ns,
        stopped_ns,
        rss_bytes: rss_bytes(pid),
        ..Census::default()
    };
    match (&table, &plain) {
        (Ok(t), Some(w)) => {
            census.untracked_objects = w.plain_objects;
            census.arenas = w.arenas_read;
            census.arenas_unreadable = w.arenas_unreadable;
            census.arena_bytes = w.arenas_read * t.arena_size;
            census.block_bytes = w.block_bytes;
            census.pools = w.pools;
            census.pools_changed = w.pools_changed;
            census.partial |= w.partial;
        }
        (Err(e), _) => census.arenas_not_read = Some(format!("{e:#}")),
        _ => {}
    }
    census.rows = rows(&types.infos, &lists.by_type, plain.as_ref().map(|w| &w.by_type));
    Ok((census, started_at))
}

/// The census of a free-threaded build, from its mimalloc pages (no
/// collector lists: mimalloc.rs).
#[allow(clippy::too_many_arguments)]
fn walk_pages<'a>(pid: u32, mem: &Memory, heap: &heap::HeapLayout, layout: &crate::python::Layout, interp: u64, runtime: u64, mut types: Types<'a>, sizes: &Sizes<'a>, paused: Option<Paused>, timeout: Duration) -> Result<(Census, SystemTime)> {
    // A page is at least one 64 KiB slice of the process's memory.
    let max_pages = rss_bytes(pid).max(1 << 30) / (1 << 16);
    let (started, started_at) = (Instant::now(), SystemTime::now());
    let young_before = mimalloc::young_count(mem, layout, interp);
    let pages = mimalloc::walk(mem, layout, heap, interp, &mut types, sizes, max_pages, started + timeout);
    let young_after = mimalloc::young_count(mem, layout, interp);
    let walk_ns = started.elapsed().as_nanos() as u64;
    let stopped_ns = paused.map(|p| p.resume());
    if !proc::is_running(pid) || mem.read_u64(runtime).is_err() {
        bail!("process {pid} exited during the heap walk, after {} pages", pages.pages);
    }
    let census = Census {
        rows: rows(&types.infos, &pages.tracked, Some(&pages.plain)),
        tracked_objects: pages.tracked_objects,
        tracked_refused: pages.refused,
        list_broken: pages.broken,
        partial: pages.partial,
        frozen_objects: pages.frozen_objects,
        types_unnamed: unnamed_types(&types.infos, pages.tracked.keys().chain(pages.plain.keys())),
        tables_unread: sizes.tables_unread.get(),
        young_change: young_before.zip(young_after).map(|(before, after)| after - before),
        untracked_objects: pages.plain_objects,
        block_bytes: pages.block_bytes,
        pages_read: Some(PagesRead { threads: pages.threads, pages: pages.pages, pages_skipped: pages.pages_skipped, abandoned_segments: pages.abandoned_segments }),
        walk_ns,
        stopped_ns,
        rss_bytes: rss_bytes(pid),
        ..Census::default()
    };
    Ok((census, started_at))
}

/// The heap types named by tp_name alone, of those objects were counted
/// under (not of all those checked: words in the pools' buffers point at
/// types no object here has).
fn unnamed_types<'t>(infos: &[crate::python::reading::heap::types::TypeInfo], counted: impl Iterator<Item = &'t usize>) -> u64 {
    let counted: std::collections::HashSet<usize> = counted.copied().collect();
    counted.iter().filter(|&&t| infos[t].unnamed).count() as u64
}

/// One row per type name: two type objects of one name (a class defined
/// twice) are one row, as gc.get_objects() counted by name sees them.
fn rows(infos: &[crate::python::reading::heap::types::TypeInfo], tracked: &HashMap<usize, Tally>, plain: Option<&HashMap<usize, Tally>>) -> Vec<TypeRow> {
    let mut by_name: HashMap<(String, String, bool), TypeRow> = HashMap::new();
    let all = tracked.iter().map(|(t, c)| (t, c, true)).chain(plain.into_iter().flatten().map(|(t, c)| (t, c, false)));
    for (&t, tally, is_tracked) in all {
        let info = &infos[t];
        let row = by_name.entry((info.module.clone(), info.qualname.clone(), is_tracked)).or_insert_with(|| TypeRow {
            module: info.module.clone(),
            qualname: info.qualname.clone(),
            tracked: is_tracked,
            count: 0,
            bytes: 0,
        });
        row.count += tally.count;
        row.bytes += tally.bytes;
    }
    let mut rows: Vec<TypeRow> = by_name.into_values().collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)).then_with(|| a.name().cmp(&b.name())));
    rows
}

/// The collector's young-generation count (`gc_generation.count`, after its
/// list head and threshold, 3.9 to 3.15): objects it tracks allocated less
/// those freed since it last ran. Read just before and just after a walk,
/// the difference is how many tracked objects the heap gained (lost, if
/// negative) during it, or a collection ran (it resets the count to 0).
/// Free-threaded builds are refused before this. None: unreadable or no
/// count (negative).
fn read_young_count(mem: &Memory, young_head: u64) -> Option<i32> {
    let mut count = [0u8; 4];
    mem.read(young_head + 20, &mut count).ok()?;
    Some(i32::from_le_bytes(count)).filter(|&c| c >= 0)
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())))
        .map_or(0, |kib| kib * 1024)
}

/// Every thread of a process held in a ptrace stop; dropped, each is
/// detached (with any signal it stopped for), so it runs on.
struct Paused {
    /// Each seized thread and the signal to give back at its detach.
    threads: Vec<(libc::pid_t, i32)>,
    since: Instant,
}

/// A process with more threads than this is not stopped thread by thread.
const MAX_THREADS: usize = 1 << 14;

impl Paused {
    fn stop(pid: u32) -> Result<Self> {
        if let Some(tracer) = tracer_of(pid).filter(|&t| t != 0) {
            bail!("process {pid} is already traced by process {tracer}: --stop cannot hold it (run without --stop)");
        }
        let mut paused = Paused { threads: Vec::new(), since: Instant::now() };
        // Threads started while the first are seized: list again until no new one.
        loop {
            let tids = proc_tids(pid)?;
            let new: Vec<libc::pid_t> = tids.into_iter().filter(|t| !paused.threads.iter().any(|(s, _)| s == t)).collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                if paused.threads.len() >= MAX_THREADS {
                    bail!("process {pid} has more than {MAX_THREADS} threads: --stop does not hold that many");
                }
                // SAFETY: ptrace on a thread of the target; options none.
                if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
                    let err = std::io::Error::last_os_error();
                    if err.raw_os_error() == Some(libc::ESRCH) {
                        continue; // the thread ended
                    }
                    return Err(err).with_context(|| format!("--stop could not seize thread {tid} of process {pid}"));
                }
                paused.threads.push((tid, 0));
                // SAFETY: our tracee.
                unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) };
                let mut status = 0;
                // SAFETY: waiting for our tracee's stop.
                let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
                if got == tid && libc::WIFSTOPPED(status) && status >> 16 == 0 {
                    // A signal-delivery stop came first: the signal goes back at detach.
                    let sig = libc::WSTOPSIG(status);
                    if sig != libc::SIGTRAP {
                        paused.threads.last_mut().expect("pushed").1 = sig;
                    }
                }
            }
        }
        paused.since = Instant::now();
        Ok(paused)
    }

    /// Detaches every thread; how long the process was stopped.
    fn resume(self) -> u64 {
        self.since.elapsed().as_nanos() as u64
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &(tid, sig) in &self.threads {
            // SAFETY: our stopped tracee; detaching lets it run.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, sig as libc::c_long) };
        }
    }
}

fn tracer_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")?.trim().parse().ok())
}

fn proc_tids(pid: u32) -> Result<Vec<libc::pid_t>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).with_context(|| format!("process {pid} has exited"))?;
    Ok(dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
}
