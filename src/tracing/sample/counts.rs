//! Reading the per-stack counts BPF aggregates. The perf-event program
//! counts into whichever of two maps the `counts` map-in-map holds; a
//! drain swaps them (the kernel returns from the swap only once no program
//! can still be counting into the old one) and then reads and empties the
//! old one in batches. --idle's iterator, which user space runs itself,
//! counts into one map read the same way between passes. Counts are
//! weights: SAMPLE_WEIGHT per mean period sampled.

use std::os::fd::AsRawFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::bpf::sample::types::{sample_weight, stack_key};

/// Entries read per batch call.
const BATCH: usize = 4096;

/// What BPF adds to a stack's count per sample taken at the mean period
/// (bpf/sample.h's enum sample_weight): a sample counts for its clock's
/// period, which clock.rs draws at random per window.
pub const SAMPLE_WEIGHT: u64 = sample_weight::SAMPLE_WEIGHT.0 as u64;

/// The samples a weight stands for, rounded, at least one for a stack
/// sampled at all (so that no stack seen disappears from the profile).
pub fn samples_of(weight: u64) -> u64 {
    if weight == 0 {
        0
    } else {
        ((weight + SAMPLE_WEIGHT / 2) / SAMPLE_WEIGHT).max(1)
    }
}

/// A sample's weight at `period` ns when the mean period is `mean` ns.
pub fn weight_of(period: u64, mean: u64) -> u32 {
    ((period as u128 * SAMPLE_WEIGHT as u128 + mean as u128 / 2) / mean.max(1) as u128).min(u32::MAX as u128) as u32
}

pub struct CountsReader {
    /// Whether the program counts into counts_a now.
    counting_into_a: bool,
    keys: Vec<stack_key>,
    values: Vec<u64>,
}

impl CountsReader {
    pub fn new() -> Self {
        CountsReader { counting_into_a: true, keys: vec![stack_key::default(); BATCH], values: vec![0; BATCH] }
    }

    /// Points the program at the other map; returns the one it left, which
    /// nothing writes any more.
    pub fn swap<'m>(&mut self, outer: &dyn MapCore, a: &'m dyn MapCore, b: &'m dyn MapCore) -> Result<&'m dyn MapCore> {
        let (next, old) = if self.counting_into_a { (b, a) } else { (a, b) };
        let fd = next.as_fd().as_raw_fd() as u32;
        outer.update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY).context("failed to swap the sample counts maps")?;
        self.counting_into_a = !self.counting_into_a;
        Ok(old)
    }

    /// Reads and empties a counts map no program writes to.
    pub fn take(&mut self, map: &dyn MapCore, out: &mut Vec<(stack_key, u64)>) -> Result<()> {
        let fd = map.as_fd().as_raw_fd();
        let mut token = 0u64;
        let mut first = true;
        loop {
            let mut count = BATCH as u32;
            let opts = libbpf_rs::libbpf_sys::bpf_map_batch_opts {
                sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_batch_opts>() as _,
                ..Default::default()
            };
            let mut next = 0u64;
            // SAFETY: keys and values hold BATCH entries of the map's key and
            // value types; the batch tokens are u32s for hash maps.
            let ret = unsafe {
                libbpf_rs::libbpf_sys::bpf_map_lookup_and_delete_batch(
                    fd,
                    if first { std::ptr::null_mut() } else { (&mut token as *mut u64).cast() },
                    (&mut next as *mut u64).cast(),
                    self.keys.as_mut_ptr().cast(),
                    self.values.as_mut_ptr().cast(),
                    &mut count,
                    &opts,
                )
            };
            // libbpf returns the negated errno.
            let errno = -ret;
            if ret < 0 && errno != libc::ENOENT {
                bail!("failed to read the sample counts: {}", std::io::Error::from_raw_os_error(errno));
            }
            let n = (count as usize).min(BATCH);
            out.extend(self.keys[..n].iter().copied().zip(self.values[..n].iter().copied()));
            if ret < 0 {
                return Ok(());
            }
            token = next;
            first = false;
        }
    }
}
