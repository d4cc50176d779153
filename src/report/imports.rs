//! The `imports` report: every module import as a tree with self and
//! cumulative time, like `python -X importtime`, slowest first.

use std::collections::HashMap;

use serde::Serialize;

use super::human_ns;
use crate::model::counters::Counters;
use crate::model::events::ImportEvent;

#[derive(Serialize, Debug, Clone, schemars::JsonSchema)]
pub struct ImportNode {
    pub name: String,
    /// False when the import failed (ModuleNotFoundError or an exception).
    pub found: bool,
    pub cumulative_ns: u64,
    pub self_ns: u64,
    pub children: Vec<ImportNode>,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct ImportsReport {
    pub kind: super::ReportKind,
    pub pid: u32,
    pub python: super::PythonInfo,
    pub duration_ns: u64,
    pub lost_events: u64,
    pub counters: Counters,
    /// Imports still running when tracing stopped, or whose start was not seen.
    pub unfinished: u64,
    pub imports: Vec<ImportNode>,
}

struct Open {
    name: String,
    start_ns: u64,
    children: Vec<ImportNode>,
}

/// Nests start/done events into trees, per thread: an import that starts
/// while another is open on the same thread is part of it.
pub fn build_tree(events: &[ImportEvent]) -> (Vec<ImportNode>, u64) {
    let mut stacks: HashMap<u32, Vec<Open>> = HashMap::new();
    let mut roots = Vec::new();
    let mut unfinished = 0;
    for ev in events {
        let stack = stacks.entry(ev.tid).or_default();
        if ev.start {
            stack.push(Open { name: ev.name.clone(), start_ns: ev.ts_ns, children: Vec::new() });
            continue;
        }
        match stack.last() {
            Some(open) if open.name == ev.name => {
                let open = stack.pop().unwrap();
                let cumulative_ns = ev.ts_ns.saturating_sub(open.start_ns);
                let in_children: u64 = open.children.iter().map(|c| c.cumulative_ns).sum();
                let mut children = open.children;
                children.sort_by_key(|c| std::cmp::Reverse(c.cumulative_ns));
                let node = ImportNode {
                    name: open.name,
                    found: ev.found,
                    cumulative_ns,
                    self_ns: cumulative_ns.saturating_sub(in_children),
                    children,
                };
                match stack.last_mut() {
                    Some(parent) => parent.children.push(node),
                    None => roots.push(node),
                }
            }
            // Its start came before pytrace attached.
            _ => unfinished += 1,
        }
    }
    unfinished += stacks.values().map(|s| s.len() as u64).sum::<u64>();
    roots.sort_by_key(|c| std::cmp::Reverse(c.cumulative_ns));
    (roots, unfinished)
}

impl ImportsReport {
    pub fn to_json(&self) -> String {
        super::to_json_text(self)
    }

    pub fn to_table(&self, top: Option<usize>) -> String {
        fn count(nodes: &[ImportNode]) -> usize {
            nodes.iter().map(|n| 1 + count(&n.children)).sum()
        }
        let mut out = format!(
            "pytrace imports: PID {}, Python {} ({} mode), {:.2} s, {}, {}\n",
            self.pid,
            self.python.version,
            self.python.mode,
            self.duration_ns as f64 / 1e9,
            super::counted(count(&self.imports) as u64, "import"),
            super::counted(self.lost_events, "lost event"),
        );
        out += &super::counted_line(&self.counters);
        out += &format!("{:>10} {:>11}  {}\n", "self", "cumulative", "module (nested: imported by the one above)");
        fn walk(out: &mut String, nodes: &[ImportNode], depth: usize) {
            for n in nodes {
                let failed = if n.found { "" } else { "  (failed)" };
                *out += &format!(
                    "{:>10} {:>11}  {}{}{}\n",
                    human_ns(n.self_ns),
                    human_ns(n.cumulative_ns),
                    "  ".repeat(depth),
                    n.name,
                    failed
                );
                walk(out, &n.children, depth + 1);
            }
        }
        let shown = top.unwrap_or(usize::MAX).min(self.imports.len());
        walk(&mut out, &self.imports[..shown], 0);
        if self.imports.len() > shown {
            let hidden = (self.imports.len() - shown) as u64;
            out += &format!("… {} more {} (--top)\n", hidden, super::plural(hidden, "top-level import"));
        }
        out += &super::dropped_line(&self.counters);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts_ns: u64, tid: u32, start: bool, name: &str) -> ImportEvent {
        ImportEvent { ts_ns, tid, start, found: true, name: name.into() }
    }

    #[test]
    fn nests_per_thread_and_computes_self_time() {
        let events = [
            ev(0, 1, true, "top"),
            ev(10, 1, true, "a"),
            ev(5, 2, true, "other"), // another thread, interleaved
            ev(30, 1, false, "a"),
            ev(40, 1, true, "b"),
            ev(45, 2, false, "other"),
            ev(100, 1, false, "b"),
            ev(110, 1, false, "top"),
            ev(120, 1, false, "started_before_attach"),
        ];
        let (roots, unfinished) = build_tree(&events);
        assert_eq!(unfinished, 1);
        assert_eq!(roots.len(), 2);
        let top = &roots[0];
        assert_eq!((top.name.as_str(), top.cumulative_ns, top.self_ns), ("top", 110, 110 - 20 - 60));
        let names: Vec<&str> = top.children.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["b", "a"], "slowest first");
        assert_eq!(roots[1].name, "other");
    }
}
