//! BPF sessions: load a program, point it at a target, collect what it
//! aggregated. One file per BPF program; the subcommands in src/commands
//! wire these to reports. What they all share is here.

pub mod calls;
pub mod compare;
pub mod gc;
pub mod histogram;
pub mod imports;
pub mod sample;

use std::time::Duration;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags, RingBuffer};

use crate::target::proc;

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
    if !proc::is_running(pid) {
        anyhow::anyhow!("process {pid} exited while pytrace was attaching")
    } else {
        privilege_hint(e)
    }
}

/// Whether this kernel has uprobe sessions (Linux 6.13+): its BTF names the
/// session kfuncs. PYTRACE_NO_UPROBE_SESSION=1 forces the older path (the
/// tests use it to cover kernels without them).
pub fn has_uprobe_sessions() -> bool {
    if std::env::var_os("PYTRACE_NO_UPROBE_SESSION").is_some() {
        return false;
    }
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let btf = std::env::var("PYTRACE_KERNEL_BTF").unwrap_or_else(|_| "/sys/kernel/btf/vmlinux".into());
        std::fs::read(btf).is_ok_and(|b| b.windows(22).any(|w| w == b"\0bpf_session_is_return"))
    })
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

/// Fails if the target died while probes were being attached.
pub fn ensure_still_running(pid: u32) -> Result<()> {
    if !proc::is_running(pid) {
        anyhow::bail!("process {pid} exited while pytrace was attaching");
    }
    Ok(())
}

/// Polls a ring buffer until `keep_going` says stop, then drains it. The
/// BPF side mostly does not wake us (bpf/ring.bpf.h), so each round also
/// consumes whatever arrived during the wait.
pub fn poll_until(ring: &RingBuffer, what: &str, mut keep_going: impl FnMut() -> Result<bool>) -> Result<()> {
    while keep_going()? {
        match ring.poll(Duration::from_millis(100)) {
            Ok(()) => {}
            // A signal (Ctrl-C) interrupted the wait: keep_going decides.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("failed to read the {what} ring buffer")),
        }
        ring.consume().with_context(|| format!("failed to read the {what} ring buffer"))?;
    }
    ring.consume().with_context(|| format!("failed to drain the {what} ring buffer"))?;
    Ok(())
}

/// Sums a per-CPU array of u64 counters, by name.
pub fn read_counters(map: &dyn MapCore, names: &[(&'static str, u32)]) -> Result<Vec<(&'static str, u64)>> {
    let mut counters = Vec::new();
    for &(name, index) in names {
        let sum = map
            .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)?
            .map(|cpus| cpus.iter().map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap())).sum())
            .unwrap_or(0);
        counters.push((name, sum));
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
