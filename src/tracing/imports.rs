//! The `imports` BPF session (bpf/imports.bpf.c): the start and end of each
//! module import, in order.

use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::SkelBuilder;
use libbpf_rs::RingBufferBuilder;

use super::{attach_error, ensure_still_running, poll_until, read_counters};
use crate::bpf::imports::types::{import_counter, import_event, import_phase};
use crate::bpf::imports::ImportsSkelBuilder;
use crate::python::Python;

/// Why `imports` cannot work on this interpreter, if it cannot.
pub fn check_probes(python: &Python) -> Result<&'static str> {
    let elf = &python.elf;
    if elf.has_usdt("python", "import__find__load__start") && elf.has_usdt("python", "import__find__load__done") {
        return Ok("usdt");
    }
    bail!(
        "{} has no import__find__load__start/done USDT probes (CPython built without --with-dtrace): pytrace imports needs them; `python -X importtime` gives the same tree from inside",
        python.target_path
    )
}

#[derive(Debug, Clone)]
pub struct ImportEvent {
    pub ts_ns: u64,
    pub tid: u32,
    pub start: bool,
    pub found: bool,
    pub name: String,
}

pub struct ImportData {
    pub events: Vec<ImportEvent>,
    pub counters: Vec<(&'static str, u64)>,
}

pub fn run(
    pid: u32,
    python: &Python,
    attached: impl FnOnce() -> Result<()>,
    keep_going: impl FnMut() -> Result<bool>,
) -> Result<ImportData> {
    let mut object = MaybeUninit::uninit();
    let open = ImportsSkelBuilder::default().open(&mut object).context("failed to open the imports BPF program")?;
    let skel = crate::bpf::load::load("imports", open)?;

    let path = &python.elf.path;
    let what = |probe| format!("failed to attach to the USDT probe python:{probe} in {}", python.target_path);
    let links = vec![
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
    ];
    ensure_still_running(pid)?;

    let mut events = Vec::new();
    let mut builder = RingBufferBuilder::new();
    builder.add(&skel.maps.events, |bytes: &[u8]| {
        let mut ev = import_event::default();
        if plain::copy_from_bytes(&mut ev, bytes).is_ok() {
            let len = (ev.name_len as usize).min(ev.name.len());
            let name: Vec<u8> = ev.name[..len].iter().map(|&c| c as u8).collect();
            events.push(ImportEvent {
                ts_ns: ev.ts_ns,
                tid: ev.tid,
                start: ev.phase == import_phase::IMPORT_START.0 as u8,
                found: ev.found != 0,
                name: String::from_utf8_lossy(&name).into_owned(),
            });
        }
        0
    })?;
    let ring = builder.build()?;
    attached()?;
    let polled = poll_until(&ring, "imports", keep_going);
    drop(links);
    polled?;
    ring.consume().context("failed to drain the imports ring buffer")?;
    drop(ring);
    let counters = read_counters(&skel.maps.counters, &[("event_lost", import_counter::IMPORT_EVENT_LOST.0)])?;
    Ok(ImportData { events, counters })
}

// SAFETY: a plain integer struct generated from bpf/imports.h.
unsafe impl plain::Plain for import_event {}
