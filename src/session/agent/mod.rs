//! `pytrace agent`: always-on profiling of every CPython on the host,
//! pushed where the fleet's profiles already go. It is `sample --all`
//! run for as long as the agent runs, in rounds like `top`'s: every
//! `interval` the samples counted since the last cut become one pprof
//! profile per process, labelled, and handed to each destination's
//! buffer; each destination pushes from its own thread. SIGTERM cuts the
//! last (partial) interval, flushes and exits; SIGHUP reloads the
//! configuration.
//!
//! It lives in `session/` because it is a run's lifecycle (the sampler's
//! start, its rounds, its end, the flush), as `top` is; the profile's
//! encoding stays in `report/`.

pub mod config;
mod buffer;
mod export;
mod intervals;
mod labels;
mod metrics;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;

use super::{preflight, Live};
use crate::model::counters::Counters;
use crate::model::samples::Sample;
use crate::report::profile::otlp::Attribute;
use crate::report::profile::Profile;
use crate::report::PythonInfo;
use crate::tracing::sample::{self, Options, Targets};
use config::{Config, Overrides};
use export::Running;
use metrics::Metrics;

/// One process's profile for one interval, as every destination gets it.
pub struct Exported {
    /// Which interval (counted from 1): a buffer's cap is in intervals.
    pub interval: u64,
    /// "cpu" or "wall" (config::Clock::time_type).
    pub time: &'static str,
    pub pid: u32,
    pub service: String,
    /// Every label: the process's, then the configuration's static ones.
    pub labels: BTreeMap<String, String>,
    pub start_unix_ns: i64,
    pub end_unix_ns: i64,
    /// Gzipped pprof.
    pub pprof: Vec<u8>,
    /// An OTLP ExportProfilesServiceRequest, made if a destination speaks OTLP.
    pub otlp: Option<Vec<u8>>,
}

impl Exported {
    /// What it holds, for the buffers' byte caps.
    pub fn bytes(&self) -> usize {
        self.pprof.len() + self.otlp.as_ref().map_or(0, Vec::len)
    }
}

/// Set by SIGHUP.
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn request_reload(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// SIGHUP reloads rather than stops (installed after the run's own
/// handlers, which stop on it).
fn reload_on_sighup() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = request_reload as *const () as usize;
        libc::sigaction(libc::SIGHUP, &action, std::ptr::null_mut());
    }
}

fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Runs the agent until SIGTERM or Ctrl-C. Config errors and an address
/// that cannot be served fail here, before anything is sampled.
pub fn run(path: Option<PathBuf>, flags: Overrides) -> Result<i32> {
    let config = Config::load(path.as_deref(), &flags)?;
    preflight()?;
    if config.clock == config::Clock::Wall {
        crate::kernel::Kernel::get().require(crate::kernel::Feature::CopyFromUserTask, "agent mode = \"wall\"")?;
    }
    let metrics = Arc::new(Metrics::default());
    if let Some(address) = &config.metrics_address {
        metrics::serve(address, metrics.clone())?;
    }
    let mut agent = Agent::start(config, path, flags, metrics)?;
    let live = Live::everywhere(None);
    reload_on_sighup();
    let wall = agent.config.clock == config::Clock::Wall;
    let opts = Options { hz: agent.config.hz, kernel: false, idle: wall, native: false, threads: false, gil: false, states: wall, async_tasks: agent.config.async_tasks };
    let plan = sample::Plan { targets: Targets::All, opts: &opts };
    let data = live.run(
        plan,
        |_, target| target.release(),
        |session| {
            agent.round(session)?;
            Ok(true)
        },
        |_, _| {},
    );
    // The last, partial interval, then the flush: even if sampling failed.
    let failed = match data {
        Ok(data) => {
            agent.count_lost(&data.counters);
            agent.cut(data.samples);
            None
        }
        Err(e) => Some(e),
    };
    agent.finish();
    match failed {
        Some(e) => Err(e),
        None => Ok(0),
    }
}

