//! A hardware watchpoint on one word of a process's memory, running a BPF
//! program at every write to it: one perf breakpoint event per thread
//! (`inherit`, so threads they start get one too), each with the program
//! attached. Used by `pytrace gc` on builds without USDT probes.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use libbpf_rs::{Link, ProgramMut};

use std::os::fd::IntoRawFd;

use super::perf_event::{self, PerfEventAttr, EXCLUDE_HV, EXCLUDE_KERNEL, HW_BREAKPOINT_W, INHERIT, PERF_TYPE_BREAKPOINT};
use super::privilege_hint;

/// How often the thread list is read again for threads started while the
/// events were being opened, before giving up on it settling.
const THREAD_SCANS: usize = 20;

/// Opens the watchpoint on `addr` (`len` bytes: 1, 2, 4 or 8, aligned) in
/// every thread of `pid` and attaches `prog` to each. A thread that gets
/// two (it inherited one while pytrace opened another) runs `prog` twice
/// per write: the program must not mind.
pub fn watch_writes(prog: &ProgramMut, pid: u32, addr: u64, len: u64) -> Result<Vec<Link>> {
    if !matches!(len, 1 | 2 | 4 | 8) || !addr.is_multiple_of(len) {
        bail!("cannot watch {len} bytes at {addr:#x}: a hardware watchpoint covers 1, 2, 4 or 8 aligned bytes");
    }
    let mut links = Vec::new();
    let mut watched = HashSet::new();
    for _ in 0..THREAD_SCANS {
        let threads = threads_of(pid)?;
        let new: Vec<u32> = threads.iter().copied().filter(|t| !watched.contains(t)).collect();
        if new.is_empty() {
            return Ok(links);
        }
        for tid in new {
            let fd = match open_breakpoint(tid, addr, len) {
                Ok(fd) => fd,
                // The thread exited since the list was read.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    watched.insert(tid);
                    continue;
                }
                Err(e) => return Err(breakpoint_error(e, pid, tid)),
            };
            let link = prog.attach_perf_event(fd).map_err(privilege_hint);
            let link = match link {
                Ok(link) => link,
                Err(e) => {
                    // SAFETY: libbpf did not take the fd it failed to attach.
                    unsafe { libc::close(fd) };
                    return Err(e).context("failed to attach the watchpoint program");
                }
            };
            links.push(link);
            watched.insert(tid);
        }
    }
    bail!("process {pid} starts threads faster than pytrace can watch them ({} watched)", watched.len())
}

fn open_breakpoint(tid: u32, addr: u64, len: u64) -> std::io::Result<i32> {
    let attr = PerfEventAttr {
        kind: PERF_TYPE_BREAKPOINT,
        sample_period: 1,
        flags: INHERIT | EXCLUDE_KERNEL | EXCLUDE_HV,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: addr,
        bp_len: len,
        ..Default::default()
    };
    // The descriptor goes to libbpf, which closes it with the link.
    Ok(perf_event::open(attr, tid as i32, -1)?.into_raw_fd())
}

/// The real reason the kernel refused a watchpoint, in one sentence.
fn breakpoint_error(e: std::io::Error, pid: u32, tid: u32) -> anyhow::Error {
    let why = match e.raw_os_error() {
        Some(libc::ENOSPC) => "every hardware debug register of that thread is taken (a debugger's watchpoints?)",
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
            "this kernel or machine offers no hardware breakpoints to perf (CONFIG_HAVE_HW_BREAKPOINT, or a hypervisor that hides debug registers)"
        }
        Some(libc::EACCES) | Some(libc::EPERM) => "not permitted (pytrace needs root, or CAP_PERFMON and CAP_SYS_PTRACE)",
        _ => "",
    };
    if why.is_empty() {
        anyhow::anyhow!("failed to set a hardware watchpoint in thread {tid} of process {pid}: {e}")
    } else {
        anyhow::anyhow!("failed to set a hardware watchpoint in thread {tid} of process {pid}: {why} ({e})")
    }
}

/// The process's threads, from /proc/PID/task.
fn threads_of(pid: u32) -> Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).with_context(|| format!("failed to read {dir}"))?;
    Ok(entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
}
