//! Where a report goes: standard output, or a file replaced whole.
//!
//! pytrace runs as root, so a file path is treated with care: the report is
//! written to a new file in the same directory (created exclusively, never
//! through a link) and renamed over the path only once it is complete. An
//! earlier report at the path survives a failed run; a symlink, FIFO or
//! device at the path is refused, never written through; and the new file
//! is made before tracing starts, so an unwritable directory fails at once.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// "-" is standard output; anything else is a file.
pub enum Output {
    Stdout,
    File { path: PathBuf, temp: PathBuf, file: Option<File> },
}

impl Output {
    pub fn create(path: &Path) -> Result<Self> {
        if path == Path::new("-") {
            return Ok(Output::Stdout);
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.file_type().is_symlink() {
                bail!("cannot write {}: it is a symbolic link, and pytrace does not write through links (give the real path, or - for standard output)", path.display());
            }
            if !meta.file_type().is_file() {
                bail!("cannot write {}: it is not a regular file (use - for standard output)", path.display());
            }
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path.file_name().with_context(|| format!("cannot write {}: it names no file", path.display()))?;
        for attempt in 0..100 {
            let temp = dir.join(format!(".{}.pytrace-{}-{attempt}", name.to_string_lossy(), std::process::id()));
            match create_exclusive(&temp) {
                Ok(file) => return Ok(Output::File { path: path.to_path_buf(), temp, file: Some(file) }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot write {}", path.display())),
            }
        }
        bail!("cannot write {}: could not create a new file beside it", path.display())
    }

    /// Writes the whole report; a file is then renamed into place.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            // A file format (JSON, folded stacks), exact: not a terminal table.
            #[allow(clippy::disallowed_methods)]
            Output::Stdout => io::stdout().write_all(bytes).context("failed to write to standard output"),
            Output::File { path, temp, file } => {
                let mut f = file.take().with_context(|| format!("{} was already written", path.display()))?;
                f.write_all(bytes).and_then(|()| f.flush()).with_context(|| format!("failed to write {}", path.display()))?;
                drop(f);
                std::fs::rename(&*temp, &*path).with_context(|| format!("failed to put the report in place at {}", path.display()))?;
                *temp = PathBuf::new();
                Ok(())
            }
        }
    }
}

impl Drop for Output {
    /// A report never written leaves nothing behind, and the path as it was.
    fn drop(&mut self) {
        if let Output::File { temp, .. } = self {
            if !temp.as_os_str().is_empty() {
                let _ = std::fs::remove_file(&*temp);
            }
        }
    }
}

/// O_CREAT|O_EXCL|O_NOFOLLOW: a new file, never an existing one or a link.
fn create_exclusive(path: &Path) -> io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open(2) on a NUL-terminated path; the fd becomes the File's.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Refuses, before anything runs, an output that is also an input (it
/// would be replaced before or while it is read) or that two outputs share.
pub fn check_distinct(inputs: &[&Path], outputs: &[&Path]) -> Result<()> {
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let outputs: Vec<&Path> = outputs.iter().copied().filter(|p| *p != Path::new("-")).collect();
    for (i, out) in outputs.iter().enumerate() {
        for input in inputs {
            if out == input || id(out).is_some() && id(out) == id(input) {
                bail!("{} is both an input and an output: pytrace would replace the report it reads; write to another file", out.display());
            }
        }
        for other in &outputs[i + 1..] {
            if out == other || id(out).is_some() && id(out) == id(other) {
                bail!("{} is given as two outputs: give each its own file", out.display());
            }
        }
    }
    Ok(())
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
        assert!(format!("{:#}", Output::create(Path::new("/dev/null")).err().unwrap()).contains("not a regular file"));
    }

    #[test]
    fn an_output_that_is_an_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        std::fs::write(&a, "{}").unwrap();
        let hard = dir.path().join("hard.json");
        std::fs::hard_link(&a, &hard).unwrap();
        assert!(check_distinct(&[&a], &[&a]).unwrap_err().to_string().contains("both an input and an output"));
        assert!(check_distinct(&[&a], &[&hard]).is_err(), "the same file by another name");
        let b = dir.path().join("b.json");
        assert!(check_distinct(&[&a], &[&b, &b]).unwrap_err().to_string().contains("two outputs"));
        assert!(check_distinct(&[&a], &[&b, Path::new("-"), Path::new("-")]).is_ok());
    }
}
