//! BPF sessions: load a program, point it at a target, collect what it
//! aggregated. One file per BPF program; the subcommands in src/commands
//! wire these to reports.

pub mod calls;
pub mod histogram;
