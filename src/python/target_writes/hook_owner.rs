//! One owner at a time for a process's eval-frame hook (eval_hook.rs).
//!
//! Two `calls` runs on one target both set the hook, and the first to end
//! puts NULL back under the second, whose counts then silently miss every
//! inlined call. So the hook has an owner: whoever holds an exclusive flock
//! on /run/pytrace/hook-PID-STARTTIME (the target's PID and start time, since
//! PIDs are reused). The file holds the owner's PID, for the refusal's
//! sentence. The guardian inherits the lock with the fork and keeps it until
//! it has restored the hook, so no new run starts on a hook being put back.
//! The kernel drops a flock when its last holder dies, so a lock is never
//! stale; the file left behind by a killed run is harmless and reused.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::process::proc;

/// Where the lock files live: root's, on a tmpfs cleared at boot.
const RUN_DIR: &str = "/run/pytrace";

/// The held lock on one target's hook.
pub struct HookLock {
    file: File,
    path: PathBuf,
    /// The pytrace that held this lock before and ended without releasing
    /// it (killed with its guardian): the record that a hook of pytrace's
    /// value in the target was left by a run, not set by something else.
    pub previous_owner: Option<u32>,
}

fn lock_path(pid: u32) -> Result<PathBuf> {
    Ok(PathBuf::from(format!("{RUN_DIR}/hook-{pid}-{}", proc::start_time(pid)?)))
}

/// Opens (creating if asked) the lock file without following a symlink, in
/// a directory that only we can write.
fn open_lock_file(path: &Path, create: bool) -> std::io::Result<File> {
    if create {
        ensure_run_dir()?;
    }
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | if create { libc::O_CREAT } else { 0 };
    // SAFETY: open(2) on a NUL-terminated path; the fd becomes the File's.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let file = unsafe { File::from_raw_fd(fd) };
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", path.display())));
    }
    Ok(file)
}

/// /run/pytrace, a directory of ours that no one else can write (so no one
/// can plant a file or link in it for us to open).
fn ensure_run_dir() -> std::io::Result<()> {
    match std::fs::create_dir(RUN_DIR) {
        Ok(()) => std::fs::set_permissions(RUN_DIR, std::os::unix::fs::PermissionsExt::from_mode(0o700))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(RUN_DIR)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!("{RUN_DIR} is not a directory that only user {me} can write")));
    }
    Ok(())
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock(2) on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn read_owner(mut file: &File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

impl HookLock {
    /// Takes ownership of process `pid`'s hook, or says who has it.
    pub fn acquire(pid: u32) -> Result<Self> {
        let path = lock_path(pid)?;
        let what = || format!("failed to take the eval-frame hook lock {}", path.display());
        // A releasing owner unlinks the file while it still holds the lock:
        // a lock won on an unlinked file is no lock, so try again.
        for _ in 0..8 {
            let mut file = open_lock_file(&path, true).with_context(what)?;
            if let Err(e) = flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    match read_owner(&file) {
                        Some(owner) => bail!(
                            "pytrace PID {owner} is already tracing calls in process {pid} (it owns its eval-frame hook); one calls or compare run at a time can trace a process"
                        ),
                        None => bail!("another pytrace is already tracing calls in process {pid} (it owns its eval-frame hook)"),
                    }
                }
                return Err(e).with_context(what);
            }
            let still_there = std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == file.metadata().map(|f| f.ino()).unwrap_or(0));
            if !still_there {
                continue;
            }
            let previous_owner = read_owner(&file);
            file.set_len(0).with_context(what)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes()).with_context(what)?;
            return Ok(HookLock { file, path, previous_owner });
        }
        bail!("{}: the file kept being replaced", what())
    }

    /// The PID of the pytrace that owns process `pid`'s hook now, if any.
    pub fn owner(pid: u32) -> Option<u32> {
        let file = open_lock_file(&lock_path(pid).ok()?, false).ok()?;
        match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => None,
            Err(_) => Some(read_owner(&file).unwrap_or(0)),
        }
    }

    /// The pytrace whose run left its lock file behind for process `pid`
    /// (it ended without releasing it, so was killed), if none holds it now.
    pub fn left_behind_by(pid: u32) -> Option<u32> {
        let file = open_lock_file(&lock_path(pid).ok()?, false).ok()?;
        flock(&file, libc::LOCK_SH | libc::LOCK_NB).ok()?;
        read_owner(&file)
    }

    /// The pytrace that owns the hook of process `pid` or of one of its
    /// ancestors (its hook inherited at a fork while traced, which that run
    /// restores too), with the PID of the process it traces.
    pub fn owner_here_or_above(pid: u32) -> Option<(u32, u32)> {
        let mut process = pid;
        for _ in 0..64 {
            if let Some(owner) = HookLock::owner(process) {
                return Some((owner, process));
            }
            process = proc::parent(process).filter(|&p| p > 1)?;
        }
        None
    }

    /// Ends ownership: the file goes, then the lock (closing the last fd;
    /// a guardian holding the same lock must have exited first).
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}
