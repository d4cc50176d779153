//! BPF sessions: load a program, point it at a target, collect what it
//! aggregated. One file per BPF program; the subcommands in src/commands
//! wire these to reports. What they all share is here.

pub mod calls;
pub mod compare;
pub mod gc;
pub mod gil;
pub mod imports;
mod perf_event;
pub mod sample;
pub mod watchpoint;
pub mod memory;
pub mod allocations;

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::Result;
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBufferBuilder};

use crate::model::counters::{Counters, Kind};
use crate::process::proc;

/// How a subcommand sees the interpreter's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// CPython's own USDT probes.
    Usdt,
    /// Uprobes on the interpreter's functions.
    Uprobe,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Usdt => "usdt",
            Mode::Uprobe => "uprobe",
        }
    }
}

/// A skeleton's `py_layout` (each skeleton has its own generated type with
/// the fields of bpf/python.h) from a version's layout.
macro_rules! py_layout {
    ($ty:path, $l:expr) => {{
        let l: &crate::python::layouts::Layout = $l;
        $ty {
            tstate_interp: l.tstate_interp,
            tstate_current: l.tstate_current,
            cframe_current_frame: l.cframe_current_frame,
            interp_eval_frame: l.interp_eval_frame,
            frame_code: l.frame_code,
            frame_owner: l.frame_owner,
            object_type: l.object_type,
            code_flags: l.code_flags,
            code_filename: l.code_filename,
            code_qualname: l.code_qualname,
            code_firstlineno: l.code_firstlineno,
            unicode_length: l.unicode_length,
            unicode_hash: l.unicode_hash,
            unicode_state: l.unicode_state,
            unicode_ascii_data: l.unicode_ascii_data,
            unicode_compact_data: l.unicode_compact_data,
            unicode_kind_shift: l.unicode_kind_shift,
            frame_owned_by_thread: l.frame_owned_by_thread,
            frame_owned_not_code: l.frame_owned_not_code,
            code_tag_bits: l.code_tag_bits,
        }
    }};
}
pub(crate) use py_layout;

/// EPERM/EACCES means missing privileges only when we are not root; as root
/// EACCES is the verifier refusing a program, whose log libbpf has printed.
pub fn privilege_hint(e: libbpf_rs::Error) -> anyhow::Error {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if e.kind() == libbpf_rs::ErrorKind::PermissionDenied && !root {
        anyhow::Error::new(e).context("tracing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE)")
    } else {
        anyhow::Error::new(e)
    }
}

/// An attach failure, said as what the user can act on: the target is gone,
/// or privileges are missing, or libbpf's own reason.
pub fn attach_error(pid: u32, e: libbpf_rs::Error) -> anyhow::Error {
    let said = crate::bpf::load::take_libbpf_warning();
    if !proc::is_running(pid) {
        anyhow::anyhow!("process {pid} exited while pytrace was attaching")
    } else if let Some(said) = said {
        privilege_hint(e).context(said)
    } else {
        privilege_hint(e)
    }
}

/// Whether this kernel has uprobe sessions (Linux 6.13+; 6.10 to 6.12 have
/// the session kfuncs, for kprobes only). PYTRACE_NO_UPROBE_SESSION=1
/// forces the older path (the tests use it to cover kernels without them).
pub fn has_uprobe_sessions() -> bool {
    crate::kernel::Kernel::get().has(crate::kernel::Feature::UprobeSession)
}

/// Attaches entry and return probes at one function: as one uprobe session
/// where the kernel has them, else as a uprobe and a uretprobe. The links
/// come back return-probe first, so dropping them in order detaches the
/// return probe before the entry probe.
pub fn attach_entry_and_return(
    session: &libbpf_rs::ProgramMut,
    entry: &libbpf_rs::ProgramMut,
    ret: &libbpf_rs::ProgramMut,
    pid: u32,
    path: &std::path::Path,
    offset: usize,
) -> Result<Vec<libbpf_rs::Link>> {
    if has_uprobe_sessions() {
        let opts = libbpf_rs::UprobeMultiOpts { offsets: vec![offset], session: true, ..Default::default() };
        return Ok(vec![session.attach_uprobe_multi_with_opts(pid as i32, path, "", opts).map_err(|e| attach_error(pid, e))?]);
    }
    Ok(vec![
        ret.attach_uprobe(true, pid as i32, path, offset).map_err(|e| attach_error(pid, e))?,
        entry.attach_uprobe(false, pid as i32, path, offset).map_err(|e| attach_error(pid, e))?,
    ])
}

