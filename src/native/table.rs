//! Unwind tables for unwinding native stacks in the kernel
//! (docs/design/native-unwind.md, step 1): each file's `.eh_frame` turned
//! into sorted 8-byte rows BPF can binary-search, one row per change of the
//! only rules an x86-64 unwinder needs (where the CFA is, where the caller's
//! rbp was saved; the return address is always at CFA-8); a cache that
//! builds each file's table once for all the processes mapping it; and
//! `step`, the per-frame rules in Rust, which the BPF code is to mirror and
//! the tests check against readelf and framehop.

// kernel_tables.rs loads the rows into BPF; the reference stepper (`step`
// and its types) and the look-ups it uses serve only the tests, which hold
// them against readelf and framehop as the model bpf/native_unwind.bpf.h
// mirrors.
#![cfg_attr(not(test), allow(dead_code))]

use std::cmp::Reverse;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use gimli::{BaseAddresses, CfaRule, EhFrame, EndianSlice, LittleEndian, RegisterRule, UnwindContext, UnwindExpression, UnwindSection, UnwindTableRow, X86_64};

use super::module::{Bytes, ModuleFile};
use crate::process::files::FileId;

/// One row of a file's unwind table, as BPF reads it from a map: the rule
/// for the addresses from `pc` up to the next row's `pc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// The row's first address: its link-time address minus the table's
    /// `base` (the file's lowest executable address), so that 32 bits do
    /// for any file whose code spans less than 4 GiB (larger ones are
    /// refused).
    pub pc: u32,
    /// CfaRsp, CfaRbp: the CFA is that register plus this.
    pub cfa_offset: i16,
    /// A RowKind.
    pub kind: u8,
    /// Where the caller's rbp was saved, in 8-byte words from the CFA (-2:
    /// at CFA-16); 0: this frame leaves rbp as the caller had it.
    pub rbp_at: i8,
}

const _: () = assert!(std::mem::size_of::<UnwindRow>() == 8 && std::mem::align_of::<UnwindRow>() == 4);

/// What a row says about its addresses. The unsupported kinds are several
/// so that BPF can count unwinding failures by cause.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// CFA = rsp + cfa_offset.
    CfaRsp = 0,
    /// CFA = rbp + cfa_offset.
    CfaRbp = 1,
    /// A PLT entry (GCC and binutils' expression, matched byte for byte):
    /// CFA = rsp + 8 + ((rip & 15) >= 11) * 8, as the entry's push moved rsp.
    Plt = 2,
    /// glibc's __restore_rt (an `S` augmentation, its expressions matched
    /// byte for byte): the interrupted registers are in the ucontext_t the
    /// kernel put at rsp.
    SignalFrame = 3,
    /// The return address is undefined: the thread's first frame (_start,
    /// clone's child). The stack is complete.
    EndOfStack = 4,
    /// No unwind entry (FDE) covers these addresses: between two entries,
    /// after the last, or where an entry could not be read.
    NoFde = 5,
    /// The CFA is another register plus an offset, or rsp/rbp plus one
    /// outside i16.
    UnsupportedCfa = 6,
    /// The CFA is an expression other than the PLT's (or a signal frame's
    /// other than glibc's).
    UnsupportedExpression = 7,
    /// rbp was saved in another register, by an expression, or at an
    /// offset that is not a multiple of 8 in i8 words.
    UnsupportedRbp = 8,
    /// The return address is not at CFA-8.
    UnsupportedReturnAddress = 9,
}

impl RowKind {
    pub const ALL: [RowKind; 10] = [
        RowKind::CfaRsp,
        RowKind::CfaRbp,
        RowKind::Plt,
        RowKind::SignalFrame,
        RowKind::EndOfStack,
        RowKind::NoFde,
        RowKind::UnsupportedCfa,
        RowKind::UnsupportedExpression,
        RowKind::UnsupportedRbp,
        RowKind::UnsupportedReturnAddress,
    ];

    pub fn from_u8(kind: u8) -> Option<RowKind> {
        RowKind::ALL.get(kind as usize).copied()
    }

    pub fn is_unsupported(self) -> bool {
        matches!(self, RowKind::UnsupportedCfa | RowKind::UnsupportedExpression | RowKind::UnsupportedRbp | RowKind::UnsupportedReturnAddress)
    }
}

impl UnwindRow {
    pub fn kind(&self) -> Option<RowKind> {
        RowKind::from_u8(self.kind)
    }
}

/// A row without its address: what consecutive rows are merged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    kind: RowKind,
    cfa_offset: i16,
    rbp_at: i8,
}

impl Rule {
    const fn only(kind: RowKind) -> Rule {
        Rule { kind, cfa_offset: 0, rbp_at: 0 }
    }
}

/// GCC and binutils' CFA of a PLT entry: DW_OP_breg7 (rsp) 8;
/// DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus.
const PLT_CFA: &[u8] = &[0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];

/// glibc's __restore_rt (sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c):
/// CFA = *(rsp + 160), rbp at rsp + 120, rip at rsp + 168, the offsets of
/// uc_mcontext's RSP, RBP and RIP in the ucontext_t at rsp (UCONTEXT_*).
const SIGNAL_CFA: &[u8] = &[0x77, 0xa0, 0x01, 0x06]; // DW_OP_breg7 160; DW_OP_deref
const SIGNAL_RBP: &[u8] = &[0x77, 0xf8, 0x00]; // DW_OP_breg7 120
const SIGNAL_RIP: &[u8] = &[0x77, 0xa8, 0x01]; // DW_OP_breg7 168

/// What a table holds, for the counters and the tests.
#[derive(Debug, Default, Clone)]
pub struct TableStats {
    /// Unwind entries (FDEs) whose rows are in the table.
    pub fdes: usize,
    /// Of those, entries with at least one unsupported row.
    pub unsupported_fdes: usize,
    /// The table's rows of each RowKind (indexed by its value).
    pub rows_by_kind: [usize; RowKind::ALL.len()],
    /// Entries left out because they could not be read (a CIE pointer
    /// outside the section or to no CIE, instructions gimli refuses): their
    /// code is NoFde.
    pub skipped_fdes: usize,
    /// Entries left out because they cover addresses outside the file's
    /// executable segments.
    pub fdes_outside_code: usize,
    /// Entries starting inside another's range: the later start wins from
    /// there on, as an .eh_frame_hdr search would have it.
    pub overlapping_fdes: usize,
    /// The section ended in bytes that are no entry: what followed them is
    /// not in the table.
    pub unreadable_rest: bool,
}

impl TableStats {
    pub fn rows(&self, kind: RowKind) -> usize {
        self.rows_by_kind[kind as usize]
    }

    pub fn unsupported_rows(&self) -> usize {
        RowKind::ALL.iter().filter(|k| k.is_unsupported()).map(|&k| self.rows(k)).sum()
    }
}

/// A file's unwind rows, sorted by pc.
#[derive(Debug)]
pub struct UnwindTable {
    /// The link-time address row pc 0 stands for: the file's lowest
    /// executable address. A mapping's bias plus this is where row pc 0 is
    /// at run time.
    pub base: u64,
    pub rows: Box<[UnwindRow]>,
    pub stats: TableStats,
}

/// A table that would have more rows than its caller allows. Its own type,
/// so that a caller can tell it from a file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{file}'s .eh_frame makes more than {limit} unwind rows, the most allowed for one file's table")]
pub struct TooManyRows {
    pub file: String,
    pub limit: usize,
}

/// Why one unwind entry's rows were not taken.
enum FdeError {
    Unreadable,
    TooManyRows,
}

impl UnwindTable {
    /// The table of a module's `.eh_frame`, at most `max_rows` rows.
    pub fn for_module(module: &ModuleFile, max_rows: usize) -> Result<UnwindTable> {
        let (eh_range, eh_frame) = module.eh_frame.as_ref().with_context(|| format!("{} has no .eh_frame section to build an unwind table from", module.name))?;
        let code = module.code_span().with_context(|| format!("{} has no executable segment", module.name))?;
        let mut bases = BaseAddresses::default().set_eh_frame(eh_range.start);
        if let Some((text, _)) = &module.text {
            bases = bases.set_text(text.start);
        }
        if let Some(got) = &module.got {
            bases = bases.set_got(got.start);
        }
        build(&module.name, eh_frame, &bases, code, max_rows)
    }

    /// The table of an `.eh_frame` section at link-time address
    /// `eh_frame_address`, for a file whose executable code is `code`.
    pub fn from_section(name: &str, eh_frame_address: u64, eh_frame: &[u8], code: Range<u64>, max_rows: usize) -> Result<UnwindTable> {
        let bases = BaseAddresses::default().set_eh_frame(eh_frame_address).set_text(code.start);
        build(name, eh_frame, &bases, code, max_rows)
    }

    /// The row for link-time address `svma`, None outside the table.
    pub fn row_for(&self, svma: u64) -> Option<UnwindRow> {
        find_row(&self.rows, self.base, svma)
    }

    /// The table's size in a BPF map.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.rows)
    }
}

/// The row for run-time address `address` in a table whose row pc 0 is at
/// `table_start`: the last row at or below it, None outside the table.
/// (In BPF: a fixed-count binary search.)
pub fn find_row(rows: &[UnwindRow], table_start: u64, address: u64) -> Option<UnwindRow> {
    let offset = u32::try_from(address.checked_sub(table_start)?).ok()?;
    let i = rows.partition_point(|r| r.pc <= offset).checked_sub(1)?;
    Some(rows[i])
}

