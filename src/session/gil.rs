//! A `gil` run from start to end: the target found or started, its GIL's
//! probe points found (a command pytrace cannot measure never runs), the
//! gil program attached, its window opened as the target is let run.

use std::time::Duration;

use anyhow::Result;

use super::{Run, Target, TargetSpec};
use crate::tracing::gil::{self, GilData};

/// Measures `spec`'s GIL until it exits, the duration runs out or a stop
/// signal comes. The run's mode is where the probes went
/// (`GilProbes::describe`).
pub fn trace_gil(spec: TargetSpec, duration: Option<Duration>) -> Result<(Run, GilData)> {
    let (target, python) = Target::prepare(spec)?;
    let probes = gil::probe_points(&python)?;
    let mode = probes.describe();
    let plan = gil::Plan { pid: target.pid, python: &python, probes };
    let release = |session: &gil::Session, target: &mut Target| {
        session.open()?;
        target.release()
    };
    let (mut run, data) = target.trace(&python, "uprobe", duration, plan, release, |_, _| Ok(true))?;
    run.mode = mode.into();
    Ok((run, data))
}
