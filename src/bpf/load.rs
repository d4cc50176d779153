//! Loading a BPF object with libbpf's messages kept, not printed: a program
//! the kernel's verifier refuses is reported as that, in one sentence
//! quoting the verifier, with its whole log saved to a file the sentence
//! names. PYTRACE_LIBBPF_LOG=1 prints every libbpf message as it comes
//! (PYTRACE_LIBBPF_LOG=stats: with what verifying each program cost, and
//! how long attaching took where a session says it).

use std::io::Write;
use std::sync::Mutex;

use anyhow::{anyhow, Result};
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{ErrorKind, PrintLevel};

use crate::kernel::Kernel;

/// libbpf's messages since the last load began; bounded, a verifier log
/// can run to megabytes.
static MESSAGES: Mutex<String> = Mutex::new(String::new());
const MESSAGES_CAP: usize = 32 << 20;
/// libbpf's last warning, which says why an attach failed.
static LAST_WARNING: Mutex<Option<String>> = Mutex::new(None);

fn stats() -> bool {
    std::env::var_os("PYTRACE_LIBBPF_LOG").is_some_and(|v| v == "stats")
}

/// PYTRACE_LIBBPF_LOG=stats: how long attaching `links` probes of
/// `program` took, beside the verifier's costs (a start's other half).
pub fn say_attach_stats(program: &str, links: usize, took: std::time::Duration) {
    if stats() {
        crate::console::err(&format!("pytrace: attached {links} links of the {program} program in {:.1} ms\n", took.as_secs_f64() * 1e3));
    }
}

fn echo() -> bool {
    std::env::var_os("PYTRACE_LIBBPF_LOG").is_some_and(|v| v != "0")
}

fn keep(level: PrintLevel, message: String) {
    if echo() {
        crate::console::err(&message);
    }
    if matches!(level, PrintLevel::Warn) {
        *LAST_WARNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.trim_start_matches("libbpf: ").trim().to_string());
    }
    let mut kept = MESSAGES.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() + message.len() <= MESSAGES_CAP {
        kept.push_str(&message);
    }
}

/// Routes libbpf's messages through `keep`, once, before any BPF object is
/// opened.
pub fn capture_libbpf_messages() {
    libbpf_rs::set_print(Some((PrintLevel::Debug, keep)));
}

/// libbpf's last warning since the last call, if any: its reason for a
/// failed attach.
pub fn take_libbpf_warning() -> Option<String> {
    LAST_WARNING.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Loads an opened skeleton; `program` names it in errors ("calls").
pub fn load<'obj, S: OpenSkel<'obj>>(program: &str, mut open: S) -> Result<S::Output> {
    raise_open_files_limit();
    if stats() {
        // Statistics only (level 4), printed for programs that load too.
        for mut prog in open.open_object_mut().progs_mut() {
            if prog.autoload() {
                prog.set_log_level(4);
            }
        }
    }
    MESSAGES.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let loaded = open.load();
    let log = std::mem::take(&mut *MESSAGES.lock().unwrap_or_else(|e| e.into_inner()));
    take_libbpf_warning();
    loaded.map_err(|e| refusal(program, e, &log))
}

/// Says why a load failed: missing privileges, the verifier (its own
/// words, the whole log in a file), or whatever libbpf said last.
fn refusal(program: &str, e: libbpf_rs::Error, log: &str) -> anyhow::Error {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if matches!(e.kind(), ErrorKind::PermissionDenied) && !root {
        return anyhow::Error::new(e).context("tracing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE)");
    }
    if let Some(refused) = verifier_refusal(log) {
        let saved = match save_log(program, log) {
            Ok(path) => format!("the whole log is in {path}"),
            Err(why) => format!("its whole log could not be saved: {why}"),
        };
        return anyhow!(
            "the kernel's BPF verifier refused pytrace's {program} program on Linux {}: {} (in {}; {saved})",
            Kernel::get().version,
            refused.reason,
            refused.function
        );
    }
    let said = log.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim_start_matches("libbpf: ").trim().to_string());
    match said {
        Some(said) => anyhow::Error::new(e).context(format!("failed to load the {program} BPF program ({said})")),
        None => anyhow::Error::new(e).context(format!("failed to load the {program} BPF program")),
    }
}

#[derive(Debug, PartialEq)]
struct Refusal {
    /// The BPF function (program) refused.
    function: String,
    /// The verifier's last line that says why.
    reason: String,
}

