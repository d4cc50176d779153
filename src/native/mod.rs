//! `sample --native`: the C frames between the Python ones. BPF unwinds
//! each sampled thread's native stack from the tables loaded here
//! (kernel_tables.rs, built by table.rs); where it cannot go on, it copies
//! the stack from there and user space unwinds the rest (unwind.rs,
//! framehop over each module's .eh_frame, and scan.rs past code without
//! unwind information). The frames are named (symbols.rs, blazesym) and
//! merged with the Python frames (merge.rs). Every sample whose native
//! stack could not be had whole, or could not be paired with its Python
//! frames, is counted.

pub mod kernel_tables;
pub mod merge;
mod module;
mod scan;
mod symbols;
mod table;
mod unwind;

use std::collections::HashMap;
use std::rc::Rc;

use merge::{End, Markers, Outcome, PythonStack};
pub use unwind::{KernelStack, UserStack};
use unwind::{ModuleFiles, ProcessUnwinder, Stop};

use crate::model::samples::Frame;

/// What became of the samples' native stacks, for the report's counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// The stack went on past the bytes BPF copied.
    pub stack_cut: u64,
    /// Unwinding failed: an unwinding error, an address in no module, or a
    /// frame above a stack scan's return address that follows no call.
    pub unwind_lost: u64,
    /// Unwinding stopped at code without unwind information whose caller
    /// no stack scan found.
    pub no_unwind_info: u64,
    /// Callers of code without unwind information found by a stack scan.
    pub scanned: u64,
    /// The time stack scans took, the walks that checked them included.
    pub scan_time: std::time::Duration,
    /// Samples of threads started by native code (no Python code, the
    /// native stack whole, not the main thread).
    pub native_threads: u64,
    /// Eval frames and Python eval calls disagreed: not merged.
    pub unmatched: u64,
    /// No registers or stack for the sample.
    pub unavailable: u64,
}

pub struct NativeStacks {
    files: ModuleFiles,
    symbols: symbols::Symbols,
    processes: HashMap<u32, ProcessUnwinder>,
    markers: Markers,
    unavailable: Rc<Frame>,
    pub counts: Counts,
    /// The tables and mappings BPF unwinds by; None when it unwinds
    /// nothing (--idle, the tests).
    pub kernel: Option<kernel_tables::KernelTables>,
    /// pid -> the generation of its mappings loaded into `kernel`.
    published: HashMap<u32, u64>,
}

impl Default for NativeStacks {
    fn default() -> Self {
        NativeStacks {
            files: ModuleFiles::default(),
            symbols: symbols::Symbols::default(),
            processes: HashMap::new(),
            markers: Markers::default(),
            unavailable: Rc::new(Frame::NativeUnavailable),
            counts: Counts::default(),
            kernel: None,
            published: HashMap::new(),
        }
    }
}

impl NativeStacks {
    /// Reads the unwind tables and symbols of every file `pid` maps now,
    /// before its first sample: otherwise the first --native record waits
    /// for them while the ring buffer fills behind it (seconds for a large
    /// interpreter under emulation, long enough to lose samples).
    pub fn prepare(&mut self, pid: u32) {
        self.processes.entry(pid).or_insert_with(|| ProcessUnwinder::new(pid)).prepare(&mut self.files);
        self.publish(pid);
    }

    /// Loads pid's mappings and their tables into BPF if they changed
    /// since last loaded.
    fn publish(&mut self, pid: u32) {
        let (Some(kernel), Some(unwinder)) = (self.kernel.as_mut(), self.processes.get(&pid)) else { return };
        if self.published.get(&pid) == Some(&unwinder.generation) {
            return;
        }
        self.published.insert(pid, unwinder.generation);
        kernel.publish(pid, unwinder.mappings());
    }

