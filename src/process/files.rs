//! Opening the files a target runs, as the target itself sees them.
//!
//! pytrace runs as root and its targets are not trusted: a container can
//! plant absolute symlinks, FIFOs or device files at the paths its maps name,
//! and a package upgrade replaces a running service's libraries on disk. So
//! no file is ever found by walking a path the target controls:
//! - a mapped file is opened through `/proc/PID/map_files/START-END`, the
//!   kernel's reference to the very file mapped there (even when deleted);
//!   where that is not allowed (it needs CAP_SYS_ADMIN), its path is resolved
//!   inside the target's root with `openat2(RESOLVE_IN_ROOT)`, so symlinks
//!   cannot lead out of it;
//! - either way the opened file's (device, inode) must be the mapping's;
//! - everything is first opened with O_PATH, which opens nothing (no FIFO
//!   blocks, no device wakes up), and read only if fstat says it is a
//!   regular file, and only up to MAX_FILE_BYTES;
//! - an ELF file is read only in the ranges it declares and pytrace uses,
//!   and there only where it holds data (read_ranges), so appended data,
//!   debug sections or a sparse hole, however large, cost no memory.
//!
//! libbpf gets `/proc/self/fd/N` of the checked file to attach uprobes to,
//! which the kernel follows to that same inode.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::proc::Mapping;

/// The largest file pytrace opens. Only what an ELF file declares and
/// pytrace uses is read of it (see MAX_READ_BYTES); the rest costs address
/// space only, in anonymous memory never touched (CheckedFile::read_ranges).
pub const MAX_FILE_BYTES: u64 = 4 << 30;

/// The most pytrace reads of one file. What it reads of an interpreter or
/// library (its loaded segments, symbol tables and notes) adds up to 3.2
/// to 7.4 MiB (pyenv's libpython3.6 to 3.12, whose files are 9 to 29 MiB
/// with their debug data; Debian's python3.11: 6.5 MiB): 64 MiB leaves
/// room for builds 8 times bigger, and a file declaring more is refused
/// with that said, never read.
pub const MAX_READ_BYTES: u64 = 64 << 20;

/// A file's identity: the same (device, inode) is the same file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub fn of(m: &Mapping) -> Self {
        FileId { dev: m.dev, ino: m.inode }
    }
}

/// A regular file, opened without following any path the target controls
/// and checked to be the one it should be.
#[derive(Debug)]
pub struct CheckedFile {
    file: File,
    pub id: FileId,
    pub size: u64,
    pub mtime: i64,
    /// What the target calls it, for messages.
    pub name: String,
    /// The most pytrace reads of it.
    max: u64,
}

impl CheckedFile {
    /// Checks a file opened with O_PATH (a regular file of at most
    /// MAX_FILE_BYTES, and `want` if given), then opens it for reading.
    fn new(path_fd: File, name: &str, want: Option<FileId>) -> Result<Self> {
        Self::new_capped(path_fd, name, want, MAX_FILE_BYTES, "of one file")
    }

    /// As `new`, with a cap of `max` bytes, said as "the N MiB pytrace
    /// reads {of_what}".
    fn new_capped(path_fd: File, name: &str, want: Option<FileId>, max: u64, of_what: &str) -> Result<Self> {
        let meta = path_fd.metadata().with_context(|| format!("failed to stat {name}"))?;
        let mut id = FileId { dev: meta.dev(), ino: meta.ino() };
        if let Some(want) = want.filter(|&want| want != id && overlay_alias(&path_fd, want, id)) {
            // Known from here on as the maps name it.
            id = want;
        }
        if want.is_some_and(|want| want != id) {
            bail!("{name} is not the file the process mapped (it was replaced on disk since): pytrace reads only the mapped file");
        }
        if !meta.file_type().is_file() {
            bail!("{name} is not a regular file: pytrace reads only regular files");
        }
        if meta.len() > max {
            bail!("{name} is {} MiB, more than the {} MiB pytrace reads {of_what}", meta.len() >> 20, max >> 20);
        }
        // The same inode, now open for reading (magic links are ours here).
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", path_fd.as_raw_fd()));
        let file = open_raw(&fd_path, 0).with_context(|| format!("failed to open {name} for reading"))?;
        Ok(CheckedFile { file, id, size: meta.len(), mtime: meta.mtime(), name: name.to_string(), max })
    }

    /// The whole file, at most the cap it was checked against (a file that
    /// grew past it is refused rather than read on).
    pub fn read_all(&self) -> Result<Vec<u8>> {
        let mut bytes = Vec::with_capacity(self.size.min(self.max) as usize);
        let mut reader = (&self.file).take(self.max + 1);
        std::io::Seek::rewind(&mut &self.file).with_context(|| format!("failed to read {}", self.name))?;
        reader.read_to_end(&mut bytes).with_context(|| format!("failed to read {}", self.name))?;
        if bytes.len() as u64 > self.max {
            bail!("{} grew past {} MiB while pytrace read it", self.name, self.max >> 20);
        }
        Ok(bytes)
    }

