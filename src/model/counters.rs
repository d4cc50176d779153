//! What a session counted besides its results: every event lost, every
//! input refused, and what is worth knowing about a run. Each counter
//! carries its kind and a phrase saying what it counts, given where it is
//! read (the BPF program's enum, or the user-space cache that counts it),
//! so "lost" has one definition and every footer says every counter.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An event that happened and is missing from the results (a full ring
    /// buffer or map): the report's `lost_events`.
    Lost,
    /// An input pytrace would not use (an unreadable object, a return
    /// without its call): the results are complete about the rest.
    Refused,
    /// Worth knowing, missing nothing (evaluations seen, caches emptied).
    Informational,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// The key in the JSON reports.
    pub name: &'static str,
    pub kind: Kind,
    /// What one of it is, after its number: "functions' names lost (ring buffer full)".
    pub what: &'static str,
    pub value: u64,
}

/// A session's counters, in the order they were read; written to JSON as
/// an object of name to value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(Vec<Counter>);

impl Counters {
    pub fn push(&mut self, name: &'static str, kind: Kind, what: &'static str, value: u64) {
        self.0.push(Counter { name, kind, what, value });
    }

    pub fn get(&self, name: &str) -> u64 {
        self.0.iter().filter(|c| c.name == name).map(|c| c.value).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Counter> {
        self.0.iter()
    }

    /// Events missing from the results, whatever dropped them.
    pub fn lost(&self) -> u64 {
        self.of_kind(Kind::Lost).map(|c| c.value).sum()
    }

    /// The counters of one kind.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Counter> {
        self.0.iter().filter(move |c| c.kind == kind)
    }
}

impl Extend<Counter> for Counters {
    fn extend<I: IntoIterator<Item = Counter>>(&mut self, iter: I) {
        self.0.extend(iter)
    }
}

impl Serialize for Counters {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.iter().map(|c| (c.name, c.value)).collect::<BTreeMap<_, _>>().serialize(serializer)
    }
}

/// As serialized: a map of counter name to count.
impl schemars::JsonSchema for Counters {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Counters".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <BTreeMap<String, u64>>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_counts_only_the_lost_kind_and_json_is_a_map() {
        let mut c = Counters::default();
        c.push("event_lost", Kind::Lost, "events lost", 3);
        c.push("too_deep", Kind::Lost, "too deep", 2);
        c.push("bad", Kind::Refused, "bad", 7);
        c.push("seen", Kind::Informational, "seen", 100);
        assert_eq!(c.lost(), 5);
        assert_eq!(c.get("bad"), 7);
        assert_eq!(c.get("absent"), 0);
        assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"bad":7,"event_lost":3,"seen":100,"too_deep":2}"#);
    }
}