/// Where to put an entry probe (and a return probe) on a function whose
/// machine code starts with `code` at file offset `offset`: past a leading
/// endbr64 when a push follows it. The kernel single-steps endbr64 (about
/// 15 us a hit on this VM, measured on Debian's 3.15) but emulates push
/// (about 1.2 us); and before that push nothing has moved the stack
/// pointer, so a return probe there still finds the return address at it.
/// Any other prologue keeps the function's first byte.
pub fn entry_probe_offset(code: &[u8], offset: usize) -> usize {
    use crate::process::elf::ENDBR64;
    if code.starts_with(&ENDBR64) && starts_with_push(&code[ENDBR64.len()..]) {
        offset + ENDBR64.len()
    } else {
        offset
    }
}

/// Whether the kernel emulates the instruction an entry probe on this code
/// sits on (see entry_probe_offset), rather than single-stepping it.
pub fn entry_probe_is_emulated(code: &[u8]) -> bool {
    starts_with_push(code.strip_prefix(&crate::process::elf::ENDBR64[..]).unwrap_or(code))
}

/// push %reg, with or without a REX.B prefix.
fn starts_with_push(code: &[u8]) -> bool {
    matches!(code, [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..])
}

/// Fails if the target died while probes were being attached.
pub fn ensure_still_running(pid: u32) -> Result<()> {
    if !proc::is_running(pid) {
        anyhow::bail!("process {pid} exited while pytrace was attaching");
    }
    Ok(())
}

/// A BPF session not started yet: what its program needs to be opened,
/// loaded and attached into the libbpf objects the session driver holds
/// (`session::Live::run`), so that no caller handles those objects'
/// lifetimes. The session borrows the objects (`'obj`), hence the generic
/// associated type. Two plans side by side (`pytrace compare`) are one
/// plan too (compare.rs), started in order into an object each.
pub trait Start {
    /// What the started session's `finish` gives back.
    type Data;
    /// Room for the session's libbpf objects: an `Object` per program.
    type Objects: Objects;
    type Session<'obj>: Tracing<Data = Self::Data>;

    /// Opens, loads and attaches the program into `objects`.
    fn start<'obj>(self, objects: &'obj mut Self::Objects) -> Result<Self::Session<'obj>>;
}

/// Room for one BPF program's libbpf object, which a skeleton opens in
/// place and its session then borrows.
pub type Object = MaybeUninit<OpenObject>;

/// Room for a session's libbpf objects, made empty by the driver before
/// the session starts in it.
pub trait Objects {
    fn empty() -> Self;
}

impl Objects for Object {
    fn empty() -> Self {
        MaybeUninit::uninit()
    }
}

impl<A: Objects, B: Objects> Objects for (A, B) {
    fn empty() -> Self {
        (A::empty(), B::empty())
    }
}

/// A BPF program loaded and attached to its target, in the steps the
/// session driver (src/session/driver.rs) runs it by. Two side by side
/// (`pytrace compare`) are one session too (compare.rs).
pub trait Tracing {
    /// What `finish` gives back.
    type Data;

    /// The program, for error messages ("the {what} ring buffer").
    fn what(&self) -> String;

    /// Adds the session's ring buffers to `builder`.
    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()>;

    /// Whether the program sends records at all; one that only sums in
    /// maps (gil) has no ring buffer to read, and the driver just waits.
    fn has_records(&self) -> bool {
        true
    }

    /// How long `between_polls` (and the command's `keep_going`) may wait:
    /// zero for every round. A signal runs them at once whatever this is.
    fn check_every(&self) -> Duration {
        Duration::ZERO
    }

    /// Periodic work between two reads of the ring buffers (follow forked
    /// children, drain counts, locate interpreters).
    fn between_polls(&self) -> Result<()> {
        Ok(())
    }

    /// After each read of the ring buffers.
    fn after_poll(&self) {}

    /// When the session must next run `run_due` (--idle's passes over the
    /// threads), if it has such work.
    fn next_due(&self) -> Option<Instant> {
        None
    }

    /// Runs the work `next_due` announced.
    fn run_due(&self) -> Result<()> {
        Ok(())
    }

