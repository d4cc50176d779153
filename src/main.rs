//! pytrace: traces and profiles running CPython processes from outside, with
//! eBPF. See README.md.

mod bpf;
mod cli;
mod commands;
mod kernel;
mod model;
mod native;
mod process;
mod python;
mod report;
mod session;
mod tracing;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    bpf::load::capture_libbpf_messages();
    match cli.run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One sentence, most specific cause last: "what failed: why".
            report::console::err(&format!("pytrace: {e:#}\n"));
            std::process::exit(1);
        }
    }
}
