//! `pytrace imports` on a module tree made at test time, against the tree
//! `python -X importtime` prints for the same run: through the import USDT
//! probes (Debian's 3.11) and through the eval-function uprobe (every build
//! without probes: pyenv's 3.9 to 3.13, and Debian's 3.11 with --mode
//! uprobe), with and without uprobe sessions.

use crate::common::*;

/// (name, found, children) of an imports tree, for comparison.
fn shape(nodes: &serde_json::Value) -> Vec<(String, bool, Vec<String>)> {
    let mut out = Vec::new();
    for n in nodes.as_array().unwrap() {
        let children = n["children"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_string()).collect();
        out.push((n["name"].as_str().unwrap().to_string(), n["found"].as_bool().unwrap(), children));
        out.extend(shape(&n["children"]));
    }
    out
}

fn assert_tree(report: &serde_json::Value) {
    let mut nodes: Vec<_> = shape(&report["imports"]).into_iter().filter(|(n, _, _)| n.starts_with("pt_")).collect();
    nodes.sort();
    for (_, _, children) in nodes.iter_mut() {
        children.sort();
    }
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        nodes,
        vec![
            ("pt_a".into(), true, s(&["pt_c"])),
            ("pt_b".into(), true, s(&["pt_e"])), // pt_c was already loaded by pt_a
            ("pt_c".into(), true, s(&[])),
            ("pt_e".into(), true, s(&["pt_f", "pt_missing"])),
            ("pt_f".into(), true, s(&[])),
            ("pt_missing".into(), false, s(&[])),
            ("pt_top".into(), true, s(&["pt_a", "pt_b"])),
        ]
    );
    let top = report["imports"].as_array().unwrap().iter().find(|n| n["name"] == "pt_top").expect("pt_top is a root");
    let children: u64 = top["children"].as_array().unwrap().iter().map(|c| c["cumulative_ns"].as_u64().unwrap()).sum();
    assert_eq!(top["self_ns"].as_u64().unwrap() + children, top["cumulative_ns"].as_u64().unwrap());
}

