//! The `heap` report: a process's live objects by type, sorted by bytes,
//! with what the walk covered and skipped and how long it (and a --stop)
//! took; `--by-module` groups the rows by the module that defines the
//! type; with several walks (`--interval`), which types grew.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{thousands, PythonInfo, ReportKind};
use crate::model::heap::{Census, TypeRow};

#[derive(Serialize, schemars::JsonSchema)]
pub struct HeapReport {
    pub kind: ReportKind,
    pub pid: u32,
    pub python: PythonInfo,
    /// Each walk, the first first (one without --interval).
    pub snapshots: Vec<Snapshot>,
    /// Per type, from the first walk to the last (empty with one walk),
    /// the fastest-growing in bytes first.
    pub growth: Vec<Growth>,
    #[serde(skip)]
    pub by_module: bool,
    #[serde(skip)]
    pub top: usize,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct Snapshot {
    /// Seconds since the first walk started.
    pub at_s: f64,
    /// When the walk started, in seconds since the Unix epoch (what
    /// `--diff` takes the time between two reports from).
    pub unix_s: f64,
    #[serde(flatten)]
    pub census: Census,
}

#[derive(Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Growth {
    pub module: String,
    pub qualname: String,
    pub count_delta: i64,
    pub bytes_delta: i64,
    /// Objects per second over the walks' span.
    pub count_per_s: f64,
}

/// A saved `heap --json` report, as `--diff` reads it back.
#[derive(Deserialize)]
struct Saved {
    kind: ReportKind,
    pid: u32,
    python: PythonInfo,
    snapshots: Vec<Snapshot>,
}

/// A report file larger than this is not one `heap` wrote for a process.
const MAX_SAVED_BYTES: u64 = 1 << 28;

/// The last walk of a saved heap report, its PID and Python version.
pub fn read_saved(path: &std::path::Path) -> Result<(u32, String, Snapshot)> {
    let name = path.display();
    let size = std::fs::metadata(path).with_context(|| format!("could not read {name}"))?.len();
    if size > MAX_SAVED_BYTES {
        bail!("{name} is {size} bytes: not a heap report");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("could not read {name}"))?;
    let saved: Saved = serde_json::from_str(&text).map_err(|e| {
        let kind = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v["kind"].as_str().map(str::to_string));
        match kind {
            Some(k) if k != "heap" => anyhow::anyhow!("{name} is a `pytrace {k} --json` report, not a heap report"),
            _ => anyhow::anyhow!("{name} is not a `pytrace heap --json` report: {e}"),
        }
    })?;
    if saved.kind != ReportKind::Heap {
        bail!("{name} is not a `pytrace heap --json` report");
    }
    let Some(last) = saved.snapshots.into_iter().last() else { bail!("{name} holds no walk") };
    Ok((saved.pid, saved.python.version, last))
}

impl HeapReport {
    pub fn new(pid: u32, version: String, snapshots: Vec<Snapshot>, by_module: bool, top: usize) -> Self {
        let growth = growth(&snapshots);
        Self { kind: ReportKind::Heap, pid, python: PythonInfo { version, mode: "read".into() }, snapshots, growth, by_module, top }
    }

    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self) -> String {
        let Some(last) = self.snapshots.last() else { return String::new() };
        let c = &last.census;
        let total_count: u64 = c.rows.iter().map(|r| r.count).sum();
        let total_bytes: u64 = c.rows.iter().map(|r| r.bytes).sum();
        let mut out = format!(
            "Python {}, process {}: {} objects, {} (sys.getsizeof)\n",
            self.python.version,
            self.pid,
            thousands(total_count),
            mib(total_bytes)
        );
        let rows = if self.by_module { by_module(&c.rows) } else { c.rows.clone() };
        out += &format!("{:>12} {:>14} {:>6}  {:<9}  {}\n", "count", "bytes", "share", "kind", if self.by_module { "module" } else { "type" });
        for r in rows.iter().take(self.top) {
            let share = if total_bytes > 0 { r.bytes as f64 * 100.0 / total_bytes as f64 } else { 0.0 };
            let kind = if self.by_module { "" } else if r.tracked { "tracked" } else { "untracked" };
            let name = if self.by_module { r.module.clone() } else { r.name() };
            out += &format!("{:>12} {:>14} {:>5.1}%  {:<9}  {}\n", thousands(r.count), thousands(r.bytes), share, kind, crate::console::printable(&name));
        }
        if rows.len() > self.top {
            out += &format!("({} more rows: --top N, or --json)\n", thousands((rows.len() - self.top) as u64));
        }
        if !self.growth.is_empty() {
            let span = self.snapshots.last().map_or(0.0, |s| s.at_s);
            out += &format!("\ngrowth over {span:.1} s ({} walks):\n", self.snapshots.len());
            out += &format!("{:>12} {:>14} {:>10}  {}\n", "count", "bytes", "objects/s", "type");
            for g in self.growth.iter().filter(|g| g.count_delta != 0 || g.bytes_delta != 0).take(self.top.min(20)) {
                out += &format!("{:>+12} {:>+14} {:>10.1}  {}.{}\n", g.count_delta, g.bytes_delta, g.count_per_s, crate::console::printable(&g.module), crate::console::printable(&g.qualname));
            }
        }
        out += &footer(c);
        out
    }
}

/// The rows summed by module (qualname empty).
fn by_module(rows: &[TypeRow]) -> Vec<TypeRow> {
    let mut modules: HashMap<&str, TypeRow> = HashMap::new();
    for r in rows {
        let m = modules.entry(&r.module).or_insert_with(|| TypeRow { module: r.module.clone(), qualname: String::new(), tracked: r.tracked, count: 0, bytes: 0 });
        m.count += r.count;
        m.bytes += r.bytes;
    }
    let mut out: Vec<TypeRow> = modules.into_values().collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.module.cmp(&b.module)));
    out
}

