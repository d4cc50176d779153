//! pytrace: traces and profiles running CPython processes from outside, with
//! eBPF. See README.md.

mod bpf;
mod cli;
mod commands;
mod console;
mod kernel;
mod model;
mod native;
mod out_of_memory;
mod process;
mod python;
mod report;
mod session;
mod tracing;

#[global_allocator]
static ALLOCATOR: out_of_memory::ExitWhenExhausted = out_of_memory::ExitWhenExhausted;

fn main() {
    out_of_memory::say_failed_thread_stacks();
    let cli = cli::Cli::parse_or_exit();
    bpf::load::capture_libbpf_messages();
    match cli.run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One sentence, most specific cause last: "what failed: why".
            crate::console::err(&format!("pytrace: {e:#}\n"));
            std::process::exit(1);
        }
    }
}
