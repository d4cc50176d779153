//! The command line. Arguments stop here: each subcommand gets a plain
//! options struct and never sees clap.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::commands;
use crate::report::calls::SortKey;
use crate::session::{LaunchCommand, TargetSpec};
use crate::tracing::calls::Mode;

const EXAMPLES: &str = "\
Examples:
  pytrace calls -p 1234 -d 10            exact call counts and latencies for 10 s
  pytrace calls --top 20 -- python3 app.py
  pytrace calls -p 1234 --json calls.json
  pytrace sample -p 1234 -d 30 --flamegraph out.svg
  pytrace compare -p 1234 -d 10 -r 999     exact and sampled shares side by side
  pytrace gc -p 1234 --events             a line per garbage collection, then a summary
  pytrace gil -p 1234 -d 10               per thread: time holding, waiting for and without the GIL
  pytrace imports -- python3 app.py       which imports make start-up slow
  pytrace info -p 1234                    what pytrace finds in the process
  pytrace info                            what this kernel lets pytrace do
  pytrace top -p 1234                     a live view, like top (q quits)
  pytrace dump -p 1234                    every thread's stack right now
  pytrace restore -p 1234                 put back an eval-frame hook a killed run left set
  pytrace heap -p 1234 --stop             the live objects by type, the process held still
  pytrace heap -p 1234 --interval 30 -n 5 which types grow";

#[derive(Parser)]
#[command(name = "pytrace", version, about = "See what a running CPython process does, from outside it, with eBPF", after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Exact call counts, total and self time, and latency percentiles per Python function
    Calls(CallsArgs),
    /// Every garbage collection: pauses and objects collected per generation
    Gc(GcArgs),
    /// Per thread: time holding the GIL, waiting for it and running without it; waits' distribution
    Gil(GilArgs),
    /// Every module import as a tree with self and cumulative time
    Imports(ImportsArgs),
    /// A statistical profile of where the target spends CPU time: table, flamegraph, folded, speedscope
    Sample(SampleArgs),
    /// Calls and sample on one target at once (or two saved reports), compared per function
    Compare(CompareArgs),
    /// What pytrace finds in a Python process or binary, and which mode it would use; what this kernel allows
    Info(InfoArgs),
    /// A live view of the functions using CPU now, like py-spy top (q quits)
    Top(TopArgs),
    /// Every thread's stack at this instant, like py-spy dump (nothing is written into the target)
    Dump(DumpArgs),
    /// Put back a process's eval-frame hook that a pytrace run left set (see `info`)
    Restore(RestoreArgs),
    /// The JSON Schema of a report kind's --json output (docs/schema/KIND.json)
    #[command(hide = true)]
    Schema(SchemaArgs),
    /// The bytes each Python stack made the heap grow by and still holds, sampled by bytes
    Memory(MemoryArgs),
    /// The live objects by type (count, bytes, share), read from outside; which types grow
    Heap(HeapArgs),
    /// Always-on profiling of every CPython on the host, pushed every interval to Pyroscope, OTLP or a directory, with /metrics
    Agent(AgentArgs),
}

