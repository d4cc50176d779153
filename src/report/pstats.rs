//! `calls --pstats`: the file cProfile's `dump_stats` writes, which
//! `pstats.Stats(FILE)`, `python -m pstats`, snakeviz, gprof2dot and tuna
//! open. It is one marshalled dict:
//!
//! ```text
//! {(file, first_line, name): (primitive_calls, calls, self_s, total_s,
//!                              {(caller's file, line, name): (calls, primitive_calls, self_s, total_s)})}
//! ```
//!
//! (an edge's tuple has its two counts the other way round, as cProfile
//! writes them). Functions are named as cProfile names them: by `co_name`,
//! not the qualified name the table shows.
//!
//! The only Rust crate that writes marshal is GPL-licensed, and this needs
//! five of marshal's types, so the writer is here (`Marshal` below).

use std::collections::BTreeMap;

use crate::model::functions::{CallEdge, EdgeStats, FunctionId, FunctionStats};

/// pstats' key for a function: (file, first line, co_name). A qualified
/// name's last part is the code object's co_name (`Square.area` is `area`,
/// `f.<locals>.<lambda>` is `<lambda>`).
fn pstats_key(f: &FunctionId) -> (String, u32, String) {
    let name = f.name.rsplit('.').next().unwrap_or(&f.name);
    (f.file.clone(), f.line, name.to_string())
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[derive(Default)]
struct Entry {
    stats: FunctionStats,
    callers: BTreeMap<(String, u32, String), EdgeStats>,
}

/// The pstats file for these functions and edges. Functions or edges that
/// share a pstats key (several code objects of one function) are added up,
/// as cProfile's own snapshot does.
pub fn encode<'a>(functions: impl IntoIterator<Item = (FunctionId, &'a FunctionStats)>, edges: &[CallEdge]) -> Vec<u8> {
    let mut entries: BTreeMap<(String, u32, String), Entry> = BTreeMap::new();
    for (id, stats) in functions {
        entries.entry(pstats_key(&id)).or_default().stats.merge(stats);
    }
    for edge in edges {
        // An edge into a function with no row (its name was lost) has
        // nowhere to go; cProfile's snapshot drops those too.
        if let Some(callee) = entries.get_mut(&pstats_key(&edge.callee)) {
            callee.callers.entry(pstats_key(&edge.caller)).or_default().merge(&edge.stats);
        }
    }

    let mut out = Marshal::default();
    out.dict_start();
    for ((file, line, name), entry) in &entries {
        out.key(file, *line, name);
        let s = &entry.stats;
        out.tuple(5);
        out.int(s.primitive_calls);
        out.int(s.calls);
        out.float(seconds(s.self_ns));
        out.float(seconds(s.total_ns));
        out.dict_start();
        for ((file, line, name), e) in &entry.callers {
            out.key(file, *line, name);
            out.tuple(4);
            out.int(e.calls);
            out.int(e.primitive_calls);
            out.float(seconds(e.self_ns));
            out.float(seconds(e.total_ns));
        }
        out.dict_end();
    }
    out.dict_end();
    out.bytes
}

/// Python's marshal format (Python/marshal.c), version 2: what every
/// Python 3 reads, with no back-references to keep track of.
#[derive(Default)]
struct Marshal {
    bytes: Vec<u8>,
}

impl Marshal {
    fn int(&mut self, v: u64) {
        if let Ok(small) = i32::try_from(v) {
            self.bytes.push(b'i');
            self.bytes.extend(small.to_le_bytes());
            return;
        }
        // TYPE_LONG: the count of 15-bit digits, then the digits, least
        // significant first.
        let mut digits = Vec::new();
        let mut rest = v;
        while rest > 0 {
            digits.push((rest & 0x7fff) as u16);
            rest >>= 15;
        }
        self.bytes.push(b'l');
        self.bytes.extend((digits.len() as i32).to_le_bytes());
        for d in digits {
            self.bytes.extend(d.to_le_bytes());
        }
    }

    fn float(&mut self, v: f64) {
        self.bytes.push(b'g');
        self.bytes.extend(v.to_le_bytes());
    }

    fn str(&mut self, s: &str) {
        self.bytes.push(b'u');
        self.bytes.extend((s.len() as u32).to_le_bytes());
        self.bytes.extend(s.as_bytes());
    }

    /// A tuple of `len` items; the caller writes them next.
    fn tuple(&mut self, len: u32) {
        self.bytes.push(b'(');
        self.bytes.extend(len.to_le_bytes());
    }

    /// A dict: key, value, key, value... then `dict_end`.
    fn dict_start(&mut self) {
        self.bytes.push(b'{');
    }

    fn dict_end(&mut self) {
        self.bytes.push(b'0');
    }

    /// A function's key: (file, line, name).
    fn key(&mut self, file: &str, line: u32, name: &str) {
        self.tuple(3);
        self.str(file);
        self.int(line as u64);
        self.str(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python 3.11's `marshal.dumps({("a.py", 3, "f"): (1, 2, 0.5, 1.5,
    /// {("b.py", 70000, "g"): (2, 1, 0.25, 0.75)}), ("c", 1 << 40, "h"): ()}, 2).hex()`:
    /// ints small and large, floats, strings, tuples and nested dicts.
    const PYTHON_WROTE: &str = "7b28030000007504000000612e7079690300000075010000006628050000006901000000690200000067000000000000e03f67000000000000f83f7b28030000007504000000622e7079697011010075010000006728040000006902000000690100000067000000000000d03f67000000000000e83f3028030000007501000000636c03000000000000000004750100000068280000000030";

    #[test]
    fn marshal_writes_what_python_writes() {
        let mut m = Marshal::default();
        m.dict_start();
        m.key("a.py", 3, "f");
        m.tuple(5);
        m.int(1);
        m.int(2);
        m.float(0.5);
        m.float(1.5);
        m.dict_start();
        m.key("b.py", 70000, "g");
        m.tuple(4);
        m.int(2);
        m.int(1);
        m.float(0.25);
        m.float(0.75);
        m.dict_end();
        // A line past i32 is no real line; it exercises TYPE_LONG.
        m.tuple(3);
        m.str("c");
        m.int(1 << 40);
        m.str("h");
        m.tuple(0);
        m.dict_end();
        let hex: String = m.bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, PYTHON_WROTE);
    }

    #[test]
    fn functions_are_keyed_by_code_name_and_merged_with_their_edges() {
        let id = |name: &str, line| FunctionId { name: name.into(), file: "app.py".into(), line };
        let stats = FunctionStats { calls: 3, primitive_calls: 1, self_ns: 2_000_000_000, total_ns: 4_000_000_000, ..Default::default() };
        let edge = |caller: &str, calls| CallEdge { caller: id(caller, 1), callee: id("Square.area", 5), stats: EdgeStats { calls, primitive_calls: 1, self_ns: 0, total_ns: 0 } };
        // Two code objects of one method, and two edges from one caller.
        let bytes = encode([(id("Square.area", 5), &stats), (id("Square.area", 5), &stats)], &[edge("main", 2), edge("main", 4)]);
        let mut want = Marshal::default();
        want.dict_start();
        want.key("app.py", 5, "area");
        want.tuple(5);
        want.int(2);
        want.int(6);
        want.float(4.0);
        want.float(8.0);
        want.dict_start();
        want.key("app.py", 1, "main");
        want.tuple(4);
        want.int(6);
        want.int(2);
        want.float(0.0);
        want.float(0.0);
        want.dict_end();
        want.dict_end();
        assert_eq!(bytes, want.bytes);
    }
}
