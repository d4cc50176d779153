//! Unwinding one process's native stacks from what BPF copied: the
//! registers and the stack pages above the stack pointer, walked with
//! framehop over each mapped module's .eh_frame (the Pythons pytrace meets
//! are built without frame pointers, so nothing else works).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use super::module::{Bytes, ModuleFile};
use super::scan;
use crate::process::proc;

/// Frames kept per stack; deeper ones end it early.
const MAX_NATIVE_FRAMES: usize = 1024;

/// Functions without unwind information one stack may be scanned past
/// (OpenBLAS: a kernel, sometimes called from an assembly driver).
const MAX_SCANS: u32 = 3;

/// Stack words that pass scan.rs's checks tried as the return address of
/// one function, each by unwinding the rest of the stack from it.
const MAX_SCAN_CANDIDATES: usize = 4;

/// /proc/PID/maps is read again when a stack holds an address in no known
/// module: at once for a page not seen before (a library just loaded), at
/// most this often for pages seen before (code in no file, like a JIT's).
const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// Module files by identity (device, inode), shared by every process.
#[derive(Default)]
pub struct ModuleFiles {
    files: HashMap<crate::process::files::FileId, Option<Rc<ModuleFile>>>,
}

/// A module as one process maps it.
struct Mapped {
    range: Range<u64>,
    /// Which file, so that another file mapped at the same addresses later
    /// is not taken for this one.
    inode: u64,
    bias: u64,
    file: Rc<ModuleFile>,
}

/// The registers and stack bytes of one sample.
pub struct UserStack<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Address of bytes[0].
    pub start: u64,
    pub bytes: &'a [u8],
    /// The copy stopped at its size limit, not at the end of the stack.
    pub full: bool,
}

/// A native frame as unwound: the module and link-time address to name it by.
#[derive(Clone)]
pub struct RawFrame {
    pub module: Option<Rc<ModuleFile>>,
    /// Link-time address in `module` (return addresses minus one, so that
    /// they fall in the call), or the run-time address without a module.
    pub address: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The thread's first frame was reached.
    Complete,
    /// The stack goes on past the bytes copied.
    StackCut,
    /// An unwinding error, an address in no module, or a return address
    /// after a scan that follows no call.
    Lost,
    /// Code without unwind information whose caller no stack scan found.
    NoUnwindInfo,
}

pub struct Unwound {
    /// Innermost first.
    pub frames: Vec<RawFrame>,
    pub stop: Stop,
    /// Callers found by a stack scan (scan.rs).
    pub scanned: u32,
    /// The time those scans took, the walks they checked included.
    pub scan_time: Duration,
}

/// One process's modules and framehop's state for it.
pub struct ProcessUnwinder {
    pid: u32,
    modules: Vec<Mapped>,
    unwinder: UnwinderX86_64<Bytes>,
    cache: Box<CacheX86_64>,
    last_scan: Option<Instant>,
    /// Pages of code found in no module at the last scan.
    unmapped_pages: HashSet<u64>,
    /// Counts the scans of the mappings: BPF's copy of them is loaded
    /// again when it changes.
    pub generation: u64,
}

/// A sample's native stack as BPF unwound it (bpf/native_unwind.bpf.h).
pub struct KernelStack<'a> {
    /// Run-time addresses, innermost first, NATIVE_EXACT_PC set on exact
    /// ones (the first frame, one a signal interrupted).
    pub frames: &'a [u64],
    /// The kernel reached the thread's first frame.
    pub complete: bool,
    /// The stack from the kernel's last frame (whose registers it holds),
    /// where the kernel could go no further and user space may.
    pub copy: Option<UserStack<'a>>,
}

/// Set on a kernel frame's address when it is exact (sample.h).
pub const EXACT_PC: u64 = 1 << 63;

impl ProcessUnwinder {
    pub fn new(pid: u32) -> Self {
        ProcessUnwinder {
            pid,
            modules: Vec::new(),
            unwinder: UnwinderX86_64::new(),
            cache: Box::new(CacheX86_64::new()),
            last_scan: None,
            unmapped_pages: HashSet::new(),
            generation: 0,
        }
    }