#[derive(Args)]
struct TargetArgs {
    /// PID of the Python process to trace
    #[arg(short, long, conflicts_with = "command", allow_negative_numbers = true)]
    pid: Option<u32>,
    /// Stop after this many seconds (default: until the target exits or Ctrl-C)
    // Negative numbers are taken as values, so `-d -5` gets the sentence
    // below instead of clap's tip to write `-- -5` (which would start -5).
    #[arg(short, long, value_name = "SECONDS", allow_negative_numbers = true)]
    duration: Option<f64>,
    /// With -- COMMAND: leave the command running when pytrace stops first (by default it gets SIGINT, then SIGTERM, then SIGKILL)
    #[arg(long, requires = "command")]
    keep_running: bool,
    /// Start this command and trace it from its first Python instruction
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// The sampler's rate, as `sample`, `compare` and `top` take it: declared
/// and range-checked here once, so the three cannot drift apart.
#[derive(Args)]
struct RateArg {
    /// Samples per second per CPU (99 does not beat in step with timer ticks)
    #[arg(short = 'r', long = "rate", value_name = "HZ", default_value_t = 99, allow_negative_numbers = true)]
    rate: u64,
}

impl RateArg {
    /// The rate, or why it cannot be one.
    fn hz(&self) -> Result<u64> {
        if !(1..=10_000).contains(&self.rate) {
            bail!("--rate must be between 1 and 10000 samples per second");
        }
        Ok(self.rate)
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Auto,
    Usdt,
    Uprobe,
}

#[derive(Clone, Copy, ValueEnum)]
enum GcModeArg {
    Auto,
    Usdt,
    Watchpoint,
}

#[derive(Clone, Copy, ValueEnum)]
enum SortArg {
    Calls,
    Total,
    #[value(name = "self")]
    SelfTime,
}

#[derive(Args)]
struct CallsArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// How to see calls: CPython's USDT probes or uprobes on the interpreter
    #[arg(long, value_enum, default_value = "auto")]
    mode: ModeArg,
    /// Show only the first N functions
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    top: Option<usize>,
    /// Order of the rows
    #[arg(long, value_enum, default_value = "total")]
    sort: SortArg,
    /// Also write the report as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also write a gzipped pprof profile: a one-frame sample per function,
    /// valued in calls and self nanoseconds (go tool pprof -top reads it)
    #[arg(long, value_name = "FILE.pb.gz")]
    pprof: Option<PathBuf>,
    /// Also write cProfile's stats file, with every caller->callee edge
    /// (pstats.Stats, python -m pstats, snakeviz and gprof2dot read it)
    #[arg(long, value_name = "FILE.prof")]
    pstats: Option<PathBuf>,
    /// For scripts/bench.sh: attach probes that do nothing (uprobe mode, -p),
    /// to measure the kernel's own cost of a probe hit
    #[arg(long, hide = true)]
    empty_probe: bool,
}

#[derive(Args)]
struct GcArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Print one line per collection as it happens (time, generation, pause, collected)
    #[arg(long)]
    events: bool,
    /// How to see collections: CPython's USDT probes, or a hardware
    /// watchpoint on the collector's state (any build; the default without probes)
    #[arg(long, value_enum, default_value = "auto")]
    mode: GcModeArg,
    /// Also write the summary as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct GilArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Also write the report as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct ImportsArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Show only the N slowest top-level imports
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    top: Option<usize>,
    /// How to see imports: CPython's USDT probes, or a uprobe on the eval
    /// function (any build; the default without probes)
    #[arg(long, value_enum, default_value = "auto")]
    mode: ModeArg,
    /// Also write the tree as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct MemoryArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Keep one event per SIZE bytes on average (an event of b bytes is
    /// kept with probability 1 - e^(-b/SIZE)); smaller is finer and costs more
    #[arg(long, value_name = "BYTES", default_value_t = crate::tracing::memory::DEFAULT_EVERY)]
    every: u64,
    /// Read the live view every SECONDS while the target runs (the last
    /// read is the report's if the target exits by itself)
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    interval: f64,
    /// Rows in the terminal table
    #[arg(long, value_name = "N", default_value_t = 20, allow_negative_numbers = true)]
    top: usize,
    /// Also count every allocation's bytes per stack, freed or not (the
    /// churn view): a probe on each object allocation, which costs more
    #[arg(long)]
    allocations: bool,
    /// Write the report as JSON ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write folded stacks weighted by live bytes, one `frame;frame;... bytes` a line
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// Write an SVG flamegraph of the live bytes
    #[arg(long, value_name = "FILE.svg")]
    flamegraph: Option<PathBuf>,
    /// Write a speedscope profile of the live bytes (https://www.speedscope.app)
    #[arg(long, value_name = "FILE.json")]
    speedscope: Option<PathBuf>,
    /// Write a gzipped pprof heap profile (alloc_objects, alloc_space,
    /// inuse_objects, inuse_space: go tool pprof, Pyroscope, Parca)
    #[arg(long, value_name = "FILE.pb.gz")]
    pprof: Option<PathBuf>,
}

