//! The eval-frame hook around a calls session (src/python/target_writes/eval_hook.rs):
//! owned before any BPF object exists, set once the probes are attached,
//! watched between polls, put back as the traced window ends, before the
//! probes are detached.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::Target;
use crate::model::hook::HookOutcome;
use crate::python::target_writes::eval_hook::{EvalHook, Guardian, Installed};
use crate::python::target_writes::hook_owner::HookLock;
use crate::python::Python;
use crate::tracing::calls::ChildWatch;
use crate::tracing::Mode;

/// The eval-frame hook around a calls session (src/python/target_writes/eval_hook.rs): on
/// 3.11+ in uprobe mode it is owned (one run at a time), set once the probes
/// are attached, watched while tracing and restored at the end, in the
/// target and its children; a guardian restores it if pytrace dies first.
pub struct HookedRelease {
    hook: Option<EvalHook>,
    /// Shared with the calls program's plan (`children`), which tells it
    /// of the target's children.
    guardian: Rc<RefCell<Option<Guardian>>>,
    armed: Cell<bool>,
    installed: RefCell<Installed>,
    last_check: Cell<Option<Instant>>,
    /// The pytrace whose killed run left the hook's lock file, if one did.
    left_by: Option<u32>,
    /// Interpreters created while traced that the hook was set in.
    late_interpreters: Cell<usize>,
    /// The hook was put back (`put_back`).
    put_back: Cell<bool>,
}

impl HookedRelease {
    /// Takes ownership of the hook and forks the guardian if the hook is
    /// needed: call before any BPF object or thread exists.
    pub fn new(target: &Target, python: &Python, mode: Mode) -> Result<Self> {
        let hook = if mode == Mode::Uprobe && python.inlines_calls() { Some(EvalHook::new(target.pid, python)?) } else { None };
        // A running target's code is there to check now, before any probe
        // is attached; a command we start is checked as the hook is set.
        if let (Some(hook), false) = (&hook, target.started_by_us()) {
            hook.check_target_code()?;
        }
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
            guardian: Rc::new(RefCell::new(guardian)),
            armed: Cell::new(false),
            installed: RefCell::new(Installed::default()),
            last_check: Cell::new(None),
            left_by,
            late_interpreters: Cell::new(0),
            put_back: Cell::new(false),
        })
    }

    /// A command we start has no interpreter yet to set the hook in: the BPF
    /// program stops it at its first frame evaluation and `release` sets it then.
    pub fn stop_at_first_eval(&self, target: &Target) -> bool {
        self.hook.is_some() && target.started_by_us()
    }

    /// Once every probe is attached: sets the hook and lets the target
    /// run, with `start_counting` called where the traced window opens: in
    /// a running process, once the hook is set (before, 3.11+ inlined the
    /// calls Python made and the probes saw those made from C); in a
    /// command we started, before it runs any Python.
    /// `hook_set` runs once the hook is set.
    pub fn release(&self, target: &mut Target, start_counting: impl FnOnce(), hook_set: impl FnOnce()) -> Result<()> {
        // Armed only as the hook is set: a command killed before its first
        // evaluation has nothing of ours to put back, and nothing is said.
        let install = |hook: &EvalHook| -> Result<()> {
            self.armed.set(true);
            if let Some(guardian) = self.guardian.borrow().as_ref() {
                guardian.arm();
            }
            *self.installed.borrow_mut() = hook.install()?;
            hook_set();
            Ok(())
        };
        match &self.hook {
            Some(hook) if target.started_by_us() => {
                start_counting();
                target.release_at_first_eval(|| install(hook))
            }
            Some(hook) => {
                install(hook)?;
                start_counting();
                target.release()
            }
            None => {
                start_counting();
                target.release()
            }
        }
    }

    /// What the calls program tells of the target's children, for the
    /// guardian (none without a hook): the program's plan owns it.
    pub fn children(&self) -> Box<dyn ChildWatch> {
        Box::new(GuardedChildren(Rc::clone(&self.guardian)))
    }

    /// Between polls (at most every 100 ms): reads the hook back, so a
    /// change by someone else is reported, and sets it in interpreters
    /// created since (subinterpreters).
    pub fn watch(&self) {
        let Some(hook) = self.hook.as_ref().filter(|_| self.armed.get() && !self.put_back.get()) else { return };
        if self.last_check.get().is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.last_check.set(Some(Instant::now()));
        hook.verify();
        // A target that is exiting may have no list to read: nothing to hook.
        if let Ok(added) = hook.install_new() {
            self.late_interpreters.set(self.late_interpreters.get() + added);
        }
    }

    /// Puts the hook back in the target and its children, once the traced
    /// window has ended and before the probes are detached: the target
    /// runs at full speed again at once, whatever the detach then waits
    /// for. (Before, it was put back after the detach, so that no call
    /// went unseen while the probes were on; now the probes count nothing
    /// by then.) Once only.
    pub fn put_back(&self, target: &Target) {
        let Some(hook) = self.hook.as_ref().filter(|_| self.armed.get() && !self.put_back.get()) else { return };
        self.put_back.set(true);
        if target.is_running() {
            if let Err(e) = hook.restore() {
                crate::console::err(&format!("pytrace: warning: could not restore interp->eval_frame in PID {}: {e:#}\n", target.pid));
            }
        }
        if let Some(g) = self.guardian.borrow().as_ref() {
            hook.restore_children(&g.children);
        }
    }

    /// Puts the hook back if `put_back` has not (an error path), ends the
    /// guardian, and says what happened to the hook.
    pub fn restore(self, target: &Target) -> HookOutcome {
        let mut outcome = HookOutcome::default();
        self.put_back(target);
        let guardian = self.guardian.borrow_mut().take();
        let Some(hook) = self.hook.as_ref().filter(|_| self.armed.get()) else {
            if let Some(g) = guardian {
                g.finish();
            }
            return outcome;
        };
        if let Some(g) = guardian {
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
        let late = self.late_interpreters.get();
        if late > 0 {
            outcome.incomplete.get_or_insert(format!(
                "{late} interpreter(s) created in process {} while it was traced (subinterpreters) got the eval-frame hook within 100 ms of appearing: calls CPython ran inline in them before that were not seen, so their counts may be incomplete",
                target.pid
            ));
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

/// The guardian's end of the calls program's children (`children`).
struct GuardedChildren(Rc<RefCell<Option<Guardian>>>);

impl ChildWatch for GuardedChildren {
    /// The guardian keeps the map of followed children.
    fn share_map(&self, map: std::os::fd::BorrowedFd<'_>) {
        if let Some(guardian) = self.0.borrow().as_ref() {
            guardian.share_children_map(map);
        }
    }

    /// A process the target forked while traced: it inherited the hook.
    fn forked(&self, child: u32) {
        if let Some(guardian) = self.0.borrow_mut().as_mut() {
            guardian.watch_child(child);
        }
    }
}