/// Per type name, the last walk minus the first.
fn growth(snapshots: &[Snapshot]) -> Vec<Growth> {
    let (Some(first), Some(last)) = (snapshots.first(), snapshots.last()) else { return Vec::new() };
    if snapshots.len() < 2 {
        return Vec::new();
    }
    let span = (last.at_s - first.at_s).max(1e-9);
    let key = |r: &TypeRow| (r.module.clone(), r.qualname.clone());
    let mut deltas: HashMap<(String, String), (i64, i64)> = HashMap::new();
    for r in &last.census.rows {
        let d = deltas.entry(key(r)).or_default();
        d.0 += r.count as i64;
        d.1 += r.bytes as i64;
    }
    for r in &first.census.rows {
        let d = deltas.entry(key(r)).or_default();
        d.0 -= r.count as i64;
        d.1 -= r.bytes as i64;
    }
    let mut out: Vec<Growth> = deltas
        .into_iter()
        .map(|((module, qualname), (count, bytes))| Growth { module, qualname, count_delta: count, bytes_delta: bytes, count_per_s: count as f64 / span })
        .collect();
    out.sort_by(|a, b| b.bytes_delta.cmp(&a.bytes_delta).then(b.count_delta.cmp(&a.count_delta)).then_with(|| a.qualname.cmp(&b.qualname)));
    out
}

/// What the walk covered, what it could not see, what it skipped, and how
/// long it (and a stop) took.
fn footer(c: &Census) -> String {
    let mut out = String::from("\n");
    let tracked_in = if c.pages_read.is_some() { "tracked by the collector in its mimalloc heaps" } else { "on the collector's lists" };
    out += &format!("covered: {} objects {tracked_in}", thousands(c.tracked_objects));
    if c.frozen_objects > 0 {
        out += &format!(" (and {} frozen by gc.freeze(), not in the rows, as gc.get_objects() leaves them out)", thousands(c.frozen_objects));
    }
    match (&c.pages_read, &c.arenas_not_read) {
        (Some(pages), _) => {
            out += &format!(
                "; {} untracked objects in {} pages of {} threads' heaps and {} abandoned segments ({} in allocated blocks)\n",
                thousands(c.untracked_objects),
                thousands(pages.pages),
                thousands(pages.threads),
                thousands(pages.abandoned_segments),
                mib(c.block_bytes)
            );
            out += &format!("not seen: objects on free lists, memory C code allocates itself; the process's RSS is {}\n", mib(c.rss_bytes));
        }
        (None, None) => {
            out += &format!(
                "; {} small untracked objects in {} arenas ({} read, {} in allocated blocks)\n",
                thousands(c.untracked_objects),
                thousands(c.arenas),
                mib(c.arena_bytes),
                mib(c.block_bytes)
            )
        }
        (None, Some(why)) => out += &format!("; small untracked objects were not counted: {why}\n"),
    }
    if c.pages_read.is_none() {
        out += &format!(
            "not seen: untracked objects over 512 bytes (long str and bytes), objects on free lists, memory C code allocates itself; the process's RSS is {}\n",
            mib(c.rss_bytes)
        );
    }
    let mut skipped = Vec::new();
    if c.pools_changed > 0 {
        skipped.push(format!("{} pools that changed during the read", thousands(c.pools_changed)));
    }
    if c.arenas_unreadable > 0 {
        skipped.push(format!("{} arenas freed during the walk", thousands(c.arenas_unreadable)));
    }
    if let Some(pages) = c.pages_read.as_ref().filter(|p| p.pages_skipped > 0) {
        skipped.push(format!("{} pages that changed during the read", thousands(pages.pages_skipped)));
    }
    if c.tracked_refused > 0 && c.pages_read.is_some() {
        skipped.push(format!("{} blocks of the collector's heaps whose type was no GC type", thousands(c.tracked_refused)));
    } else if c.tracked_refused > 0 {
        skipped.push(format!("{} list nodes whose type was no GC type", thousands(c.tracked_refused)));
    }
    if let Some(broken) = &c.list_broken {
        skipped.push(format!("the rest of a list: {broken}"));
    }
    if c.types_unnamed > 0 {
        skipped.push(format!("the module of {} classes (named by tp_name)", thousands(c.types_unnamed)));
    }
    if c.tables_unread > 0 {
        skipped.push(format!("the table of {} dicts and sets (sized without it)", thousands(c.tables_unread)));
    }
    if c.partial {
        skipped.push("the rest of the heap: the walk reached its deadline (--timeout)".into());
    }
    out += &format!("skipped: {}\n", if skipped.is_empty() { "nothing".to_string() } else { skipped.join("; ") });
    match c.young_change {
        Some(change) if change >= 0 => out += &format!("changed during the walk: {change:+} objects the collector tracks (allocated less freed: its young count)\n"),
        Some(change) => out += &format!("changed during the walk: {change} objects the collector tracks (freed more than allocated, or a collection ran: its young count)\n"),
        None => out += "changed during the walk: unknown (the collector's young count was unreadable)\n",
    }
    out += &match c.stopped_ns {
        Some(ns) => format!("walk: {}; the target was stopped for {} (--stop)\n", super::human_ns(c.walk_ns), super::human_ns(ns)),
        None => format!("walk: {}; the target ran during it (--stop for an exact snapshot)\n", super::human_ns(c.walk_ns)),
    };
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}
