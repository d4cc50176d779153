//! `pytrace info`: what pytrace finds in a Python process or binary, which
//! mode each subcommand would use, and what this kernel allows.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::kernel::Kernel;
use crate::python::eval_hook::EvalHook;
use crate::python::hook_owner::HookLock;
use crate::python::{FunctionProbes, Python};
use crate::report::Output;
use crate::tracing::calls::choose_mode;

pub struct Options {
    pub pid: Option<u32>,
    pub binary: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Findings {
    pid: Option<u32>,
    version: String,
    interpreter: String,
    shared_library: bool,
    usdt_probes: Vec<String>,
    function_probes: &'static str,
    calls_mode: String,
    calls_mode_reason: String,
    eval_frame_hook: bool,
    /// Whether the kernel emulates the instruction calls' probe sits on, or
    /// single-steps it (far costlier per call).
    calls_probe: &'static str,
    /// Where the structure offsets pytrace reads come from.
    layout: String,
    /// What calls' counts or times cannot be exact about on this build,
    /// and where it counts the calls the build makes without entering the
    /// eval function (the report's caveats).
    calls_caveats: Vec<String>,
    /// How `pytrace sample` walks the stacks.
    sample_mode: &'static str,
    /// With -p on 3.11+: what interp->eval_frame holds now, and whether a
    /// live pytrace owns it.
    eval_frame_now: Option<String>,
    /// Where interp->eval_frame is and which sources say so: pytrace writes
    /// it only where two agree.
    eval_frame_offset: String,
    /// A free-threaded (no GIL) build, by its _Py_DebugOffsets.
    free_threaded: bool,
    /// How `pytrace gc` would see collections, or why it cannot.
    gc_mode: String,
    /// How `pytrace imports` would see imports, or why it cannot.
    imports_mode: String,
    kernel: KernelFindings,
}

/// The running kernel, what pytrace can use of it, and what that changes.
#[derive(Serialize)]
struct KernelFindings {
    #[serde(flatten)]
    kernel: &'static Kernel,
    limits: Vec<String>,
}

impl KernelFindings {
    fn get() -> Self {
        let kernel = Kernel::get();
        KernelFindings { kernel, limits: kernel.limits() }
    }

