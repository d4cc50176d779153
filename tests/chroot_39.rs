//! Every subcommand on Debian bullseye's CPython 3.9 (USDT probes, the
//! interpreter in the executable), run in a chroot: the target sees other
//! paths than pytrace does, as a Python in a container would. pytrace starts
//! it through `chroot` (one more exec to follow) or attaches by PID.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

struct Root {
    dir: PathBuf,
    /// The fixtures' directory, as seen inside the root.
    inside: String,
}

/// The root from scripts/pythons.sh, with this run's fixtures copied in.
fn root() -> Root {
    let dir = std::env::var_os("PYTRACE_ROOT_39").map(PathBuf::from).or_else(|| {
        let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg("root-3.9").output().ok()?;
        Some(PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()))
    });
    let dir = dir.filter(|d| d.join("usr/bin/python3.9").exists()).expect("no bullseye root: run scripts/pythons.sh root-3.9");
    // One directory per test: tests run in parallel and each removes its own.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let inside = format!("/pytrace-tests-{}-{n}", std::process::id());
    std::fs::create_dir_all(dir.join(&inside[1..])).unwrap();
    for entry in std::fs::read_dir(fixture("")).unwrap().flatten() {
        std::fs::copy(entry.path(), dir.join(&inside[1..]).join(entry.file_name())).unwrap();
    }
    Root { dir, inside }
}

impl Root {
    fn argv(&self, script: &str, args: &[&str]) -> Vec<String> {
        let mut v = vec!["chroot".into(), self.dir.to_string_lossy().into_owned(), "/usr/bin/python3.9".into(), format!("{}/{script}", self.inside)];
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    fn host(&self, inside_path: &str) -> PathBuf {
        self.dir.join(inside_path.trim_start_matches('/'))
    }

    fn run(&self, script: &str, args: &[&str]) {
        let argv = self.argv(script, args);
        assert!(Command::new(&argv[0]).args(&argv[1..]).status().unwrap().success(), "{argv:?}");
    }

    fn pytrace(&self, sub: &[&str], script: &str, args: &[&str]) -> std::process::Output {
        let argv = self.argv(script, args);
        let mut all: Vec<&str> = sub.to_vec();
        all.push("--");
        all.extend(argv.iter().map(String::as_str));
        let out = pytrace(&all);
        assert!(out.status.success(), "pytrace {all:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.dir.join(&self.inside[1..]));
    }
}

fn truth(path: &Path) -> Vec<(u64, String, u64)> {
    read_json(path)
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["line"].as_u64().unwrap(), r["name"].as_str().unwrap().to_string(), r["calls"].as_u64().unwrap()))
        .collect()
}

#[test]
fn calls_equal_cprofile_by_command_and_by_pid() {
    let root = root();
    let cp = format!("{}/cp.json", root.inside);
    root.run("callgraph.py", &["--rounds", "20", "--cprofile", &cp]);
    let want = truth(&root.host(&cp));

    let by_command: serde_json::Value = serde_json::from_slice(&root.pytrace(&["calls", "--json", "-"], "callgraph.py", &["--rounds", "20"]).stdout).unwrap();
    let argv = root.argv("callgraph.py", &["--rounds", "20", "--wait"]);
    let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn().unwrap());
    wait_for_line(&mut target, "ready");
    // The chroot process execs python3.9 in place: its PID is the target.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("calls.json");
    let tracer = start_tracer(&["calls", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    assert!(tracer.stderr_head.contains("Python 3.9.2, uprobe mode"), "{}", tracer.stderr_head);
    signal(target.pid(), libc::SIGUSR1);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    let by_pid = read_json(&json);

    for (how, report) in [("--", &by_command), ("-p", &by_pid)] {
        let rows = rows_for_file(report, "/callgraph.py");
        for (line, name, calls) in &want {
            let row = find_row(&rows, *line as u32, name).unwrap_or_else(|| panic!("{how}: no row for {name}"));
            assert_eq!(row["calls"].as_u64().unwrap(), *calls, "{how}: calls of {name} (line {line})");
        }
        assert_eq!(report["python"]["version"], "3.9.2");
    }
}

#[test]
fn gc_equals_gc_callbacks_by_pid() {
    let root = root();
    let truth_path = format!("{}/gc-truth.json", root.inside);
    let argv = root.argv("gc_cycles.py", &["--rounds", "60000", "--wait", "--truth", &truth_path]);
    let mut target = Proc(Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn().unwrap());
    wait_for_line(&mut target, "ready");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("gc.json");
    let tracer = start_tracer(&["gc", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    assert!(tracer.stderr_head.contains("usdt mode"), "{}", tracer.stderr_head);
    signal(target.pid(), libc::SIGUSR1);
    wait_for_line(&mut target, "done");
    signal(tracer.child.pid(), libc::SIGINT);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    let key = |v: &serde_json::Value| {
        v.as_array().unwrap().iter().map(|g| (g["generation"].as_u64(), g["collections"].as_u64(), g["collected"].as_i64())).collect::<Vec<_>>()
    };
    assert_eq!(key(&read_json(&json)["generations"]), key(&read_json(&root.host(&truth_path))));
}

#[test]
fn imports_tree_and_sampling_split() {
    let root = root();
    let modules = format!("{}/modules", root.inside);
    std::fs::create_dir_all(root.host(&modules)).unwrap();
    let out = root.pytrace(&["imports", "--json", "-"], "imports_tree.py", &[&modules]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let top = report["imports"].as_array().unwrap().iter().find(|n| n["name"] == "pt_top").expect("pt_top imported");
    let children: Vec<&str> = top["children"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(children.contains(&"pt_a") && children.contains(&"pt_b"), "{children:?}");

    let out = root.pytrace(&["sample", "-r", "999", "--json", "-"], "cpu_split.py", &["--seconds", "4"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let total = |name: &str| report["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total_samples"].as_u64().unwrap()).unwrap_or(0);
    let (a, b, c) = (total("sixty"), total("thirty"), total("ten"));
    let sum = (a + b + c) as f64;
    assert!(sum > 2500.0, "only {sum} samples");
    for (got, want) in [(a, 60.0), (b, 30.0), (c, 10.0)] {
        assert!((got as f64 / sum * 100.0 - want).abs() <= 2.0, "{got} of {sum} for {want}%");
    }
}

/// compare on 3.9 (no eval-frame hook: 3.9 inlines no calls): both sides
/// show the 60/30/10 split, and every round calls each function once.
#[test]
fn compare_sees_the_split_on_both_sides() {
    let root = root();
    let out = root.pytrace(&["compare", "-r", "999", "--json", "-"], "cpu_split.py", &["--seconds", "3"]);
    let cmp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cmp["python"]["version"], "3.9.2");
    let row = |name: &str| cmp["functions"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no {name}")).clone();
    let calls = row("sixty")["calls"].as_u64().unwrap();
    assert!(calls > 100 && row("thirty")["calls"] == calls && row("ten")["calls"] == calls, "{calls}");
    for field in ["corrected_total_share", "sampled_total_share"] {
        let shares: Vec<f64> = ["sixty", "thirty", "ten"].iter().map(|n| row(n)[field].as_f64().unwrap()).collect();
        let sum: f64 = shares.iter().sum();
        for (got, want) in shares.iter().zip([60.0, 30.0, 10.0]) {
            assert!((got / sum * 100.0 - want).abs() <= 3.0, "{field}: {got} of {sum} for {want}%");
        }
    }
}
