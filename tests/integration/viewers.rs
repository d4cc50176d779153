//! The viewers a user opens pytrace's files in, driven as a user would:
//! `--flamegraph` SVGs and `--speedscope` profiles in headless Chromium
//! (tests/viewers/browser.cjs, with the speedscope app from its npm
//! package), and `calls --pstats` files in gprof2dot and snakeviz. What they
//! show is held to the fixtures' own ground truth: cpu_split.py's measured
//! CPU split, cProfile's call counts. scripts/test-tools.sh installs them.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Where scripts/test-tools.sh put the npm and pip packages.
fn viewers_cache() -> PathBuf {
    let dir = PathBuf::from(std::env::var("PYTRACE_VIEWERS").unwrap_or_else(|_| "/var/cache/pytrace/viewers".into()));
    assert!(dir.join("node/node_modules/speedscope").exists() && dir.join("venv/bin/snakeviz").exists(), "the viewers are missing from {dir:?}: run scripts/test-tools.sh");
    dir
}

/// `node tests/viewers/browser.cjs ARGS`: what Chromium showed, as JSON.
pub(crate) fn browser(args: &[&str]) -> serde_json::Value {
    let out = Command::new("node")
        .arg(format!("{}/tests/viewers/browser.cjs", env!("CARGO_MANIFEST_DIR")))
        .args(args)
        .env("PYTRACE_VIEWERS", viewers_cache())
        .output()
        .expect("node is installed by scripts/test-tools.sh");
    assert!(out.status.success(), "browser.cjs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["page_errors"], serde_json::json!([]), "browser.cjs {args:?}: the page threw");
    shown
}

/// "1,159 (57%)" or "Matched: 57.4%": the number before '%'.
pub(crate) fn percent(text: &str) -> f64 {
    let end = text.rfind('%').unwrap_or_else(|| panic!("no percent in {text:?}"));
    let start = text[..end].rfind(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(0, |i| i + 1);
    text[start..end].parse().unwrap_or_else(|_| panic!("no percent in {text:?}"))
}

/// "1,159 (57%)": the count before the parenthesis.
fn count(text: &str) -> u64 {
    text.split(" (").next().unwrap().replace(',', "").parse().unwrap_or_else(|_| panic!("no count in {text:?}"))
}

const SPLIT: [&str; 3] = ["sixty", "thirty", "ten"];

/// cpu_split.py's CPU time per function as shares of the three (its own
/// process_time() around each call).
fn cpu_shares(cpu_split: &Path) -> HashMap<&'static str, f64> {
    let truth = read_json(cpu_split);
    let sum: f64 = SPLIT.iter().map(|n| truth[n].as_f64().unwrap()).sum();
    SPLIT.iter().map(|n| (*n, truth[n].as_f64().unwrap() * 100.0 / sum)).collect()
}

/// `pytrace sample` on cpu_split.py writing OUTPUTS, attached by PID once
/// it waits or started by pytrace; the fixture's CPU split file.
fn sample_cpu_split(dir: &Path, by_pid: bool, outputs: &[&str]) -> PathBuf {
    let python = Path::new("/usr/bin/python3.11");
    let cpu_split = dir.join("cpu_split.json");
    let seconds = longer(3.0);
    let fixture_args = ["--cpu-seconds", &seconds, "--cpu-split", cpu_split.to_str().unwrap()];
    let mut args = vec!["sample", "-r", "999"];
    args.extend(outputs);
    run_on_fixture("cpu_split.py", &args, python, "cpu_split.py", &fixture_args, by_pid);
    cpu_split
}

/// Each function's total samples in pytrace's JSON report.
fn report_totals(report: &serde_json::Value) -> HashMap<String, u64> {
    let mut totals = HashMap::new();
    for f in report["functions"].as_array().unwrap() {
        *totals.entry(f["name"].as_str().unwrap().to_string()).or_default() += f["total_samples"].as_u64().unwrap();
    }
    totals
}

/// The flamegraph's own search, in Chromium, finds each function of the
/// split with the share the fixture measured (within 3 points of the
/// three's sum, as the sampler's accuracy tests allow) and exactly the
/// share of samples the JSON report gives it; clicking a frame zooms to it
/// (it spans the width, its siblings hide, its callers dim) and "Reset
/// Zoom" brings every frame back. Attached by PID and started by pytrace.
#[test]
fn flamegraph_search_and_zoom_work_in_chromium() {
    let _machine = shared();
    for by_pid in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (svg, json) = (dir.path().join("flame.svg"), dir.path().join("report.json"));
        let cpu_split = sample_cpu_split(dir.path(), by_pid, &["--flamegraph", svg.to_str().unwrap(), "--json", json.to_str().unwrap()]);
        let how = if by_pid { "by PID" } else { "started" };
        let report = read_report(&json);
        let (totals, samples) = (report_totals(&report), report["samples"].as_u64().unwrap());
        let mut args = vec!["flamegraph", svg.to_str().unwrap()];
        args.extend(SPLIT);
        let shown = browser(&args);
        let matched: HashMap<&str, f64> = SPLIT.iter().map(|n| (*n, percent(shown["searches"][n].as_str().unwrap()))).collect();
        let matched_sum: f64 = matched.values().sum();
        let truth = cpu_shares(&cpu_split);
        for name in SPLIT {
            let exact = totals[name] as f64 * 100.0 / samples as f64;
            assert!((matched[name] - exact).abs() <= 0.051, "{how}: search for {name} matched {}% of the flamegraph, the report gives it {exact:.2}%", matched[name]);
            let share = matched[name] * 100.0 / matched_sum;
            assert!((share - truth[name]).abs() <= 3.0, "{how}: {name} has {share:.1}% of the split in the flamegraph's search, {:.1}% of its CPU time", truth[name]);
        }
        let zoom = &shown["zoom"];
        assert_eq!(zoom["unzoom_shown"], true, "{how}: clicking sixty showed no Reset Zoom");
        let frames = zoom["shown"].as_array().unwrap();
        let visible = |name: &str| frames.iter().filter(|f| f["title"].as_str().unwrap().starts_with(&format!("{name} ("))).collect::<Vec<_>>();
        let sixty = visible("sixty");
        assert!(sixty.iter().any(|f| f["width"].as_f64().unwrap() > 99.9 && f["parent"] == false), "{how}: zoomed sixty does not span the graph: {sixty:?}");
        assert!(sixty.iter().any(|f| f["label"].as_str().unwrap().starts_with("sixty")), "{how}: zoomed sixty's label is not its name");
        assert!(visible("thirty").is_empty() && visible("ten").is_empty(), "{how}: sixty's siblings still show when zoomed to it");
        assert!(visible("main").iter().all(|f| f["parent"] == true), "{how}: sixty's caller is not dimmed as a parent");
        assert_eq!(zoom["hidden_after_reset"], 0, "{how}: Reset Zoom left frames hidden");
    }
}

