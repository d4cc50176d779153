//! The agent's own health, in Prometheus's text format on `/metrics`:
//! processes profiled, samples, profiles made, and per destination pushes,
//! failed attempts, what is buffered and what was dropped, by cause; the
//! agent's own CPU time and RSS. Counters are atomics the sampler and the
//! push threads add to; the server is one thread answering one request at
//! a time, each bounded in size and time.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

/// Why a profile never reached a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The buffer's cap (intervals or bytes) pushed it out.
    BufferFull,
    /// The destination refused it for good (an HTTP 4xx other than 429).
    Rejected,
    /// Still buffered when the shutdown's flush timeout ran out.
    Shutdown,
}

const CAUSES: [(Cause, &str); 3] = [(Cause::BufferFull, "buffer_full"), (Cause::Rejected, "rejected"), (Cause::Shutdown, "shutdown")];

pub struct DestinationMetrics {
    pub name: String,
    pub pushes: AtomicU64,
    pub failures: AtomicU64,
    dropped: [AtomicU64; 3],
    buffered: AtomicU64,
    buffered_bytes: AtomicU64,
}

impl DestinationMetrics {
    pub fn new(name: &str) -> Self {
        DestinationMetrics { name: name.to_string(), pushes: 0.into(), failures: 0.into(), dropped: Default::default(), buffered: 0.into(), buffered_bytes: 0.into() }
    }

    pub fn dropped(&self, cause: Cause, n: u64) {
        self.dropped[cause as usize].fetch_add(n, Relaxed);
    }

    pub fn dropped_by(&self, cause: Cause) -> u64 {
        self.dropped[cause as usize].load(Relaxed)
    }

    pub fn set_buffered(&self, items: usize, bytes: usize) {
        self.buffered.store(items as u64, Relaxed);
        self.buffered_bytes.store(bytes as u64, Relaxed);
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Processes with samples in the last interval.
    pub processes: AtomicU64,
    pub samples: AtomicU64,
    pub profiles: AtomicU64,
    /// The sampler's lost samples by cause (its counters of kind Lost),
    /// as of the last interval: counts since the agent started.
    pub samples_lost: Mutex<Vec<(&'static str, u64)>>,
    /// Replaced whole at a reload (the old destinations' counts go with them).
    pub destinations: Mutex<Vec<Arc<DestinationMetrics>>>,
}

impl Metrics {
    /// The text Prometheus scrapes.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, rows: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP pytrace_agent_{name} {help}\n# TYPE pytrace_agent_{name} {kind}");
            for (labels, value) in rows {
                let _ = writeln!(out, "pytrace_agent_{name}{labels} {value}");
            }
        };
        metric("processes_profiled", "gauge", "Python processes with samples in the last interval.", &[(String::new(), self.processes.load(Relaxed))]);
        metric("samples_total", "counter", "Samples counted in the profiles made.", &[(String::new(), self.samples.load(Relaxed))]);
        metric("profiles_total", "counter", "Profiles made (one per process and interval).", &[(String::new(), self.profiles.load(Relaxed))]);
        let lost: Vec<(String, u64)> = self.samples_lost.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(cause, n)| (format!("{{cause=\"{cause}\"}}"), *n)).collect();
        metric("samples_lost_total", "counter", "Samples taken and in no profile, by cause (the sampler's own counts).", &lost);
        let destinations = self.destinations.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let per = |f: &dyn Fn(&DestinationMetrics) -> u64| destinations.iter().map(|d| (format!("{{destination=\"{}\"}}", d.name), f(d))).collect::<Vec<_>>();
        metric("pushes_total", "counter", "Profiles a destination took.", &per(&|d| d.pushes.load(Relaxed)));
        metric("push_failures_total", "counter", "Push attempts that failed (each retry counts).", &per(&|d| d.failures.load(Relaxed)));
        metric("buffered_profiles", "gauge", "Profiles waiting in a destination's buffer.", &per(&|d| d.buffered.load(Relaxed)));
        metric("buffered_bytes", "gauge", "Bytes waiting in a destination's buffer.", &per(&|d| d.buffered_bytes.load(Relaxed)));
        let dropped: Vec<(String, u64)> = destinations
            .iter()
            .flat_map(|d| CAUSES.iter().map(move |(cause, name)| (format!("{{destination=\"{}\",cause=\"{name}\"}}", d.name), d.dropped_by(*cause))))
            .collect();
        metric("profiles_dropped_total", "counter", "Profiles that never reached a destination, by cause.", &dropped);
        let (cpu_ns, rss) = own_usage();
        let _ = writeln!(out, "# HELP process_cpu_seconds_total The agent's own CPU time, user and system.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {:.3}", cpu_ns as f64 / 1e9);
        let _ = writeln!(out, "# HELP process_resident_memory_bytes The agent's resident memory.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {rss}");
        out
    }
}

/// The agent's CPU time (ns) and resident bytes.
fn own_usage() -> (u64, u64) {
    let cpu = crate::process::proc::cpu_time_ns(std::process::id()).unwrap_or(0);
    // statm's second field: resident pages.
    let pages = std::fs::read_to_string("/proc/self/statm").ok().and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    (cpu, pages * page)
}

/// Binds `address` now (a bad or taken address fails the start) and
/// serves /metrics from a thread of its own.
pub fn serve(address: &str, metrics: Arc<Metrics>) -> Result<()> {
    let listener = TcpListener::bind(address).with_context(|| format!("cannot serve /metrics on {address}"))?;
    std::thread::Builder::new()
        .name("agent-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &metrics);
            }
        })
        .context("cannot start the /metrics thread")?;
    Ok(())
}

fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    // The request line and headers, at most 8 KiB; only the path matters.
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while request.len() < 8192 && !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(request.split(|&b| b == b'\r').next().unwrap_or_default()).into_owned();
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if line.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
        ("200 OK", metrics.render())
    } else {
        ("404 Not Found", "pytrace agent serves /metrics only\n".to_string())
    };
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}
