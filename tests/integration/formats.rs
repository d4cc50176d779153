//! Each output format read back by the program a user would read it with:
//! `--pprof` by Go's pprof (`go tool pprof`, from scripts/test-tools.sh).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::common::*;

/// `go tool pprof ARGS FILE`, which must succeed; its standard output.
pub(crate) fn go_pprof(args: &[&str], file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // pprof keeps a copy of every profile it reads under $PPROF_TMPDIR.
        .env("PPROF_TMPDIR", file.parent().unwrap())
        .env("HOME", file.parent().unwrap())
        .output()
        .expect("go is installed by scripts/test-tools.sh");
    assert!(out.status.success(), "go tool pprof {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `-top` rows by function name: (flat, cum) in the chosen sample index.
pub(crate) fn top_rows(top: &str) -> HashMap<String, (f64, f64)> {
    let mut rows = HashMap::new();
    let mut in_table = false;
    for line in top.lines() {
        if line.trim_start().starts_with("flat") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 6 {
            continue;
        }
        rows.insert(cols[5..].join(" "), (cols[0].parse().unwrap(), cols[3].parse().unwrap()));
    }
    rows
}

/// The 60/30/10 split, read by `go tool pprof -top` from the pprof file:
/// within 2 points of the known split, and every function's samples equal
/// to what the same run's JSON report says (the encoding loses nothing).
/// Attached by PID and started by pytrace, on every Python of the suite.
#[test]
fn pprof_reads_back_in_go_pprof_with_the_known_split() {
    let _machine = shared();
    for (label, python) in pythons() {
        for by_pid in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let pprof = dir.path().join("profile.pb.gz");
            let json = dir.path().join("profile.json");
            let outputs = ["--pprof", pprof.to_str().unwrap(), "--json", json.to_str().unwrap()];
            let mut args = vec!["sample", "-r", "999"];
            args.extend(outputs);
            run_on_fixture(label, &args, &python, "cpu_split.py", &["--cpu-seconds", "4"], by_pid);
            let how = if by_pid { "by PID" } else { "started" };
            let top = go_pprof(&["-top", "-nodecount=200", "-sample_index=samples"], &pprof);
            let rows = top_rows(&top);
            let cum = |name: &str| rows.get(name).map(|r| r.1).unwrap_or_else(|| panic!("{label} {how}: no {name} in\n{top}"));
            let (a, b, c) = (cum("sixty"), cum("thirty"), cum("ten"));
            let sum = a + b + c;
            assert!(sum > 3000.0, "{label} {how}: only {sum} samples");
            for (got, want, name) in [(a, 60.0, "sixty"), (b, 30.0, "thirty"), (c, 10.0, "ten")] {
                let share = got / sum * 100.0;
                assert!((share - want).abs() <= 2.0, "{label} {how}: {name} has {share:.1}% in pprof, expected {want}%");
            }
            // (Names only cpu_split.py defines: -top merges same-named
            // functions of different files, such as every `<module>`.)
            let report = read_report(&json);
            for f in report["functions"].as_array().unwrap() {
                let name = f["name"].as_str().unwrap();
                if ["sixty", "thirty", "ten", "spin"].contains(&name) {
                    assert_eq!(cum(name), f["total_samples"].as_f64().unwrap(), "{label} {how}: {name}'s samples");
                }
            }
            // The other views a pprof user reaches for read it too.
            assert!(go_pprof(&["-traces"], &pprof).contains("spin"), "{label} {how}");
            assert!(go_pprof(&["-svg"], &pprof).contains("<svg"), "{label} {how}");
        }
    }
}

/// --native and --kernel frames keep their kind in pprof: native frames sit
/// in the mapping of their module's file, kernel frames in
/// [kernel.kallsyms], Python frames in [python]; a user tells them apart
/// with pprof's mapping filters.
#[test]
fn pprof_keeps_native_and_kernel_frames_apart() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let pprof = dir.path().join("profile.pb.gz");
    let fixture = fixture("native_split.py");
    let out = pytrace(&[
        "sample", "-r", "499", "--native", "--kernel", "--pprof", pprof.to_str().unwrap(), "--", python.to_str().unwrap(), &fixture,
        "--cpu-seconds", "3",
    ]);
    assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
    let raw = go_pprof(&["-raw"], &pprof);
    let mappings: Vec<&str> = raw.lines().skip_while(|l| !l.starts_with("Mappings")).skip(1).collect();
    let mapping_id = |needle: &str| -> String {
        let line = mappings.iter().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{label}: no mapping {needle} in\n{raw}"));
        line.split(':').next().unwrap().trim().to_string()
    };
    let (python_id, zlib_id) = (mapping_id("[python]"), mapping_id("libz.so"));
    let location = |name: &str| -> String {
        raw.lines()
            .skip_while(|l| !l.starts_with("Locations"))
            .find(|l| l.contains(&format!(" {name} ")))
            .unwrap_or_else(|| panic!("{label}: no location for {name} in\n{raw}"))
            .to_string()
    };
    assert!(location("compress_work").contains(&format!("M={python_id} ")), "{label}: {}", location("compress_work"));
    assert!(location("deflate").contains(&format!("M={zlib_id} ")), "{label}: {}", location("deflate"));
}

