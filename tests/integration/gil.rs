//! `pytrace gil` against what each thread of fixtures/gil_threads.py
//! measures of itself: its CPU time (time.thread_time), its wall time, its
//! sleeps, and the kernel's schedstat (time on CPU, time runnable waiting
//! for a CPU). On every build with take_gil and drop_gil in its symbol
//! table that the tests have (pyenv's 3.10, 3.12, 3.13 and the 3.11 without
//! probes), and on Debian's stripped builds, whose probe sites are found by
//! code search (this machine's 3.11, bullseye's 3.9, sid's 3.13 to 3.15); a
//! copy of Debian's 3.11 patched so that the code search's two sources
//! disagree, and the free-threaded 3.13t, get their one sentence and a
//! non-zero exit.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use crate::common::matrix::Interpreter;
use crate::common::*;

const MS: f64 = 1e6;

fn pyenv(version: &str) -> PathBuf {
    let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg(format!("pyenv-{version}")).output().unwrap();
    assert!(out.status.success(), "scripts/pythons.sh pyenv-{version}: {}", String::from_utf8_lossy(&out.stderr));
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(path.exists(), "{}", path.display());
    path
}

/// The 3.11 without probes (pyenv's): taken whatever PYTRACE_TEST_PYTHONS
/// keeps, since Debian's stripped 3.11 names no take_gil for gil to probe.
fn nodtrace_311() -> PathBuf {
    let path = match std::env::var_os("PYTRACE_NODTRACE_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => {
            let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg("nodtrace-3.11").output().unwrap();
            assert!(out.status.success(), "scripts/pythons.sh nodtrace-3.11: {}", String::from_utf8_lossy(&out.stderr));
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        }
    };
    assert!(path.exists(), "{}", path.display());
    path
}

/// Where the fixture runs: a CPython on this machine, or one of Debian's
/// in its root (chroot), with /proc mounted there in a mount namespace of
/// its own (the fixture reads its threads' schedstat), unseen by other
/// tests sharing the root.
enum Place {
    Host(PathBuf),
    Root(Interpreter),
}

impl Place {
    /// The command that runs the fixture, and its truth file as the
    /// target and as the test see it.
    fn fixture_argv(&self, dir: &std::path::Path, spin_seconds: &str) -> (Vec<String>, PathBuf) {
        match self {
            Place::Host(python) => {
                let truth = dir.join("truth.json");
                (vec![python.to_string_lossy().into_owned(), fixture("gil_threads.py"), truth.to_string_lossy().into_owned(), spin_seconds.into()], truth)
            }
            Place::Root(py) => {
                let (inside, truth) = py.output("truth.json");
                // chroot ROOT PYTHON SCRIPT ARGS: ROOT is $1 of the shell.
                let chrooted = py.argv("gil_threads.py", &[&inside, spin_seconds]);
                let mount = r#"mount --bind /proc "$2/proc" && exec "$@""#;
                let argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh"].iter().map(|s| s.to_string()).chain(chrooted).collect();
                (argv, truth)
            }
        }
    }
}

/// Runs the fixture under `pytrace gil -- ...`; returns the report and
/// the fixture's own measurements, by TID.
fn traced_fixture(place: &Place, spin_seconds: &str) -> (serde_json::Value, HashMap<u32, serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("gil.json");
    let (argv, truth_path) = place.fixture_argv(dir.path(), spin_seconds);
    let mut args = vec!["gil", "--json", report_path.to_str().unwrap(), "--"];
    args.extend(argv.iter().map(String::as_str));
    let out = pytrace(&args);
    assert!(out.status.success(), "pytrace gil: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    // Also: no hand-over the probes missed (takes_unseen, drops_unseen).
    assert!(table.contains("dropped: nothing"), "{table}");
    let report = read_report(&report_path);
    let truth: HashMap<String, serde_json::Value> = serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    (report, truth.into_iter().map(|(tid, v)| (tid.parse().unwrap(), v)).collect())
}

fn ns(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}")) as f64
}

