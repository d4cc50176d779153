//! Shared by the integration tests: the real pytrace binary, real Python
//! processes (killed on drop), and cProfile as ground truth.

pub mod matrix;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const PYTRACE: &str = env!("CARGO_BIN_EXE_pytrace");

/// Tests over a list of builds, the one way every module writes them: for
/// each `BUILD(VALUE): BODY, …;` a module BUILD holding one test per BODY,
/// which calls the invoking module's `fn BODY(VALUE)`, VALUE made afresh
/// in each test. A test is then named MODULE::BUILD::BODY
/// (`matrix::python_3_9::imports_tree`), so `-- python_3_9::` picks a
/// build's tests and `-- ::imports_tree` a body's. VALUE is written in the
/// invoking module and sees its names.
macro_rules! over_builds {
    ($($build:ident($value:expr): $($body:ident),+;)*) => {$(
        mod $build {
            #[allow(unused_imports)]
            use super::*;
            $(
            #[test]
            fn $body() {
                let _machine = $crate::common::shared();
                super::$body($value)
            }
            )+
        }
    )*};
}
pub(crate) use over_builds;

/// All the integration tests are one process, and libtest runs two of them
/// at once whatever module each is in. A test whose measurement needs the
/// machine's CPUs for its target alone (sample_native's: a target that gets
/// less CPU gives fewer samples than they require) holds this lock
/// exclusively, through `alone()`; every other test holds it shared,
/// through `shared()`, so none runs beside such a test. (When each file was
/// a binary of its own, cargo ran them one after another and
/// sample_native's own mutex gave it the machine.) A test takes it once, in
/// its #[test] function, never in a body it calls: a thread taking a read
/// lock twice could wait behind a waiting writer.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The machine to this test alone (see MACHINE).
pub fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

/// The machine shared with any test but one that needs it alone (see MACHINE).
pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

pub fn fixture(name: &str) -> String {
    format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The CPythons every exactness test runs on: Debian's 3.11 (USDT probes,
/// interpreter in the executable) and a 3.11 without probes and with a
/// shared libpython (pyenv's, or one scripts/pythons.sh built). Both must
/// exist: scripts/test.sh provides them; a missing one fails, never skips.
pub fn pythons() -> Vec<(&'static str, PathBuf)> {
    let debian = PathBuf::from("/usr/bin/python3.11");
    assert!(debian.exists(), "Debian's python3.11 is missing: run scripts/install.sh");
    let nodtrace = std::env::var_os("PYTRACE_NODTRACE_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR")))
                .arg("nodtrace-3.11")
                .output()
                .ok()?;
            Some(PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()))
        })
        .filter(|p| p.exists())
        .expect("no CPython 3.11 without USDT probes: run scripts/pythons.sh nodtrace-3.11");
    let all = vec![("debian", debian), ("nodtrace", nodtrace)];
    all.into_iter().filter(|(label, _)| wanted(label)).collect()
}

/// Whether a test runs on the build `label` names ("debian 3.11 uprobe"):
/// PYTRACE_TEST_PYTHONS=debian keeps only those whose label starts with
/// "debian" (scripts/kernels.sh runs tests in slow VMs on Debian's build
/// only); unset, every build.
pub fn wanted(label: &str) -> bool {
    match std::env::var("PYTRACE_TEST_PYTHONS") {
        Ok(only) => only.split(',').any(|o| label.split(' ').next() == Some(o)),
        Err(_) => true,
    }
}

/// `seconds` of a fixture's run, made longer where the machine is slow:
/// PYTRACE_TEST_SLOWDOWN (default 1) multiplies it. scripts/kernels.sh sets
/// it in its emulated VMs, whose late timers give the sampler about half the
/// samples it asks for; the sampler tests need as many samples as here.
pub fn longer(seconds: f64) -> String {
    format!("{}", seconds * slowdown())
}

/// PYTRACE_TEST_SLOWDOWN (default 1): how much slower than this machine
/// code runs where the tests run (a kernel VM under emulation).
pub fn slowdown() -> f64 {
    std::env::var("PYTRACE_TEST_SLOWDOWN").ok().and_then(|f| f.parse().ok()).unwrap_or(1.0)
}