#[derive(Args)]
struct SampleArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Sample every CPython process on the machine (one BPF program for all)
    #[arg(long, conflicts_with_all = ["pid", "command"])]
    all: bool,
    #[command(flatten)]
    rate: RateArg,
    /// Add kernel frames under the Python frames
    #[arg(long)]
    kernel: bool,
    /// Put native frames (C extensions, libpython, libc) between the Python frames
    #[arg(long)]
    native: bool,
    /// Wall-clock view: sample every thread at each tick, on CPU or not (waiting, sleeping)
    #[arg(long, conflicts_with = "kernel")]
    idle: bool,
    /// Split stacks by thread (name and TID)
    #[arg(long)]
    threads: bool,
    /// Only samples where the thread holds the GIL (what runs Python code,
    /// not what waits for the GIL or runs C code that released it)
    #[arg(long)]
    gil: bool,
    /// With --idle: put each sample under its thread's state, as the root
    /// frame: running (GIL held or released), waiting for the GIL, or
    /// released (in a named system call)
    #[arg(long, requires = "idle")]
    states: bool,
    /// CPython 3.14+: put each sample of a thread running an asyncio task
    /// under the task's name, then the tasks awaiting it, as root frames
    #[arg(long = "async")]
    async_tasks: bool,
    /// A frame per line running in folded stacks, the flamegraph and
    /// speedscope (default: one frame per function)
    #[arg(long)]
    lines: bool,
    /// Files as the interpreter names them (default: shortened, from
    /// site-packages, the standard library or the working directory)
    #[arg(long)]
    full_paths: bool,
    /// Rows in the terminal table
    #[arg(long, value_name = "N", default_value_t = 20, allow_negative_numbers = true)]
    top: usize,
    /// Write an SVG flamegraph (Python frames green, native aqua, kernel orange)
    #[arg(long, value_name = "FILE.svg")]
    flamegraph: Option<PathBuf>,
    /// Write folded stacks, one `frame;frame;... count` per line ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// Write a speedscope profile (https://www.speedscope.app)
    #[arg(long, value_name = "FILE.json")]
    speedscope: Option<PathBuf>,
    /// Write a gzipped pprof profile (go tool pprof, Pyroscope, Parca, Grafana)
    #[arg(long, value_name = "FILE.pb.gz")]
    pprof: Option<PathBuf>,
    /// Write the summary as JSON ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
#[command(after_help = "\
Examples:
  pytrace compare -p 1234 -d 10 -r 999
  pytrace compare --json cmp.json --traced-json calls.json --sampled-json sample.json -- python3 app.py
  pytrace compare --traced calls.json --sampled sample.json")]
struct CompareArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    rate: RateArg,
    /// Rows in the terminal table
    #[arg(long, value_name = "N", default_value_t = 25, allow_negative_numbers = true)]
    top: usize,
    /// Write the comparison as JSON ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also write the calls report compared, as `pytrace calls --json` would
    #[arg(long, value_name = "FILE")]
    traced_json: Option<PathBuf>,
    /// Also write the sample report compared, as `pytrace sample --json` would
    #[arg(long, value_name = "FILE")]
    sampled_json: Option<PathBuf>,
    /// Compare saved reports instead: this one from `pytrace calls --json`...
    #[arg(long, value_name = "CALLS.json", requires = "sampled", conflicts_with_all = ["pid", "command", "duration", "traced_json", "sampled_json"])]
    traced: Option<PathBuf>,
    /// ...and this one from `pytrace sample --json`
    #[arg(long, value_name = "SAMPLE.json", requires = "traced")]
    sampled: Option<PathBuf>,
}