/// The speedscope app (its npm package, served on a loopback port as a
/// user would host it) loads the --speedscope file in Chromium: its
/// Sandwich table lists the split's functions by name with each one's
/// sample count equal to the JSON report's and its share within 3 points
/// of the fixture's measured CPU split; the page title names the target.
#[test]
fn speedscope_app_shows_the_known_functions_in_chromium() {
    let _machine = shared();
    for by_pid in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (profile, json) = (dir.path().join("profile.speedscope.json"), dir.path().join("report.json"));
        let cpu_split = sample_cpu_split(dir.path(), by_pid, &["--speedscope", profile.to_str().unwrap(), "--json", json.to_str().unwrap()]);
        let how = if by_pid { "by PID" } else { "started" };
        let totals = report_totals(&read_report(&json));
        let shown = browser(&["speedscope", profile.to_str().unwrap()]);
        assert!(shown["title"].as_str().unwrap().starts_with("pytrace sample: PID"), "{how}: speedscope's title is {}", shown["title"]);
        let rows: HashMap<String, (u64, f64)> = shown["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r[2].as_str().unwrap().to_string(), (count(r[0].as_str().unwrap()), percent(r[0].as_str().unwrap()))))
            .collect();
        let row = |name: &str| *rows.get(name).unwrap_or_else(|| panic!("{how}: speedscope shows no {name}: {:?}", rows.keys()));
        // (Names only cpu_split.py defines: the table has a row per frame, and
        // site.py has its own `main`.)
        for name in ["spin"].iter().chain(&SPLIT) {
            assert_eq!(row(name).0, totals[*name], "{how}: {name}'s samples in speedscope and in the report");
        }
        let sum: u64 = SPLIT.iter().map(|n| row(n).0).sum();
        let truth = cpu_shares(&cpu_split);
        for name in SPLIT {
            let share = row(name).0 as f64 * 100.0 / sum as f64;
            assert!((share - truth[name]).abs() <= 3.0, "{how}: {name} has {share:.1}% of the split in speedscope, {:.1}% of its CPU time", truth[name]);
        }
    }
}