struct Agent {
    config: Config,
    path: Option<PathBuf>,
    flags: Overrides,
    metrics: Arc<Metrics>,
    destinations: Vec<Running>,
    labels: labels::LabelCache,
    versions: HashMap<u32, String>,
    /// When the current interval began.
    since: (Instant, SystemTime),
    /// Intervals cut so far.
    cuts: u64,
    /// Whether a round ran: the first interval begins there, once the
    /// sampler is attached (attaching takes a second or two, unsampled).
    rounds_began: bool,
}

impl Agent {
    fn start(config: Config, path: Option<PathBuf>, flags: Overrides, metrics: Arc<Metrics>) -> Result<Agent> {
        let destinations = start_destinations(&config, &metrics)?;
        Ok(Agent {
            config,
            path,
            flags,
            metrics,
            destinations,
            labels: labels::LabelCache::new(),
            versions: HashMap::new(),
            since: (Instant::now(), SystemTime::now()),
            cuts: 0,
            rounds_began: false,
        })
    }

    /// Between the sampler's polls: a reload if asked, a cut if due.
    fn round(&mut self, session: &sample::Session) -> Result<()> {
        if !self.rounds_began {
            self.rounds_began = true;
            self.since = (Instant::now(), SystemTime::now());
        }
        if RELOAD.swap(false, Ordering::SeqCst) {
            self.reload();
        }
        // Labels are read as a process is found, not at the cut: one that
        // lives a second still has its command line read.
        for (pid, version) in session.python_versions() {
            if let std::collections::hash_map::Entry::Vacant(e) = self.versions.entry(pid) {
                self.labels.get(pid, &version);
                e.insert(version);
            }
        }
        if self.since.0.elapsed() >= self.config.interval {
            self.count_lost(&session.counters()?);
            self.cut(session.take_samples()?);
        }
        Ok(())
    }

    /// The sampler's lost samples, by cause, for /metrics.
    fn count_lost(&self, counters: &Counters) {
        let lost = counters.of_kind(crate::model::counters::Kind::Lost).map(|c| (c.name, c.value)).collect();
        *self.metrics.samples_lost.lock().unwrap_or_else(|p| p.into_inner()) = lost;
    }

