//! Unwind tables for unwinding native stacks in the kernel
//! (docs/design/native-unwind.md, step 1): each file's `.eh_frame` turned
//! into sorted 8-byte rows BPF can binary-search, one row per change of the
//! only rules an x86-64 unwinder needs (where the CFA is, where the caller's
//! rbp was saved; the return address is always at CFA-8), checked against
//! readelf; and a cache that builds each file's table once for all the
//! processes mapping it.

// Nothing outside the tests uses the tables until BPF does (the design's
// steps 2 and 3).
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
/// uc_mcontext's RSP, RBP and RIP in the ucontext_t at rsp.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use crate::process::files::open_local;

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
}