fn build(name: &str, eh_frame: &[u8], bases: &BaseAddresses, code: Range<u64>, max_rows: usize) -> Result<UnwindTable> {
    if code.end.saturating_sub(code.start) > u64::from(u32::MAX) {
        bail!("{name}'s executable code ({:#x}..{:#x}) spans more than the 4 GiB a 32-bit unwind row address reaches", code.start, code.end);
    }
    let section = EhFrame::new(eh_frame, LittleEndian);
    let mut ctx = UnwindContext::new();
    let mut stats = TableStats::default();
    // Each entry's rows, in section order (entries are not sorted by
    // address): (start, end, its range in `rules`).
    let mut fdes: Vec<(u64, u64, Range<usize>)> = Vec::new();
    let mut rules: Vec<(u64, Rule)> = Vec::new();
    // Entries are delimited here rather than by gimli's iterator, which
    // stops at the first entry it cannot parse: one bad CIE pointer would
    // lose the rest of the file.
    let mut offset = 0;
    while offset < eh_frame.len() {
        let Some(entry) = entry_at(eh_frame, offset) else {
            stats.unreadable_rest = true;
            break;
        };
        let Some((is_fde, next)) = entry else { break }; // the zero terminator
        let at = offset;
        offset = next;
        if !is_fde {
            continue;
        }
        let parsed = section.partial_fde_from_offset(bases, gimli::EhFrameOffset(at)).and_then(|partial| partial.parse(EhFrame::cie_from_offset));
        let Ok(fde) = parsed else {
            stats.skipped_fdes += 1;
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start < code.start || end <= start || end > code.end {
            stats.fdes_outside_code += 1;
            continue;
        }
        let first = rules.len();
        // Each entry's rules are merged already; merging across entries
        // takes off at most one rule per entry (its first, if the same as
        // the last before it), so past this many the table cannot fit, and
        // the work stops at once rather than when all is read. (Entries
        // clipped by an overlapping one are counted whole.)
        let rules_limit = max_rows.saturating_add(fdes.len() + 1);
        match fde_rules(&section, bases, &mut ctx, &fde, &mut rules, rules_limit) {
            Ok(()) => {
                if rules[first..].iter().any(|(_, r)| r.kind.is_unsupported()) {
                    stats.unsupported_fdes += 1;
                }
                fdes.push((start, end, first..rules.len()));
            }
            Err(FdeError::Unreadable) => {
                rules.truncate(first);
                stats.skipped_fdes += 1;
            }
            Err(FdeError::TooManyRows) => return Err(TooManyRows { file: name.to_string(), limit: max_rows }.into()),
        }
    }
    if stats.unreadable_rest && fdes.is_empty() {
        bail!("{name}'s .eh_frame holds no unwind entry that could be read before it breaks off at byte {offset} of {}", eh_frame.len());
    }
    // Ties: the longer entry first, then the shorter ones are dropped.
    fdes.sort_by_key(|&(start, end, _)| (start, Reverse(end)));
    let mut rows = Rows { base: code.start, rows: Vec::new() };
    if let Some(&(first_start, _, _)) = fdes.first() {
        if first_start > code.start {
            rows.push(code.start, Rule::only(RowKind::NoFde));
        }
    }
    for (i, (start, end, range)) in fdes.iter().enumerate() {
        if i > 0 && fdes[i - 1].0 == *start {
            stats.overlapping_fdes += 1;
            continue;
        }
        let next_start = fdes[i + 1..].iter().map(|f| f.0).find(|s| s > start);
        // An entry starting inside this one's range ends it there.
        let stop = match next_start {
            Some(next) if next < *end => {
                stats.overlapping_fdes += 1;
                next
            }
            _ => *end,
        };
        stats.fdes += 1;
        for &(pc, rule) in rules[range.clone()].iter().take_while(|(pc, _)| *pc < stop) {
            rows.push(pc, rule);
        }
        if next_start != Some(stop) {
            rows.push(stop, Rule::only(RowKind::NoFde));
        }
        if rows.rows.len() > max_rows {
            return Err(TooManyRows { file: name.to_string(), limit: max_rows }.into());
        }
    }
    for row in &rows.rows {
        stats.rows_by_kind[row.kind as usize] += 1;
    }
    Ok(UnwindTable { base: code.start, rows: rows.rows.into_boxed_slice(), stats })
}

/// The `.eh_frame` entry at `offset`: whether it is an FDE (not a CIE) and
/// where the next entry starts; Some(None) at the zero terminator, None
/// where no entry fits in the section.
fn entry_at(eh_frame: &[u8], offset: usize) -> Option<Option<(bool, usize)>> {
    let bytes = |at: usize, n: usize| eh_frame.get(at..at.checked_add(n)?);
    let u32_at = |at| bytes(at, 4).map(|b| u64::from(u32::from_le_bytes(b.try_into().unwrap())));
    let u64_at = |at| bytes(at, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    // The 64-bit format (a length of 0xffffffff, then 8 bytes of length
    // and an 8-byte CIE id) is allowed though no x86-64 linker writes it.
    let (length, body, id_size) = match u32_at(offset)? {
        0 => return Some(None),
        0xffff_ffff => (u64_at(offset + 4)?, offset + 12, 8),
        n => (n, offset + 4, 4),
    };
    let next = body.checked_add(usize::try_from(length).ok()?)?;
    if next > eh_frame.len() || length < id_size {
        return None;
    }
    let id = if id_size == 8 { u64_at(body)? } else { u32_at(body)? };
    Some(Some((id != 0, next)))
}

/// The rows being built: merges each new row into the last when their
/// rules are the same.
struct Rows {
    base: u64,
    rows: Vec<UnwindRow>,
}

impl Rows {
    fn push(&mut self, svma: u64, rule: Rule) {
        // In the code span, checked to fit in 32 bits.
        let pc = (svma - self.base) as u32;
        let row = UnwindRow { pc, cfa_offset: rule.cfa_offset, kind: rule.kind as u8, rbp_at: rule.rbp_at };
        let same = |a: &UnwindRow, b: &UnwindRow| (a.kind, a.cfa_offset, a.rbp_at) == (b.kind, b.cfa_offset, b.rbp_at);
        if let Some(last) = self.rows.last_mut() {
            if last.pc == pc {
                *last = row;
                // The replaced row may now repeat the one before it.
                let n = self.rows.len();
                if n >= 2 && same(&self.rows[n - 2], &self.rows[n - 1]) {
                    self.rows.pop();
                }
                return;
            }
            if same(last, &row) {
                return;
            }
        }
        self.rows.push(row);
    }
}

/// Appends one entry's rules to `rules` (those equal to the one before
/// merged), clipped to the entry's range.
fn fde_rules(
    section: &EhFrame<EndianSlice<LittleEndian>>,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &gimli::FrameDescriptionEntry<EndianSlice<LittleEndian>>,
    rules: &mut Vec<(u64, Rule)>,
    limit: usize,
) -> std::result::Result<(), FdeError> {
    let (start, end) = (fde.initial_address(), fde.end_address());
    let first = rules.len();
    let mut table = fde.rows(section, bases, ctx).map_err(|_| FdeError::Unreadable)?;
    while let Some(row) = table.next_row().map_err(|_| FdeError::Unreadable)? {
        let (from, to) = (row.start_address().max(start), row.end_address().min(end));
        if from >= to {
            continue;
        }
        let rule = classify(row, fde.is_signal_trampoline(), section);
        if rules.len() > first && rules.last().is_some_and(|(_, last)| *last == rule) {
            continue;
        }
        rules.push((from, rule));
        if rules.len() > limit {
            return Err(FdeError::TooManyRows);
        }
    }
    Ok(())
}

/// The bytes of an expression in the section.
fn expression<'a>(section: &EhFrame<EndianSlice<'a, LittleEndian>>, expr: &UnwindExpression<usize>) -> Option<&'a [u8]> {
    expr.get(section).ok().map(|e| e.0.slice())
}

/// One gimli row as a table row: the CFA and rbp rules the row gives, or
/// the reason an unwinder following only rsp, rbp and CFA-8 cannot use it.
fn classify(row: &UnwindTableRow<usize>, signal_frame: bool, section: &EhFrame<EndianSlice<LittleEndian>>) -> Rule {
    let ra = row.register(X86_64::RA);
    if matches!(ra, None | Some(RegisterRule::Undefined)) {
        return Rule::only(RowKind::EndOfStack);
    }
    let rbp = row.register(X86_64::RBP);
    if signal_frame {
        let cfa_is = matches!(row.cfa(), CfaRule::Expression(e) if expression(section, e) == Some(SIGNAL_CFA));
        let saved_at = |rule: &Option<RegisterRule<usize>>, want: &[u8]| matches!(rule, Some(RegisterRule::Expression(e)) if expression(section, e) == Some(want));
        let glibc = cfa_is && saved_at(&ra, SIGNAL_RIP) && saved_at(&rbp, SIGNAL_RBP);
        return Rule::only(if glibc { RowKind::SignalFrame } else { RowKind::UnsupportedExpression });
    }
    if ra != Some(RegisterRule::Offset(-8)) {
        return Rule::only(RowKind::UnsupportedReturnAddress);
    }
    let (kind, offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => (RowKind::CfaRsp, *offset),
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => (RowKind::CfaRbp, *offset),
        CfaRule::RegisterAndOffset { .. } => return Rule::only(RowKind::UnsupportedCfa),
        CfaRule::Expression(e) if expression(section, e) == Some(PLT_CFA) => (RowKind::Plt, 0),
        CfaRule::Expression(_) => return Rule::only(RowKind::UnsupportedExpression),
    };
    let Ok(cfa_offset) = i16::try_from(offset) else { return Rule::only(RowKind::UnsupportedCfa) };
    let rbp_at = match rbp {
        // Not mentioned, or said to be the caller's: unchanged. (Undefined
        // too: compilers only say it of registers they never touch.)
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Register(r)) if r == X86_64::RBP => 0,
        Some(RegisterRule::Offset(at)) if at % 8 == 0 && at != 0 => match i8::try_from(at / 8) {
            Ok(words) => words,
            Err(_) => return Rule::only(RowKind::UnsupportedRbp),
        },
        Some(_) => return Rule::only(RowKind::UnsupportedRbp),
    };
    Rule { kind, cfa_offset, rbp_at }
}