    fn print(&self) {
        let k = self.kernel;
        let (has, lacks): (Vec<_>, Vec<_>) = k.features.iter().partition(|(_, has)| *has);
        let name = |f: &crate::kernel::Feature| f.kernel_name().to_string();
        println!("kernel:          Linux {} ({}){}", k.version, k.release, if k.btf { ", BTF" } else { ", no BTF" });
        println!("kernel has:      {}", if has.is_empty() { "none of what pytrace looks for".into() } else { has.iter().map(|(f, _)| name(f)).collect::<Vec<_>>().join(", ") });
        if !lacks.is_empty() {
            let missing: Vec<String> = lacks.iter().map(|(f, _)| format!("{} ({}.{})", name(f), f.since().0, f.since().1)).collect();
            println!("kernel lacks:    {}", missing.join(", "));
        }
        for limit in &self.limits {
            println!("kernel limit:    {limit}");
        }
    }
}

/// `pytrace info` without a target: the kernel alone.
fn kernel_only(json: Option<Output>) -> Result<i32> {
    let findings = KernelFindings::get();
    if let Some(mut out) = json {
        #[derive(Serialize)]
        struct Only {
            kernel: KernelFindings,
        }
        out.write_all((serde_json::to_string_pretty(&Only { kernel: findings })? + "\n").as_bytes())?;
        return Ok(0);
    }
    findings.print();
    Ok(0)
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let python = match (opts.pid, &opts.binary) {
        (Some(pid), _) => Python::from_pid(pid)?,
        (None, Some(path)) => match Python::from_executable(path, None)? {
            Some(p) => p,
            None => bail!("{} is not a CPython executable or libpython", path.display()),
        },
        (None, None) => return kernel_only(json),
    };
    let mut probes: Vec<String> =
        python.elf.usdt_probes.iter().map(|p| format!("{}:{}", p.provider, p.name)).collect();
    probes.sort();
    probes.dedup();
    let function_probes = match python.function_probes() {
        FunctionProbes::Working => "working",
        FunctionProbes::EntryBroken => "entry probe misses inlined calls (3.11)",
        FunctionProbes::Missing => "missing",
    };
    let (mode, reason) = choose_mode(&python, None)?;
    let findings = Findings {
        pid: opts.pid,
        version: python.version.to_string(),
        interpreter: python.target_path.clone(),
        shared_library: python.is_shared_library(),
        usdt_probes: probes,
        function_probes,
        calls_mode: mode.name().into(),
        calls_mode_reason: reason.into(),
        eval_frame_hook: mode == crate::tracing::calls::Mode::Uprobe && python.inlines_calls(),
        layout: python.layout.source(),
        calls_caveats: crate::tracing::calls::caveats(&python, mode),
        calls_probe: match python.elf.read_static(python.symbol(crate::python::EVAL_FRAME_SYMBOL)?, 8) {
            Ok(code) if crate::tracing::entry_probe_is_emulated(code) => "emulated by the kernel",
            Ok(_) => "single-stepped by the kernel (endbr64, then no push, starts the function): measured 19 us per call on Debian's 3.13 in a VM, against 2-3 us where it is emulated",
            Err(_) => "unknown",
        },
        sample_mode: "perf-event (a BPF program walks the frames at each sample)",
        gc_mode: match crate::tracing::gc::choose_mode(&python, None) {
            Ok((mode, why)) => format!("{} ({why})", mode.name()),
            Err(e) => format!("unavailable: {e}"),
        },
        imports_mode: match crate::tracing::imports::choose_mode(&python, None) {
            Ok((mode, why)) => format!("{} ({why})", mode.name()),
            Err(e) => format!("unavailable: {e}"),
        },
        kernel: KernelFindings::get(),
        eval_frame_now: match opts.pid {
            Some(pid) if python.inlines_calls() => Some(match EvalHook::new(pid, &python) {
                Ok(hook) => hook.state()?.describe(pid, HookLock::owner(pid)),
                Err(e) => format!("unknown: {e:#}"),
            }),
            _ => None,
        },
        eval_frame_offset: match python.eval_frame_offset.agreed {
            Some(offset) => format!("{offset:#x} ({})", python.eval_frame_offset.describe()),
            None => format!("unknown: no two sources agree ({})", python.eval_frame_offset.describe()),
        },
        free_threaded: python.free_threaded,
    };
    if let Some(out) = &mut json {
        out.write_all((serde_json::to_string_pretty(&findings)? + "\n").as_bytes())?;
        if matches!(out, Output::Stdout) {
            return Ok(0);
        }
    }
    let probes = if findings.usdt_probes.is_empty() {
        "none (built without --with-dtrace)".to_string()
    } else {
        findings.usdt_probes.join(", ")
    };
    if let Some(pid) = findings.pid {
        println!("process:         {pid} ({})", crate::process::proc::command_name(pid));
    }
    println!("python:          {}", findings.version);
    println!(
        "interpreter:     {} ({})",
        findings.interpreter,
        if findings.shared_library { "shared libpython" } else { "in the executable" }
    );
    println!("usdt probes:     {probes}");
    println!("function probes: {}", findings.function_probes);
    println!("layout:          {}", findings.layout);
    println!("calls mode:      {} ({})", findings.calls_mode, findings.calls_mode_reason);
    println!("calls probe:     {}", findings.calls_probe);
    for caveat in &findings.calls_caveats {
        println!("calls note:      {caveat}");
    }
    if findings.eval_frame_hook {
        println!("eval-frame hook: calls sets interp->eval_frame while tracing, so that no call is inlined; restored on exit");
        println!("eval_frame at:   {}", findings.eval_frame_offset);
    }
    if findings.free_threaded {
        println!("free-threaded:   yes (built without the GIL; offsets from the {} table)", python.layout.build_name());
    }
    println!("gc mode:         {}", findings.gc_mode);
    println!("imports mode:    {}", findings.imports_mode);
    println!("sample mode:     {}", findings.sample_mode);
    if let Some(now) = &findings.eval_frame_now {
        println!("eval_frame now:  {now}");
    }
    findings.kernel.print();
    Ok(0)
}
