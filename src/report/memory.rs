//! `pytrace memory`'s table and JSON: per stack and allocator path, the
//! bytes live at the end of the run and the bytes the heap grew by, each
//! with its 95 % interval and the kept events it rests on. Its stack
//! formats are sample's (folded, flamegraph, speedscope), weighted by live
//! bytes; its pprof is Go's heap profile.

use serde::Serialize;

use anyhow::Result;

use super::pprof::{encode, unix_ns_ago, PprofInput, StackValues};
use super::profile::{label, Profile, Weight};
use super::{counted_line, dropped_line, thousands, PythonInfo, ReportKind};
use crate::model::counters::Counters;
use crate::model::memory::{AllocatedStack, Estimate, MemoryData, MemoryStack, Source};
use crate::model::samples::{Frame, Sample};

/// sample's profile of `data`, each stack weighted by its live bytes (to
/// the byte): what folded stacks, the flamegraph and speedscope draw.
pub fn live_profile(pid: u32, python: PythonInfo, duration_ns: u64, data: &MemoryData) -> Profile {
    let samples: Vec<Sample> = data
        .stacks
        .iter()
        .map(|s| Sample { pid, tid: 0, frames: s.frames.clone(), count: s.live.bytes.round().max(0.0) as u64 })
        .filter(|s| s.count > 0)
        .collect();
    let mut profile = Profile::new(pid, python, 0, duration_ns, data.counters.clone(), &samples, None);
    profile.weight = Weight::LiveBytes;
    profile
}

/// Go's heap profile (what `go tool pprof`, Pyroscope and Parca read as a
/// memory profile): per stack alloc_objects and alloc_space (what the
/// heap grew by through it during the run), inuse_objects and inuse_space
/// (of that, what is live at the end), the last the default, as Go's own
/// heap profiles order them. Objects are obmalloc's: a chunk is one, a
/// pool its blocks. With --allocations, alloc_objects and alloc_space are
/// instead every allocation's (the churn view), each stack's in samples of
/// their own. Estimates, rounded to whole bytes and objects.
pub fn to_pprof(data: &MemoryData, duration_ns: u64, subject: &str) -> Result<Vec<u8>> {
    let mut comments = vec![
        format!("pytrace memory: {subject}"),
        format!("sampled by bytes: one event kept per {} bytes on average; values are estimates", data.every),
    ];
    comments.extend(counted_line(&data.counters).lines().map(str::to_string));
    comments.extend(dropped_line(&data.counters).lines().map(str::to_string));
    let whole = |x: f64| x.round().max(0.0) as i64;
    let mut stacks: Vec<StackValues> = data
        .stacks
        .iter()
        .map(|s| {
            let (alloc_objects, alloc_space) = if data.allocations.is_some() { (0, 0) } else { (whole(s.grown.objects), whole(s.grown.bytes)) };
            StackValues { thread: "", frames: &s.frames, values: vec![alloc_objects, alloc_space, whole(s.live.objects), whole(s.live.bytes)] }
        })
        .collect();
    for s in data.allocations.iter().flatten() {
        stacks.push(StackValues { thread: "", frames: &s.frames, values: vec![whole(s.allocated.objects), whole(s.allocated.bytes), 0, 0] });
    }
    encode(&PprofInput {
        value_types: vec![("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")],
        stacks,
        // Go's heap profiles say their sampling rate this way.
        period: Some(("space", "bytes", data.every as i64)),
        start_unix_ns: unix_ns_ago(duration_ns),
        duration_ns,
        comments,
    })
}

/// Kept events under which an estimate is marked unreliable: its interval
/// rests on the normal approximation.
pub const MIN_RELIABLE_KEPT: u64 = 30;