/// A child process killed (and reaped) when dropped, whatever the test did.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// Starts a fixture with --wait and returns once it is blocked waiting for
/// SIGUSR1, so a tracer can attach before any of its work runs.
pub fn start_waiting(python: &Path, script: &str, args: &[&str]) -> Proc {
    let mut child = Command::new(python)
        .arg(fixture(script))
        .args(args)
        .arg("--wait")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the fixture");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "fixture did not start");
    Proc(child)
}

/// `pytrace ARGS` (before the target: e.g. `sample -r 999 --json F`) on
/// fixture SCRIPT with SCRIPT_ARGS: attached by PID once the fixture waits
/// (SIGUSR1 lets it go), or, with `by_pid` false, started by pytrace.
/// pytrace must exit 0; `label` names the case in the failure message.
pub fn run_on_fixture(label: &str, args: &[&str], python: &Path, script: &str, script_args: &[&str], by_pid: bool) {
    if by_pid {
        let target = start_waiting(python, script, script_args);
        let pid = target.pid().to_string();
        let mut args = args.to_vec();
        args.extend(["-p", &pid]);
        let tracer = start_tracer(&args);
        signal(target.pid(), libc::SIGUSR1);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label} (by PID): {stderr}");
    } else {
        let script = fixture(script);
        let mut args = args.to_vec();
        args.extend(["--", python.to_str().unwrap(), &script]);
        args.extend(script_args);
        let out = pytrace(&args);
        assert!(out.status.success(), "{label} (started): {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Reads the target's stdout until a line equal to `want`.
pub fn wait_for_line(target: &mut Proc, want: &str) {
    let stdout = target.0.stdout.as_mut().expect("stdout is piped");
    let mut reader = BufReader::new(stdout);
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the target ended before printing {want:?}");
        if line.trim() == want {
            return;
        }
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill({pid}, {sig})");
}

/// pytrace started in the background; stderr is read until the attached line.
pub struct Tracer {
    pub child: Proc,
    pub stderr_head: String,
    stderr_rest: std::thread::JoinHandle<String>,
}

pub fn start_tracer(args: &[&str]) -> Tracer {
    start_tracer_env(args, &[])
}

pub fn start_tracer_env(args: &[&str], envs: &[(&str, &str)]) -> Tracer {
    let mut command = Command::new(PYTRACE);
    command.args(args).envs(envs.iter().copied());
    start(command)
}

/// Starts pytrace under GNU time, whose last line of stderr is then
/// `maxrss_kb=N`: pytrace's own peak. A process this test binary starts
/// itself inherits the binary's peak RSS (the kernel keeps a process's
/// high-water mark across exec, and the fork copied the binary's pages),
/// which in one test process holding every test's data can pass 100 MiB;
/// time's child is forked from time, which holds almost nothing.
pub fn start_tracer_measured(args: &[&str]) -> Tracer {
    let mut command = Command::new("/usr/bin/time");
    command.args(["-f", "maxrss_kb=%M", PYTRACE]).args(args);
    start(command)
}

/// The peak a run under GNU time's `-f maxrss_kb=%M` reached, in KiB
/// (`start_tracer_measured`, or time run directly).
pub fn peak_kib(stderr: &str) -> u64 {
    stderr.lines().find_map(|l| l.strip_prefix("maxrss_kb=")).and_then(|kib| kib.trim().parse().ok()).unwrap_or_else(|| panic!("no maxrss_kb line in {stderr:?}"))
}

/// How long a run may take to say it attached. A `memory` run on a
/// stripped build places hundreds of uprobes, and each one's cost grows
/// with the processes mapping the file, which in this suite's parallel
/// tests can be many; 30 s was once passed under such load.
const ATTACH_AT_MOST: Duration = Duration::from_secs(90);

/// Starts pytrace and waits, at most ATTACH_AT_MOST, for the line scripts
/// wait for. Its stderr is read on a thread of its own, so a run that never
/// says it attached fails the test at the deadline instead of holding it:
/// it is then stopped (SIGINT, so it puts the target back; SIGKILL if it
/// is still there 10 s later) and its output shown.
fn start(mut command: Command) -> Tracer {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start pytrace");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (lines, head_lines) = std::sync::mpsc::channel::<String>();
    // Every line goes to the waiting test until the attach line; the rest
    // (or all of it, once the test stopped waiting) is kept for `finish`.
    let stderr_rest = std::thread::spawn(move || {
        let mut stderr = stderr;
        let mut rest = String::new();
        let mut waited_for = true;
        loop {
            let mut line = String::new();
            if !matches!(stderr.read_line(&mut line), Ok(n) if n > 0) {
                return rest;
            }
            let attached = line.contains("attached to PID");
            if waited_for {
                if let Err(unsent) = lines.send(line) {
                    rest.push_str(&unsent.0);
                    waited_for = false;
                }
            } else {
                rest.push_str(&line);
            }
            if attached {
                waited_for = false;
            }
        }
    });
    let started = Instant::now();
    let mut head = String::new();
    loop {
        let left = ATTACH_AT_MOST.saturating_sub(started.elapsed());
        match head_lines.recv_timeout(left) {
            Ok(line) => {
                let attached = line.contains("attached to PID");
                head.push_str(&line);
                if attached {
                    break;
                }
            }
            Err(waited) => {
                let timed_out = matches!(waited, std::sync::mpsc::RecvTimeoutError::Timeout);
                drop(head_lines);
                stop_within(&mut child, Duration::from_secs(10));
                let mut out = String::new();
                let _ = child.stdout.take().unwrap().read_to_string(&mut out);
                let rest = stderr_rest.join().unwrap_or_default();
                match timed_out {
                    true => panic!("pytrace had not attached after {} s, and was stopped: {head}{rest}{out}", ATTACH_AT_MOST.as_secs()),
                    false => panic!("pytrace ended before attaching: {head}{rest}{out}"),
                }
            }
        }
    }
    Tracer { child: Proc(child), stderr_head: head, stderr_rest }
}

/// SIGINT, then SIGKILL if `child` is still running after `grace`; reaped.
fn stop_within(child: &mut Child, grace: Duration) {
    signal(child.id(), libc::SIGINT);
    let asked = Instant::now();
    while asked.elapsed() < grace {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Tracer {
    /// Waits for pytrace to finish; returns its exit code, stdout and all
    /// of stderr.
    pub fn finish(mut self) -> (i32, String, String) {
        let mut out = String::new();
        self.child.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let status = self.child.0.wait().unwrap();
        let Tracer { stderr_head, stderr_rest, .. } = self;
        let err = stderr_head + &stderr_rest.join().unwrap();
        (status.code().unwrap_or(-1), out, err)
    }
}

/// The lines of a run's stderr that say something went wrong: less the
/// line scripts wait for ("attached to PID"), the timings of a slow attach
/// or detach, said because they are no part of the traced time (on a
/// loaded machine an attach can take over half a second), and the note
/// that the kernel's detach went on after 1 s: a uprobe run on the host,
/// such as another test's `calls -- command` in this same test process, can
/// hold that detach however this run ends (docs/kernels.md).
pub fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            !l.starts_with("pytrace: attached to PID")
                && !l.ends_with("(not part of the traced time)")
                && !l.starts_with("pytrace: the kernel had not finished detaching pytrace's probes")
        })
        .collect()
}

pub fn pytrace(args: &[&str]) -> Output {
    Command::new(PYTRACE).args(args).output().expect("run pytrace")
}

/// cProfile's ncalls for each function of a fixture: (first line, name, calls).
pub fn cprofile_calls(python: &Path, script: &str, args: &[&str]) -> Vec<(u32, String, u64)> {
    truth_calls(python, script, args, "--cprofile")
}

/// The 'call' events CPython's profiling hook reports on every thread
/// (fixtures/ground_truth.py): (first line, name, calls).
pub fn hook_calls(python: &Path, script: &str, args: &[&str]) -> Vec<(u32, String, u64)> {
    truth_calls(python, script, args, "--count-calls")
}

fn truth_calls(python: &Path, script: &str, args: &[&str], flag: &str) -> Vec<(u32, String, u64)> {
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new(python)
        .arg(fixture(script))
        .args(args)
        .arg(flag)
        .arg(out_file.path())
        .status()
        .unwrap();
    assert!(status.success(), "the fixture failed under {flag}");
    let rows: serde_json::Value = serde_json::from_reader(std::fs::File::open(out_file.path()).unwrap()).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (r["line"].as_u64().unwrap() as u32, r["name"].as_str().unwrap().to_string(), r["calls"].as_u64().unwrap()))
        .collect()
}

