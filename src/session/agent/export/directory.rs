//! A local directory of pprof files, one per process and interval, named
//! so that their order is their time (`START_MS-SERVICE-PID.pb.gz`), the
//! oldest removed once the directory's pprof files pass the size cap.
//! Each file is written beside its name and renamed into place, never
//! through a link (report/output.rs).
//!
//! The files and their sizes are listed once, at start, then kept in
//! memory as they are written and removed: listing the directory at every
//! push cost a stat per file, thousands per push once the directory
//! filled, and was the agent's CPU creeping up over a long run
//! (bench/agent.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{Destination, PushError};
use crate::report::output::Output;
use crate::session::agent::Exported;

pub struct Directory {
    path: PathBuf,
    max_bytes: u64,
    /// Our files by name (their names sort by time), with their sizes.
    files: BTreeMap<String, u64>,
    total: u64,
}

impl Directory {
    pub fn new(path: &Path, max_bytes: u64) -> Result<Self> {
        std::fs::create_dir_all(path).with_context(|| format!("cannot create the directory destination {}", path.display()))?;
        let meta = std::fs::symlink_metadata(path).with_context(|| format!("cannot use the directory destination {}", path.display()))?;
        if !meta.is_dir() {
            bail!("the directory destination {} is not a directory (a symbolic link is not followed)", path.display());
        }
        // What an earlier run left counts toward the cap.
        let files: BTreeMap<String, u64> = std::fs::read_dir(path)
            .with_context(|| format!("cannot list the directory destination {}", path.display()))?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                (name.ends_with(".pb.gz") && meta.is_file()).then_some((name, meta.len()))
            })
            .collect();
        let total = files.values().sum();
        Ok(Directory { path: path.to_path_buf(), max_bytes, files, total })
    }

    /// Removes the oldest of our files until they fit the cap. One removed
    /// by someone else meanwhile is simply no longer counted.
    fn rotate(&mut self) -> std::io::Result<()> {
        while self.total > self.max_bytes {
            let Some((name, size)) = self.files.pop_first() else { break };
            match std::fs::remove_file(self.path.join(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.files.insert(name, size);
                    return Err(e);
                }
            }
            self.total -= size;
        }
        Ok(())
    }
}

impl Destination for Directory {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError> {
        let service: String = profile.service.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).take(80).collect();
        let name = format!("{:013}-{service}-{}.pb.gz", profile.start_unix_ns / 1_000_000, profile.pid);
        let path = self.path.join(&name);
        let written = Output::create(&path).and_then(|mut out| out.write_all(&profile.pprof));
        // A full disk may clear; a directory gone is a retry too, counted.
        written.map_err(|e| PushError::Retry(format!("{e:#}")))?;
        // The same name again (a retry after the rename) replaces the file.
        self.total -= self.files.insert(name, profile.pprof.len() as u64).unwrap_or(0);
        self.total += profile.pprof.len() as u64;
        self.rotate().map_err(|e| PushError::Retry(format!("cannot rotate {}: {e}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(start_ms: i64, bytes: usize) -> Exported {
        Exported { interval: 1, time: "cpu", pid: 7, service: "web".into(), labels: Default::default(), start_unix_ns: start_ms * 1_000_000, end_unix_ns: 0, pprof: vec![1; bytes], otlp: None }
    }

    #[test]
    fn the_oldest_go_past_the_cap_counted_from_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0000000000001-old-1.pb.gz"), [0; 300]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), [0; 5000]).unwrap();
        let mut d = Directory::new(dir.path(), 1000).unwrap();
        for start in 2..=5 {
            d.push(&profile(start, 300)).ok().unwrap();
        }
        let mut left: Vec<String> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["0000000000003-web-7.pb.gz", "0000000000004-web-7.pb.gz", "0000000000005-web-7.pb.gz", "notes.txt"]);
        assert_eq!(d.total, 900);
    }
}