/// `calls --pprof`: one sample per function valued in calls and self
/// nanoseconds. Read back by `go tool pprof -top -sample_index=calls`,
/// every function of callgraph.py has cProfile's ncalls (those whose name
/// another file uses too are left out: -top merges functions by name);
/// self time, summed by pprof, equals the JSON report's.
#[test]
fn calls_pprof_reads_back_with_cprofiles_counts() {
    let _machine = shared();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let (pprof, json) = (dir.path().join("calls.pb.gz"), dir.path().join("calls.json"));
        let fixture = fixture("callgraph.py");
        let out = pytrace(&[
            "calls", "--pprof", pprof.to_str().unwrap(), "--json", json.to_str().unwrap(), "--", python.to_str().unwrap(), &fixture, "--rounds", "20",
        ]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let report = read_report(&json);
        let names: Vec<&str> = report["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
        let unique = |name: &str| names.iter().filter(|n| **n == name).count() == 1;
        let top = go_pprof(&["-top", "-nodecount=100000", "-nodefraction=0", "-sample_index=calls"], &pprof);
        let rows = top_rows(&top);
        let truth = cprofile_calls(&python, "callgraph.py", &["--rounds", "20"]);
        let rows_of_fixture = rows_for_file(&report, "fixtures/callgraph.py");
        let mut checked = 0;
        for (line, name, calls) in &truth {
            let row = find_row(&rows_of_fixture, *line, name).unwrap_or_else(|| panic!("{label}: no row for {name}:{line}"));
            let qualname = row["name"].as_str().unwrap();
            if !unique(qualname) {
                continue;
            }
            let got = rows.get(qualname).unwrap_or_else(|| panic!("{label}: no {qualname} in\n{top}")).0;
            assert_eq!(got, *calls as f64, "{label}: {qualname}'s calls in pprof");
            checked += 1;
        }
        assert!(checked >= 10, "{label}: only {checked} functions compared");
        let self_ns: u64 = report["functions"].as_array().unwrap().iter().map(|f| f["self_ns"].as_u64().unwrap()).sum();
        let raw = go_pprof(&["-raw"], &pprof);
        let sum: i64 = raw
            .lines()
            .skip_while(|l| !l.starts_with("Samples:"))
            .skip(2)
            .take_while(|l| !l.starts_with("Locations"))
            .filter_map(|l| l.split(':').next()?.split_whitespace().nth(1)?.parse::<i64>().ok())
            .sum();
        assert_eq!(sum as u64, self_ns, "{label}: self nanoseconds in pprof");
    }
}

/// Folded stacks and the flamegraph have one frame per function by
/// default, its file shortened (the standard library's from its own root,
/// the program's relative to its working directory): a function spinning
/// over two lines is one frame whose samples are the JSON report's for it.
/// `--lines` splits it by line again; `--full-paths` gives the files as
/// the interpreter names them.
#[test]
fn stacks_show_functions_with_short_paths_unless_asked() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    // textwrap is pure Python in the standard library.
    // cpu_split.py's spin loops over two lines.
    let script = "import importlib.util, sys, textwrap, time\n\
                  spec = importlib.util.spec_from_file_location('cpu_split', sys.argv[1])\n\
                  split = importlib.util.module_from_spec(spec)\n\
                  spec.loader.exec_module(split)\n\
                  t = 'word ' * 200\n\
                  e = time.process_time() + 2\n\
                  while time.process_time() < e:\n    textwrap.fill(t, 30)\n    split.sixty()\n";
    let run = |extra: &[&str]| -> (String, serde_json::Value) {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("p.json");
        let fixture = fixture("cpu_split.py");
        let mut args = vec!["sample", "-r", "499", "--folded", "-", "--json", json.to_str().unwrap()];
        args.extend(extra);
        args.extend(["--", python.to_str().unwrap(), "-c", script, &fixture]);
        let out = pytrace(&args);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), read_report(&json))
    };
    let frames_of = |folded: &str, name: &str| -> HashMap<String, u64> {
        let mut seen = HashMap::new();
        for line in folded.lines() {
            let (stack, n) = line.rsplit_once(' ').unwrap();
            for frame in stack.split(';').filter(|f| f.starts_with(&format!("{name} ("))) {
                *seen.entry(frame.to_string()).or_default() += n.parse::<u64>().unwrap();
            }
        }
        seen
    };
    let (folded, report) = run(&[]);
    let spin = frames_of(&folded, "spin");
    assert_eq!(spin.keys().collect::<Vec<_>>(), ["spin (fixtures/cpu_split.py)"], "{label}: {spin:?}");
    let in_json = report["functions"].as_array().unwrap().iter().find(|f| f["name"] == "spin").unwrap()["total_samples"].as_u64().unwrap();
    assert_eq!(spin.values().sum::<u64>(), in_json, "{label}: spin's samples");
    assert!(frames_of(&folded, "TextWrapper.fill").keys().all(|f| f == "TextWrapper.fill (textwrap.py)"), "{label}: {folded}");
    assert!(!folded.contains("/lib/python3"), "{label}: a long path left");

    let (folded, _) = run(&["--lines", "--full-paths"]);
    let spin = frames_of(&folded, "spin");
    let fixture = fixture("cpu_split.py");
    assert!(spin.len() >= 2 && spin.keys().all(|f| f.starts_with(&format!("spin ({fixture}:"))), "{label}: {spin:?}");
    let fill = frames_of(&folded, "TextWrapper.fill");
    assert!(!fill.is_empty() && fill.keys().all(|f| f.contains("/lib/python3.11/textwrap.py:")), "{label}: {fill:?}");
}

