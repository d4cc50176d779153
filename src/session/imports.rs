//! An `imports` run from start to end: the target found or started, its
//! mode chosen (the USDT probes where they exist), the imports program
//! attached, every import gathered.

use std::time::Duration;

use anyhow::Result;

use super::{Run, Target, TargetSpec};
use crate::tracing::imports::{self, ImportData, Mode};

/// Times `spec`'s imports in `requested` mode (None: the USDT probes where
/// they exist) until it exits, the duration runs out or a stop signal comes.
pub fn trace_imports(spec: TargetSpec, duration: Option<Duration>, requested: Option<Mode>) -> Result<(Run, ImportData)> {
    let (target, python) = Target::prepare(spec)?;
    let (mode, _why) = imports::choose_mode(&python, requested)?;
    let plan = imports::Plan { pid: target.pid, python: &python, mode };
    target.trace(&python, mode.name(), duration, plan, |_, target| target.release(), |_, _| Ok(true))
}
