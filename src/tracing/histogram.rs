//! The in-kernel latency histogram (bpf/calls.h: HIST_*) and its conversion
//! into hdrhistogram for percentiles.

use hdrhistogram::Histogram;

const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;
const MIN_EXP: u32 = SUB_BITS + 1;
#[cfg(test)]
const MAX_EXP: u32 = 43;
/// Bucket count, the length of func_stats.hist (checked by a test).
#[cfg(test)]
const BUCKETS: usize = (LINEAR + (MAX_EXP - MIN_EXP + 1) as u64 * SUB) as usize;

/// [low, high) nanoseconds of bucket `i`, the inverse of hist_bucket() in
/// bpf/calls.bpf.c.
pub fn bucket_range(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < LINEAR {
        return (i, i + 1);
    }
    let j = i - LINEAR;
    let exp = MIN_EXP as u64 + j / SUB;
    let width = 1u64 << (exp - SUB_BITS as u64);
    let low = (1u64 << exp) + (j % SUB) * width;
    (low, low + width)
}

/// Adds kernel bucket counts to an hdrhistogram, each at its bucket's
/// midpoint (at most 6.25% from the true value).
pub fn add_buckets(hist: &mut Histogram<u64>, buckets: &[u64]) {
    for (i, &count) in buckets.iter().enumerate().filter(|(_, &c)| c > 0) {
        let (low, high) = bucket_range(i);
        let _ = hist.record_n(low + (high - low) / 2, count);
    }
}

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is a valid precision")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust twin of hist_bucket() in bpf/calls.bpf.c.
    fn bucket_of(ns: u64) -> usize {
        if ns < LINEAR {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros();
        if exp > MAX_EXP {
            return BUCKETS - 1;
        }
        (LINEAR + (exp - MIN_EXP) as u64 * SUB + ((ns >> (exp - SUB_BITS)) & (SUB - 1))) as usize
    }

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        for i in 1..BUCKETS {
            assert_eq!(bucket_range(i - 1).1, bucket_range(i).0, "bucket {i}");
        }
        for ns in [0, 1, 15, 16, 17, 31, 32, 1000, 123_456, 9_999_999_999] {
            let (low, high) = bucket_range(bucket_of(ns));
            assert!(low <= ns && ns < high, "{ns} not in [{low}, {high})");
            assert!((high - low) as f64 <= 0.125 * low.max(8) as f64, "bucket of {ns} is too wide");
        }
    }

    #[test]
    fn matches_the_kernel_array_length() {
        let stats = crate::bpf::calls::types::func_stats::default();
        assert_eq!(stats.hist.len(), BUCKETS);
    }

    #[test]
    fn percentiles_come_from_bucket_midpoints() {
        let mut buckets = vec![0u64; BUCKETS];
        buckets[bucket_of(1_000)] = 90;
        buckets[bucket_of(1_000_000)] = 10;
        let mut h = new_histogram();
        add_buckets(&mut h, &buckets);
        let p50 = h.value_at_quantile(0.5) as f64;
        let p99 = h.value_at_quantile(0.99) as f64;
        assert!((p50 / 1_000.0 - 1.0).abs() < 0.07, "p50 {p50}");
        assert!((p99 / 1_000_000.0 - 1.0).abs() < 0.07, "p99 {p99}");
    }
}
