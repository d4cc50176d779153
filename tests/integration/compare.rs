//! `pytrace compare` on both local 3.11 builds: every number it prints is
//! recomputed here from the two reports it wrote (--traced-json and
//! --sampled-json), the known 60/30/10 CPU split shows on both sides, the
//! saved pair gives the same comparison, and the probes' cost is measured
//! and flagged where it dominates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use serde_json::Value;

/// The row name `compare` gives samples taken inside pytrace's probes.
const PROBES: &str = "[pytrace probes]";

struct Run {
    dir: tempfile::TempDir,
    stdout: String,
}

impl Run {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn json(&self, name: &str) -> Value {
        read_report(&self.path(name))
    }
}

fn output_args(dir: &Path) -> Vec<String> {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    vec!["--json".into(), p("cmp.json"), "--traced-json".into(), p("A.json"), "--sampled-json".into(), p("B.json")]
}

/// `pytrace compare -- python script args` at 999 Hz.
fn compare_command(label: &str, python: &Path, script: &str, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let mut argv: Vec<String> = vec!["compare".into(), "-r".into(), "999".into()];
    argv.extend(output_args(dir.path()));
    argv.extend(["--".into(), python.to_str().unwrap().into(), fixture(script)]);
    argv.extend(args.iter().map(|a| a.to_string()));
    let out = Command::new(PYTRACE).args(&argv).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{label}: pytrace compare failed: {stderr}");
    assert!(stderr.contains("uprobe and sample mode"), "{label}: {stderr}");
    Run { dir, stdout: String::from_utf8(out.stdout).unwrap() }
}

