//! The version matrix's test bodies, shared by tests/integration/matrix.rs (Debian's
//! CPythons, each in a chroot of its own root) and tests/integration/matrix_pyenv.rs
//! (pyenv's, on this machine). Each body takes an `Interpreter`, which knows
//! how to run a fixture there and what that build has (USDT probes, a shared
//! libpython); what differs between versions is asked of it, never of the
//! file the test sits in.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::*;

/// One CPython of the matrix, and where its fixtures run.
pub struct Interpreter {
    pub version: &'static str,
    place: Place,
}

enum Place {
    /// A Debian root made by scripts/pythons.sh, run by chroot with this
    /// run's fixtures copied to `inside`: the target sees other paths than
    /// pytrace does, as a Python in a container would, so pytrace must find
    /// its files through /proc/PID/root. Debian builds with USDT probes and
    /// libpython in the executable.
    Root { root: PathBuf, inside: String },
    /// pyenv's build on this machine (scripts/pythons.sh pyenv-3.X): shared
    /// libpython, symbol tables, no USDT probes. `dir` holds what the
    /// fixtures write.
    Host { python: PathBuf, dir: tempfile::TempDir },
}

impl Interpreter {
    /// Debian's python`version`: bullseye's 3.9, sid's 3.13 to 3.15.
    pub fn debian(version: &'static str) -> Self {
        let (env, which) = if version == "3.9" { ("PYTRACE_ROOT_39", "root-3.9") } else { ("PYTRACE_ROOT_SID", "root-sid") };
        let root = std::env::var_os(env).map(PathBuf::from).or_else(|| {
            let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg(which).output().ok()?;
            Some(PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()))
        });
        let python = format!("usr/bin/python{version}");
        let root = root
            .filter(|r| r.join(&python).exists())
            .unwrap_or_else(|| panic!("no root with {python}: run scripts/pythons.sh {which}"));
        // One directory per test: tests run in parallel and each removes its own.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let inside = format!("/pytrace-tests-{}-{n}", std::process::id());
        std::fs::create_dir_all(root.join(&inside[1..])).unwrap();
        for entry in std::fs::read_dir(fixture("")).unwrap().flatten() {
            std::fs::copy(entry.path(), root.join(&inside[1..]).join(entry.file_name())).unwrap();
        }
        Interpreter { version, place: Place::Root { root, inside } }
    }

    /// pyenv's python`version` (3.10, 3.12: Debian packages neither).
    pub fn pyenv(version: &'static str) -> Self {
        let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg(format!("pyenv-{version}")).output().unwrap();
        assert!(out.status.success(), "scripts/pythons.sh pyenv-{version}: {}", String::from_utf8_lossy(&out.stderr));
        let python = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        assert!(python.exists(), "{}", python.display());
        Interpreter { version, place: Place::Host { python, dir: tempfile::tempdir().unwrap() } }
    }

    /// The CPython at `python` on this machine (Debian's 3.11, the one
    /// built without probes), treated as pyenv's are.
    pub fn host(version: &'static str, python: PathBuf) -> Self {
        assert!(python.exists(), "{}", python.display());
        Interpreter { version, place: Place::Host { python, dir: tempfile::tempdir().unwrap() } }
    }

    /// The command that runs a fixture, with `flags` for the interpreter.
    pub fn argv_with(&self, flags: &[&str], script: &str, args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = match &self.place {
            Place::Root { root, .. } => vec!["chroot".into(), root.to_string_lossy().into_owned(), format!("/usr/bin/python{}", self.version)],
            Place::Host { python, .. } => vec![python.to_string_lossy().into_owned()],
        };
        v.extend(flags.iter().map(|f| f.to_string()));
        v.push(match &self.place {
            Place::Root { inside, .. } => format!("{inside}/{script}"),
            Place::Host { .. } => fixture(script),
        });
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    pub fn argv(&self, script: &str, args: &[&str]) -> Vec<String> {
        self.argv_with(&[], script, args)
    }

    /// A file the target writes, named as the target and as the host see it.
    pub fn output(&self, name: &str) -> (String, PathBuf) {
        match &self.place {
            Place::Root { root, inside } => {
                let inside = format!("{inside}/{name}");
                let host = root.join(&inside[1..]);
                (inside, host)
            }
            Place::Host { dir, .. } => {
                let path = dir.path().join(name);
                (path.to_string_lossy().into_owned(), path)
            }
        }
    }

    pub fn run(&self, script: &str, args: &[&str]) {
        let argv = self.argv(script, args);
        assert!(Command::new(&argv[0]).args(&argv[1..]).status().unwrap().success(), "{argv:?}");
    }

    /// Starts a fixture with --wait; returns once it is ready. `chroot` execs
    /// the Python in place, so the child's PID is the target's.
    pub fn start_waiting(&self, script: &str, args: &[&str]) -> Proc {
        let argv = self.argv(script, &[args, &["--wait"]].concat());
        let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn().unwrap());
        wait_for_line(&mut target, "ready");
        target
    }

    /// `pytrace SUB… -- PYTHON fixture ARGS…`, which must succeed.
    pub fn pytrace(&self, sub: &[&str], script: &str, args: &[&str]) -> std::process::Output {
        let argv = self.argv(script, args);
        let mut all: Vec<&str> = sub.to_vec();
        all.push("--");
        all.extend(argv.iter().map(String::as_str));
        let out = pytrace(&all);
        assert!(out.status.success(), "{}: pytrace {all:?}: {}", self.version, String::from_utf8_lossy(&out.stderr));
        out
    }

    pub fn json(&self, sub: &[&str], script: &str, args: &[&str]) -> serde_json::Value {
        let out = self.pytrace(&[sub, &["--json", "-"]].concat(), script, args);
        parse_report(&out.stdout)
    }

    /// (first line, name, calls) from a truth file the fixture wrote
    /// (fixtures/ground_truth.py: `--cprofile` or `--count-calls`).
    pub fn truth(&self, script: &str, args: &[&str], flag: &str) -> Vec<(u32, String, u64)> {
        let (inside, host) = self.output(&format!("truth-{script}.json"));
        self.run(script, &[args, &[flag, &inside]].concat());
        read_json(&host)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["line"].as_u64().unwrap() as u32, r["name"].as_str().unwrap().to_string(), r["calls"].as_u64().unwrap()))
            .collect()
    }

    pub fn minor(&self) -> u32 {
        self.version[2..].parse().unwrap()
    }

    /// Whether the build has CPython's USDT probes (Debian's do).
    pub fn has_usdt(&self) -> bool {
        matches!(self.place, Place::Root { .. })
    }

    /// Whether the interpreter is a shared libpython (pyenv's) rather than
    /// in the executable (Debian's).
    pub fn shared_library(&self) -> bool {
        matches!(self.place, Place::Host { .. })
    }

    /// Whether this build's function__entry/function__return USDT probes
    /// fire on every call: 3.9 and 3.10, then 3.15 again.
    pub fn has_function_probes(&self) -> bool {
        self.has_usdt() && (self.minor() <= 10 || self.minor() >= 15)
    }

    /// Where calls' probe on the eval function sits, as `info` begins to
    /// say it: Debian builds 3.13+ with endbr64 first, and only its 3.13 has
    /// no push after it (`sub rsp`: the kernel would single-step the entry),
    /// so there the eval-frame hook points at a jump to the function, which
    /// the kernel emulates; pyenv's builds have no endbr64.
    pub fn calls_probe_site(&self) -> &'static str {
        if self.has_usdt() && self.version == "3.13" {
            "a jump to the eval function at 0x"
        } else {
            "the eval function's entry, emulated by the kernel"
        }
    }
}

