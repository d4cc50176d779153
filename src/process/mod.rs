//! The process being traced, from outside: /proc, its files and ELF.

pub mod elf;
pub mod files;
pub mod proc;
pub mod x86;
