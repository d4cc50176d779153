//! sample's profile for pprof (encoded by crate::report::pprof).

use anyhow::Result;

use super::Profile;
use crate::report::pprof::{encode, unix_ns_ago, PprofInput, StackValues};

impl Profile {
    /// pprof's gzipped profile.proto, valued in samples and in time at
    /// the sampling period; `time` names that time: "cpu" for on-CPU
    /// sampling, "wall" for --idle.
    pub fn to_pprof(&self, time: &'static str) -> Result<Vec<u8>> {
        self.to_pprof_from(time, unix_ns_ago(self.duration_ns))
    }

    /// The same, for a window that began at `start_unix_ns` (the agent's
    /// intervals, cut after they end).
    pub fn to_pprof_from(&self, time: &'static str, start_unix_ns: i64) -> Result<Vec<u8>> {
        let period_ns = (1_000_000_000 / self.hz.max(1)) as i64;
        let mut comments = vec![format!("pytrace sample: {}", self.subject())];
        comments.extend(crate::report::counted_line(&self.counters).lines().map(str::to_string));
        comments.extend(crate::report::dropped_line(&self.counters).lines().map(str::to_string));
        encode(&PprofInput {
            value_types: vec![("samples", "count"), (time, "nanoseconds")],
            stacks: self
                .stacks
                .iter()
                .map(|((thread, frames), &n)| StackValues { thread, frames, values: vec![n as i64, n as i64 * period_ns] })
                .collect(),
            period: Some((time, "nanoseconds", period_ns)),
            start_unix_ns,
            duration_ns: self.duration_ns,
            comments,
        })
    }
}