#[derive(Args)]
struct InfoArgs {
    /// PID of a Python process (with neither this nor --binary: the kernel only)
    #[arg(short, long, conflicts_with = "binary", allow_negative_numbers = true)]
    pid: Option<u32>,
    /// A Python executable or libpython, inspected on disk
    #[arg(long, value_name = "PATH")]
    binary: Option<PathBuf>,
    /// Write the findings as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct TopArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    rate: RateArg,
    /// Exact calls per second, self time and latency percentiles from
    /// tracing every call (as `pytrace calls` does) instead of sampling
    #[arg(long, conflicts_with = "rate")]
    calls: bool,
    /// asyncio (CPython 3.14+): each asyncio task a row of its own, the
    /// share of the samples its code ran in (`[task NAME]`), beside the functions
    #[arg(long = "async", conflicts_with = "calls")]
    async_tasks: bool,
    /// Per Python stack, the bytes live now and grown since the start, as
    /// `pytrace memory` measures them, instead of sampling
    #[arg(long, conflicts_with_all = ["rate", "calls", "async_tasks"])]
    memory: bool,
    /// With --memory: keep one event per SIZE bytes on average, as `pytrace
    /// memory --every` does [default: 524288]
    #[arg(long, value_name = "BYTES")]
    every: Option<u64>,
}

#[derive(Args)]
struct DumpArgs {
    /// PID of the Python process
    #[arg(short, long, allow_negative_numbers = true)]
    pid: u32,
    /// Add each thread's native (C) frames between the Python ones
    #[arg(long)]
    native: bool,
    /// asyncio (CPython 3.14+): each thread's running task and its awaiters, and every pending task
    #[arg(long = "async")]
    async_tasks: bool,
    /// Write the stacks as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct HeapArgs {
    /// PID of the Python process
    #[arg(short, long, allow_negative_numbers = true)]
    pid: Option<u32>,
    /// Hold every thread of the target still during each walk (ptrace), for an exact snapshot
    #[arg(long)]
    stop: bool,
    /// Group the rows by the module that defines each type
    #[arg(long)]
    by_module: bool,
    /// Walk every SECONDS and show which types grew (with -n)
    #[arg(long, value_name = "SECONDS")]
    interval: Option<f64>,
    /// How many walks (default 1; 2 with --interval)
    #[arg(short = 'n', long = "count", value_name = "K")]
    count: Option<u32>,
    /// Rows shown in the table
    #[arg(long, default_value_t = 30)]
    top: usize,
    /// A walk that takes longer than SECONDS ends there, marked partial
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    timeout: f64,
    /// Write the census as JSON to FILE ("-" for standard output)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Which types grew between two saved `heap --json` reports (the earlier first)
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"], conflicts_with_all = ["pid", "stop", "interval", "count"])]
    diff: Option<Vec<PathBuf>>,
    /// Not taken: heap reads a process that runs (-p)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    command: Vec<String>,
}

#[derive(Args)]
struct RestoreArgs {
    /// PID of the Python process whose interp->eval_frame pytrace left set
    #[arg(short, long, allow_negative_numbers = true)]
    pid: u32,
}

#[derive(Args)]
struct SchemaArgs {
    /// The report kind: calls, compare, dump, gc, gil, imports, info or sample
    kind: String,
}

#[derive(Args)]
struct AgentArgs {
    /// The configuration file (TOML, docs/commands/agent.md); flags override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Samples per second (default 19)
    #[arg(long, value_name = "HZ")]
    frequency: Option<u64>,
    /// Seconds each exported profile covers (default 15)
    #[arg(long, value_name = "SECONDS")]
    interval: Option<f64>,
    /// Serve Prometheus metrics at http://ADDRESS/metrics (like 127.0.0.1:9465)
    #[arg(long, value_name = "ADDRESS")]
    metrics_address: Option<String>,
}

/// The longest --duration: a year. Longer ones would overflow the clock
/// arithmetic of a deadline (1e20 s does), and a run meant to last that
/// long is one without -d.
const MAX_DURATION_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