/// `pytrace memory --json`.
#[derive(Serialize, schemars::JsonSchema)]
pub struct MemoryReport {
    pub kind: ReportKind,
    pub pid: u32,
    pub python: PythonInfo,
    /// The traced window's length.
    pub duration_ns: u64,
    /// The byte sampler's mean interval T (`--every`): an event of b bytes
    /// is kept with chance 1 - e^(-b/T).
    pub every: u64,
    /// What the kept events still held at the last read, estimated.
    pub live: Estimate,
    /// What the heap grew by over the run, estimated.
    pub grown: Estimate,
    /// Kept blocks read back from the target at the last read, and of
    /// those, the ones found freed or reused.
    pub blocks_read: u64,
    pub blocks_gone: u64,
    /// Events dropped (the counters marked lost, summed).
    pub lost_events: u64,
    pub counters: Counters,
    /// By live bytes, largest first.
    pub stacks: Vec<StackRow>,
    /// --allocations: every allocation's bytes per stack, freed or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocations: Option<AllocationsReport>,
}

/// `--allocations`' part of the report: what every allocation of the run
/// summed to, what it cost (allocator calls seen, each a probe hit), and
/// each stack's share.
#[derive(Serialize, schemars::JsonSchema)]
pub struct AllocationsReport {
    pub allocated: Estimate,
    pub allocated_interval95: f64,
    /// Allocator calls the probes saw, and per second of the run.
    pub events: u64,
    pub events_per_second: f64,
    /// By allocated bytes, largest first.
    pub stacks: Vec<AllocatedRow>,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct AllocatedRow {
    /// Outermost first, as `name (file:line)`.
    pub frames: Vec<String>,
    pub allocated: Estimate,
    pub allocated_interval95: f64,
}

impl AllocationsReport {
    fn new(stacks: Vec<AllocatedStack>, events: u64, duration_ns: u64) -> Self {
        let mut allocated = Estimate::default();
        let mut merged: std::collections::BTreeMap<Vec<String>, Estimate> = Default::default();
        for s in stacks {
            allocated.add(&s.allocated);
            merged.entry(s.frames.iter().map(|f| label(f)).collect()).or_default().add(&s.allocated);
        }
        let mut stacks: Vec<AllocatedRow> = merged.into_iter().map(|(frames, e)| AllocatedRow { frames, allocated_interval95: e.interval95(), allocated: e }).collect();
        stacks.sort_by(|a, b| b.allocated.bytes.total_cmp(&a.allocated.bytes));
        let seconds = duration_ns as f64 / 1e9;
        AllocationsReport {
            allocated_interval95: allocated.interval95(),
            allocated,
            events,
            events_per_second: if seconds > 0.0 { events as f64 / seconds } else { 0.0 },
            stacks,
        }
    }

