//! pytrace agent against receivers that stand in for the backends (no
//! Pyroscope, Parca or Collector binary can be installed here): a
//! Pyroscope-style HTTP /ingest (tests/receivers/pyroscope_ingest.py) whose
//! bodies Go's own pprof reader decodes, an OTLP profiles HTTP receiver
//! decoding with PyPI's opentelemetry-proto (tests/receivers/otlp_profiles.py),
//! a grpcio server (tests/receivers/grpc_profiles.py) serving OTLP's
//! ProfilesService with opentelemetry-proto's servicer and Parca's
//! ProfileStoreService compiled from Parca's own .proto, and the directory
//! destination.
//! One run is checked every way, to keep the CPU time low: two services
//! with a known CPU split (fixtures/cpu_split.py writes its own), one in
//! its own PID and mount namespace, four full intervals and the partial
//! one SIGTERM cuts, three receivers (one always up, two down for the
//! first two intervals with a large and a one-interval buffer) and
//! /metrics scraped while it runs, directly and by a real Prometheus
//! (Debian's, started by the test).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, assert_share, fixture, read_json, signal, Proc, PYTRACE};

const INTERVAL_SECONDS: u64 = 8;
/// High for an agent (19 Hz by default), so each interval holds enough
/// samples per service for a share test: a service on half a CPU gets
/// about 4000 an interval.
const HZ: u64 = 997;
/// Samples of the three functions an interval must hold for its shares
/// to be checked within SHARE_POINTS: at 1500, one standard deviation of
/// a 60 % share is 1.3 points.
const MIN_SAMPLES: f64 = 1500.0;
const SHARE_POINTS: f64 = 0.03;
const FULL_INTERVALS: usize = 4;
const PYTHON: &str = "/usr/bin/python3.11";
/// The test's destinations, by name.
const DESTINATIONS: [&str; 7] = ["directory", "steady", "otlp", "otlp-grpc", "parca", "outage", "small"];

/// A receiver: its process, directory and port.
struct Receiver {
    _proc: Proc,
    dir: PathBuf,
    port: u16,
}

impl Receiver {
    fn start(dir: PathBuf, down: bool) -> Receiver {
        Receiver::start_script(dir, down, PYTHON.into(), "pyroscope_ingest.py", None)
    }

    /// The OTLP receiver, in the venv scripts/test-tools.sh makes.
    fn start_otlp(dir: PathBuf) -> Receiver {
        Receiver::start_script(dir, false, receivers_python(), "otlp_profiles.py", None)
    }

    /// The gRPC receiver (OTLP and Parca), in the same venv: Parca's
    /// profiles in DIR/parca, OTLP's in DIR/otlp.
    fn start_grpc(dir: PathBuf) -> Receiver {
        Receiver::start_script(dir, false, receivers_python(), "grpc_profiles.py", None)
    }

    /// `tls`: the server's certificate and key, served over TLS.
    fn start_script(dir: PathBuf, down: bool, python: PathBuf, script: &str, tls: Option<&Certificates>) -> Receiver {
        std::fs::create_dir_all(&dir).unwrap();
        if down {
            std::fs::write(dir.join("down"), "").unwrap();
        }
        let script = format!("{}/tests/receivers/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut command = Command::new(python);
        // grpcio logs each refused handshake (the TLS test's untrusted
        // destination) at its info level.
        command.arg(script).arg(&dir).env("GRPC_VERBOSITY", "ERROR");
        if let Some(tls) = tls {
            command.arg(&tls.server).arg(&tls.key);
        }
        let mut child = command.stdout(Stdio::piped()).spawn().expect("start the receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the receiver said {line:?}, not its port"));
        Receiver { _proc: Proc(child), dir, port }
    }

    fn up(&self) {
        std::fs::remove_file(self.dir.join("down")).unwrap();
    }

    /// Every profile taken so far: its query and headers, and its body.
    fn received(&self) -> Vec<(serde_json::Value, Vec<u8>)> {
        received_in(&self.dir)
    }
}

/// Every profile a receiver saved in `dir` (N.json and N.pb.gz, from 1).
fn received_in(dir: &Path) -> Vec<(serde_json::Value, Vec<u8>)> {
    let mut out = Vec::new();
    for n in 1.. {
        let meta = dir.join(format!("{n}.json"));
        if !meta.exists() {
            break;
        }
        out.push((read_json(&meta), std::fs::read(dir.join(format!("{n}.pb.gz"))).unwrap()));
    }
    out
}

fn receivers_python() -> PathBuf {
    let viewers = PathBuf::from(std::env::var("PYTRACE_VIEWERS").unwrap_or_else(|_| "/var/cache/pytrace/viewers".into()));
    let python = viewers.join("receivers/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/test-tools.sh", python.display());
    python
}

/// The profiles an OTLP receiver saved in `dir` (N.json, from 1).
fn otlp_received(dir: &Path) -> Vec<serde_json::Value> {
    (1..).map(|n| dir.join(format!("{n}.json"))).take_while(|p| p.exists()).map(|p| read_json(&p)).collect()
}

/// A service's profiles at a receiver, by interval start (`from`).
fn intervals_of(received: &[(serde_json::Value, Vec<u8>)], service: &str) -> BTreeMap<u64, (serde_json::Value, Vec<u8>)> {
    received
        .iter()
        .filter(|(meta, _)| meta["name"].as_str().is_some_and(|n| n.starts_with(&format!("{service}{{"))))
        .map(|(meta, body)| (meta["from"].as_str().unwrap().parse().unwrap(), (meta.clone(), body.clone())))
        .collect()
}