impl TargetArgs {
    fn into_parts(self) -> Result<(TargetSpec, Option<Duration>)> {
        let duration = match self.duration {
            Some(s) if !(s > 0.0 && s <= MAX_DURATION_SECONDS) => {
                bail!("--duration must be a positive number of seconds, at most {MAX_DURATION_SECONDS} (a year; leave it out to trace until the target exits)")
            }
            Some(s) => Some(Duration::from_secs_f64(s)),
            None => None,
        };
        let spec = match (self.pid, self.command.is_empty()) {
            (Some(pid), true) => TargetSpec::Pid(pid),
            (None, false) => TargetSpec::Command(LaunchCommand { argv: self.command, duration, keep_running: self.keep_running, give_terminal: true }),
            (None, true) => bail!("say which process to trace: -p PID, or -- COMMAND to start one"),
            (Some(_), false) => bail!("give either -p PID or -- COMMAND, not both"),
        };
        Ok((spec, duration))
    }
}

impl Cli {
    /// The command line, or exit: help and version go to standard output as
    /// clap writes them; a mistake is one line on standard error, "pytrace:
    /// " and clap's sentence (which names the argument and the value), and
    /// exit code 2, as clap's own.
    pub fn parse_or_exit() -> Cli {
        match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e) if !e.use_stderr() => e.exit(),
            Err(e) => {
                let rendered = e.render().to_string();
                let sentence = rendered.lines().next().unwrap_or_default().trim_start_matches("error: ");
                crate::console::err(&format!("pytrace: {sentence}\n"));
                std::process::exit(2);
            }
        }
    }

    /// Runs the chosen subcommand; returns the process exit code.
    pub fn run(self) -> Result<i32> {
        match self.command {
            Command::Calls(args) => {
                let (target, duration) = args.target.into_parts()?;
                commands::calls::run(commands::calls::Options {
                    target,
                    duration,
                    mode: match args.mode {
                        ModeArg::Auto => None,
                        ModeArg::Usdt => Some(Mode::Usdt),
                        ModeArg::Uprobe => Some(Mode::Uprobe),
                    },
                    top: args.top,
                    sort: match args.sort {
                        SortArg::Calls => SortKey::Calls,
                        SortArg::Total => SortKey::Total,
                        SortArg::SelfTime => SortKey::SelfTime,
                    },
                    json: args.json,
                    pprof: args.pprof,
                    pstats: args.pstats,
                    empty_probe: args.empty_probe,
                })
            }
            Command::Gc(args) => {
                let (target, duration) = args.target.into_parts()?;
                let mode = match args.mode {
                    GcModeArg::Auto => None,
                    GcModeArg::Usdt => Some(crate::tracing::gc::Mode::Usdt),
                    GcModeArg::Watchpoint => Some(crate::tracing::gc::Mode::Watchpoint),
                };
                commands::gc::run(commands::gc::Options { target, duration, events: args.events, json: args.json, mode })
            }
            Command::Gil(args) => {
                let (target, duration) = args.target.into_parts()?;
                commands::gil::run(commands::gil::Options { target, duration, json: args.json })
            }
            Command::Imports(args) => {
                let (target, duration) = args.target.into_parts()?;
                let mode = match args.mode {
                    ModeArg::Auto => None,
                    ModeArg::Usdt => Some(crate::tracing::imports::Mode::Usdt),
                    ModeArg::Uprobe => Some(crate::tracing::imports::Mode::Uprobe),
                };
                commands::imports::run(commands::imports::Options { target, duration, top: args.top, json: args.json, mode })
            }
            Command::Sample(args) => {
                let (target, duration) = if args.all {
                    let duration = TargetArgs { pid: Some(0), duration: args.target.duration, keep_running: false, command: vec![] }.into_parts()?.1;
                    (None, duration)
                } else {
                    let (target, duration) = args.target.into_parts()?;
                    (Some(target), duration)
                };
                let hz = args.rate.hz()?;
                use crate::report::profile::Format;
                let formats = [
                    (Format::Flamegraph, args.flamegraph),
                    (Format::Folded, args.folded),
                    (Format::Speedscope, args.speedscope),
                    (Format::Pprof { wall: args.idle }, args.pprof),
                    (Format::Json, args.json),
                ];
                commands::sample::run(commands::sample::Options {
                    target,
                    duration,
                    sampling: crate::tracing::sample::Options { hz, kernel: args.kernel, idle: args.idle, native: args.native, threads: args.threads, gil: args.gil, states: args.states, async_tasks: args.async_tasks },
                    view: crate::report::profile::FrameView { lines: args.lines, full_paths: args.full_paths, cwd: None },
                    top: args.top,
                    outputs: formats.into_iter().filter_map(|(format, path)| Some((format, path?))).collect(),
                })
            }
            Command::Compare(args) => {
                let source = match (args.traced, args.sampled) {
                    (Some(traced), Some(sampled)) => commands::compare::Source::Saved { traced, sampled },
                    _ => {
                        let (target, duration) = args.target.into_parts()?;
                        commands::compare::Source::Live {
                            target,
                            duration,
                            hz: args.rate.hz()?,
                            traced_json: args.traced_json,
                            sampled_json: args.sampled_json,
                        }
                    }
                };
                commands::compare::run(commands::compare::Options { source, top: args.top, json: args.json })
            }
            Command::Info(args) => commands::info::run(commands::info::Options {
                pid: args.pid,
                binary: args.binary,
                json: args.json,
            }),
            Command::Top(args) => {
                let (mut target, duration) = args.target.into_parts()?;
                // top reads its keys from the terminal: the command does not get it.
                if let TargetSpec::Command(command) = &mut target {
                    command.give_terminal = false;
                }
                // Checked here, not by clap, whose sentence for a missing
                // --memory runs onto a second line.
                anyhow::ensure!(args.memory || args.every.is_none(), "--every sets the byte sampling of `top --memory`: add --memory");
                if args.memory {
                    let every = args.every.unwrap_or(crate::tracing::memory::DEFAULT_EVERY);
                    anyhow::ensure!(every > 0, "--every must be at least 1 byte");
                    return commands::top_memory::run(target, duration, every);
                }
                let hz = args.rate.hz()?;
                commands::top::run(commands::top::Options { target, duration, hz, calls: args.calls, async_tasks: args.async_tasks })
            }
            Command::Dump(args) => commands::dump::run(commands::dump::Options { pid: args.pid, native: args.native, async_tasks: args.async_tasks, json: args.json }),
            Command::Restore(args) => commands::restore::run(args.pid),
            Command::Schema(args) => commands::schema::run(&args.kind),
            Command::Memory(args) => {
                let (target, duration) = args.target.into_parts()?;
                anyhow::ensure!(args.every > 0, "--every must be at least 1 byte");
                anyhow::ensure!(args.interval.is_finite() && args.interval >= 0.1, "--interval must be at least 0.1 seconds");
                let interval = std::time::Duration::from_secs_f64(args.interval);
                use commands::memory::File;
                use crate::report::profile::Format;
                let files = [(File::Stacks(Format::Folded), args.folded), (File::Stacks(Format::Flamegraph), args.flamegraph), (File::Stacks(Format::Speedscope), args.speedscope), (File::Pprof, args.pprof)];
                let files = files.into_iter().filter_map(|(kind, path)| Some((kind, path?))).collect();
                commands::memory::run(commands::memory::Options { target, duration, memory: crate::tracing::memory::Options { every: args.every, interval, allocations: args.allocations }, top: args.top, json: args.json, files })
            }
            Command::Heap(args) => commands::heap::run(commands::heap::Options::from_flags(commands::heap::Flags {
                pid: args.pid,
                command: args.command,
                stop: args.stop,
                by_module: args.by_module,
                interval: args.interval,
                count: args.count,
                top: args.top,
                timeout: args.timeout,
                json: args.json,
                diff: args.diff,
            })?),
            Command::Agent(args) => {
                let interval = args.interval.map(|s| if s.is_finite() && (1.0..=3600.0).contains(&s) { Ok(Duration::from_secs_f64(s)) } else { Err(anyhow::anyhow!("--interval must be between 1 and 3600 seconds")) }).transpose()?;
                commands::agent::run(commands::agent::Options { config: args.config, frequency: args.frequency, interval, metrics_address: args.metrics_address })
            }
        }
    }
}
