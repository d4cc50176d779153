//! `-- command`: pytrace follows the command's tree to its CPython wherever
//! the command starts it (a shell that forks it, after a delay), bounds the
//! wait with --duration, and, when it stops first, stops the command's
//! whole tree (SIGINT, SIGTERM, SIGKILL) unless --keep-running; and every
//! stop signal ends a run with its report written.

// The tests of the eval-frame hook force uprobe mode, which sets it on any
// 3.11+ build: the last of `pythons()` is then the probe-less one on this
// machine, and Debian's where only that one is wanted (kernel VMs).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

/// The PID pytrace says it attached to: the CPython, here a grandchild.
fn attached_pid(stderr: &str) -> u32 {
    let rest = stderr.split("attached to PID ").nth(1).unwrap_or_else(|| panic!("no attached line: {stderr}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

fn gone(pid: u32) -> bool {
    // A zombie is gone too: it runs nothing.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Kills a process the test left running on purpose, whatever happens.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

fn shell_running(python: &Path, script_and_args: &str) -> String {
    // `; true`: bash forks the CPython and waits, rather than exec'ing it.
    format!("{} {script_and_args}; true", python.display())
}

/// A shell that forks the CPython (not exec'ing it) is followed to it: with
/// calls from its first instruction (every leaf call of callgraph.py, 100 a
/// round, and its module body), with sample for the CPU seconds the
/// fixture spins (at 99 Hz, at least a third of them on a loaded machine).
#[test]
fn a_shell_that_forks_the_python_is_followed() {
    let _machine = shared();
    assert_calls_followed_through(|python, script| vec!["bash".into(), "-c".into(), shell_running(python, script)]);
    let (label, python) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("p.folded");
    let script = shell_running(&python, &format!("{} --cpu-seconds 1", fixture("cpu_split.py")));
    let out = pytrace(&["sample", "-r", "99", "--folded", folded.to_str().unwrap(), "--", "bash", "-c", &script]);
    assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
    let samples: u64 = std::fs::read_to_string(&folded).unwrap().lines().filter(|l| l.contains("cpu_split.py")).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert!(samples >= 33, "{label}: {samples} samples of 1 CPU-second at 99 Hz");
}

/// A command that starts its CPython late is waited for, and pytrace says
/// so once a second has passed; the CPython is still traced from its start.
#[test]
fn a_delayed_start_is_waited_for_and_said() {
    let _machine = shared();
    let (label, python) = pythons().pop().unwrap();
    let script = format!("sleep 1.5; {}", shell_running(&python, &format!("{} --rounds 3", fixture("callgraph.py"))));
    let out = pytrace(&["calls", "-d", "60", "--json", "-", "--", "bash", "-c", &script]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{label}: {err}");
    assert!(err.contains("waiting for bash (PID") && err.contains("to start a CPython, for up to"), "{label}: {err}");
    let report: serde_json::Value = parse_report(&out.stdout);
    let leaf = find_row(&rows_for_file(&report, "fixtures/callgraph.py"), 24, "leaf").map(|r| r["calls"].clone());
    assert_eq!(leaf, Some(serde_json::json!(300)), "{label}");

    // sample: the fixture's CPU second at 99 Hz, at least a third of it.
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("p.folded");
    let script = format!("sleep 1.5; {}", shell_running(&python, &format!("{} --cpu-seconds 1", fixture("cpu_split.py"))));
    let out = pytrace(&["sample", "-r", "99", "-d", "60", "--folded", folded.to_str().unwrap(), "--", "bash", "-c", &script]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{label} sample: {err}");
    assert!(err.contains("waiting for bash (PID"), "{label} sample: {err}");
    let samples: u64 = std::fs::read_to_string(&folded).unwrap().lines().filter(|l| l.contains("cpu_split.py")).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert!(samples >= 33, "{label} sample: {samples} samples of 1 CPU-second at 99 Hz");
}

/// A command that starts no CPython: one that exits says so with its
/// status; one that keeps running is stopped at --duration, with its tree.
#[test]
fn a_command_that_starts_no_python_is_bounded() {
    let _machine = shared();
    let out = pytrace(&["sample", "--", "bash", "-c", "exit 3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("pytrace: bash exited with status 3 before starting Python"), "{err}");

    for sub in ["sample", "calls"] {
        let asked = Instant::now();
        // The shell's child, `sleep`, must go too.
        let out = pytrace(&[sub, "-d", "1", "--", "bash", "-c", "sleep 30 & echo $! ; wait"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(asked.elapsed() < Duration::from_secs(10), "{sub}: took {:?}", asked.elapsed());
        assert_eq!(out.status.code(), Some(1), "{sub}: {err}");
        assert!(err.contains("started no CPython within the --duration of 1.0 s; it was stopped"), "{sub}: {err}");
        let sleep: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("{sub}: no sleep PID in {:?}", out.stdout));
        assert!(gone(sleep), "{sub}: the command's child {sleep} outlived pytrace");
    }
}

/// When --duration ends the run, the command's tree gets SIGINT (Python's
/// KeyboardInterrupt: bash and its CPython exit as killed by it, 130);
/// with --keep-running it is left running, and pytrace exits 0.
#[test]
fn the_duration_stops_the_command_unless_told_to_keep_it() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let script = shell_running(&python, &format!("{} spin", fixture("safety.py")));
    for sub in ["sample", "calls"] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        let out = pytrace(&[sub, "-d", "1", "--json", json.to_str().unwrap(), "--", "bash", "-c", &script]);
        let err = String::from_utf8_lossy(&out.stderr);
        let cpython = attached_pid(&err);
        assert_eq!(out.status.code(), Some(130), "{label} {sub}: {err}");
        assert!(gone(cpython), "{label} {sub}: the CPython {cpython} outlived pytrace");
        read_report(&json);

        // To files: the command left running keeps what it inherited open,
        // so a pipe would never end.
        let err_path = dir.path().join("stderr");
        let status = std::process::Command::new(PYTRACE)
            .args([sub, "-d", "1", "--keep-running", "--json", json.to_str().unwrap(), "--", "bash", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .status()
            .unwrap();
        let err = std::fs::read_to_string(&err_path).unwrap();
        let cpython = attached_pid(&err);
        let _cleanup = KillOnDrop(cpython);
        assert_eq!(status.code(), Some(0), "{label} {sub}: {err}");
        assert!(err.contains("was left running (--keep-running)"), "{label} {sub}: {err}");
        assert!(!gone(cpython), "{label} {sub}: --keep-running, yet the CPython was stopped");
        read_report(&json);
    }
}

/// SIGINT to pytrace alone (not to its terminal's group) mid-run reaches
/// the command's whole tree: the report is written, the CPython grandchild
/// is gone, and pytrace returns the command's status (130).
#[test]
fn ctrl_c_mid_run_reaches_the_whole_tree() {
    let _machine = shared();
    let (label, python) = pythons().pop().unwrap();
    let script = shell_running(&python, &format!("{} spin", fixture("safety.py")));
    for sub in ["sample", "calls"] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        let mut tracer = start_tracer(&[sub, "--json", json.to_str().unwrap(), "--", "bash", "-c", &script]);
        let cpython = attached_pid(&tracer.stderr_head);
        // Mid-run: once the fixture spins (a slow VM was still importing
        // site after half a second, and Python's startup then exits 1).
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(tracer.child.0.stdout.as_mut().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "spinning", "{label} {sub}");
        let asked = Instant::now();
        signal(tracer.child.pid(), libc::SIGINT);
        let (code, _, stderr) = tracer.finish();
        assert!(asked.elapsed() < Duration::from_secs(10), "{label} {sub}: took {:?}", asked.elapsed());
        assert_eq!(code, 130, "{label} {sub}: {stderr}");
        assert!(gone(cpython), "{label} {sub}: the CPython {cpython} outlived pytrace");
        let report = read_report(&json);
        if sub == "calls" {
            let leaf = rows_for_file(&report, "fixtures/safety.py").into_iter().find(|r| r["name"] == "leaf").map(|r| r["calls"].as_u64().unwrap());
            assert!(leaf.is_some_and(|n| n > 0), "{label}: {report}");
        }
    }
}

/// SIGHUP (a closed ssh session), SIGQUIT, SIGUSR1 and SIGUSR2 end a run
/// as SIGINT does: the report is written and the eval-frame hook put back.
#[test]
fn every_stop_signal_writes_the_report_and_restores_the_hook() {
    let _machine = shared();
    let (label, python) = pythons().pop().unwrap();
    for sig in [libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("calls.json");
        let target = start_waiting(&python, "callgraph.py", &["--rounds", "1000000"]);
        let tracer = start_tracer(&["calls", "--mode", "uprobe", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
        signal(target.pid(), libc::SIGUSR1);
        assert!(eval_frame_now(target.pid()).contains("pytrace calls is tracing"), "{label}/{sig}: hook set while tracing");
        signal(tracer.child.pid(), sig);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}/{sig}: {stderr}");
        let report = read_report(&json);
        assert!(find_row(&rows_for_file(&report, "fixtures/callgraph.py"), 24, "leaf").is_some(), "{label}/{sig}: {report}");
        assert_eq!(eval_frame_now(target.pid()), "not set", "{label}/{sig}: hook restored");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).filter(|n| n != "calls.json").collect();
        assert!(leftovers.is_empty(), "{label}/{sig}: temporary files left: {leftovers:?}");
    }
}

/// The guardian's PID: pytrace's child named pytrace-guard.
fn guardian_of(pytrace: u32) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pytrace) && stat.contains("(pytrace-guard)") {
            return pid;
        }
    }
    panic!("pytrace {pytrace} has no guardian");
}

/// A guardian stopped (SIGSTOP) does not hold back the report: pytrace,
/// which put the hook back itself, waits for it a bounded time, then kills
/// it (it had nothing left to do), and so frees the hook's lock.
#[test]
fn a_stopped_guardian_does_not_hold_back_the_report() {
    let _machine = shared();
    let (label, python) = pythons().pop().unwrap();
    let target = start_waiting(&python, "callgraph.py", &["--rounds", "1000000"]);
    let pid = target.pid().to_string();
    let tracer = start_tracer(&["calls", "--mode", "uprobe", "-p", &pid, "--json", "-"]);
    signal(target.pid(), libc::SIGUSR1);
    let guardian = guardian_of(tracer.child.pid());
    signal(guardian, libc::SIGSTOP);
    assert!(eval_frame_now(target.pid()).contains("pytrace calls is tracing"), "{label}: hook set while tracing");
    let asked = Instant::now();
    signal(tracer.child.pid(), libc::SIGINT);
    let (code, out, stderr) = tracer.finish();
    assert!(asked.elapsed() < Duration::from_secs(15), "{label}: took {:?}", asked.elapsed());
    assert_eq!(code, 0, "{label}: {stderr}");
    assert!(stderr.contains(&format!("the guardian (PID {guardian}) did not exit")), "{label}: {stderr}");
    // What the report holds is others' tests; here, that it came whole.
    let report: serde_json::Value = parse_report(&out);
    assert_eq!(report["pid"], target.pid(), "{label}: {out}");
    assert_eq!(eval_frame_now(target.pid()), "not set", "{label}: hook restored");
    assert!(gone(guardian), "{label}: the stopped guardian was left");
    // The lock went with the guardian: another run can trace the target.
    let again = pytrace(&["calls", "-p", &pid, "-d", "0.5", "--json", "-"]);
    assert!(again.status.success(), "{label}: {}", String::from_utf8_lossy(&again.stderr));
}

/// A command killed while pytrace holds it at its start (before its first
/// Python instruction, so before the eval-frame hook is set), or pytrace
/// killed then, leaves nothing to restore: neither pytrace nor its guardian
/// says anything about the hook (the guardian said "could not restore
/// interp->eval_frame … libpython … is not mapped" in 3 of 5 SIGKILLs).
#[test]
fn a_command_killed_during_launch_gets_no_hook_message() {
    let _machine = shared();
    let (label, python) = pythons().pop().unwrap();
    for kill_pytrace in [false, false, false, true, true, true] {
        let child = std::process::Command::new(PYTRACE)
            // Long enough that the kill, however late, finds it running.
            .args(["calls", "--mode", "uprobe", "--json", "-", "--", python.to_str().unwrap(), "-c", "import time; time.sleep(30)"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pytrace_pid = child.id();
        // The guardian is forked while the command is held at its exec.
        let deadline = Instant::now() + Duration::from_secs(20);
        let held = loop {
            assert!(Instant::now() < deadline, "{label}: no guardian appeared");
            let children: Vec<u32> = std::fs::read_to_string(format!("/proc/{pytrace_pid}/task/{pytrace_pid}/children")).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect();
            let is_guard = |p: &u32| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "pytrace-guard");
            if children.iter().any(is_guard) {
                break children.into_iter().find(|p| !is_guard(p)).expect("the command");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        signal(if kill_pytrace { pytrace_pid } else { held }, libc::SIGKILL);
        // Read to the end: the guardian writes to the same stderr.
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("eval_frame") && !err.contains("guardian"), "{label}: {err}");
        if kill_pytrace {
            continue;
        }
        // Killed while attaching: one sentence and 1; a moment later, the
        // command's status (137).
        let code = out.status.code();
        assert!(code == Some(137) || (code == Some(1) && err.contains(&format!("process {held} exited"))), "{label}: {code:?} {err}");
        assert!(!err.contains("eval_frame") && !err.contains("guardian"), "{label}: {err}");
    }
}

/// A target that double-forks a daemon (fork, setsid, fork; the middle
/// process exits, so the daemon is reparented away from the target) just
/// before pytrace is SIGKILLed: the daemon inherited the eval-frame hook,
/// and the guardian, which holds the calls program's map of followed
/// children, puts it back without waiting for pytrace's next poll or the
/// daemon's parentage.
#[test]
fn a_daemon_forked_just_before_pytrace_is_killed_gets_its_hook_back() {
    let _machine = shared();
    use std::io::{BufRead, BufReader, Write};
    let (label, python) = pythons().pop().unwrap();
    let script = r#"
import os, sys, time
def work(n):
    return n + 1
print("ready", flush=True)
sys.stdin.readline()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        end = time.time() + 60
        while time.time() < end:
            work(1)
            time.sleep(0.001)
    os._exit(0)
end = time.time() + 60
while time.time() < end:
    work(1)
    time.sleep(0.001)
"#;
    let mut target = std::process::Command::new(&python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _target_cleanup = KillOnDrop(target.id());
    let mut stdout = BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let tracer = start_tracer(&["calls", "--mode", "uprobe", "-p", &target.id().to_string()]);
    assert!(eval_frame_now(target.id()).contains("pytrace calls is tracing"), "{label}: hook set while tracing");
    target.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let daemon: u32 = line.trim().parse().unwrap_or_else(|_| panic!("{label}: no daemon PID: {line:?}"));
    let _daemon_cleanup = KillOnDrop(daemon);
    signal(tracer.child.pid(), libc::SIGKILL);
    let _ = tracer.finish();
    let deadline = Instant::now() + Duration::from_secs(10);
    while eval_frame_now(daemon) != "not set" || eval_frame_now(target.id()) != "not set" {
        assert!(Instant::now() < deadline, "{label}: daemon {daemon}: {}; target: {}", eval_frame_now(daemon), eval_frame_now(target.id()));
        std::thread::sleep(Duration::from_millis(50));
    }
    // Reaped here, not left a zombie for the rest of the one test process.
    let _ = target.kill();
    let _ = target.wait();
}