/// Runs fixtures/callers.py on Debian's 3.11: once under cProfile
/// (builtins=False, around its rounds) writing `truth.prof`, once under
/// `pytrace calls --pstats ours.prof`, attached by PID or started.
fn callers_pstats(dir: &Path, by_pid: bool) -> (PathBuf, PathBuf) {
    let python = Path::new("/usr/bin/python3.11");
    let (truth, ours) = (dir.join("truth.prof"), dir.join("ours.prof"));
    let out = Command::new(python).args([&fixture("callers.py"), "--rounds", "100", "--cprofile-pstats", truth.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if by_pid {
        let target = start_waiting(python, "callers.py", &["--rounds", "100"]);
        let tracer = start_tracer(&["calls", "-p", &target.pid().to_string(), "--pstats", ours.to_str().unwrap()]);
        signal(target.pid(), libc::SIGUSR1);
        let (code, _, stderr) = tracer.finish();
        assert_eq!(code, 0, "{stderr}");
    } else {
        let out = pytrace(&["calls", "--pstats", ours.to_str().unwrap(), "--", python.to_str().unwrap(), &fixture("callers.py"), "--rounds", "100"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    (truth, ours)
}

/// gprof2dot's call graph of a pstats file (every node and edge: no
/// thresholds), as edges "file:line:function" -> same, with their calls.
fn gprof2dot_edges(prof: &Path) -> HashMap<(String, String), u64> {
    let out = Command::new(viewers_cache().join("venv/bin/gprof2dot")).args(["-f", "pstats", "--node-thres=0", "--edge-thres=0"]).arg(prof).output().unwrap();
    assert!(out.status.success(), "gprof2dot {prof:?}: {}", String::from_utf8_lossy(&out.stderr));
    let dot = String::from_utf8(out.stdout).unwrap();
    let attribute = |line: &str, name: &str| -> String {
        let start = line.find(&format!("{name}=\"")).unwrap_or_else(|| panic!("no {name} in {line}")) + name.len() + 2;
        line[start..][..line[start..].find('"').unwrap()].to_string()
    };
    // Node: `ID [..., label="module:LINE:function\n...", tooltip="FILE"]`.
    let mut nodes = HashMap::new();
    for line in dot.lines().map(str::trim).filter(|l| !l.contains("->") && l.contains("label=")) {
        let id = line.split_whitespace().next().unwrap().to_string();
        if id.parse::<u64>().is_err() {
            continue; // the graph's and the nodes' defaults
        }
        let label = attribute(line, "label");
        let mut parts = label.split("\\n").next().unwrap().rsplitn(3, ':');
        let (function, line_no) = (parts.next().unwrap(), parts.next().unwrap());
        let file = attribute(line, "tooltip");
        let file = file.rsplit('/').next().unwrap();
        nodes.insert(id, format!("{file}:{line_no}:{function}"));
    }
    // Edge: `A -> B [..., label="P%\nN×", ...]`.
    let mut edges = HashMap::new();
    for line in dot.lines().map(str::trim).filter(|l| l.contains(" -> ")) {
        let mut ids = line.split(" [").next().unwrap().split(" -> ");
        let (from, to) = (ids.next().unwrap(), ids.next().unwrap());
        let label = attribute(line, "label");
        let calls = label.rsplit("\\n").next().unwrap().trim_end_matches('×').parse().unwrap_or_else(|_| panic!("no calls in {line}"));
        edges.insert((nodes[from].clone(), nodes[to].clone()), calls);
    }
    edges
}

/// gprof2dot, the call-graph drawer cProfile users feed pstats to, draws
/// from pytrace's `--pstats` file every edge it draws from cProfile's own
/// file of the same workload (fixtures/callers.py: recursion, mutual
/// recursion, methods, generators), with the same call count; the only
/// edges it adds come from the module body cProfile ran outside of.
/// Attached by PID and started by pytrace.
#[test]
fn gprof2dot_draws_cprofiles_edges_from_pstats() {
    let _machine = shared();
    for by_pid in [true, false] {
        let how = if by_pid { "by PID" } else { "started" };
        let dir = tempfile::tempdir().unwrap();
        let (truth, ours) = callers_pstats(dir.path(), by_pid);
        let is_fixture = |f: &str| f.starts_with("callers.py:");
        let truth: HashMap<_, _> = gprof2dot_edges(&truth).into_iter().filter(|((a, b), _)| is_fixture(a) && is_fixture(b)).collect();
        let ours = gprof2dot_edges(&ours);
        assert!(truth.len() >= 10, "{how}: gprof2dot drew only {truth:?} from cProfile's file");
        for ((from, to), calls) in &truth {
            let got = ours.get(&(from.clone(), to.clone())).unwrap_or_else(|| panic!("{how}: gprof2dot draws no {from} -> {to} from pytrace's file"));
            assert_eq!(got, calls, "{how}: calls on {from} -> {to} in gprof2dot");
        }
        for (from, to) in ours.keys().filter(|e| is_fixture(&e.0) && is_fixture(&e.1) && !truth.contains_key(*e)) {
            assert!(!by_pid && from.ends_with(":<module>"), "{how}: gprof2dot draws an edge cProfile has not: {from} -> {to}");
        }
    }
}

/// A port on the loopback interface no one listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// snakeviz, started as a server on a loopback port, serves its page for
/// pytrace's `--pstats` file: its stats table lists every function of
/// fixtures/callers.py that it lists for cProfile's file, with the same
/// ncalls text (recursive "total/primitive" included).
#[test]
fn snakeviz_serves_pstats_with_cprofiles_counts() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let (truth, ours) = callers_pstats(dir.path(), false);
    let port = free_port().to_string();
    let server = Proc(
        Command::new(viewers_cache().join("venv/bin/snakeviz"))
            .args(["--server", "--hostname", "127.0.0.1", "--port", &port])
            .arg(&truth)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(format!("127.0.0.1:{port}")).is_err() {
        if Instant::now() > deadline {
            let mut server = server;
            let _ = server.0.kill();
            let mut err = String::new();
            server.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("snakeviz did not listen on {port} in 30 s: {err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = |prof: &Path| -> HashMap<String, String> {
        let url = format!("http://127.0.0.1:{port}/snakeviz/{}", prof.to_str().unwrap().replace('/', "%2F"));
        let out = Command::new(viewers_cache().join("venv/bin/python"))
            .arg(format!("{}/tests/viewers/snakeviz_table.py", env!("CARGO_MANIFEST_DIR")))
            .arg(&url)
            .output()
            .unwrap();
        assert!(out.status.success(), "snakeviz's page {url}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let fixture_path = fixture("callers.py");
    let (truth, ours) = (table(&truth), table(&ours));
    drop(server);
    let truth: HashMap<_, _> = truth.into_iter().filter(|(f, _)| f.starts_with(&fixture_path)).collect();
    assert!(truth.len() >= 10, "snakeviz lists only {truth:?} from cProfile's file");
    for (function, ncalls) in &truth {
        let got = ours.get(function).unwrap_or_else(|| panic!("snakeviz lists no {function} from pytrace's file: {:?}", ours.keys()));
        assert_eq!(got, ncalls, "ncalls of {function} in snakeviz");
    }
    // Recursion shows as "total/primitive" in both.
    let recurse = truth.iter().find(|(f, _)| f.ends_with("(recurse)")).expect("cProfile's file has recurse");
    assert!(recurse.1.contains('/'), "snakeviz shows recurse's calls as {}", recurse.1);
}
