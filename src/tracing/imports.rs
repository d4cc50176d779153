//! The `imports` BPF session (bpf/imports.bpf.c): the start and end of each
//! module import, in order, from CPython's USDT probes or, without them, a
//! uprobe on the eval function (importlib's _find_and_load called from C).

use std::cell::RefCell;
use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::{OpenObject, RingBufferBuilder};

use super::{attach_entry_and_return, attach_error, ensure_still_running, entry_probe_offset, has_uprobe_sessions, read_counters, CounterRow, Links, Tracing};
use crate::model::counters::Counters;
use crate::model::events::ImportEvent;
use crate::model::counters::Kind::{Informational, Lost};
use crate::bpf::imports::types::{import_counter, import_event, import_phase, py_layout};
use crate::bpf::imports::{ImportsSkel, ImportsSkelBuilder};
use crate::python::layouts::NO_FIELD;
use crate::python::reading::strings;
use crate::python::{Python, EVAL_FRAME_SYMBOL};

/// importlib._bootstrap's co_filename in every version (it is frozen).
const IMPORTLIB_FILE: &str = "<frozen importlib._bootstrap>";

/// Counters from bpf/imports.h's enum import_counter: name, kind, meaning.
const COUNTERS: [CounterRow; 3] = [
    ("event_lost", Lost, "import events lost (ring buffer full)", import_counter::IMPORT_EVENT_LOST.0),
    ("name_unreadable", Informational, "imports whose module name could not be read", import_counter::IMPORT_NAME_UNREADABLE.0),
    ("too_deep", Lost, "imports nested too deep to time", import_counter::IMPORT_TOO_DEEP.0),
];

// How `imports` sees imports: the import__find__load__start/done USDT
// probes, or a uprobe on _PyEval_EvalFrameDefault keeping the evaluations
// of importlib's _find_and_load that C code starts.
pub use super::Mode;

/// The mode `imports` uses for this interpreter (`requested` by --mode,
/// else the probes where they exist), and why.
pub fn choose_mode(python: &Python, requested: Option<Mode>) -> Result<(Mode, &'static str)> {
    let elf = &python.elf;
    let probes = elf.has_usdt("python", "import__find__load__start") && elf.has_usdt("python", "import__find__load__done");
    match requested {
        Some(Mode::Usdt) if !probes => bail!(
            "--mode usdt needs the import__find__load__start/done USDT probes, which {} does not have (built without --with-dtrace); use --mode uprobe",
            python.target_path
        ),
        Some(Mode::Usdt) | None if probes => Ok((Mode::Usdt, "the import__find__load probes")),
        Some(Mode::Uprobe) => Ok((Mode::Uprobe, "asked for with --mode uprobe: importlib's _find_and_load, called from C, seen entering _PyEval_EvalFrameDefault")),
        _ => Ok((Mode::Uprobe, "no import probes: importlib's _find_and_load, called from C, seen entering _PyEval_EvalFrameDefault")),
    }
}

pub struct ImportData {
    pub events: Vec<ImportEvent>,
    pub counters: Counters,
}

/// The imports program loaded and attached to one target, in steps that the
/// session driver (src/session/driver.rs) runs.
pub struct Session<'obj> {
    skel: ImportsSkel<'obj>,
    links: Links,
    events: RefCell<Vec<ImportEvent>>,
}

/// An imports session to start (`Start`): on `pid`, whose Python is
/// `python`, seen in `mode`.
pub struct Plan<'p> {
    pub pid: u32,
    pub python: &'p Python,
    pub mode: Mode,
}

impl super::Start for Plan<'_> {
    type Data = ImportData;
    type Objects = super::Object;
    type Session<'obj> = Session<'obj>;

    fn start<'obj>(self, object: &'obj mut MaybeUninit<OpenObject>) -> Result<Session<'obj>> {
        Session::start(object, self.pid, self.python, self.mode)
    }
}