/// Every bound below holds on a loaded machine: a thread descheduled while
/// it holds the GIL holds it longer than its CPU time, and a thread woken
/// to take the GIL may wait for a CPU too, so each truth is an interval.
fn assert_matches_the_threads_own_measures(version: &str, place: &Place, mode: &str) {
    let (report, truth) = traced_fixture(place, &longer(0.4));
    let label = format!("Python {version}");
    assert_eq!(report["kind"], "gil", "{label}");
    assert_eq!(report["python"]["mode"], mode, "{label}: {}", report["python"]);
    assert_eq!(report["lost_events"], 0, "{label}");
    let threads: HashMap<u32, &serde_json::Value> = report["threads"].as_array().unwrap().iter().map(|t| (t["tid"].as_u64().unwrap() as u32, t)).collect();
    // One GIL: no two threads hold it at once.
    let window = ns(&report, "duration_ns");
    let held_sum: f64 = threads.values().map(|t| ns(t, "held_ns")).sum();
    assert!(held_sum <= window * 1.001 + MS, "{label}: threads held the GIL {held_sum} ns in all, over a {window} ns session");
    assert_eq!(truth.len(), 4, "{label}: {truth:?}");
    for (tid, own) in &truth {
        let function = own["function"].as_str().unwrap();
        let t = threads.get(tid).unwrap_or_else(|| panic!("{label}: no row for thread {tid} ({function}): {report}"));
        let who = format!("{label}, {function} (TID {tid}): {t} against its own {own}");
        let (held, wait, released, life) = (ns(t, "held_ns"), ns(t, "wait_ns"), ns(t, "released_ns"), ns(t, "lifetime_ns"));
        let (wall, cpu, on_cpu, runnable) = (ns(own, "wall_ns"), ns(own, "cpu_ns"), ns(own, "on_cpu_ns"), ns(own, "runnable_ns"));
        // Every nanosecond of the thread's life is in exactly one state...
        assert!((held + wait + released - life).abs() <= 0.001 * life + 0.1 * MS, "{who}: the states do not add up to its life");
        // ...and its life covers what it measured, and lies within the
        // start call and the join that saw it end (which on a loaded machine
        // can be far apart from the span it measured: a starting thread
        // waits for the GIL and a CPU first), plus its last steps after join
        // returned.
        assert!(life >= wall && life <= ns(own, "spawned_to_joined_ns") + 100.0 * MS, "{who}: lifetime");
        assert!(t["exited"] == true, "{who}");
        // Every thread has ended by the time the command has: named from
        // what was read while it ran, not by the kernel's name.
        assert_eq!(t["name"], function, "{who}: named by threading.Thread.name");
        assert!(t["acquisitions"].as_u64().unwrap() >= 1, "{who}");
        let max = ns(&t["wait"], "max_ns");
        assert!(ns(&t["wait"], "p50_ns") <= ns(&t["wait"], "p99_ns") && ns(&t["wait"], "p99_ns") <= max && max <= wait, "{who}: wait distribution");
        match function {
            "spin_a" | "spin_b" => {
                // Pure Python runs only with the GIL: the stretches of its
                // loop the spinner measured as holding it throughout (its
                // wall time between clock reads with no hand-over in or next
                // to them, the fixture's held_through_ns) are held time,
                // never waiting. Wall time, not CPU time: in a kernel VM a
                // thread's CPU time also counts what the host took from the
                // virtual CPU (0.9 to 2.6 ms a hand-over measured on 5.10),
                // while a stretch's wall time and pytrace's held time count
                // it alike. The margin is the loop's start and end, and a
                // hand-over to a thread that leaves no name (the main
                // thread's, starting the others) shorter than the fixture's
                // HAND_OVER_GAP.
                let through = ns(own, "held_through_ns");
                // Found 95 % of its CPU time on the host, 36 to 46 % in VMs on a
                // busy host (not yet explained: neither its hand-overs nor
                // steal, which the window cancels, account for the rest).
                assert!(through >= 0.25 * cpu, "{who}: the fixture found too few stretches without a hand-over");
                assert!(held >= 0.999 * through - 5.0 * MS, "{who}: held less than the stretches it surely held the GIL");
                // It never lets go but to hand the GIL over, and asks again at once.
                assert!(released <= 0.05 * life + 20.0 * MS, "{who}: released");
                // Off CPU and not runnable, a spinner sleeps only on the GIL;
                // it cannot wait while it surely holds it.
                let sleeping = wall - on_cpu - runnable;
                assert!(wait >= sleeping - 0.05 * wall - 10.0 * MS, "{who}: waited less than it slept on the GIL ({sleeping} ns)");
                assert!(wait <= life - 0.999 * through + 5.0 * MS, "{who}: waited while it surely held the GIL");
                assert!(t["switches"].as_u64().unwrap() >= 2, "{who}: two spinners hand the GIL over");
            }
            "sleeper" => {
                let slept = ns(own, "slept_ns");
                // Ten waits of 50 ms, each timed from when the GIL was let go,
                // release it for at least 500 ms; the waits it timed are that,
                // the hand-overs inside drop_gil before them and taking the GIL back.
                assert!(released >= 500.0 * MS, "{who}: released");
                assert!(released + wait >= slept - 5.0 * MS, "{who}: its sleeps ({slept} ns) are released time or the wait to take the GIL back");
                assert!(t["acquisitions"].as_u64().unwrap() >= 10, "{who}: one acquisition per sleep at least");
            }
            "hasher" => {
                // CPU time not spent holding the GIL was spent released,
                // but for the CPU a waiting thread uses in take_gil to wake
                // and look at the GIL (counted as waiting): 2 % of it, for
                // an emulated VM's costlier wake-ups (a 6.1 VM under host
                // load came 1 ms short of a flat 5 ms).
                assert!(released >= cpu - held - 5.0 * MS - 0.02 * cpu, "{who}: hashing released the GIL");
                assert!(released >= 0.3 * cpu, "{who}: most of its CPU time is hashing, without the GIL");
                // Inside its hash calls it holds the GIL only for a few
                // microseconds a call, before letting go and after taking
                // it back (2 % of its life covers hundreds of calls even
                // emulated): it holds it in the rest of its life or not at all.
                let hashing = ns(own, "hashing_ns");
                assert!(held <= life - hashing + 5.0 * MS + 0.02 * life, "{who}: held the GIL while it was hashing ({hashing} ns)");
            }
            other => panic!("{label}: unexpected thread {other}"),
        }
    }
    assert_functions_and_blame(&label, &report, &truth, &threads);
}

