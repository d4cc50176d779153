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
    let parts: [&[u8]; 3] = [b"pytrace: out of memory: could not allocate ", &digits[at..], b" bytes (check ulimit -v, RLIMIT_AS, or the memory cgroup's limit)\n"];
    for part in parts {
        // SAFETY: write(2) of a live buffer; a failure has nowhere to go.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: _exit(2) ends the process without running anything else.
    unsafe { libc::_exit(1) }
}
