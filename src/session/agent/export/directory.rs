//! A local directory of pprof files, one per process and interval, named
//! so that their order is their time (`START_MS-SERVICE-PID.pb.gz`), the
//! oldest removed once the directory's pprof files pass the size cap.
//! Each file is written beside its name and renamed into place, never
//! through a link (report/output.rs).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{Destination, PushError};
use crate::report::output::Output;
use crate::session::agent::Exported;

pub struct Directory {
    path: PathBuf,
    max_bytes: u64,
}

impl Directory {
    pub fn new(path: &Path, max_bytes: u64) -> Result<Self> {
        std::fs::create_dir_all(path).with_context(|| format!("cannot create the directory destination {}", path.display()))?;
        let meta = std::fs::symlink_metadata(path).with_context(|| format!("cannot use the directory destination {}", path.display()))?;
        if !meta.is_dir() {
            bail!("the directory destination {} is not a directory (a symbolic link is not followed)", path.display());
        }
        Ok(Directory { path: path.to_path_buf(), max_bytes })
    }

    /// Removes the oldest of our files until they fit the cap.
    fn rotate(&self) -> std::io::Result<()> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(&self.path)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                (name.ends_with(".pb.gz") && meta.is_file()).then_some((name, meta.len()))
            })
            .collect();
        files.sort();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        for (name, size) in files {
            if total <= self.max_bytes {
                break;
            }
            std::fs::remove_file(self.path.join(&name))?;
            total -= size;
        }
        Ok(())
    }
}

impl Destination for Directory {
    fn push(&mut self, profile: &Exported) -> Result<(), PushError> {
        let service: String = profile.service.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).take(80).collect();
        let name = format!("{:013}-{service}-{}.pb.gz", profile.start_unix_ns / 1_000_000, profile.pid);
        let path = self.path.join(name);
        let written = Output::create(&path).and_then(|mut out| out.write_all(&profile.pprof));
        // A full disk may clear; a directory gone is a retry too, counted.
        written.map_err(|e| PushError::Retry(format!("{e:#}")))?;
        self.rotate().map_err(|e| PushError::Retry(format!("cannot rotate {}: {e}", self.path.display())))
    }
}
