//! Where a report goes: standard output, a file replaced whole, or a pipe,
//! /dev/null or a terminal written in place.
//!
//! pytrace runs as root, and a path may lead into a container whose files
//! it does not trust, so a file is made like this:
//! - the directory is opened first, and the file is then created in it by
//!   name (openat, renameat on that directory's fd), so nothing swapped on
//!   the path afterwards can redirect it;
//! - on the host, that directory is reached without following any symbolic
//!   link (openat2 RESOLVE_NO_SYMLINKS): a link on the path is refused, not
//!   followed, since a link under /tmp or in a shared directory can lead
//!   anywhere;
//! - a path under `/proc/PID/root/` is resolved inside that root
//!   (RESOLVE_IN_ROOT, no /proc magic links), so links a container plants
//!   stay in the container;
//! - the report goes to a new file beside the name (O_EXCL, O_NOFOLLOW),
//!   renamed over it only once complete: an earlier report survives a
//!   failed run, and a symlink at the name is refused, never written
//!   through; the new file is made before tracing starts, so an unwritable
//!   directory fails at once.
//!
//! A FIFO (`>(jq .)` is /dev/fd/N, a pipe), /dev/null or a terminal is
//! written in place instead, even through links (as /dev/stdout is one):
//! nothing is created or replaced there, and no regular file is ever
//! written without the steps above.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::process::files::openat2;

/// "-" is standard output; anything else is a file.
pub enum Output {
    Stdout,
    /// A regular file: `temp`, made in `dir`, is renamed over `name` once
    /// written.
    File { shown: PathBuf, dir: File, name: CString, temp: Option<CString>, file: Option<File> },
    /// A FIFO, /dev/null or a terminal, written in place.
    InPlace { shown: PathBuf, file: Option<File> },
}

