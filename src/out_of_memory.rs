//! Running out of memory (a low RLIMIT_AS, a memory cgroup's limit) ends
//! pytrace with one sentence and exit code 1, not Rust's abort with a
//! backtrace and a core (exit 134).
//!
//! The system allocator, with a check on what it returns: an allocation it
//! cannot make writes the sentence with write(2) (formatting would itself
//! allocate) and `_exit`s. Destructors do not run, so a hook pytrace set in
//! a target is put back by its guardian (a process of its own, forked
//! before anything was written, which restores within a second of
//! pytrace's death), as after a SIGKILL. Nothing in pytrace asks for memory
//! fallibly (`try_reserve`), so no caller expected the null back.

use std::alloc::{GlobalAlloc, Layout, System};

pub struct ExitWhenExhausted;

// SAFETY: every call is System's, with the same arguments; a null result
// never returns to the caller, it ends the process.
unsafe impl GlobalAlloc for ExitWhenExhausted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        checked(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        checked(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        checked(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn checked(ptr: *mut u8, size: usize) -> *mut u8 {
    if ptr.is_null() {
        exit_out_of_memory(size);
    }
    ptr
}

/// Makes the panic std raises in a new thread whose signal stack it
/// cannot map ("failed to allocate an alternative stack: Cannot allocate
/// memory", before the thread's own code runs) end pytrace as any other
/// allocation failure does: one sentence, exit 1. Other panics keep Rust's
/// hook. Seen under a low `ulimit -v` as `sample` started its clock threads.
pub fn say_failed_thread_stacks() {
    let rust_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied());
        if message.is_some_and(|m| m.contains("alternative stack")) {
            exit_with(&[b"pytrace: out of memory: could not map a new thread's signal stack (check ulimit -v, RLIMIT_AS, or the memory cgroup's limit)\n"]);
        }
        rust_hook(info)
    }));
}

/// The address space left per thread pytrace starts, at least: its 2 MiB
/// stack and guard page, std's signal stack, and what glibc maps for its
/// first allocations (a new thread's malloc arena reserves more than the
/// limit then leaves). Measured: with 12 MiB left for two threads, glibc
/// still aborted; with 16 MiB a thread, a sweep of limits from 54,000 to
/// 58,000 KiB (every 40) gave this sentence or a good run, nothing else.
const THREAD_ROOM: u64 = 16 << 20;

/// Fails in one sentence if the address space limit (RLIMIT_AS, `ulimit
/// -v`) leaves less than `threads` threads' room. Past it a thread's start
/// can fail where nothing can say so: glibc aborts when it cannot register
/// a thread-local destructor ("Fatal glibc error", exit 134; CI's
/// cli_limits at `ulimit -v 35512`, `sample`'s clock threads).
pub fn ensure_room_for_threads(threads: usize) -> anyhow::Result<()> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(used_kib) = status.lines().find_map(|l| l.strip_prefix("VmSize:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()) else {
        return Ok(());
    };
    let (left, need) = (limit.rlim_cur.saturating_sub(used_kib << 10), threads as u64 * THREAD_ROOM);
    if left < need {
        anyhow::bail!(
            "out of memory: {threads} threads need {} MiB of address space, and the limit leaves {} MiB (check ulimit -v, RLIMIT_AS)",
            need >> 20,
            left >> 20
        );
    }
    Ok(())
}

fn exit_with(parts: &[&[u8]]) -> ! {
    for part in parts {
        // SAFETY: write(2) of a live buffer; a failure has nowhere to go.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: _exit(2) ends the process without running anything else.
    unsafe { libc::_exit(1) }
}

fn exit_out_of_memory(size: usize) -> ! {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = size;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    exit_with(&[b"pytrace: out of memory: could not allocate ", &digits[at..], b" bytes (check ulimit -v, RLIMIT_AS, or the memory cgroup's limit)\n"])
}
