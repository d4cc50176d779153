//! `pytrace calls` on the Python code the interpreter runs for you
//! (fixtures/implicit_calls.py: dunder methods called by operators and
//! builtins, attribute machinery, object creation, generators and coroutines
//! driven every way, closures, key functions, decorators, class bodies),
//! each call site warmed up until specialized, on every CPython build at
//! hand: every function's count must equal cProfile's ncalls, by `--` and by
//! `-p`. Some builds run such calls without entering
//! _PyEval_EvalFrameDefault (3.11.0-3.11.3's BINARY_SUBSCR_GETITEM, 3.13's
//! inlined __init__, close()'s fast path since gh-140373): the counters show
//! those were counted where they happen, and no report may call its counts
//! lower bounds.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::*;

const SCRIPT: &str = "implicit_calls.py";
const ROUNDS: &str = "3";

/// Rows a whole run (`--`) has beyond cProfile's, which only sees main():
/// the module body, the class bodies and the decorator applied at import,
/// once each.
const AT_IMPORT: [&str; 21] = [
    "<module>", "Box", "Countdown", "Key", "Managed", "Mortal", "Celsius", "Doubled", "Lazy", "Holder", "Fallback", "Audited",
    "Plain", "Allocated", "Derived", "Registry", "Suspend", "AsyncRange", "AsyncManaged", "Tool", "traced",
];

/// One build of CPython and how to run a fixture on it.
struct Build {
    label: &'static str,
    /// The root it runs in (chroot), or None for this machine's root.
    root: Option<PathBuf>,
    /// The interpreter, as the target sees it.
    python: String,
    /// Environment for the target (and for pytrace, which passes it on).
    env: Vec<(String, String)>,
    /// Where the fixtures are, as the target sees them; removed on drop
    /// when copied into a root.
    fixtures: String,
    /// Kept alive for builds that live in a temporary directory.
    _scratch: Option<tempfile::TempDir>,
}