/// `pytrace dump`: each thread of fixtures/dump_threads.py (told apart by
/// the native thread IDs the fixture wrote) shows the function it waits or
/// spins in as its innermost Python frame, and the state the kernel gives
/// it; with --native, the sleeping thread's innermost frames are C code
/// under sleep_here. The target runs on, its eval-frame hook untouched.
#[test]
fn dump_shows_each_threads_stack_where_it_waits() {
    let _machine = shared();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let ids_path = dir.path().join("ids.json");
        let mut target = Proc(Command::new(&python).arg(fixture("dump_threads.py")).arg(&ids_path).spawn().unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !ids_path.exists() {
            assert!(std::time::Instant::now() < deadline, "{label}: the fixture never started its threads");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let ids = read_json(&ids_path);
        let pid = target.pid().to_string();
        let hook_before = eval_frame_now(target.pid());
        for native in [false, true] {
            let mut args = vec!["dump", "-p", &pid, "--json", "-"];
            if native {
                args.push("--native");
            }
            let out = pytrace(&args);
            assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
            let dump: serde_json::Value = parse_report(&out.stdout);
            let thread = |name: &str| {
                let tid = ids[name].as_u64().unwrap();
                dump["threads"].as_array().unwrap().iter().find(|t| t["tid"] == tid).unwrap_or_else(|| panic!("{label}: no thread {name} ({tid}) in {dump}"))
            };
            let python_frames = |name: &str| -> Vec<String> {
                thread(name)["frames"].as_array().unwrap().iter().filter(|f| f["kind"] == "python").map(|f| f["name"].as_str().unwrap().to_string()).collect()
            };
            for (name, function) in [("worker-sleep", "sleep_here"), ("worker-spin", "spin_here"), ("worker-wait", "wait_on_lock")] {
                assert_eq!(python_frames(name).first().map(String::as_str), Some(function), "{label} (native {native}): {}", thread(name));
            }
            assert!(python_frames("main").iter().any(|f| f == "join_all"), "{label}: {}", thread("main"));
            assert_eq!(thread("worker-sleep")["state"], "sleeping", "{label}");
            assert_eq!(thread("worker-spin")["state"], "running", "{label}");
            if native {
                let frames = thread("worker-sleep")["frames"].as_array().unwrap();
                assert_eq!(frames[0]["kind"], "native", "{label}: {frames:?}");
            }
        }
        assert!(target.0.try_wait().unwrap().is_none(), "{label}: the target died");
        assert_eq!(eval_frame_now(target.pid()), hook_before, "{label}: the hook changed");
    }
}

/// Python thread names in `dump` and `sample --threads`, and a hostile
/// target's garbage refused (tests/integration/common/matrix.rs), on this machine's two
/// 3.11 builds; tests/integration/matrix*.rs run the same on every other version.
#[test]
fn thread_names_on_this_machines_311s() {
    let _machine = shared();
    for (_, python) in pythons() {
        crate::common::matrix::thread_names_in_dump_and_sample(&crate::common::matrix::Interpreter::host("3.11", python));
    }
}

/// An 80×24 terminal (a tmux session, as over ssh) running `command`,
/// killed when dropped.
struct Terminal(String);

impl Terminal {
    fn start(name: &str, command: &str) -> Self {
        Self::start_with_rows(name, command, 24)
    }

    /// An 80-column terminal of `rows` rows.
    fn start_with_rows(name: &str, command: &str, rows: u32) -> Self {
        Self::start_sized(name, command, 80, rows)
    }

    /// A terminal of `columns` × `rows`.
    fn start_sized(name: &str, command: &str, columns: u32, rows: u32) -> Self {
        let terminal = Terminal(format!("{name}-{}", std::process::id()));
        terminal.tmux(&["new-session", "-d", "-s", &terminal.0, "-x", &columns.to_string(), "-y", &rows.to_string(), command]);
        terminal
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().expect("tmux is installed by scripts/test-tools.sh");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the terminal shows now.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", &self.0])
    }

    fn press(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.0, keys]);
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.0]).status();
    }
}

