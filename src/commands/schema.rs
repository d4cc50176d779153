//! `pytrace schema KIND` (hidden): prints the JSON Schema of a report kind,
//! which docs/schema/KIND.json holds (src/report/schema.rs makes it).

use anyhow::{bail, Result};

use crate::report::schema;

pub fn run(kind: &str) -> Result<i32> {
    let Some(text) = schema::schema_text(kind) else {
        bail!("no JSON report is called {kind:?}: the kinds are {}", schema::KINDS.join(", "));
    };
    crate::console::out(&text)?;
    Ok(0)
}
