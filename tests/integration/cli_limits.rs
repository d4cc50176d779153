//! No input makes pytrace panic or abort: extreme numbers for every numeric
//! flag of every subcommand, a standard output whose reader is gone, and
//! too little address space each end in one line on standard error and a
//! non-zero exit (never 101, a panic, or 134, an abort), with the target
//! alive and its eval-frame hook not set.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A target that keeps calling Python functions (so `calls` sets its hook)
/// until killed.
fn busy_target() -> Proc {
    let (_, python) = pythons().remove(0);
    let target = Proc(Command::new(python).args(["-c", "import time\ndef f(i): return i * i\nwhile True:\n    sum(f(i) for i in range(1000)); time.sleep(0.001)"]).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(500));
    target
}

/// Runs pytrace with `args` (stdout to `stdout`), killed after a minute: a
/// value taken for a huge duration would otherwise hang the test.
fn run(args: &[String], stdout: Stdio, limit_kib: Option<u64>) -> Output {
    let mut command = match limit_kib {
        Some(kib) => {
            let mut sh = Command::new("sh");
            sh.args(["-c", &format!("ulimit -v {kib}; exec \"$0\" \"$@\""), PYTRACE]).args(args);
            sh
        }
        None => {
            let mut c = Command::new(PYTRACE);
            c.args(args);
            c
        }
    };
    let mut child = command.stdout(stdout).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("pytrace {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The smallest `ulimit -v` (KiB, to 64 KiB) under which `pytrace
/// --version` runs: what mapping the binary and its libraries takes.
fn loader_floor_kib() -> u64 {
    let runs = |kib: u64| run(&["--version".to_string()], Stdio::null(), Some(kib)).status.success();
    let (mut fails, mut works) = (1_024, 256 * 1_024);
    assert!(runs(works), "pytrace --version does not run under ulimit -v {works}");
    while works - fails > 64 {
        let mid = (fails + works) / 2;
        if runs(mid) { works = mid } else { fails = mid }
    }
    works
}

/// No panic, no abort; on failure one line saying why; the target alive
/// and unhooked (within 2 s: after an out-of-memory exit the guardian
/// puts the hook back, as after a SIGKILL).
fn assert_ended_cleanly(what: &str, out: &Output, target: &Proc) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(code.is_some(), "{what}: killed by a signal ({:?}): {stderr}", out.status);
    assert!(code != Some(101) && code != Some(134), "{what}: exit {code:?}: {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{what}: {stderr}");
    if code != Some(0) {
        let said = error_lines(&stderr);
        assert_eq!(said.len(), 1, "{what}: one line of error, not {stderr:?}");
        assert!(said[0].starts_with("pytrace: "), "{what}: {stderr}");
    }
    // SAFETY: kill(pid, 0) only checks the process exists.
    assert_eq!(unsafe { libc::kill(target.pid() as i32, 0) }, 0, "{what}: the target died");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let hook = eval_frame_now(target.pid());
        if hook == "not set" {
            break;
        }
        assert!(Instant::now() < deadline, "{what}: the target's hook is left {hook:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn extreme_numbers_for_every_numeric_flag() {
    let _machine = shared();
    let target = busy_target();
    let pid = target.pid().to_string();
    let values = ["0", "-5", "1e20", "NaN", "inf", "-inf", "18446744073709551616", "18446744073709551615", "4294967296", ""];
    // Each subcommand's numeric flags, and what else it needs to run.
    let subcommands: &[(&str, &[&str])] = &[
        ("calls", &["-p", "-d", "--top"]),
        ("gc", &["-p", "-d"]),
        ("gil", &["-p", "-d"]),
        ("imports", &["-p", "-d", "--top"]),
        ("sample", &["-p", "-d", "-r", "--top"]),
        ("compare", &["-p", "-d", "-r", "--top"]),
        ("top", &["-p", "-d", "-r"]),
        ("info", &["-p"]),
        ("dump", &["-p"]),
        ("restore", &["-p"]),
    ];
    let mut runs = 0;
    for (subcommand, flags) in subcommands {
        let takes_duration = flags.contains(&"-d");
        for flag in *flags {
            for value in values {
                let mut args = vec![subcommand.to_string(), flag.to_string(), value.to_string()];
                if *flag != "-p" {
                    args.extend(["-p".into(), pid.clone()]);
                }
                if *flag != "-d" && takes_duration {
                    args.extend(["-d".into(), "1".into()]);
                }
                let out = run(&args, Stdio::piped(), None);
                assert_ended_cleanly(&format!("pytrace {args:?}"), &out, &target);
                runs += 1;
            }
        }
    }
    assert!(runs >= 200, "{runs} runs");
}

/// A pipe whose reader has already gone, as in `pytrace ... | true`.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into a local array; both ends are owned from here on.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe(2), each owned once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

#[test]
fn standard_output_closed_ends_the_run_with_its_files_written() {
    let _machine = shared();
    let target = busy_target();
    let pid = target.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("calls.json");
    let folded = dir.path().join("sample.folded");
    let gc_json = dir.path().join("gc.json");
    let cases: Vec<Vec<String>> = vec![
        vec!["calls".into(), "-p".into(), pid.clone(), "-d".into(), "1".into(), "--json".into(), json.display().to_string()],
        vec!["sample".into(), "-p".into(), pid.clone(), "-d".into(), "1".into(), "--json".into(), "-".into(), "--folded".into(), folded.display().to_string()],
        vec!["gc".into(), "-p".into(), pid.clone(), "-d".into(), "3".into(), "--events".into(), "--json".into(), gc_json.display().to_string()],
        vec!["gil".into(), "-p".into(), pid.clone(), "-d".into(), "1".into()],
        vec!["imports".into(), "-p".into(), pid.clone(), "-d".into(), "1".into()],
        vec!["info".into(), "-p".into(), pid.clone()],
        vec!["info".into()],
        vec!["dump".into(), "-p".into(), pid.clone()],
    ];
    for args in cases {
        let out = run(&args, closed_pipe(), None);
        let what = format!("pytrace {args:?} | true");
        assert_eq!(out.status.code(), Some(1), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("failed to write to standard output"), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        assert_ended_cleanly(&what, &out, &target);
    }
    // The files went out before standard output failed.
    assert_eq!(read_report(&json)["kind"], "calls");
    assert!(std::fs::read_to_string(&folded).unwrap().lines().count() > 0, "folded stacks written");
    // gc's events may not have come in 3 s; its summary file is written
    // either way, once the run is over.
    assert_eq!(read_report(&gc_json)["kind"], "gc");
}

/// Address space limits from too small to read the kernel's BTF, through
/// too small for the BPF objects or the ring buffer, to enough for those
/// but not for `compare`'s two sessions (a Rust allocation fails: the
/// allocator's sentence, no abort), to enough: each failure is one
/// sentence, the target untouched.
#[test]
fn too_little_address_space_is_one_sentence() {
    let _machine = shared();
    let target = busy_target();
    let pid = target.pid().to_string();
    let (mut failed, mut runs, mut allocator_said) = (0, 0, 0);
    // The limits stand above the address space the loader needs to map
    // pytrace and its libraries at all (under it, exec fails with ld.so's
    // message, before pytrace runs): set when the binary had a floor of
    // 9,600 KiB, they move with it as the binary grows (the agent's HTTP
    // and OTLP crates added 3.9 MiB of it).
    let floor = loader_floor_kib();
    for above in [400, 10_400, 14_400, 15_400, 16_400, 18_400, 20_400, 35_400] {
        let kib = floor + above;
        for subcommand in ["calls", "compare", "sample", "gil", "dump", "info"] {
            let mut args = vec![subcommand.to_string(), "-p".into(), pid.clone()];
            if !matches!(subcommand, "dump" | "info") {
                args.extend(["-d".into(), "1".into()]);
            }
            let out = run(&args, Stdio::piped(), Some(kib));
            runs += 1;
            failed += usize::from(!out.status.success());
            allocator_said += usize::from(String::from_utf8_lossy(&out.stderr).contains("pytrace: out of memory: could not allocate"));
            assert_ended_cleanly(&format!("ulimit -v {kib}; pytrace {args:?}"), &out, &target);
        }
    }
    // The limits are chosen so that many runs fail, some of them in a Rust
    // allocation: the test checks failures, not successes.
    assert!(failed >= 20 && allocator_said >= 1, "{failed} of {runs} runs failed, {allocator_said} in an allocation: the limits no longer bite");
}