/// pytrace's JSON rows for one file.
pub fn rows_for_file<'a>(report: &'a serde_json::Value, file_suffix: &str) -> Vec<&'a serde_json::Value> {
    report["functions"]
        .as_array()
        .expect("functions array")
        .iter()
        .filter(|f| f["file"].as_str().unwrap_or("").ends_with(file_suffix))
        .collect()
}

/// The row for a function by first line and name. pytrace names functions
/// by qualified name (`Shape.area`), the profiling hook and cProfile by
/// plain name (`area`); several functions may share a line (a comprehension
/// inside a comprehension).
pub fn find_row<'a>(rows: &[&'a serde_json::Value], line: u32, name: &str) -> Option<&'a serde_json::Value> {
    rows.iter().copied().find(|r| {
        let qualname = r["name"].as_str().unwrap_or("");
        r["line"].as_u64() == Some(line as u64) && (qualname == name || qualname.ends_with(&format!(".{name}")))
    })
}

pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("report written")).expect("report is JSON")
}

/// Whether `report` is a pytrace JSON report valid against the checked-in
/// schema of the kind it says it is (docs/schema/KIND.json): Err holds the
/// validator's message for every place the schema refuses.
pub fn check_report(report: &serde_json::Value) -> Result<(), String> {
    let kind = report["kind"].as_str().ok_or("it has no `kind` string")?;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/schema").join(format!("{kind}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("no schema for kind {kind:?} ({}: {e})", path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let validator = jsonschema::validator_for(&schema).map_err(|e| format!("{} is not a valid schema: {e}", path.display()))?;
    let refused: Vec<String> = validator.iter_errors(report).map(|e| format!("at {:?}: {e}", e.instance_path().to_string())).collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!("docs/schema/{kind}.json refuses it: {}", refused.join("; ")))
    }
}