    /// Bytes `len` at `offset`, read now (an ELF file's header and header
    /// tables, before anything says which ranges to read); Err if the file
    /// ends before them.
    pub fn read_at(&self, offset: u64, len: usize, what: &str) -> Result<Vec<u8>> {
        let mut bytes = vec![0; len];
        std::os::unix::fs::FileExt::read_exact_at(&self.file, &mut bytes, offset)
            .with_context(|| format!("{}'s {what} ({len} bytes at offset {offset}) runs past its end ({} bytes)", self.name, self.size))?;
        Ok(bytes)
    }

    /// The file's bytes at their own offsets, read only within `ranges`
    /// (what an ELF file declares and pytrace uses, see elf_image.rs) and
    /// there only where the file holds data (SEEK_DATA/SEEK_HOLE): in
    /// anonymous memory, whose pages cost nothing until written, so the
    /// rest (debug sections, data appended to a binary, a sparse hole)
    /// costs nothing either. Each range must lie inside the file, and all
    /// together hold at most MAX_READ_BYTES. Bytes past a file that shrank
    /// meanwhile read as zeros.
    pub fn read_ranges(&self, ranges: &[(String, std::ops::Range<u64>)]) -> Result<FileImage> {
        for (what, r) in ranges {
            if r.start > r.end || r.end > self.size {
                bail!("{}'s {what} (bytes {}..{}) runs past its end ({} bytes)", self.name, r.start, r.end, self.size);
            }
        }
        // Ranges overlap (a section inside its segment): count each byte once.
        let mut merged: Vec<std::ops::Range<u64>> = ranges.iter().map(|(_, r)| r.clone()).filter(|r| !r.is_empty()).collect();
        merged.sort_by_key(|r| r.start);
        let mut union: Vec<std::ops::Range<u64>> = Vec::new();
        for r in merged {
            match union.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => union.push(r),
            }
        }
        let distinct: u64 = union.iter().map(|r| r.end - r.start).sum();
        if distinct > MAX_READ_BYTES {
            bail!("{} declares {} MiB of sections pytrace reads, more than the {} MiB it reads of one file", self.name, distinct >> 20, MAX_READ_BYTES >> 20);
        }
        let len = self.size as usize;
        let mut map = memmap2::MmapOptions::new().len(len.max(1)).no_reserve_swap().map_anon().with_context(|| format!("failed to make room for {}", self.name))?;
        let fd = self.file.as_raw_fd();
        for range in union {
            let mut at = range.start;
            while at < range.end {
                // SAFETY: lseek(2) on an fd we own.
                let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
                if data < 0 {
                    let e = std::io::Error::last_os_error();
                    // ENXIO: no data past `at`, the rest is a hole (or the file shrank).
                    if e.raw_os_error() == Some(libc::ENXIO) {
                        break;
                    }
                    return Err(e).with_context(|| format!("failed to read {}", self.name));
                }
                if data as u64 >= range.end {
                    break;
                }
                // SAFETY: as above.
                let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
                let end = if hole < 0 { range.end } else { (hole as u64).min(range.end) };
                let mut pos = data as u64;
                while pos < end {
                    let n = std::os::unix::fs::FileExt::read_at(&self.file, &mut map[pos as usize..end as usize], pos).with_context(|| format!("failed to read {}", self.name))?;
                    if n == 0 {
                        break;
                    }
                    pos += n as u64;
                }
                at = end.max(data as u64 + 1);
            }
        }
        Ok(FileImage { map, len })
    }

    /// A path the kernel resolves to this very file for as long as it is
    /// open here: what libbpf and blazesym are given to open or attach to.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// A file's bytes where they were read, zeros elsewhere (see
/// CheckedFile::read_ranges).
pub struct FileImage {
    map: memmap2::MmapMut,
    len: usize,
}

impl std::ops::Deref for FileImage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

/// Whether `opened` is the overlayfs face of the file a mapping names as
/// `mapped`. Before Linux 6.8, /proc/PID/maps gives a file on an overlay
/// (a container's root, say) by its real layer's device and inode, while
/// the path (map_files' link too) leads to the overlay, which reports its
/// own device with the layer's inode (measured on Debian's 6.1 and 6.12
/// with an overlay on 9p).
fn overlay_alias(opened: &File, mapped: FileId, opened_id: FileId) -> bool {
    const OVERLAYFS_SUPER_MAGIC: libc::c_long = 0x794c_7630;
    // SAFETY: fstatfs on an fd we own, into a zeroed struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let on_overlay = unsafe { libc::fstatfs(opened.as_raw_fd(), &mut fs) } == 0 && fs.f_type as libc::c_long == OVERLAYFS_SUPER_MAGIC;
    on_overlay && opened_id.ino == mapped.ino
}