    /// The links that keep the session's programs attached, which the
    /// default `detach` drops. None for a session that detaches in its own
    /// way: compare's pair (each of the two), the sampler (its clock first).
    fn links(&self) -> Option<&Links>;

    /// Opens the traced window, where the program counts only inside one
    /// (calls: once the eval-frame hook is set).
    fn start_counting(&self) {}

    /// calls: the eval-frame hook was just set, so what only served to
    /// stop the command before it can go.
    fn hook_set(&self) {}

    /// Ends the traced window, before anything is put back or detached:
    /// from here on the program changes nothing.
    fn stop_counting(&self) {}

    /// What must happen just before the probes go (close a measuring
    /// window, drop a probe that only served the start).
    fn before_detach(&self) {}

    /// Stops the probes; the maps stay readable. Once this returns no
    /// program runs any more, so the ring buffers hold every record there
    /// will be.
    fn detach(&self) {
        self.before_detach();
        if let Some(links) = self.links() {
            links.clear();
        }
    }

    /// Reads what the program gathered, once `detach` has run (the driver
    /// sees to it) and the ring buffers have been drained and dropped.
    fn finish(self) -> Result<Self::Data>;
}

/// A session's attached programs: dropping a link detaches its program.
/// Behind a RefCell because a session adds links while it is driven (gc's
/// watchpoint is set once the target's interpreter exists).
#[derive(Default)]
pub struct Links(RefCell<Vec<Link>>);

impl Links {
    pub fn new(links: Vec<Link>) -> Self {
        Links(RefCell::new(links))
    }

    pub fn extend(&self, links: impl IntoIterator<Item = Link>) {
        self.0.borrow_mut().extend(links);
    }

    /// Detaches every program, in the order they were attached, without
    /// letting the kernel hold the run (see `detach_links`).
    pub fn clear(&self) {
        detach_links(std::mem::take(&mut *self.0.borrow_mut()));
    }
}

/// How long a run waits for the kernel to finish detaching its probes
/// before it leaves the rest to a process of its own. On this host a
/// detach takes under 10 ms unless the kernel waits for return probes
/// pending in any traced process (see `detach_links`).
const DETACH_WAIT: Duration = Duration::from_millis(1000);

/// A detach that took longer than this is said on stderr: it is no part
/// of the traced time.
pub const SAY_SLOW_STEP: Duration = Duration::from_millis(500);

