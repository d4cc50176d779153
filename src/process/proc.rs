//! What /proc says about a process: its state, its memory mappings, and its
//! memory itself. The target is untrusted: every read can fail, and callers
//! get an error with context instead of a guess.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// One line of /proc/PID/maps that maps a file (or the vDSO).
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// The mapped file's identity (st_dev, st_ino), which no path walk can
    /// fake: files are opened through the target and checked against it
    /// (src/process/files.rs).
    pub dev: u64,
    pub inode: u64,
    pub executable: bool,
    /// The path as the kernel names it to us: inside the target's mount
    /// namespace for a container, the full host path for a chroot; `[vdso]`
    /// for the vDSO. A name for messages only, never opened.
    pub path: String,
    /// The file was unlinked or replaced on disk since it was mapped (the
    /// kernel says " (deleted)"): whatever the path holds now is another file.
    pub deleted: bool,
}

pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// False once the process has exited, including while it is a zombie that
/// its parent has not reaped yet.
pub fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and
        // may itself contain spaces or parentheses.
        Ok(stat) => match stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) {
            Some(state) => state != "Z" && state != "X",
            None => false,
        },
        Err(_) => false,
    }
}

/// A process's exit, watched through a pidfd (Linux 5.3): one poll says
/// whether it has exited, where `is_running` reads and parses
/// /proc/PID/stat (about 100 µs of CPU on a virtual machine, four times a
/// second in every run), and a new process given the same PID cannot pass
/// for it. Without a pidfd (it could not be opened), `is_running`.
pub struct ExitWatch {
    pid: u32,
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl ExitWatch {
    pub fn new(pid: u32) -> Self {
        // SAFETY: pidfd_open takes a PID and flags and returns a new
        // descriptor, which nothing else owns, or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = (fd >= 0).then(|| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as std::os::fd::RawFd) });
        ExitWatch { pid, pidfd }
    }

    /// False once the process has exited (the pidfd is readable from then,
    /// while it is a zombie too).
    pub fn running(&self) -> bool {
        let Some(fd) = &self.pidfd else { return is_running(self.pid) };
        let mut poll = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(fd), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, valid for the call; a zero timeout.
        match unsafe { libc::poll(&mut poll, 1, 0) } {
            0 => true,
            1 => false,
            // Interrupted or refused: ask /proc.
            _ => is_running(self.pid),
        }
    }
}

pub fn command_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The names of the target's threads, as far as /proc still knows them.
pub fn thread_names(pid: u32, names: &mut HashMap<u32, String>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else { continue };
        if let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) {
            names.insert(tid, comm.trim().to_string());
        }
    }
}

/// A thread's state letter as /proc has it (R, S, D, ...); None once it
/// has exited.
pub fn thread_state(pid: u32, tid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // The command name before it is in parentheses and may hold spaces.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
}

/// Whether the process is a kernel thread (PF_KTHREAD in field 9 of
/// /proc/PID/stat): it has no executable and no memory of its own to read.
pub fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // Fields after the command name (in parentheses, which may hold anything).
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().nth(6))
        .and_then(|flags| flags.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The target's executable as the target names it (a name, never opened:
/// see src/process/files.rs), and whether it was deleted or replaced since.
pub fn exe_path(pid: u32) -> Result<(String, bool)> {
    let link = std::fs::read_link(format!("/proc/{pid}/exe")).with_context(|| format!("failed to read the link /proc/{pid}/exe"))?;
    let link = link.to_string_lossy();
    Ok((strip_deleted(&link).to_string(), link.ends_with(DELETED)))
}

/// When the process started, in clock ticks after boot (field 22 of
/// /proc/PID/stat): with the PID, names one process for good, since PIDs
/// are reused.
pub fn start_time(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("failed to read /proc/{pid}/stat"))?;
    // Fields after the command name (in parentheses, which may hold anything).
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().nth(19))
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("/proc/{pid}/stat has no start time"))
}

