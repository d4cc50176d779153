//! A `gc` run from start to end: the target found or started, the gc
//! program attached (USDT probes, or a watchpoint set once the interpreter
//! exists), every collection handed on as it arrives, until the target
//! exits, the duration runs out or a stop signal comes.

use std::cell::Cell;
use std::time::Duration;

use anyhow::Result;

use super::{Run, Target, TargetSpec};
use crate::model::events::Collection;
use crate::tracing::gc::{self, GcData, Mode};
use crate::tracing::monotonic_ns;

/// Traces `spec`'s collections in `requested` mode (None: the USDT probes
/// where they exist), giving each to `on_collection` with how long after
/// the target was let run it began; the run ends early once it returns
/// false (nowhere left to print).
pub fn trace_gc(spec: TargetSpec, duration: Option<Duration>, requested: Option<Mode>, on_collection: impl Fn(&Collection, u64) -> bool) -> Result<(Run, GcData)> {
    let (target, python) = Target::prepare(spec)?;
    let (mode, _why) = gc::choose_mode(&python, requested)?;
    let pid = target.pid;
    let attached_at = Cell::new(monotonic_ns());
    let stopped = Cell::new(false);
    let each = |c: Collection| {
        if !stopped.get() && !on_collection(&c, c.start_ns.saturating_sub(attached_at.get())) {
            stopped.set(true);
        }
    };
    let plan = gc::Plan { pid, python: &python, mode, started_by_us: target.started_by_us(), on_collection: &each };
    let release = |session: &gc::Session, target: &mut Target| {
        // Watchpoint mode on a command we started: its interpreter exists
        // only once it runs Python; it stops there for the watchpoint.
        match session.waits_for_first_eval() {
            true => target.release_at_first_eval(|| session.watch_at_first_eval())?,
            false => target.release()?,
        }
        session.released();
        attached_at.set(monotonic_ns());
        Ok(())
    };
    target.trace(&python, mode.name(), duration, plan, release, |_, _| Ok(!stopped.get()))
}