#[test]
fn the_import_tree_is_exact_when_pytrace_starts_the_command() {
    let _machine = shared();
    let (_, debian) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let out = pytrace(&["imports", "--json", "-", "--", debian.to_str().unwrap(), &fixture("imports_tree.py"), dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = parse_report(&out.stdout);
    assert_tree(&report);
    // Started by pytrace, everything it imports at start-up is seen too.
    let roots: Vec<&str> = report["imports"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert!(roots.contains(&"site"), "start-up imports: {roots:?}");
    assert_eq!(report["unfinished"], 0);
}

#[test]
fn the_import_tree_is_exact_when_attached_by_pid() {
    let _machine = shared();
    let (_, debian) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let target = start_waiting(&debian, "imports_tree.py", &[dir.path().to_str().unwrap()]);
    let json = dir.path().join("imports.json");
    let tracer = start_tracer(&["imports", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    signal(target.pid(), libc::SIGUSR1);
    let (code, table, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    assert_tree(&read_report(&json));
    assert!(table.contains("pt_missing  (failed)"), "{table}");
}

/// Each build, and how pytrace is asked to see its imports.
fn builds() -> Vec<(String, std::path::PathBuf, &'static [&'static str])> {
    let debian = pythons().remove(0).1;
    let mut builds: Vec<(String, std::path::PathBuf, &[&str])> =
        (9..=13).map(|minor| (format!("pyenv 3.{minor}"), pyenv_python(minor), &[][..])).collect();
    builds.push(("debian 3.11 usdt".into(), debian.clone(), &["--mode", "usdt"][..]));
    builds.push(("debian 3.11 uprobe".into(), debian, &["--mode", "uprobe"][..]));
    builds.into_iter().filter(|b| wanted(&b.0)).collect()
}

/// Started by pytrace, everything the interpreter imports (start-up, site,
/// the fixture's tree) is seen: the whole tree equals -X importtime's for
/// the same program.
#[test]
fn the_whole_tree_equals_importtime_when_pytrace_starts_the_command() {
    let _machine = shared();
    for (label, python, mode) in builds() {
        let dir = tempfile::tempdir().unwrap();
        let truth = std::process::Command::new(&python)
            .args(["-X", "importtime", &fixture("imports_tree.py"), dir.path().to_str().unwrap()])
            .output()
            .unwrap();
        assert!(truth.status.success(), "{label}: {}", String::from_utf8_lossy(&truth.stderr));
        let want = importtime_paths(&String::from_utf8_lossy(&truth.stderr));
        assert!(want.iter().any(|p| p.last().is_some_and(|m| m == "pt_missing")), "{label}: {want:?}");

        let dir = tempfile::tempdir().unwrap();
        let out = pytrace(&[&["imports", "--json", "-"], mode, &["--", python.to_str().unwrap(), &fixture("imports_tree.py"), dir.path().to_str().unwrap()]].concat());
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = parse_report(&out.stdout);
        assert_eq!(report_import_paths(&report["imports"]), want, "{label}");
        assert_eq!((report["unfinished"].as_u64(), report["lost_events"].as_u64()), (Some(0), Some(0)), "{label}");
        assert_tree(&report);
    }
}

/// Attached by PID to a process already running (and holding its eval
/// loop), on every build and way.
#[test]
fn the_tree_is_exact_on_every_build_when_attached_by_pid() {
    let _machine = shared();
    for (label, python, mode) in builds() {
        let dir = tempfile::tempdir().unwrap();
        let target = start_waiting(&python, "imports_tree.py", &[dir.path().to_str().unwrap()]);
        let json = dir.path().join("imports.json");
        let tracer = start_tracer(&[&["imports", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()], mode].concat());
        let want_mode = if label.contains("usdt") { "usdt mode" } else { "uprobe mode" };
        assert!(tracer.stderr_head.contains(want_mode), "{label}: {}", tracer.stderr_head);
        signal(target.pid(), libc::SIGUSR1);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        assert_tree(&read_report(&json));
    }
}

/// Kernels before 6.13 (no uprobe sessions, forced here): a uprobe and a
/// uretprobe on every evaluation, imports' returns told apart by the stack
/// pointer. The same tree as -X importtime's.
#[test]
fn uprobe_mode_without_sessions_equals_importtime_too() {
    let _machine = shared();
    let python = pyenv_python(12);
    let dir = tempfile::tempdir().unwrap();
    let truth = std::process::Command::new(&python).args(["-X", "importtime", &fixture("imports_tree.py"), dir.path().to_str().unwrap()]).output().unwrap();
    let want = importtime_paths(&String::from_utf8_lossy(&truth.stderr));
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(PYTRACE)
        .args(["imports", "--json", "-", "--", python.to_str().unwrap(), &fixture("imports_tree.py"), dir.path().to_str().unwrap()])
        .env("PYTRACE_NO_UPROBE_SESSION", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = parse_report(&out.stdout);
    assert_eq!(report_import_paths(&report["imports"]), want);
}

/// importlib.import_module imports through _find_and_load called from
/// Python, which -X importtime does not list: neither does pytrace, on 3.9
/// and 3.10 too, where every Python call enters the eval function.
#[test]
fn import_module_calls_are_left_out_like_importtime() {
    let _machine = shared();
    for minor in [9, 12] {
        let python = pyenv_python(minor);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pt_dynamic.py"), "import pt_dynamic_child\n").unwrap();
        std::fs::write(dir.path().join("pt_dynamic_child.py"), "").unwrap();
        let code = format!("import sys, importlib; sys.path.insert(0, {:?}); importlib.import_module('pt_dynamic')", dir.path().to_str().unwrap());
        let truth = std::process::Command::new(&python).args(["-X", "importtime", "-c", &code]).output().unwrap();
        let want = importtime_paths(&String::from_utf8_lossy(&truth.stderr));
        assert!(want.contains(&vec!["pt_dynamic_child".to_string()]), "3.{minor}: the child is imported by an import statement: {want:?}");
        let out = pytrace(&["imports", "--json", "-", "--", python.to_str().unwrap(), "-c", &code]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = parse_report(&out.stdout);
        assert_eq!(report_import_paths(&report["imports"]), want, "3.{minor}");
    }
}