/// Closes `links` from a child process, and waits for it at most
/// DETACH_WAIT. Since Linux 6.12 closing a uprobe link waits
/// (`uprobe_unregister_sync`: `synchronize_srcu(&uretprobes_srcu)`) for
/// every return probe pending on the host, and a thread that keeps making
/// probed calls renews its lease on the oldest one (`ri_timer` is pushed
/// back at each new return instance): a run traced by another pytrace, or
/// by any uretprobe user, could hold this close for as long as that other
/// run lasts, unkillable (state D). The kernel removes the breakpoints
/// before it waits, so by then no new event comes; the child does the
/// waiting, with nothing else open (not the terminal, nor a pipe someone
/// reads to its end, nor the hook's lock), in a session of its own, so
/// that neither the report nor pytrace's exit waits for it. A process that
/// exits with the last reference to a link would wait in exit instead,
/// and still hold its shell: the child holds the last one, not pytrace.
pub fn detach_links(links: Vec<Link>) {
    use std::os::fd::{AsFd, AsRawFd};
    if links.is_empty() {
        return;
    }
    let started = Instant::now();
    let mut fds: Vec<libc::c_int> = links.iter().map(|l| l.as_fd().as_raw_fd()).collect();
    // The child closes the links only once ours are closed (EOF on this
    // pipe): if it closed first, ours would be the last references, and
    // closing them would be the wait this is about.
    let mut go = [-1; 2];
    // SAFETY: pipe2 fills the array.
    if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        go = [-1, -1];
    }
    if go[0] >= 0 {
        fds.push(go[0]);
    }
    fds.sort_unstable();
    // SAFETY: opened before the fork, so the child only makes system calls.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    // SAFETY: the child makes only async-signal-safe system calls on fds it
    // inherited, then _exit: no allocation, no lock, no Rust destructor.
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            libc::setsid();
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
                libc::signal(sig, libc::SIG_IGN);
            }
            if null >= 0 {
                for std_fd in 0..3 {
                    libc::dup2(null, std_fd);
                }
            }
            // Every fd above stderr but the links: gaps between them.
            let mut from: libc::c_uint = 3;
            for &fd in &fds {
                let fd = fd as libc::c_uint;
                if fd > from {
                    libc::syscall(libc::SYS_close_range, from, fd - 1, 0);
                }
                from = from.max(fd + 1);
            }
            libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0);
            if go[0] >= 0 {
                let mut byte = 0u8;
                while libc::read(go[0], (&mut byte as *mut u8).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
            }
            for &fd in &fds {
                libc::close(fd);
            }
            libc::_exit(0);
        }
    }
    if null >= 0 {
        // SAFETY: our own fd.
        unsafe { libc::close(null) };
    }
    // Ours are not the last references when the child holds them: closing
    // them is quick. Without a child (fork failed), this is the detach.
    drop(links);
    for fd in go {
        if fd >= 0 {
            // SAFETY: our own pipe's ends; closing the write end lets the child go.
            unsafe { libc::close(fd) };
        }
    }
    if child < 0 {
        say_slow_detach(started.elapsed());
        return;
    }
    loop {
        let mut status = 0;
        // SAFETY: reaps our own child, without blocking.
        let reaped = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if reaped != 0 {
            say_slow_detach(started.elapsed());
            return;
        }
        if started.elapsed() >= DETACH_WAIT {
            crate::console::err(&format!(
                "pytrace: the kernel had not finished detaching pytrace's probes after {:.1} s (it waits for return probes still pending in traced processes, this one's or another tracer's); process {child} finishes that on its own: the probes no longer fire, and neither the report nor pytrace waits for it\n",
                started.elapsed().as_secs_f64()
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn say_slow_detach(took: Duration) {
    if took > SAY_SLOW_STEP {
        crate::console::err(&format!("pytrace: detaching the probes took {:.1} s (not part of the traced time)\n", took.as_secs_f64()));
    }
}

/// One counter of a BPF program's per-CPU counter array: its JSON name,
/// its kind, what one of it is, and its index (the program's enum).
pub type CounterRow = (&'static str, Kind, &'static str, u32);

/// Sums a per-CPU array of u64 counters, by name.
pub fn read_counters(map: &dyn MapCore, names: &[CounterRow]) -> Result<Counters> {
    let mut counters = Counters::default();
    for &(name, kind, what, index) in names {
        let sum = map
            .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)?
            .map(|cpus| cpus.iter().map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap())).sum())
            .unwrap_or(0);
        counters.push(name, kind, what, sum);
    }
    Ok(counters)
}

/// CLOCK_MONOTONIC now, the clock of bpf_ktime_get_ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// How long a loaded BPF program has run, and how often: (run_time_ns,
/// run_cnt). Counted only while kernel.bpf_stats_enabled is 1 (the
/// benchmark turns it on); None otherwise.
pub fn bpf_run_stats(prog: &libbpf_rs::ProgramMut) -> Option<(u64, u64)> {
    use std::os::fd::{AsFd, AsRawFd};
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: the kernel fills at most `len` bytes of `info`.
    let r = unsafe {
        libbpf_rs::libbpf_sys::bpf_obj_get_info_by_fd(prog.as_fd().as_raw_fd(), (&mut info as *mut libbpf_rs::libbpf_sys::bpf_prog_info).cast(), &mut len)
    };
    (r == 0 && info.run_cnt > 0).then_some((info.run_time_ns, info.run_cnt))
}

#[cfg(test)]
mod tests {
    use super::{entry_probe_is_emulated, entry_probe_offset};

    #[test]
    fn entry_probes_skip_endbr64_only_before_a_push() {
        // Debian's 3.15: endbr64; push %rbp
        assert_eq!(entry_probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48], 100), 104);
        // endbr64; push %r15
        assert_eq!(entry_probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57], 100), 104);
        // Debian's 3.13: endbr64; sub $0x1a8,%rsp (the stack moves: stay put)
        assert_eq!(entry_probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x81, 0xec], 100), 100);
        // Debian's 3.11: push %r15 first; and too little code
        assert_eq!(entry_probe_offset(&[0x41, 0x57, 0x41, 0x56], 100), 100);
        assert_eq!(entry_probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa], 100), 100);
        assert!(entry_probe_is_emulated(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]));
        assert!(entry_probe_is_emulated(&[0x41, 0x57]));
        assert!(!entry_probe_is_emulated(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x81, 0xec]));
    }
}