/// Each spinner's function is where its thread waited and held, and the
/// other spinner's function is what it mostly waited for.
fn assert_functions_and_blame(label: &str, report: &serde_json::Value, truth: &HashMap<u32, serde_json::Value>, threads: &HashMap<u32, &serde_json::Value>) {
    let functions = report["functions"].as_array().unwrap();
    let function = |name: &str| {
        functions
            .iter()
            .find(|f| f["name"] == name && f["file"].as_str().unwrap().ends_with("gil_threads.py"))
            .unwrap_or_else(|| panic!("{label}: no function {name} in {report}"))
    };
    // The fixture's own measures of the thread that ran `name`, and its row.
    let own_of = |name: &str| truth.iter().find(|(_, own)| own["function"] == name).unwrap();
    let thread_of = |name: &str| {
        let tid = own_of(name).0;
        threads[tid]
    };
    let blamed = |f: &serde_json::Value, holder: &str| f["blocked_by"].as_array().unwrap().iter().filter(|b| b["name"] == holder).map(|b| b["ns"].as_u64().unwrap()).sum::<u64>() as f64;
    for f in functions {
        let blocked: f64 = f["blocked_by"].as_array().unwrap().iter().map(|b| ns(b, "ns")).sum();
        assert!((blocked - ns(f, "wait_ns")).abs() <= 1.0, "{label}: the blame of {f} adds up to its wait");
    }
    for (me, other) in [("spin_a", "spin_b"), ("spin_b", "spin_a")] {
        let (f, t) = (function(me), thread_of(me));
        let who = format!("{label}: function {me}: {f} of thread {t}; every thread: {threads:?}; their own measures: {truth:?}");
        // Only its own thread runs it, and its thread waited elsewhere only
        // outside the span it measured (a starting thread waits for the GIL
        // first: 0.65 s in a 6.1 VM) or, inside it, in the fixture's
        // measuring code (schedstat's reads, the wrapper), whoever's thread.
        let own = own_of(me).1;
        let outside = ns(t, "lifetime_ns") - ns(own, "wall_ns");
        // (Not the workers' code, nor <module>, which the main thread runs.)
        let workers = ["spin_a", "spin_b", "sleeper", "hasher", "<module>"];
        let in_measuring: f64 = functions
            .iter()
            .filter(|g| g["file"].as_str().unwrap().ends_with("gil_threads.py") && !workers.contains(&g["name"].as_str().unwrap()))
            .map(|g| ns(g, "wait_ns"))
            .sum();
        assert!(ns(f, "wait_ns") <= ns(t, "wait_ns") + 1.0, "{who}: wait");
        assert!(ns(f, "wait_ns") >= ns(t, "wait_ns") - outside - in_measuring - 5.0 * MS, "{who}: waited outside it ({outside} ns outside its measured span, {in_measuring} ns in the fixture's measuring code)");
        assert!(ns(f, "held_ns") <= ns(t, "held_ns") + 1.0 && ns(f, "held_ns") >= 0.5 * ns(t, "held_ns"), "{who}: held");
        // The hasher is blamed only for what it held between its hash
        // calls, which its own clock bounds (the thread checks above). It
        // holds the GIL there for microseconds at a time, but a holder the
        // scheduler puts off its CPU holds it on: in a 6.12 VM the hasher
        // was blamed for 2.4 s of one 2.5 s wait of spin_a. So the
        // spinners' fight is told apart from the hasher's blame: of the
        // other holders, the other spinner blocked it most (a tie counts),
        // for no longer than it held, and for 30 % of the wait the hasher
        // is not blamed for at least.
        let hasher_own = own_of("hasher").1;
        let outside_hashing = ns(thread_of("hasher"), "lifetime_ns") - ns(hasher_own, "hashing_ns");
        assert!(blamed(f, "hasher") <= ns(function("hasher"), "held_ns") + 1.0, "{who}: blamed the hasher for more than it held");
        assert!(blamed(f, "hasher") <= outside_hashing + 5.0 * MS + 0.02 * ns(thread_of("hasher"), "lifetime_ns"), "{who}: blamed the hasher while it was hashing (out of its hash calls for {outside_hashing} ns)");
        let most = f["blocked_by"].as_array().unwrap().iter().filter(|b| b["name"] != "(no holder: hand-over)" && b["name"] != "hasher").map(|b| ns(b, "ns")).fold(0.0, f64::max);
        assert!(blamed(f, other) >= 0.95 * most, "{who}: blocked by");
        assert!(blamed(f, other) <= ns(function(other), "held_ns") + 1.0, "{who}: blamed {other} for more than it held");
        assert!(blamed(f, other) >= 0.3 * (ns(f, "wait_ns") - blamed(f, "hasher")), "{who}: {other}'s share");
    }
    // The hasher waits for the spinners, between hashes.
    let hasher = function("hasher");
    assert!(ns(hasher, "wait_ns") <= ns(thread_of("hasher"), "wait_ns") + 1.0, "{label}: {hasher}");
    assert!(blamed(hasher, "spin_a") + blamed(hasher, "spin_b") >= 0.3 * ns(hasher, "wait_ns"), "{label}: {hasher}");
}