/// A pytrace JSON report (not a fixture's ground truth) read from `path`,
/// checked against its published schema (which requires the
/// `schema_version` docs/json.md promises).
pub fn read_report(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("report {} not written: {e}", path.display()));
    let report = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{text}", path.display()));
    check_report(&report).unwrap_or_else(|e| panic!("{} is not a valid report: {e}", path.display()));
    report
}

/// A pytrace JSON report written to standard output (`--json -`), checked
/// as `read_report` checks one in a file.
pub fn parse_report(text: impl AsRef<[u8]>) -> serde_json::Value {
    let text = text.as_ref();
    let report = serde_json::from_slice(text).unwrap_or_else(|e| panic!("not a JSON report: {e}\n{}", String::from_utf8_lossy(text)));
    check_report(&report).unwrap_or_else(|e| panic!("not a valid report: {e}"));
    report
}

/// What `pytrace info -p` says interp->eval_frame holds now.
pub fn eval_frame_now(pid: u32) -> String {
    let out = pytrace(&["info", "-p", &pid.to_string(), "--json", "-"]);
    assert!(out.status.success(), "info failed: {}", String::from_utf8_lossy(&out.stderr));
    let v = parse_report(&out.stdout);
    v["eval_frame_now"].as_str().unwrap_or("").to_string()
}

/// Fails unless the target is still running 300 ms from now.
pub fn assert_alive(target: &mut Proc, what: &str) {
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(target.0.try_wait().unwrap().is_none(), "{what}: the target died");
}

/// Waits (bounded) for `info` to say the hook is NULL again.
pub fn assert_hook_restored_within(pid: u32, bound: Duration, what: &str) -> Duration {
    let started = std::time::Instant::now();
    loop {
        let now = eval_frame_now(pid);
        if now == "not set" {
            return started.elapsed();
        }
        assert!(started.elapsed() < bound, "{what}: interp->eval_frame of {pid} still {now:?} after {bound:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `n` CPU-bound processes of `python`, killed when dropped: the load the
/// tests that must hold on a busy machine run under.
pub fn cpu_bound_neighbours(python: &Path, n: usize) -> Vec<Proc> {
    (0..n).map(|_| Proc(Command::new(python).args(["-c", "while True: pass"]).spawn().unwrap())).collect()
}

/// pyenv's CPython 3.`minor` (`$PYENV_ROOT`, else ~/.pyenv): built without
/// USDT probes, with a shared libpython and a symbol table, like the
/// Pythons people install with pyenv or uv. Every machine the tests run on
/// has 3.9 to 3.13 there; a missing one fails, never skips.
pub fn pyenv_python(minor: u32) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"));
    let prefix = format!("3.{minor}.");
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join(format!("bin/python3.{minor}")))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("no pyenv CPython 3.{minor} under {}/versions", root.display()))
}

