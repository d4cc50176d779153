//! `pytrace info`'s findings: what pytrace finds in a Python process or
//! binary, which mode each subcommand would use and why, and what this
//! kernel allows; as JSON or as the table of `label: value` lines.

use anyhow::Result;
use serde::Serialize;

use crate::kernel::Kernel;
use crate::python::target_writes::eval_hook::EvalHook;
use crate::python::target_writes::hook_owner::HookLock;
use crate::python::{FunctionProbes, Python};
use crate::tracing::calls::{self, choose_mode};

#[derive(Serialize, schemars::JsonSchema)]
pub struct Findings {
    kind: super::ReportKind,
    pid: Option<u32>,
    version: String,
    interpreter: String,
    shared_library: bool,
    usdt_probes: Vec<String>,
    function_probes: &'static str,
    calls_mode: String,
    calls_mode_reason: String,
    eval_frame_hook: bool,
    /// Where calls' probe on the eval function sits (its entry, or a jump
    /// to it that the eval-frame hook points at), and whether the kernel
    /// emulates that instruction or single-steps it (far costlier per call).
    calls_probe: String,
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
    /// Which offsets table a free-threaded build reads.
    #[serde(skip)]
    build_name: String,
    /// How `pytrace gc` would see collections, or why it cannot.
    gc_mode: String,
    /// How `pytrace imports` would see imports, or why it cannot.
    imports_mode: String,
    /// How `pytrace gil` would see the GIL taken and dropped (and where),
    /// or why it cannot.
    gil_mode: String,
    kernel: KernelFindings,
}

/// The running kernel, what pytrace can use of it, and what that changes.
#[derive(Serialize, schemars::JsonSchema)]
pub struct KernelFindings {
    #[serde(flatten)]
    kernel: &'static Kernel,
    limits: Vec<String>,
    /// Said when this pytrace could not trace: `info` itself runs without
    /// root, so it is where a user learns that the rest needs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    privileges: Option<&'static str>,
}

impl KernelFindings {
    pub fn get() -> Self {
        let kernel = Kernel::get();
        let privileges = (!crate::session::has_tracing_privileges()).then_some(crate::session::NEEDS_PRIVILEGES);
        KernelFindings { kernel, limits: kernel.limits(), privileges }
    }

    /// The kernel's lines of the table.
    pub fn to_table(&self) -> String {
        let mut out = Vec::new();
        let k = self.kernel;
        let (has, lacks): (Vec<_>, Vec<_>) = k.features.iter().partition(|(_, has)| *has);
        let name = |f: &crate::kernel::Feature| f.kernel_name().to_string();
        out.push(format!("kernel:          Linux {} ({}){}", k.version, k.release, if k.btf { ", BTF" } else { ", no BTF" }));
        out.push(format!("kernel has:      {}", if has.is_empty() { "none of what pytrace looks for".into() } else { has.iter().map(|(f, _)| name(f)).collect::<Vec<_>>().join(", ") }));
        if !lacks.is_empty() {
            let missing: Vec<String> = lacks.iter().map(|(f, _)| format!("{} ({}.{})", name(f), f.since().0, f.since().1)).collect();
            out.push(format!("kernel lacks:    {}", missing.join(", ")));
        }
        for limit in &self.limits {
            out.push(format!("kernel limit:    {limit}"));
        }
        if let Some(needs) = self.privileges {
            out.push(format!("privileges:      {needs}"));
        }
        out.iter().map(|line| format!("{line}\n")).collect()
    }
}

