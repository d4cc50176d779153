//! perf_event_open(2), for the two kinds of event pytrace attaches BPF to:
//! the sampler's CPU clock (sample/clock.rs) and gc's hardware watchpoint
//! (watchpoint.rs). One copy of the attr struct and of the system call.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The start of perf_event_attr, up to bp_len: the kernel takes any size
/// it knows and zero-fills the rest.
#[repr(C)]
#[derive(Default)]
pub struct PerfEventAttr {
    pub kind: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub bp_addr: u64,
    pub bp_len: u64,
}

pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_BREAKPOINT: u32 = 5;
pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// attr.flags bits.
pub const INHERIT: u64 = 1 << 1;
pub const EXCLUDE_KERNEL: u64 = 1 << 5;
pub const EXCLUDE_HV: u64 = 1 << 6;
pub const EXCLUDE_IDLE: u64 = 1 << 7;
pub const HW_BREAKPOINT_W: u32 = 2;
const PERF_FLAG_FD_CLOEXEC: u64 = 1 << 3;

/// Opens an event for thread `tid` (-1: every thread) on `cpu` (-1: any);
/// `attr.size` is filled in here.
pub fn open(mut attr: PerfEventAttr, tid: i32, cpu: i32) -> std::io::Result<OwnedFd> {
    attr.size = std::mem::size_of::<PerfEventAttr>() as u32;
    // SAFETY: perf_event_open with a valid attr that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr, tid, cpu, -1i32, PERF_FLAG_FD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
