//! `pytrace info`: what pytrace finds in a Python process or binary, which
//! mode each subcommand would use, and what this kernel allows.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::python::Python;
use crate::report::info::{Findings, KernelFindings, KernelOnly};
use crate::report::{self, Output};

pub struct Options {
    pub pid: Option<u32>,
    pub binary: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

pub fn run(opts: Options) -> Result<i32> {
    let mut json = opts.json.as_deref().map(Output::create).transpose()?;
    let python = match (opts.pid, &opts.binary) {
        (Some(pid), _) => Python::from_pid(pid)?,
        (None, Some(path)) => Python::from_executable(path, None)?.with_context(|| format!("{} is not a CPython executable or libpython", path.display()))?,
        (None, None) => {
            // The kernel alone: its JSON if asked for, else its table.
            let only = KernelOnly { kind: report::ReportKind::Info, kernel: KernelFindings::get() };
            match json {
                Some(mut out) => out.write_all(only.to_json().as_bytes())?,
                None => crate::console::out(&only.kernel.to_table())?,
            }
            return Ok(0);
        }
    };
    let findings = Findings::of(&python, opts.pid)?;
    report::emit(json.as_mut(), || findings.to_json(), || findings.to_table())?;
    Ok(0)
}