    /// A process exited: what BPF held for it is freed.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.published.remove(&pid);
        if let Some(kernel) = self.kernel.as_mut() {
            kernel.forget(pid);
        }
    }

    /// A sample's frames, innermost first: its Python frames merged with
    /// its native stack, or, without one (`user` None), the Python frames
    /// under a `[native stack unavailable]` marker; and whether the native
    /// stack was had whole, to its first frame.
    pub fn frames(&mut self, pid: u32, python: &PythonStack, user: Option<&UserStack>) -> (Vec<Rc<Frame>>, bool) {
        self.native_frames(pid, python, user.map(Native::Copied))
    }

    /// `frames`, from what BPF unwound (and the copy it sent, if any).
    pub fn kernel_frames(&mut self, pid: u32, python: &PythonStack, stack: &KernelStack) -> (Vec<Rc<Frame>>, bool) {
        self.native_frames(pid, python, Some(Native::Kernel(stack)))
    }

    fn native_frames(&mut self, pid: u32, python: &PythonStack, native: Option<Native>) -> (Vec<Rc<Frame>>, bool) {
        let Some(native) = native else {
            self.counts.unavailable += 1;
            let mut out: Vec<Rc<Frame>> = python.frames.to_vec();
            if python.truncated {
                out.push(self.markers.truncated.clone());
            }
            out.push(self.unavailable.clone());
            return (out, false);
        };
        let unwinder = self.processes.entry(pid).or_insert_with(|| ProcessUnwinder::new(pid));
        let unwound = match native {
            Native::Copied(user) => unwinder.unwind(user, &mut self.files),
            Native::Kernel(stack) => unwinder.name_kernel_frames(stack, &mut self.files),
        };
        self.publish(pid);
        let native: Vec<_> = unwound.frames.iter().map(|raw| self.symbols.frame(raw)).collect();
        let end = match unwound.stop {
            Stop::Complete => End::Complete,
            Stop::StackCut => {
                self.counts.stack_cut += 1;
                End::Early
            }
            Stop::Lost => {
                self.counts.unwind_lost += 1;
                End::Early
            }
            Stop::NoUnwindInfo => {
                self.counts.no_unwind_info += 1;
                End::Early
            }
        };
        self.counts.scanned += u64::from(unwound.scanned);
        self.counts.scan_time += unwound.scan_time;
        let (frames, outcome) = merge::merge(python, &native, end, &self.markers);
        if outcome == Outcome::Unmatched {
            self.counts.unmatched += 1;
        }
        (frames, end == End::Complete)
    }
}

/// Where a sample's native stack comes from.
enum Native<'a> {
    Copied(&'a UserStack<'a>),
    Kernel(&'a KernelStack<'a>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::profile::label;

    /// The registers here and the stack above them, copied the way BPF
    /// copies a target's: whole pages from the stack pointer's up, until a
    /// page cannot be read.
    #[inline(never)]
    fn capture() -> (u64, u64, u64, u64, Vec<u8>) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: only reads registers.
        unsafe { std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp", ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp) };
        let start = sp & !4095;
        let mem = crate::process::proc::Memory::open(std::process::id()).unwrap();
        let mut bytes = Vec::new();
        let mut page = vec![0u8; 4096];
        while bytes.len() < 1 << 20 && mem.read(start + bytes.len() as u64, &mut page).is_ok() {
            bytes.extend_from_slice(&page);
        }
        (ip, sp, bp, start, bytes)
    }

    /// Unwinds this test's own thread (no Python: its frames are all
    /// native) through pytrace's executable and libc, to the thread's
    /// first frame, naming the frames on the way.
    #[test]
    fn unwinds_and_names_its_own_stack() {
        let (ip, sp, bp, start, bytes) = capture();
        let user = UserStack { ip, sp, bp, start, bytes: &bytes, full: false };
        let mut native = NativeStacks::default();
        let python = PythonStack { frames: &[], entry: &[], truncated: false };
        let (frames, whole) = native.frames(std::process::id(), &python, Some(&user));
        assert!(whole);
        let names: Vec<String> = frames.iter().map(|f| label(f)).collect();
        assert!(names[0].starts_with("pytrace::native::tests::capture"), "{names:?}");
        // (The test function itself is inlined into its caller in release.)
        assert!(names.iter().any(|n| n.contains("__rust_begin_short_backtrace")), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("<std::sys::thread::unix::Thread>::new::thread_start")), "{names:?}");
        // A test runs on a thread of its own: the stack ends in libc's
        // thread start, where unwinding stops on purpose.
        assert!(names.last().unwrap().ends_with("(libc.so.6)"), "{names:?}");
        assert_eq!((native.counts.unwind_lost, native.counts.no_unwind_info, native.counts.stack_cut, native.counts.unmatched), (0, 0, 0, 0), "{names:?}");
    }
}
