//! sample's JSON report (what `compare --sampled` reads).

use std::collections::BTreeMap;

use serde_json::json;

use super::Profile;

impl Profile {
    pub fn to_json(&self) -> String {
        let threads: BTreeMap<&str, u64> = self.stacks.iter().fold(BTreeMap::new(), |mut m, ((t, _), n)| {
            *m.entry(t.as_str()).or_default() += n;
            m
        });
        crate::report::to_json_text(&json!({
            "kind": crate::report::ReportKind::Sample,
            "pid": self.pid,
            "python": self.python,
            "hz": self.hz,
            "duration_ns": self.duration_ns,
            "samples": self.total,
            "bpf_ns_per_sample": self.bpf_ns_per_sample,
            "cpu_ns": self.cpu_ns,
            "lost_events": self.lost(),
            "counters": self.counters,
            "functions": self.functions(),
            "threads": threads.into_iter().filter(|(t, _)| !t.is_empty()).map(|(t, n)| json!({"thread": t, "samples": n})).collect::<Vec<_>>(),
        }))
    }
}
