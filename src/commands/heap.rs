//! `pytrace heap`: a running process's live objects by type, read from
//! outside (src/session/heap.rs), once or every --interval, or the growth
//! between two saved reports (--diff); nothing is written into the target.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::report::heap::{read_saved, HeapReport, Snapshot};
use crate::report::{self, Output};
use crate::session::{self, HeapOptions};

pub struct Options {
    pub pid: u32,
    pub stop: bool,
    pub by_module: bool,
    pub interval: Option<Duration>,
    pub walks: u32,
    pub top: usize,
    pub timeout: Duration,
    pub json: Option<PathBuf>,
    /// Two saved reports to compare instead of walking.
    pub diff: Option<(PathBuf, PathBuf)>,
}

/// The command line as given, before it is checked.
pub struct Flags {
    pub pid: Option<u32>,
    /// A command after `--`: refused, heap reads a process that runs.
    pub command: Vec<String>,
    pub stop: bool,
    pub by_module: bool,
    pub interval: Option<f64>,
    pub count: Option<u32>,
    pub top: usize,
    pub timeout: f64,
    pub json: Option<PathBuf>,
    pub diff: Option<Vec<PathBuf>>,
}

impl Options {
    /// The flags checked together, each refusal one sentence naming the
    /// flag, before any process is looked at.
    pub fn from_flags(flags: Flags) -> Result<Options> {
        if !flags.command.is_empty() {
            bail!("pytrace heap reads a process that is already running: start the program, then give its PID with -p (a heap census of a command would have no moment to be taken at)");
        }
        let diff = match flags.diff {
            Some(files) => match <[PathBuf; 2]>::try_from(files) {
                Ok([a, b]) => Some((a, b)),
                Err(_) => bail!("--diff takes two saved reports: --diff A.json B.json"),
            },
            None => None,
        };
        let Some(pid) = flags.pid.or(diff.as_ref().map(|_| 0)) else {
            bail!("pytrace heap needs the PID of a running Python process: -p PID (or --diff A.json B.json)")
        };
        let valid = |s: f64| s.is_finite() && s > 0.0 && s <= 86400.0;
        if !valid(flags.timeout) {
            bail!("--timeout must be a number of seconds above 0 and at most a day");
        }
        if let Some(i) = flags.interval.filter(|&i| !valid(i)) {
            bail!("--interval must be a number of seconds above 0 and at most a day, not {i}");
        }
        let walks = flags.count.unwrap_or(if flags.interval.is_some() { 2 } else { 1 });
        if walks == 0 || walks > 10_000 {
            bail!("-n must be between 1 and 10000 walks");
        }
        if walks > 1 && flags.interval.is_none() {
            bail!("-n {walks} needs --interval SECONDS between the walks");
        }
        Ok(Options {
            pid,
            stop: flags.stop,
            by_module: flags.by_module,
            interval: flags.interval.map(Duration::from_secs_f64),
            walks,
            top: flags.top,
            timeout: Duration::from_secs_f64(flags.timeout),
            json: flags.json,
            diff,
        })
    }
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    if let Some((a, b)) = &opts.diff {
        let ((_, _, mut first), (pid, version, mut last)) = (read_saved(a)?, read_saved(b)?);
        first.at_s = 0.0;
        last.at_s = last.unix_s - first.unix_s;
        if last.at_s <= 0.0 {
            anyhow::bail!("{} was not taken after {}: --diff takes the earlier report first", b.display(), a.display());
        }
        let report = HeapReport::new(pid, version, vec![first, last], opts.by_module, opts.top);
        report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
        return Ok(0);
    }
    let walk = HeapOptions { pid: opts.pid, stop: opts.stop, timeout: opts.timeout };
    let started = Instant::now();
    let mut snapshots = Vec::new();
    let mut version = String::new();
    for i in 0..opts.walks {
        if let Some(interval) = opts.interval.filter(|_| i > 0) {
            std::thread::sleep((started + interval * i).saturating_duration_since(Instant::now()));
        }
        let run = session::heap_census(&walk)?;
        let unix_s = run.started_at.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let at_s = snapshots.first().map_or(0.0, |first: &Snapshot| unix_s - first.unix_s);
        version = run.version;
        snapshots.push(Snapshot { at_s, unix_s, census: run.census });
    }
    let report = HeapReport::new(opts.pid, version, snapshots, opts.by_module, opts.top);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Flags {
        Flags { pid: Some(7), command: vec![], stop: false, by_module: false, interval: None, count: None, top: 30, timeout: 60.0, json: None, diff: None }
    }

    fn refusal(flags: Flags) -> String {
        format!("{:#}", Options::from_flags(flags).err().expect("refused"))
    }

    /// Each bad combination is refused in a sentence that names it; the
    /// walks default to 1, or 2 with --interval.
    #[test]
    fn flags_are_checked_together() {
        assert_eq!(Options::from_flags(flags()).unwrap().walks, 1);
        assert_eq!(Options::from_flags(Flags { interval: Some(5.0), ..flags() }).unwrap().walks, 2);
        assert!(refusal(Flags { command: vec!["python3".into()], ..flags() }).contains("already running"));
        assert!(refusal(Flags { pid: None, ..flags() }).contains("needs the PID"));
        assert_eq!(Options::from_flags(Flags { pid: None, diff: Some(vec!["a.json".into(), "b.json".into()]), ..flags() }).unwrap().diff, Some(("a.json".into(), "b.json".into())));
        for timeout in [0.0, -1.0, f64::NAN, 1e9] {
            assert!(refusal(Flags { timeout, ..flags() }).contains("--timeout must be"), "{timeout}");
        }
        assert!(refusal(Flags { interval: Some(f64::INFINITY), ..flags() }).contains("--interval must be"));
        assert!(refusal(Flags { count: Some(0), ..flags() }).contains("-n must be between"));
        assert!(refusal(Flags { count: Some(3), ..flags() }).contains("-n 3 needs --interval"));
    }
}
