//! What the running kernel lets pytrace's BPF programs do. Each feature is
//! read from the kernel itself where it can be: a BPF helper exists when
//! the kernel's BTF lists it in `enum bpf_func_id`, an attach type when
//! `enum bpf_attach_type` does (those uapi enums are compiled into every
//! kernel's BTF, so they say what this kernel has, backports included).
//! Only BPF's compare-and-swap and uprobe_multi's filter by process (a
//! fix), which no enum names, are taken from the release.

use std::ffi::OsStr;
use std::sync::OnceLock;

use anyhow::{bail, Result};
use libbpf_rs::btf::{types, Btf};
use serde::Serialize;

/// The kernel's BTF, where pytrace's CO-RE programs learn its types.
/// PYTRACE_KERNEL_BTF overrides it (the tests point it at a missing file).
pub fn btf_path() -> String {
    std::env::var("PYTRACE_KERNEL_BTF").unwrap_or_else(|_| "/sys/kernel/btf/vmlinux".into())
}

/// A kernel capability some part of pytrace depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// BPF ring buffers, which every program sends its records through.
    Ringbuf,
    /// BPF_CMPXCHG: `calls` keeps each function's maximum latency exact
    /// when several CPUs finish calls of it at once.
    AtomicCompareExchange,
    /// bpf_get_attach_cookie (for uprobes): `calls`' probes inside the eval
    /// loop learn their site's registers from it; libbpf tells USDT probe
    /// sites apart with it (before it, by instruction address).
    AttachCookie,
    /// bpf_task_pt_regs: `sample --native` reads the user registers of a
    /// thread interrupted in the kernel with it.
    TaskPtRegs,
    /// bpf_loop: the sampler's loops (frames, their names, the thread
    /// list) run through it, so the verifier checks each loop's body once
    /// instead of once per pass: a hundredth of the work at every start.
    BpfLoop,
    /// bpf_copy_from_user_task in a sleepable task iterator: how `sample
    /// --idle` reads threads that are not running.
    CopyFromUserTask,
    /// Multi-uprobe links, which uprobe sessions are built on.
    UprobeMulti,
    /// Uprobe sessions: entry and return in one program and one link
    /// (`calls`, `imports --mode uprobe`; before them, a uprobe and a
    /// uretprobe).
    UprobeSession,
    /// A uprobe_multi link given a PID runs its program for every thread of
    /// that process (6.6 to 6.9 ran it for the one thread whose id is the
    /// PID: 46ba0e49b642, "bpf: fix multi-uprobe PID filtering logic"):
    /// `memory` attaches its 500-odd probe sites of a stripped build as
    /// one link per program, where it would otherwise open (and close, one
    /// kernel grace period each) a perf event per site.
    UprobeMultiByProcess,
}

impl Feature {
    pub const ALL: [Feature; 9] = [
        Feature::Ringbuf,
        Feature::AtomicCompareExchange,
        Feature::AttachCookie,
        Feature::TaskPtRegs,
        Feature::BpfLoop,
        Feature::CopyFromUserTask,
        Feature::UprobeMulti,
        Feature::UprobeSession,
        Feature::UprobeMultiByProcess,
    ];

    /// The mainline release that brought it.
    pub fn since(self) -> (u32, u32) {
        match self {
            Feature::Ringbuf => (5, 8),
            Feature::AtomicCompareExchange => (5, 12),
            Feature::AttachCookie => (5, 15),
            Feature::TaskPtRegs => (5, 15),
            Feature::BpfLoop => (5, 17),
            Feature::CopyFromUserTask => (5, 18),
            Feature::UprobeMulti => (6, 6),
            Feature::UprobeSession => (6, 13),
            Feature::UprobeMultiByProcess => (6, 10),
        }
    }

