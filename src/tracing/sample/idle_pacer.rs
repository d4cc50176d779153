//! --idle's own thread: one pass of the thread iterator at each tick
//! (clock.rs IdleTicks), at real-time priority when pytrace may have it.
//!
//! Why a thread of its own, and why real-time: a pass is a wall-clock
//! sample of every thread, so its instants must not depend on what the
//! target does. A pass run from the poll loop, at normal priority, waits
//! for a CPU on a busy machine, and a CPU comes free mostly when the
//! target stops running: the passes then land after the target's bursts
//! of work and under-sample them. Measured on this 2-core machine at load
//! 3 (fixtures/async_idle.py on 3.15, a task spinning 22 % of the loop's
//! wall time): 0.12 to 0.17 of the loop's samples at normal priority,
//! 0.22 to 0.28 with this thread at SCHED_FIFO 1 (truth 0.22 to 0.27, the
//! target at normal priority). Ticks pytrace still misses are counted.
//!
//! A real-time thread must not take a CPU from everything else: after a
//! pass it waits at least as long as the pass took (at most half of one
//! CPU whatever the machine's size or the rate), the ticks that fall in
//! that wait counted as missed.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, Result};

use super::clock::IdleTicks;

/// The priority asked for: the lowest real-time one, above every normal
/// thread and below every real-time thread the machine already has.
const REALTIME_PRIORITY: i32 = 1;

/// The thread, running passes until dropped.
pub struct IdlePacer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<PacerEnd>>,
}

/// What the thread hands back when it stops.
pub struct PacerEnd {
    pub ticks: IdleTicks,
    /// Whether it ran at real-time priority (not: no CAP_SYS_NICE, or the
    /// machine's real-time budget is 0).
    pub realtime: bool,
    /// The first pass that failed, which ended the passes.
    pub failed: Option<String>,
}

impl IdlePacer {
    /// Starts passes over the iterator `link` (a BPF link of an iter
    /// program, which must outlive the pacer) at the ticks of `ticks`.
    /// `counts_lock` is held during each pass: user space takes the counts
    /// the passes add to only while holding it, so no increment is lost to
    /// a delete.
    pub fn start(link: BorrowedFd<'_>, ticks: IdleTicks, counts_lock: Arc<Mutex<()>>) -> Result<Self> {
        let link = link.try_clone_to_owned().context("failed to duplicate the thread iterator's descriptor")?;
        crate::out_of_memory::ensure_room_for_threads(1)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pytrace-idle".into())
            .spawn(move || run(link, ticks, &counts_lock, &stopping))
            .context("failed to start the --idle sampling thread")?;
        Ok(IdlePacer { stop, thread: Some(thread) })
    }

    /// Stops the passes (the one under way ends first) and returns the
    /// thread's account.
    pub fn finish(mut self) -> Option<PacerEnd> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Option<PacerEnd> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take()?;
        thread.thread().unpark();
        thread.join().ok()
    }
}

impl Drop for IdlePacer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn run(link: OwnedFd, mut ticks: IdleTicks, counts_lock: &Mutex<()>, stop: &AtomicBool) -> PacerEnd {
    let realtime = become_realtime();
    let mut failed = None;
    ticks.restart();
    while !stop.load(Ordering::SeqCst) {
        let due = ticks.next();
        let now = Instant::now();
        if now < due {
            // Parked (a futex wait): the lightest wait that stopping can
            // cut short; a real-time thread's timers have no slack.
            std::thread::park_timeout(due - now);
            continue;
        }
        let started = Instant::now();
        let pass = {
            let _held = counts_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            one_pass(&link)
        };
        if let Err(e) = pass {
            failed = Some(format!("{e:#}"));
            break;
        }
        let ended = Instant::now();
        ticks.advance(started);
        ticks.not_before(ended + (ended - started));
    }
    PacerEnd { ticks, realtime, failed }
}

/// One pass of the iterator: each read runs the program over more threads,
/// until the end.
fn one_pass(link: &OwnedFd) -> Result<()> {
    // SAFETY: a BPF link descriptor of an iter program; the call returns a
    // new descriptor or a negative errno.
    let fd = unsafe { libbpf_rs::libbpf_sys::bpf_iter_create(link.as_raw_fd()) };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd)).context("failed to start a pass over the threads");
    }
    // SAFETY: fd was just returned to us, owned by nobody else.
    let pass = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(pass);
    // The program writes nothing into the pass: reads return 0 bytes once
    // every thread is done.
    let mut nothing = [0u8; 64];
    loop {
        match std::io::Read::read(&mut file, &mut nothing) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("failed to sample the threads"),
        }
    }
}

/// SCHED_FIFO for this thread alone (sched_setscheduler with 0 is the
/// calling thread on Linux). False where it is not allowed.
fn become_realtime() -> bool {
    let param = libc::sched_param { sched_priority: REALTIME_PRIORITY };
    // SAFETY: a valid sched_param for the calling thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}
