//! A function's call latencies as the kernel buckets them
//! (bpf/histogram.bpf.h), kept sparse, and the percentiles read from them.
//!
//! The bucket layout comes through the skeleton (bpf/histogram.h's enum
//! hist_layout); Rust keeps only the inverse of the C function, and the
//! tests below check it against the C function itself, run by the kernel.

use crate::bpf::calls::types::hist_layout;

const SUB_BITS: u32 = hist_layout::HIST_SUB_BITS.0;
const LINEAR: u64 = hist_layout::HIST_LINEAR.0 as u64;
const MIN_EXP: u32 = hist_layout::HIST_MIN_EXP.0;
/// calls' bucket count (the length of func_stats.hist).
pub const BUCKETS: usize = hist_layout::HIST_BUCKETS.0 as usize;

/// The lowest value and width in ns of bucket `i`, the inverse of
/// log_linear_bucket() in bpf/histogram.bpf.h (calls' hist_bucket and gil's
/// wait_bucket). calls' last bucket also holds every longer call.
pub fn bucket_range(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < LINEAR {
        return (i, 1);
    }
    let j = i - LINEAR;
    let sub = 1u64 << SUB_BITS;
    let exp = (MIN_EXP as u64 + j / sub).min(63);
    let width = 1u64 << (exp - SUB_BITS as u64);
    ((1u64 << exp) + (j % sub) * width, width)
}

/// The calls bucket of `ns`, for the calls user space closes itself (open
/// at the stop): found through bucket_range, so no second copy of the C
/// function exists.
pub fn bucket_of(ns: u64) -> usize {
    // The last bucket whose lowest value is at most ns (bucket 0's is 0).
    let (mut low, mut high) = (0, BUCKETS);
    while high - low > 1 {
        let mid = (low + high) / 2;
        if bucket_range(mid).0 <= ns {
            low = mid;
        } else {
            high = mid;
        }
    }
    low
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
                let (low, width) = bucket_range(bucket as usize);
                return low + width / 2;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::histogram_test::HistogramTestSkelBuilder;
    use hdrhistogram::Histogram;
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    use libbpf_rs::ProgramInput;
    use std::mem::MaybeUninit;

    const UNCLAMPED_BUCKETS: usize = hist_layout::HIST_UNCLAMPED_BUCKETS.0 as usize;

    /// (value, calls' hist_bucket, gil's wait_bucket) for each value, as the
    /// kernel runs bpf/histogram.bpf.h (bpf/histogram_test.bpf.c, through
    /// BPF_PROG_TEST_RUN: root and Linux 5.14+, as every test here has).
    fn c_buckets(values: &[u64]) -> Vec<(u64, usize, usize)> {
        let mut object = MaybeUninit::uninit();
        let open = HistogramTestSkelBuilder::default().open(&mut object).expect("open histogram_test");
        let mut skel = open.load().expect("load histogram_test");
        let mut out = Vec::with_capacity(values.len());
        let batch = skel.maps.bss_data.as_deref().expect("bss").values.len();
        for chunk in values.chunks(batch) {
            let bss = skel.maps.bss_data.as_deref_mut().expect("bss");
            bss.values.fill(0);
            bss.values[..chunk.len()].copy_from_slice(chunk);
            let run = skel.progs.run_buckets.test_run(ProgramInput::default()).expect("BPF_PROG_TEST_RUN");
            assert_eq!(run.return_value, 0);
            let bss = skel.maps.bss_data.as_deref().expect("bss");
            for (i, &v) in chunk.iter().enumerate() {
                out.push((v, bss.hist_buckets[i] as usize, bss.wait_buckets[i] as usize));
            }
        }
        out
    }

    /// Every bucket's lowest value, the values on either side of it, and its
    /// highest value, for the first `n` buckets of the inverse.
    fn bucket_edges(n: usize) -> Vec<u64> {
        (0..n)
            .flat_map(|i| {
                let (low, width) = bucket_range(i);
                [low.saturating_sub(1), low, low + 1, low + (width - 1)]
            })
            .collect()
    }

    /// The C functions and the Rust inverse agree on every bucket edge, and
    /// the buckets are what bpf/histogram.h documents: one per ns below
    /// HIST_LINEAR (16), then 8 equal buckets per power of two, calls' last
    /// one (2^43 + 7 * 2^40 and up) taking every longer call. The truth the
    /// documentation gives is checked on values computed independently of
    /// both sides: every power of two and its neighbours, and random values.
    #[test]
    fn the_c_buckets_are_the_documented_ones_and_rust_inverts_them() {
        let mut values = bucket_edges(UNCLAMPED_BUCKETS);
        values.extend((0..64).flat_map(|k| {
            let p = 1u64 << k;
            [p - 1, p, p + 1]
        }));
        values.push(u64::MAX);
        let mut x = 0x2545f4914f6cdd1du64; // xorshift64: random values over every magnitude
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        let results = c_buckets(&values);
        assert_eq!(results.len(), values.len());
        let last = BUCKETS - 1;
        for &(v, hist, wait) in &results {
            // The documented definition, computed here from the value alone.
            let documented = if v < 16 {
                v as usize
            } else {
                let exp = 63 - v.leading_zeros() as usize; // floor(log2 v)
                16 + (exp - 4) * 8 + ((v >> (exp - 3)) & 7) as usize
            };
            assert_eq!(wait, documented, "wait_bucket({v})");
            assert_eq!(hist, documented.min(last), "hist_bucket({v})");
            assert!(wait < UNCLAMPED_BUCKETS, "wait_bucket({v}) = {wait}");
            // Rust's inverse puts the value back in the bucket C chose.
            let (low, width) = bucket_range(wait);
            assert!(low <= v && v - low < width, "{v} outside wait bucket {wait}: [{low}, +{width})");
            let (low, width) = bucket_range(hist);
            assert!(low <= v && (hist == last || v - low < width), "{v} outside calls bucket {hist}");
            assert_eq!(bucket_of(v), hist, "bucket_of({v})");
            // Resolution: a bucket is at most 1/8 as wide as its lowest value.
            assert!(width == 1 || width * 8 <= low, "bucket {hist}: {width} wide from {low}");
        }
        // Every bucket is reached: C's first value of bucket i is Rust's low.
        for i in 0..UNCLAMPED_BUCKETS {
            let low = bucket_range(i).0;
            let hit = results.iter().find(|r| r.0 == low).expect("every low was run");
            assert_eq!(hit.2, i, "wait_bucket of bucket {i}'s lowest value {low}");
            if i > 0 {
                assert_eq!(bucket_range(i - 1).0 + bucket_range(i - 1).1, low, "buckets {} and {i} touch", i - 1);
            }
        }
        assert_eq!(results.iter().find(|r| r.0 == 1 << 44).unwrap().1, last, "2^44 ns is past calls' last bucket");
    }

    /// Adds kernel bucket counts to an hdrhistogram, each at its bucket's
    /// midpoint (at most 6.25% from the true value).
    fn add_buckets(hist: &mut Histogram<u64>, buckets: &[u64]) {
        for (i, &count) in buckets.iter().enumerate().filter(|(_, &c)| c > 0) {
            let (low, width) = bucket_range(i);
            let _ = hist.record_n(low + width / 2, count);
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