fn script_output(args: &[&str]) -> PathBuf {
    let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).args(args).output().expect("run scripts/pythons.sh");
    assert!(out.status.success(), "scripts/pythons.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

impl Build {
    fn host(label: &'static str, python: PathBuf) -> Self {
        assert!(python.exists(), "{label}: {} is missing", python.display());
        let fixtures = fixture("");
        Build { label, root: None, python: python.to_string_lossy().into_owned(), env: Vec::new(), fixtures, _scratch: None }
    }

    /// A root made by scripts/pythons.sh, which scripts/test.sh names in an
    /// environment variable (made here once otherwise).
    fn chroot(label: &'static str, which: &str, python: &str) -> Self {
        let env = match which {
            "root-3.9" => "PYTRACE_ROOT_39",
            "root-sid" => "PYTRACE_ROOT_SID",
            _ => "PYTRACE_ROOT_TRIXIE",
        };
        let root = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| script_output(&[which]));
        assert!(root.join(&python[1..]).exists(), "{label}: no {python} in {}: run scripts/pythons.sh {which}", root.display());
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let fixtures = format!("/pytrace-implicit-{}-{n}/", std::process::id());
        let dir = root.join(&fixtures[1..]);
        std::fs::create_dir_all(&dir).unwrap();
        for name in [SCRIPT, "ground_truth.py"] {
            std::fs::copy(fixture(name), dir.join(name)).unwrap();
        }
        Build { label, root: Some(root), python: python.into(), env: Vec::new(), fixtures, _scratch: None }
    }

    /// pyenv's 3.13 with its shared libpython copied and stripped of its
    /// symbol table, found through LD_LIBRARY_PATH (pyenv's executable has
    /// a RUNPATH, which LD_LIBRARY_PATH overrides): a stripped PIE library,
    /// whose opcode table only relocations fill in.
    fn stripped_pyenv_313() -> Self {
        let python = script_output(&["pyenv-3.13"]);
        let lib = python.parent().unwrap().parent().unwrap().join("lib/libpython3.13.so.1.0");
        let scratch = tempfile::tempdir().unwrap();
        let copy = scratch.path().join("libpython3.13.so.1.0");
        let status = Command::new("strip").arg("-o").arg(&copy).arg(&lib).status().expect("run strip");
        assert!(status.success(), "strip {}", lib.display());
        let mut build = Build::host("pyenv-3.13-stripped", python);
        build.env.push(("LD_LIBRARY_PATH".into(), scratch.path().to_string_lossy().into_owned()));
        build._scratch = Some(scratch);
        build
    }

    fn argv(&self, args: &[&str]) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(root) = &self.root {
            v.extend(["chroot".to_string(), root.to_string_lossy().into_owned()]);
        }
        v.push(self.python.clone());
        v.push(format!("{}{SCRIPT}", self.fixtures));
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    fn command(&self, argv: &[String]) -> Command {
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// A file the target writes: its name for the target, and for us.
    fn output(&self, name: &str) -> (String, PathBuf) {
        let inside = format!("{}{name}", self.fixtures);
        let host = match &self.root {
            Some(root) => root.join(&inside[1..]),
            None => PathBuf::from(format!("{}/{name}", std::env::temp_dir().display())),
        };
        let inside = if self.root.is_some() { inside } else { host.to_string_lossy().into_owned() };
        (inside, host)
    }

    /// cProfile's view of the fixture's main().
    fn truth(&self) -> Vec<Truth> {
        let (inside, host) = self.output(&format!("truth-{}-{}.json", self.label, std::process::id()));
        let argv = self.argv(&["--rounds", ROUNDS, "--cprofile", &inside]);
        assert!(self.command(&argv).status().unwrap().success(), "{}: {argv:?}", self.label);
        let rows = read_json(&host);
        let _ = std::fs::remove_file(&host);
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| Truth {
                line: r["line"].as_u64().unwrap() as u32,
                name: r["name"].as_str().unwrap().to_string(),
                calls: r["calls"].as_u64().unwrap(),
                callers: r["callers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| (c["line"].as_u64().unwrap() as u32, c["name"].as_str().unwrap().to_string(), c["calls"].as_u64().unwrap()))
                    .collect(),
            })
            .collect()
    }

    fn trace_command(&self) -> serde_json::Value {
        let argv = self.argv(&["--rounds", ROUNDS]);
        let mut all = vec!["calls".to_string(), "--json".into(), "-".into(), "--".into()];
        all.extend(argv);
        let out = Command::new(PYTRACE).args(&all).envs(self.env.iter().map(|(k, v)| (k, v))).output().unwrap();
        assert!(out.status.success(), "{}: pytrace {all:?}: {}", self.label, String::from_utf8_lossy(&out.stderr));
        parse_report(&out.stdout)
    }

    fn trace_pid(&self) -> serde_json::Value {
        let argv = self.argv(&["--rounds", ROUNDS, "--wait"]);
        // chroot execs the interpreter in place: the child's PID is the target's.
        let mut target = Proc(self.command(&argv).stdout(Stdio::piped()).spawn().unwrap());
        wait_for_line(&mut target, "ready");
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("calls.json");
        let tracer = start_tracer(&["calls", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
        signal(target.pid(), libc::SIGUSR1);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{}: {stderr}", self.label);
        read_report(&json)
    }
}

impl Drop for Build {
    fn drop(&mut self) {
        if let Some(root) = &self.root {
            let _ = std::fs::remove_dir_all(root.join(&self.fixtures[1..]));
        }
    }
}

struct Truth {
    line: u32,
    name: String,
    calls: u64,
    /// (first line, name, calls made) of each caller in the fixture.
    callers: Vec<(u32, String, u64)>,
}

fn check(build: &Build, how: &str, report: &serde_json::Value, truth: &[Truth]) {
    let label = format!("{} {how}", build.label);
    let whole_run = how == "--";
    let rows = rows_for_file(report, &format!("/{SCRIPT}"));
    for t in truth {
        let row = find_row(&rows, t.line, &t.name).unwrap_or_else(|| panic!("{label}: no row for {} (line {})", t.name, t.line));
        // Holder's class body, at import, names its descriptor once more.
        let extra = u64::from(whole_run && t.name == "__set_name__");
        assert_eq!(row["calls"].as_u64().unwrap(), t.calls + extra, "{label}: calls of {} (line {})", t.name, t.line);
    }
    for row in &rows {
        let (name, line) = (row["name"].as_str().unwrap(), row["line"].as_u64().unwrap() as u32);
        if truth.iter().any(|t| find_row(&[*row], line, &t.name).is_some() && t.line == line) {
            continue;
        }
        assert!(whole_run && AT_IMPORT.contains(&name), "{label}: a row cProfile has not: {name} (line {line})");
        assert_eq!(row["calls"], 1, "{label}: {name} runs once, at import");
    }
    assert_eq!(report["lost_events"], 0, "{label}");

    // What an inlined __getitem__ calls is its child, not its caller's.
    let getitem = truth.iter().find(|t| t.name == "__getitem__").expect("cProfile saw __getitem__");
    let helper = truth.iter().find(|t| t.name == "helper").expect("cProfile saw helper");
    let from_getitem: u64 = helper.callers.iter().filter(|c| c.0 == getitem.line && c.1 == "__getitem__").map(|c| c.2).sum();
    assert_eq!(from_getitem, helper.calls, "cProfile: every helper call is made by __getitem__");
    let row = find_row(&rows, getitem.line, "__getitem__").unwrap();
    assert_eq!(row["child_calls"].as_u64().unwrap(), from_getitem, "{label}: calls made by __getitem__");

    let caveats = report["caveats"].to_string();
    assert!(!caveats.contains("lower bound"), "{label}: {caveats}");
    let version = report["python"]["version"].as_str().unwrap();
    let counter = |name: &str| report["counters"][name].as_u64().unwrap_or(0);
    // 3.11.0-3.11.3 only (gh-104405).
    let getitem_bug = version.starts_with("3.11.") && version[5..].parse::<u32>().unwrap() < 4;
    assert_eq!(counter("inlined_getitem_calls") > 0, getitem_bug, "{label}: {version}");
    // close()'s fast path, skipped unless a tool listens (gh-140373): in
    // Debian sid's builds, not yet in trixie's 3.13.5 or pyenv's 3.13.0.
    let skips_close = build.label.starts_with("sid-");
    assert_eq!(counter("skipped_close_calls") > 0, skips_close, "{label}: {version}");
}

fn exact_by_command_and_pid(build: Build) {
    let truth = build.truth();
    assert!(truth.len() > 60, "{}: cProfile saw {} functions", build.label, truth.len());
    check(&build, "--", &build.trace_command(), &truth);
    check(&build, "-p", &build.trace_pid(), &truth);
}

over_builds! {
    debian_3_11_2(Build::host("debian-3.11", PathBuf::from("/usr/bin/python3.11"))): exact_by_command_and_pid;
    pyenv_3_10(Build::host("pyenv-3.10", script_output(&["pyenv-3.10"]))): exact_by_command_and_pid;
    pyenv_3_11(Build::host("pyenv-3.11", pythons().remove(1).1)): exact_by_command_and_pid;
    pyenv_3_12(Build::host("pyenv-3.12", script_output(&["pyenv-3.12"]))): exact_by_command_and_pid;
    pyenv_3_13(Build::host("pyenv-3.13", script_output(&["pyenv-3.13"]))): exact_by_command_and_pid;
    // A stripped PIE libpython: its opcode table is found through its
    // relocations, so 3.13's inlined __init__ is counted there too.
    pyenv_3_13_stripped_shared_library(Build::stripped_pyenv_313()): exact_by_command_and_pid;
    bullseye_3_9(Build::chroot("bullseye-3.9", "root-3.9", "/usr/bin/python3.9")): exact_by_command_and_pid;
    trixie_3_13_5(Build::chroot("trixie-3.13", "root-trixie", "/usr/bin/python3.13")): exact_by_command_and_pid;
    // Debian 13's stripped shared libpython3.13 (a PIE), as a program that
    // embeds the interpreter runs it; started by pytrace, its library is
    // found in the chroot's own root.
    trixie_3_13_5_stripped_shared_library(Build::chroot("trixie-3.13-shared", "root-trixie", "/usr/local/bin/python3.13-shared")): exact_by_command_and_pid;
    sid_3_13(Build::chroot("sid-3.13", "root-sid", "/usr/bin/python3.13")): exact_by_command_and_pid;
    sid_3_14(Build::chroot("sid-3.14", "root-sid", "/usr/bin/python3.14")): exact_by_command_and_pid;
    sid_3_15(Build::chroot("sid-3.15", "root-sid", "/usr/bin/python3.15")): exact_by_command_and_pid;
}

/// Kernels before 6.13 get a uprobe and a uretprobe instead of a session
/// (forced here): the inlined __getitem__'s slot is closed by its caller's
/// return all the same.
#[test]
fn debian_3_11_2_without_uprobe_sessions() {
    let _machine = shared();
    let mut build = Build::host("debian-3.11-no-session", PathBuf::from("/usr/bin/python3.11"));
    build.env.push(("PYTRACE_NO_UPROBE_SESSION".into(), "1".into()));
    let truth = build.truth();
    check(&build, "--", &build.trace_command(), &truth);
}

