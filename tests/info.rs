//! `pytrace info` on this machine's two CPython 3.11 builds.

mod common;

use common::*;

fn info_json(args: &[&str]) -> serde_json::Value {
    let out = pytrace(&[&["info", "--json", "-"], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn finds_probes_and_mode_for_each_build() {
    for (label, python) in pythons() {
        let on_disk = info_json(&["--binary", python.to_str().unwrap()]);
        let target = start_waiting(&python, "callgraph.py", &["--rounds", "1"]);
        let live = info_json(&["-p", &target.pid().to_string()]);
        for v in [&on_disk, &live] {
            assert!(v["version"].as_str().unwrap().starts_with("3.11."), "{label}: {v}");
            assert_eq!(v["calls_mode"], "uprobe", "{label}");
            assert_eq!(v["eval_frame_hook"], true, "{label}");
        }
        assert_eq!(live["eval_frame_now"], "not set");
        let probes: Vec<&str> = live["usdt_probes"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        match label {
            // Debian builds --with-dtrace, into the executable.
            "debian" => {
                assert_eq!(live["shared_library"], false);
                for p in ["python:function__entry", "python:function__return", "python:gc__start", "python:import__find__load__start"] {
                    assert!(probes.contains(&p), "{label}: {p} missing from {probes:?}");
                }
                assert_eq!(live["function_probes"], "entry probe misses inlined calls (3.11)");
                assert!(live["gc_mode"].as_str().unwrap().starts_with("usdt"), "{live}");
                assert!(live["imports_mode"].as_str().unwrap().starts_with("usdt"), "{live}");
            }
            // pyenv (or scripts/pythons.sh) builds without probes, with a
            // shared libpython.
            _ => {
                assert_eq!(live["shared_library"], true);
                assert!(live["interpreter"].as_str().unwrap().contains("libpython3.11.so"));
                assert!(probes.is_empty(), "{probes:?}");
                assert_eq!(live["function_probes"], "missing");
                assert!(live["gc_mode"].as_str().unwrap().starts_with("watchpoint"), "{live}");
                assert!(live["imports_mode"].as_str().unwrap().starts_with("uprobe"), "{live}");
            }
        }
    }
}

#[test]
fn table_output_names_the_mode() {
    let (_, python) = pythons().remove(0);
    let out = pytrace(&["info", "--binary", python.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("calls mode:      uprobe"), "{text}");
    assert!(text.contains("python:          3.11."), "{text}");
}