impl Findings {
    /// Looks at `python` (in process `pid`, or a binary on disk if None)
    /// and at the kernel.
    pub fn of(python: &Python, pid: Option<u32>) -> Result<Self> {
        let mut probes: Vec<String> = python.elf.usdt_probes.iter().map(|p| format!("{}:{}", p.provider, p.name)).collect();
        probes.sort();
        probes.dedup();
        let function_probes = match python.function_probes() {
            FunctionProbes::Working => "working",
            FunctionProbes::EntryBroken => "entry probe misses inlined calls (3.11)",
            FunctionProbes::Missing => "missing",
        };
        let (mode, reason) = choose_mode(python, None)?;
        Ok(Findings {
            kind: super::ReportKind::Info,
            pid,
            version: python.version.to_string(),
            interpreter: python.target_path.clone(),
            shared_library: python.is_shared_library(),
            usdt_probes: probes,
            function_probes,
            calls_mode: mode.name().into(),
            calls_mode_reason: reason.into(),
            eval_frame_hook: mode == calls::Mode::Uprobe && python.inlines_calls(),
            layout: python.layout.source(),
            calls_caveats: calls::caveats(python, mode),
            calls_probe: python.eval_probe().describe(),
            sample_mode: "perf-event (a BPF program walks the frames at each sample)",
            gc_mode: match crate::tracing::gc::choose_mode(python, None) {
                Ok((mode, why)) => format!("{} ({why})", mode.name()),
                Err(e) => format!("unavailable: {e}"),
            },
            imports_mode: match crate::tracing::imports::choose_mode(python, None) {
                Ok((mode, why)) => format!("{} ({why})", mode.name()),
                Err(e) => format!("unavailable: {e}"),
            },
            gil_mode: match crate::tracing::gil::probe_points(python) {
                Ok(probes) => format!("{} ({})", probes.describe(), probes.sites()),
                Err(e) => format!("unavailable: {e}"),
            },
            kernel: KernelFindings::get(),
            eval_frame_now: match pid {
                Some(pid) if python.inlines_calls() => Some(match EvalHook::new(pid, python) {
                    Ok(hook) => hook.state()?.describe(pid, HookLock::owner_here_or_above(pid), HookLock::left_behind_by(pid)),
                    Err(e) => format!("unknown: {e:#}"),
                }),
                _ => None,
            },
            eval_frame_offset: match python.eval_frame_offset.agreed {
                Some(offset) => format!("{offset:#x} ({})", python.eval_frame_offset.describe()),
                None => format!("unknown: no two sources agree ({})", python.eval_frame_offset.describe()),
            },
            free_threaded: python.free_threaded,
            build_name: python.layout.build_name(),
        })
    }

    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    /// One `label: value` line per finding, the kernel's last.
    pub fn to_table(&self) -> String {
        let mut out = Vec::new();
        if let Some(pid) = self.pid {
            out.push(format!("process:         {pid} ({})", crate::process::proc::command_name(pid)));
        }
        let probes = if self.usdt_probes.is_empty() { "none (built without --with-dtrace)".to_string() } else { self.usdt_probes.join(", ") };
        out.push(format!("python:          {}", self.version));
        out.push(format!("interpreter:     {} ({})", self.interpreter, if self.shared_library { "shared libpython" } else { "in the executable" }));
        out.push(format!("usdt probes:     {probes}"));
        out.push(format!("function probes: {}", self.function_probes));
        out.push(format!("layout:          {}", self.layout));
        out.push(format!("calls mode:      {} ({})", self.calls_mode, self.calls_mode_reason));
        out.push(format!("calls probe:     {}", self.calls_probe));
        for caveat in &self.calls_caveats {
            out.push(format!("calls note:      {caveat}"));
        }
        if self.eval_frame_hook {
            out.push("eval-frame hook: calls sets interp->eval_frame while tracing, so that no call is inlined; restored on exit".into());
            out.push(format!("eval_frame at:   {}", self.eval_frame_offset));
        }
        if self.free_threaded {
            out.push(format!("free-threaded:   yes (built without the GIL; offsets from the {} table)", self.build_name));
        }
        out.push(format!("gc mode:         {}", self.gc_mode));
        out.push(format!("imports mode:    {}", self.imports_mode));
        out.push(format!("gil mode:        {}", self.gil_mode));
        out.push(format!("sample mode:     {}", self.sample_mode));
        if let Some(now) = &self.eval_frame_now {
            out.push(format!("eval_frame now:  {now}"));
        }
        out.iter().map(|line| format!("{line}\n")).collect::<String>() + &self.kernel.to_table()
    }
}

/// `pytrace info` without a target: the kernel alone.
#[derive(Serialize, schemars::JsonSchema)]
pub struct KernelOnly {
    pub kind: super::ReportKind,
    pub kernel: KernelFindings,
}

impl KernelOnly {
    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }
}
