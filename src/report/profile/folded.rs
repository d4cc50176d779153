//! Folded stacks (Brendan Gregg's collapsed format), which the
//! flamegraph is drawn from too.

use super::Profile;
use crate::model::samples::Frame;

impl Profile {
    /// Brendan Gregg's collapsed format: `frame;frame;... count`, outermost
    /// first; with --threads the thread is the first frame. Stacks that read
    /// the same (a function's lines, merged by default) are one line.
    pub fn to_folded(&self, annotate: bool) -> String {
        let mut lines: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for ((thread, stack), n) in &self.stacks {
            let mut parts: Vec<String> = Vec::new();
            if !thread.is_empty() {
                parts.push(thread.clone());
            }
            for frame in stack {
                // `;` separates frames: never let a name add one.
                let mut l = self.view.label(frame).replace(';', ":");
                if annotate {
                    // inferno's java palette colours by these suffixes:
                    // green, aqua (its "inlined" colour), orange.
                    match frame.as_ref() {
                        Frame::Python { .. } => l.push_str("_[j]"),
                        Frame::Native { .. } => l.push_str("_[i]"),
                        Frame::Kernel(_) => l.push_str("_[k]"),
                        _ => {}
                    }
                }
                parts.push(l);
            }
            *lines.entry(parts.join(";")).or_default() += n;
        }
        lines.into_iter().map(|(stack, n)| format!("{stack} {n}\n")).collect()
    }
}
