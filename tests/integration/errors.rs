//! Bad input gets one clear sentence on stderr and a non-zero exit code,
//! never a panic, and nothing is left changed in any process.

use std::process::{Command, Stdio};

use crate::common::*;

/// Runs pytrace, expecting failure with a one-line message containing `want`.
fn assert_fails_with(args: &[&str], envs: &[(&str, &str)], want: &str) {
    let out = Command::new(PYTRACE).args(args).envs(envs.iter().copied()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "pytrace {args:?} should fail: {stderr}");
    assert!(stderr.contains(want), "pytrace {args:?}: expected {want:?} in {stderr:?}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line, not a backtrace: {stderr}");
    assert!(stderr.starts_with("pytrace: ") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn nonexistent_pid() {
    let _machine = shared();
    assert_fails_with(&["calls", "-p", "999999999"], &[], "no process with PID 999999999");
    assert_fails_with(&["info", "-p", "999999999"], &[], "no process with PID 999999999");
}

#[test]
fn process_that_is_not_python() {
    let _machine = shared();
    let sleeper = Proc(Command::new("sleep").arg("30").spawn().unwrap());
    let pid = sleeper.pid().to_string();
    assert_fails_with(&["calls", "-p", &pid], &[], &format!("process {pid} (sleep) is not a CPython process"));
}

/// A real CPython process whose version pytrace has no layout for: a copy of
/// Debian's python3.11 whose exported Py_Version constant says 3.99 (the
/// interpreter itself never reads it, so the copy runs normally). This is how
/// an unknown future release looks to pytrace.
#[test]
fn python_version_not_supported() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("python3.11");
    let mut bytes = std::fs::read("/usr/bin/python3.11").unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let sym = elf
        .dynsyms
        .iter()
        .find(|s| elf.dynstrtab.get_at(s.st_name) == Some("Py_Version"))
        .expect("Py_Version is exported");
    let seg = elf
        .program_headers
        .iter()
        .find(|p| p.p_type == goblin::elf::program_header::PT_LOAD && (p.p_vaddr..p.p_vaddr + p.p_filesz).contains(&sym.st_value))
        .unwrap();
    let at = (sym.st_value - seg.p_vaddr + seg.p_offset) as usize;
    bytes[at..at + 4].copy_from_slice(&0x0363_00f0u32.to_le_bytes());
    std::fs::write(&fake, &bytes).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    // Another test's fork can hold the file open for writing for a moment
    // after it was written (its child has not exec'd yet): exec then fails
    // with ETXTBSY, so try again briefly.
    let mut tries = 0;
    let target = loop {
        match Command::new(&fake).args(["-c", "import time; time.sleep(30)"]).spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            spawned => break Proc(spawned.unwrap()),
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = target.pid().to_string();
    assert_fails_with(&["calls", "-p", &pid], &[], "Python 3.99.0");
    assert_fails_with(&["calls", "-p", &pid], &[], "is not supported: pytrace supports CPython 3.9 to");
    assert_fails_with(&["calls", "--", fake.to_str().unwrap(), "-c", "pass"], &[], "Python 3.99.0");
    assert_fails_with(&["info", "-p", &pid], &[], "Python 3.99.0");
}

/// A kernel thread (PF_KTHREAD) has no executable to read: it is not a
/// CPython process, said as such, not as a failed read of /proc/PID/exe.
#[test]
fn kernel_thread_is_not_python() {
    let _machine = shared();
    let kernel_thread = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let flags: u64 = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse().ok()).unwrap_or(0);
            flags & 0x0020_0000 != 0
        })
        .expect("a kernel thread (kthreadd is on every Linux)");
    let pid = kernel_thread.to_string();
    for subcommand in ["calls", "info", "dump", "sample"] {
        assert_fails_with(&[subcommand, "-p", &pid], &[], &format!("process {pid} ("));
        assert_fails_with(&[subcommand, "-p", &pid], &[], "is not a CPython process: it is a kernel thread");
    }
}

