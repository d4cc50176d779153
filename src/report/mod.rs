//! Every report pytrace prints or writes: terminal tables and JSON. The
//! subcommands hand plain data here and never format it themselves.

pub mod calls;
pub mod compare;
pub mod gc;
pub mod imports;
pub mod output;
pub mod profile;

use anyhow::Result;

pub use output::Output;

use crate::model::counters::{Counters, Kind};

/// Which Python a report is about and how pytrace saw it.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct PythonInfo {
    pub version: String,
    pub mode: String,
}

/// Writes a report: JSON to `json` if given, and the table to stdout unless
/// the JSON already went there.
pub fn emit(json: Option<&mut Output>, to_json: impl FnOnce() -> String, to_table: impl FnOnce() -> String) -> Result<()> {
    let table_on_stdout = !matches!(json, Some(Output::Stdout));
    if let Some(out) = json {
        out.write_all(to_json().as_bytes())?;
    }
    if table_on_stdout {
        print!("{}", to_table());
    }
    Ok(())
}

/// A table's last lines: every counter that is not zero, what was counted
/// with nothing missing first, then every event lost or input refused, in
/// the `dropped:` line, last, so that a table is never read as complete
/// when it is not.
pub fn counters_footer(counters: &Counters) -> String {
    let said = |kinds: &[Kind]| -> Vec<String> {
        counters.iter().filter(|c| c.value > 0 && kinds.contains(&c.kind)).map(|c| format!("{} {}", thousands(c.value), c.what)).collect()
    };
    let mut out = String::new();
    let counted = said(&[Kind::Informational]);
    if !counted.is_empty() {
        out += &format!("also counted: {}\n", counted.join("; "));
    }
    let dropped = said(&[Kind::Lost, Kind::Refused]);
    if dropped.is_empty() {
        out += "dropped: nothing\n";
    } else {
        out += &format!("dropped: {}\n", dropped.join("; "));
    }
    out
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
    fn counts_take_their_plural() {
        assert_eq!(super::counted(1, "function"), "1 function");
        assert_eq!(super::counted(0, "lost event"), "0 lost events");
        assert_eq!(super::counted(1234, "call"), "1,234 calls");
    }

    use super::*;

    #[test]
    fn the_footer_says_every_counter_that_is_not_zero_and_ends_with_the_drops() {
        use crate::model::counters::{Counters, Kind};
        let mut c = Counters::default();
        assert_eq!(counters_footer(&c), "dropped: nothing\n");
        c.push("seen", Kind::Informational, "evaluations", 1234);
        c.push("zero", Kind::Informational, "never said", 0);
        assert_eq!(counters_footer(&c), "also counted: 1,234 evaluations\ndropped: nothing\n");
        c.push("full", Kind::Lost, "calls not counted", 3);
        c.push("bad", Kind::Refused, "unreadable objects", 2);
        assert_eq!(counters_footer(&c), "also counted: 1,234 evaluations\ndropped: 3 calls not counted; 2 unreadable objects\n");
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
