//! The comparison as a terminal table.

use super::flags::SUMMARISED;
use super::{ratio, Comparison};
use crate::report::{counted, human_ns, plural, thousands};

impl Comparison {
    pub fn to_table(&self, top: usize) -> String {
        let t = &self.traced;
        let s = &self.sampled;
        let o = &self.overhead;
        let mut out = format!(
            "pytrace compare: PID {}, Python {} ({} mode), {:.2} s\n",
            self.pid,
            self.python.version,
            self.python.mode,
            t.duration_ns as f64 / 1e9
        );
        out += &format!(
            "traced:  {} ({}) in {}, {} of self time, {}\n",
            counted(t.calls, "call"),
            counted(t.evaluations, "evaluation"),
            counted(t.functions as u64, "function"),
            human_ns(t.self_ns),
            counted(t.lost_events, "lost event")
        );
        out += &format!(
            "sampled: {} samples at {} Hz, {} lost; {} inside pytrace's probes ({:.1}%), set apart\n",
            thousands(s.samples),
            s.hz,
            thousands(s.lost_events),
            thousands(s.probe_samples),
            ratio(s.probe_samples, s.samples) * 100.0
        );
        out += &format!(
            "probe cost: {} per call ({} in the called function's self time, {} in its caller's), {}\n",
            human_ns(o.ns_per_call),
            human_ns(o.callee_ns_per_call),
            human_ns(o.caller_ns_per_call),
            o.basis
        );
        match t.corrected_self_ns {
            Some(c) => {
                out += &format!(
                    "corrected (*): {} of the {} traced self time is the probes' ({:.1}%)\n",
                    human_ns(t.self_ns - c),
                    human_ns(t.self_ns),
                    ratio(t.self_ns - c, t.self_ns) * 100.0
                )
            }
            None => out += "corrected (*): not available\n",
        }
        let (traced_ns, how) = match t.off_cpu_from {
            "cpu_time" => (t.self_ns, "the target's CPU time measured"),
            _ => (t.corrected_self_ns.unwrap_or(t.self_ns), "CPU time estimated from the samples"),
        };
        if t.off_cpu_ns > 0 {
            out += &format!(
                "off CPU: {} of the {} traced time ({:.0}%, against {how}) was not on a CPU (sleep, I/O, locks, the GIL, a busy machine): sampling does not see it\n",
                human_ns(t.off_cpu_ns as u64),
                human_ns(traced_ns),
                ratio(t.off_cpu_ns as u64, traced_ns) * 100.0
            );
        }
        for note in &self.notes {
            out += &format!("note: {note}\n");
        }
        let with = |kind: &str| self.functions.iter().filter(|r| r.flags.iter().any(|f| f.kind == kind)).count() as u64;
        let rare = with("below_sampling");
        if rare > 0 {
            out += &format!(
                "not compared: {} too short or rare for sampling to see (under one sample expected; --json flags each)\n",
                counted(rare, "function")
            );
        }
        let inflated = with("probe_cost");
        if inflated > 0 {
            out += &format!(
                "probe-heavy: {} with a quarter or more of their traced self time in pytrace's probes (short functions called often): read their * columns\n",
                counted(inflated, "function")
            );
        }
        out += &format!(
            "\n{:>12}  {:-^31}  {:-^15}  {:-^15}\n",
            "", " traced (wall time) ", " sampled (CPU) ", &format!(" diff vs {} ", if self.diff_against == "corrected" { "*" } else { "raw" })
        );
        out += &format!(
            "{:>12}  {:>7}{:>8}{:>8}{:>8}  {:>7}{:>8}  {:>7}{:>8}  {}\n",
            "calls", "total", "total*", "self", "self*", "total", "self", "total", "self", "function (file:line)"
        );
        let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.1}%", v * 100.0));
        let pts = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:+.1}", v * 100.0));
        for r in self.functions.iter().take(top) {
            out += &format!(
                "{:>12}  {:>7}{:>8}{:>8}{:>8}  {:>7}{:>8}  {:>7}{:>8}  {}\n",
                r.calls.map_or("–".to_string(), thousands),
                pct(r.traced_total_share),
                pct(r.corrected_total_share),
                pct(r.traced_self_share),
                pct(r.corrected_self_share),
                pct(Some(r.sampled_total_share)),
                pct(Some(r.sampled_self_share)),
                pts(r.total_diff),
                pts(r.self_diff),
                crate::report::profile::named_in(&r.name, &r.file, r.line)
            );
            for f in r.flags.iter().filter(|f| !SUMMARISED.contains(&f.kind)) {
                out += &format!("{:>14} {}\n", "↳", f.message);
            }
        }
        if self.functions.len() > top {
            let hidden = &self.functions[top..];
            let flagged = hidden.iter().filter(|r| r.flags.iter().any(|f| !SUMMARISED.contains(&f.kind))).count();
            out += &format!("… {} more {} (--top), {} of them flagged (--json has every row)\n", hidden.len(), plural(hidden.len() as u64, "function"), flagged);
        }
        out += "\nShares: traced of all traced self time (wall clock, every thread); sampled of the samples outside pytrace's\n\
                probes (CPU time). *: without the probes' estimated cost. diff: sampled minus traced share, in points.\n";
        out
    }
}