#[test]
fn target_that_has_already_exited() {
    let _machine = shared();
    // Not reaped, so its PID still exists (a zombie), as when a target dies
    // while pytrace is starting.
    let (_, python) = pythons().remove(0);
    let mut target = Command::new(&python).args(["-c", "pass"]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = target.id().to_string();
    assert_fails_with(&["calls", "-p", &pid], &[], &format!("process {pid} has exited"));
    target.wait().unwrap();
}

#[test]
fn without_privileges() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let target = start_waiting(&python, "callgraph.py", &["--rounds", "1"]);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", PYTRACE, "calls", "-p", &target.pid().to_string()])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("tracing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE)"), "{stderr}");
    assert_eq!(eval_frame_now(target.pid()), "not set", "nothing was changed");
}

#[test]
fn kernel_without_btf() {
    let _machine = shared();
    assert_fails_with(&["calls", "-p", "1"], &[("PYTRACE_KERNEL_BTF", "/nonexistent/vmlinux")], "this kernel has no BTF");
}

#[test]
fn command_that_does_not_exist_or_is_not_python() {
    let _machine = shared();
    assert_fails_with(&["calls", "--", "no-such-command-pytrace"], &[], "command not found: no-such-command-pytrace");
    assert_fails_with(&["calls", "--", "/bin/true"], &[], "/bin/true exited with status 0 before starting Python");
}

#[test]
fn unwritable_output_fails_before_tracing() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let out = Command::new(PYTRACE)
        .args(["calls", "--json", "/nonexistent-dir/calls.json", "--", python.to_str().unwrap(), "-c", "print('ran')"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write /nonexistent-dir/calls.json"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"), "the command must not have run");
}

#[test]
fn usdt_mode_is_refused_where_it_would_miss_calls() {
    let _machine = shared();
    let pythons = pythons();
    assert_fails_with(&["calls", "--mode", "usdt", "--", pythons[0].1.to_str().unwrap(), "-c", "pass"], &[], "would miss calls on Python 3.11");
    assert_fails_with(&["calls", "--mode", "usdt", "--", pythons[1].1.to_str().unwrap(), "-c", "pass"], &[], "needs the function__entry and function__return USDT probes");
}

#[test]
fn missing_or_conflicting_target() {
    let _machine = shared();
    assert_fails_with(&["calls"], &[], "say which process to trace");
    assert_fails_with(&["calls", "-d", "0", "-p", "1"], &[], "--duration must be a positive number");
    // A negative number is a value, not clap's tip to write `-- -5` (which
    // would start a command named -5); a huge one is refused, not a panic.
    assert_fails_with(&["calls", "-d", "-5", "-p", "1"], &[], "--duration must be a positive number of seconds, at most 31536000");
    assert_fails_with(&["gil", "-d", "1e20", "-p", "1"], &[], "--duration must be a positive number of seconds, at most 31536000");
    assert_fails_with(&["info", "--binary", "/bin/ls"], &[], "/bin/ls is not a CPython executable or libpython");
}

#[test]
fn imports_usdt_mode_without_import_probes_says_why() {
    let _machine = shared();
    let (_, nodtrace) = pythons().remove(1);
    assert_fails_with(&["imports", "--mode", "usdt", "--", nodtrace.to_str().unwrap(), "-c", "pass"], &[], "needs the import__find__load__start/done USDT probes");
}

#[test]
fn sample_checks_every_output_path_before_sampling() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let out = Command::new(PYTRACE)
        .args(["sample", "--folded", "/tmp/ok.folded", "--flamegraph", "/nonexistent-dir/p.svg", "--", python.to_str().unwrap(), "-c", "print('ran')"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write /nonexistent-dir/p.svg"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"), "the command must not have run");
    assert_fails_with(&["sample", "-r", "0", "-p", "1"], &[], "--rate must be between 1 and 10000");
}