impl Drop for Interpreter {
    fn drop(&mut self) {
        if let Place::Root { root, inside } = &self.place {
            let _ = std::fs::remove_dir_all(root.join(&inside[1..]));
        }
    }
}

/// 3.13 runs `__init__` inline when a class is called at a specialized
/// site (CALL_ALLOC_AND_ENTER_INIT) even with interp->eval_frame set, which
/// every other inlined call respects (3.14 does here too). pytrace counts
/// those calls at the instance's allocation, untimed; the report says so.
fn check_inlined_init(py: &Interpreter, label: &str, report: &serde_json::Value) {
    let caveats = report["caveats"].to_string();
    let uprobe = report["python"]["mode"] == "uprobe";
    let counted = report["counters"]["inlined_init_calls"].as_u64().unwrap_or(0);
    if py.version == "3.13" && uprobe {
        assert!(caveats.contains("counted (at the instance's allocation) but not timed"), "{label}: {caveats}");
        assert!(counted > 0, "{label}: no inlined __init__ counted");
    } else {
        assert!(!caveats.contains("__init__"), "{label}: {caveats}");
        assert_eq!(counted, 0, "{label}");
    }
}

fn assert_counts(py: &Interpreter, how: &str, report: &serde_json::Value, truth: &[(u32, String, u64)], skip: impl Fn(&str, u32) -> bool) {
    let label = format!("{} {how}", py.version);
    let reported = report["python"]["version"].as_str().unwrap();
    // The patch level too (3.10 keeps it only as the tail of other strings).
    assert!(reported.starts_with(&format!("{}.", py.version)) && reported.len() > py.version.len() + 1, "{label}: {reported}");
    let rows = rows_for_file(report, "/callgraph.py");
    for (line, name, calls) in truth {
        if skip(name, *line) {
            continue;
        }
        let row = find_row(&rows, *line, name).unwrap_or_else(|| panic!("{label}: no row for {name} (line {line})"));
        assert_eq!(row["calls"].as_u64().unwrap(), *calls, "{label}: calls of {name} (line {line})");
    }
    assert_eq!(report["lost_events"], 0, "{label}");
    check_inlined_init(py, &label, report);
    // Before 3.13 no call escapes the eval-frame hook or the eval
    // function's probe (3.11's specialized __getitem__ is not in the matrix):
    // uprobe mode has nothing to be inexact about.
    if report["python"]["mode"] == "uprobe" && py.minor() < 13 {
        assert!(report.get("caveats").is_none(), "{label}: {}", report["caveats"]);
    }
}

