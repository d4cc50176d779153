//! `pytrace agent`: always-on profiling of every CPython on the host, a
//! pprof profile per process and interval pushed to each configured
//! destination (session/agent/ runs it all).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::session::agent::{self, config::Overrides};

pub struct Options {
    pub config: Option<PathBuf>,
    pub frequency: Option<u64>,
    pub interval: Option<Duration>,
    pub metrics_address: Option<String>,
}

pub fn run(opts: Options) -> Result<i32> {
    let flags = Overrides { hz: opts.frequency, interval: opts.interval, metrics_address: opts.metrics_address };
    agent::run(opts.config, flags)
}