/// The verifier's verdict in libbpf's messages: the last program log
/// printed, and its last line that is neither an instruction, source, a
/// register state nor the closing statistics.
fn verifier_refusal(log: &str) -> Option<Refusal> {
    const BEGIN: &str = "-- BEGIN PROG LOAD LOG --";
    let start = log.rfind(BEGIN)?;
    let header = log[..start].lines().last().unwrap_or("");
    // "libbpf: prog 'eval_entry': -- BEGIN PROG LOAD LOG --"
    let function = header.split('\'').nth(1).unwrap_or("?").to_string();
    let body = &log[start + BEGIN.len()..];
    let body = &body[..body.find("-- END PROG LOAD LOG --").unwrap_or(body.len())];
    let reason = body.lines().map(str::trim).rev().find(|l| is_verdict(l))?.to_string();
    Some(Refusal { function, reason })
}

fn is_verdict(line: &str) -> bool {
    let instruction = line.split_once(':').is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    !(line.is_empty()
        || instruction
        || line.starts_with(';')
        || line.starts_with("processed ")
        || line.starts_with("verification time")
        || line.starts_with("stack depth")
        || line.starts_with("mark_precise")
        || line.starts_with("frame")
        || line.starts_with("R0=")
        || line.starts_with("R1=")
        || line.starts_with("caller:")
        || line.starts_with("callee:")
        || line.starts_with("Func#")
        || line.starts_with("Validating")
        || line.starts_with("last_idx")
        || line.starts_with("parent ")
        || line.starts_with("regs=")
        || line.starts_with("from ")
        || line.starts_with("returning from callee")
        || line.starts_with("to caller"))
}

/// Writes the log to a new file in the temporary directory (never over an
/// existing one: the name is predictable and pytrace runs as root).
fn save_log(program: &str, log: &str) -> Result<String> {
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    for n in 0..100 {
        let name = if n == 0 { format!("pytrace-{program}-verifier-{pid}.log") } else { format!("pytrace-{program}-verifier-{pid}-{n}.log") };
        let path = dir.join(name);
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(log.as_bytes())?;
                return Ok(path.display().to_string());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(anyhow!("every name was taken in {}", dir.display()))
}

/// Lifts the soft limit of open files to the hard one. Before uprobe_multi
/// links (Linux 6.6) every probe site is a perf event and a link of its
/// own: `memory --allocations` on a stripped build attaches about 700 on
/// Debian's 3.11, past the usual soft limit of 1024 files (EMFILE, seen on
/// 6.1). Done at the load, after any command pytrace starts was forked, so
/// that the command keeps the limit it was given.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write this one struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Logs as libbpf printed them on Debian's kernels (abridged).
    #[test]
    fn the_verifier_s_own_reason_is_found_in_each_kernel_s_log() {
        let on_6_1 = "libbpf: prog 'eval_entry': BPF program load failed: -EACCES\n\
            libbpf: prog 'eval_entry': -- BEGIN PROG LOAD LOG --\n\
            0: R1=ctx(off=0,imm=0) R10=fp0\n\
            ; __sync_fetch_and_add(&st->hist[bucket], 1);\n\
            930: (db) lock *(u64 *)(r0 +64) += r2\n\
            R0 unbounded memory access, make sure to bounds check any such access\n\
            processed 1568 insns (limit 1000000) max_states_per_insn 8 total_states 140 peak_states 96 mark_read 21\n\
            -- END PROG LOAD LOG --\n\
            libbpf: prog 'eval_entry': failed to load: -EACCES\n";
        assert_eq!(
            verifier_refusal(on_6_1),
            Some(Refusal { function: "eval_entry".into(), reason: "R0 unbounded memory access, make sure to bounds check any such access".into() })
        );
        let on_5_10 = "libbpf: prog 'sample_thread': -- BEGIN PROG LOAD LOG --\n\
            number of funcs in func_info doesn't match number of subprogs\n\
            processed 0 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0\n\
            -- END PROG LOAD LOG --\n";
        assert_eq!(verifier_refusal(on_5_10).unwrap().reason, "number of funcs in func_info doesn't match number of subprogs");
        let on_6_12 = "libbpf: prog 'eval_frame': -- BEGIN PROG LOAD LOG --\n\
            ; __u64 *cookie = bpf_session_cookie(); @ calls.bpf.c:585\n\
            2: (85) call bpf_session_cookie#59308\n\
            calling kernel function bpf_session_cookie is not allowed\n\
            processed 3 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0\n\
            -- END PROG LOAD LOG --\n";
        assert_eq!(verifier_refusal(on_6_12).unwrap().reason, "calling kernel function bpf_session_cookie is not allowed");
        assert_eq!(verifier_refusal("libbpf: failed to find BTF for extern 'x'\n"), None);
    }
}