impl Output {
    pub fn create(path: &Path) -> Result<Self> {
        if path == Path::new("-") {
            return Ok(Output::Stdout);
        }
        let shown = path.display();
        let start = Start::of(path).with_context(|| format!("cannot write {shown}"))?;
        if let Some(out) = start.open_in_place(path)? {
            return Ok(out);
        }
        let mut parts: Vec<Component> = start.rest.components().collect();
        let name = match parts.pop() {
            Some(Component::Normal(name)) => name,
            _ => bail!("cannot write {shown}: it names no file"),
        };
        let parent: PathBuf = if parts.is_empty() { PathBuf::from(".") } else { parts.iter().collect() };
        let dir = openat2(start.fd(), &parent, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, start.resolve).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if start.root.is_none() => anyhow::anyhow!(
                "cannot write {shown}: a directory on its path is a symbolic link, and pytrace creates reports only in directories reached without links (give the real path)"
            ),
            Some(libc::ELOOP) => anyhow::anyhow!("cannot write {shown}: a link in that root leads to a /proc magic link, which pytrace does not follow out of a container"),
            Some(libc::EXDEV) => anyhow::anyhow!("cannot write {shown}: its path leads out of the process's root"),
            _ => anyhow::Error::new(e).context(format!("cannot write {shown}")),
        })?;
        let name = CString::new(name.as_bytes()).with_context(|| format!("cannot write {shown}: it names no file"))?;
        if let Some(meta) = stat_at(&dir, &name)? {
            if meta.st_mode & libc::S_IFMT == libc::S_IFLNK {
                bail!("cannot write {shown}: it is a symbolic link, and pytrace does not write through links (give the real path, or - for standard output)");
            }
            if meta.st_mode & libc::S_IFMT != libc::S_IFREG {
                bail!("cannot write {shown}: it is not a regular file, a FIFO or a terminal (use - for standard output)");
            }
        }
        for attempt in 0..100 {
            let temp = CString::new([b".", name.as_bytes(), format!(".pytrace-{}-{attempt}", std::process::id()).as_bytes()].concat()).unwrap();
            // O_CREAT|O_EXCL|O_NOFOLLOW: a new file, never an existing one or a link.
            // SAFETY: openat(2) on a directory fd we hold and a NUL-terminated name.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), temp.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o644) };
            if fd >= 0 {
                // SAFETY: a fresh fd we own.
                let file = unsafe { File::from_raw_fd(fd) };
                return Ok(Output::File { shown: path.to_path_buf(), dir, name, temp: Some(temp), file: Some(file) });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e).with_context(|| format!("cannot write {shown}"));
            }
        }
        bail!("cannot write {shown}: could not create a new file beside it")
    }

    /// Writes the whole report; a file is then renamed into place.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            // A file format (JSON, folded stacks), exact: not a terminal table.
            #[allow(clippy::disallowed_methods)]
            Output::Stdout => io::stdout().write_all(bytes).context("failed to write to standard output"),
            Output::InPlace { shown, file } => {
                let mut f = file.take().with_context(|| format!("{} was already written", shown.display()))?;
                f.write_all(bytes).and_then(|()| f.flush()).with_context(|| format!("failed to write {}", shown.display()))
            }
            Output::File { shown, dir, name, temp, file } => {
                let mut f = file.take().with_context(|| format!("{} was already written", shown.display()))?;
                f.write_all(bytes).and_then(|()| f.flush()).with_context(|| format!("failed to write {}", shown.display()))?;
                drop(f);
                let from = temp.as_ref().with_context(|| format!("{} was already written", shown.display()))?;
                // SAFETY: renameat(2) within one directory fd we hold, NUL-terminated names.
                if unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), name.as_ptr()) } != 0 {
                    return Err(io::Error::last_os_error()).with_context(|| format!("failed to put the report in place at {}", shown.display()));
                }
                *temp = None;
                Ok(())
            }
        }
    }

    /// What makes two outputs one file: its directory's (device, inode)
    /// and its name there; a FIFO or device written in place by its own.
    fn identity(&self) -> Option<(u64, u64, Vec<u8>)> {
        match self {
            Output::Stdout => None,
            Output::InPlace { .. } => None,
            Output::File { dir, name, .. } => {
                let meta = dir.metadata().ok()?;
                Some((meta.dev(), meta.ino(), name.as_bytes().to_vec()))
            }
        }
    }

    /// The (device, inode) of the file now at this output's name, if any.
    fn existing_file(&self) -> Option<(u64, u64)> {
        match self {
            Output::File { dir, name, .. } => stat_at(dir, name).ok().flatten().map(|m| (m.st_dev, m.st_ino)),
            _ => None,
        }
    }

    fn shown(&self) -> String {
        match self {
            Output::Stdout => "-".into(),
            Output::File { shown, .. } | Output::InPlace { shown, .. } => shown.display().to_string(),
        }
    }
}

impl Drop for Output {
    /// A report never written leaves nothing behind, and the path as it was.
    fn drop(&mut self) {
        if let Output::File { dir, temp: Some(temp), .. } = self {
            // SAFETY: unlinkat(2) of the temporary name in the directory fd we hold.
            unsafe { libc::unlinkat(dir.as_raw_fd(), temp.as_ptr(), 0) };
        }
    }
}

/// Where a path is resolved from: the working directory (or "/") of the
/// host, walked without links, or a process's root, walked inside it.
struct Start {
    root: Option<File>,
    rest: PathBuf,
    resolve: u64,
}