    fn to_table(&self, top: usize) -> String {
        let mut out = format!(
            "allocated (--allocations: every allocation, freed or not): {} ± {} (95 %); cost: {} allocator calls probed, {} a second\n",
            bytes(self.allocated.bytes),
            bytes(self.allocated_interval95),
            thousands(self.events),
            thousands(self.events_per_second.round() as u64)
        );
        out += &format!("{:>10} {:>9} {:>6}  stack (innermost first)\n", "allocated", "±95%", "kept");
        for row in self.stacks.iter().take(top) {
            let inner: Vec<&str> = row.frames.iter().rev().take(3).map(String::as_str).collect();
            let mark = if row.allocated.kept < MIN_RELIABLE_KEPT { " (few events)" } else { "" };
            out += &format!("{:>10} {:>9} {:>6}  {}{}\n", bytes(row.allocated.bytes), bytes(row.allocated_interval95), thousands(row.allocated.kept), inner.join(" < "), mark);
        }
        out
    }
}

/// One stack and allocator path.
#[derive(Serialize, schemars::JsonSchema)]
pub struct StackRow {
    /// Outermost first, as `name (file:line)`.
    pub frames: Vec<String>,
    pub source: Source,
    pub live: Estimate,
    /// Half the width of `live`'s 95 % interval, in bytes.
    pub live_interval95: f64,
    pub grown: Estimate,
    /// Half the width of `grown`'s 95 % interval, in bytes.
    pub grown_interval95: f64,
}

/// The rows of `stacks`, each frame named by `name`, by live bytes
/// (largest first), and the live and grown totals: stacks that differ
/// only where a frame's instruction is (two call sites on one line) are
/// one row. The table's and `top --memory`'s.
pub fn stack_rows(stacks: &[MemoryStack], name: impl Fn(&Frame) -> String) -> (Vec<StackRow>, Estimate, Estimate) {
    let mut live = Estimate::default();
    let mut grown = Estimate::default();
    let mut merged: std::collections::BTreeMap<(Vec<String>, Source), (Estimate, Estimate)> = Default::default();
    for s in stacks {
        live.add(&s.live);
        grown.add(&s.grown);
        let row = merged.entry((s.frames.iter().map(|f| name(f)).collect(), s.source)).or_default();
        row.0.add(&s.live);
        row.1.add(&s.grown);
    }
    let mut rows: Vec<StackRow> = merged
        .into_iter()
        .map(|((frames, source), (live, grown))| StackRow { frames, source, live_interval95: live.interval95(), live, grown_interval95: grown.interval95(), grown })
        .collect();
    rows.sort_by(|a, b| b.live.bytes.total_cmp(&a.live.bytes).then(b.grown.bytes.total_cmp(&a.grown.bytes)));
    (rows, live, grown)
}

impl MemoryReport {
    pub fn new(pid: u32, python: PythonInfo, duration_ns: u64, data: MemoryData) -> Self {
        let (stacks, live, grown) = stack_rows(&data.stacks, label);
        let events = data.counters.get("allocation_events");
        let allocations = data.allocations.map(|stacks| AllocationsReport::new(stacks, events, duration_ns));
        MemoryReport {
            kind: ReportKind::Memory,
            pid,
            python,
            duration_ns,
            every: data.every,
            live,
            grown,
            blocks_read: data.blocks_read,
            blocks_gone: data.blocks_gone,
            lost_events: data.counters.lost(),
            counters: data.counters,
            stacks,
            allocations,
        }
    }

    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self, top: usize) -> String {
        let mut out = format!(
            "pytrace memory: PID {} (Python {}, {}), {:.1} s, one event kept per {} on average\n",
            self.pid,
            self.python.version,
            self.python.mode,
            self.duration_ns as f64 / 1e9,
            bytes(self.every as f64)
        );
        out += &format!(
            "live at the last read: {} ± {}; grown: {} ± {} (95 %); {} kept blocks read, {} gone since\n",
            bytes(self.live.bytes),
            bytes(self.live.interval95()),
            bytes(self.grown.bytes),
            bytes(self.grown.interval95()),
            thousands(self.blocks_read),
            thousands(self.blocks_gone)
        );
        out += &counted_line(&self.counters);
        out += &format!("{:>10} {:>9} {:>10} {:>9} {:>6}  {:<6}  stack (innermost first)\n", "live", "±95%", "grown", "±95%", "kept", "from");
        for row in self.stacks.iter().take(top) {
            let inner: Vec<&str> = row.frames.iter().rev().take(3).map(String::as_str).collect();
            let mark = if row.grown.kept < MIN_RELIABLE_KEPT { " (few events)" } else { "" };
            out += &format!(
                "{:>10} {:>9} {:>10} {:>9} {:>6}  {:<6}  {}{}\n",
                bytes(row.live.bytes),
                bytes(row.live_interval95),
                bytes(row.grown.bytes),
                bytes(row.grown_interval95),
                thousands(row.grown.kept),
                row.source.name(),
                inner.join(" < "),
                mark
            );
        }
        if let Some(allocations) = &self.allocations {
            out += &allocations.to_table(top);
        }
        out += &dropped_line(&self.counters);
        out
    }
}

/// Bytes in the binary unit that keeps three or four significant digits.
pub(super) fn bytes(b: f64) -> String {
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1048576.0)
    } else {
        format!("{:.2} GiB", b / 1073741824.0)
    }
}
