//! A function's call latencies as the kernel buckets them (bpf/calls.h:
//! HIST_*), kept sparse, and the percentiles read from them.

const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;
const MIN_EXP: u32 = SUB_BITS + 1;
#[cfg(test)]
const MAX_EXP: u32 = 43;
/// Bucket count, the length of func_stats.hist (checked by a test in
/// src/tracing/calls.rs, where the generated type is).
#[cfg(test)]
pub const BUCKETS: usize = (LINEAR + (MAX_EXP - MIN_EXP + 1) as u64 * SUB) as usize;

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

/// A function's latencies as the kernel bucketed them, keeping only the
/// buckets that hold something (a handful per function). Percentiles come
/// from bucket midpoints (at most 6.25% from the true value). Per function
/// this is bytes where an hdrhistogram fed the same midpoints took tens of
/// KiB: a target that floods pytrace with 16,384 distinct functions (the
/// function map's size) made it peak at 318 MiB that way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latency {
    /// (bucket, count), by bucket.
    buckets: Vec<(u16, u64)>,
}

impl Latency {
    /// From func_stats.hist.
    pub fn from_kernel(buckets: &[u64]) -> Self {
        Latency { buckets: buckets.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| (i as u16, c)).collect() }
    }

    /// Adds another function's latencies (rows merged by name).
    pub fn add(&mut self, other: &Latency) {
        for &(bucket, count) in &other.buckets {
            match self.buckets.binary_search_by_key(&bucket, |&(b, _)| b) {
                Ok(i) => self.buckets[i].1 += count,
                Err(i) => self.buckets.insert(i, (bucket, count)),
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The midpoint of the bucket holding the value at quantile `q` (the
    /// ceil(q * count)-th smallest), as hdrhistogram's value_at_quantile.
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().map(|&(_, c)| c).sum();
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total.max(1));
        let mut seen = 0;
        for &(bucket, count) in &self.buckets {
            seen += count;
            if seen >= rank {
                let (low, high) = bucket_range(bucket as usize);
                return low + (high - low) / 2;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;

    /// Adds kernel bucket counts to an hdrhistogram, each at its bucket's
    /// midpoint (at most 6.25% from the true value).
    fn add_buckets(hist: &mut Histogram<u64>, buckets: &[u64]) {
        for (i, &count) in buckets.iter().enumerate().filter(|(_, &c)| c > 0) {
            let (low, high) = bucket_range(i);
            let _ = hist.record_n(low + (high - low) / 2, count);
        }
    }

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
    fn percentiles_come_from_bucket_midpoints() {
        let mut buckets = vec![0u64; BUCKETS];
        buckets[bucket_of(1_000)] = 90;
        buckets[bucket_of(1_000_000)] = 10;
        let mut h = Histogram::<u64>::new(3).unwrap();
        add_buckets(&mut h, &buckets);
        let p50 = h.value_at_quantile(0.5) as f64;
        let p99 = h.value_at_quantile(0.99) as f64;
        assert!((p50 / 1_000.0 - 1.0).abs() < 0.07, "p50 {p50}");
        assert!((p99 / 1_000_000.0 - 1.0).abs() < 0.07, "p99 {p99}");
        // The sparse form gives what the hdrhistogram gives, to its precision.
        let mut sparse = Latency::from_kernel(&buckets);
        for q in [0.5, 0.9, 0.99, 1.0] {
            let (a, b) = (sparse.value_at_quantile(q) as f64, h.value_at_quantile(q) as f64);
            assert!((a / b - 1.0).abs() < 0.002, "q {q}: {a} against {b}");
        }
        // Merging two functions' rows adds their buckets.
        sparse.add(&Latency::from_kernel(&buckets));
        assert_eq!(sparse.value_at_quantile(0.5), Latency::from_kernel(&buckets).value_at_quantile(0.5));
        let mut more = vec![0u64; BUCKETS];
        more[bucket_of(50)] = 1000;
        sparse.add(&Latency::from_kernel(&more));
        assert!(sparse.value_at_quantile(0.5) < 60, "the added fast calls are now the median");
        assert!(Latency::default().is_empty());
    }
}
