//! `pytrace info` on this machine's two CPython 3.11 builds, and what it
//! says of the running kernel.

use crate::common::*;

fn info_json(args: &[&str]) -> serde_json::Value {
    let out = pytrace(&[&["info", "--json", "-"], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    parse_report(&out.stdout)
}

#[test]
fn finds_probes_and_mode_for_each_build() {
    let _machine = shared();
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
                // Stripped: gil's sites by code search (gil_sites.rs's tests check the addresses).
                assert!(live["gil_mode"].as_str().unwrap().contains("found by code search (take_gil at 0x"), "{live}");
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
                assert!(live["gil_mode"].as_str().unwrap().ends_with(", by symbol)"), "{live}");
            }
        }
    }
}

#[test]
fn table_output_names_the_mode() {
    let _machine = shared();
    let (_, python) = pythons().remove(0);
    let out = pytrace(&["info", "--binary", python.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("calls mode:      uprobe"), "{text}");
    assert!(text.contains("python:          3.11."), "{text}");
}

/// The mainline release each kernel feature pytrace looks for arrived in
/// (from the kernel's own history, independent of how pytrace detects
/// them: it reads the kernel's BTF).
const FEATURES_SINCE: [(&str, (u32, u32)); 9] = [
    ("ringbuf", (5, 8)),
    ("atomic_compare_exchange", (5, 12)),
    ("attach_cookie", (5, 15)),
    ("task_pt_regs", (5, 15)),
    ("bpf_loop", (5, 17)),
    ("copy_from_user_task", (5, 18)),
    ("uprobe_multi", (6, 6)),
    ("uprobe_session", (6, 13)),
    // A fix (46ba0e49b642), taken from the release: no enum names it.
    ("uprobe_multi_by_process", (6, 10)),
];

/// This kernel's release, as major and minor.
pub(crate) fn running_kernel() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

// Debian's kernels are mainline releases with fixes: each has exactly the
// features of its release. (Run on every kernel of scripts/kernels.sh.)
#[test]
fn kernel_features_are_those_of_its_release() {
    let _machine = shared();
    let (major, minor) = running_kernel();
    let v = info_json(&[]);
    let kernel = &v["kernel"];
    assert_eq!(kernel["version"], format!("{major}.{minor}"), "{v}");
    assert_eq!(kernel["btf"], true, "{v}");
    for (name, since) in FEATURES_SINCE {
        assert_eq!(kernel["features"][name], (major, minor) >= since, "{name} on {major}.{minor}: {v}");
    }
    let limits: Vec<&str> = kernel["limits"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    let idle = format!("sample --idle needs Linux 5.18 or newer (bpf_copy_from_user_task); this kernel is {major}.{minor}");
    assert_eq!(limits.contains(&idle.as_str()), (major, minor) < (5, 18), "{limits:?}");
    // The same through a target's findings, and as text.
    let (_, python) = pythons().remove(0);
    assert_eq!(info_json(&["--binary", python.to_str().unwrap()])["kernel"], *kernel);
    let text = String::from_utf8(pytrace(&["info"]).stdout).unwrap();
    assert!(text.starts_with(&format!("kernel:          Linux {major}.{minor} (")), "{text}");
}

// Where the kernel lacks what a feature needs, the feature says so in one
// sentence before anything starts; where it has it, the feature works.
#[test]
fn sample_idle_needs_5_18_and_says_so() {
    let _machine = shared();
    let (major, minor) = running_kernel();
    let (label, python) = pythons().remove(0);
    let marker = std::env::temp_dir().join(format!("pytrace-idle-started-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let out = pytrace(&["sample", "--idle", "-r", "49", "--", python.to_str().unwrap(), "-c", &format!("open({:?}, 'w'); import time; time.sleep(0.5)", marker.to_str().unwrap())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if (major, minor) < (5, 18) {
        assert_eq!(out.status.code(), Some(1), "{label}: {stderr}");
        assert_eq!(stderr.trim(), format!("pytrace: sample --idle needs Linux 5.18 or newer (bpf_copy_from_user_task); this kernel is {major}.{minor}"));
        assert!(!marker.exists(), "the command was started");
    } else {
        assert!(out.status.success(), "{label}: {stderr}");
        assert!(marker.exists(), "the command did not run");
    }
    let _ = std::fs::remove_file(&marker);
}

// Debian's 3.11.2 runs some __getitem__ calls inline; calls counts them
// with a probe that learns its register from the uprobe's cookie (5.15).
// Before that the caveat says the counts are lower bounds, and why.
#[test]
fn inlined_getitem_caveat_names_the_release_cookies_need() {
    let _machine = shared();
    let (major, minor) = running_kernel();
    let (_, python) = pythons().remove(0);
    let v = info_json(&["--binary", python.to_str().unwrap()]);
    let caveats: Vec<&str> = v["calls_caveats"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let getitem = caveats.iter().find(|c| c.contains("BINARY_SUBSCR_GETITEM")).unwrap_or_else(|| panic!("{caveats:?}"));
    if (major, minor) < (5, 15) {
        assert!(getitem.contains(&format!("counting them needs Linux 5.15 or newer (bpf_get_attach_cookie); this kernel is {major}.{minor}: __getitem__ counts are lower bounds")), "{getitem}");
    } else {
        assert!(getitem.contains("those calls are counted where the instruction starts them"), "{getitem}");
    }
}

/// `info` runs without root, so it is where a user learns that tracing
/// needs it: as `nobody` it says so; as root it does not.
#[test]
fn info_says_when_tracing_would_need_root() {
    let _machine = shared();
    let out = std::process::Command::new("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", PYTRACE, "info"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("privileges:      tracing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE)"), "{table}");
    let json = std::process::Command::new("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", PYTRACE, "info", "--json", "-"]).output().unwrap();
    let v: serde_json::Value = parse_report(&json.stdout);
    assert!(v["kernel"]["privileges"].as_str().is_some_and(|p| p.starts_with("tracing needs root")), "{v}");
    let as_root = pytrace(&["info"]);
    assert!(!String::from_utf8_lossy(&as_root.stdout).contains("privileges:"), "root can trace");
}
