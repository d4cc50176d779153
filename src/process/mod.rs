//! The process being traced: /proc, its ELF files, and starting it ourselves.

pub mod elf;
pub mod files;
pub mod launch;
pub mod proc;
pub mod x86;