/// What a table is cached by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TableKey {
    /// A file: its (device, inode) with its size and mtime, as an inode
    /// number freed by a deleted file can be given to another.
    File { id: FileId, size: u64, mtime: i64 },
    /// A module only in memory (the vDSO, the same in every process under
    /// one kernel): its `.eh_frame`'s bytes and address and its code span.
    Memory { eh_frame_address: u64, eh_frame: Bytes, code: Range<u64> },
}

impl TableKey {
    pub fn of(module: &ModuleFile) -> Option<TableKey> {
        if let Some(file) = module.file() {
            return Some(TableKey::File { id: file.id, size: file.size, mtime: file.mtime });
        }
        let (range, bytes) = module.eh_frame.as_ref()?;
        Some(TableKey::Memory { eh_frame_address: range.start, eh_frame: bytes.clone(), code: module.code_span()? })
    }
}

/// Failures remembered (so that a file that cannot be read is not read
/// again for every process mapping it); past this many, all are forgotten.
const MAX_REMEMBERED_FAILURES: usize = 4096;

/// Every file's table, built once and shared by the processes mapping it,
/// within a budget of rows (the BPF rows map's size).
///
/// When a new table does not fit, the least recently used tables that no
/// process holds any more (only the cache has their Arc) are evicted; tables
/// still held are never evicted, as BPF would still be reading their rows.
/// A table that does not fit in what is left then is refused, counted, and
/// built again only once more room has been freed. Refusing rather than
/// evicting what is in use keeps the promise that every live process's
/// tables stay whole; the files refused fall back to user space's stack
/// copy (the design's step 4).
pub struct TableCache {
    budget_rows: usize,
    clock: u64,
    entries: HashMap<TableKey, Entry>,
    pub counts: CacheCounts,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheCounts {
    pub built: u64,
    pub reused: u64,
    pub evicted: u64,
    /// Requests for a table that did not fit in the budget.
    pub refused: u64,
    /// Files whose table could not be built (no .eh_frame, garbage, code
    /// spanning over 4 GiB).
    pub failed: u64,
}

struct Entry {
    last_used: u64,
    state: State,
}

enum State {
    Built(Arc<UnwindTable>),
    Failed(String),
    /// Refused when `available` rows were left.
    Refused { available: usize },
}

impl TableCache {
    pub fn new(budget_rows: usize) -> Self {
        TableCache { budget_rows, clock: 0, entries: HashMap::new(), counts: CacheCounts::default() }
    }

    /// Rows of the tables the cache holds now.
    pub fn held_rows(&self) -> usize {
        self.entries.values().map(|e| if let State::Built(t) = &e.state { t.rows.len() } else { 0 }).sum()
    }

    /// Rows of the tables some process still holds: never evicted.
    fn rows_in_use(&self) -> usize {
        self.entries.values().map(|e| if let State::Built(t) = &e.state { if Arc::strong_count(t) > 1 { t.rows.len() } else { 0 } } else { 0 }).sum()
    }

    /// The module's table: the cached one, or built now.
    pub fn get(&mut self, module: &ModuleFile) -> Result<Arc<UnwindTable>> {
        let key = TableKey::of(module).with_context(|| format!("{} has neither a file nor an .eh_frame to key its unwind table by", module.name))?;
        self.clock += 1;
        let available = self.budget_rows.saturating_sub(self.rows_in_use());
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.last_used = self.clock;
            match &entry.state {
                State::Built(table) => {
                    self.counts.reused += 1;
                    return Ok(table.clone());
                }
                State::Failed(why) => bail!("{why}"),
                // Nothing freed since: refused again, without building it.
                State::Refused { available: then } if available <= *then => return Err(self.refuse(module, available)),
                State::Refused { .. } => {}
            }
        }
        let (state, result) = match UnwindTable::for_module(module, available) {
            Ok(table) => {
                self.evict_until(self.budget_rows - table.rows.len());
                self.counts.built += 1;
                let table = Arc::new(table);
                (State::Built(table.clone()), Ok(table))
            }
            Err(e) if e.is::<TooManyRows>() => (State::Refused { available }, Err(self.refuse(module, available))),
            Err(e) => {
                self.counts.failed += 1;
                let why = format!("{e:#}");
                (State::Failed(why.clone()), Err(anyhow::anyhow!(why)))
            }
        };
        if !matches!(state, State::Built(_)) && self.entries.values().filter(|e| !matches!(e.state, State::Built(_))).count() >= MAX_REMEMBERED_FAILURES {
            self.entries.retain(|_, e| matches!(e.state, State::Built(_)));
        }
        self.entries.insert(key, Entry { last_used: self.clock, state });
        result
    }

    fn refuse(&mut self, module: &ModuleFile, available: usize) -> anyhow::Error {
        self.counts.refused += 1;
        anyhow::anyhow!("{}'s unwind table does not fit in the {available} rows left of the {}-row budget (the rest held by tables in use)", module.name, self.budget_rows)
    }

    /// Evicts the least recently used tables no process holds until the
    /// cache holds at most `rows` rows (or none is left to evict).
    fn evict_until(&mut self, rows: usize) {
        let mut held = self.held_rows();
        while held > rows {
            let oldest = self
                .entries
                .iter()
                .filter_map(|(key, e)| match &e.state {
                    State::Built(t) if Arc::strong_count(t) == 1 => Some((e.last_used, key.clone(), t.rows.len())),
                    _ => None,
                })
                .min_by_key(|(used, _, _)| *used);
            let Some((_, key, len)) = oldest else { return };
            self.entries.remove(&key);
            self.counts.evicted += 1;
            held -= len;
        }
    }
}

/// Addresses at and above this are the kernel's (x86-64, 4-level paging;
/// 5-level paging only gives user space more above this if it asks).
pub const USER_SPACE_END: u64 = 0x0000_8000_0000_0000;

/// The frame-pointer fallback's largest frame (rbp - sp): rbp used as a
/// scratch register seldom holds a value just above sp, and real frames
/// this large (alloca, big local arrays) are rare.
pub const MAX_FRAME_POINTER_FRAME: u64 = 1 << 20;

/// The registers an x86-64 unwinder restores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
}

/// The caller's registers, one frame up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub regs: Regs,
    /// The frame was a signal handler's return to __restore_rt: `regs.pc`
    /// is where the signal interrupted the caller, not a return address,
    /// so its row is looked up at pc itself, as a first frame's is.
    pub interrupted: bool,
}

/// How one step of a native stack's unwinding ended it (the value is to be
/// the BPF counter's index). NoRow and NoFde are where the frame-pointer
/// fallback is tried. The walk around `step` (the design's steps 2 to 4)
/// adds its own causes: the frame cap, a pc in no mapping, a file without
/// a table, the stack copy sent to user space.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndCause {
    /// The thread's first frame was reached: the stack is complete.
    EndOfStack = 0,
    /// No row covers pc: outside the table's addresses.
    NoRow = 1,
    /// pc is in code no unwind entry covers (a NoFde row).
    NoFde = 2,
    UnsupportedCfa = 3,
    UnsupportedExpression = 4,
    UnsupportedRbp = 5,
    UnsupportedReturnAddress = 6,
    /// A stack word could not be read.
    ReadFailed = 7,
    /// The CFA is not 8-byte aligned or not a user address.
    BadCfa = 8,
    /// The CFA is not above sp: the stack would not unwind upwards.
    SpNotRising = 9,
    /// The return address is 0 (some runtimes end their stacks so) or not
    /// a user address.
    BadReturnAddress = 10,
    /// The frame-pointer fallback's rbp is not an aligned address just
    /// above sp.
    BadFramePointer = 11,
}

fn check_return_address(ra: u64) -> Result<(), EndCause> {
    if ra == 0 || ra >= USER_SPACE_END {
        return Err(EndCause::BadReturnAddress);
    }
    Ok(())
}