    fn module_at(&self, address: u64) -> Option<&Mapped> {
        let i = self.modules.partition_point(|m| m.range.start <= address).checked_sub(1)?;
        let m = &self.modules[i];
        (address < m.range.end).then_some(m)
    }

    /// Reads the process's executable mappings again, adding the new ones.
    fn rescan(&mut self, files: &mut ModuleFiles) {
        self.last_scan = Some(Instant::now());
        self.generation += 1;
        self.unmapped_pages.clear();
        let Ok(mappings) = proc::code_mappings(self.pid) else { return };
        let current: Vec<(Range<u64>, u64)> = mappings.iter().map(|m| (m.start..m.end, m.inode)).collect();
        let still = |m: &Mapped| current.contains(&(m.range.clone(), m.inode));
        for gone in self.modules.iter().filter(|m| !still(m)) {
            self.unwinder.remove_module(gone.range.start);
        }
        self.modules.retain(still);
        for m in mappings {
            if self.modules.iter().any(|known| known.range == (m.start..m.end) && known.inode == m.inode) {
                continue;
            }
            let file = if m.path == "[vdso]" {
                let mut bytes = vec![0u8; (m.end - m.start) as usize];
                proc::Memory::open(self.pid)
                    .and_then(|mem| mem.read(m.start, &mut bytes))
                    .ok()
                    .and_then(|()| ModuleFile::from_memory(&bytes).ok())
                    .map(Rc::new)
            } else {
                // Opened through the process and checked to be the mapped file.
                files
                    .files
                    .entry(crate::process::files::FileId::of(&m))
                    .or_insert_with(|| {
                        let name = std::path::Path::new(&m.path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                        crate::process::files::open_mapping(self.pid, &m).and_then(|f| ModuleFile::read(f, name)).ok().map(Rc::new)
                    })
                    .clone()
            };
            let Some(file) = file else { continue };
            let Some(bias) = file.bias(m.start, m.offset) else { continue };
            self.unwinder.add_module(Module::new(file.name.clone(), m.start..m.end, bias, section_info(&file)));
            self.modules.push(Mapped { range: m.start..m.end, inode: m.inode, bias, file });
        }
        self.modules.sort_by_key(|m| m.range.start);
    }

    /// Reads the process's mappings, if not yet read.
    pub fn prepare(&mut self, files: &mut ModuleFiles) {
        if self.last_scan.is_none() {
            self.rescan(files);
        }
    }

    /// The executable mappings with their files, sorted by start.
    pub fn mappings(&self) -> impl Iterator<Item = super::kernel_tables::MappedFile<'_>> {
        self.modules.iter().map(|m| super::kernel_tables::MappedFile { range: m.range.clone(), bias: m.bias, file: &m.file })
    }

    /// The stack's frames, innermost first, as far as they can be unwound.
    pub fn unwind(&mut self, stack: &UserStack, files: &mut ModuleFiles) -> Unwound {
        self.unwind_with(files, |me| me.unwind_once(stack))
    }

    /// The frames BPF unwound, named by module, and from a stack copy, the
    /// rest as far as user space unwinds it.
    pub fn name_kernel_frames(&mut self, stack: &KernelStack, files: &mut ModuleFiles) -> Unwound {
        self.unwind_with(files, |me| me.name_kernel_frames_once(stack))
    }

    /// `unwind_once`, again after reading the mappings anew when the stack
    /// reached an address in no known module (a library loaded since).
    fn unwind_with(&mut self, files: &mut ModuleFiles, once: impl Fn(&mut Self) -> Unwound) -> Unwound {
        self.prepare(files);
        let unwound = once(self);
        let Some(RawFrame { module: None, address }) = unwound.frames.last() else { return unwound };
        let page = address >> 12;
        if !self.unmapped_pages.contains(&page) || self.last_scan.is_some_and(|t| t.elapsed() >= RESCAN_EVERY) {
            self.rescan(files);
            let unwound = once(self);
            if let Some(RawFrame { module: None, address }) = unwound.frames.last() {
                self.unmapped_pages.insert(address >> 12);
            }
            return unwound;
        }
        unwound
    }

