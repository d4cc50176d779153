//! Compiles each bpf/*.bpf.c into a libbpf skeleton (src/bpf/<name>.skel.rs).
//! vmlinux.h, the kernel's types for CO-RE, is dumped from this machine's BTF
//! with bpftool into OUT_DIR; it is a build output, not a source file.

// Cargo reads a build script's standard output: printing is its protocol.
#![allow(clippy::disallowed_macros)]

use std::env;
use std::path::PathBuf;
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

// histogram_test: only the unit tests load it (src/model/latency.rs).
const PROGRAMS: &[&str] = &["calls", "gc", "gil", "imports", "sample", "histogram_test", "memory"];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let vmlinux = out.join("vmlinux.h");
    if !vmlinux.exists() {
        let dump = Command::new("bpftool")
            .args(["btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c"])
            .output()
            .expect("bpftool is needed to build pytrace: run scripts/install.sh");
        assert!(
            dump.status.success(),
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&dump.stderr)
        );
        std::fs::write(&vmlinux, dump.stdout).expect("write vmlinux.h");
    }

    for name in PROGRAMS {
        let source = format!("bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&source)
            .clang_args([
                "-I".into(),
                out.clone().into_os_string(),
                "-Ibpf".into(),
                // usdt.bpf.h includes <sys/sdt.h>-free headers that need the
                // multiarch include directory on Debian.
                "-idirafter".into(),
                "/usr/include/x86_64-linux-gnu".into(),
            ])
            .build_and_generate(format!("src/bpf/{name}.skel.rs"))
            .unwrap_or_else(|e| panic!("building {source}: {e:#}"));
        println!("cargo:rerun-if-changed={source}");
    }
    // The headers every program includes: cargo rebuilds when any file
    // under bpf/ changes.
    println!("cargo:rerun-if-changed=bpf");
}