/// One frame up from `regs`, by the table of the file holding pc (its row
/// pc 0 at run-time address `table_start`). `is_first_frame`: pc is exact
/// (the sampled frame, or one a signal interrupted) rather than a return
/// address, whose row is looked up at pc-1 since a call may be a function's
/// last instruction. `read_u64` reads the stack (None: unreadable).
pub fn step(rows: &[UnwindRow], table_start: u64, regs: Regs, is_first_frame: bool, read_u64: impl Fn(u64) -> Option<u64>) -> Result<Caller, EndCause> {
    let lookup = if is_first_frame { regs.pc } else { regs.pc.wrapping_sub(1) };
    let row = find_row(rows, table_start, lookup).ok_or(EndCause::NoRow)?;
    let cfa = match row.kind() {
        Some(RowKind::CfaRsp) => regs.sp.wrapping_add(row.cfa_offset as i64 as u64),
        Some(RowKind::CfaRbp) => regs.bp.wrapping_add(row.cfa_offset as i64 as u64),
        Some(RowKind::Plt) => regs.sp.wrapping_add(if regs.pc & 15 >= 11 { 16 } else { 8 }),
        Some(RowKind::SignalFrame) => return signal_frame_step(regs, read_u64),
        Some(RowKind::EndOfStack) => return Err(EndCause::EndOfStack),
        Some(RowKind::NoFde) => return Err(EndCause::NoFde),
        Some(RowKind::UnsupportedCfa) => return Err(EndCause::UnsupportedCfa),
        Some(RowKind::UnsupportedRbp) => return Err(EndCause::UnsupportedRbp),
        Some(RowKind::UnsupportedReturnAddress) => return Err(EndCause::UnsupportedReturnAddress),
        Some(RowKind::UnsupportedExpression) | None => return Err(EndCause::UnsupportedExpression),
    };
    if !cfa.is_multiple_of(8) || cfa >= USER_SPACE_END {
        return Err(EndCause::BadCfa);
    }
    if cfa <= regs.sp {
        return Err(EndCause::SpNotRising);
    }
    let ra = read_u64(cfa - 8).ok_or(EndCause::ReadFailed)?;
    check_return_address(ra)?;
    let bp = if row.rbp_at != 0 { read_u64(cfa.wrapping_add((row.rbp_at as i64 * 8) as u64)).ok_or(EndCause::ReadFailed)? } else { regs.bp };
    Ok(Caller { regs: Regs { pc: ra, sp: cfa, bp }, interrupted: false })
}

/// Where the kernel's ucontext_t (x86-64) holds the interrupted rbp, rsp
/// and rip: uc_mcontext is 40 bytes in, and in it r8-r15, rdi, rsi, rbp,
/// rbx, rdx, rax, rcx, rsp, rip, 8 bytes each.
const UCONTEXT_RBP: u64 = 120;
const UCONTEXT_RSP: u64 = 160;
const UCONTEXT_RIP: u64 = 168;

/// Through __restore_rt: the handler returned here, popping the return
/// address the kernel pushed, so sp is the ucontext_t the kernel saved the
/// interrupted registers in. The interrupted sp need not be above it (a
/// handler on sigaltstack's stack): only that it is a user address is
/// checked.
fn signal_frame_step(regs: Regs, read_u64: impl Fn(u64) -> Option<u64>) -> Result<Caller, EndCause> {
    let context = regs.sp;
    if !context.is_multiple_of(8) || context >= USER_SPACE_END - UCONTEXT_RIP {
        return Err(EndCause::BadCfa);
    }
    let pc = read_u64(context + UCONTEXT_RIP).ok_or(EndCause::ReadFailed)?;
    let sp = read_u64(context + UCONTEXT_RSP).ok_or(EndCause::ReadFailed)?;
    let bp = read_u64(context + UCONTEXT_RBP).ok_or(EndCause::ReadFailed)?;
    check_return_address(pc)?;
    if sp == 0 || sp >= USER_SPACE_END {
        return Err(EndCause::BadCfa);
    }
    Ok(Caller { regs: Regs { pc, sp, bp }, interrupted: true })
}