pub fn calls_equal_cprofile(py: &Interpreter) {
    let truth = py.truth("callgraph.py", &["--rounds", "20"], "--cprofile");

    let by_command = py.json(&["calls"], "callgraph.py", &["--rounds", "20"]);
    assert_eq!(by_command["python"]["mode"], "uprobe");
    assert_counts(py, "calls --", &by_command, &truth, |_, _| false);

    let target = py.start_waiting("callgraph.py", &["--rounds", "20"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("calls.json");
    let tracer = start_tracer(&["calls", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    assert!(tracer.stderr_head.contains(&format!("(Python {}.", py.version)), "{}", tracer.stderr_head);
    signal(target.pid(), libc::SIGUSR1);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    let report = read_report(&json);
    assert_eq!(report["python"]["mode"], "uprobe");
    assert_counts(py, "calls -p", &report, &truth, |_, _| false);
}

/// Where the function probes work (3.9, 3.15), `--mode usdt` counts every
/// call too, inlined and specialized ones included on 3.15. The probes pass
/// the line being run, not the function's first line, so a generator's
/// resumptions are rows of their own lines (and on 3.15 its creation runs
/// its frame and fires function__entry): generators are left out here.
pub fn usdt_mode_counts_equal_cprofile(py: &Interpreter) {
    assert!(py.has_function_probes());
    let truth = py.truth("callgraph.py", &["--rounds", "20"], "--cprofile");
    let report = py.json(&["calls", "--mode", "usdt"], "callgraph.py", &["--rounds", "20"]);
    assert_eq!(report["python"]["mode"], "usdt");
    assert_counts(py, "calls --mode usdt", &report, &truth, |name, _| name == "countdown");
}

/// Four threads against CPython's profiling hook on every thread, and 300
/// functions made from one code object's template, each its own row.
pub fn calls_threads_and_reused_code_objects(py: &Interpreter) {
    let version = py.version;
    let args = ["--threads", "4", "--iterations", "300"];
    let truth = py.truth("threads.py", &args, "--count-calls");
    let report = py.json(&["calls"], "threads.py", &args);
    let rows = rows_for_file(&report, "/threads.py");
    for (line, name, calls) in truth.iter().filter(|t| t.1 != "<lambda>") {
        let row = find_row(&rows, *line, name).unwrap_or_else(|| panic!("{version}: no row for {name}"));
        assert_eq!(row["calls"].as_u64().unwrap(), *calls, "{version}: calls of {name} on 4 threads");
    }
    assert_eq!(report["counters"]["unmatched_return"], 0, "{version}");

    let report = py.json(&["calls"], "code_reuse.py", &["--functions", "300"]);
    let generated: HashMap<&str, u64> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["file"] == "<generated>" && f["name"].as_str().unwrap().starts_with("f_"))
        .map(|f| (f["name"].as_str().unwrap(), f["calls"].as_u64().unwrap()))
        .collect();
    assert_eq!(generated.len(), 300, "{version}: one row per generated function");
    for (name, calls) in generated {
        let i: u64 = name[2..].parse().unwrap();
        assert_eq!(calls, i % 3 + 1, "{version}: {name}");
    }
}

/// Each way the build allows: the mode pytrace picks by itself (the gc
/// USDT probes where they exist, else the watchpoint on the collector's
/// state; on stripped builds too; 3.15 keeps its totals in rings), then
/// the watchpoint asked for where the probes were picked.
pub fn gc_equals_gc_callbacks(py: &Interpreter) {
    let version = py.version;
    let modes: &[(Option<&str>, &str)] = if py.has_usdt() { &[(None, "usdt"), (Some("watchpoint"), "watchpoint")] } else { &[(None, "watchpoint")] };
    for &(asked, mode) in modes {
        let (inside, host) = py.output("gc-truth.json");
        let mut target = py.start_waiting("gc_cycles.py", &["--rounds", "60000", "--truth", &inside]);
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("gc.json");
        let pid = target.pid().to_string();
        let mut args = vec!["gc", "-p", &pid, "--json", json.to_str().unwrap()];
        if let Some(asked) = asked {
            args.extend(["--mode", asked]);
        }
        let tracer = start_tracer(&args);
        assert!(tracer.stderr_head.contains(&format!("{mode} mode")), "{version}: {}", tracer.stderr_head);
        signal(target.pid(), libc::SIGUSR1);
        wait_for_line(&mut target, "done");
        signal(tracer.child.pid(), libc::SIGINT);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{stderr}");
        let key = |v: &serde_json::Value| {
            v.as_array().unwrap().iter().map(|g| (g["generation"].as_u64(), g["collections"].as_u64(), g["collected"].as_i64())).collect::<Vec<_>>()
        };
        let want = key(&read_json(&host));
        assert_eq!(want.len(), 3, "{version}: the fixture collects all three generations");
        assert_eq!(key(&read_report(&json)["generations"]), want, "{version} {mode}: (generation, collections, collected)");
    }
}

/// Each way the build allows (the import USDT probes, and the eval-function
/// uprobe that builds without them get): the whole tree equals -X
/// importtime's for the same program.
pub fn imports_tree(py: &Interpreter) {
    let version = py.version;
    let (modules, host) = py.output("modules");
    std::fs::create_dir_all(&host).unwrap();
    let argv = py.argv_with(&["-X", "importtime"], "imports_tree.py", &[&modules]);
    let truth = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    assert!(truth.status.success(), "{version}: {}", String::from_utf8_lossy(&truth.stderr));
    let want = importtime_paths(&String::from_utf8_lossy(&truth.stderr));
    let modes: &[&str] = if py.has_usdt() { &["usdt", "uprobe"] } else { &["uprobe"] };
    for &mode in modes {
        std::fs::remove_dir_all(&host).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        let report = py.json(&["imports", "--mode", mode], "imports_tree.py", &[&modules]);
        assert_eq!(report["python"]["mode"], mode);
        let top = report["imports"].as_array().unwrap().iter().find(|n| n["name"] == "pt_top").expect("pt_top imported");
        let mut children: Vec<&str> = top["children"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        children.sort();
        assert_eq!(children, ["pt_a", "pt_b"], "{version} {mode}");
        let (own, total) = (top["self_ns"].as_u64().unwrap(), top["cumulative_ns"].as_u64().unwrap());
        assert!(0 < own && own <= total, "{version} {mode}: {top}");
        assert_eq!(report_import_paths(&report["imports"]), want, "{version} {mode}: the tree -X importtime prints");
    }
}

/// The CPU split within 2 points; one function per thread; deep stacks
/// marked truncated. The split's truth is what the fixture measured of its
/// own CPU time around each call (60/30/10 on real hardware; in an
/// emulated VM, where every call and clock read costs far more, not quite).
pub fn sample_split_threads_and_depth(py: &Interpreter) {
    let version = py.version;
    let (cpu, cpu_host) = py.output("cpu-split.json");
    let report = py.json(&["sample", "-r", "999"], "cpu_split.py", &["--cpu-seconds", &longer(4.0), "--cpu-split", &cpu]);
    let truth = read_json(&cpu_host);
    let total = |name: &str| {
        report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_samples"].as_u64().unwrap()).unwrap_or(0)
    };
    let names = ["sixty", "thirty", "ten"];
    let sum: u64 = names.iter().map(|f| total(f)).sum();
    let cpu_sum: f64 = names.iter().map(|f| truth[f].as_f64().unwrap()).sum();
    assert!(sum > 3000, "{version}: only {sum} samples");
    for name in names {
        let (share, want) = (total(name) as f64 * 100.0 / sum as f64, truth[name].as_f64().unwrap() * 100.0 / cpu_sum);
        assert!((share - want).abs() <= 2.0, "{version}: {name} has {share:.1}% of samples, its CPU time {want:.1}%");
    }

    let folded = String::from_utf8(py.pytrace(&["sample", "-r", "499", "--threads", "--folded", "-"], "threads_spin.py", &["1"]).stdout).unwrap();
    for f in ["spin_a", "spin_b", "spin_c"] {
        let threads: std::collections::HashSet<&str> = folded
            .lines()
            .filter(|l| l.contains(&format!(";{f} (")))
            .map(|l| l.split(';').next().unwrap())
            .collect();
        assert_eq!(threads.len(), 1, "{version}: {f} on threads {threads:?}");
    }

    let folded = String::from_utf8(py.pytrace(&["sample", "-r", "499", "--folded", "-"], "deep_recursion.py", &["1.5"]).stdout).unwrap();
    let bottom: Vec<&str> = folded.lines().filter(|l| l.contains("spin_at_bottom (")).collect();
    assert!(!bottom.is_empty(), "{version}: no sample at the bottom");
    for line in bottom {
        let frames: Vec<&str> = line.rsplit_once(' ').unwrap().0.split(';').collect();
        assert_eq!((frames[0], frames.len()), ("[truncated]", 257), "{version}: 256 frames and the marker");
    }
}

/// A command pytrace starts is sampled from its first Python line: the
/// fixture spins from there, and spin()'s samples must be its CPU time
/// (read inside it) at the rate the whole run had (samples per CPU-second
/// of the process), within 15 %. With a shared libpython, mapped only after
/// the exec pytrace holds the command at, the first quarter second was
/// once lost (every sample without a thread state until the next check):
/// 0.55-0.75 of the truth. At least 200 samples.
pub fn sample_starts_at_the_commands_first_line(py: &Interpreter) {
    let version = py.version;
    let (truth, truth_host) = py.output("spin-truth.json");
    let report = py.json(&["sample", "-r", "499"], "spin_from_start.py", &[&truth, &longer(0.6)]);
    let spin_cpu = read_json(&truth_host)["spin_cpu_s"].as_f64().unwrap();
    let spin = report["functions"].as_array().unwrap().iter().find(|f| f["name"] == "spin").map_or(0.0, |f| f["total_samples"].as_f64().unwrap());
    let hz = report["samples"].as_f64().unwrap() / (report["cpu_ns"].as_f64().unwrap() / 1e9);
    let want = spin_cpu * hz;
    assert!(want >= 200.0, "{version}: only {want:.0} samples expected: {report}");
    assert!((spin / want - 1.0).abs() <= 0.15, "{version}: spin has {spin} samples, {want:.0} expected ({spin_cpu:.3} CPU-s at {hz:.0} per CPU-second); counters {}", report["counters"]);
}

/// Periodic work sampled at rates commensurate with its period: 100 Hz
/// (its period, started by pytrace) and 50 Hz (twice it, by PID), where a
/// strictly periodic clock gives one function every sample. The bound is
/// that of tests/integration/sample.rs's sweep: 4 standard errors of each share, or 2
/// points when that is more.
pub fn sample_periodic_work_at_exact_rates(py: &Interpreter) {
    let version = py.version;
    let check = |how: &str, report: &serde_json::Value| {
        let total = |name: &str| {
            report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_samples"].as_u64().unwrap()).unwrap_or(0)
        };
        let split = [("sixty", 60.0), ("thirty", 30.0), ("ten", 10.0)];
        let n: u64 = split.iter().map(|(f, _)| total(f)).sum();
        assert!(n > 200, "{version} {how}: only {n} samples");
        for (name, want) in split {
            let share = total(name) as f64 * 100.0 / n as f64;
            let p = want / 100.0;
            let bound = (400.0 * (p * (1.0 - p) / n as f64).sqrt()).max(2.0);
            assert!((share - want).abs() <= bound, "{version} {how}: {name} has {share:.1} % of {n} samples, expected {want} ± {bound:.1}");
        }
    };
    check("100 Hz", &py.json(&["sample", "-r", "100"], "cpu_split.py", &["--cpu-seconds", "5"]));
    let target = py.start_waiting("cpu_split.py", &["--cpu-seconds", "8"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let tracer = start_tracer(&["sample", "-r", "50", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    signal(target.pid(), libc::SIGUSR1);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{version}: {stderr}");
    check("50 Hz by PID", &read_report(&json));
}

pub fn sample_idle_sees_sleepers(py: &Interpreter) {
    let version = py.version;
    let report = py.json(&["sample", "-r", "199", "--idle"], "sleep_and_spin.py", &[&longer(2.0)]);
    let share = |name: &str| {
        report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_share"].as_f64().unwrap()).unwrap_or(0.0)
    };
    // Half each of the two threads' samples (start-up is neither's; the
    // two must be a good part of the whole, a guard only: see
    // tests/integration/sample.rs's idle test for what start-up took in a busy VM).
    let (sleeper, spinner) = (share("sleeper"), share("spinner"));
    let of_both = sleeper / (sleeper + spinner);
    assert!((of_both - 0.5).abs() < 0.08 && sleeper + spinner > 0.3, "{version}: sleeper {sleeper:.2}, spinner {spinner:.2}");
}

/// --native: in each sample of compress_work, libz's frames sit above it
/// (between it and the leaf) with no Python frame above them; the shares of
/// compress_work and of libz under it are those of the CPU time the fixture
/// measured (common's assert_native_split: under emulation its clock reads
/// take a third of compress_work's time), and every eval frame was paired
/// with its Python frames. 3 CPU-seconds at 999 Hz: about 3,000 samples
/// however busy the machine; in the VMs 7.5 at their --native rate (common's
/// native_rate), 729 on a loaded 5.10.
pub fn sample_native_puts_c_frames_under_their_python_caller(py: &Interpreter) {
    let version = py.version;
    let (inside, cpu_split) = py.output("native-split.json");
    let rate = native_rate().to_string();
    let out = py.pytrace(&["sample", "--native", "-r", &rate, "--folded", "-"], "native_split.py", &["--cpu-seconds", &longer(3.0), "--cpu-split", &inside]);
    let mut split = NativeSplit::default();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        assert!(!stack.contains("[native stack unmatched]") || n < 5, "{version}: {line}");
        if frames.iter().any(|f| f.starts_with("spin_work (")) {
            split.spin += n;
        }
        let Some(caller) = frames.iter().rposition(|f| f.starts_with("compress_work (")) else { continue };
        split.compress += n;
        let above = &frames[caller + 1..];
        if in_zlib_call(above) {
            split.in_call += n;
        }
        if above.iter().any(|f| f.contains("(libz.so")) && !above.iter().any(|f| f.contains(".py)") || f.contains(".py:")) {
            split.in_libz += n;
        }
    }
    let min_samples = if slowdown() > 1.0 { 400 } else { 800 };
    assert!(split.compress + split.spin > min_samples, "{version}: {split:?}");
    assert_native_split(version, &split, &cpu_split);
}

/// compare runs calls and sample at once: both sides show the 60/30/10
/// split (the traced side as the fixture's own wall-time split), and every
/// round calls each function once.
pub fn compare_sees_the_split_on_both_sides(py: &Interpreter) {
    let (wall, wall_host) = py.output("wall-split.json");
    let cmp = py.json(&["compare", "-r", "999"], "cpu_split.py", &["--cpu-seconds", &longer(3.0), "--wall-split", &wall]);
    assert!(cmp["python"]["version"].as_str().unwrap().starts_with(&format!("{}.", py.version)), "{}", cmp["python"]);
    assert_compare_split(py.version, &cmp, &wall_host, 3.0);
}

pub fn info_names_each_mode(py: &Interpreter) {
    let version = py.version;
    let target = py.start_waiting("callgraph.py", &["--rounds", "1"]);
    let out = pytrace(&["info", "-p", &target.pid().to_string(), "--json", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info: serde_json::Value = parse_report(&out.stdout);
    assert!(info["version"].as_str().unwrap().starts_with(&format!("{version}.")), "{info}");
    // In a root, found through /proc/PID/root: the target sees another path.
    let interpreter = if py.shared_library() { format!("/libpython{version}.so.1.0") } else { format!("/usr/bin/python{version}") };
    assert!(info["interpreter"].as_str().unwrap().ends_with(&interpreter), "{info}");
    assert_eq!(info["shared_library"], py.shared_library(), "{info}");
    assert_eq!(info["calls_mode"], "uprobe");
    assert_eq!(info["eval_frame_hook"], py.minor() >= 11);
    let want = if py.has_function_probes() { "working" } else { "missing" };
    assert_eq!(info["function_probes"], want, "{info}");
    let (gc, imports) = if py.has_usdt() { ("usdt", "usdt") } else { ("watchpoint", "uprobe") };
    assert!(info["gc_mode"].as_str().unwrap().starts_with(gc), "{info}");
    assert!(info["imports_mode"].as_str().unwrap().starts_with(imports), "{info}");
    // Debian's builds (those with USDT probes) are stripped: gil finds its
    // sites by code search there, by symbol in pyenv's.
    let gil = if py.has_usdt() { "found by code search (take_gil at 0x" } else { ", by symbol)" };
    assert!(info["gil_mode"].as_str().unwrap().contains(gil), "{version}: {info}");
    assert!(info["calls_probe"].as_str().unwrap().starts_with(py.calls_probe_site()), "{version}: {}", info["calls_probe"]);
    let layout = info["layout"].as_str().unwrap();
    let want = if py.minor() >= 13 { "_Py_DebugOffsets" } else { "built-in table" };
    assert!(layout.contains(want), "{version}: layout from {layout}");
}

/// The eval-frame hook goes back to NULL when pytrace is killed mid-run
/// (its guardian restores it) wherever it points: at the eval function, or
/// on sid's 3.13 at a jump to it (`calls_probe_site`). While it is set the
/// calls are counted through it, and the target runs on after.
pub fn a_killed_calls_run_puts_the_hook_back(py: &Interpreter) {
    let version = py.version;
    let mut target = py.start_waiting("safety.py", &["spin"]);
    let pid = target.pid().to_string();
    let mut tracer = start_tracer(&["calls", "-p", &pid]);
    signal(target.pid(), libc::SIGUSR1);
    wait_for_line(&mut target, "spinning");
    let now = eval_frame_now(target.pid());
    assert!(now.contains("pytrace calls is tracing this process"), "{version}: {now}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    signal(tracer.child.pid(), libc::SIGKILL);
    let _ = tracer.child.0.wait();
    assert_hook_restored_within(target.pid(), std::time::Duration::from_secs(3), version);
    assert_alive(&mut target, version);
}

/// Waits for the file a fixture writes whole once it is ready.
fn wait_for_file(path: &std::path::Path, version: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !path.exists() {
        assert!(std::time::Instant::now() < deadline, "{version}: the fixture never wrote {}", path.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Python thread names (`threading.Thread.name`, read from the target's
/// memory): `dump -p` names each thread of fixtures/dump_threads.py as the
/// fixture itself names it, by the TIDs it wrote (`threading.get_native_id`),
/// a long non-ASCII name whole (the kernel keeps 15 bytes); `sample
/// --threads -- …` labels the spinning thread's stacks, folded and JSON,
/// with its Python name and TID. A hostile target (a `_name` that is no
/// str; an `_active` of 100,000 entries) gets the kernel's names where
/// Python's do not check out, says so, and runs on.
pub fn thread_names_in_dump_and_sample(py: &Interpreter) {
    let version = py.version;
    let dump = |hostile: &[&str]| {
        let (inside, host) = py.output(&format!("ids{}.json", hostile.join("-")));
        let argv = py.argv("dump_threads.py", &[&[inside.as_str()], hostile].concat());
        let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).spawn().unwrap());
        wait_for_file(&host, version);
        let ids = read_json(&host);
        let out = pytrace(&["dump", "-p", &target.pid().to_string(), "--json", "-"]);
        assert!(out.status.success(), "{version}: dump: {}", String::from_utf8_lossy(&out.stderr));
        assert!(target.0.try_wait().unwrap().is_none(), "{version}: the target died");
        let report: serde_json::Value = parse_report(&out.stdout);
        let names: HashMap<String, (String, String)> = ids
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, tid)| {
                let t = report["threads"].as_array().unwrap().iter().find(|t| t["tid"] == *tid).unwrap_or_else(|| panic!("{version}: no thread {name} in {report}"));
                let comm = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", target.pid())).unwrap();
                assert_eq!(t["os_name"], comm.trim(), "{version}: {name}'s kernel name");
                (name.clone(), (t["name"].as_str().unwrap().to_string(), comm.trim().to_string()))
            })
            .collect();
        (names, report)
    };
    let python_name = |name: &str| if name == "main" { "MainThread".to_string() } else { name.to_string() };

    let (names, report) = dump(&[]);
    assert_eq!(names.len(), 5, "{version}: {names:?}");
    for (name, (shown, _)) in &names {
        assert_eq!(shown, &python_name(name), "{version}: {report}");
    }
    assert_eq!(report["thread_names"]["from_python"], 5, "{version}: {report}");
    assert_eq!(report["thread_names"]["refused"], 0, "{version}: {report}");

    // One thread's _name is no str: it alone keeps the kernel's name.
    let (names, report) = dump(&["--hostile", "name"]);
    for (name, (shown, comm)) in &names {
        let want = if name == "worker-sleep" { comm.clone() } else { python_name(name) };
        assert_eq!(shown, &want, "{version}: {report}");
    }
    assert_eq!(report["thread_names"]["refused"], 1, "{version}: {report}");
    // _active too large to walk: every thread keeps the kernel's name.
    let (names, report) = dump(&["--hostile", "huge"]);
    for (shown, comm) in names.values() {
        assert_eq!(shown, comm, "{version}: {report}");
    }
    assert!(report["thread_names"]["failure"].as_str().unwrap().contains("huge"), "{version}: {report}");

    // By `--`: the spinning thread's stacks carry its Python name.
    let (inside, host) = py.output("ids-sample.json");
    let (_, folded_path) = py.output("threads.folded");
    let out = py.pytrace(&["sample", "-r", "199", "--threads", "--folded", folded_path.to_str().unwrap(), "--json", "-"], "dump_threads.py", &[&inside, &longer(2.0)]);
    let ids = read_json(&host);
    let report: serde_json::Value = parse_report(&out.stdout);
    let spin = format!("worker-spin ({})", ids["worker-spin"]);
    let samples = report["threads"].as_array().unwrap().iter().find(|t| t["thread"] == spin.as_str()).map(|t| t["samples"].as_u64().unwrap());
    assert!(samples.is_some_and(|n| n > 50), "{version}: no {spin} in {}", report["threads"]);
    let folded = std::fs::read_to_string(&folded_path).unwrap();
    let in_folded: u64 = folded.lines().filter(|l| l.starts_with(&format!("{spin};"))).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert_eq!(Some(in_folded), samples, "{version}: {folded}");
}

/// Stacks read while their thread runs (issue #22.1): before 3.11 a
/// returning frame goes to a free list and the next call reuses it, so a
/// walk racing the thread could follow freed or reused frames into a stack
/// the program never had. fixtures/recursive.py recurses to a depth it
/// writes and back, forever; with two CPU-bound neighbours of its own (so
/// that the target is preempted and resumed mid-read), 100 `dump -p` and 3
/// s of `sample --idle -p` must show only stacks it can have: `<module>` at
/// the root, at most MAX_DEPTH + 1 `recurse` frames, and a `recurse` the
/// caller of another only at its calling line. At least 90 dumps must show
/// a stack (a thread whose stack changed under every read is shown without
/// one, marked), and the sample at least 100 samples.
pub fn stacks_read_while_running_are_ones_it_can_have(py: &Interpreter) {
    let version = py.version;
    let _neighbours: Vec<Proc> = (0..2).map(|_| Proc(Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap())).collect();
    let (inside, host) = py.output("recursive-ready");
    let argv = py.argv("recursive.py", &[&inside]);
    let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).spawn().unwrap());
    wait_for_file(&host, version);
    let facts: Vec<u32> = std::fs::read_to_string(&host).unwrap().split_whitespace().map(|w| w.parse().unwrap()).collect();
    let (max_depth, call_line) = (facts[0] as usize, facts[1] as u64);
    let pid = target.pid().to_string();
    // Outermost first: (function, line).
    let possible = |stack: &[(String, u64)]| {
        stack.first().is_some_and(|(name, _)| name == "<module>")
            && stack[1..].iter().all(|(name, _)| name == "recurse")
            && stack.len() - 1 <= max_depth + 1
            && stack.windows(2).skip(1).all(|pair| pair[0].1 == call_line)
    };

    let mut shown = 0;
    for _ in 0..100 {
        let out = pytrace(&["dump", "-p", &pid, "--json", "-"]);
        assert!(out.status.success(), "{version}: dump: {}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = parse_report(&out.stdout);
        let threads = report["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 1, "{version}: {report}");
        let frames = threads[0]["frames"].as_array().unwrap();
        if frames.iter().any(|f| f["kind"] == "marker" && f["name"].as_str().unwrap().contains("changed under every read")) {
            continue;
        }
        let stack: Vec<(String, u64)> = frames.iter().rev().map(|f| (f["name"].as_str().unwrap().to_string(), f["line"].as_u64().unwrap_or(0))).collect();
        assert!(possible(&stack), "{version}: dump shows a stack recursive.py cannot have: {stack:?}");
        shown += 1;
    }
    assert!(shown >= 90, "{version}: only {shown} of 100 dumps showed a stack");

    let (_, folded) = py.output("recursive.folded");
    let out = pytrace(&["sample", "--idle", "--lines", "-p", &pid, "-d", &longer(3.0), "--folded", folded.to_str().unwrap(), "--json", "-"]);
    assert!(out.status.success(), "{version}: sample: {}", String::from_utf8_lossy(&out.stderr));
    let mut samples = 0;
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        // `name (file:line)`, one a frame.
        let stack: Vec<(String, u64)> = stack
            .split(';')
            .map(|frame| {
                let (name, place) = frame.split_once(" (").unwrap();
                (name.to_string(), place.trim_end_matches(')').rsplit_once(':').unwrap().1.parse().unwrap())
            })
            .collect();
        assert!(possible(&stack), "{version}: sample --idle shows a stack recursive.py cannot have: {line}");
        samples += count.parse::<u64>().unwrap();
    }
    assert!(samples >= 100, "{version}: only {samples} samples");
    assert!(target.0.try_wait().unwrap().is_none(), "{version}: the target died");
}

/// Module bodies are named after their own files: fixtures/module_bodies.py
/// imports 30 modules (from .pyc files) whose bodies are the same code,
/// each spinning for 0.1 s of CPU time, the second half once the process
/// is 6 s old (past the seconds in which every new stack wakes pytrace).
/// Each body's code object is freed as its import ends and the next one's
/// is often made at its address, with the same interned name `<module>`:
/// the sampler hashes each frame's globals (its module's dict, which lives
/// on) and reads each code object's file name pointer with its name; and
/// a new stack whose code was not seen before wakes pytrace at once. Before,
/// every sample was named after the first module (after those fixes but
/// the wake-up, one late module's 100 samples went unreadable beside CPU
/// hogs). Ground truth: each module's CPU time, measured around its
/// import; every module's share of the body samples must be within 2
/// points of its share of that time, from at least 1,500 samples in all
/// (3 s of CPU at 999 Hz).
pub fn module_bodies_are_named_after_their_own_files(py: &Interpreter) {
    let version = py.version;
    let (dir, _) = py.output("module-bodies");
    let (truth, truth_host) = py.output("module-bodies.json");
    let report = py.json(
        &["sample", "-r", "999"],
        "module_bodies.py",
        &["--dir", &dir, "--truth", &truth, "--cpu-seconds-each", &longer(0.1), "--from-bytecode", "--steady-after", "6"],
    );
    let truth = read_json(&truth_host);
    let truth = truth.as_object().unwrap();
    assert_eq!(truth.len(), 30, "{version}: {truth:?}");
    let samples_in = |file: &str| -> u64 {
        report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["name"] == "<module>" && f["file"] == file)
            .map(|f| f["total_samples"].as_u64().unwrap())
            .sum()
    };
    let sum: u64 = truth.keys().map(|file| samples_in(file)).sum();
    let cpu_sum: f64 = truth.values().map(|s| s.as_f64().unwrap()).sum();
    assert!(sum >= 1500, "{version}: only {sum} samples in the module bodies");
    for (file, cpu) in truth {
        let (share, want) = (samples_in(file) as f64 * 100.0 / sum as f64, cpu.as_f64().unwrap() * 100.0 / cpu_sum);
        assert!((share - want).abs() <= 2.0, "{version}: {file}'s body has {share:.1}% of the body samples, its CPU time {want:.1}%");
    }
}