/// The CPU time (user and system, every thread, exited ones included) a
/// process has used, in ns, from the kernel's own accounting (the clock
/// `clock_getcpuclockid` names; the same one `time.process_time()` reads
/// inside the process). None once it has exited or cannot be read.
pub fn cpu_time_ns(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: both calls write only into the locals passed.
    unsafe {
        if libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) != 0 || libc::clock_gettime(clock, &mut now) != 0 {
            return None;
        }
    }
    Some(now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64)
}

const DELETED: &str = " (deleted)";

fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(DELETED).unwrap_or(path)
}

/// The parent of process `pid`, from /proc/PID/stat; None once it is gone.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(1))?.parse().ok()
}

/// The processes descended from `roots` (children, their children, ...),
/// at most `max`, found by parent PID; not the roots themselves.
pub fn descendants(roots: &[u32], max: usize) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let parent_of: Vec<(u32, u32)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(1))?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found: Vec<u32> = Vec::new();
    let mut frontier = roots.to_vec();
    while let Some(parent) = frontier.pop() {
        for &(pid, _) in parent_of.iter().filter(|&&(pid, ppid)| ppid == parent && !roots.contains(&pid)) {
            if found.len() >= max {
                return found;
            }
            if !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// The process's mappings of files, in address order.
pub fn file_mappings(pid: u32) -> Result<Vec<Mapping>> {
    Ok(mappings(pid)?.into_iter().filter(|m| m.path.starts_with('/')).collect())
}

/// The process's executable mappings (files' code and the vDSO), in
/// address order.
pub fn code_mappings(pid: u32) -> Result<Vec<Mapping>> {
    Ok(mappings(pid)?.into_iter().filter(|m| m.executable).collect())
}

fn mappings(pid: u32) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("failed to read /proc/{pid}/maps"))?;
    Ok(text.lines().filter_map(parse_maps_line).collect())
}

/// `start-end perms offset dev inode path`, for a file or the vDSO.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let executable = fields.next()?.contains('x');
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let dev = libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next()?.trim_start();
    if !path.starts_with('/') && path != "[vdso]" {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        dev,
        inode,
        executable,
        path: strip_deleted(path).to_string(),
        deleted: path.ends_with(DELETED),
    })
}

/// Reads and writes the target's memory through /proc/PID/mem.
pub struct Memory {
    pid: u32,
    file: File,
}