impl Start {
    /// `/proc/PID/root/REST` is REST inside that root; any other path is
    /// the host's.
    fn of(path: &Path) -> io::Result<Self> {
        let mut parts = path.components();
        let is_pid = |s: &OsStr| s == "self" || !s.is_empty() && s.as_bytes().iter().all(u8::is_ascii_digit);
        if let (Some(Component::RootDir), Some(Component::Normal(proc_)), Some(Component::Normal(pid)), Some(Component::Normal(root))) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            if proc_ == "proc" && is_pid(pid) && root == "root" {
                let root_path = CString::new(format!("/proc/{}/root", pid.to_string_lossy())).unwrap();
                // SAFETY: open(2) on a NUL-terminated path; the fd becomes the File's.
                let fd = unsafe { libc::open(root_path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: a fresh fd we own.
                let root = unsafe { File::from_raw_fd(fd) };
                return Ok(Start { root: Some(root), rest: parts.as_path().to_path_buf(), resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS });
            }
        }
        Ok(Start { root: None, rest: path.to_path_buf(), resolve: libc::RESOLVE_NO_SYMLINKS })
    }

    fn fd(&self) -> RawFd {
        self.root.as_ref().map_or(libc::AT_FDCWD, |r| r.as_raw_fd())
    }

    /// The path, if it already is a FIFO, /dev/null or a terminal, opened
    /// for writing in place (never created or truncated). Host links are
    /// followed here, as /dev/stdout and /dev/fd/N need, since nothing but
    /// those is ever opened this way; a container's stay in its root.
    fn open_in_place(&self, path: &Path) -> Result<Option<Output>> {
        let shown = path.display();
        let found = match &self.root {
            Some(root) => openat2(root.as_raw_fd(), &self.rest, libc::O_PATH | libc::O_CLOEXEC, self.resolve),
            None => openat2(libc::AT_FDCWD, path, libc::O_PATH | libc::O_CLOEXEC, 0),
        };
        let Ok(found) = found else { return Ok(None) };
        let meta = found.metadata().with_context(|| format!("cannot write {shown}"))?;
        let kind = meta.file_type();
        if kind.is_file() || kind.is_symlink() {
            return Ok(None);
        }
        if !(kind.is_fifo() || kind.is_char_device() && writable_device(meta.rdev())) {
            if kind.is_dir() {
                return Ok(None);
            }
            bail!("cannot write {shown}: it is not a regular file, a FIFO, /dev/null or a terminal (use - for standard output)");
        }
        // The very inode found, reopened for writing; O_NONBLOCK so that a
        // FIFO nobody reads fails now instead of blocking forever.
        let reopen = CString::new(format!("/proc/self/fd/{}", found.as_raw_fd())).unwrap();
        // SAFETY: open(2) on a NUL-terminated path; the fd becomes the File's.
        let fd = unsafe { libc::open(reopen.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) && kind.is_fifo() {
                bail!("cannot write {shown}: it is a FIFO that no process is reading");
            }
            return Err(e).with_context(|| format!("cannot write {shown}"));
        }
        // SAFETY: a fresh fd we own.
        let file = unsafe { File::from_raw_fd(fd) };
        let opened = file.metadata().with_context(|| format!("cannot write {shown}"))?;
        if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
            bail!("cannot write {shown}: it changed while pytrace opened it");
        }
        // Blocking from here on: a slow reader is waited for, not lost.
        // SAFETY: fcntl(2) on an fd we own.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) };
        Ok(Some(Output::InPlace { shown: path.to_path_buf(), file: Some(file) }))
    }
}

/// /dev/null and terminals: the character devices a report may go to.
/// Others (/dev/mem, /dev/kmsg, a disk's raw device) are never written.
fn writable_device(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    matches!((major, minor), (1, 3) | (5, 0) | (5, 1)) || major == 4 || (136..=143).contains(&major)
}

/// fstatat(2) of `name` in `dir`, not following a link; None if absent.
fn stat_at(dir: &File, name: &CString) -> Result<Option<libc::stat>> {
    // SAFETY: fstatat(2) into a zeroed struct, on a directory fd we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0 {
        return Ok(Some(st));
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::NotFound {
        return Ok(None);
    }
    Err(e).context(format!("cannot look at {}", name.to_string_lossy()))
}

/// Refuses, before anything runs, an output that is also an input (it
/// would be replaced before or while it is read) or two outputs that are
/// one file (`x.json` and `/abs/x.json`: one report would be lost).
pub fn check_distinct(inputs: &[&Path], outputs: &[&Output]) -> Result<()> {
    let input_ids: Vec<(&Path, Option<(u64, u64)>)> = inputs.iter().map(|p| (*p, std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino())))).collect();
    for (i, out) in outputs.iter().enumerate() {
        let existing = out.existing_file();
        for (input, id) in &input_ids {
            if existing.is_some() && existing == *id || out.shown() == input.display().to_string() && !matches!(out, Output::Stdout) {
                bail!("{} is both an input and an output: pytrace would replace the report it reads; write to another file", out.shown());
            }
        }
        let Some(id) = out.identity() else { continue };
        for other in &outputs[i + 1..] {
            if other.identity().as_ref() == Some(&id) {
                if other.shown() == out.shown() {
                    bail!("{} is given as two outputs: give each its own file", out.shown());
                }
                bail!("{} and {} are the same file, given as two outputs: give each its own file", out.shown(), other.shown());
            }
        }
    }
    Ok(())
}

