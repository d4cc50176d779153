//! The version matrix: every subcommand, on every fixture, on Debian's
//! CPython 3.9 (bullseye) and 3.13, 3.14, 3.15 (sid), each run in a chroot
//! of a minimal Debian root made by scripts/pythons.sh. The target then sees
//! other paths than pytrace does, as a Python in a container would: pytrace
//! must find its files through /proc/PID/root. (3.11 is covered by the other
//! test files, on this machine's two builds.) The bodies are in
//! tests/integration/common/matrix.rs, shared with matrix_pyenv.rs.

use crate::common::matrix::*;
use crate::common::over_builds;

// One module per version, one test per body, each on a fresh
// `Interpreter::debian(version)`.
over_builds! {
    python_3_9(&Interpreter::debian("3.9")): calls_equal_cprofile, usdt_mode_counts_equal_cprofile, calls_threads_and_reused_code_objects, gc_equals_gc_callbacks, imports_tree, sample_split_threads_and_depth, sample_periodic_work_at_exact_rates, sample_idle_sees_sleepers, sample_native_puts_c_frames_under_their_python_caller, compare_sees_the_split_on_both_sides, info_names_each_mode, thread_names_in_dump_and_sample, stacks_read_while_running_are_ones_it_can_have, module_bodies_are_named_after_their_own_files;
    python_3_13(&Interpreter::debian("3.13")): sample_starts_at_the_commands_first_line, calls_equal_cprofile, calls_threads_and_reused_code_objects, gc_equals_gc_callbacks, imports_tree, sample_split_threads_and_depth, sample_periodic_work_at_exact_rates, sample_idle_sees_sleepers, sample_native_puts_c_frames_under_their_python_caller, compare_sees_the_split_on_both_sides, info_names_each_mode, thread_names_in_dump_and_sample, stacks_read_while_running_are_ones_it_can_have, a_killed_calls_run_puts_the_hook_back, module_bodies_are_named_after_their_own_files;
    python_3_14(&Interpreter::debian("3.14")): calls_equal_cprofile, calls_threads_and_reused_code_objects, gc_equals_gc_callbacks, imports_tree, sample_split_threads_and_depth, sample_periodic_work_at_exact_rates, sample_idle_sees_sleepers, sample_native_puts_c_frames_under_their_python_caller, compare_sees_the_split_on_both_sides, info_names_each_mode, thread_names_in_dump_and_sample, stacks_read_while_running_are_ones_it_can_have, a_killed_calls_run_puts_the_hook_back, module_bodies_are_named_after_their_own_files;
    python_3_15(&Interpreter::debian("3.15")): calls_equal_cprofile, usdt_mode_counts_equal_cprofile, calls_threads_and_reused_code_objects, gc_equals_gc_callbacks, imports_tree, sample_split_threads_and_depth, sample_periodic_work_at_exact_rates, sample_idle_sees_sleepers, sample_native_puts_c_frames_under_their_python_caller, compare_sees_the_split_on_both_sides, info_names_each_mode, thread_names_in_dump_and_sample, stacks_read_while_running_are_ones_it_can_have, module_bodies_are_named_after_their_own_files;
}