/// Samples per function (sixty, thirty, ten) in a pprof body, as Go's
/// pprof reads it (`-raw`: each sample's counts and location IDs, then
/// each location's function).
fn split_by_go_pprof(body: &[u8], dir: &Path) -> HashMap<String, f64> {
    let file = dir.join("decode.pb.gz");
    std::fs::write(&file, body).unwrap();
    let out = Command::new("go").args(["tool", "pprof", "-raw"]).arg(&file).output().expect("run go tool pprof (scripts/test-tools.sh installs golang-go)");
    assert!(out.status.success(), "go tool pprof could not read the profile: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut functions: HashMap<u64, String> = HashMap::new();
    let mut samples: Vec<(f64, Vec<u64>)> = Vec::new();
    let mut section = "";
    for line in text.lines() {
        match line.trim_end() {
            "Samples:" | "Locations" | "Mappings" => section = line.trim_end(),
            l if section == "Samples:" && l.contains(':') && !l.contains('/') => {
                let (values, ids) = l.split_once(':').unwrap();
                let count: f64 = values.split_whitespace().next().unwrap().parse().unwrap();
                samples.push((count, ids.split_whitespace().map(|i| i.parse().unwrap()).collect()));
            }
            l if section == "Locations" => {
                let (id, rest) = l.trim().split_once(": ").unwrap();
                // "0x0 M=1 NAME FILE:LINE s=N()"
                let name = rest.split_whitespace().nth(2).unwrap_or("").to_string();
                functions.insert(id.parse().unwrap(), name);
            }
            _ => {}
        }
    }
    let mut split = HashMap::new();
    for (count, ids) in samples {
        if let Some(f) = ids.iter().filter_map(|i| functions.get(i)).find(|f| ["sixty", "thirty", "ten"].contains(&f.as_str())) {
            *split.entry(f.clone()).or_insert(0.0) += count;
        }
    }
    split
}

fn scrape(port: u16) -> HashMap<String, f64> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.lines().filter(|l| !l.starts_with('#') && l.starts_with("pytrace_agent_")).filter_map(|l| l.rsplit_once(' ')).map(|(k, v)| (k.to_string(), v.parse().unwrap())).collect()
}

/// Debian's Prometheus, scraping `target` every second, its storage in `dir`.
fn start_prometheus(dir: &Path, target: u16) -> (Proc, u16) {
    let port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: pytrace-agent\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("start prometheus (scripts/test-tools.sh installs Debian's)");
    (Proc(child), port)
}

/// A PromQL query's result: each series' labels and value.
fn prometheus_query(port: u16, query: &str) -> Vec<(serde_json::Value, f64)> {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return Vec::new() };
    // HTTP/1.0: the whole body, never chunked.
    write!(stream, "GET /api/v1/query?query={query} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    if stream.read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    let Some((_, body)) = text.split_once("\r\n\r\n") else { return Vec::new() };
    let Ok(answer) = serde_json::from_str::<serde_json::Value>(body) else { return Vec::new() };
    answer["data"]["result"]
        .as_array()
        .map(|rows| rows.iter().map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse().unwrap())).collect())
        .unwrap_or_default()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A cpu_split.py run as a service: `label` its service name, set through
/// `variable`; `contained` puts it in its own PID and mount namespace.
fn service(variable: &str, label: &str, truth: &Path, contained: bool) -> (Proc, u32) {
    let script = fixture("cpu_split.py");
    let args = ["--seconds", "300", "--stop-on-usr2", "--cpu-split", truth.to_str().unwrap()];
    let mut command = if contained {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--mount", "--fork", "--kill-child", PYTHON, &script]);
        c
    } else {
        let mut c = Command::new(PYTHON);
        c.arg(&script);
        c
    };
    let child = command.args(args).env(variable, label).stdout(Stdio::null()).spawn().expect("start a service");
    let proc = Proc(child);
    let pid = if contained {
        let unshare = proc.pid();
        let mut pid = 0;
        wait_until("unshare forked the service", Duration::from_secs(10), || {
            let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap_or_default();
            pid = children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(0);
            pid != 0
        });
        pid
    } else {
        proc.pid()
    };
    (proc, pid)
}

