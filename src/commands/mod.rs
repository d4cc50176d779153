//! One file per subcommand: each wires a BPF session to a report.

pub mod calls;
pub mod compare;
pub mod dump;
pub mod gc;
pub mod gil;
pub mod imports;
pub mod sample;
pub mod info;
pub mod restore;
pub mod schema;
pub mod top;
pub mod top_calls;
pub mod top_memory;
pub mod memory;
pub mod heap;
pub mod agent;