/// One frame up by the frame-pointer chain, for a pc no row covers: the
/// caller's rbp at rbp, the return address at rbp+8, the caller's sp
/// rbp+16. Checked only as far as the registers and the stack allow (rbp
/// 8-byte aligned, at or above sp and at most MAX_FRAME_POINTER_FRAME
/// above it, a plausible return address); that the return address is in a
/// mapped file after a call is the caller's to check (the design's step 4).
pub fn frame_pointer_step(regs: Regs, read_u64: impl Fn(u64) -> Option<u64>) -> Result<Regs, EndCause> {
    let bp = regs.bp;
    if !bp.is_multiple_of(8) || bp < regs.sp || bp - regs.sp > MAX_FRAME_POINTER_FRAME || bp >= USER_SPACE_END - 16 {
        return Err(EndCause::BadFramePointer);
    }
    let ra = read_u64(bp + 8).ok_or(EndCause::ReadFailed)?;
    check_return_address(ra)?;
    let caller_bp = read_u64(bp).ok_or(EndCause::ReadFailed)?;
    Ok(Regs { pc: ra, sp: bp + 16, bp: caller_bp })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use crate::native::unwind::{ModuleFiles, ProcessUnwinder, Stop, UserStack};
    use crate::process::files::{open_local, open_mapping};

    /// More rows than any file here has: the tests that are not about the
    /// limit.
    const NO_LIMIT: usize = 10_000_000;

    fn local_module(path: &Path) -> ModuleFile {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        ModuleFile::read(open_local(path).unwrap(), name).unwrap()
    }

    /// The libc this test process runs with.
    fn libc_path() -> PathBuf {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let path = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.ends_with("/libc.so.6")).expect("this process maps libc.so.6");
        PathBuf::from(path)
    }

    fn this_executable() -> PathBuf {
        std::fs::read_link("/proc/self/exe").unwrap()
    }

    /// Debian's libpython3.11 (python3.11-dev, which scripts/install.sh
    /// installs, depends on it).
    const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";

    #[test]
    fn a_row_is_8_bytes() {
        assert_eq!(std::mem::size_of::<UnwindRow>(), 8);
        assert_eq!(std::mem::size_of::<[UnwindRow; 3]>(), 24, "no padding between rows");
    }

    // ---- Rows against readelf ----

    /// One unwind entry's columns in readelf's interpreted table: the CFA
    /// ("rsp+8", "exp"), where rbp and the return address were saved
    /// ("c-16", "u", ...; None when readelf shows no column for them).
    #[derive(Clone, Debug)]
    struct Columns {
        cfa: String,
        rbp: Option<String>,
        ra: Option<String>,
    }

    #[derive(Debug)]
    struct ReadelfFde {
        offset: u64,
        cie: u64,
        range: Range<u64>,
        rows: Vec<(u64, Columns)>,
    }

    /// What readelf says of a file's .eh_frame.
    struct Readelf {
        /// CIE offset -> its augmentation string and the last row of its
        /// initial instructions (what an FDE without instructions keeps).
        cies: HashMap<u64, (String, Option<Columns>)>,
        fdes: Vec<ReadelfFde>,
        /// FDE offsets whose raw instructions hold GCC's PLT expression.
        plt: HashSet<u64>,
        /// FDE offsets whose raw instructions are glibc's __restore_rt's.
        glibc_signal: HashSet<u64>,
    }

    fn run_readelf(option: &str, path: &Path) -> String {
        let out = std::process::Command::new("readelf").arg("--debug-dump=no-follow-links").arg(option).arg(path).output().expect("readelf (binutils) is installed");
        assert!(out.status.success(), "readelf {option} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn hex(s: &str) -> u64 {
        u64::from_str_radix(s, 16).unwrap()
    }

    /// The lines of the .eh_frame section's dump, not .debug_frame's.
    fn eh_frame_lines(text: &str) -> impl Iterator<Item = &str> {
        let mut inside = false;
        text.lines().filter(move |line| {
            if line.starts_with("Contents of the ") {
                inside = line.starts_with("Contents of the .eh_frame section");
            }
            inside
        })
    }

    /// An entry's header line: (offset, "CIE"/"FDE", the rest's words).
    fn entry_header(line: &str) -> Option<(u64, &str, Vec<&str>)> {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 4 && words[0].len() == 8 && (words[3] == "CIE" || words[3] == "FDE") && words[0].chars().all(|c| c.is_ascii_hexdigit()) {
            return Some((hex(words[0]), words[3], words[4..].to_vec()));
        }
        None
    }

    fn readelf(path: &Path) -> Readelf {
        let mut re = Readelf { cies: HashMap::new(), fdes: Vec::new(), plt: HashSet::new(), glibc_signal: HashSet::new() };
        let interp = run_readelf("--debug-dump=frames-interp", path);
        let mut columns: Vec<String> = Vec::new();
        // The entry whose rows follow: Err(CIE offset) or Ok(index in fdes).
        let mut current: Option<std::result::Result<usize, u64>> = None;
        for line in eh_frame_lines(&interp) {
            if let Some((offset, what, rest)) = entry_header(line) {
                columns.clear();
                if what == "CIE" {
                    re.cies.insert(offset, (rest[0].trim_matches('"').to_string(), None));
                    current = Some(Err(offset));
                } else {
                    let cie = hex(rest.iter().find_map(|w| w.strip_prefix("cie=")).unwrap());
                    let (from, to) = rest.iter().find_map(|w| w.strip_prefix("pc=")).unwrap().split_once("..").unwrap();
                    re.fdes.push(ReadelfFde { offset, cie, range: hex(from)..hex(to), rows: Vec::new() });
                    current = Some(Ok(re.fdes.len() - 1));
                }
                continue;
            }
            // A register saved in another is shown as "r5 (rdi)": one column.
            let mut words: Vec<String> = Vec::new();
            for word in line.split_whitespace() {
                match words.last_mut() {
                    Some(last) if word.starts_with('(') => *last = format!("{last} {word}"),
                    _ => words.push(word.to_string()),
                }
            }
            if words.first().map(String::as_str) == Some("LOC") {
                columns = words[1..].to_vec();
                continue;
            }
            if columns.is_empty() || words.is_empty() || words[0].len() != 16 || !words[0].chars().all(|c| c.is_ascii_hexdigit()) {
                continue;
            }
            assert_eq!(words.len(), columns.len() + 1, "a row of readelf's table not understood: {line:?} under {columns:?}");
            let get = |name: &str| columns.iter().position(|c| c == name).map(|i| words[i + 1].clone());
            let cols = Columns { cfa: get("CFA").unwrap(), rbp: get("rbp"), ra: get("ra") };
            match current {
                Some(Ok(i)) => re.fdes[i].rows.push((hex(&words[0]), cols)),
                Some(Err(cie)) => re.cies.get_mut(&cie).unwrap().1 = Some(cols),
                None => {}
            }
        }
        // The raw instructions, for the expressions the interpreted table
        // only calls "exp".
        let raw = run_readelf("--debug-dump=frames", path);
        let mut fde = None;
        let mut signal_parts = HashMap::<u64, usize>::new();
        for line in eh_frame_lines(&raw) {
            if let Some((offset, what, _)) = entry_header(line) {
                fde = (what == "FDE").then_some(offset);
                continue;
            }
            let Some(fde) = fde else { continue };
            let line = line.trim();
            if line == "DW_CFA_def_cfa_expression (DW_OP_breg7 (rsp): 8; DW_OP_breg16 (rip): 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus)" {
                re.plt.insert(fde);
            }
            if ["DW_CFA_def_cfa_expression (DW_OP_breg7 (rsp): 160; DW_OP_deref)", "DW_CFA_expression: r6 (rbp) (DW_OP_breg7 (rsp): 120)", "DW_CFA_expression: r16 (rip) (DW_OP_breg7 (rsp): 168)"].contains(&line) {
                *signal_parts.entry(fde).or_default() += 1;
            }
        }
        re.glibc_signal = signal_parts.into_iter().filter(|(_, n)| *n == 3).map(|(fde, _)| fde).collect();
        re
    }

    /// The row readelf's columns call for, by the rules in the module
    /// documentation, read off readelf's text: (kind, cfa_offset, rbp_at).
    fn expected_row(cols: &Columns, signal_cie: bool, plt: bool, glibc_signal: bool) -> (RowKind, i16, i8) {
        let only = |kind| (kind, 0, 0);
        if cols.ra.as_deref().is_none_or(|ra| ra == "u") {
            return only(RowKind::EndOfStack);
        }
        if signal_cie {
            return only(if glibc_signal { RowKind::SignalFrame } else { RowKind::UnsupportedExpression });
        }
        if cols.ra.as_deref() != Some("c-8") {
            return only(RowKind::UnsupportedReturnAddress);
        }
        let (kind, cfa_offset) = if cols.cfa == "exp" {
            if !plt {
                return only(RowKind::UnsupportedExpression);
            }
            (RowKind::Plt, 0)
        } else {
            let sign = cols.cfa.find(['+', '-']).unwrap();
            let (register, offset) = cols.cfa.split_at(sign);
            let offset: i64 = offset.trim_start_matches('+').parse().unwrap();
            let kind = match register {
                "rsp" => RowKind::CfaRsp,
                "rbp" => RowKind::CfaRbp,
                _ => return only(RowKind::UnsupportedCfa),
            };
            match i16::try_from(offset) {
                Ok(offset) => (kind, offset),
                Err(_) => return only(RowKind::UnsupportedCfa),
            }
        };
        let rbp_at = match cols.rbp.as_deref() {
            None | Some("u") | Some("s") | Some("rbp") => 0,
            Some(saved) => match saved.strip_prefix('c').and_then(|n| n.trim_start_matches('+').parse::<i64>().ok()) {
                Some(n) if n % 8 == 0 && n != 0 && i8::try_from(n / 8).is_ok() => (n / 8) as i8,
                _ => return only(RowKind::UnsupportedRbp),
            },
        };
        (kind, cfa_offset, rbp_at)
    }

    /// Checks `path`'s table against readelf at every row start readelf
    /// prints and the midpoint to the next, and at every entry's end (no
    /// entry there: NoFde). Returns the readelf rows compared (printed
    /// with the addresses, under --nocapture).
    #[allow(clippy::disallowed_macros)]
    fn compare_with_readelf(path: &Path) -> (usize, UnwindTable) {
        let module = local_module(path);
        let table = UnwindTable::for_module(&module, NO_LIMIT).unwrap();
        let re = readelf(path);
        let mut fdes: Vec<&ReadelfFde> = re.fdes.iter().filter(|f| !f.range.is_empty()).collect();
        fdes.sort_by_key(|f| (f.range.start, f.range.end));
        // Addresses two entries cover have no single answer: left out.
        let mut overlapping = HashSet::new();
        for pair in fdes.windows(2) {
            if pair[1].range.start < pair[0].range.end {
                overlapping.insert(pair[0].offset);
                overlapping.insert(pair[1].offset);
            }
        }
        assert!(overlapping.len() * 100 <= fdes.len(), "{}: {} of {} entries overlap", path.display(), overlapping.len(), fdes.len());
        let covered = |a: u64| {
            let i = fdes.partition_point(|f| f.range.start <= a);
            fdes[..i].iter().rev().take(8).any(|f| f.range.contains(&a))
        };
        let mut mismatches = Vec::new();
        let (mut compared, mut addresses) = (0, 0);
        let mut kinds = HashMap::<RowKind, usize>::new();
        for fde in fdes.iter().filter(|f| !overlapping.contains(&f.offset)) {
            let (augmentation, cie_row) = &re.cies[&fde.cie];
            let rows: Vec<(u64, Columns)> = if fde.rows.is_empty() { vec![(fde.range.start, cie_row.clone().unwrap())] } else { fde.rows.clone() };
            for (i, (at, cols)) in rows.iter().enumerate() {
                let next = rows.get(i + 1).map_or(fde.range.end, |r| r.0);
                if next <= *at {
                    continue; // a later row at the same address replaces it
                }
                let want = expected_row(cols, augmentation.contains('S'), re.plt.contains(&fde.offset), re.glibc_signal.contains(&fde.offset));
                compared += 1;
                *kinds.entry(want.0).or_default() += 1;
                for a in [*at, at + (next - at) / 2] {
                    addresses += 1;
                    let got = table.row_for(a).map(|r| (r.kind().unwrap(), r.cfa_offset, r.rbp_at));
                    if got != Some(want) {
                        mismatches.push(format!("{a:#x} (entry {:#x} at {:#x}): readelf {cols:?} wants {want:?}, the table has {got:?}", fde.offset, fde.range.start));
                    }
                }
            }
            if !covered(fde.range.end) {
                addresses += 1;
                let got = table.row_for(fde.range.end).map(|r| r.kind());
                if got != Some(Some(RowKind::NoFde)) {
                    mismatches.push(format!("{:#x}, the end of entry {:#x}: no entry covers it, the table has {got:?}", fde.range.end, fde.offset));
                }
            }
        }
        eprintln!("{}: {compared} of readelf's rows compared at {addresses} addresses (rows by kind {kinds:?}; {} entries overlapping, left out)", path.display(), overlapping.len());
        assert!(mismatches.is_empty(), "{}: {} of {compared} rows differ from readelf's, the first:\n{}", path.display(), mismatches.len(), mismatches[..mismatches.len().min(20)].join("\n"));
        let starts: HashSet<u64> = fdes.iter().map(|f| f.range.start).collect();
        assert_eq!(table.stats.fdes, starts.len(), "{}: entries in the table", path.display());
        assert_eq!((table.stats.skipped_fdes, table.stats.fdes_outside_code, table.stats.unreadable_rest), (0, 0, false), "{}", path.display());
        // Sorted, strictly rising, and no two neighbours alike.
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc && (w[0].kind, w[0].cfa_offset, w[0].rbp_at) != (w[1].kind, w[1].cfa_offset, w[1].rbp_at)), "{}", path.display());
        (compared, table)
    }

    #[test]
    fn rows_match_readelf_for_this_executable() {
        let (compared, table) = compare_with_readelf(&this_executable());
        assert!(compared >= 50_000, "{compared} rows compared");
        assert!(table.stats.rows(RowKind::CfaRbp) >= 1, "{:?}", table.stats);
    }

    #[test]
    fn rows_match_readelf_for_libc() {
        let (compared, table) = compare_with_readelf(&libc_path());
        assert!(compared >= 10_000, "{compared} rows compared");
        // glibc's __restore_rt, the PLT, and _start / clone's child.
        for kind in [RowKind::SignalFrame, RowKind::Plt, RowKind::EndOfStack, RowKind::CfaRbp] {
            assert!(table.stats.rows(kind) >= 1, "{kind:?}: {:?}", table.stats);
        }
    }

    #[test]
    fn rows_match_readelf_for_libpython() {
        let (compared, _) = compare_with_readelf(Path::new(LIBPYTHON));
        assert!(compared >= 30_000, "{compared} rows compared");
    }

    /// What the final report quotes: rows, sizes and build times of libc
    /// and libpython (run with --nocapture to see them).
    #[test]
    #[allow(clippy::disallowed_macros)]
    fn table_sizes_of_libc_and_libpython() {
        for path in [libc_path(), PathBuf::from(LIBPYTHON)] {
            let module = local_module(&path);
            let started = Instant::now();
            let table = UnwindTable::for_module(&module, NO_LIMIT).unwrap();
            let took = started.elapsed();
            let s = &table.stats;
            let unsupported: Vec<String> = RowKind::ALL.iter().filter(|k| k.is_unsupported() && s.rows(**k) > 0).map(|k| format!("{k:?} {}", s.rows(*k))).collect();
            eprintln!(
                "{}: {} rows ({} KiB), {} FDEs ({} of them with {} unsupported rows, {} overlapping), built in {:.1} ms; rows by kind {:?}; unsupported: {}",
                path.display(),
                table.rows.len(),
                table.bytes() / 1024,
                s.fdes,
                s.unsupported_fdes,
                s.unsupported_rows(),
                s.overlapping_fdes,
                took.as_secs_f64() * 1000.0,
                RowKind::ALL.iter().map(|k| (*k, s.rows(*k))).collect::<Vec<_>>(),
                if unsupported.is_empty() { "none".to_string() } else { unsupported.join(", ") }
            );
            assert!(table.rows.len() >= 10_000, "{}: {} rows", path.display(), table.rows.len());
        }
    }

    // ---- Bounds and garbage ----

    fn libc_eh_frame() -> (ModuleFile, u64, Vec<u8>, Range<u64>) {
        let module = local_module(&libc_path());
        let (range, bytes) = module.eh_frame.clone().unwrap();
        let code = module.code_span().unwrap();
        (module, range.start, bytes.to_vec(), code)
    }

    #[test]
    fn a_table_past_its_row_limit_is_an_error() {
        let (module, _, _, _) = libc_eh_frame();
        let rows = UnwindTable::for_module(&module, NO_LIMIT).unwrap().rows.len();
        UnwindTable::for_module(&module, rows).expect("exactly the rows it has fit");
        let err = UnwindTable::for_module(&module, rows - 1).unwrap_err();
        assert!(err.is::<TooManyRows>());
        let message = format!("{err:#}");
        assert!(message.contains("libc.so.6") && message.contains(&format!("more than {} unwind rows", rows - 1)), "{message}");
        // Far below: stopped early, not after building everything.
        let started = Instant::now();
        assert!(UnwindTable::for_module(&module, 10).unwrap_err().is::<TooManyRows>());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn code_spanning_over_4_gib_is_refused() {
        let (_, address, bytes, code) = libc_eh_frame();
        let err = UnwindTable::from_section("big.so", address, &bytes, code.start..code.start + (5 << 30), NO_LIMIT).unwrap_err();
        assert!(format!("{err:#}").contains("big.so's executable code"), "{err:#}");
    }

    /// Bytes that are no .eh_frame, cut ones, and entries pointing out of
    /// the section: an error or entries skipped and counted, never a panic,
    /// in bounded time.
    #[test]
    fn garbage_eh_frame_is_an_error_or_skipped() {
        let started = Instant::now();
        let (_, address, bytes, code) = libc_eh_frame();
        let whole = UnwindTable::from_section("libc", address, &bytes, code.clone(), NO_LIMIT).unwrap();
        assert_eq!((whole.stats.skipped_fdes, whole.stats.unreadable_rest), (0, false));

        // Cut in the middle of an entry: what precedes the cut is kept.
        let cut = UnwindTable::from_section("libc", address, &bytes[..bytes.len() / 2 + 3], code.clone(), NO_LIMIT).unwrap();
        assert!(cut.stats.unreadable_rest);
        assert!(cut.stats.fdes > whole.stats.fdes / 3 && cut.stats.fdes < whole.stats.fdes, "{:?}", cut.stats);

        // The first FDE's CIE pointer (the word after its length) sent out
        // of the section: that FDE alone is skipped.
        let first_fde = {
            let cie_len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
            4 + cie_len
        };
        let mut bad_cie = bytes.clone();
        bad_cie[first_fde + 4..first_fde + 8].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
        let table = UnwindTable::from_section("libc", address, &bad_cie, code.clone(), NO_LIMIT).unwrap();
        assert_eq!((table.stats.skipped_fdes, table.stats.fdes), (1, whole.stats.fdes - 1), "{:?}", table.stats);
        // ... or at another FDE instead of a CIE.
        let mut fde_as_cie = bytes.clone();
        let second_fde = first_fde + 4 + u32::from_le_bytes(bytes[first_fde..first_fde + 4].try_into().unwrap()) as usize;
        let pointer_field = second_fde + 4;
        fde_as_cie[pointer_field..pointer_field + 4].copy_from_slice(&((pointer_field - first_fde) as u32).to_le_bytes());
        let table = UnwindTable::from_section("libc", address, &fde_as_cie, code.clone(), NO_LIMIT).unwrap();
        assert_eq!(table.stats.skipped_fdes, 1, "{:?}", table.stats);

        // Random bytes, and random bytes after a valid CIE (so that FDEs
        // with garbage ranges and instructions are parsed).
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        };
        let cie = &bytes[..first_fde];
        let mut errors = 0;
        for round in 0..200 {
            let mut garbage = if round % 2 == 0 { Vec::new() } else { cie.to_vec() };
            garbage.extend(random(64 + round * 37));
            errors += UnwindTable::from_section("garbage", address, &garbage, code.clone(), 100_000).is_err() as usize;
        }
        // FDEs built from a real CIE and bytes whose lengths and ranges are
        // plausible: only the instructions are garbage.
        let (mut skipped, mut read) = (0, 0);
        for round in 0..200 {
            let mut garbage = cie.to_vec();
            for _ in 0..4 {
                let instructions = random(8 + round % 40);
                let len = 4 + 4 + 4 + 1 + instructions.len();
                let pointer = (garbage.len() + 4) as u32;
                garbage.extend((len as u32).to_le_bytes());
                garbage.extend(pointer.to_le_bytes());
                // pcrel sdata4: the start 16 bytes into the code.
                let here = address + garbage.len() as u64;
                garbage.extend(((code.start + 16).wrapping_sub(here) as u32).to_le_bytes());
                garbage.extend(64u32.to_le_bytes());
                garbage.push(0); // no augmentation data
                garbage.extend(instructions);
            }
            let table = UnwindTable::from_section("garbage", address, &garbage, code.clone(), 100_000).unwrap();
            skipped += table.stats.skipped_fdes;
            read += table.stats.fdes;
        }
        // Random bytes delimit no entry (errors); garbage instructions are
        // refused (skipped entries) or read.
        assert!(errors > 100, "{errors} errors");
        assert!(skipped > 0 && read > 0, "{skipped} skipped, {read} read");
        assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    }

    /// Entries covering addresses outside the file's code are left out and
    /// counted (a garbage range could otherwise span the address space).
    #[test]
    fn entries_outside_the_code_are_counted() {
        let (_, address, bytes, code) = libc_eh_frame();
        let half = code.start..code.start + (code.end - code.start) / 2;
        let table = UnwindTable::from_section("libc", address, &bytes, half.clone(), NO_LIMIT).unwrap();
        assert!(table.stats.fdes_outside_code > 100 && table.stats.fdes > 100, "{:?}", table.stats);
        assert!(table.rows.iter().all(|r| u64::from(r.pc) <= half.end - half.start));
    }

    // ---- The cache ----

    #[test]
    fn the_cache_shares_tables_and_keeps_to_its_budget() {
        let libc = local_module(&libc_path());
        let libpython = local_module(Path::new(LIBPYTHON));
        let libc_rows = UnwindTable::for_module(&libc, NO_LIMIT).unwrap().rows.len();
        let libpython_rows = UnwindTable::for_module(&libpython, NO_LIMIT).unwrap().rows.len();

        // The same file opened twice (two processes mapping it): one table.
        let mut cache = TableCache::new(NO_LIMIT);
        let a = cache.get(&libc).unwrap();
        let b = cache.get(&local_module(&libc_path())).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((cache.counts.built, cache.counts.reused), (1, 1));
        drop((a, b));

        // Room for one of the two at a time.
        let mut cache = TableCache::new(libc_rows.max(libpython_rows) + 10);
        let held = cache.get(&libc).unwrap();
        let err = cache.get(&libpython).unwrap_err();
        assert!(format!("{err:#}").contains("does not fit"), "{err:#}");
        assert_eq!(cache.counts.refused, 1);
        // Asked again with no more room: refused without building.
        assert!(cache.get(&libpython).is_err());
        assert_eq!((cache.counts.refused, cache.counts.built), (2, 1));
        // Once no process holds libc's table it is evicted for libpython's.
        drop(held);
        let python = cache.get(&libpython).unwrap();
        assert_eq!((cache.counts.evicted, cache.counts.built), (1, 2));
        assert_eq!(cache.held_rows(), libpython_rows);
        drop(python);

        // A file that cannot be read is remembered as such.
        let mut no_eh_frame = local_module(&libc_path());
        no_eh_frame.eh_frame = None;
        let mut cache = TableCache::new(NO_LIMIT);
        assert!(cache.get(&no_eh_frame).is_err());
        assert!(cache.get(&no_eh_frame).is_err());
        assert_eq!(cache.counts.failed, 1);
    }

    // ---- The stepper against framehop ----

    /// Registers and a copy of the stack above them.
    struct Captured {
        regs: Regs,
        stack_start: u64,
        stack: Vec<u8>,
    }

    /// At most this much stack is copied, as BPF copies a bounded amount.
    const STACK_COPY: u64 = 512 << 10;

    impl Captured {
        fn read(&self, address: u64) -> Option<u64> {
            let at = usize::try_from(address.checked_sub(self.stack_start)?).ok()?;
            Some(u64::from_le_bytes(self.stack.get(at..at.checked_add(8)?)?.try_into().unwrap()))
        }

        fn user_stack(&self, regs: Regs) -> UserStack<'_> {
            UserStack { ip: regs.pc, sp: regs.sp, bp: regs.bp, start: self.stack_start, bytes: &self.stack, full: false }
        }
    }

    /// This function's registers (pc in it) and the stack from sp to the
    /// end of the mapping holding it, at most STACK_COPY bytes.
    #[inline(never)]
    fn capture() -> Captured {
        let (pc, sp, bp): (u64, u64, u64);
        // SAFETY: only reads registers.
        unsafe { std::arch::asm!("lea {pc}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp", pc = out(reg) pc, sp = out(reg) sp, bp = out(reg) bp) };
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let end = maps
            .lines()
            .filter_map(|l| {
                let (start, end) = l.split_whitespace().next()?.split_once('-')?;
                Some((hex(start), hex(end)))
            })
            .find(|(start, end)| (*start..*end).contains(&sp))
            .expect("sp is in a mapping")
            .1;
        let mut stack = vec![0u8; (end - sp).min(STACK_COPY) as usize];
        crate::process::proc::Memory::open(std::process::id()).unwrap().read(sp, &mut stack).unwrap();
        Captured { regs: Regs { pc, sp, bp }, stack_start: sp, stack }
    }

    // Three functions calling each other, none inlined nor tail-calling
    // (each uses the result after the call), and unalike so that they are
    // not merged into one.
    #[inline(never)]
    fn descend_a(depth: u32) -> Captured {
        let c = if depth == 0 { capture() } else { descend_b(std::hint::black_box(depth - 1)) };
        std::hint::black_box(depth + 1);
        c
    }

    #[inline(never)]
    fn descend_b(depth: u32) -> Captured {
        let c = if depth == 0 { capture() } else { descend_c(std::hint::black_box(depth - 1)) };
        std::hint::black_box(depth * 3);
        c
    }

    #[inline(never)]
    fn descend_c(depth: u32) -> Captured {
        let c = if depth == 0 { capture() } else { descend_a(std::hint::black_box(depth - 1)) };
        std::hint::black_box(depth ^ 5);
        c
    }

    /// A mapped file's table, where this process maps it.
    struct Mapped {
        range: Range<u64>,
        name: String,
        bias: u64,
        table: Arc<UnwindTable>,
    }

    fn mapped_tables(cache: &mut TableCache) -> Vec<Mapped> {
        let pid = std::process::id();
        let mut out = Vec::new();
        for m in crate::process::proc::code_mappings(pid).unwrap() {
            let module = if m.path == "[vdso]" {
                let mut bytes = vec![0u8; (m.end - m.start) as usize];
                crate::process::proc::Memory::open(pid).unwrap().read(m.start, &mut bytes).unwrap();
                ModuleFile::from_memory(&bytes).unwrap()
            } else {
                let name = Path::new(&m.path).file_name().unwrap().to_string_lossy().into_owned();
                ModuleFile::read(open_mapping(pid, &m).unwrap(), name).unwrap()
            };
            let Some(bias) = module.bias(m.start, m.offset) else { continue };
            let table = cache.get(&module).unwrap();
            out.push(Mapped { range: m.start..m.end, name: module.name.clone(), bias, table });
        }
        out
    }

    #[derive(Debug, PartialEq, Eq)]
    enum WalkEnd {
        Step(EndCause),
        NoMapping,
        FrameCap,
    }

    /// The walk BPF is to do: each frame's step by its file's table, the
    /// frame-pointer step where no row covers pc. Frames as framehop's
    /// walk gives them: (file name, link-time address looked up).
    fn walk(tables: &[Mapped], mut regs: Regs, read: impl Fn(u64) -> Option<u64>) -> (Vec<(String, u64)>, WalkEnd) {
        let mut frames = Vec::new();
        let mut exact_pc = true;
        loop {
            let lookup = if exact_pc { regs.pc } else { regs.pc - 1 };
            let Some(m) = tables.iter().find(|m| m.range.contains(&lookup)) else { return (frames, WalkEnd::NoMapping) };
            frames.push((m.name.clone(), lookup - m.bias));
            if frames.len() == 256 {
                return (frames, WalkEnd::FrameCap);
            }
            match step(&m.table.rows, m.bias + m.table.base, regs, exact_pc, &read) {
                Ok(caller) => {
                    regs = caller.regs;
                    exact_pc = caller.interrupted;
                }
                Err(EndCause::NoRow | EndCause::NoFde) => match frame_pointer_step(regs, &read) {
                    Ok(caller) => {
                        regs = caller;
                        exact_pc = false;
                    }
                    Err(cause) => return (frames, WalkEnd::Step(cause)),
                },
                Err(cause) => return (frames, WalkEnd::Step(cause)),
            }
        }
    }

    /// framehop's walk (src/native/unwind.rs) of the same registers and stack.
    fn framehop_walk(captured: &Captured, regs: Regs) -> (Vec<(String, u64)>, Stop) {
        let mut files = ModuleFiles::default();
        let unwound = ProcessUnwinder::new(std::process::id()).unwind(&captured.user_stack(regs), &mut files);
        let frames = unwound.frames.iter().map(|f| (f.module.as_ref().map_or(String::new(), |m| m.name.clone()), f.address)).collect();
        (frames, unwound.stop)
    }

    #[test]
    fn the_stepper_walks_its_own_stack_as_framehop_does() {
        let captured = descend_a(std::hint::black_box(7));
        let mut cache = TableCache::new(NO_LIMIT);
        let tables = mapped_tables(&mut cache);
        let (mine, end) = walk(&tables, captured.regs, |a| captured.read(a));
        let (framehop, stop) = framehop_walk(&captured, captured.regs);
        assert_eq!(mine, framehop, "ours ended {end:?}, framehop's {stop:?}");
        assert_eq!((end, stop), (WalkEnd::Step(EndCause::EndOfStack), Stop::Complete));
        // capture, 8 descend frames, the test and the harness's frames,
        // down to libc's thread start.
        assert!(mine.len() >= 12, "{mine:?}");
        assert!(mine.last().unwrap().0.starts_with("libc.so"), "{mine:?}");
    }

    // ---- Through a signal frame ----

    /// What the signal handler saw: its own registers and stack, and the
    /// registers the signal interrupted (from the ucontext_t).
    static IN_HANDLER: std::sync::Mutex<Option<(Captured, Regs)>> = std::sync::Mutex::new(None);

    extern "C" fn on_signal(_: libc::c_int, _: *mut libc::siginfo_t, context: *mut libc::c_void) {
        // SAFETY: the kernel passes a ucontext_t to an SA_SIGINFO handler.
        let gregs = unsafe { (*(context as *const libc::ucontext_t)).uc_mcontext.gregs };
        let interrupted = Regs { pc: gregs[libc::REG_RIP as usize] as u64, sp: gregs[libc::REG_RSP as usize] as u64, bp: gregs[libc::REG_RBP as usize] as u64 };
        // raise() delivers the signal to this thread, which holds no lock:
        // allocating here is safe.
        let captured = capture();
        *IN_HANDLER.lock().unwrap() = Some((captured, interrupted));
    }

    #[inline(never)]
    fn raise_in_a_deep_stack(depth: u32, signal: libc::c_int) {
        if depth == 0 {
            // SAFETY: raise(3) with a signal whose handler is installed.
            unsafe { libc::raise(signal) };
        } else {
            raise_in_a_deep_stack(std::hint::black_box(depth - 1), signal);
        }
        std::hint::black_box(depth);
    }

    /// From inside a signal handler, through glibc's __restore_rt: the
    /// frames up to it are those framehop walks from the handler, and the
    /// frames past it those framehop walks from the interrupted registers
    /// the kernel saved.
    #[test]
    fn the_stepper_unwinds_through_a_signal_frame() {
        let signal = libc::SIGRTMIN() + 5;
        // SAFETY: installs a handler for a signal nothing else here uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
        }
        raise_in_a_deep_stack(std::hint::black_box(5), signal);
        let (captured, interrupted) = IN_HANDLER.lock().unwrap().take().expect("the handler ran");
        let mut cache = TableCache::new(NO_LIMIT);
        let tables = mapped_tables(&mut cache);
        let (mine, end) = walk(&tables, captured.regs, |a| captured.read(a));
        // framehop cannot evaluate the signal frame's CFA (a dereference)
        // and guesses past it: only its frames up to __restore_rt, libc's
        // first frame, are the truth.
        let (mut to_handler, _) = framehop_walk(&captured, captured.regs);
        let restore_rt = to_handler.iter().position(|(file, _)| file.starts_with("libc.so")).expect("the handler returns into libc's __restore_rt");
        to_handler.truncate(restore_rt + 1);
        // The registers restored from the signal frame are those the
        // handler was given.
        let mut regs = captured.regs;
        let mut exact_pc = true;
        let restored = loop {
            let lookup = if exact_pc { regs.pc } else { regs.pc - 1 };
            let m = tables.iter().find(|m| m.range.contains(&lookup)).unwrap();
            let caller = step(&m.table.rows, m.bias + m.table.base, regs, exact_pc, |a| captured.read(a)).unwrap();
            if caller.interrupted {
                break caller.regs;
            }
            (regs, exact_pc) = (caller.regs, false);
        };
        assert_eq!(restored, interrupted);
        let (past_handler, stop) = framehop_walk(&captured, interrupted);
        assert_eq!(stop, Stop::Complete);
        let framehop: Vec<_> = to_handler.iter().chain(&past_handler).cloned().collect();
        assert_eq!(mine, framehop, "ours ended {end:?}");
        assert_eq!(end, WalkEnd::Step(EndCause::EndOfStack));
        assert!(past_handler.len() >= 8, "raise, 6 raising frames, the test: {past_handler:?}");
    }

    // ---- The rules on stacks built by hand ----

    /// A stack as a map of 8-byte words.
    fn memory(words: &[(u64, u64)]) -> impl Fn(u64) -> Option<u64> + '_ {
        move |a| words.iter().find(|(at, _)| *at == a).map(|(_, v)| *v)
    }

    fn row(pc: u32, kind: RowKind, cfa_offset: i16, rbp_at: i8) -> UnwindRow {
        UnwindRow { pc, cfa_offset, kind: kind as u8, rbp_at }
    }

    #[test]
    fn step_follows_each_kind_of_row() {
        const START: u64 = 0x5555_0000_0000;
        let rows = [
            row(0, RowKind::CfaRsp, 24, -2),
            row(0x100, RowKind::Plt, 0, 0),
            row(0x200, RowKind::CfaRbp, 16, -2),
            row(0x300, RowKind::NoFde, 0, 0),
            row(0x400, RowKind::EndOfStack, 0, 0),
            row(0x500, RowKind::UnsupportedExpression, 0, 0),
            row(0x600, RowKind::CfaRsp, 8, 0),
            row(0x700, RowKind::CfaRsp, 12, 0),
            row(0x800, RowKind::CfaRsp, -8, 0),
        ];
        let sp = 0x7ffd_0000_1000u64;
        let ra = 0x5555_0000_2345u64;
        let stack = [(sp + 8, 0x1111), (sp + 16, ra), (sp + 24, ra), (sp + 32, 0xffff_ffff_8100_0000)];
        let read = memory(&stack);
        let regs = |pc: u64, bp: u64| Regs { pc: START + pc, sp, bp };
        let up = |pc, bp, first| step(&rows, START, regs(pc, bp), first, &read);

        // CFA = rsp+24; rbp saved at CFA-16; return address at CFA-8.
        assert_eq!(up(0x10, 7, true), Ok(Caller { regs: Regs { pc: ra, sp: sp + 24, bp: 0x1111 }, interrupted: false }));
        // A return address just past a row's start belongs to the row
        // before (the call is the last instruction of the code it covers).
        assert_eq!(up(0x100, 7, false).unwrap().regs.sp, sp + 24);
        // The PLT: the push at offset 6 in an entry has run from offset 11 on.
        let plt_stack = [(sp, 0x5555_0000_aaaa), (sp + 8, 0x5555_0000_bbbb)];
        let plt = |pc| step(&rows, START, regs(pc, 7), true, memory(&plt_stack)).map(|c| c.regs);
        assert_eq!(plt(0x10a), Ok(Regs { pc: 0x5555_0000_aaaa, sp: sp + 8, bp: 7 }));
        assert_eq!(plt(0x10b), Ok(Regs { pc: 0x5555_0000_bbbb, sp: sp + 16, bp: 7 }));
        assert_eq!(plt(0x1f0), Ok(Regs { pc: 0x5555_0000_aaaa, sp: sp + 8, bp: 7 }));
        assert_eq!(plt(0x1ff), Ok(Regs { pc: 0x5555_0000_bbbb, sp: sp + 16, bp: 7 }));
        // CFA = rbp+16, caller's rbp at CFA-16 = the rbp we had.
        assert_eq!(up(0x210, sp + 8, true).unwrap().regs, Regs { pc: ra, sp: sp + 24, bp: 0x1111 });
        // rbp below sp: the CFA would not be above sp.
        assert_eq!(up(0x210, sp - 64, true), Err(EndCause::SpNotRising));
        assert_eq!(up(0x210, sp + 4, true), Err(EndCause::BadCfa));
        assert_eq!(up(0x210, USER_SPACE_END, true), Err(EndCause::BadCfa));
        assert_eq!(up(0x310, 7, true), Err(EndCause::NoFde));
        assert_eq!(up(0x410, 7, true), Err(EndCause::EndOfStack));
        assert_eq!(up(0x510, 7, true), Err(EndCause::UnsupportedExpression));
        // Return addresses: 0x1111 is fine, [sp] unreadable, a kernel one bad.
        assert_eq!(up(0x610, 7, true), Err(EndCause::ReadFailed));
        assert_eq!(up(0x710, 7, true), Err(EndCause::BadCfa));
        assert_eq!(up(0x810, 7, true), Err(EndCause::SpNotRising));
        let kernel = [row(0, RowKind::CfaRsp, 40, 0)];
        assert_eq!(step(&kernel, START, regs(0, 7), true, &read), Err(EndCause::BadReturnAddress));
        let zero = [row(0, RowKind::CfaRsp, 48, 0)];
        let zero_stack = [(sp + 40, 0)];
        assert_eq!(step(&zero, START, regs(0, 7), true, memory(&zero_stack)), Err(EndCause::BadReturnAddress));
        // Outside the table.
        assert_eq!(step(&rows, START, Regs { pc: START - 1, sp, bp: 7 }, true, &read), Err(EndCause::NoRow));
        assert_eq!(step(&rows, START, Regs { pc: START, sp, bp: 7 }, false, &read), Err(EndCause::NoRow));
        assert_eq!(step(&rows, START, Regs { pc: START + (1 << 32), sp, bp: 7 }, true, &read), Err(EndCause::NoRow));
    }

    #[test]
    fn a_signal_frame_restores_the_interrupted_registers() {
        let rows = [row(0, RowKind::SignalFrame, 0, 0)];
        let context = 0x7ffd_0000_2000u64;
        // Where the libc crate's ucontext_t has the registers.
        let gregs = (std::mem::offset_of!(libc::ucontext_t, uc_mcontext) + std::mem::offset_of!(libc::mcontext_t, gregs)) as u64;
        let register = |r: libc::c_int| context + gregs + 8 * r as u64;
        let stack = [(register(libc::REG_RIP), 0x5555_0000_1234), (register(libc::REG_RSP), 0x7ffd_0000_9000), (register(libc::REG_RBP), 0x42)];
        let caller = step(&rows, 0x1000, Regs { pc: 0x1001, sp: context, bp: 1 }, false, memory(&stack)).unwrap();
        assert_eq!(caller, Caller { regs: Regs { pc: 0x5555_0000_1234, sp: 0x7ffd_0000_9000, bp: 0x42 }, interrupted: true });
        assert_eq!(step(&rows, 0x1000, Regs { pc: 0x1001, sp: context + 8, bp: 1 }, false, memory(&stack)), Err(EndCause::ReadFailed));
    }

    #[test]
    fn the_frame_pointer_step_is_checked() {
        let sp = 0x7ffd_0000_1000u64;
        let bp = sp + 0x40;
        let stack = [(bp, 0x7ffd_0000_2000), (bp + 8, 0x5555_0000_4321), (sp + 0x80, 0), (sp + 0x88, 0x5555_0000_4321)];
        let read = memory(&stack);
        assert_eq!(frame_pointer_step(Regs { pc: 1, sp, bp }, &read), Ok(Regs { pc: 0x5555_0000_4321, sp: bp + 16, bp: 0x7ffd_0000_2000 }));
        for bad_bp in [bp + 4, sp - 16, sp + MAX_FRAME_POINTER_FRAME + 8, 0] {
            assert_eq!(frame_pointer_step(Regs { pc: 1, sp, bp: bad_bp }, &read), Err(EndCause::BadFramePointer), "{bad_bp:#x}");
        }
        assert_eq!(frame_pointer_step(Regs { pc: 1, sp, bp: sp + 0x100 }, &read), Err(EndCause::ReadFailed));
        // The caller's rbp at [sp+0x80] reads 0, fine; the return address is fine too.
        assert_eq!(frame_pointer_step(Regs { pc: 1, sp, bp: sp + 0x80 }, &read).unwrap().bp, 0);
        let zero_ra = [(bp, 0), (bp + 8, 0)];
        assert_eq!(frame_pointer_step(Regs { pc: 1, sp, bp }, memory(&zero_ra)), Err(EndCause::BadReturnAddress));
    }
}