impl Memory {
    pub fn open(pid: u32) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("failed to open /proc/{pid}/mem"))?;
        Ok(Self { pid, file })
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let n = self
            .file
            .read_at(buf, addr)
            .with_context(|| format!("failed to read {} bytes at {addr:#x} in process {}", buf.len(), self.pid))?;
        if n != buf.len() {
            bail!("short read of {} bytes at {addr:#x} in process {}", buf.len(), self.pid);
        }
        Ok(())
    }

    pub fn read_u64(&self, addr: u64) -> Result<u64> {
        let mut buf = [0u8; 8];
        self.read(addr, &mut buf)?;
        Ok(u64::from_ne_bytes(buf))
    }

    /// The 8 bytes a pointer read from the target points at: NULL, common
    /// in a hostile or half-built object, is refused before any read.
    pub fn read_u64_non_null(&self, addr: u64) -> Result<u64> {
        ensure!(addr != 0, "NULL pointer");
        self.read_u64(addr)
    }

    pub fn read_u8(&self, addr: u64) -> Result<u8> {
        let mut buf = [0u8];
        self.read(addr, &mut buf)?;
        Ok(buf[0])
    }

    /// One aligned 8-byte write: the target sees the old value or the new.
    pub fn write_u64(&self, addr: u64, value: u64) -> Result<()> {
        let n = self
            .file
            .write_at(&value.to_ne_bytes(), addr)
            .with_context(|| format!("failed to write at {addr:#x} in process {}", self.pid))?;
        if n != 8 {
            bail!("short write at {addr:#x} in process {}", self.pid);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's own letters: this thread is running as it reads its
    /// stat; a thread blocked in a sleep is sleeping; a TID that names no
    /// thread of ours has no state.
    #[test]
    fn thread_states_are_the_kernels_letters() {
        let pid = std::process::id();
        // SAFETY: gettid cannot fail.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(thread_state(pid, tid).as_deref(), Some("R"));
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid cannot fail.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        let sleeper_tid = rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(thread_state(pid, sleeper_tid).as_deref(), Some("S"));
        sleeper.join().unwrap();
        assert_eq!(thread_state(pid, sleeper_tid), None);
        assert_eq!(thread_state(pid, u32::MAX), None);
    }

    #[test]
    fn parses_file_mappings_and_skips_anonymous_ones() {
        let m = parse_maps_line(
            "7f1c2a000000-7f1c2a100000 r-xp 00042000 08:01 1234     /usr/lib/libpython3.11.so.1.0 (deleted)",
        )
        .unwrap();
        assert_eq!(m.start, 0x7f1c2a000000);
        assert_eq!(m.offset, 0x42000);
        assert_eq!(m.path, "/usr/lib/libpython3.11.so.1.0");
        assert!(m.deleted);
        assert_eq!((m.dev, m.inode), (libc::makedev(8, 1), 1234));
        assert!(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0   [stack]").is_none());
        assert!(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0").is_none());
    }

    #[test]
    fn code_mappings_are_executable_files_and_the_vdso() {
        let m = parse_maps_line("7f1c2a000000-7f1c2a100000 r-xp 00042000 08:01 1234     /usr/lib/libz.so.1").unwrap();
        assert_eq!((m.start, m.end, m.offset, m.inode, m.executable, m.path.as_str()), (0x7f1c2a000000, 0x7f1c2a100000, 0x42000, 1234, true, "/usr/lib/libz.so.1"));
        assert!(!parse_maps_line("7f1c2a000000-7f1c2a100000 r--p 00000000 08:01 1234     /usr/lib/libz.so.1").unwrap().executable);
        assert_eq!(parse_maps_line("7ffd1000-7ffd3000 r-xp 00000000 00:00 0   [vdso]").unwrap().path, "[vdso]");
        assert!(parse_maps_line("7ffd1000-7ffd3000 rwxp 00000000 00:00 0").is_none(), "anonymous code (a JIT) has no unwind information");
        assert!(!parse_maps_line("7f1c2a000000-7f1c2a100000 r-xp 00042000 103:0a 1234     /usr/lib/libz.so.1").unwrap().deleted);
        assert_eq!(parse_maps_line("7f1c2a000000-7f1c2a100000 r-xp 00042000 103:0a 1234     /usr/lib/libz.so.1").unwrap().dev, libc::makedev(0x103, 0xa));
        let mine = code_mappings(std::process::id()).unwrap();
        assert!(mine.iter().all(|m| m.executable) && mine.iter().any(|m| m.path == "[vdso]"));
        assert!(mine.windows(2).all(|w| w[0].start < w[1].start));
        assert!(file_mappings(std::process::id()).unwrap().iter().all(|m| m.path.starts_with('/')), "no [vdso] among files");
    }

    /// The pidfd says a child exited as soon as it is a zombie, as /proc
    /// does, and says it runs while it does.
    #[test]
    fn an_exit_watch_sees_a_child_exit_before_it_is_reaped() {
        let mut child = std::process::Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let watch = ExitWatch::new(child.id());
        assert!(watch.pidfd.is_some());
        assert!(watch.running() && is_running(child.id()));
        // SAFETY: kill sends a signal to our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        let waited = std::time::Instant::now();
        while watch.running() && waited.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!watch.running(), "still running 10 s after SIGKILL");
        assert!(!is_running(child.id()), "/proc disagrees: the child is a zombie");
        child.wait().unwrap();
        assert!(!watch.running());
    }

    #[test]
    fn this_process_is_running_and_readable() {
        let pid = std::process::id();
        assert!(is_running(pid));
        assert!(start_time(pid).unwrap() > 0 && start_time(pid).unwrap() == start_time(pid).unwrap());
        let value: u64 = 0x1122_3344_5566_7788;
        let mem = Memory::open(pid).unwrap();
        assert_eq!(mem.read_u64(&value as *const u64 as u64).unwrap(), value);
        assert!(mem.read_u64(8).is_err(), "page zero is never mapped");
    }
}
