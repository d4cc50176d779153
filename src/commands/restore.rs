//! `pytrace restore`: puts back by hand an eval-frame hook that a pytrace
//! run left set (its guardian could not run: a machine-wide kill, an OOM
//! kill of both). See src/python/target_writes/eval_hook.rs.

use anyhow::{bail, Result};

use crate::python::target_writes::eval_hook;
use crate::python::Python;

pub fn run(pid: u32) -> Result<i32> {
    crate::session::preflight()?;
    let python = Python::from_pid(pid)?;
    if !python.inlines_calls() {
        bail!("Python {} in process {pid} has no eval-frame hook that pytrace sets (only 3.11 and later): nothing to restore", python.version);
    }
    crate::console::out(&format!("pytrace restore: {}\n", eval_hook::restore_by_hand(pid, &python)?))?;
    Ok(0)
}