fn python_version() -> String {
    let out = Command::new(PYTHON).args(["-c", "import platform; print(platform.python_version())"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `pytrace agent --config DIR/agent.toml` (the test writes that file
/// first), its stderr kept in DIR/agent.log for the assertions' messages.
struct Agent {
    proc: Proc,
    dir: PathBuf,
}

impl Agent {
    fn start(dir: &Path) -> Agent {
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let proc = Proc(Command::new(PYTRACE).args(["agent", "--config"]).arg(dir.join("agent.toml")).stdout(Stdio::null()).stderr(log).spawn().unwrap());
        Agent { proc, dir: dir.to_path_buf() }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGTERM: the partial interval is cut and delivered, then the agent
    /// must exit with 0.
    fn stop(mut self) {
        signal(self.pid(), libc::SIGTERM);
        let status = self.proc.0.wait().unwrap();
        assert_eq!(status.code(), Some(0), "the agent ended badly: {}", self.log());
    }
}

#[test]
fn every_destination_gets_every_interval() {
    // Each service needs a good part of a CPU for the samples its share
    // tests require: no other test of this binary runs beside it.
    let _machine = common::alone();
    let tmp = tempfile::tempdir().unwrap();
    let steady = Receiver::start(tmp.path().join("steady"), false);
    let outage = Receiver::start(tmp.path().join("outage"), true);
    let small = Receiver::start(tmp.path().join("small"), true);
    let otlp = Receiver::start_otlp(tmp.path().join("otlp"));
    let grpc = Receiver::start_grpc(tmp.path().join("grpc"));
    std::fs::write(tmp.path().join("token"), "s3cret-token\n").unwrap();
    let metrics_port = free_port();
    let profiles = tmp.path().join("profiles");
    let config = format!(
        r#"
frequency = {HZ}
interval = "{INTERVAL_SECONDS}s"
[labels]
env = "ci"
[metrics]
address = "127.0.0.1:{metrics_port}"
[[destinations]]
kind = "directory"
path = "{profiles}"
[[destinations]]
kind = "pyroscope"
name = "steady"
url = "http://127.0.0.1:{}"
bearer_token_file = "{token}"
tenant = "team-a"
[[destinations]]
kind = "otlp"
url = "http://127.0.0.1:{}"
[[destinations]]
kind = "otlp"
name = "otlp-grpc"
protocol = "grpc"
url = "http://127.0.0.1:{grpc_port}"
bearer_token_file = "{token}"
tenant = "team-a"
[[destinations]]
kind = "parca"
url = "http://127.0.0.1:{grpc_port}"
basic_auth_user = "agent"
basic_auth_password_file = "{token}"
tenant = "team-a"
[[destinations]]
kind = "pyroscope"
name = "outage"
url = "http://127.0.0.1:{}"
buffer_intervals = 10
retry_initial = "200ms"
retry_max = "1s"
[[destinations]]
kind = "pyroscope"
name = "small"
url = "http://127.0.0.1:{}"
buffer_intervals = 1
retry_initial = "200ms"
retry_max = "1s"
"#,
        steady.port,
        otlp.port,
        outage.port,
        small.port,
        profiles = profiles.display(),
        token = tmp.path().join("token").display(),
        grpc_port = grpc.port,
    );
    let config_path = tmp.path().join("agent.toml");
    std::fs::write(&config_path, config).unwrap();

    let (truth_a, truth_b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    let (mut service_a, pid_a) = service("OTEL_SERVICE_NAME", "agent-split-a", &truth_a, false);
    let (service_b, pid_b) = service("PYROSCOPE_APPLICATION_NAME", "agent-split-b", &truth_b, true);

    let (_prometheus, prometheus_port) = start_prometheus(tmp.path(), metrics_port);
    let agent = Agent::start(tmp.path());
    let limit = Duration::from_secs(INTERVAL_SECONDS * 3 + 30);

    // Down for the first two intervals, then back.
    wait_until("the steady receiver has two intervals of each service", limit, || {
        let got = steady.received();
        intervals_of(&got, "agent-split-a").len() >= 2 && intervals_of(&got, "agent-split-b").len() >= 2
    });
    outage.up();
    small.up();
    wait_until("four intervals of each service", limit, || {
        let got = steady.received();
        intervals_of(&got, "agent-split-a").len() >= FULL_INTERVALS && intervals_of(&got, "agent-split-b").len() >= FULL_INTERVALS
    });
    // Scraped once every buffer is empty, just after a cut: the next is
    // seconds away, so the receivers' counts are those the scrape saw, and
    // Prometheus's scrapes in the next seconds see them too.
    let before = steady.received().len();
    wait_until("a new interval", limit, || steady.received().len() > before);
    let mut scraped = HashMap::new();
    wait_until("every buffer is empty", limit, || {
        scraped = scrape(metrics_port);
        DESTINATIONS.iter().all(|d| scraped[&format!("pytrace_agent_buffered_profiles{{destination=\"{d}\"}}")] == 0.0)
    });
    let counted = |d: &str| scraped[&format!("pytrace_agent_pushes_total{{destination=\"{d}\"}}")];
    let dropped = |d: &str, cause: &str| scraped[&format!("pytrace_agent_profiles_dropped_total{{destination=\"{d}\",cause=\"{cause}\"}}")];
    let at_scrape = (steady.received().len(), outage.received().len(), small.received().len());
    let grpc_at_scrape = (otlp_received(&grpc.dir.join("otlp")).len(), received_in(&grpc.dir.join("parca")).len());
    let quiet = Instant::now();
    let mut by_prometheus = Vec::new();
    wait_until("Prometheus scraped the agent since the buffers emptied", Duration::from_secs(5), || {
        std::thread::sleep(Duration::from_millis(300));
        by_prometheus = prometheus_query(prometheus_port, "pytrace_agent_pushes_total");
        quiet.elapsed() > Duration::from_millis(2500) && by_prometheus.len() == DESTINATIONS.len()
    });
    let dropped_by_prometheus = prometheus_query(prometheus_port, "pytrace_agent_profiles_dropped_total");
    let quiet_for = quiet.elapsed();

    // SIGTERM: the partial interval is cut and delivered, then it exits.
    let terminated = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    agent.stop();
    signal(pid_a, libc::SIGUSR2);
    signal(pid_b, libc::SIGUSR2);
    assert!(service_a.0.wait().unwrap().success());
    wait_until("the contained service wrote its split", Duration::from_secs(10), || truth_b.exists());
    drop(service_b);

    let got = steady.received();
    let (host, version) = (std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string(), python_version());
    for (label, pid, truth) in [("agent-split-a", pid_a, &truth_a), ("agent-split-b", pid_b, &truth_b)] {
        let intervals = intervals_of(&got, label);
        let bounds: Vec<(u64, u64)> = intervals.values().map(|(m, _)| (m["from"].as_str().unwrap().parse().unwrap(), m["until"].as_str().unwrap().parse().unwrap())).collect();
        assert!(bounds.len() > FULL_INTERVALS, "{label}: {} intervals; the four full ones and the last, partial one were expected: {bounds:?}", bounds.len());
        for pair in bounds.windows(2) {
            assert_eq!(pair[0].1, pair[1].0, "{label}: intervals are not back to back: {bounds:?}");
        }
        let last = bounds.last().unwrap();
        assert!(last.1 + 1 >= terminated, "{label}: the last interval ends at {}, before the SIGTERM at {terminated}", last.1);
        let want_name = format!("{label}{{env=ci,host={host},pid={pid},python_version={version}}}");
        let truth = read_json(truth);
        let total: f64 = ["sixty", "thirty", "ten"].iter().map(|f| truth[f].as_f64().unwrap()).sum();
        // Every interval cut by the clock (not the last, SIGTERM's).
        for (from, (meta, body)) in intervals.iter().take(bounds.len() - 1) {
            assert_eq!(meta["name"], want_name, "{label}");
            assert_eq!(meta["format"], "pprof");
            assert_eq!(meta["authorization"], "Bearer s3cret-token");
            assert_eq!(meta["tenant"], "team-a");
            let split = split_by_go_pprof(body, tmp.path());
            let n: f64 = split.values().sum();
            for f in ["sixty", "thirty", "ten"] {
                let share = split.get(f).copied().unwrap_or(0.0) / n.max(1.0);
                assert_share(&format!("{label} interval from {from}"), f, share, truth[f].as_f64().unwrap() / total, SHARE_POINTS, n, MIN_SAMPLES);
            }
        }
    }

    // OTLP over HTTP and over gRPC: the same intervals, as PyPI's
    // opentelemetry-proto decodes them.
    for (protocol, otlp_got) in [("HTTP", otlp_received(&otlp.dir)), ("gRPC", otlp_received(&grpc.dir.join("otlp")))] {
    assert_eq!(otlp_got.len(), got.len(), "the OTLP {protocol} receiver and the steady /ingest one got as many profiles");
    if protocol == "gRPC" {
        for p in &otlp_got {
            assert_eq!(p["metadata"], serde_json::json!({"authorization": "Bearer s3cret-token", "tenant": "team-a"}), "OTLP gRPC's metadata");
        }
    }
    for (label, pid, truth) in [("agent-split-a", pid_a, &truth_a), ("agent-split-b", pid_b, &truth_b)] {
        let mut mine: Vec<&serde_json::Value> = otlp_got.iter().filter(|p| p["attributes"]["service.name"] == label).collect();
        mine.sort_by_key(|p| p["time_unix_nano"].as_u64().unwrap());
        let pprof_intervals = intervals_of(&got, label);
        assert_eq!(mine.len(), pprof_intervals.len(), "{label}: OTLP and /ingest intervals");
        let truth = read_json(truth);
        let total: f64 = ["sixty", "thirty", "ten"].iter().map(|f| truth[f].as_f64().unwrap()).sum();
        for (i, p) in mine.iter().enumerate() {
            let a = &p["attributes"];
            assert_eq!((a["host.name"].as_str(), a["process.pid"].as_u64(), a["process.runtime.version"].as_str(), a["env"].as_str()), (Some(host.as_str()), Some(pid as u64), Some(version.as_str()), Some("ci")), "{label}: {a}");
            assert_eq!(p["sample_type"], serde_json::json!(["samples", "count"]));
            let start = p["time_unix_nano"].as_u64().unwrap();
            if let Some(next) = mine.get(i + 1) {
                let end = start + p["duration_nano"].as_u64().unwrap();
                let next_start = next["time_unix_nano"].as_u64().unwrap();
                assert!(end.abs_diff(next_start) < 1_000_000, "{label}: OTLP intervals are not back to back: {end} then {next_start}");
                let mut split: HashMap<&str, f64> = HashMap::new();
                for stack in p["stacks"].as_array().unwrap() {
                    let names: Vec<&str> = stack[0].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
                    if let Some(f) = names.iter().find(|n| ["sixty", "thirty", "ten"].contains(n)) {
                        *split.entry(f).or_insert(0.0) += stack[1].as_f64().unwrap();
                    }
                }
                let n: f64 = split.values().sum();
                for f in ["sixty", "thirty", "ten"] {
                    let share = split.get(f).copied().unwrap_or(0.0) / n.max(1.0);
                    assert_share(&format!("{label} OTLP {protocol} interval {i}"), f, share, truth[f].as_f64().unwrap() / total, SHARE_POINTS, n, MIN_SAMPLES);
                }
            }
        }
    }
    }

    // Parca: every interval of each service as WriteRaw series, labelled,
    // the tenant in the request and the metadata, the very pprof bodies
    // the steady receiver took (whose shares Go's pprof checked above).
    let parca_got = received_in(&grpc.dir.join("parca"));
    let mut parca_bodies: Vec<Vec<u8>> = parca_got.iter().map(|(_, b)| b.clone()).collect();
    parca_bodies.sort();
    let mut steady_bodies: Vec<Vec<u8>> = got.iter().map(|(_, b)| b.clone()).collect();
    steady_bodies.sort();
    assert!(parca_bodies == steady_bodies, "Parca's receiver has {} profiles, the steady one {}", parca_bodies.len(), steady_bodies.len());
    for (label, pid) in [("agent-split-a", pid_a), ("agent-split-b", pid_b)] {
        let mine: Vec<&serde_json::Value> = parca_got.iter().map(|(m, _)| m).filter(|m| m["labels"]["service_name"] == label).collect();
        assert_eq!(mine.len(), intervals_of(&got, label).len(), "{label}: Parca and /ingest intervals");
        for meta in mine {
            let want = serde_json::json!({"__name__": "process_cpu", "service_name": label, "env": "ci", "host": host, "pid": pid.to_string(), "python_version": version});
            assert_eq!(meta["labels"], want, "{label}: Parca's labels");
            assert_eq!(meta["tenant"], "team-a");
            // base64("agent:s3cret-token"), by Python's base64 module.
            assert_eq!(meta["metadata"], serde_json::json!({"authorization": "Basic YWdlbnQ6czNjcmV0LXRva2Vu", "tenant": "team-a"}));
            assert!(meta["pprof_bytes"].as_u64().unwrap() > 0);
        }
    }

    // The directory holds the very bodies the steady receiver took.
    let mut in_directory: Vec<Vec<u8>> = std::fs::read_dir(&profiles).unwrap().flatten().map(|e| std::fs::read(e.path()).unwrap()).collect();
    let mut bodies: Vec<Vec<u8>> = got.iter().map(|(_, b)| b.clone()).collect();
    in_directory.sort();
    bodies.sort();
    assert!(in_directory == bodies, "the directory has {} profiles, the steady receiver {}", in_directory.len(), bodies.len());

    // /metrics agreed with the receivers when scraped.
    assert_eq!(counted("steady") as usize, at_scrape.0, "{scraped:?}");
    assert_eq!(counted("outage") as usize, at_scrape.1, "{scraped:?}");
    assert_eq!(counted("small") as usize, at_scrape.2, "{scraped:?}");
    assert_eq!((counted("otlp-grpc") as usize, counted("parca") as usize), grpc_at_scrape, "{scraped:?}");
    assert!(scraped["pytrace_agent_push_failures_total{destination=\"outage\"}"] >= 2.0, "the outage was seen: {scraped:?}");
    // The sampler's own losses, by cause: each cause it counts is shown,
    // and (two services, a few stacks each) they are at most 1 % of the
    // samples.
    let mut lost = 0.0;
    for cause in ["lost", "counts_map_full", "unresolved_stacks", "profile_full"] {
        lost += scraped.get(&format!("pytrace_agent_samples_lost_total{{cause=\"{cause}\"}}")).copied().unwrap_or_else(|| panic!("no samples_lost_total for {cause}: {scraped:?}"));
    }
    assert!(lost <= 0.01 * scraped["pytrace_agent_samples_total"], "{lost} samples lost: {scraped:?}");

    // Prometheus scraped the same figures, which agree with the receivers.
    assert!(quiet_for < Duration::from_secs(INTERVAL_SECONDS - 2), "the Prometheus check took {quiet_for:?}, into the next interval");
    let prometheus_pushes: HashMap<String, f64> = by_prometheus.iter().map(|(m, v)| (m["destination"].as_str().unwrap().to_string(), *v)).collect();
    for (d, received) in [("steady", at_scrape.0), ("outage", at_scrape.1), ("small", at_scrape.2)] {
        assert_eq!(prometheus_pushes.get(d).copied(), Some(received as f64), "Prometheus's pushes_total for {d}: {by_prometheus:?}");
    }
    let prometheus_small_full = dropped_by_prometheus.iter().find(|(m, _)| m["destination"] == "small" && m["cause"] == "buffer_full").map(|(_, v)| *v);
    assert_eq!(prometheus_small_full, Some(dropped("small", "buffer_full")), "{dropped_by_prometheus:?}");

    // Down for two intervals with room for ten: nothing lost.
    let mut outage_bodies: Vec<Vec<u8>> = outage.received().into_iter().map(|(_, b)| b).collect();
    outage_bodies.sort();
    assert!(outage_bodies == bodies, "the outage receiver has {} profiles, the steady one {}", outage_bodies.len(), bodies.len());
    assert_eq!(dropped("outage", "buffer_full"), 0.0);
    // Room for one interval: the first interval's profiles were dropped,
    // exactly as many as /metrics says, and only those.
    let small_got = small.received();
    let missing = got.len() - small_got.len();
    assert!(missing > 0, "the one-interval buffer dropped nothing");
    assert_eq!(dropped("small", "buffer_full") as usize, missing, "{scraped:?}");
    let first_from = got.iter().map(|(m, _)| m["from"].as_str().unwrap().to_string()).min().unwrap();
    let small_first: Vec<_> = small_got.iter().filter(|(m, _)| m["from"].as_str().unwrap() == first_from).collect();
    assert!(small_first.is_empty(), "the small buffer delivered the first interval, which it should have dropped");
    assert_eq!(got.iter().filter(|(m, _)| m["from"].as_str().unwrap() == first_from).count(), missing);
}

/// A bad configuration is one sentence naming the cause, and exit 1,
/// before anything is sampled.
#[test]
fn a_bad_configuration_is_one_sentence() {
    let _machine = common::shared();
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("frequncy = 19\n", "unknown field `frequncy`"),
        ("[[destinations]]\nkind = \"kafka\"\n", "unknown destination kind \"kafka\""),
        ("[[destinations]]\nkind = \"pyroscope\"\nurl = \"http://127.0.0.1:1\"\nbearer_token_file = \"/nonexistent/token\"\n", "cannot read the secret file /nonexistent/token"),
        ("interval = \"fast\"\n[[destinations]]\nkind = \"directory\"\npath = \"/tmp/x\"\n", "interval \"fast\" is not a duration"),
        ("", "no destination is configured"),
        ("[metrics]\naddress = \"256.0.0.1:9465\"\n[[destinations]]\nkind = \"directory\"\npath = \"/tmp/x\"\n", "cannot serve /metrics on 256.0.0.1:9465"),
    ];
    for (text, want) in cases {
        let path = tmp.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        let out = Command::new(PYTRACE).args(["agent", "--config"]).arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{text:?}: one line expected: {stderr}");
        assert!(stderr.contains(want), "{text:?}: {stderr:?} should say {want:?}");
    }
}

/// SIGHUP reads the configuration again: its new destination takes the
/// next intervals; a bad file then changes nothing, says why, and the
/// agent goes on.
#[test]
fn sighup_reloads_the_configuration() {
    let _machine = common::shared();
    let tmp = tempfile::tempdir().unwrap();
    let (first, second) = (tmp.path().join("first"), tmp.path().join("second"));
    let config = |dir: &Path| format!("interval = \"1s\"\nfrequency = 97\n[[destinations]]\nkind = \"directory\"\npath = \"{}\"\n", dir.display());
    let config_path = tmp.path().join("agent.toml");
    std::fs::write(&config_path, config(&first)).unwrap();
    let truth = tmp.path().join("split.json");
    let (_service, _) = service("OTEL_SERVICE_NAME", "agent-reload", &truth, false);
    let agent = Agent::start(tmp.path());
    let files = |dir: &Path| std::fs::read_dir(dir).map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().contains("agent-reload")).count()).unwrap_or(0);
    let limit = Duration::from_secs(30);
    wait_until("a profile in the first directory", limit, || files(&first) > 0);
    std::fs::write(&config_path, config(&second)).unwrap();
    signal(agent.pid(), libc::SIGHUP);
    wait_until("a profile in the second directory", limit, || files(&second) > 0);
    assert!(agent.log().contains("configuration reloaded"), "{}", agent.log());
    // The first directory's destination was flushed and let go.
    let in_first = files(&first);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(files(&first), in_first, "the old destination still takes profiles");
    std::fs::write(&config_path, "frequncy = 3\n").unwrap();
    signal(agent.pid(), libc::SIGHUP);
    wait_until("the bad file is reported", limit, || agent.log().contains("the configuration was not reloaded"));
    let in_second = files(&second);
    wait_until("the agent going on with the second directory", limit, || files(&second) > in_second);
    agent.stop();
}

/// A private CA and a server certificate it signed, for 127.0.0.1, made
/// by openssl as an operator would (the CA's is what `ca_file` names).
struct Certificates {
    ca: PathBuf,
    server: PathBuf,
    key: PathBuf,
}

fn make_certificates(dir: &Path) -> Certificates {
    let at = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("run openssl (scripts/test-tools.sh installs it)");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(&[&["req", "-x509"][..], &p256, &["-keyout", &at("ca.key"), "-out", &at("ca.pem"), "-days", "2", "-subj", "/CN=pytrace test CA"]].concat());
    openssl(&[&["req"][..], &p256, &["-keyout", &at("server.key"), "-out", &at("server.csr"), "-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(dir.join("server.ext"), "subjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\nextendedKeyUsage = serverAuth\n").unwrap();
    openssl(&["x509", "-req", "-in", &at("server.csr"), "-CA", &at("ca.pem"), "-CAkey", &at("ca.key"), "-CAcreateserial", "-days", "2", "-extfile", &at("server.ext"), "-out", &at("server.pem")]);
    Certificates { ca: dir.join("ca.pem"), server: dir.join("server.pem"), key: dir.join("server.key") }
}

/// Every protocol over TLS to receivers whose certificate a private CA
/// signed: with `ca_file` naming that CA, each receiver (Python's ssl for
/// the two HTTP ones, grpcio's TLS for OTLP and Parca over gRPC) decodes
/// intervals of the service, labelled; a destination without `ca_file`
/// (its server's certificate then unknown to the webpki roots), over
/// HTTPS and over gRPC, gets nothing, and its failures are counted on
/// /metrics and said in a sentence that names the unknown CA and ca_file.
#[test]
fn tls_destinations_trust_their_ca_file_and_no_other() {
    let _machine = common::shared();
    let tmp = tempfile::tempdir().unwrap();
    let certificates = make_certificates(tmp.path());
    let tls = Some(&certificates);
    let ingest = Receiver::start_script(tmp.path().join("ingest"), false, PYTHON.into(), "pyroscope_ingest.py", tls);
    let untrusted = Receiver::start_script(tmp.path().join("untrusted"), false, PYTHON.into(), "pyroscope_ingest.py", tls);
    let otlp = Receiver::start_script(tmp.path().join("otlp"), false, receivers_python(), "otlp_profiles.py", tls);
    let grpc = Receiver::start_script(tmp.path().join("grpc"), false, receivers_python(), "grpc_profiles.py", tls);
    let untrusted_grpc = Receiver::start_script(tmp.path().join("untrusted-grpc"), false, receivers_python(), "grpc_profiles.py", tls);
    let metrics_port = free_port();
    let ca = certificates.ca.display();
    let config = format!(
        r#"
interval = "1s"
frequency = 97
[metrics]
address = "127.0.0.1:{metrics_port}"
[[destinations]]
kind = "pyroscope"
url = "https://127.0.0.1:{}"
ca_file = "{ca}"
[[destinations]]
kind = "otlp"
url = "https://127.0.0.1:{}"
ca_file = "{ca}"
[[destinations]]
kind = "otlp"
name = "otlp-grpc"
protocol = "grpc"
url = "https://127.0.0.1:{}"
ca_file = "{ca}"
[[destinations]]
kind = "parca"
url = "https://127.0.0.1:{}"
ca_file = "{ca}"
[[destinations]]
kind = "pyroscope"
name = "untrusted"
url = "https://127.0.0.1:{}"
retry_initial = "200ms"
retry_max = "1s"
[[destinations]]
kind = "parca"
name = "untrusted-grpc"
url = "https://127.0.0.1:{}"
retry_initial = "200ms"
retry_max = "1s"
"#,
        ingest.port, otlp.port, grpc.port, grpc.port, untrusted.port, untrusted_grpc.port
    );
    let config_path = tmp.path().join("agent.toml");
    std::fs::write(&config_path, config).unwrap();
    let truth = tmp.path().join("split.json");
    let (_service, pid) = service("OTEL_SERVICE_NAME", "agent-tls", &truth, false);
    let agent = Agent::start(tmp.path());

    let mine_at_ingest = || intervals_of(&ingest.received(), "agent-tls").len();
    let mine_over_otlp = |dir: &Path| otlp_received(dir).into_iter().filter(|p| p["attributes"]["service.name"] == "agent-tls").collect::<Vec<_>>();
    let mine_at_parca = || received_in(&grpc.dir.join("parca")).into_iter().filter(|(m, _)| m["labels"]["service_name"] == "agent-tls").count();
    wait_until("two intervals of the service at each TLS receiver", Duration::from_secs(60), || {
        mine_at_ingest() >= 2 && mine_over_otlp(&otlp.dir).len() >= 2 && mine_over_otlp(&grpc.dir.join("otlp")).len() >= 2 && mine_at_parca() >= 2
    });
    for (protocol, got) in [("HTTP", mine_over_otlp(&otlp.dir)), ("gRPC", mine_over_otlp(&grpc.dir.join("otlp")))] {
        for p in got {
            assert_eq!(p["attributes"]["process.pid"].as_u64(), Some(pid as u64), "OTLP over {protocol} with TLS: {p}");
        }
    }
    let scraped = scrape(metrics_port);
    for name in ["untrusted", "untrusted-grpc"] {
        let failures = scraped.get(&format!("pytrace_agent_push_failures_total{{destination=\"{name}\"}}")).copied().unwrap_or(0.0);
        assert!(failures >= 1.0, "{name}'s failures are not counted: {scraped:?}");
        let said: Vec<String> = agent.log().lines().filter(|l| l.contains(&format!("destination {name} "))).map(String::from).collect();
        assert!(said.iter().any(|l| l.contains("UnknownIssuer") && l.contains("ca_file")), "{name}'s failure does not say the certificate's CA is unknown: {said:?}");
    }
    assert!(untrusted.received().is_empty(), "a server whose certificate no trusted CA signed took a profile over HTTPS");
    assert!(received_in(&untrusted_grpc.dir.join("parca")).is_empty(), "a server whose certificate no trusted CA signed took a profile over gRPC");
    for name in ["pyroscope", "otlp", "otlp-grpc", "parca"] {
        let failed = scraped.get(&format!("pytrace_agent_push_failures_total{{destination=\"{name}\"}}")).copied().unwrap_or(0.0);
        assert_eq!(failed, 0.0, "{name} failed over TLS: {}", agent.log());
    }
    agent.stop();
}

/// `mode = "wall"`: every thread of a Python at each tick, under its
/// state, as an OTLP receiver decodes it (period type `wall`). The
/// fixture's two threads, one sleeping in 10 ms naps and one spinning,
/// each get half the samples (both are sampled at every tick); the
/// sleeper's are under its nap (`[released: clock_nanosleep]`) or its
/// wait for the GIL the spinner holds, running hardly ever (its own CPU
/// time, which the fixture writes, is about 1 % of the run); the
/// spinner's are never in a system call. At least 300 samples of the two.
#[test]
fn wall_mode_samples_every_thread_under_its_state() {
    let _machine = common::shared();
    let tmp = tempfile::tempdir().unwrap();
    let otlp = Receiver::start_otlp(tmp.path().join("otlp"));
    let config = format!("interval = \"2s\"\nfrequency = 97\nmode = \"wall\"\n[[destinations]]\nkind = \"otlp\"\nurl = \"http://127.0.0.1:{}\"\n", otlp.port);
    let config_path = tmp.path().join("agent.toml");
    std::fs::write(&config_path, config).unwrap();
    let cpu_times = tmp.path().join("cpu.json");
    let mut fixture = Proc(Command::new(PYTHON).arg(fixture("sleep_and_spin.py")).arg("12").arg(&cpu_times).env("OTEL_SERVICE_NAME", "agent-wall").stdout(Stdio::null()).spawn().unwrap());
    let agent = Agent::start(tmp.path());
    let mine = || otlp_received(&otlp.dir).into_iter().filter(|p| p["attributes"]["service.name"] == "agent-wall").collect::<Vec<_>>();
    wait_until("three wall intervals of the fixture", Duration::from_secs(60), || mine().len() >= 3);
    let profiles = mine();
    agent.stop();
    // Per thread (by its function), samples by root frame (the state).
    let mut by_state: HashMap<&str, HashMap<String, f64>> = HashMap::new();
    for p in &profiles {
        assert_eq!(p["period_type"], serde_json::json!(["wall", "nanoseconds"]), "{p}");
        for stack in p["stacks"].as_array().unwrap() {
            let names: Vec<&str> = stack[0].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
            let Some(thread) = ["sleeper", "spinner"].into_iter().find(|t| names.contains(t)) else { continue };
            *by_state.entry(thread).or_default().entry(names.last().unwrap().to_string()).or_insert(0.0) += stack[1].as_f64().unwrap();
        }
    }
    let total = |thread: &str| by_state.get(thread).map_or(0.0, |s| s.values().sum::<f64>());
    let share = |thread: &str, state: &dyn Fn(&str) -> bool| by_state.get(thread).map_or(0.0, |s| s.iter().filter(|(k, _)| state(k)).map(|(_, v)| v).sum::<f64>()) / total(thread).max(1.0);
    let (sleeper, spinner) = (total("sleeper"), total("spinner"));
    assert!(sleeper + spinner >= 300.0, "only {sleeper} + {spinner} samples: {by_state:?}");
    assert!((sleeper / (sleeper + spinner) - 0.5).abs() < 0.08, "wall time is not split between the threads: {by_state:?}");
    let napping = share("sleeper", &|s| s == "[released: clock_nanosleep]");
    let off_cpu = share("sleeper", &|s| s == "[released: clock_nanosleep]" || s == "[waiting for the GIL]");
    assert!(napping >= 0.25 && off_cpu >= 0.85, "the sleeper's states: {by_state:?}");
    assert!(fixture.0.wait().unwrap().success());
    let cpu_fraction = read_json(&cpu_times)["sleeper"].as_f64().unwrap() / 12.0;
    let running = share("sleeper", &|s| s.starts_with("[running"));
    assert!(running <= cpu_fraction + 0.05, "the sleeper ran {cpu_fraction:.3} of the time and is running in {running:.3} of its samples: {by_state:?}");
    let in_syscall = share("spinner", &|s| s.starts_with("[released: "));
    assert!(in_syscall <= 0.05, "the spinner's states: {by_state:?}");
}

/// `async_tasks = true` on Debian's 3.14 (in its own root, as a
/// container): fixtures/async_tasks.py's two tasks, as an OTLP receiver
/// decodes them, each spin under its task's name and awaiters (root
/// first: the task, `Task-1`, `main`, as `sample --async` puts them), and
/// the tasks' shares of those samples are their shares of the CPU time
/// the fixture measured (4 binomial standard errors plus 2 points; at
/// least 300 samples).
#[test]
fn async_tasks_put_samples_under_their_tasks() {
    let _machine = common::shared();
    let tmp = tempfile::tempdir().unwrap();
    let otlp = Receiver::start_otlp(tmp.path().join("otlp"));
    let config = format!("interval = \"2s\"\nfrequency = 499\nasync_tasks = true\n[[destinations]]\nkind = \"otlp\"\nurl = \"http://127.0.0.1:{}\"\n", otlp.port);
    let config_path = tmp.path().join("agent.toml");
    std::fs::write(&config_path, config).unwrap();
    let agent = Agent::start(tmp.path());
    wait_until("the agent samples", Duration::from_secs(60), || agent.log().contains("sampling every CPython process"));
    let py = common::matrix::Interpreter::debian("3.14");
    let (inside, truth_path) = py.output("async-truth.json");
    let argv = py.argv("async_tasks.py", &[&inside, &common::longer(6.0)]);
    let mut fixture = Proc(Command::new(&argv[0]).args(&argv[1..]).env("OTEL_SERVICE_NAME", "agent-async").stdout(Stdio::null()).spawn().unwrap());
    assert!(fixture.0.wait().unwrap().success(), "the fixture failed");
    let mine = || otlp_received(&otlp.dir).into_iter().filter(|p| p["attributes"]["service.name"] == "agent-async").collect::<Vec<_>>();
    // The fixture's last interval is cut at the next interval's end.
    std::thread::sleep(Duration::from_secs(3));
    agent.stop();
    let mut by_task: HashMap<&str, f64> = HashMap::new();
    for p in mine() {
        for stack in p["stacks"].as_array().unwrap() {
            let root_first: Vec<&str> = stack[0].as_array().unwrap().iter().rev().map(|n| n.as_str().unwrap()).collect();
            let Some(task) = [("alpha", "alpha_spin"), ("beta", "beta_spin")].into_iter().find(|(_, spin)| root_first.contains(spin)).map(|(t, _)| t) else { continue };
            let roots: Vec<&str> = root_first.iter().take_while(|n| n.starts_with('[')).copied().collect();
            assert_eq!(roots, [format!("[task {task}]"), "[awaited by task Task-1]".into(), "[awaited by task main]".into()], "{task}'s spin under other roots: {root_first:?}");
            *by_task.entry(task).or_insert(0.0) += stack[1].as_f64().unwrap();
        }
    }
    let truth: HashMap<String, f64> = serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    let n = by_task.values().sum::<f64>();
    assert!(n >= 300.0, "{n} samples of the tasks' spins: {by_task:?}");
    for task in ["alpha", "beta"] {
        let p = truth[task] / (truth["alpha"] + truth["beta"]);
        let share = by_task.get(task).copied().unwrap_or(0.0) / n;
        let bound = 4.0 * (p * (1.0 - p) / n).sqrt() + 0.02;
        assert!((share - p).abs() <= bound, "{task} has {share:.3} of the samples, {p:.3} of the CPU time (bound {bound:.3}): {by_task:?}");
    }
}
