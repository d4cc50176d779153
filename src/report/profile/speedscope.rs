//! speedscope's JSON file format.

use std::collections::{BTreeMap, HashMap};

use serde_json::json;

use super::{label, Profile};
use crate::model::samples::Frame;

impl Profile {
    /// speedscope's file format: one sampled profile per thread (or one).
    pub fn to_speedscope(&self) -> String {
        let mut frames: Vec<serde_json::Value> = Vec::new();
        // Frames that show the same are one frame: without --lines, every
        // line of a function.
        let mut index: HashMap<serde_json::Value, usize> = HashMap::new();
        let mut profiles: BTreeMap<&str, (Vec<Vec<usize>>, Vec<u64>)> = BTreeMap::new();
        for ((thread, stack), &n) in &self.stacks {
            let ids = stack
                .iter()
                .map(|f| {
                    let shown = match f.as_ref() {
                        // speedscope shows the line beside the file.
                        Frame::Python { name, file, line, first_line } => {
                            json!({"name": name, "file": file, "line": if self.view.lines { line } else { first_line }})
                        }
                        Frame::Native { name, module } => json!({"name": name, "file": module}),
                        other => json!({"name": label(other)}),
                    };
                    *index.entry(shown.clone()).or_insert_with(|| {
                        frames.push(shown);
                        frames.len() - 1
                    })
                })
                .collect();
            let p = profiles.entry(thread.as_str()).or_default();
            p.0.push(ids);
            p.1.push(n);
        }
        let profiles: Vec<serde_json::Value> = profiles
            .into_iter()
            .map(|(thread, (samples, weights))| {
                let end: u64 = weights.iter().sum();
                json!({
                    "type": "sampled",
                    "name": if thread.is_empty() { format!("PID {}", self.pid) } else { thread.to_string() },
                    "unit": self.weight.speedscope_unit(),
                    "startValue": 0,
                    "endValue": end,
                    "samples": samples,
                    "weights": weights,
                })
            })
            .collect();
        serde_json::to_string(&json!({
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames},
            "profiles": profiles,
            "name": format!("pytrace {}: PID {}", self.weight.command(), self.pid),
            "exporter": "pytrace",
        }))
        .expect("the profile serializes")
    }
}
