//! `pytrace imports` on a module tree made at test time.

mod common;

use common::*;

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
    let (_, debian) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let out = pytrace(&["imports", "--json", "-", "--", debian.to_str().unwrap(), &fixture("imports_tree.py"), dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_tree(&report);
    // Started by pytrace, everything it imports at start-up is seen too.
    let roots: Vec<&str> = report["imports"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert!(roots.contains(&"site"), "start-up imports: {roots:?}");
    assert_eq!(report["unfinished"], 0);
}

#[test]
fn the_import_tree_is_exact_when_attached_by_pid() {
    let (_, debian) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let target = start_waiting(&debian, "imports_tree.py", &[dir.path().to_str().unwrap()]);
    let json = dir.path().join("imports.json");
    let tracer = start_tracer(&["imports", "-p", &target.pid().to_string(), "--json", json.to_str().unwrap()]);
    signal(target.pid(), libc::SIGUSR1);
    let (code, table, stderr) = tracer.finish();
    assert_eq!(code, 0, "{stderr}");
    assert_tree(&read_json(&json));
    assert!(table.contains("pt_missing  (failed)"), "{table}");
}
