//! The eval-frame hook around a calls session (src/python/eval_hook.rs):
//! owned before any BPF object exists, set once the probes are attached,
//! watched between polls, put back once they are detached.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::Target;
use crate::model::hook::HookOutcome;
use crate::python::eval_hook::{EvalHook, Guardian, Installed};
use crate::python::hook_owner::HookLock;
use crate::python::Python;
use crate::tracing::Mode;

/// The eval-frame hook around a calls session (src/python/eval_hook.rs): on
/// 3.11+ in uprobe mode it is owned (one run at a time), set once the probes
/// are attached, watched while tracing and restored at the end, in the
/// target and its children; a guardian restores it if pytrace dies first.
pub struct HookedRelease {
    hook: Option<EvalHook>,
    guardian: RefCell<Option<Guardian>>,
    armed: Cell<bool>,
    installed: RefCell<Installed>,
    last_check: Cell<Option<Instant>>,
    /// The pytrace whose killed run left the hook's lock file, if one did.
    left_by: Option<u32>,
}

impl HookedRelease {
    /// Takes ownership of the hook and forks the guardian if the hook is
    /// needed: call before any BPF object or thread exists.
    pub fn new(target: &Target, python: &Python, mode: Mode) -> Result<Self> {
        let hook = if mode == Mode::Uprobe && python.inlines_calls() { Some(EvalHook::new(target.pid, python)?) } else { None };
        let (guardian, left_by) = match &hook {
            Some(hook) => {
                let lock = HookLock::acquire(target.pid)?;
                let left_by = lock.previous_owner;
                (Some(hook.spawn_guardian(lock)?), left_by)
            }
            None => (None, None),
        };
        Ok(HookedRelease {
            hook,
            guardian: RefCell::new(guardian),
            armed: Cell::new(false),
            installed: RefCell::new(Installed::default()),
            last_check: Cell::new(None),
            left_by,
        })
    }

    /// A command we start has no interpreter yet to set the hook in: the BPF
    /// program stops it at its first frame evaluation and `release` sets it then.
    pub fn stop_at_first_eval(&self, target: &Target) -> bool {
        self.hook.is_some() && target.started_by_us()
    }

    /// Once every probe is attached: sets the hook and lets the target run.
    pub fn release(&self, target: &mut Target) -> Result<()> {
        // Armed only as the hook is set: a command killed before its first
        // evaluation has nothing of ours to put back, and nothing is said.
        let install = |hook: &EvalHook| -> Result<()> {
            self.armed.set(true);
            if let Some(guardian) = self.guardian.borrow().as_ref() {
                guardian.arm();
            }
            *self.installed.borrow_mut() = hook.install()?;
            Ok(())
        };
        match &self.hook {
            Some(hook) if target.started_by_us() => target.release_at_first_eval(|| install(hook)),
            Some(hook) => {
                install(hook)?;
                target.release()
            }
            None => target.release(),
        }
    }

    /// A process the target forked while traced: it inherited the hook.
    pub fn watch_child(&self, child: u32) {
        if let Some(guardian) = self.guardian.borrow_mut().as_mut() {
            guardian.watch_child(child);
        }
    }

    /// The calls program's map of followed children, for the guardian.
    pub fn share_children_map(&self, map: std::os::fd::BorrowedFd<'_>) {
        if let Some(guardian) = self.guardian.borrow().as_ref() {
            guardian.share_children_map(map);
        }
    }

    /// Between polls: reads the hook back (at most every 100 ms), so a
    /// change by someone else is reported.
    pub fn watch(&self) {
        let Some(hook) = self.hook.as_ref().filter(|_| self.armed.get()) else { return };
        if self.last_check.get().is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.last_check.set(Some(Instant::now()));
        hook.verify();
    }

    /// Puts the hook back (once the probes are detached) in the target and
    /// its children, and ends the guardian; says what happened to the hook.
    pub fn restore(self, target: &Target) -> HookOutcome {
        let mut outcome = HookOutcome::default();
        let guardian = self.guardian.into_inner();
        let Some(hook) = self.hook.as_ref().filter(|_| self.armed.get()) else {
            if let Some(g) = guardian {
                g.finish();
            }
            return outcome;
        };
        if target.is_running() {
            if let Err(e) = hook.restore() {
                crate::report::console::err(&format!("pytrace: warning: could not restore interp->eval_frame in PID {}: {e:#}\n", target.pid));
            }
        }
        if let Some(g) = guardian {
            hook.restore_children(&g.children);
            g.finish();
        }
        let installed = self.installed.into_inner();
        outcome.incomplete = hook.changed();
        if !installed.foreign.is_empty() {
            let values: Vec<String> = installed.foreign.iter().map(|v| format!("{v:#x}")).collect();
            let why = format!(
                "interp->eval_frame in process {} already held another tool's PEP 523 hook ({}), which pytrace left as it was: calls that hook runs without _PyEval_EvalFrameDefault were not seen, so counts may be incomplete",
                target.pid,
                values.join(", ")
            );
            outcome.incomplete.get_or_insert(why);
        }
        // Only the lock file a killed run left says a run left the hook:
        // without it, the value may be the build's or another tool's own.
        match (installed.adopted, self.left_by) {
            (0, _) => {}
            (_, Some(left_by)) => outcome.notes.push(format!(
                "interp->eval_frame in process {} already held pytrace's value, left by pytrace PID {left_by}, which ended without putting it back; this run restored it",
                target.pid
            )),
            (_, None) => outcome.notes.push(format!(
                "interp->eval_frame in process {} already held _PyEval_EvalFrameDefault when this run began, with no pytrace run on record that set it (the build or another tool may set it); this run traced with it and put NULL, CPython's default, back at the end",
                target.pid
            )),
        }
        outcome
    }
}