/// Flags for every open: never block (a FIFO), never become our terminal.
/// (With O_PATH only O_CLOEXEC matters; the rest are for the reopen.)
const OPEN_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

fn open_raw(path: &Path, extra: libc::c_int) -> std::io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let flags = if extra & libc::O_PATH != 0 { libc::O_CLOEXEC | extra } else { OPEN_FLAGS | extra };
    // SAFETY: open(2) on a NUL-terminated path; the fd becomes the File's.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The file mapped at `m` in process `pid`, checked to be that mapping's.
pub fn open_mapping(pid: u32, m: &Mapping) -> Result<CheckedFile> {
    let name = format!("{}{} (mapped in process {pid})", m.path, if m.deleted { " (deleted)" } else { "" });
    let through = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let file = match open_raw(&through, libc::O_PATH) {
        Ok(file) => file,
        // Opening map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE):
        // find the path inside a root instead, and check it is the mapping's.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) => {
            if m.deleted {
                bail!("{name} was replaced or deleted on disk, and without CAP_SYS_ADMIN pytrace cannot open the mapped file through the process");
            }
            // The name is inside the target's root for a container; for a
            // chroot the kernel already gave it from ours.
            let mut refused = None;
            for root_of in [pid, std::process::id()] {
                match open_in_root_raw(root_of, &m.path).map_err(anyhow::Error::from).and_then(|f| CheckedFile::new(f, &name, Some(FileId::of(m)))) {
                    Ok(checked) => return Ok(checked),
                    Err(e) => refused = Some(e),
                }
            }
            return Err(refused.unwrap()).with_context(|| format!("failed to open {name} inside the process's root"));
        }
        Err(e) => return Err(e).with_context(|| format!("failed to open {name} through {}", through.display())),
    };
    CheckedFile::new(file, &name, Some(FileId::of(m)))
}

/// The executable process `pid` runs: its mapping, opened through the
/// target; else the kernel's own link to it.
pub fn open_executable(pid: u32, maps: &[Mapping]) -> Result<CheckedFile> {
    let (path, deleted) = super::proc::exe_path(pid)?;
    if let Some(m) = maps.iter().find(|m| m.path == path && m.deleted == deleted && m.offset == 0) {
        return open_mapping(pid, m);
    }
    let file = open_raw(Path::new(&format!("/proc/{pid}/exe")), libc::O_PATH).with_context(|| format!("failed to open /proc/{pid}/exe"))?;
    CheckedFile::new(file, &format!("{path} (the executable of process {pid})"), None)
}

/// `path` as the target would find it, resolved inside its root (its
/// container, chroot, or ours): symlinks, absolute or not, and `..` cannot
/// lead out of it, and no /proc magic link is followed.
pub fn open_in_root(pid: u32, path: &str) -> Result<CheckedFile> {
    let file = open_in_root_raw(pid, path).with_context(|| format!("failed to open {path} inside the root of process {pid}"))?;
    CheckedFile::new(file, path, None)
}

fn open_in_root_raw(pid: u32, path: &str) -> std::io::Result<File> {
    let root = open_raw(Path::new(&format!("/proc/{pid}/root")), libc::O_PATH | libc::O_DIRECTORY)?;
    // openat2 refuses any flag O_PATH ignores.
    openat2(root.as_raw_fd(), Path::new(path), libc::O_PATH | libc::O_CLOEXEC, libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS)
}

