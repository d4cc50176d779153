//! Finding the CPython interpreter in a process or a binary: which ELF file
//! holds it (the executable, or a shared libpython), its version, where it is
//! loaded, its USDT probes, and the layout of its structures.

pub mod code;
pub mod eval_hook;
pub mod inlined_init;
pub mod layouts;
pub mod strings;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::rc::Rc;

use anyhow::{bail, Context, Result};

use crate::target::elf::{find_library, ElfFile};
use crate::target::proc;
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
    /// 3.13's inlined-__init__ probe, found once (inlined_init.rs scans the
    /// file for it) however many places ask.
    inlined_init: std::cell::OnceCell<Option<inlined_init::InitProbe>>,
}

impl Python {
    /// The interpreter inside a running process.
    pub fn from_pid(pid: u32) -> Result<Self> {
        if !proc::exists(pid) {
            bail!("no process with PID {pid}");
        }
        if !proc::is_running(pid) {
            bail!("process {pid} has exited");
        }
        let exe = proc::exe_path(pid).map_err(|e| permission_hint(e, pid))?;
        let maps = proc::file_mappings(pid).map_err(|e| permission_hint(e, pid))?;
        let mut candidates = vec![exe];
        for m in &maps {
            let name = Path::new(&m.path).file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            if name.starts_with("libpython") && !candidates.contains(&m.path) {
                candidates.push(m.path.clone());
            }
        }
        for path in candidates {
            let inode = maps.iter().find(|m| m.path == path).map(|m| m.inode).unwrap_or(0);
            let Some(elf) = interpreter_file(&proc::host_path(pid, &path, inode)) else { continue };
            let first_page = maps
                .iter()
                .find(|m| m.path == path && m.offset == 0)
                .with_context(|| format!("{path} is not mapped at offset 0 in process {pid}"))?
                .start;
            let load_bias = Some(elf.load_bias(first_page)?);
            return Self::new(elf, path, load_bias);
        }
        bail!(
            "process {pid} ({}) is not a CPython process: neither its executable nor its libraries contain the CPython interpreter",
            proc::command_name(pid)
        )
    }