/// The report's mode on a build with symbols, and on a stripped one
/// (every one here has an out-of-line drop_gil the search agrees on).
const BY_SYMBOL: &str = "uprobes on take_gil and drop_gil";
const BY_CODE_SEARCH: &str = "uprobes on take_gil, drop_gil and the GIL's condition variable, found by code search";

/// One build of the GIL tests: its version, where the fixture runs, and the
/// mode the report must name for it.
struct Build {
    version: &'static str,
    place: Place,
    mode: &'static str,
}

fn build(version: &'static str, place: Place, mode: &'static str) -> Build {
    Build { version, place, mode }
}

fn threads_own_measures(build: Build) {
    assert_matches_the_threads_own_measures(build.version, &build.place, build.mode);
}

// Debian's builds are stripped: their sites are found by code search.
over_builds! {
    pyenv_3_10(build("3.10", Place::Host(pyenv("3.10")), BY_SYMBOL)): threads_own_measures;
    nodtrace_3_11(build("3.11", Place::Host(nodtrace_311()), BY_SYMBOL)): threads_own_measures;
    pyenv_3_12(build("3.12", Place::Host(pyenv("3.12")), BY_SYMBOL)): threads_own_measures, attached_by_pid_threads_already_running_are_split_over_the_whole_session;
    pyenv_3_13(build("3.13", Place::Host(pyenv("3.13")), BY_SYMBOL)): threads_own_measures;
    stripped_debian_3_11(build("3.11", Place::Host(PathBuf::from("/usr/bin/python3.11")), BY_CODE_SEARCH)): threads_own_measures, attached_by_pid_threads_already_running_are_split_over_the_whole_session;
    stripped_debian_3_9(build("3.9", Place::Root(Interpreter::debian("3.9")), BY_CODE_SEARCH)): threads_own_measures;
    stripped_debian_3_13(build("3.13", Place::Root(Interpreter::debian("3.13")), BY_CODE_SEARCH)): threads_own_measures;
    stripped_debian_3_14(build("3.14", Place::Root(Interpreter::debian("3.14")), BY_CODE_SEARCH)): threads_own_measures;
    stripped_debian_3_15(build("3.15", Place::Root(Interpreter::debian("3.15")), BY_CODE_SEARCH)): threads_own_measures;
}