/// The outcome of writing several outputs: every one was attempted, and
/// each that failed is one sentence (one line each, as main prints them).
pub fn all_written(results: impl IntoIterator<Item = Result<()>>) -> Result<()> {
    let failed: Vec<String> = results.into_iter().filter_map(|r| r.err()).map(|e| format!("{e:#}")).collect();
    match failed.len() {
        0 => Ok(()),
        _ => Err(anyhow::anyhow!("{}", failed.join("\npytrace: "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritable_output_fails_at_once() {
        let err = Output::create(Path::new("/nonexistent-dir/out.json")).err().unwrap();
        assert!(format!("{err:#}").starts_with("cannot write /nonexistent-dir/out.json"));
    }

    #[test]
    fn a_report_replaces_the_file_only_once_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keep.json");
        std::fs::write(&path, "earlier").unwrap();
        // Created, then dropped unwritten (a failed run): the earlier file stays.
        drop(Output::create(&path).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "earlier");
        let mut out = Output::create(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "earlier", "untouched until written");
        out.write_all(b"new").unwrap();
        drop(out);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn links_and_special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let link = dir.path().join("out.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = Output::create(&link).err().unwrap();
        assert!(format!("{err:#}").contains("is a symbolic link"), "{err:#}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(format!("{:#}", Output::create(Path::new("/dev/zero")).err().unwrap()).contains("not a regular file, a FIFO"));
        assert!(format!("{:#}", Output::create(dir.path()).err().unwrap()).contains("not a regular file"));
    }

    #[test]
    fn a_symlinked_directory_on_the_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let link = dir.path().join("reports");
        std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
        let err = format!("{:#}", Output::create(&link.join("out.json")).err().unwrap());
        assert!(err.contains("a directory on its path is a symbolic link"), "{err}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing made through the link");
    }

    #[test]
    fn dev_null_and_fifos_are_written_in_place() {
        let mut null = Output::create(Path::new("/dev/null")).unwrap();
        null.write_all(b"{}").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = format!("{:#}", Output::create(&fifo).err().unwrap());
        assert!(err.contains("a FIFO that no process is reading"), "{err}");
        let reader = std::thread::spawn({
            let fifo = fifo.clone();
            move || std::fs::read_to_string(fifo).unwrap()
        });
        // The reader opens the FIFO in its own time: retry until it has.
        let mut out = loop {
            match Output::create(&fifo) {
                Ok(out) => break out,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        };
        out.write_all(b"through the pipe").unwrap();
        drop(out);
        assert_eq!(reader.join().unwrap(), "through the pipe");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is not replaced");
    }

    #[test]
    fn an_output_that_is_an_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        std::fs::write(&a, "{}").unwrap();
        let hard = dir.path().join("hard.json");
        std::fs::hard_link(&a, &hard).unwrap();
        let out_a = Output::create(&a).unwrap();
        let out_hard = Output::create(&hard).unwrap();
        assert!(check_distinct(&[&a], &[&out_a]).unwrap_err().to_string().contains("both an input and an output"));
        assert!(check_distinct(&[&a], &[&out_hard]).is_err(), "the same file by another name");
        let b = dir.path().join("b.json");
        let (b1, b2) = (Output::create(&b).unwrap(), Output::create(&b).unwrap());
        assert!(check_distinct(&[&a], &[&b1, &b2]).unwrap_err().to_string().contains("two outputs"));
        let (stdout1, stdout2) = (Output::create(Path::new("-")).unwrap(), Output::create(Path::new("-")).unwrap());
        assert!(check_distinct(&[&a], &[&b1, &stdout1, &stdout2]).is_ok());
    }

    #[test]
    fn one_new_file_named_two_ways_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let absolute = dir.path().join("x.json");
        let dotted = dir.path().join(".").join("sub").join("..").join("x.json");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let (one, two) = (Output::create(&absolute).unwrap(), Output::create(&dotted).unwrap());
        let err = check_distinct(&[], &[&one, &two]).unwrap_err().to_string();
        assert!(err.contains("are the same file, given as two outputs"), "{err}");
    }
}