impl<'obj> Session<'obj> {
    /// Loads the program into `object` and attaches it: from here on every
    /// import of the target is seen.
    pub fn start(object: &'obj mut MaybeUninit<OpenObject>, pid: u32, python: &Python, mode: Mode) -> Result<Self> {
        let mut open = ImportsSkelBuilder::default().open(object).context("failed to open the imports BPF program")?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the imports BPF program has no rodata")?;
        let l = &python.layout;
        rodata.cfg.layout = super::py_layout!(py_layout, l);
        rodata.cfg.code_type = python.code_type_address().unwrap_or(0);
        // How much of a code object covers every field read.
        rodata.cfg.code_head = [l.object_type, l.code_qualname, l.code_filename].iter().filter(|&&o| o != NO_FIELD).map(|o| o + 8).max().unwrap_or(8);
        rodata.cfg.frame_localsplus = l.frame_localsplus;
        let name = |s: &str| {
            let mut padded = [0 as std::ffi::c_char; 32];
            padded.iter_mut().zip(s.bytes()).for_each(|(to, from)| *to = from as std::ffi::c_char);
            padded
        };
        rodata.cfg.bootstrap_file = name(IMPORTLIB_FILE);
        rodata.cfg.find_and_load = name("_find_and_load");
        rodata.cfg.gcd_import = name("_gcd_import");
        let sessions = has_uprobe_sessions();
        let uprobe = mode == Mode::Uprobe;
        open.progs.usdt_import_start.set_autoload(!uprobe);
        open.progs.usdt_import_done.set_autoload(!uprobe);
        open.progs.eval_frame.set_autoload(uprobe && sessions);
        open.progs.eval_entry.set_autoload(uprobe && !sessions);
        open.progs.eval_return.set_autoload(uprobe && !sessions);
        let skel = crate::bpf::load::load("imports", open)?;

        let path = &python.elf.path;
        let links = match mode {
            Mode::Usdt => {
                let what = |probe| format!("failed to attach to the USDT probe python:{probe} in {}", python.target_path);
                vec![
                    skel.progs
                        .usdt_import_start
                        .attach_usdt(pid as i32, path, "python", "import__find__load__start")
                        .map_err(|e| attach_error(pid, e))
                        .with_context(|| what("import__find__load__start"))?,
                    skel.progs
                        .usdt_import_done
                        .attach_usdt(pid as i32, path, "python", "import__find__load__done")
                        .map_err(|e| attach_error(pid, e))
                        .with_context(|| what("import__find__load__done"))?,
                ]
            }
            Mode::Uprobe => {
                let addr = python.symbol(EVAL_FRAME_SYMBOL)?;
                let offset = entry_probe_offset(python.elf.read_static(addr, 8)?, python.elf.file_offset(addr)? as usize);
                let p = &skel.progs;
                attach_entry_and_return(&p.eval_frame, &p.eval_entry, &p.eval_return, pid, path, offset)
                    .with_context(|| format!("failed to attach to {EVAL_FRAME_SYMBOL} in {}", python.target_path))?
            }
        };
        ensure_still_running(pid)?;
        Ok(Session { skel, links: Links::new(links), events: RefCell::new(Vec::new()) })
    }
}

impl Tracing for Session<'_> {
    type Data = ImportData;

    fn what(&self) -> String {
        "imports".into()
    }

    /// The ring buffer of import starts and ends, in order.
    fn add_to<'s>(&'s self, builder: &mut RingBufferBuilder<'s, 's>) -> Result<()> {
        builder.add(&self.skel.maps.events, |bytes: &[u8]| {
            let mut ev = import_event::default();
            if plain::copy_from_bytes(&mut ev, bytes).is_ok() {
                let bytes: Vec<u8> = ev.name.iter().map(|&c| c as u8).collect();
                let name = strings::decode(ev.name_kind, ev.name_len, &bytes).unwrap_or_else(|| "[unreadable module name]".into());
                self.events.borrow_mut().push(ImportEvent {
                    ts_ns: ev.ts_ns,
                    tid: ev.tid,
                    start: ev.phase == import_phase::IMPORT_START.0 as u8,
                    found: ev.found != 0,
                    name,
                });
            }
            0
        })?;
        Ok(())
    }

    fn links(&self) -> Option<&Links> {
        Some(&self.links)
    }

    fn finish(self) -> Result<ImportData> {
        Ok(ImportData { events: self.events.into_inner(), counters: read_counters(&self.skel.maps.counters, &COUNTERS)? })
    }
}

// SAFETY: a plain integer struct generated from bpf/imports.h.
unsafe impl plain::Plain for import_event {}
