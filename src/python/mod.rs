//! Finding the CPython interpreter in a process or a binary: which ELF file
//! holds it (the executable, or a shared libpython), its version, where it is
//! loaded, its USDT probes, and the layout of its structures.

pub mod layouts;
pub mod probes;
pub mod reading;
pub mod target_writes;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::rc::{Rc, Weak};

use anyhow::{bail, Context, Result};

use crate::process::elf::{find_library, ElfFile};
use crate::process::files::{self, FileId};
use crate::process::proc;
use probes::{eval_entry, generator_close, inlined_getitem, inlined_init};
use target_writes::eval_frame_offset::{self, EvalFrameOffset};
pub use layouts::Layout;

/// The symbols that make an ELF file a CPython interpreter.
pub const EVAL_FRAME_SYMBOL: &str = "_PyEval_EvalFrameDefault";
pub const RUNTIME_SYMBOL: &str = "_PyRuntime";
const CODE_TYPE_SYMBOL: &str = "PyCode_Type";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub micro: Option<u32>,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.micro {
            Some(micro) => write!(f, "{}.{}.{}", self.major, self.minor, micro),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

/// A CPython interpreter found in a process or on disk.
pub struct Python {
    /// The ELF file holding the interpreter: the executable or libpython,
    /// shared by every process that runs the same file.
    pub elf: Rc<ElfFile>,
    /// That file's path as the target sees it.
    pub target_path: String,
    pub version: Version,
    pub layout: Layout,
    /// Run-time minus link-time addresses, once the file is mapped.
    pub load_bias: Option<u64>,
    /// Where interp->eval_frame is, by which sources (eval_frame_offset.rs).
    pub eval_frame_offset: EvalFrameOffset,
    /// `_Py_DebugOffsets.free_threaded` (3.13+): a build without the GIL,
    /// whose structures differ from the tables'.
    pub free_threaded: bool,
    /// 3.13's inlined-__init__ probe, found once (inlined_init.rs scans the
    /// file for it) however many places ask.
    inlined_init: std::cell::OnceCell<Option<inlined_init::InitProbe>>,
    /// 3.11.0-3.11.3's inlined __getitem__ probe (inlined_getitem.rs), likewise.
    inlined_getitem: std::cell::OnceCell<Option<inlined_getitem::InlineFrameProbe>>,
    /// Where generator close() skips the frame (generator_close.rs), likewise.
    skipped_close: std::cell::OnceCell<generator_close::CloseProbe>,
    /// Where calls probes the eval function and its hook points (eval_entry.rs), likewise.
    eval_probe: std::cell::OnceCell<eval_entry::EvalProbe>,
}

impl Python {
    /// The interpreter inside a running process: its executable or a
    /// libpython it maps, each opened through the process and checked to be
    /// the mapped file (src/process/files.rs).
    pub fn from_pid(pid: u32) -> Result<Self> {
        if !proc::exists(pid) {
            bail!("no process with PID {pid}");
        }
        if !proc::is_running(pid) {
            bail!("process {pid} has exited");
        }
        if proc::is_kernel_thread(pid) {
            bail!("process {pid} ({}) is not a CPython process: it is a kernel thread", proc::command_name(pid));
        }
        let (exe, exe_deleted) = proc::exe_path(pid).map_err(|e| access_error(e, pid))?;
        let maps = proc::file_mappings(pid).map_err(|e| access_error(e, pid))?;
        // Each file once, by identity: the executable first, then libpython.
        let mut candidates: Vec<&proc::Mapping> = Vec::new();
        for m in maps.iter().filter(|m| m.offset == 0) {
            let is_exe = m.path == exe && m.deleted == exe_deleted;
            let name = Path::new(&m.path).file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            if (is_exe || name.starts_with("libpython")) && !candidates.iter().any(|c| FileId::of(c) == FileId::of(m)) {
                candidates.insert(if is_exe { 0 } else { candidates.len() }, m);
            }
        }
        let mut refused = None;
        for m in candidates {
            match interpreter_file(pid, m) {
                Ok(Some(elf)) => {
                    let load_bias = Some(elf.load_bias(m.start)?);
                    return Self::new(elf, m.path.clone(), load_bias);
                }
                Ok(None) => {}
                Err(e) => refused = refused.or(Some(e)),
            }
        }
        // A file that could not be read safely is the answer, not "not Python".
        if let Some(e) = refused {
            return Err(e.context(format!("could not read the interpreter files of process {pid}")));
        }
        bail!(
            "process {pid} ({}) is not a CPython process: neither its executable nor its libraries contain the CPython interpreter",
            proc::command_name(pid)
        )
    }

    /// The interpreter a Python executable will run, before it runs: the
    /// executable itself or the libpython it links. With `pid`, the
    /// executable is that process's (stopped at its exec: the file is
    /// opened through it) and libpython is looked for inside its root;
    /// without, `path` is a file on pytrace's command line. Ok(None): not
    /// Python.
    pub fn from_executable(path: &Path, pid: Option<u32>) -> Result<Option<Self>> {
        let exe = match pid {
            Some(pid) => ElfFile::read(files::open_executable(pid, &proc::file_mappings(pid)?)?)?,
            None => ElfFile::open(path)?,
        };
        let target_path = path.to_string_lossy().into_owned();
        if is_interpreter(&exe) {
            return Self::new(Rc::new(exe), target_path, None).map(Some);
        }
        let Some(lib) = exe.needed.iter().find(|n| n.starts_with("libpython")) else {
            return Ok(None);
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let root_of = pid.unwrap_or_else(std::process::id);
        let lib_path = find_library(&exe, dir, lib, root_of)
            .with_context(|| format!("{} needs {lib}, which pytrace could not find", path.display()))?;
        // Not mapped yet: the process maps it later, and every use checks
        // that the mapped file is this one (by identity, see `load_bias_in`).
        let elf = ElfFile::read(files::open_in_root(root_of, &lib_path)?)?;
        if !is_interpreter(&elf) {
            bail!("{lib_path} does not contain the CPython interpreter");
        }
        Self::new(Rc::new(elf), lib_path, None).map(Some)
    }

    /// The run-time minus link-time address of the interpreter file in
    /// process `pid` now: where a mapping of this very file (same device and
    /// inode) starts. Fails if the process maps another file by that name
    /// (replaced on disk, or another libpython than the one found for a
    /// command pytrace started).
    pub fn load_bias_in(&self, pid: u32) -> Result<u64> {
        load_bias_in(&self.elf, &self.target_path, pid)
    }

    fn new(elf: Rc<ElfFile>, target_path: String, load_bias: Option<u64>) -> Result<Self> {
        let version = detect_version(&elf, &target_path)?;
        let free_threaded = is_free_threaded(&elf);
        let Some(table) = layouts::for_build(version.major, version.minor, free_threaded) else {
            if free_threaded {
                bail!(
                    "Python {version} free-threaded ({target_path}) is not supported: pytrace supports free-threaded CPython {}",
                    layouts::free_threaded_versions()
                );
            }
            bail!(
                "Python {version} ({target_path}) is not supported: pytrace supports CPython {}",
                layouts::supported_range()
            );
        };
        let (layout, eval_frame_offset, free_threaded) =
            read_layout(&elf, table).with_context(|| format!("reading the layout of Python {version} in {target_path}"))?;
        Ok(Self { elf, target_path, version, layout, load_bias, eval_frame_offset, free_threaded, inlined_init: std::cell::OnceCell::new(), inlined_getitem: std::cell::OnceCell::new(), skipped_close: std::cell::OnceCell::new(), eval_probe: std::cell::OnceCell::new() })
    }

    /// Link-time address of one of the interpreter's symbols.
    pub fn symbol(&self, name: &str) -> Result<u64> {
        self.elf
            .symbol(name)
            .with_context(|| format!("{} has no symbol {name}", self.target_path))
    }

    /// Run-time address of a symbol in the target.
    pub fn runtime_address(&self, name: &str) -> Result<u64> {
        let bias = self.load_bias.with_context(|| format!("{} is not loaded yet", self.target_path))?;
        Ok(self.symbol(name)?.wrapping_add(bias))
    }

    pub fn code_type_address(&self) -> Option<u64> {
        self.runtime_address(CODE_TYPE_SYMBOL).ok()
    }

    pub fn is_shared_library(&self) -> bool {
        self.elf.is_shared_object && self.elf.symbol("main").is_none()
    }

    /// Whether Python-to-Python calls run inside one
    /// _PyEval_EvalFrameDefault (3.11+), unless interp->eval_frame is set.
    pub fn inlines_calls(&self) -> bool {
        self.layout.facts().inlines_calls
    }

    pub fn function_probes(&self) -> FunctionProbes {
        let has = |name| self.elf.has_usdt("python", name);
        if !has("function__entry") || !has("function__return") {
            FunctionProbes::Missing
        } else if self.layout.facts().function_entry_misses_inlined {
            FunctionProbes::EntryBroken
        } else {
            FunctionProbes::Working
        }
    }
}

/// What CPython's function__entry/function__return USDT probes are good for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionProbes {
    /// Both fire on every call and return.
    Working,
    /// 3.11: function__entry fires only on the rare non-inlined path (5 times
    /// in 4 million calls, measured), function__return on every return.
    EntryBroken,
    /// Built without --with-dtrace, or 3.12 to 3.14 (removed with PEP 669).
    Missing,
}

/// Whether the binary is a free-threaded build (`--disable-gil`, 3.13+), as
/// the `free_threaded` word of its `_Py_DebugOffsets` says: which table its
/// offsets start from depends on it. A build before 3.13 has no
/// `_Py_DebugOffsets`: its `_PyRuntime` does not start with the cookie.
fn is_free_threaded(elf: &ElfFile) -> bool {
    elf.symbol(RUNTIME_SYMBOL)
        .and_then(|runtime| elf.read_static(runtime, 24).ok())
        .and_then(layouts::free_threaded_build)
        .unwrap_or(false)
}

/// See Python::load_bias_in.
pub fn load_bias_in(elf: &ElfFile, target_path: &str, pid: u32) -> Result<u64> {
    let maps = proc::file_mappings(pid)?;
    if let Some(m) = maps.iter().find(|m| FileId::of(m) == elf.id && m.offset == 0) {
        return elf.load_bias(m.start);
    }
    let name = Path::new(target_path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match maps.iter().find(|m| m.offset == 0 && Path::new(&m.path).file_name().is_some_and(|n| n.to_string_lossy() == name)) {
        Some(m) => bail!(
            "process {pid} maps {}{}, which is not the file pytrace read ({target_path}): pytrace uses only the file the process runs",
            m.path,
            if m.deleted { " (deleted)" } else { "" },
        ),
        None => bail!("{target_path} is not mapped in process {pid}"),
    }
}

/// The version's table, with what the binary itself says: its
/// `_Py_DebugOffsets` (3.13+), read from the file rather than from the
/// process, since it is a static initialiser (the same bytes) and the file is
/// there before a launched target runs, with its `free_threaded` flag; and
/// where interp->eval_frame is, the one field pytrace writes, which
/// `_Py_DebugOffsets` does not list: taken only where two sources agree
/// (eval_frame_offset.rs).
fn read_layout(elf: &ElfFile, table: &Layout) -> Result<(Layout, EvalFrameOffset, bool)> {
    let (mut layout, free_threaded) = match table.debug_offsets {
        Some(d) => {
            let runtime = elf.symbol(RUNTIME_SYMBOL).context("no _PyRuntime symbol")?;
            let bytes = elf.read_static(runtime, d.span().max(DEBUG_FREE_THREADED + 8)).context("reading _Py_DebugOffsets")?;
            let free_threaded = u64::from_le_bytes(bytes[DEBUG_FREE_THREADED..DEBUG_FREE_THREADED + 8].try_into().unwrap()) != 0;
            (table.resolve(bytes).map_err(|e| anyhow::anyhow!("{e}"))?, free_threaded)
        }
        None => (table.clone(), false),
    };
    let code = |name| elf.function_code(name, eval_frame_offset::MAX_CODE);
    let offset = EvalFrameOffset::new(table.interp_eval_frame, code(eval_frame_offset::GET_SYMBOL), code(eval_frame_offset::SET_SYMBOL));
    if let Some(agreed) = offset.agreed {
        layout.interp_eval_frame = agreed;
    }
    Ok((layout, offset, free_threaded))
}

/// Where `_Py_DebugOffsets.free_threaded` is: after the 8-byte cookie and
/// the version, in 3.13 as in 3.14 and 3.15 (every one of them puts
/// runtime_state.interpreters_head at 40, three words later).
const DEBUG_FREE_THREADED: usize = 16;

/// What tells one version of a file from the next: identity, size, mtime.
type FileStamp = (FileId, u64, i64);

thread_local! {
    /// Files already looked at, by identity, size and modification time:
    /// `sample --all` looks at every process each rescan, and 20 processes
    /// of one Python read and parsed its executable 20 times (2 s and 440
    /// MB on this VM) before this. An interpreter file is held (whole, 7 to
    /// 31 MB) only while a Python of it is: a 10-minute `sample --all`
    /// kept every Python build that other work on the machine ran, and
    /// grew by 200 MiB.
    static LOOKED_AT: RefCell<HashMap<FileStamp, Option<Weak<ElfFile>>>> = RefCell::new(HashMap::new());
}

/// The parsed file mapped at `m` in process `pid` if it holds the CPython
/// interpreter; each file is read once while processes of it are looked
/// at, and a file that is not an interpreter once per pytrace run. Err: the
/// file could not be opened or read safely.
fn interpreter_file(pid: u32, m: &proc::Mapping) -> Result<Option<Rc<ElfFile>>> {
    let file = files::open_mapping(pid, m)?;
    let stamp = (file.id, file.size, file.mtime);
    match LOOKED_AT.with(|seen| seen.borrow().get(&stamp).cloned()) {
        Some(None) => return Ok(None),
        Some(Some(held)) => {
            if let Some(elf) = held.upgrade() {
                return Ok(Some(elf));
            }
        }
        None => {}
    }
    let elf = match ElfFile::read(file) {
        Ok(elf) => is_interpreter(&elf).then(|| Rc::new(elf)),
        // Not an ELF file at all: not an interpreter either.
        Err(e) if e.to_string().ends_with("is not an ELF file") => None,
        Err(e) => return Err(e),
    };
    LOOKED_AT.with(|seen| seen.borrow_mut().insert(stamp, elf.as_ref().map(Rc::downgrade)));
    Ok(elf)
}

fn is_interpreter(elf: &ElfFile) -> bool {
    elf.symbol(EVAL_FRAME_SYMBOL).is_some() && elf.symbol(RUNTIME_SYMBOL).is_some()
}

/// Says what failed; adds the likely cause only when it is known: not root.
fn access_error(e: anyhow::Error, pid: u32) -> anyhow::Error {
    let denied = e
        .chain()
        .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied));
    // SAFETY: geteuid cannot fail.
    if denied && unsafe { libc::geteuid() } != 0 {
        e.context(format!("inspecting process {pid} needs root (or CAP_SYS_PTRACE)"))
    } else if denied {
        e.context(format!("the kernel refused pytrace access to process {pid}"))
    } else {
        e
    }
}