    fn name_kernel_frames_once(&mut self, stack: &KernelStack) -> Unwound {
        let mut walk = Walk { frames: Vec::new(), scanned: 0, scan_time: Duration::ZERO };
        // With a copy, the last frame is where user space goes on from.
        let named = if stack.copy.is_some() { &stack.frames[..stack.frames.len().saturating_sub(1)] } else { stack.frames };
        for &frame in named {
            let pc = frame & !EXACT_PC;
            let lookup = if frame & EXACT_PC != 0 { pc } else { pc.wrapping_sub(1) };
            let Some(m) = self.module_at(lookup) else {
                walk.frames.push(RawFrame { module: None, address: lookup });
                return Unwound { frames: walk.frames, stop: Stop::Lost, scanned: 0, scan_time: Duration::ZERO };
            };
            walk.frames.push(RawFrame { module: Some(m.file.clone()), address: lookup.wrapping_sub(m.bias) });
        }
        let stop = match &stack.copy {
            Some(copy) => {
                let exact = stack.frames.last().is_none_or(|f| f & EXACT_PC != 0);
                let regs = UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp);
                let address = if exact { Some(FrameAddress::from_instruction_pointer(copy.ip)) } else { FrameAddress::from_return_address(copy.ip) };
                match address {
                    Some(address) => self.walk(copy, address, regs, &mut walk, MAX_SCANS, false),
                    None => Stop::Complete,
                }
            }
            None if stack.complete => Stop::Complete,
            None => Stop::Lost,
        };
        Unwound { frames: walk.frames, stop, scanned: walk.scanned, scan_time: walk.scan_time }
    }

    fn unwind_once(&mut self, stack: &UserStack) -> Unwound {
        let regs = UnwindRegsX86_64::new(stack.ip, stack.sp, stack.bp);
        let mut walk = Walk { frames: Vec::new(), scanned: 0, scan_time: Duration::ZERO };
        let stop = self.walk(stack, FrameAddress::from_instruction_pointer(stack.ip), regs, &mut walk, MAX_SCANS, false);
        Unwound { frames: walk.frames, stop, scanned: walk.scanned, scan_time: walk.scan_time }
    }

    /// Unwinds from `address` with `regs`, pushing onto `walk.frames`. With
    /// `verify` (the frames above a scanned return address), every return
    /// address must also follow a call instruction, or the walk is Lost.
    fn walk(&mut self, stack: &UserStack, mut address: FrameAddress, mut regs: UnwindRegsX86_64, walk: &mut Walk, scans_left: u32, verify: bool) -> Stop {
        let end = stack.start + stack.bytes.len() as u64;
        loop {
            let lookup = address.address_for_lookup();
            let Some(m) = self.module_at(lookup) else {
                walk.frames.push(RawFrame { module: None, address: lookup });
                return Stop::Lost;
            };
            let svma = lookup.wrapping_sub(m.bias);
            let file = m.file.clone();
            walk.frames.push(RawFrame { module: Some(file.clone()), address: svma });
            if walk.frames.len() >= MAX_NATIVE_FRAMES {
                return Stop::Lost;
            }
            // framehop falls back to frame pointers where no unwind entry
            // covers an address; without frame pointers that yields garbage,
            // so the caller is looked for by a checked stack scan instead.
            if file.function_start(svma).is_none() {
                if scans_left == MAX_SCANS {
                    let started = Instant::now();
                    let stop = self.scan(stack, &file, svma, regs, walk, scans_left);
                    walk.scan_time += started.elapsed();
                    return stop;
                }
                return self.scan(stack, &file, svma, regs, walk, scans_left);
            }
            // Whether the unwinder wanted bytes above the copy.
            let past_copy = std::cell::Cell::new(false);
            let mut read_stack = |addr: u64| -> Result<u64, ()> {
                if addr < stack.start || addr.saturating_add(8) > end {
                    past_copy.set(past_copy.get() || addr.saturating_add(8) > end);
                    return Err(());
                }
                let at = (addr - stack.start) as usize;
                Ok(u64::from_le_bytes(stack.bytes[at..at + 8].try_into().unwrap()))
            };
            match self.unwinder.unwind_frame(address, &mut regs, &mut self.cache, &mut read_stack) {
                Ok(Some(ra)) if !past_copy.get() => match FrameAddress::from_return_address(ra) {
                    Some(_) if verify && !self.follows_call(ra) => return Stop::Lost,
                    Some(next) => address = next,
                    None => return Stop::Complete,
                },
                Ok(None) => return Stop::Complete,
                Ok(Some(_)) | Err(_) => {
                    return if past_copy.get() && stack.full { Stop::StackCut } else { Stop::Lost };
                }
            }
        }
    }

    /// The caller of the function without unwind information at `left_svma`
    /// (in `left`), whose frame starts at `regs`' stack pointer: the first
    /// stack word that passes scan.rs's checks and from which the rest of
    /// the stack unwinds, every return address checked, to its end (or to
    /// the end of the copy). None found: NoUnwindInfo, and no frame added.
    fn scan(&mut self, stack: &UserStack, left: &Rc<ModuleFile>, left_svma: u64, regs: UnwindRegsX86_64, walk: &mut Walk, scans_left: u32) -> Stop {
        if scans_left == 0 || regs.sp() < stack.start {
            return Stop::NoUnwindInfo;
        }
        let depth = walk.frames.len();
        let first = (regs.sp() - stack.start) as usize;
        let words = stack.bytes.get(first..).unwrap_or_default().chunks_exact(8).take(scan::MAX_SCAN_WORDS);
        let mut tried = 0;
        for (i, word) in words.enumerate() {
            let ra = u64::from_le_bytes(word.try_into().unwrap());
            let Some(m) = self.module_at(ra) else { continue };
            let caller = m.file.clone();
            let Some(call) = scan::call_before(&caller, ra.wrapping_sub(m.bias)) else { continue };
            if !scan::could_call(&call, Rc::ptr_eq(&caller, left), left, left_svma) {
                continue;
            }
            let Some(next) = FrameAddress::from_return_address(ra) else { continue };
            let ra_at = regs.sp() + 8 * i as u64;
            let sp = ra_at + 8;
            let stop = self.walk(stack, next, UnwindRegsX86_64::new(ra, sp, caller_bp(stack, regs.bp(), ra_at)), walk, scans_left - 1, true);
            if matches!(stop, Stop::Complete | Stop::StackCut) {
                walk.scanned += 1;
                return stop;
            }
            walk.frames.truncate(depth);
            tried += 1;
            if tried == MAX_SCAN_CANDIDATES {
                break;
            }
        }
        Stop::NoUnwindInfo
    }

    /// Whether the return address `ra` follows a call instruction.
    fn follows_call(&self, ra: u64) -> bool {
        self.module_at(ra).is_some_and(|m| scan::call_before(&m.file, ra.wrapping_sub(m.bias)).is_some())
    }
}

