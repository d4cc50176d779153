//! Every report pytrace prints or writes: terminal tables and JSON. The
//! subcommands hand plain data here and never format it themselves.

pub mod calls;
pub mod compare;
pub mod dump;
pub mod gc;
pub mod gil;
pub mod imports;
pub mod info;
pub mod output;
pub mod pprof;
pub mod profile;
pub mod pstats;
pub mod schema;
pub mod terminal;
pub mod top;
pub mod top_memory;
pub mod memory;
pub mod heap;

use anyhow::Result;

pub use output::Output;

use crate::model::counters::{Counters, Kind};

/// The version of the JSON reports' layout, written first in every
/// report as `schema_version`. Bumped when a field is removed, renamed or
/// changes type or meaning; adding a field keeps it (docs/json.md).
pub const SCHEMA_VERSION: u32 = 1;

/// A report as the JSON text pytrace writes: pretty-printed, with
/// `schema_version` before the report's own fields, and a final newline.
/// Every report goes through here so that none can leave the version out.
pub fn to_json_text<T: serde::Serialize>(report: &T) -> String {
    #[derive(serde::Serialize)]
    struct Versioned<'a, T> {
        schema_version: u32,
        #[serde(flatten)]
        report: &'a T,
    }
    serde_json::to_string_pretty(&Versioned { schema_version: SCHEMA_VERSION, report }).expect("a report serializes") + "\n"
}

/// Which subcommand wrote a JSON report: its `kind` field, so that a
/// report given to `compare` is told by what it says it is.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq, Debug, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReportKind {
    Calls,
    Gc,
    Gil,
    Imports,
    Sample,
    Compare,
    Dump,
    Info,
    Heap,
    Memory,
}

impl ReportKind {
    /// The command that writes it, as error messages name it.
    pub fn command(self) -> &'static str {
        match self {
            ReportKind::Calls => "`pytrace calls --json`",
            ReportKind::Gc => "`pytrace gc --json`",
            ReportKind::Gil => "`pytrace gil --json`",
            ReportKind::Imports => "`pytrace imports --json`",
            ReportKind::Sample => "`pytrace sample --json`",
            ReportKind::Compare => "`pytrace compare --json`",
            ReportKind::Dump => "`pytrace dump --json`",
            ReportKind::Info => "`pytrace info --json`",
            ReportKind::Heap => "`pytrace heap --json`",
            ReportKind::Memory => "`pytrace memory --json`",
        }
    }
}

/// Which Python a report is about and how pytrace saw it.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
pub struct PythonInfo {
    pub version: String,
    pub mode: String,
}

/// Writes a report: JSON to `json` if given, and the table to stdout unless
/// the JSON already went there, even when writing the JSON failed.
pub fn emit(json: Option<&mut Output>, to_json: impl FnOnce() -> String, to_table: impl FnOnce() -> String) -> Result<()> {
    let table_on_stdout = !matches!(json, Some(Output::Stdout));
    let written = json.map_or(Ok(()), |out| out.write_all(to_json().as_bytes()));
    if table_on_stdout {
        crate::console::out(&to_table())?;
    }
    written
}

/// The non-zero counters of these kinds, each as "N what".
fn said(counters: &Counters, kinds: &[Kind]) -> Vec<String> {
    counters.iter().filter(|c| c.value > 0 && kinds.contains(&c.kind)).map(|c| format!("{} {}", thousands(c.value), c.what)).collect()
}

/// A table's `counted:` line, above its columns: every informational
/// counter that is not zero (nothing is missing for them); empty if none.
pub fn counted_line(counters: &Counters) -> String {
    let counted = said(counters, &[Kind::Informational]);
    if counted.is_empty() {
        String::new()
    } else {
        format!("counted: {}\n", counted.join("; "))
    }
}

/// A table's last line: every event lost and input refused, so that a
/// table is never read as complete when it is not.
pub fn dropped_line(counters: &Counters) -> String {
    let dropped = said(counters, &[Kind::Lost, Kind::Refused]);
    if dropped.is_empty() {
        "dropped: nothing\n".into()
    } else {
        format!("dropped: {}\n", dropped.join("; "))
    }
}

/// Nanoseconds in the unit that keeps three or four significant digits.
pub fn human_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e6 {
        format!("{:.2}µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

/// "1 call", "1,234 calls": a count and its noun, plural unless it is one.
pub fn counted(n: u64, noun: &str) -> String {
    format!("{} {}", thousands(n), plural(n, noun))
}

/// The noun as `n` of it is written: "function", "functions".
pub fn plural(n: u64, noun: &str) -> String {
    if n == 1 { noun.to_string() } else { format!("{noun}s") }
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_report_begins_with_the_schema_version_and_keeps_its_fields() {
        #[derive(serde::Serialize)]
        struct Report {
            kind: super::ReportKind,
            pid: u32,
        }
        let text = super::to_json_text(&Report { kind: super::ReportKind::Gc, pid: 7 });
        assert_eq!(text, "{\n  \"schema_version\": 1,\n  \"kind\": \"gc\",\n  \"pid\": 7\n}\n");
        // A report built as a JSON value (sample's) gets it too.
        let text = super::to_json_text(&serde_json::json!({"pid": 7}));
        assert_eq!(text, "{\n  \"schema_version\": 1,\n  \"pid\": 7\n}\n");
    }

    #[test]
    fn counts_take_their_plural() {
        assert_eq!(super::counted(1, "function"), "1 function");
        assert_eq!(super::counted(0, "lost event"), "0 lost events");
        assert_eq!(super::counted(1234, "call"), "1,234 calls");
    }

    use super::*;

    #[test]
    fn every_counter_that_is_not_zero_is_said_and_drops_apart() {
        use crate::model::counters::{Counters, Kind};
        let mut c = Counters::default();
        assert_eq!((counted_line(&c).as_str(), dropped_line(&c).as_str()), ("", "dropped: nothing\n"));
        c.push("seen", Kind::Informational, "evaluations", 1234);
        c.push("zero", Kind::Informational, "never said", 0);
        assert_eq!((counted_line(&c).as_str(), dropped_line(&c).as_str()), ("counted: 1,234 evaluations\n", "dropped: nothing\n"));
        c.push("full", Kind::Lost, "calls not counted", 3);
        c.push("bad", Kind::Refused, "unreadable objects", 2);
        assert_eq!(dropped_line(&c), "dropped: 3 calls not counted; 2 unreadable objects\n");
    }

    #[test]
    fn formats_numbers_for_people() {
        assert_eq!(human_ns(999), "999ns");
        assert_eq!(human_ns(1_500), "1.50µs");
        assert_eq!(human_ns(2_345_678), "2.35ms");
        assert_eq!(human_ns(3_000_000_000), "3.00s");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(100), "100");
    }
}
