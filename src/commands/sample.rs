//! `pytrace sample`: a statistical profile from a perf event on every CPU,
//! as a table, folded stacks, a flamegraph, speedscope or JSON.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::report::PythonInfo;
use crate::report::profile::Profile;
use crate::report::Output;
use crate::session::{self, Target, TargetSpec};
use crate::tracing::sample::{self, Options as SampleOptions};

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub hz: u64,
    pub kernel: bool,
    pub threads: bool,
    pub top: usize,
    pub flamegraph: Option<PathBuf>,
    pub folded: Option<PathBuf>,
    pub speedscope: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

/// The names of the target's threads, as far as /proc still knows them.
fn thread_names(pid: u32, names: &mut HashMap<u32, String>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else { continue };
        if let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) {
            names.insert(tid, comm.trim().to_string());
        }
    }
}

pub fn run(opts: Options) -> Result<i32> {
    // Every output is created before sampling starts, so a bad path fails now.
    let mut outputs: Vec<(&str, Output)> = Vec::new();
    for (kind, path) in [("flamegraph", &opts.flamegraph), ("folded", &opts.folded), ("speedscope", &opts.speedscope), ("json", &opts.json)] {
        if let Some(path) = path {
            outputs.push((kind, Output::create(path)?));
        }
    }
    let (mut target, python) = Target::prepare(opts.target)?;
    session::install_signal_handlers();

    let pid = target.pid;
    let progress = std::io::stderr().is_terminal();
    let mut names = HashMap::new();
    let mut last_report = Instant::now();
    let target_cell = std::cell::RefCell::new(&mut target);
    let data = sample::run(
        pid,
        &python,
        &SampleOptions { hz: opts.hz, kernel: opts.kernel },
        || {
            let mut target = target_cell.borrow_mut();
            target.release()?;
            target.say_attached(&python, "sample");
            Ok(())
        },
        |samples| {
            let mut target = target_cell.borrow_mut();
            if last_report.elapsed() >= Duration::from_millis(500) {
                last_report = Instant::now();
                if opts.threads {
                    thread_names(pid, &mut names);
                }
                if progress {
                    eprint!("\rpytrace sample: {samples} samples, {:.1} s ", target.elapsed().as_secs_f64());
                    let _ = std::io::stderr().flush();
                }
            }
            Ok(target.keep_going(opts.duration))
        },
    )?;
    if progress {
        eprintln!();
    }
    if opts.threads {
        thread_names(pid, &mut names);
    }
    let mut profile = Profile::new(
        pid,
        PythonInfo { version: python.version.to_string(), mode: "sample".into() },
        opts.hz,
        target.elapsed().as_nanos() as u64,
        data.counters.clone(),
        &data.samples,
        opts.threads.then_some(&names),
    );
    profile.bpf_ns_per_sample = data.bpf_ns_per_sample;
    let mut table_on_stdout = true;
    for (kind, out) in &mut outputs {
        let bytes = match *kind {
            "flamegraph" => profile.to_flamegraph()?,
            "folded" => profile.to_folded(false).into_bytes(),
            "speedscope" => profile.to_speedscope().into_bytes(),
            _ => profile.to_json().into_bytes(),
        };
        table_on_stdout &= !matches!(out, Output::Stdout);
        out.write_all(&bytes)?;
    }
    if table_on_stdout {
        print!("{}", profile.to_table(opts.top));
    }
    Ok(target.exit_status().unwrap_or(0))
}
