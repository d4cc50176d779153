//! What the eval-frame hook (src/python/target_writes/eval_hook.rs) went through in a
//! calls run, as the reports say it.

/// What the hook went through in a run, for the report.
#[derive(Debug, Default)]
pub struct HookOutcome {
    /// Why the counts are incomplete, if they are.
    pub incomplete: Option<String>,
    /// Everything else worth saying about the hook.
    pub notes: Vec<String>,
}