    /// What it is, as the kernel names it.
    pub fn kernel_name(self) -> &'static str {
        match self {
            Feature::Ringbuf => "BPF ring buffer",
            Feature::AtomicCompareExchange => "BPF_CMPXCHG",
            Feature::AttachCookie => "bpf_get_attach_cookie",
            Feature::TaskPtRegs => "bpf_task_pt_regs",
            Feature::BpfLoop => "bpf_loop",
            Feature::CopyFromUserTask => "bpf_copy_from_user_task",
            Feature::UprobeMulti => "uprobe_multi links",
            Feature::UprobeSession => "uprobe sessions",
            Feature::UprobeMultiByProcess => "uprobe_multi links filtered by process",
        }
    }

    /// Where the kernel's BTF says whether it has it: an enum and a value.
    fn btf_enum(self) -> Option<(&'static str, &'static str)> {
        match self {
            Feature::Ringbuf => Some(("bpf_map_type", "BPF_MAP_TYPE_RINGBUF")),
            Feature::AtomicCompareExchange => None,
            Feature::AttachCookie => Some(("bpf_func_id", "BPF_FUNC_get_attach_cookie")),
            Feature::TaskPtRegs => Some(("bpf_func_id", "BPF_FUNC_task_pt_regs")),
            Feature::BpfLoop => Some(("bpf_func_id", "BPF_FUNC_loop")),
            Feature::CopyFromUserTask => Some(("bpf_func_id", "BPF_FUNC_copy_from_user_task")),
            Feature::UprobeMulti => Some(("bpf_attach_type", "BPF_TRACE_UPROBE_MULTI")),
            Feature::UprobeSession => Some(("bpf_attach_type", "BPF_TRACE_UPROBE_SESSION")),
            Feature::UprobeMultiByProcess => None,
        }
    }
}

/// The running kernel: its release and what it has.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Kernel {
    /// As uname gives it, e.g. "6.1.0-56-amd64".
    pub release: String,
    /// Major and minor, e.g. "6.1".
    pub version: String,
    pub btf: bool,
    /// Why the BTF could not be read, where it could not: every feature is
    /// then unknown, not absent (under a low RLIMIT_AS, libbpf's parse of
    /// it fails with ENOMEM on a kernel that has everything).
    #[serde(skip)]
    pub btf_unreadable: Option<String>,
    /// Every feature of `Feature::ALL`, and whether this kernel has it.
    #[serde(serialize_with = "features_as_map")]
    #[schemars(with = "std::collections::BTreeMap<Feature, bool>")]
    pub features: Vec<(Feature, bool)>,
}

fn features_as_map<S: serde::Serializer>(features: &[(Feature, bool)], to: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = to.serialize_map(Some(features.len()))?;
    for (f, has) in features {
        map.serialize_entry(f, has)?;
    }
    map.end()
}