    /// Ends the interval at now: one profile per process with samples in
    /// it, to every destination.
    fn cut(&mut self, samples: Vec<Sample>) {
        let (end, end_wall) = (Instant::now(), SystemTime::now());
        let duration_ns = end.duration_since(self.since.0).as_nanos() as u64;
        let start_unix_ns = unix_ns(self.since.1);
        self.since = (end, end_wall);
        self.cuts += 1;
        let by_pid = intervals::by_process(samples);
        self.metrics.processes.store(by_pid.len() as u64, Ordering::Relaxed);
        let in_cut: Vec<u32> = by_pid.keys().copied().collect();
        for (pid, samples) in by_pid {
            let version = self.versions.get(&pid).cloned().unwrap_or_else(|| "unknown".into());
            let process = self.labels.get(pid, &version).clone();
            let mut labels = process.labels;
            for (k, v) in &self.config.labels {
                labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            let count: u64 = samples.iter().map(|s| s.count).sum();
            let profile = Profile::new(pid, PythonInfo { version, mode: "agent".into() }, self.config.hz, duration_ns, Counters::default(), &samples, None);
            let time = self.config.clock.time_type();
            let pprof = match profile.to_pprof_from(time, start_unix_ns) {
                Ok(p) => p,
                Err(e) => {
                    crate::console::err(&format!("pytrace agent: could not encode the profile of PID {pid}: {e:#}\n"));
                    continue;
                }
            };
            let otlp = self.config.destinations.iter().any(|d| matches!(d.kind, config::DestinationKind::Otlp(..))).then(|| profile.to_otlp(time, start_unix_ns, &resource_attributes(&labels)));
            self.metrics.samples.fetch_add(count, Ordering::Relaxed);
            self.metrics.profiles.fetch_add(1, Ordering::Relaxed);
            let exported = Arc::new(Exported { interval: self.cuts, time, pid, service: process.service, labels, start_unix_ns, end_unix_ns: unix_ns(end_wall), pprof, otlp });
            for destination in &self.destinations {
                destination.buffer.push(exported.clone());
            }
        }
        // A process that exited is forgotten one cut after its last
        // samples: those the sampler read after its exit still get its labels.
        let keep = |pid: u32| in_cut.contains(&pid) || crate::process::proc::exists(pid);
        self.labels.prune(keep);
        self.versions.retain(|&pid, _| keep(pid));
    }

    /// SIGHUP: the file read again; its destinations replace the old ones
    /// (which flush in the background), its interval and labels apply from
    /// the next cut. A bad file changes nothing and says why.
    fn reload(&mut self) {
        let config = match Config::load(self.path.as_deref(), &self.flags) {
            Ok(c) => c,
            Err(e) => {
                crate::console::err(&format!("pytrace agent: the configuration was not reloaded: {e:#}\n"));
                return;
            }
        };
        let destinations = match start_destinations(&config, &self.metrics) {
            Ok(d) => d,
            Err(e) => {
                crate::console::err(&format!("pytrace agent: the configuration was not reloaded: {e:#}\n"));
                return;
            }
        };
        if config.hz != self.config.hz {
            crate::console::err(&format!("pytrace agent: the frequency stays {} Hz until a restart\n", self.config.hz));
        }
        if (config.clock, config.async_tasks) != (self.config.clock, self.config.async_tasks) {
            crate::console::err("pytrace agent: mode and async_tasks stay as they were until a restart\n");
        }
        let old = std::mem::replace(&mut self.destinations, destinations);
        let deadline = Instant::now() + self.config.flush_timeout;
        let _ = std::thread::Builder::new().name("agent-old".into()).spawn(move || finish_all(old, deadline));
        self.config = Config { hz: self.config.hz, clock: self.config.clock, async_tasks: self.config.async_tasks, ..config };
        crate::console::err("pytrace agent: configuration reloaded\n");
    }

    /// Flushes every destination at once, for at most flush_timeout.
    fn finish(self) {
        finish_all(self.destinations, Instant::now() + self.config.flush_timeout);
    }
}

/// Labels as OpenTelemetry's resource attributes, under its semantic
/// conventions' names where one exists (static labels as they are).
fn resource_attributes(labels: &BTreeMap<String, String>) -> Vec<(String, Attribute)> {
    let mut out = vec![("process.runtime.name".to_string(), Attribute::Text("cpython".into()))];
    for (key, value) in labels {
        let (key, value) = match key.as_str() {
            "service_name" => ("service.name", Attribute::Text(value.clone())),
            "host" => ("host.name", Attribute::Text(value.clone())),
            "pid" => ("process.pid", Attribute::Int(value.parse().unwrap_or(0))),
            "python_version" => ("process.runtime.version", Attribute::Text(value.clone())),
            "container_id" => ("container.id", Attribute::Text(value.clone())),
            "pod_uid" => ("k8s.pod.uid", Attribute::Text(value.clone())),
            other => (other, Attribute::Text(value.clone())),
        };
        out.push((key.to_string(), value));
    }
    out
}

fn start_destinations(config: &Config, metrics: &Metrics) -> Result<Vec<Running>> {
    let destinations = config.destinations.iter().map(Running::start).collect::<Result<Vec<_>>>()?;
    *metrics.destinations.lock().unwrap_or_else(|p| p.into_inner()) = destinations.iter().map(|d| d.metrics.clone()).collect();
    Ok(destinations)
}

fn finish_all(destinations: Vec<Running>, deadline: Instant) {
    for d in &destinations {
        d.buffer.shut_down(deadline);
    }
    for d in destinations {
        d.finish(deadline);
    }
}