/// Every import of a `-X importtime` run (its stderr), as the path of
/// module names from a top-level import down to it, sorted. importtime
/// prints an import when it ends, indented two spaces per level, so a line
/// takes the lines one level deeper printed since as its children.
pub fn importtime_paths(stderr: &str) -> Vec<Vec<String>> {
    struct Node(String, Vec<Node>);
    let mut pending: std::collections::HashMap<usize, Vec<Node>> = std::collections::HashMap::new();
    for line in stderr.lines().filter(|l| l.starts_with("import time:") && !l.contains("imported package")) {
        let field = line.splitn(3, '|').nth(2).expect("an importtime line has three fields");
        let field = field.strip_prefix(' ').unwrap_or(field);
        let name = field.trim_start_matches(' ');
        let depth = (field.len() - name.len()) / 2;
        let children = pending.remove(&(depth + 1)).unwrap_or_default();
        pending.entry(depth).or_default().push(Node(name.to_string(), children));
    }
    fn walk(nodes: &[Node], prefix: &[String], out: &mut Vec<Vec<String>>) {
        for Node(name, children) in nodes {
            let path = [prefix, std::slice::from_ref(name)].concat();
            walk(children, &path, out);
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk(&pending.remove(&0).unwrap_or_default(), &[], &mut out);
    out.sort();
    out
}

/// The same paths from a `pytrace imports` report's `imports` tree.
pub fn report_import_paths(imports: &serde_json::Value) -> Vec<Vec<String>> {
    fn walk(nodes: &serde_json::Value, prefix: &[String], out: &mut Vec<Vec<String>>) {
        for n in nodes.as_array().expect("an array of imports") {
            let path = [prefix, &[n["name"].as_str().unwrap().to_string()]].concat();
            walk(&n["children"], &path, out);
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk(imports, &[], &mut out);
    out.sort();
    out
}

/// A share of `n` samples (percent or fraction, as `want` and `bound`)
/// against the share it should have: every statistical assertion helper
/// here goes through it, so each requires a minimum sample count, below
/// which its bound says nothing, and says both in its message.
pub fn assert_share(label: &str, what: &str, share: f64, want: f64, bound: f64, n: f64, min_n: f64) {
    assert!(n >= min_n, "{label}: {what}: {n} samples, a share test needs at least {min_n}");
    assert!((share - want).abs() <= bound, "{label}: {what}: {share:.3} of {n} samples (at least {min_n} needed), expected {want:.3} ± {bound:.3}");
}

/// Samples a compare report's three functions need for its share test:
/// a slow VM gets a third of the host's several hundred.
const COMPARE_MIN_SAMPLES: f64 = 100.0;

/// Samples native_split.py's two functions need for the --native share
/// tests (a VM samples at NATIVE_VM_HZ: a few hundred).
const NATIVE_MIN_SAMPLES: f64 = 100.0;

/// A compare report of fixtures/cpu_split.py shows its split on both
/// sides: sixty, thirty and ten relative to one another, on the sampled
/// side by the CPU time and on the traced side by the wall time the
/// fixture measured around each call (`--wall-split FILE`). On real
/// hardware the CPU split is 60/30/10; on a busy machine a preemption
/// stretches one function's wall time, not the others'; in an emulated VM
/// each clock read costs enough to lengthen every spin. Within `points`
/// on each side.
pub fn assert_compare_split(label: &str, cmp: &serde_json::Value, wall_split: &Path, points: f64) {
    let names = ["sixty", "thirty", "ten"];
    let truth = read_json(wall_split);
    let wall: Vec<f64> = names.iter().map(|n| truth[n].as_f64().unwrap_or_else(|| panic!("{label}: {wall_split:?} has no {n}"))).collect();
    let wall_sum: f64 = wall.iter().sum();
    let cpu: Vec<f64> = names.iter().map(|n| truth["cpu"][n].as_f64().unwrap_or_else(|| panic!("{label}: {wall_split:?} has no CPU time of {n}"))).collect();
    let cpu_sum: f64 = cpu.iter().sum();
    let row = |name: &str| {
        cmp["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name && r["file"].as_str().is_some_and(|f| f.ends_with("cpu_split.py")))
            .unwrap_or_else(|| panic!("{label}: no row for {name}"))
    };
    let calls = row("sixty")["calls"].as_u64().unwrap();
    assert!(calls > 50 && row("thirty")["calls"] == calls && row("ten")["calls"] == calls, "{label}: {calls} calls");
    let samples: f64 = names.iter().map(|n| row(n)["total_samples"].as_f64().unwrap()).sum();
    for field in ["traced_total_share", "corrected_total_share", "sampled_total_share"] {
        let shares: Vec<f64> = names.iter().map(|n| row(n)[field].as_f64().unwrap()).collect();
        let sum: f64 = shares.iter().sum();
        assert!(sum > 0.0, "{label}: {field}: nothing in the three");
        for (i, name) in names.iter().enumerate() {
            let sampled = field == "sampled_total_share";
            let want = if sampled { cpu[i] / cpu_sum * 100.0 } else { wall[i] / wall_sum * 100.0 };
            // Samples are a binomial draw: fewer of them (a slow VM gets a
            // third of the host's) spread wider. Four standard errors plus
            // one point, never tighter than `points`.
            let p = want / 100.0;
            let bound = if sampled { points.max(400.0 * (p * (1.0 - p) / samples).sqrt() + 1.0) } else { points };
            let share = shares[i] / sum * 100.0;
            assert_share(label, &format!("{name}'s percent by {field}"), share, want, bound, samples, COMPARE_MIN_SAMPLES);
        }
    }
}

/// A sample report of fixtures/cpu_split.py has its functions' samples in
/// the shares of the CPU time the fixture measured around each
/// (`--cpu-split FILE`): 60/30/10 on real hardware, less even where every
/// clock read costs more (an emulated VM). At least `min_samples` in the
/// three; each share within `points`.
pub fn assert_sample_split(label: &str, report: &serde_json::Value, cpu_split: &Path, min_samples: u64, points: f64) {
    let names = ["sixty", "thirty", "ten"];
    let truth = read_json(cpu_split);
    let cpu: Vec<f64> = names.iter().map(|n| truth[n].as_f64().unwrap_or_else(|| panic!("{label}: {cpu_split:?} has no {n}"))).collect();
    let cpu_sum: f64 = cpu.iter().sum();
    let samples: Vec<u64> = names
        .iter()
        .map(|n| report["functions"].as_array().unwrap().iter().find(|f| f["name"] == *n).map_or(0, |f| f["total_samples"].as_u64().unwrap()))
        .collect();
    let sum: u64 = samples.iter().sum();
    for (i, name) in names.iter().enumerate() {
        let (share, want) = (samples[i] as f64 * 100.0 / sum as f64, cpu[i] * 100.0 / cpu_sum);
        assert_share(label, &format!("{name}'s percent of the samples in sixty, thirty and ten, against its percent of their CPU time"), share, want, points, sum as f64, min_samples as f64);
    }
}

/// `sample --native`'s rate for the tests of fixtures/native_split.py.
/// Each --native sample is a 64 KiB record that pytrace's user space
/// unwinds; under emulation (PYTRACE_TEST_SLOWDOWN above 1) that is so much
/// slower that at 999 Hz most records found the ring buffer full (on 5.10,
/// 4,361 of about 6,240). The emulated machine runs Python and pytrace
/// about 7 times slower than this one, and its late timers give about half
/// the samples asked for; NATIVE_VM_HZ is a rate whose records it keeps up
/// with, measured on every kernel of scripts/kernels.sh.
pub fn native_rate() -> u64 {
    if slowdown() > 1.0 { NATIVE_VM_HZ } else { 999 }
}

const NATIVE_VM_HZ: u64 = 149;

/// What emulation in scripts/kernels.sh's VMs takes from compress_work's
/// samples beyond what its CPU times predict. On Linux 6.1 at 149 Hz
/// (five runs, 2,034 to 2,243 samples each), compress_work's share read
/// 0.2 to 3.9 points under the half its CPU time gives, and its samples
/// outside the zlib.compress call, which spin_work's iteration puts at 0.1
/// point, read 1.5 to 2.2: half of them in the clock read just after the
/// call (74 µs a read, against 6 µs for a whole iteration of spin_work's
/// loop), half in its bytecode. On this machine the two agree with the CPU
/// times within a point. A run with both shortfalls at their worst falls
/// 5.6 points short of the truth, against a bound of 5.3 from four standard
/// errors and the point of slack, which failed CI once.
const EMULATED_NATIVE_SPLIT_SLACK: f64 = 0.03;

/// Samples of fixtures/native_split.py's two functions, from a --native
/// profile: in compress_work, of those the ones inside its zlib.compress
/// call (native frames above compress_work, none of them a clock read's
/// clock_gettime) and the ones with libz's frames above compress_work (and
/// no Python frame above libz), and in spin_work.
#[derive(Debug, Default)]
pub struct NativeSplit {
    pub compress: u64,
    pub in_call: u64,
    pub in_libz: u64,
    pub spin: u64,
}

/// A folded frame of native code: `symbol (module)`, the module no Python
/// file; markers (`[…]`) and Python frames are not.
pub fn is_native_frame(frame: &str) -> bool {
    let Some((_, at)) = frame.strip_suffix(')').and_then(|f| f.rsplit_once(" (")) else { return false };
    let file = at.rsplit_once(':').filter(|(_, line)| line.parse::<u32>().is_ok()).map_or(at, |(file, _)| file);
    !frame.starts_with('[') && !file.ends_with(".py") && !file.starts_with('<')
}

/// A compress_work sample of native_split.py (`above`: the frames after
/// compress_work's) is inside its zlib.compress call: in a native frame,
/// not in the loop's clock read.
pub fn in_zlib_call(above: &[&str]) -> bool {
    above.iter().any(|f| is_native_frame(f)) && !above.iter().any(|f| f.starts_with("clock_gettime ("))
}

/// --native's shares against what native_split.py measured of its own CPU
/// (`--cpu-split FILE`): compress_work's share of the two functions'
/// samples against its share of their CPU time, and the share inside its
/// zlib.compress calls (libz and zlib's glue around it: argument parsing,
/// the output's allocation, whose page faults emulation makes dear)
/// against the CPU time spent in them (compress_work's less its loop and
/// clock reads, which spin_work measures: under emulation a clock read
/// costs about a third of a short deflate). Each within four binomial
/// standard errors of its share (sqrt(p (1 - p) / n)) plus one point: a
/// clock read's frames above time.process_time's before clock_gettime.
/// Under emulation, three points more (EMULATED_NATIVE_SPLIT_SLACK).
pub fn assert_native_split(label: &str, counted: &NativeSplit, cpu_split: &Path) {
    let truth = read_json(cpu_split);
    let get = |key: &str| truth[key].as_f64().unwrap_or_else(|| panic!("{label}: {cpu_split:?} has no {key}: {truth}"));
    let (compress_cpu, spin_cpu, in_zlib_cpu) = (get("compress_work"), get("spin_work"), get("in_zlib"));
    let n = (counted.compress + counted.spin) as f64;
    for (what, samples, cpu) in [("compress_work", counted.compress, compress_cpu), ("zlib.compress under compress_work", counted.in_call, in_zlib_cpu)] {
        let want = cpu / (compress_cpu + spin_cpu);
        let share = samples as f64 / n;
        let emulated = if slowdown() > 1.0 { EMULATED_NATIVE_SPLIT_SLACK } else { 0.0 };
        let bound = 4.0 * (want * (1.0 - want) / n).sqrt() + 0.01 + emulated;
        assert_share(label, &format!("{what}'s share against its share of CPU time (counted {counted:?}, measured {truth})"), share, want, bound, n, NATIVE_MIN_SAMPLES);
    }
}

/// `calls` of fixtures/callgraph.py (3 rounds) started by `wrapper` (a
/// command line given the fixture's own to run, which execs or forks the
/// CPython): followed to the CPython from its first instruction, so every
/// leaf call (100 a round) and the module body are in the report.
pub fn assert_calls_followed_through(wrapper: impl Fn(&Path, &str) -> Vec<String>) {
    for (label, python) in pythons() {
        let argv = wrapper(&python, &format!("{} --rounds 3", fixture("callgraph.py")));
        let mut args = vec!["calls", "--json", "-", "--"];
        args.extend(argv.iter().map(String::as_str));
        let out = pytrace(&args);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let report = parse_report(&out.stdout);
        let rows = rows_for_file(&report, "fixtures/callgraph.py");
        let leaf = find_row(&rows, 24, "leaf").unwrap_or_else(|| panic!("{label}: no leaf row"));
        assert_eq!(leaf["calls"], 300, "{label}: 100 leaf calls a round");
        assert!(find_row(&rows, 1, "<module>").is_some(), "{label}: the module body ran traced");
    }
}
