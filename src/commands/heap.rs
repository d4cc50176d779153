//! `pytrace heap`: a running process's live objects by type, read from
//! outside (src/session/heap.rs), once or every --interval, or the growth
//! between two saved reports (--diff); nothing is written into the target.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

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
        let at_s = started.elapsed().as_secs_f64();
        let unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let run = session::heap_census(&walk)?;
        version = run.version;
        snapshots.push(Snapshot { at_s, unix_s, census: run.census });
    }
    let report = HeapReport::new(opts.pid, version, snapshots, opts.by_module, opts.top);
    report::emit(json.as_mut(), || report.to_json(), || report.to_table())?;
    Ok(0)
}