/// From the Py_Version symbol (3.11+), else the PY_VERSION string in the
/// file's data, else the file name (libpython3.9.so, python3.9).
fn detect_version(elf: &ElfFile, target_path: &str) -> Result<Version> {
    if let Some(addr) = elf.symbol("Py_Version") {
        if let Ok(bytes) = elf.read_static(addr, 4) {
            let hex = u32::from_le_bytes(bytes.try_into().unwrap());
            return Ok(Version { major: hex >> 24, minor: (hex >> 16) & 0xff, micro: Some((hex >> 8) & 0xff) });
        }
    }
    let name = Path::new(target_path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let digits = name.trim_start_matches("lib").strip_prefix("python").unwrap_or("");
    let mut parts = digits.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("could not tell the Python version of {target_path}");
    };
    let major: u32 = major.parse()?;
    let minor: u32 = minor.parse()?;
    let micro = find_version_string(elf, major, minor);
    Ok(Version { major, minor, micro })
}

/// PY_VERSION ("3.9.18") as a string of its own, or as the tail of a longer
/// one: the linker may store it only inside another string that ends with
/// it (pyenv's 3.10 keeps "3.10.13" as the end of its install path and of
/// "Python-3.10.13"). Every string ending in "X.Y.<digits>" (not after a
/// digit or a dot) must agree on the patch level.
fn find_version_string(elf: &ElfFile, major: u32, minor: u32) -> Option<u32> {
    let needle = format!("{major}.{minor}.");
    let mut found = None;
    // Only the data the file declares it loads: the string is in .rodata.
    for bytes in elf.data_segments() {
        let mut at = 0;
        while let Some(i) = find(&bytes[at..], needle.as_bytes()) {
            let begin = at + i;
            let start = begin + needle.len();
            at = start;
            if begin > 0 && (bytes[begin - 1].is_ascii_digit() || bytes[begin - 1] == b'.') {
                continue;
            }
            let digits: Vec<u8> = bytes[start..].iter().take(4).take_while(|b| b.is_ascii_digit()).copied().collect();
            if digits.is_empty() || digits.len() > 3 || bytes.get(start + digits.len()) != Some(&0) {
                continue;
            }
            let micro: u32 = std::str::from_utf8(&digits).ok()?.parse().ok()?;
            match found {
                None => found = Some(micro),
                Some(other) if other == micro => {}
                Some(_) => return None,
            }
        }
    }
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}
