//! pytrace's integration tests, in one test binary: the real pytrace
//! binary run on real Python processes, each module one subject. One crate
//! rather than one per file, so the shared helpers in `common` are compiled
//! once and `cargo test` links one binary, not two dozen.
//!
//! Run one module or one test by its path:
//! `cargo test --release --test integration -- matrix::python_3_9::` or
//! `... -- --exact gil::pyenv_3_12::threads_own_measures`.

// clippy.toml keeps pytrace's own output behind its terminal filter; a
// test's prints go to libtest's captured output, shown only when it fails.
#![allow(clippy::disallowed_macros)]

mod common;

mod calls;
mod cli_limits;
mod compare;
mod containers;
mod dump_async;
mod errors;
mod formats;
mod free_threaded;
mod gc;
mod gil;
mod implicit_calls;
mod imports;
mod info;
mod launch;
mod matrix;
mod matrix_pyenv;
mod native_truth;
mod safety;
mod sample;
mod sample_async;
mod sample_gil;
mod sample_native;
mod terminal_escapes;
mod viewers;
mod memory;
mod heap;
mod agent;