fn refused(args: &[&str]) -> String {
    let out = pytrace(args);
    assert!(!out.status.success(), "pytrace {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn a_free_threaded_build_has_no_gil_to_measure() {
    let _machine = shared();
    let python = std::env::var_os("PYTRACE_FREETHREADED_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let out = Command::new(format!("{}/scripts/pythons.sh", env!("CARGO_MANIFEST_DIR"))).arg("freethreaded").output().ok()?;
            Some(PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()))
        })
        .filter(|p| p.exists())
        .expect("no free-threaded CPython: run scripts/pythons.sh freethreaded");
    let err = refused(&["gil", "--", python.to_str().unwrap(), "-c", "pass"]);
    assert!(err.contains("free-threaded build: it has no GIL"), "{err}");
    // By PID too, and the target keeps running.
    let target = start_waiting(&python, "callgraph.py", &["--rounds", "1"]);
    let err = refused(&["gil", "-p", &target.pid().to_string()]);
    assert!(err.contains("free-threaded build: it has no GIL"), "{err}");
    assert!(std::path::Path::new(&format!("/proc/{}", target.pid())).exists());
}

/// A copy of Debian's stripped 3.11 whose PyEval_AcquireLock tail-jumps 16
/// bytes past take_gil (the interpreter still runs: nothing calls that
/// deprecated function): its two callers no longer agree on take_gil, so
/// gil probes nothing, launched or by PID, and the target runs on.
#[test]
fn a_stripped_build_whose_callers_disagree_gets_no_probe() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let patched = dir.path().join("python3.11");
    let mut bytes = std::fs::read("/usr/bin/python3.11").unwrap();
    let (restore_calls, at) = {
        let elf = goblin::elf::Elf::parse(&bytes).unwrap();
        let function = |name: &str| elf.dynsyms.iter().find(|s| elf.dynstrtab.get_at(s.st_name) == Some(name)).map(|s| (s.st_value, s.st_size)).unwrap();
        let file_offset = |vaddr: u64| {
            let ph = elf.program_headers.iter().find(|ph| ph.p_type == goblin::elf::program_header::PT_LOAD && vaddr >= ph.p_vaddr && vaddr < ph.p_vaddr + ph.p_filesz).unwrap();
            (vaddr - ph.p_vaddr + ph.p_offset) as usize
        };
        let decode = |(address, size): (u64, u64)| {
            let code = &bytes[file_offset(address)..file_offset(address) + size as usize];
            iced_x86::Decoder::with_ip(64, code, address, iced_x86::DecoderOptions::NONE).into_iter().collect::<Vec<_>>()
        };
        let calls: Vec<u64> = decode(function("PyEval_RestoreThread")).iter().filter(|i| i.mnemonic() == iced_x86::Mnemonic::Call).map(|i| i.near_branch_target()).collect();
        let jump = decode(function("PyEval_AcquireLock")).into_iter().find(|i| i.mnemonic() == iced_x86::Mnemonic::Jmp && i.len() == 5 && calls.contains(&i.near_branch_target())).expect("PyEval_AcquireLock's tail jump to take_gil");
        (calls, file_offset(jump.ip()) + 1)
    };
    assert_eq!(restore_calls.len(), 1, "PyEval_RestoreThread calls take_gil alone");
    let displacement = i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) + 16;
    bytes[at..at + 4].copy_from_slice(&displacement.to_le_bytes());
    std::fs::write(&patched, &bytes).unwrap();
    std::fs::set_permissions(&patched, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let info = pytrace(&["info", "--binary", patched.to_str().unwrap()]);
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("gil mode:        unavailable:") && info.contains("do not agree"), "{info}");
    let ran = dir.path().join("ran");
    let err = refused(&["gil", "--", patched.to_str().unwrap(), "-c", &format!("open({:?}, 'w')", ran.to_str().unwrap())]);
    assert!(err.contains("PyEval_RestoreThread") && err.contains("do not agree on one function that would be take_gil") && err.contains("probes nothing rather than guess"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    assert!(!ran.exists(), "a command gil cannot measure never runs");
    let target = start_waiting(&patched, "callgraph.py", &["--rounds", "1"]);
    let err = refused(&["gil", "-p", &target.pid().to_string()]);
    assert!(err.contains("do not agree"), "{err}");
    assert!(std::path::Path::new(&format!("/proc/{}", target.pid())).exists(), "the target runs on");
}

/// Attached by PID to threads already running: each one's state before its
/// first event in the session is inferred from that event, so every thread
/// alive throughout has the whole session as its life, split exactly; and
/// the target runs on to its normal end: with symbols, and on Debian's
/// stripped 3.11 through the code search's sites.
fn attached_by_pid_threads_already_running_are_split_over_the_whole_session(build: Build) {
    let Place::Host(python) = build.place else { panic!("Python {}: attached by PID on this machine's builds only", build.version) };
    let dir = tempfile::tempdir().unwrap();
    let truth_path = dir.path().join("truth.json");
    let mut target = Proc(Command::new(&python).arg(fixture("gil_threads.py")).arg(&truth_path).arg(longer(2.0)).spawn().unwrap());
    // The threads are running once the fixture has four more tasks.
    let tasks = || std::fs::read_dir(format!("/proc/{}/task", target.pid())).map(|d| d.count()).unwrap_or(0);
    let started = std::time::Instant::now();
    while tasks() < 5 {
        assert!(started.elapsed().as_secs() < 30, "the fixture's threads did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = pytrace(&["gil", "-p", &target.pid().to_string(), "-d", "1", "--json", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = parse_report(&out.stdout);
    assert_eq!(report["lost_events"], 0, "no hand-over the probes missed: {report}");
    let status = target.0.wait().unwrap();
    assert!(status.success(), "the target did not run on to its end: {status}");
    let truth: HashMap<String, serde_json::Value> = serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    let window = ns(&report, "duration_ns");
    assert!(window >= 1e9, "{report}");
    let held_sum: f64 = report["threads"].as_array().unwrap().iter().map(|t| ns(t, "held_ns")).sum();
    assert!(held_sum <= window * 1.001 + MS, "{report}");
    for (tid, own) in &truth {
        let function = own["function"].as_str().unwrap();
        if !function.starts_with("spin") {
            continue;
        }
        let t = report["threads"].as_array().unwrap().iter().find(|t| t["tid"].as_u64().map(|n| n.to_string()).as_deref() == Some(tid.as_str())).unwrap_or_else(|| panic!("no {function} in {report}"));
        let (held, wait, released, life) = (ns(t, "held_ns"), ns(t, "wait_ns"), ns(t, "released_ns"), ns(t, "lifetime_ns"));
        assert!((life - window).abs() <= 1.0, "{function}: alive throughout: {t}, session {window}");
        assert!((held + wait + released - life).abs() <= 0.001 * life, "{function}: {t}");
        assert!(released <= 0.05 * life + 20.0 * MS, "{function}: a spinner never lets go but to hand over: {t}");
        assert!(t["exited"] == false, "{t}");
        assert_eq!(t["name"], function, "named by threading.Thread.name, not the kernel's name: {t}");
    }
}