/// `pytrace compare -p PID` on a fixture waiting for SIGUSR1, until it exits.
fn compare_pid(label: &str, python: &Path, script: &str, args: &[&str]) -> Run {
    let target = start_waiting(python, script, args);
    let dir = tempfile::tempdir().unwrap();
    let pid = target.pid().to_string();
    let mut argv = vec!["compare".to_string(), "-p".into(), pid, "-r".into(), "999".into()];
    argv.extend(output_args(dir.path()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let tracer = start_tracer(&argv);
    signal(target.pid(), libc::SIGUSR1);
    let (code, stdout, stderr) = tracer.finish();
    assert_eq!(code, 0, "{label}: {stderr}");
    Run { dir, stdout }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn assert_close(label: &str, what: &str, got: &Value, want: f64) {
    assert!((f(got) - want).abs() < 1e-12, "{label}: {what} is {got}, computed {want}");
}

type Key = (String, String, u64);

fn key(row: &Value) -> Key {
    (row["name"].as_str().unwrap().to_string(), row["file"].as_str().unwrap().to_string(), u(&row["line"]))
}

/// Recomputes every number of the comparison from the calls report `a`
/// and the sample report `b`, the way docs/commands/compare.md defines them.
fn assert_compare_is_a_and_b(label: &str, cmp: &Value, a: &Value, b: &Value) {
    let rows: BTreeMap<Key, &Value> = cmp["functions"].as_array().unwrap().iter().map(|r| (key(r), r)).collect();
    assert_eq!(rows.len(), cmp["functions"].as_array().unwrap().len(), "{label}: one row per function");
    let traced: &Vec<Value> = a["functions"].as_array().unwrap();
    let sampled: Vec<&Value> = b["functions"].as_array().unwrap().iter().filter(|g| g["name"] != PROBES).collect();

    // Every function of either report has its row, and nothing else does.
    let keys: BTreeSet<Key> = traced.iter().map(key).chain(sampled.iter().map(|g| key(g))).collect();
    assert_eq!(keys, rows.keys().cloned().collect(), "{label}: rows are the union of both reports' functions");

    // Traced: exact counts; shares of all self time.
    let self_total: u64 = traced.iter().map(|t| u(&t["self_ns"])).sum();
    assert_eq!(u(&cmp["traced"]["self_ns"]), self_total, "{label}");
    assert_eq!(u(&cmp["traced"]["calls"]), traced.iter().map(|t| u(&t["calls"])).sum::<u64>(), "{label}");
    let evaluations = u(&a["counters"]["evaluations"]);
    assert_eq!(u(&cmp["traced"]["evaluations"]), evaluations, "{label}");
    for t in traced {
        let r = rows[&key(t)];
        let what = format!("{} ({}:{})", t["name"], t["file"], t["line"]);
        assert_eq!(r["calls"], t["calls"], "{label}: calls of {what}");
        assert_close(label, &format!("traced self share of {what}"), &r["traced_self_share"], u(&t["self_ns"]) as f64 / self_total as f64);
        assert_close(label, &format!("traced total share of {what}"), &r["traced_total_share"], u(&t["total_ns"]) as f64 / self_total as f64);
    }

    // Sampled: shares of the samples outside the probes.
    let probe_samples = b["functions"].as_array().unwrap().iter().filter(|g| g["name"] == PROBES).map(|g| u(&g["self_samples"])).sum::<u64>();
    let hz = u(&b["hz"]);
    assert_eq!(u(&cmp["sampled"]["samples"]), u(&b["samples"]), "{label}");
    assert_eq!(u(&cmp["sampled"]["probe_samples"]), probe_samples, "{label}");
    let n = u(&b["samples"]) - probe_samples;
    for g in &sampled {
        let r = rows[&key(g)];
        assert_eq!((&r["self_samples"], &r["total_samples"]), (&g["self_samples"], &g["total_samples"]), "{label}: {}", g["name"]);
        assert_close(label, &format!("sampled self share of {}", g["name"]), &r["sampled_self_share"], u(&g["self_samples"]) as f64 / n as f64);
        assert_close(label, &format!("sampled total share of {}", g["name"]), &r["sampled_total_share"], u(&g["total_samples"]) as f64 / n as f64);
    }

    // The probes' cost per call: measured from the samples inside them
    // when there are 100 or more, else the stated constant; 40 % of it in
    // the called function's self time, the rest in its caller's.
    let o = &cmp["overhead"];
    let sampled_probe_ns = (probe_samples as f64 * 1e9 / hz as f64).round() as u64;
    assert_eq!(u(&o["sampled_probe_ns"]), sampled_probe_ns, "{label}");
    let per_call = if probe_samples >= 100 {
        assert_eq!(o["source"], "sampled", "{label}");
        (sampled_probe_ns as f64 / evaluations as f64).round() as u64
    } else {
        assert_eq!(o["source"], "constant", "{label}");
        2100
    };
    let callee = (per_call as f64 * 0.4).round() as u64;
    assert_eq!((u(&o["ns_per_call"]), u(&o["callee_ns_per_call"]), u(&o["caller_ns_per_call"])), (per_call, callee, per_call - callee), "{label}");

    // Corrected: each call's callee part out of its own self time, the
    // caller part of each call it made out of its caller's, every call
    // under an outermost call out of the total.
    let corrected_self = |t: &Value| u(&t["self_ns"]).saturating_sub(u(&t["timed_calls"]) * callee + u(&t["child_calls"]) * (per_call - callee));
    let corrected_total = |t: &Value| u(&t["total_ns"]).saturating_sub(u(&t["outermost_calls"]) * callee + u(&t["nested_calls"]) * per_call);
    let corrected_all: u64 = traced.iter().map(corrected_self).sum();
    assert_eq!(u(&cmp["traced"]["corrected_self_ns"]), corrected_all, "{label}");
    for t in traced {
        let r = rows[&key(t)];
        let what = t["name"].to_string();
        let self_share = corrected_self(t) as f64 / corrected_all as f64;
        assert_close(label, &format!("corrected self share of {what}"), &r["corrected_self_share"], self_share);
        assert_close(label, &format!("corrected total share of {what}"), &r["corrected_total_share"], corrected_total(t) as f64 / corrected_all as f64);
        assert_close(label, &format!("self diff of {what}"), &r["self_diff"], f(&r["sampled_self_share"]) - self_share);
    }
    assert_eq!(cmp["diff_against"], "corrected", "{label}");
    assert_eq!(cmp["matched_by"], "name, file and first line", "{label}");
    assert_eq!(u(&a["lost_events"]) + u(&b["lost_events"]), 0, "{label}: lost events");
}

fn row<'a>(cmp: &'a Value, name: &str, file_suffix: &str) -> &'a Value {
    cmp["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name && r["file"].as_str().unwrap().ends_with(file_suffix))
        .unwrap_or_else(|| panic!("no row for {name}"))
}

fn flag_kinds(row: &Value) -> Vec<&str> {
    row["flags"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect()
}

/// The saved pair, compared again, gives the same JSON and the same table.
fn assert_saved_pair_gives_the_same(label: &str, run: &Run) {
    let again = run.path("again.json");
    let out = pytrace(&[
        "compare", "--traced", run.path("A.json").to_str().unwrap(), "--sampled", run.path("B.json").to_str().unwrap(),
        "--json", again.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_report(&again), run.json("cmp.json"), "{label}: saved reports compared differently");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), run.stdout, "{label}: the table differs");
}

#[test]
fn numbers_are_the_two_reports_combined_attached_by_pid() {
    let _machine = shared();
    for (label, python) in pythons() {
        let wall = tempfile::NamedTempFile::new().unwrap();
        let run = compare_pid(label, &python, "cpu_split.py", &["--seconds", &longer(3.0), "--wall-split", wall.path().to_str().unwrap()]);
        let cmp = run.json("cmp.json");
        assert_compare_is_a_and_b(label, &cmp, &run.json("A.json"), &run.json("B.json"));
        assert_compare_split(label, &cmp, wall.path(), 3.0);
        // Attached while it waited, so main's calls are all seen; the module
        // body was running already: sampled, never called while traced.
        assert_eq!(row(&cmp, "main", "cpu_split.py")["calls"], 1, "{label}");
        assert!(row(&cmp, "<module>", "cpu_split.py")["flags"][0]["kind"] == "not_traced", "{label}");
        assert!(run.stdout.contains("function (file:line)") && run.stdout.contains("sixty ("), "{label}: {}", run.stdout);
        assert_saved_pair_gives_the_same(label, &run);
    }
}

#[test]
fn numbers_are_the_two_reports_combined_when_pytrace_starts_the_command() {
    let _machine = shared();
    for (label, python) in pythons() {
        let wall = tempfile::NamedTempFile::new().unwrap();
        let run = compare_command(label, &python, "cpu_split.py", &["--seconds", &longer(3.0), "--wall-split", wall.path().to_str().unwrap()]);
        let cmp = run.json("cmp.json");
        assert_compare_is_a_and_b(label, &cmp, &run.json("A.json"), &run.json("B.json"));
        assert_compare_split(label, &cmp, wall.path(), 3.0);
        // From the first instruction: the module body is one traced call.
        assert_eq!(row(&cmp, "<module>", "cpu_split.py")["calls"], 1, "{label}");
        assert_eq!(run.json("A.json")["counters"]["unmatched_return"], 0, "{label}");
        assert_saved_pair_gives_the_same(label, &run);
    }
}

/// fixtures/compare_mix.py: a thousand calls of a one-line function a
/// round, where the probes' cost is most of the traced time; a CPU loop;
/// a 2 ms sleep, which tracing counts and CPU sampling does not. The
/// fixture measures its main's wall and CPU time: the off-CPU truth.
#[test]
fn probe_cost_is_measured_taken_out_and_flagged() {
    let _machine = shared();
    for (label, python) in pythons() {
        let times = tempfile::NamedTempFile::new().unwrap();
        let run = compare_command(label, &python, "compare_mix.py", &["--seconds", "3", "--times", times.path().to_str().unwrap()]);
        let (cmp, a) = (run.json("cmp.json"), run.json("A.json"));
        assert_compare_is_a_and_b(label, &cmp, &a, &run.json("B.json"));
        let get = |name: &str| row(&cmp, name, "fixtures/compare_mix.py");
        // Exact counts: every round calls each once, and tiny 1000 times.
        let rounds = u(&get("many_calls")["calls"]);
        assert!(rounds > 100, "{label}: {rounds} rounds");
        assert_eq!(u(&get("tiny")["calls"]), 1000 * rounds, "{label}");
        assert_eq!((u(&get("crunch")["calls"]), u(&get("nap")["calls"])), (rounds, rounds), "{label}");

        // A million probe pairs leave hundreds of samples inside the probes:
        // the cost is measured, and near what scripts/bench.sh finds (2 µs).
        let o = &cmp["overhead"];
        assert_eq!(o["source"], "sampled", "{label}: {o}");
        let per_call = u(&o["ns_per_call"]);
        assert!((500..=5000).contains(&per_call), "{label}: {per_call} ns per call");

        for name in ["tiny", "many_calls"] {
            let r = get(name);
            assert!(f(&r["corrected_self_share"]) < f(&r["traced_self_share"]), "{label}: {name} is not corrected down: {r}");
        }
        // many_calls' self time is mostly the probes' (the caller's part of
        // 1000 calls a round), even on a machine so busy that waits for a
        // CPU stretch every traced interval; tiny's is too on a quiet one,
        // but a one-line function's wall time is what such waits inflate.
        assert!(flag_kinds(get("many_calls")).contains(&"probe_cost"), "{label}: {}", get("many_calls"));
        // The sleep: its share of the traced time is what the fixture timed
        // it at (a busy machine stretches the CPU parts, and so shrinks
        // it: the fixture's own wall times say by how much), next to
        // nothing sampled.
        let t: Value = serde_json::from_str(&std::fs::read_to_string(times.path()).unwrap()).unwrap();
        let (wall, cpu, napped) = (f(&t["wall"]) * 1e9, f(&t["cpu"]) * 1e9, f(&t["nap"]) * 1e9);
        let traced = &cmp["traced"];
        let outside_main = u(&traced["self_ns"]) as f64 - wall;
        let nap = get("nap");
        let nap_share = napped / (wall + outside_main.max(0.0));
        assert!(nap_share > 0.05, "{label}: the fixture napped {napped:.0} of {wall:.0} ns");
        assert!(f(&nap["corrected_self_share"]) > 0.7 * nap_share && f(&nap["sampled_self_share"]) < 0.05, "{label}: napped {nap_share:.3} of the time: {nap}");
        assert!(flag_kinds(nap).contains(&"traced_more"), "{label}: {nap}");
        // Off CPU: main's wall time minus its CPU time, as the fixture
        // measured them; plus at most the traced time outside main
        // (start-up and exit, off CPU too on a busy machine). The margin is
        // for the CPU time outside Python code, told apart by samples.
        let off_cpu = traced["off_cpu_ns"].as_i64().unwrap() as f64;
        let margin = 0.05 * cpu + 20e6;
        assert_eq!(traced["off_cpu_from"], "cpu_time", "{label}");
        assert!(
            off_cpu > wall - cpu - margin && off_cpu < wall - cpu + outside_main + margin,
            "{label}: off CPU {off_cpu:.0} ns; main: wall {wall:.0} ns, CPU {cpu:.0} ns; traced outside main {outside_main:.0} ns"
        );
        assert_saved_pair_gives_the_same(label, &run);
    }
}

/// Stopped by -d while the target runs on: the target's eval-frame hook is
/// put back, and main, still running, is timed to the end of the traced
/// window (as cProfile closes the calls open when it is disabled) and
/// compared, where it used to be flagged as not timed.
#[test]
fn a_duration_ends_it_and_the_target_is_left_as_found() {
    let _machine = shared();
    for (label, python) in pythons() {
        let target = start_waiting(&python, "cpu_split.py", &["--seconds", "6"]);
        let pid = target.pid().to_string();
        let tracer = start_tracer(&["compare", "-p", &pid, "-d", "1.5", "--json", "-"]);
        signal(target.pid(), libc::SIGUSR1);
        let (code, stdout, stderr) = tracer.finish();
        assert_eq!(code, 0, "{label}: {stderr}");
        assert_eq!(eval_frame_now(target.pid()), "not set", "{label}");
        let cmp: Value = parse_report(&stdout);
        let main_flags = flag_kinds(row(&cmp, "main", "cpu_split.py"));
        assert!(!main_flags.contains(&"untimed_calls"), "{label}: {main_flags:?}");
        // Traced while it ran (how many rounds 1.5 s allows depends on what
        // else this machine runs).
        assert!(u(&row(&cmp, "sixty", "cpu_split.py")["calls"]) > 0, "{label}");
    }
}

/// Bad input: one sentence on stderr, exit code 1, no panic.
fn assert_fails_with(args: &[&str], want: &str) {
    let out = pytrace(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "pytrace {args:?} should fail: {stderr}");
    assert!(stderr.contains(want), "pytrace {args:?}: expected {want:?} in {stderr:?}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("pytrace: ") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_is_one_clear_sentence() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let calls = write("calls.json", r#"{"pid": 1, "python": {"version": "3.11.2", "mode": "uprobe"}, "duration_ns": 1, "lost_events": 0, "functions": []}"#);
    let sample = write(
        "sample.json",
        r#"{"pid": 1, "python": {"version": "3.11.2", "mode": "sample"}, "hz": 99, "duration_ns": 1, "samples": 0, "lost_events": 0, "functions": []}"#,
    );
    let text = write("notes.txt", "not json at all");
    let gc = write("gc.json", r#"{"pid": 1, "generations": []}"#);

    let missing = dir.path().join("missing.json");
    let missing = missing.to_str().unwrap();
    assert_fails_with(&["compare", "--traced", missing, "--sampled", &sample], &format!("cannot read {missing}: No such file or directory"));
    assert_fails_with(
        &["compare", "--traced", &sample, "--sampled", &calls],
        &format!("{sample} is a `pytrace sample --json` report, but --traced needs a `pytrace calls --json` report"),
    );
    assert_fails_with(
        &["compare", "--traced", &calls, "--sampled", &calls],
        &format!("{calls} is a `pytrace calls --json` report, but --sampled needs a `pytrace sample --json` report"),
    );
    assert_fails_with(&["compare", "--traced", &text, "--sampled", &sample], &format!("{text} is not JSON ("));
    assert_fails_with(&["compare", "--traced", &calls, "--sampled", &gc], "is a `pytrace gc --json` report, but --sampled needs");
    assert_fails_with(&["compare", "-p", "999999999"], "no process with PID 999999999");
    // Two empty reports are no error: an empty comparison.
    let out = pytrace(&["compare", "--traced", &calls, "--sampled", &sample, "--json", "-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cmp: Value = parse_report(&out.stdout);
    assert_eq!(cmp["functions"].as_array().unwrap().len(), 0);
}

/// Saved reports are read like every untrusted file: a device, a FIFO (a
/// writer that never comes would block forever) or a link to either is
/// refused in a sentence without reading a byte, and so is a file over
/// the 128 MiB cap (a sparse one here, which read_to_string would have
/// filled memory with), each at once and within bounded memory.
#[test]
fn unbounded_inputs_are_refused_at_once() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let sample = dir.path().join("sample.json");
    std::fs::write(
        &sample,
        r#"{"pid": 1, "python": {"version": "3.11.2", "mode": "sample"}, "hz": 99, "duration_ns": 1, "samples": 0, "lost_events": 0, "functions": []}"#,
    )
    .unwrap();
    let sample = sample.to_str().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = dir.path().join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge).unwrap().set_len(129 << 20).unwrap();
    for (input, want) in [
        ("/dev/zero", "/dev/zero is not a regular file".to_string()),
        (fifo.to_str().unwrap(), format!("{} is not a regular file", fifo.display())),
        (link.to_str().unwrap(), format!("{} is not a regular file", link.display())),
        (huge.to_str().unwrap(), format!("{} is 129 MiB, more than the 128 MiB pytrace reads of a report", huge.display())),
    ] {
        let started = std::time::Instant::now();
        let out = Command::new("timeout")
            .args(["20", "/usr/bin/time", "-f", "maxrss_kb=%M", PYTRACE, "compare", "--traced", input, "--sampled", sample])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{input}: {stderr}");
        let (sentence, rest) = stderr.split_once('\n').unwrap();
        assert!(sentence.starts_with("pytrace: ") && sentence.contains(&want), "{input}: expected {want:?} in {stderr:?}");
        let rss = peak_kib(rest);
        assert!(rss < 64 * 1024, "{input}: pytrace peaked at {rss} KiB");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{input}: took {:?}", started.elapsed());
    }
}