impl Kernel {
    /// The running kernel, read once.
    pub fn get() -> &'static Kernel {
        static KERNEL: OnceLock<Kernel> = OnceLock::new();
        KERNEL.get_or_init(Kernel::read)
    }

    fn read() -> Kernel {
        let release = release();
        let numbers = parse_version(&release);
        let read = Btf::from_path(btf_path());
        let btf_unreadable = read.as_ref().err().map(|e| format!("{e:#}"));
        let btf = read.ok();
        let features = Feature::ALL
            .iter()
            .map(|&f| {
                let has = match (f.btf_enum(), &btf) {
                    (Some((name, value)), Some(btf)) => enum_has(btf, name, value),
                    (Some(_), None) => false,
                    (None, _) => numbers >= f.since(),
                };
                (f, has)
            })
            .collect();
        Kernel { version: format!("{}.{}", numbers.0, numbers.1), release, btf: btf.is_some(), btf_unreadable, features }
    }

    pub fn has(&self, feature: Feature) -> bool {
        // PYTRACE_NO_UPROBE_SESSION=1 takes the path of kernels without
        // sessions (the tests cover it on kernels that have them).
        if feature == Feature::UprobeSession && std::env::var_os("PYTRACE_NO_UPROBE_SESSION").is_some() {
            return false;
        }
        // PYTRACE_NO_TASK_PT_REGS=1 likewise takes sample --native's path of
        // kernels before 5.15.
        if feature == Feature::TaskPtRegs && std::env::var_os("PYTRACE_NO_TASK_PT_REGS").is_some() {
            return false;
        }
        // PYTRACE_NO_UPROBE_MULTI=1 likewise takes memory's path of kernels
        // before 6.10: a perf-event uprobe per site.
        if feature == Feature::UprobeMultiByProcess && std::env::var_os("PYTRACE_NO_UPROBE_MULTI").is_some() {
            return false;
        }
        self.features.iter().any(|&(f, has)| f == feature && has)
    }

    /// Fails, in one sentence, if `what` needs a feature this kernel lacks.
    pub fn require(&self, feature: Feature, what: &str) -> Result<()> {
        if !self.has(feature) {
            bail!("{}", self.lacks(feature, what));
        }
        Ok(())
    }

    /// What this kernel changes for pytrace, a sentence each: what does
    /// not work, and what works another way.
    pub fn limits(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.btf {
            out.push(format!("pytrace needs a kernel with BTF ({} is missing: CONFIG_DEBUG_INFO_BTF=y)", btf_path()));
        }
        if !self.has(Feature::Ringbuf) {
            out.push(self.lacks(Feature::Ringbuf, "pytrace"));
        }
        if !self.has(Feature::CopyFromUserTask) {
            out.push(self.lacks(Feature::CopyFromUserTask, "sample --idle"));
        }
        if !self.has(Feature::UprobeSession) {
            out.push("calls and imports (uprobe mode) attach a uprobe and a uretprobe to the eval function (one uprobe session needs Linux 6.13)".into());
        }
        if !self.has(Feature::UprobeMultiByProcess) {
            out.push("memory attaches a uprobe per probe site (500-odd on a stripped build: seconds to attach and to detach under load; one uprobe_multi link filtered by process needs Linux 6.10)".into());
        }
        if !self.has(Feature::AtomicCompareExchange) {
            out.push("calls' maximum latency of a function can be understated when two CPUs end calls of it at the same instant (exact from Linux 5.12, whose BPF has compare-and-exchange)".into());
        }
        if !self.has(Feature::AttachCookie) {
            out.push("calls in uprobe mode cannot count __getitem__ run inline by CPython 3.11.0 to 3.11.3, nor generator closes that skip the frame (3.13+): those counts are lower bounds (uprobe cookies, bpf_get_attach_cookie, need Linux 5.15)".into());
        }
        if !self.has(Feature::TaskPtRegs) {
            out.push("sample --native reads the user registers of samples that interrupted the kernel from the top of the thread's kernel stack, as the kernel does (bpf_task_pt_regs needs Linux 5.15); where they are not there it counts the sample native_no_user_regs".into());
        }
        out
    }

    /// "sample --idle needs Linux 5.18 or newer (bpf_copy_from_user_task); this kernel is 5.10"
    pub fn lacks(&self, feature: Feature, what: &str) -> String {
        let (major, minor) = feature.since();
        format!("{what} needs Linux {major}.{minor} or newer ({}); this kernel is {}", feature.kernel_name(), self.version)
    }
}

/// Whether the BTF's enum `name` has a value called `value`.
fn enum_has(btf: &Btf, name: &str, value: &str) -> bool {
    let Some(e) = btf.type_by_name::<types::Enum>(name) else { return false };
    let found = e.iter().any(|m| m.name == Some(OsStr::new(value)));
    found
}

fn release() -> String {
    // SAFETY: uname fills the struct we pass.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates release.
    unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }.to_string_lossy().into_owned()
}

/// "6.1.0-56-amd64" -> (6, 1); anything unreadable -> (0, 0).
fn parse_version(release: &str) -> (u32, u32) {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_every_distribution_s_release_string() {
        assert_eq!(parse_version("6.1.0-56-amd64"), (6, 1));
        assert_eq!(parse_version("5.10.0-46-amd64"), (5, 10));
        assert_eq!(parse_version("6.12.117+deb13-amd64"), (6, 12));
        assert_eq!(parse_version("5.14.0-427.13.1.el9_4.x86_64"), (5, 14));
        assert_eq!(parse_version("5.15.0-105-generic"), (5, 15));
        assert_eq!(parse_version("6.18.44-fc-v782"), (6, 18));
        assert_eq!(parse_version("garbage"), (0, 0));
    }

    #[test]
    fn a_missing_feature_names_the_release_it_needs() {
        let k = Kernel { release: "5.10.0-46-amd64".into(), version: "5.10".into(), btf: true, btf_unreadable: None, features: vec![(Feature::CopyFromUserTask, false)] };
        assert_eq!(
            k.lacks(Feature::CopyFromUserTask, "sample --idle"),
            "sample --idle needs Linux 5.18 or newer (bpf_copy_from_user_task); this kernel is 5.10"
        );
        assert!(k.require(Feature::CopyFromUserTask, "sample --idle").is_err());
    }
}
