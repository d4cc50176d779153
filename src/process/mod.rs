//! The process being traced, from outside: /proc, its files and ELF.

pub mod elf;
pub mod elf_image;
pub mod files;
pub mod proc;
pub mod x86;