    /// The interpreter a Python executable will run, before it runs: the
    /// executable itself or the libpython it links. `root` is prefixed to
    /// library search paths ("" for our own file system). Ok(None): not Python.
    pub fn from_executable(path: &Path, root: &str) -> Result<Option<Self>> {
        let exe = ElfFile::open(path)?;
        let target_path = path.to_string_lossy().into_owned();
        if is_interpreter(&exe) {
            return Self::new(Rc::new(exe), target_path, None).map(Some);
        }
        let Some(lib) = exe.needed.iter().find(|n| n.starts_with("libpython")) else {
            return Ok(None);
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let lib_path = find_library(&exe, dir, lib, root)
            .with_context(|| format!("{} needs {lib}, which pytrace could not find", path.display()))?;
        let elf = ElfFile::open(&lib_path)?;
        if !is_interpreter(&elf) {
            bail!("{} does not contain the CPython interpreter", lib_path.display());
        }
        let target_path = lib_path.to_string_lossy()[root.len()..].to_string();
        Self::new(Rc::new(elf), target_path, None).map(Some)
    }

    fn new(elf: Rc<ElfFile>, target_path: String, load_bias: Option<u64>) -> Result<Self> {
        let version = detect_version(&elf, &target_path)?;
        let free_threaded = is_free_threaded(&elf, version);
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
        let layout = read_layout(&elf, table).with_context(|| format!("reading the layout of Python {version} in {target_path}"))?;
        Ok(Self { elf, target_path, version, layout, load_bias, inlined_init: std::cell::OnceCell::new() })
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

    /// Run-time minus link-time addresses in `pid` now: known once the file
    /// is mapped, which a command pytrace started does only after it is let go.
    pub fn current_load_bias(&self, pid: u32) -> Result<u64> {
        if let Some(bias) = self.load_bias {
            return Ok(bias);
        }
        let first_page = proc::file_mappings(pid)?
            .into_iter()
            .find(|m| m.path == self.target_path && m.offset == 0)
            .with_context(|| format!("{} is not mapped in process {pid}", self.target_path))?
            .start;
        self.elf.load_bias(first_page)
    }

    pub fn code_type_address(&self) -> Option<u64> {
        self.runtime_address(CODE_TYPE_SYMBOL).ok()
    }

    pub fn is_shared_library(&self) -> bool {
        self.elf.is_shared_object && self.elf.symbol("main").is_none()
    }

    /// CPython 3.11 and later inline Python-to-Python calls inside one
    /// _PyEval_EvalFrameDefault, unless interp->eval_frame is set.
    pub fn inlines_calls(&self) -> bool {
        (self.version.major, self.version.minor) >= (3, 11)
    }

    pub fn function_probes(&self) -> FunctionProbes {
        let has = |name| self.elf.has_usdt("python", name);
        if !has("function__entry") || !has("function__return") {
            FunctionProbes::Missing
        } else if (self.version.major, self.version.minor) == (3, 11) {
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
/// offsets start from depends on it.
fn is_free_threaded(elf: &ElfFile, version: Version) -> bool {
    (version.major, version.minor) >= (3, 13)
        && elf
            .symbol(RUNTIME_SYMBOL)
            .and_then(|runtime| elf.read_static(runtime, 24).ok())
            .and_then(layouts::free_threaded_build)
            .unwrap_or(false)
}

/// The version's table, with what the binary itself says: its
/// `_Py_DebugOffsets` (3.13+), read from the file rather than from the
/// process, since it is a static initialiser (the same bytes) and the file is
/// there before a launched target runs; and where
/// `_PyInterpreterState_GetEvalFrameFunc` reads `interp->eval_frame`, the one
/// field pytrace writes, which `_Py_DebugOffsets` does not list.
fn read_layout(elf: &ElfFile, table: &Layout) -> Result<Layout> {
    let mut layout = match table.debug_offsets {
        Some(d) => {
            let runtime = elf.symbol(RUNTIME_SYMBOL).context("no _PyRuntime symbol")?;
            let bytes = elf.read_static(runtime, d.span()).context("reading _Py_DebugOffsets")?;
            table.resolve(bytes).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => table.clone(),
    };
    if let Some(offset) = elf
        .symbol(GET_EVAL_FRAME_SYMBOL)
        .and_then(|addr| elf.read_static(addr, 16).ok())
        .and_then(eval_frame_load_offset)
    {
        layout.interp_eval_frame = offset;
    }
    Ok(layout)
}

const GET_EVAL_FRAME_SYMBOL: &str = "_PyInterpreterState_GetEvalFrameFunc";

/// The displacement of the first instruction of
/// `_PyInterpreterState_GetEvalFrameFunc(interp)` when it is a load from
/// `interp` (`mov reg, [rdi + disp]`, after an optional endbr64): that
/// function only reads `interp->eval_frame`. None for any other code; the
/// table's offset stands then.
pub fn eval_frame_load_offset(code: &[u8]) -> Option<u32> {
    let code = code.strip_prefix(&crate::target::elf::ENDBR64[..]).unwrap_or(code);
    let [rex, 0x8b, modrm, rest @ ..] = code else { return None };
    // REX.W, no REX.B (the base is rdi, not r15); the destination may be any register.
    if rex & 0xf9 != 0x48 || modrm & 0x07 != 0x07 {
        return None;
    }
    match modrm >> 6 {
        0b01 => rest.first().map(|&d| d as i8).filter(|&d| d >= 0).map(|d| d as u32),
        0b10 => rest.get(..4).map(|d| i32::from_le_bytes(d.try_into().unwrap())).filter(|&d| d >= 0).map(|d| d as u32),
        _ => None,
    }
}

/// A file's identity: device, inode, size and modification time.
type FileId = (u64, u64, u64, i64);

thread_local! {
    /// Files already looked at, by identity: `sample --all` looks at every
    /// process each rescan, and 20 processes of one Python read and parsed
    /// its executable 20 times (2 s and 440 MB on this VM) before this.
    static LOOKED_AT: RefCell<HashMap<FileId, Option<Rc<ElfFile>>>> = RefCell::new(HashMap::new());
}

/// The parsed file at `path` if it holds the CPython interpreter; each file
/// is read once per pytrace run, whatever the answer.
fn interpreter_file(path: &Path) -> Option<Rc<ElfFile>> {
    let meta = std::fs::metadata(path).ok()?;
    let id = (meta.dev(), meta.ino(), meta.size(), meta.mtime());
    if let Some(known) = LOOKED_AT.with(|seen| seen.borrow().get(&id).cloned()) {
        return known;
    }
    let elf = ElfFile::open(path).ok().filter(is_interpreter).map(Rc::new);
    LOOKED_AT.with(|seen| seen.borrow_mut().insert(id, elf.clone()));
    elf
}

fn is_interpreter(elf: &ElfFile) -> bool {
    elf.symbol(EVAL_FRAME_SYMBOL).is_some() && elf.symbol(RUNTIME_SYMBOL).is_some()
}

fn permission_hint(e: anyhow::Error, pid: u32) -> anyhow::Error {
    let denied = e
        .chain()
        .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied));
    if denied {
        e.context(format!("inspecting process {pid} needs root (or CAP_SYS_PTRACE)"))
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

/// PY_VERSION ("3.9.18") is stored as its own NUL-terminated string.
fn find_version_string(elf: &ElfFile, major: u32, minor: u32) -> Option<u32> {
    let bytes = elf.bytes();
    let needle = format!("\0{major}.{minor}.");
    let mut at = 0;
    while let Some(i) = find(&bytes[at..], needle.as_bytes()) {
        let start = at + i + needle.len();
        let digits: Vec<u8> = bytes[start..].iter().take(3).take_while(|b| b.is_ascii_digit()).copied().collect();
        let end = start + digits.len();
        if !digits.is_empty() && bytes.get(end) == Some(&0) {
            return std::str::from_utf8(&digits).ok()?.parse().ok();
        }
        at = start;
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::eval_frame_load_offset;

    #[test]
    fn eval_frame_offset_from_machine_code() {
        // Debian's 3.14: endbr64; mov 0x2148(%rdi),%rax; mov $..,%edx
        let sid_314 = [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x87, 0x48, 0x21, 0, 0, 0xba, 0x80, 0x8b, 0x59, 0];
        assert_eq!(eval_frame_load_offset(&sid_314), Some(0x2148));
        // No endbr64, an 8-bit displacement, rdx as destination.
        assert_eq!(eval_frame_load_offset(&[0x48, 0x8b, 0x57, 0x70, 0xc3]), Some(0x70));
        // Not a load from rdi (rsi base), not a load at all, too short.
        assert_eq!(eval_frame_load_offset(&[0x48, 0x8b, 0x86, 0x48, 0x21, 0, 0]), None);
        assert_eq!(eval_frame_load_offset(&[0x55, 0x48, 0x89, 0xe5]), None);
        assert_eq!(eval_frame_load_offset(&[0x48, 0x8b, 0x87, 0x48]), None);
        // A REX.B load (base r15) is not interp.
        assert_eq!(eval_frame_load_offset(&[0x49, 0x8b, 0x87, 0x48, 0x21, 0, 0]), None);
    }
}