/// openat2(2): `path` opened from `dir` (AT_FDCWD for the working
/// directory) with `resolve`'s restrictions on how it is walked. Retries
/// the EAGAIN RESOLVE_IN_ROOT gives when a rename raced the walk.
pub fn openat2(dir: std::os::fd::RawFd, path: &Path, flags: libc::c_int, resolve: u64) -> std::io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    /// struct open_how of openat2(2).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow { flags: flags as u64, mode: 0, resolve };
    for _ in 0..16 {
        // SAFETY: openat2(2) with a dirfd, a NUL-terminated path and an open_how of the size we pass.
        let fd = unsafe { libc::syscall(libc::SYS_openat2, dir, c.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>()) };
        if fd >= 0 {
            // SAFETY: a fresh fd we own.
            return Ok(unsafe { File::from_raw_fd(fd as libc::c_int) });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Whether `path` exists inside process `pid`'s root (resolved as
/// open_in_root does); for library search.
pub fn exists_in_root(pid: u32, path: &str) -> bool {
    open_in_root_raw(pid, path).is_ok()
}

/// The names in a directory inside process `pid`'s root (resolved as
/// open_in_root does), at most `max` of them.
pub fn list_dir_in_root(pid: u32, path: &str, max: usize) -> Vec<String> {
    let Ok(dir) = open_in_root_raw(pid, path) else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else { return Vec::new() };
    entries.flatten().take(max).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
}

/// A file named by the user on pytrace's own command line: still opened
/// non-blocking and checked to be a regular file of bounded size.
pub fn open_local(path: &Path) -> Result<CheckedFile> {
    let file = open_raw(path, libc::O_PATH).with_context(|| format!("failed to open {}", path.display()))?;
    CheckedFile::new(file, &path.display().to_string(), None)
}

/// A report pytrace reads back (`compare --traced/--sampled`): a regular
/// file (never a FIFO or device, which could block or never end) of at
/// most `max` bytes, read whole.
pub fn read_local_report(path: &Path, max: u64) -> Result<Vec<u8>> {
    let file = open_raw(path, libc::O_PATH).with_context(|| format!("cannot read {}", path.display()))?;
    CheckedFile::new_capped(file, &path.display().to_string(), None, max, "of a report")?.read_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read() {
        let err = open_local(Path::new("/dev/zero")).unwrap_err();
        assert!(format!("{err:#}").contains("is not a regular file"), "{err:#}");
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO with no writer would block without O_NONBLOCK.
        let err = open_local(&fifo).unwrap_err();
        assert!(format!("{err:#}").contains("is not a regular file"), "{err:#}");
    }

    #[test]
    fn a_mapped_file_is_read_through_the_process() {
        let me = std::process::id();
        let maps = super::super::proc::file_mappings(me).unwrap();
        let exe = open_executable(me, &maps).unwrap();
        let bytes = exe.read_all().unwrap();
        assert_eq!(bytes.len() as u64, exe.size);
        assert_eq!(&bytes[..4], b"\x7fELF");
        // As much as one image may hold: this test binary, with its debug
        // information, can be larger (67 MB once the agent's TLS came).
        let held = exe.size.min(MAX_READ_BYTES);
        let image = exe.read_ranges(&[("test".into(), 0..held)]).unwrap();
        assert_eq!(&image[..held as usize], &bytes[..held as usize], "the image holds the same bytes");
        let past = exe.read_ranges(&[("section .x".into(), 16..exe.size + 1)]).err().unwrap();
        assert!(format!("{past:#}").contains("section .x (bytes 16.."), "{past:#}");
        let local = std::fs::metadata(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(exe.id, FileId { dev: local.dev(), ino: local.ino() });
        // The fd path reaches the same inode.
        let via_fd = std::fs::metadata(exe.fd_path()).unwrap();
        assert_eq!((via_fd.dev(), via_fd.ino()), (exe.id.dev, exe.id.ino));
        // A mapping whose identity does not match what is opened is refused.
        let mut wrong = maps.iter().find(|m| m.offset == 0).unwrap().clone();
        wrong.inode ^= 1;
        assert!(format!("{:#}", open_mapping(me, &wrong).unwrap_err()).contains("is not the file the process mapped"));
    }

    #[test]
    fn a_sparse_hole_is_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let mut f = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut f, b"head").unwrap();
        f.set_len(256 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, b"tail", (256 << 20) - 4).unwrap();
        drop(f);
        let rss = || std::fs::read_to_string("/proc/self/statm").unwrap().split(' ').nth(1).unwrap().parse::<u64>().unwrap() * 4096;
        let before = rss();
        let file = open_local(&path).unwrap();
        // 60 MiB of the hole asked for, under the MAX_READ_BYTES cap.
        let ranges = [("head".into(), 0..4), ("hole".into(), 100 << 20..160 << 20), ("tail".into(), file.size - 4..file.size)];
        let image = file.read_ranges(&ranges).unwrap();
        assert_eq!((&image[..4], &image[image.len() - 4..], image[100 << 20]), (&b"head"[..], &b"tail"[..], 0));
        let grew = rss().saturating_sub(before);
        assert!(grew < 16 << 20, "a 256 MiB file with 8 bytes of data cost {} MiB", grew >> 20);
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        // Our own root is "/": an absolute symlink resolves under it, and
        // ".." cannot climb above it.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/../../../proc/self/exe", dir.path().join("link")).unwrap();
        let via_link = open_in_root(std::process::id(), dir.path().join("link").to_str().unwrap());
        assert!(via_link.is_err(), "a /proc magic link must not be followed");
        assert!(exists_in_root(std::process::id(), "/etc/../etc/passwd"));
    }
}
