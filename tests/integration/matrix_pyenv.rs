//! The version matrix's assertions (common/matrix.rs) on pyenv's
//! CPython 3.10 and 3.12, which Debian does not package: shared libpython,
//! symbol tables, no USDT probes, run from this machine's root
//! (scripts/pythons.sh pyenv-3.10, pyenv-3.12). calls equal to cProfile by
//! `--` and by `-p` and to the profiling hook on four threads, gc equal to
//! gc.callbacks through the watchpoint on the collector's state, the
//! 60/30/10 CPU split sampled and compared, what `info` reports, and
//! Python thread names (also on pyenv's 3.13, whose threads Debian's sid
//! build names too), and module bodies named after their own files (also on
//! pyenv's 3.11, the one frame layout with f_globals before f_code).
//! (`imports` without probes is tested on these builds in imports.rs.)

use crate::common::matrix::*;
use crate::common::over_builds;

// One module per version, one test per body, each on a fresh
// `Interpreter::pyenv(version)`.
over_builds! {
    pyenv_3_9(&Interpreter::pyenv("3.9")): sample_starts_at_the_commands_first_line, stacks_read_while_running_are_ones_it_can_have;
    pyenv_3_10(&Interpreter::pyenv("3.10")): sample_starts_at_the_commands_first_line, calls_equal_cprofile, calls_threads_and_reused_code_objects, gc_equals_gc_callbacks, sample_split_threads_and_depth, compare_sees_the_split_on_both_sides, info_names_each_mode, thread_names_in_dump_and_sample, stacks_read_while_running_are_ones_it_can_have, module_bodies_are_named_after_their_own_files;
    pyenv_3_11(&Interpreter::pyenv("3.11")): stacks_read_while_running_are_ones_it_can_have, module_bodies_are_named_after_their_own_files;
    pyenv_3_12(&Interpreter::pyenv("3.12")): sample_starts_at_the_commands_first_line, calls_equal_cprofile, calls_threads_and_reused_code_objects, gc_equals_gc_callbacks, sample_split_threads_and_depth, compare_sees_the_split_on_both_sides, info_names_each_mode, thread_names_in_dump_and_sample, stacks_read_while_running_are_ones_it_can_have, module_bodies_are_named_after_their_own_files;
    pyenv_3_13(&Interpreter::pyenv("3.13")): thread_names_in_dump_and_sample;
}