/// The caller's rbp, once a scan found the return address of a function
/// without unwind information at `ra_at`: a function that keeps a frame
/// pointer (push rbp; mov rbp, rsp) has rbp pointing at the caller's saved
/// rbp, right below its return address; one that does not left the
/// caller's rbp in place. (Taking the skipped function's own rbp for its
/// caller's put every rbp-based rule above it off by a frame: gdb's tests
/// in tests/integration/native_truth.rs lost 101 of 200 frames.)
fn caller_bp(stack: &UserStack, bp: u64, ra_at: u64) -> u64 {
    if bp.wrapping_add(8) != ra_at || bp < stack.start {
        return bp;
    }
    let at = (bp - stack.start) as usize;
    stack.bytes.get(at..at + 8).map_or(bp, |w| u64::from_le_bytes(w.try_into().unwrap()))
}

/// A walk's frames so far and what its scans cost.
struct Walk {
    frames: Vec<RawFrame>,
    scanned: u32,
    scan_time: Duration,
}

fn section_info(file: &ModuleFile) -> ExplicitModuleSectionInfo<Bytes> {
    ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: file.text.as_ref().map(|(r, _)| r.clone()),
        text: file.text.as_ref().map(|(_, d)| d.clone()),
        got_svma: file.got.clone(),
        eh_frame_svma: file.eh_frame.as_ref().map(|(r, _)| r.clone()),
        eh_frame: file.eh_frame.as_ref().map(|(_, d)| d.clone()),
        eh_frame_hdr_svma: file.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
        eh_frame_hdr: file.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
        ..Default::default()
    }
}
