//! The JSON Schema of each JSON report, generated from the report types
//! themselves (schemars), so that the published schemas (docs/schema/) say
//! what the code writes. A unit test below fails when a checked-in schema
//! no longer matches its type.

use schemars::{JsonSchema, Schema};

use super::calls::CallsReport;
use super::compare::Comparison;
use super::dump::DumpReport;
use super::gc::GcReport;
use super::gil::GilReport;
use super::imports::ImportsReport;
use super::info::{Findings, KernelOnly};
use super::profile::SampleReport;
use super::heap::HeapReport;
use super::memory::MemoryReport;

/// Every report kind with a JSON form, as `pytrace schema` and
/// docs/schema/KIND.json name it.
pub const KINDS: [&str; 10] = ["calls", "compare", "dump", "gc", "gil", "imports", "info", "sample", "heap", "memory"];

// A report as `to_json_text` writes it: `schema_version` first, then the
// report's own fields. Only its schema is used.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct Versioned<T> {
    /// The layout's version (docs/json.md says when it changes).
    schema_version: u32,
    #[serde(flatten)]
    report: T,
}

/// `pytrace info`: the findings about a target, or with no target the
/// kernel alone.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code, clippy::large_enum_variant)] // never built: only its schema is
enum InfoReport {
    Findings(Findings),
    KernelOnly(KernelOnly),
}

/// The schema of what serializing T writes: a field skipped when empty
/// is optional, an Option written as null is required (schemars' default,
/// the deserialize contract, says the reverse of both).
fn written<T: JsonSchema>() -> Schema {
    schemars::generate::SchemaSettings::draft2020_12().for_serialize().into_generator().into_root_schema_for::<T>()
}

/// The schema of one report kind, or None for a kind with no JSON report.
pub fn schema(kind: &str) -> Option<Schema> {
    let mut schema = match kind {
        "calls" => written::<Versioned<CallsReport>>(),
        "compare" => written::<Versioned<Comparison>>(),
        "dump" => written::<Versioned<DumpReport>>(),
        "gc" => written::<Versioned<GcReport>>(),
        "gil" => written::<Versioned<GilReport>>(),
        "imports" => written::<Versioned<ImportsReport>>(),
        "info" => written::<Versioned<InfoReport>>(),
        "sample" => written::<Versioned<SampleReport<'static>>>(),
        "heap" => written::<Versioned<HeapReport>>(),
        "memory" => written::<Versioned<MemoryReport>>(),
        _ => return None,
    };
    schema.insert("title".into(), format!("pytrace {kind} --json").into());
    schema.insert("description".into(), format!("The JSON report `pytrace {kind} --json` writes (docs/json.md).").into());
    // This schema describes one version of the layout, and says which.
    if let Some(version) = schema.get_mut("properties").and_then(|p| p.get_mut("schema_version")) {
        *version = serde_json::json!({ "description": "The layout's version: docs/json.md says when it changes.", "const": super::SCHEMA_VERSION });
    }
    // A report's `kind` names its own command, not any of them: wherever
    // the report's fields are (info's two shapes are in $defs).
    let mut value = schema.to_value();
    pin_kind(&mut value, kind);
    if let Some(defs) = value.get_mut("$defs").and_then(|d| d.as_object_mut()) {
        defs.remove("ReportKind");
    }
    let schema = Schema::try_from(value).expect("still a schema");
    Some(schema)
}

/// Every `kind` property typed as `ReportKind`, made the constant `kind`.
fn pin_kind(value: &mut serde_json::Value, kind: &str) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(properties) = map.get_mut("properties").and_then(|p| p.as_object_mut()) {
                if let Some(k) = properties.get_mut("kind").filter(|k| k.get("$ref").and_then(|r| r.as_str()) == Some("#/$defs/ReportKind")) {
                    *k = serde_json::json!({ "const": kind });
                }
            }
            map.values_mut().for_each(|v| pin_kind(v, kind));
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| pin_kind(v, kind)),
        _ => {}
    }
}

/// The schema as docs/schema/KIND.json holds it: pretty, with a final newline.
pub fn schema_text(kind: &str) -> Option<String> {
    schema(kind).map(|s| serde_json::to_string_pretty(&s).expect("a schema serializes") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in schemas are what the types generate today: a report
    /// type changed without its schema fails here (CI's cargo test stage).
    #[test]
    fn checked_in_schemas_match_the_report_types() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema");
        let mut stale = Vec::new();
        for kind in KINDS {
            let generated = schema_text(kind).unwrap();
            let path = docs.join(format!("{kind}.json"));
            if std::fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str()) {
                stale.push(format!("docs/schema/{kind}.json is stale: regenerate it with `pytrace schema {kind} > docs/schema/{kind}.json`"));
            }
        }
        assert!(stale.is_empty(), "{}", stale.join("\n"));
    }

    #[test]
    fn every_schema_requires_schema_version() {
        for kind in KINDS {
            let schema = schema(kind).unwrap();
            let required = schema.get("required").and_then(|r| r.as_array()).unwrap_or_else(|| panic!("{kind}: no required list"));
            assert!(required.iter().any(|r| r == "schema_version"), "{kind}: schema_version is not required");
        }
        assert!(schema("top").is_none());
    }
}
