//! Where the BPF programs attach, beyond the USDT probes and the exported
//! symbols: sites found by reading the interpreter's machine code (the GIL's
//! static functions, specialized instructions that run a call without
//! entering `_PyEval_EvalFrameDefault`, a generator close that never runs).

pub mod generator_close;
pub mod gil_sites;
pub mod inlined_getitem;
pub mod inlined_init;
pub mod opcode_table;
pub mod alloc_sites;
pub mod alloc_sites_stripped;
pub mod allocation_sites;

/// Addresses for a refusal's sentence: "0x1a2b, 0x3c4d", or "nothing".
fn hex_list(addresses: &[u64]) -> String {
    if addresses.is_empty() {
        return "nothing".into();
    }
    addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
}