/// `pytrace top` in an 80×24 terminal (tmux, as over ssh): the screen shows
/// the header and the fixture's functions with their times since the start
/// in the 60/30/10 split (within 5 points at 999 Hz); `q` quits at once,
/// with status 0, and gives the terminal back (the shell's line is on the
/// screen again, not the view).
#[test]
fn top_shows_the_split_live_and_quits_on_q() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let target = start_waiting(&python, "cpu_split.py", &["--seconds", "60"]);
    let terminal = Terminal::start("pytrace-top", &format!("{PYTRACE} top -r 999 -p {}; echo top exited with $?; sleep 60", target.pid()));
    signal(target.pid(), libc::SIGUSR1);
    std::thread::sleep(std::time::Duration::from_secs(5));
    let screen = terminal.screen();
    assert!(screen.contains(&format!("pytrace top: PID {}", target.pid())), "{label}:\n{screen}");
    assert!(screen.lines().count() <= 24 && screen.lines().all(|l| l.chars().count() <= 80), "{label}: fits 80×24:\n{screen}");
    let seconds = |name: &str| -> f64 {
        let line = screen.lines().find(|l| l.contains(&format!(" {name} ("))).unwrap_or_else(|| panic!("{label}: no {name}:\n{screen}"));
        line.split_whitespace().nth(3).unwrap().trim_end_matches('s').parse().unwrap()
    };
    let (a, b, c) = (seconds("sixty"), seconds("thirty"), seconds("ten"));
    let sum = a + b + c;
    assert!(sum > 1.0, "{label}: {sum} s sampled:\n{screen}");
    for (got, want, name) in [(a, 60.0, "sixty"), (b, 30.0, "thirty"), (c, 10.0, "ten")] {
        assert!((got / sum * 100.0 - want).abs() <= 5.0, "{label}: {name} {got} s of {sum}:\n{screen}");
    }
    terminal.press("q");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let screen = terminal.screen();
        if screen.contains("top exited with 0") {
            assert!(!screen.contains("%Own"), "{label}: the view stayed on screen:\n{screen}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{label}: q did not quit:\n{screen}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `top --async` (sid's 3.15) in an 80×24 terminal: each asyncio task of
/// fixtures/async_tasks.py a row of its own, `[task alpha]` and `[task
/// beta]`, whose times since the start split as the CPU time the fixture
/// measured of each task's spins (four binomial standard errors plus three
/// points: the screen is read while the fixture runs, its truth covers the
/// whole run).
#[test]
fn top_async_shows_each_tasks_share() {
    let _machine = shared();
    let py = crate::common::matrix::Interpreter::debian("3.15");
    let (inside, truth_path) = py.output("top-async-truth.json");
    let mut target = py.start_waiting("async_tasks.py", &[&inside, &longer(6.0)]);
    // 60 rows: each task's row sorts by its own time (0), after every
    // function that had a sample of its own; on a busy machine the event
    // loop's many 0.4 % rows pushed beta's off a 24-row screen.
    let terminal = Terminal::start_with_rows("pytrace-top-async", &format!("{PYTRACE} top --async -r 499 -p {}; echo top exited with $?; sleep 60", target.pid()), 60);
    std::thread::sleep(std::time::Duration::from_secs(4));
    let screen = terminal.screen();
    let seconds = |task: &str| -> f64 {
        let line = screen.lines().find(|l| l.contains(&format!("[task {task}]"))).unwrap_or_else(|| panic!("no row for task {task}:\n{screen}"));
        line.split_whitespace().nth(3).unwrap().trim_end_matches('s').parse().unwrap()
    };
    let (alpha, beta) = (seconds("alpha"), seconds("beta"));
    assert!(target.0.wait().unwrap().success(), "the fixture failed");
    // Its target gone, top ends (it once stayed on, spinning in its key
    // reads, until killed by hand an hour later).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !terminal.screen().contains("top exited with 0") {
        assert!(std::time::Instant::now() < deadline, "top --async did not end with its target:\n{}", terminal.screen());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let truth: HashMap<String, f64> = serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    let n = (alpha + beta) * 499.0;
    assert!(n >= 300.0, "{n} samples of the tasks:\n{screen}");
    let p = truth["alpha"] / (truth["alpha"] + truth["beta"]);
    let share = alpha / (alpha + beta);
    let bound = 4.0 * (p * (1.0 - p) / n).sqrt() + 0.03;
    assert!((share - p).abs() <= bound, "alpha has {share:.3} of the tasks' samples, {p:.3} of their CPU time (bound {bound:.3}):\n{screen}");
}

/// Before 3.14 `top --async` says in one sentence that it needs 3.14, and
/// exits non-zero; the target runs on.
#[test]
fn top_async_before_3_14_says_what_it_needs() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let target = start_waiting(&python, "cpu_split.py", &["--seconds", "30"]);
    let terminal = Terminal::start("pytrace-top-async-old", &format!("{PYTRACE} top --async -p {}; echo top exited with $?; sleep 60", target.pid()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let screen = loop {
        let screen = terminal.screen();
        if screen.contains("top exited with") {
            break screen;
        }
        assert!(std::time::Instant::now() < deadline, "{label}: top --async did not end:\n{screen}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(screen.contains("top --async needs CPython 3.14 or later") && screen.contains("top exited with 1"), "{label}:\n{screen}");
    assert!(std::path::Path::new(&format!("/proc/{}", target.pid())).exists(), "{label}: the target did not run on");
}

/// Without a terminal `top` says so in one sentence, before attaching.
#[test]
fn top_without_a_terminal_says_so() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let target = start_waiting(&python, "cpu_split.py", &["--seconds", "5"]);
    let out = pytrace(&["top", "-p", &target.pid().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{label}: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{label}: {stderr}");
    assert!(stderr.contains("standard output is not a terminal") || stderr.contains("is not one"), "{label}: {stderr}");
}

/// A CPython that runs the fixtures, and a directory it and pytrace both
/// see: on this machine, or in a Debian root by chroot as tests/integration/matrix.rs
/// runs them (the target then names its files by paths inside the root).
struct Interpreter {
    label: String,
    /// The command that runs a Python file, up to the file.
    python: Vec<String>,
    /// The shared directory, as pytrace and as the target see it.
    host_dir: std::path::PathBuf,
    inside_dir: String,
    _dir: tempfile::TempDir,
}

impl Interpreter {
    fn host(label: &str, python: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let inside_dir = dir.path().to_str().unwrap().to_string();
        Interpreter { label: label.into(), python: vec![python.to_str().unwrap().into()], host_dir: dir.path().into(), inside_dir, _dir: dir }
    }

    /// Debian's python`version` in the root scripts/pythons.sh makes.
    fn rooted(version: &str) -> Self {
        let (env, which) = if version == "3.9" { ("PYTRACE_ROOT_39", "root-3.9") } else { ("PYTRACE_ROOT_SID", "root-sid") };
        let root = std::env::var_os(env).map(std::path::PathBuf::from).unwrap_or_else(|| scripts_pythons(which));
        assert!(root.join(format!("usr/bin/python{version}")).exists(), "no python{version} in {}: run scripts/pythons.sh {which}", root.display());
        let dir = tempfile::tempdir_in(root.join("tmp")).unwrap();
        let inside_dir = format!("/tmp/{}", dir.path().file_name().unwrap().to_str().unwrap());
        Interpreter {
            label: format!("Debian {version}"),
            python: vec!["chroot".into(), root.to_str().unwrap().into(), format!("/usr/bin/python{version}")],
            host_dir: dir.path().into(),
            inside_dir,
            _dir: dir,
        }
    }

    /// pyenv's 3.`minor`, as scripts/pythons.sh provides it.
    fn pyenv(version: &str) -> Self {
        Self::host(&format!("pyenv {version}"), &scripts_pythons(&format!("pyenv-{version}")))
    }

    /// The argv that runs `script` (copied into the shared directory).
    fn argv(&self, script: &str, args: &[&str]) -> Vec<String> {
        std::fs::copy(fixture(script), self.host_dir.join(script)).unwrap();
        let mut v = self.python.clone();
        v.push(format!("{}/{script}", self.inside_dir));
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    /// Starts `script` with --wait; returns once it waits for SIGUSR1.
    /// (`chroot` execs the Python in place: the child's PID is the target's.)
    fn start_waiting(&self, script: &str, args: &[&str]) -> Proc {
        let argv = self.argv(script, &[args, &["--wait"]].concat());
        let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).stdout(std::process::Stdio::piped()).spawn().unwrap());
        wait_for_line(&mut target, "ready");
        target
    }

    fn run(&self, script: &str, args: &[&str]) -> String {
        let argv = self.argv(script, args);
        let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
        assert!(out.status.success(), "{}: {argv:?}: {}", self.label, String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

fn scripts_pythons(what: &str) -> std::path::PathBuf {
    let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg(what).output().unwrap();
    assert!(out.status.success(), "scripts/pythons.sh {what}: {}", String::from_utf8_lossy(&out.stderr));
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Functions fixtures/callers.py runs outside main(), which cProfile (run
/// around main only) does not see; pytrace sees each once.
const CALLERS_OUTSIDE_MAIN: [&str; 3] = ["<module>", "Base", "Derived"];

/// `calls --pstats` on fixtures/callers.py, read back by pstats.Stats in
/// the target's own Python, against cProfile's stats file from a run of
/// its own (builtins=False: pytrace sees no C functions): every function's
/// calls and primitive calls, and every caller edge's, are equal. Times
/// cannot be (the two cost differently), so they are checked as sums: a
/// function's self time is its edges' self times added up, and so is the
/// total of a function that does not recurse. `by_pid`: attach to the
/// waiting fixture with -p (its module body, already running, is then no
/// one's caller) instead of starting it.
fn pstats_equal_cprofile_by(py: Interpreter, by_pid: bool) {
    let label = &format!("{} {}", py.label, if by_pid { "-p" } else { "--" });
    let rounds = "100";
    py.run("callers.py", &["--rounds", rounds, "--cprofile-pstats", &format!("{}/cprofile.prof", py.inside_dir)]);
    let ours = py.host_dir.join("pytrace.prof");
    let stdout = if by_pid {
        let target = py.start_waiting("callers.py", &["--rounds", rounds]);
        let tracer = start_tracer(&["calls", "-p", &target.pid().to_string(), "--pstats", ours.to_str().unwrap()]);
        signal(target.pid(), libc::SIGUSR1);
        let (code, stdout, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        stdout
    } else {
        let mut argv = vec!["calls".to_string(), "--pstats".into(), ours.to_str().unwrap().into(), "--".into()];
        argv.extend(py.argv("callers.py", &["--rounds", rounds]));
        let out = pytrace(&argv.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(stdout.contains("dropped: nothing"), "{label}: {stdout}");
    let read = |file: &str| -> serde_json::Value { serde_json::from_str(&py.run("callers.py", &["--read-pstats", &format!("{}/{file}", py.inside_dir)])).unwrap() };
    let (truth, ours) = (read("cprofile.prof"), read("pytrace.prof"));
    let (all_truth, ours) = (truth.as_object().unwrap(), ours.as_object().unwrap());
    let counts = |v: &serde_json::Value| (v["calls"].as_u64().unwrap(), v["primitive_calls"].as_u64().unwrap());
    // pytrace sees no C function: a call cProfile shows made from one is,
    // for pytrace, made from the Python function that called the C one.
    let is_c = |f: &str| f.starts_with("~:");
    let truth: serde_json::Map<String, serde_json::Value> = all_truth.iter().filter(|(f, _)| !is_c(f)).map(|(f, v)| (f.clone(), v.clone())).collect();
    assert!(truth.len() >= 10, "{label}: cProfile saw only {:?}", truth.keys());
    for (function, want) in &truth {
        let got = ours.get(function).unwrap_or_else(|| panic!("{label}: no {function} in pytrace's stats: {:?}", ours.keys()));
        assert_eq!(counts(got), counts(want), "{label}: (calls, primitive calls) of {function}");
        let mut want_callers: HashMap<String, (u64, u64)> = HashMap::new();
        for (caller, edge) in want["callers"].as_object().unwrap() {
            let caller = if is_c(caller) {
                let above = all_truth[caller]["callers"].as_object().unwrap();
                assert_eq!(above.len(), 1, "{label}: {caller} has one Python caller");
                above.keys().next().unwrap().clone()
            } else {
                caller.clone()
            };
            let sum = want_callers.entry(caller).or_default();
            sum.0 += counts(edge).0;
            sum.1 += counts(edge).1;
        }
        let got_callers = got["callers"].as_object().unwrap();
        for (caller, edge) in &want_callers {
            let got_edge = got_callers.get(caller).unwrap_or_else(|| panic!("{label}: no edge {caller} -> {function}: {got_callers:?}"));
            assert_eq!(counts(got_edge), *edge, "{label}: (calls, primitive calls) of {caller} -> {function}");
        }
        // Callers cProfile did not see at all are the module's body
        // (main's), which with -p was running before tracing began.
        for caller in got_callers.keys().filter(|c| !want_callers.contains_key(*c)) {
            assert!(!by_pid && !truth.contains_key(caller) && caller.ends_with(":<module>"), "{label}: extra edge {caller} -> {function}");
        }
    }
    for (function, got) in ours.iter().filter(|(f, _)| !truth.contains_key(*f)) {
        assert!(!by_pid, "{label}: {function} ran before tracing began");
        assert!(CALLERS_OUTSIDE_MAIN.iter().any(|n| function.ends_with(&format!(":{n}"))), "{label}: unexpected {function}");
        assert_eq!(counts(got), (1, 1), "{label}: {function} runs once");
    }
    let recursive = ["recurse", "is_even", "is_odd"];
    for (function, got) in ours {
        let callers = got["callers"].as_object().unwrap();
        if callers.is_empty() {
            continue;
        }
        let sum = |field: &str| callers.values().map(|e| e[field].as_f64().unwrap()).sum::<f64>();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 + 1e-6 * b;
        assert!(close(sum("self_s"), got["self_s"].as_f64().unwrap()), "{label}: {function}'s edges' self times {} != {}", sum("self_s"), got["self_s"]);
        if !recursive.iter().any(|r| function.ends_with(&format!(":{r}"))) {
            assert!(close(sum("total_s"), got["total_s"].as_f64().unwrap()), "{label}: {function}'s edges' totals {} != {}", sum("total_s"), got["total_s"]);
        }
        assert!(got["self_s"].as_f64().unwrap() <= got["total_s"].as_f64().unwrap() + 1e-9, "{label}: {function} self > total");
    }
}

#[test]
fn pstats_equal_cprofile_on_this_machines_3_11_builds() {
    let _machine = shared();
    for (label, python) in pythons() {
        pstats_equal_cprofile_by(Interpreter::host(label, &python), false);
        pstats_equal_cprofile_by(Interpreter::host(label, &python), true);
    }
}

/// Started by pytrace, then attached by PID, each on a fresh interpreter.
fn pstats_equal_cprofile(new: fn() -> Interpreter) {
    pstats_equal_cprofile_by(new(), false);
    pstats_equal_cprofile_by(new(), true);
}

over_builds! {
    debian_3_9(|| Interpreter::rooted("3.9")): pstats_equal_cprofile;
    pyenv_3_10(|| Interpreter::pyenv("3.10")): pstats_equal_cprofile;
    pyenv_3_12(|| Interpreter::pyenv("3.12")): pstats_equal_cprofile;
    debian_3_13(|| Interpreter::rooted("3.13")): pstats_equal_cprofile;
    debian_3_14(|| Interpreter::rooted("3.14")): pstats_equal_cprofile;
    debian_3_15(|| Interpreter::rooted("3.15")): pstats_equal_cprofile;
}

/// `pytrace top --calls -p PID` in an 80×24 terminal: once the fixture's
/// rounds are done (it then sleeps), the Calls column, sorted by key 2,
/// shows exactly cProfile's counts for the same rounds; `q` quits with
/// status 0 and gives the terminal back.
#[test]
fn top_calls_shows_cprofiles_counts_live_and_quits_on_q() {
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let py = Interpreter::host(label, &python);
    let rounds = "2000";
    py.run("callers.py", &["--rounds", rounds, "--cprofile-pstats", &format!("{}/cprofile.prof", py.inside_dir)]);
    let truth: serde_json::Value = serde_json::from_str(&py.run("callers.py", &["--read-pstats", &format!("{}/cprofile.prof", py.inside_dir)])).unwrap();
    let target = py.start_waiting("callers.py", &["--rounds", rounds, "--linger", "60"]);
    let terminal = Terminal::start("pytrace-top-calls", &format!("{PYTRACE} top --calls -p {}; echo top exited with $?; sleep 60", target.pid()));
    // The view is up once pytrace has attached: only then may the rounds run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !terminal.screen().contains("exact calls") {
        assert!(std::time::Instant::now() < deadline, "{label}: no view:\n{}", terminal.screen());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    signal(target.pid(), libc::SIGUSR1);
    std::thread::sleep(std::time::Duration::from_secs(5));
    terminal.press("2");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let screen = terminal.screen();
    assert!(screen.contains(&format!("pytrace top --calls: PID {}", target.pid())), "{label}:\n{screen}");
    assert!(screen.contains("[Calls]"), "{label}: key 2 sorts by calls:\n{screen}");
    assert!(screen.lines().count() <= 24 && screen.lines().all(|l| l.chars().count() <= 80), "{label}: fits 80×24:\n{screen}");
    for name in ["recurse", "shared", "is_even", "is_odd", "first", "second"] {
        let want = truth.as_object().unwrap().iter().find(|(k, _)| k.ends_with(&format!(":{name}"))).unwrap().1["calls"].as_u64().unwrap();
        let line = screen.lines().find(|l| l.contains(&format!(" {name} ("))).unwrap_or_else(|| panic!("{label}: no {name}:\n{screen}"));
        let got: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(got, want, "{label}: calls of {name}:\n{screen}");
    }
    terminal.press("q");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let screen = terminal.screen();
        if screen.contains("top exited with 0") {
            assert!(!screen.contains("Calls/s"), "{label}: the view stayed on screen:\n{screen}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{label}: q did not quit:\n{screen}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(eval_frame_now(target.pid()), "not set", "{label}: the eval-frame hook is put back");
}

/// `top --memory -p PID` on fixtures/memory_split.py (three functions
/// hold 60/30/10 of 24 MiB, a fifth leaks 2000-byte bytearrays) at
/// `--every 1024`, in a 200×80 terminal: wide and tall enough that every
/// row of the three shows whole (on 3.11 a list comprehension's frame
/// comes first in two of their stacks). Once the fixture holds its memory,
/// the screen's rows, each charged to the innermost of the fixture's
/// functions in its stack, give the three the split of the bytes
/// tracemalloc finds each holding in a run of the same work (`--truth`),
/// within 3 points; the leak has its rows, within 10 % of what it made;
/// nothing is dropped. `q` quits with status 0 and the target runs on.
///
/// The bound, from the kept events (the `kept` column): a function's
/// estimate from k kept events of one size, each kept with chance p, has
/// a relative standard error of sqrt((1 - p) / k). retain_small's pools
/// (16 KiB, p = 1 - e^-16) and the buffers (256 KiB) are all but
/// certainly kept: their error is nil. The bytearrays' 4 KiB (p = 0.98)
/// carry it: 3 points of their 30 % (10 %) at two standard errors needs
/// k >= (1 - 0.98) / 0.05² = 8 (~1,800 are kept); the leak's 2000 bytes
/// (p = 0.86), 10 % at two, k >= 56 (MIN_KEPT_* in memory.rs). The
/// screen rounds a row to a tenth of its unit: 0.05 MiB of the buffers'
/// 2.2 MiB row is 0.2 points of the split, within the bound.
#[test]
fn top_memory_shows_the_held_split_live_and_quits_on_q() {
    use crate::memory::{FUNCTIONS, MIN_KEPT_BYTEARRAYS, MIN_KEPT_LEAK};
    let _machine = shared();
    let (label, python) = pythons().remove(0);
    let py = crate::common::matrix::Interpreter::host("3.11", python);
    let (truth_inside, truth_host) = py.output("top-memory-truth.json");
    py.run("memory_split.py", &["--truth", &truth_inside]);
    let truth = crate::common::read_json(&truth_host);
    let (held_inside, held_host) = py.output("top-memory-held.json");
    let mut target = py.start_waiting("memory_split.py", &["--held", &held_inside, "--hold", "300"]);
    let command = format!("{PYTRACE} top --memory --every 1024 -p {}; echo top exited with $?; sleep 60", target.pid());
    let terminal = Terminal::start_sized("pytrace-top-memory", &command, 200, 80);
    // The view is up once pytrace has attached: only then may the work run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !terminal.screen().contains("kept blocks read") {
        assert!(std::time::Instant::now() < deadline, "{label}: no view:\n{}", terminal.screen());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    signal(target.pid(), libc::SIGUSR1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !held_host.exists() {
        assert!(std::time::Instant::now() < deadline, "{label}: the fixture did not finish its work");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Two readings after the work is done (the view reads once a second).
    std::thread::sleep(std::time::Duration::from_secs(3));
    let screen = terminal.screen();
    assert!(screen.contains(&format!("pytrace top --memory: PID {}", target.pid())), "{label}:\n{screen}");
    assert!(screen.contains("dropped: nothing"), "{label}: events dropped:\n{screen}");
    let rows = top_memory_rows(&screen);
    let mut held: HashMap<&str, (f64, u64)> = FUNCTIONS.iter().map(|f| (*f, (0.0, 0))).collect();
    for (live, kept, stack) in &rows {
        let Some(function) = stack.split(" < ").find_map(|frame| FUNCTIONS.iter().find(|f| frame.starts_with(&format!("{f} (")))) else { continue };
        let e = held.get_mut(function).unwrap();
        e.0 += live;
        e.1 += kept;
    }
    let (kept_bytearrays, kept_leak) = (held["retain_bytearrays"].1, held["leak"].1);
    assert!(kept_bytearrays >= MIN_KEPT_BYTEARRAYS, "{label}: the bytearrays rest on {kept_bytearrays} kept events, at least {MIN_KEPT_BYTEARRAYS} needed:\n{screen}");
    assert!(kept_leak >= MIN_KEPT_LEAK, "{label}: the leak rests on {kept_leak} kept events, at least {MIN_KEPT_LEAK} needed:\n{screen}");
    let retained = ["retain_small", "retain_bytearrays", "retain_buffers"];
    let sum: f64 = retained.iter().map(|f| held[f].0).sum();
    let truth_sum: f64 = retained.iter().map(|f| truth[f].as_f64().unwrap()).sum();
    for f in retained {
        let (share, want) = (held[f].0 / sum, truth[f].as_f64().unwrap() / truth_sum);
        assert!((share - want).abs() <= 0.03, "{label}: {f} holds {share:.3} of the three's live bytes on screen, tracemalloc {want:.3} (± 0.03):\n{screen}");
    }
    let leak = held["leak"].0 / truth["leak"].as_f64().unwrap();
    assert!((leak - 1.0).abs() <= 0.10, "{label}: the leak shows {:.0} bytes live, tracemalloc {} (± 10 %):\n{screen}", held["leak"].0, truth["leak"]);
    terminal.press("q");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let screen = terminal.screen();
        if screen.contains("top exited with 0") {
            assert!(!screen.contains("kept blocks read"), "{label}: the view stayed on screen:\n{screen}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{label}: q did not quit:\n{screen}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(target.0.try_wait().unwrap().is_none(), "{label}: the target did not run on");
}

/// `top --memory`'s rows on a screen: (live bytes, kept events, stack),
/// from lines of `LIVE ±95% GROWN ±95% KEPT FROM STACK…`, each byte
/// count a number and its unit.
fn top_memory_rows(screen: &str) -> Vec<(f64, u64, String)> {
    let bytes = |number: &str, unit: &str| -> Option<f64> {
        let scale = match unit {
            "B" => 1.0,
            "KiB" => 1024.0,
            "MiB" => 1048576.0,
            "GiB" => 1073741824.0,
            _ => return None,
        };
        Some(number.parse::<f64>().ok()? * scale)
    };
    screen
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 11 || !["pool", "malloc"].contains(&cols[9]) {
                return None;
            }
            let live = bytes(cols[0], cols[1])?;
            let kept = cols[8].replace(',', "").parse().ok()?;
            Some((live, kept, cols[10..].join(" ")))
        })
        .collect()
}

/// `--memory` with another view (`--calls`, `--async`, the sampler's
/// `--rate`), `--every` without `--memory`, or an `--every` of 0: one
/// sentence and a non-zero exit (clap's 2 for a conflict, 1 for the
/// others), before any process is looked at.
#[test]
fn top_memory_refuses_what_it_cannot_do_in_one_sentence() {
    let _machine = shared();
    for (args, code, said) in [
        (&["top", "--memory", "--calls", "-p", "1"][..], 2, "pytrace: the argument '--memory' cannot be used with '--calls'"),
        (&["top", "--memory", "--async", "-p", "1"][..], 2, "pytrace: the argument '--memory' cannot be used with '--async'"),
        (&["top", "--memory", "-r", "999", "-p", "1"][..], 2, "pytrace: the argument '--memory' cannot be used with '--rate <HZ>'"),
        (&["top", "--every", "1024", "-p", "1"][..], 1, "pytrace: --every sets the byte sampling of `top --memory`: add --memory"),
        (&["top", "--memory", "--every", "0", "-p", "1"][..], 1, "pytrace: --every must be at least 1 byte"),
    ] {
        let out = pytrace(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert_eq!(error_lines(&stderr), vec![said], "{args:?}");
    }
}
