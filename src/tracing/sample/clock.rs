//! When samples are taken: a CPU-clock perf event on every CPU, whose
//! instants are randomised so that work periodic in time (event loops,
//! frame loops, batch ticks) cannot lock in phase with them.
//!
//! The kernel's CPU clock is an hrtimer re-armed every period: strictly
//! periodic. A BPF program cannot change its period, but user space can
//! (PERF_EVENT_IOC_PERIOD), and doing so restarts it: the next sample comes
//! one new period after the call, whatever the phase was. So a thread here
//! re-arms every CPU's event once per *window* with a new period drawn
//! uniformly from [P/2, 3P/2] (P = 1/rate), and lets it fire `k` times
//! (k such that a window lasts about WINDOW: a few samples per window at
//! low rates), then re-arms it again right after the k-th sample. Every window
//! starts at a phase the previous one left at random, and within a window
//! the period itself is random, so no period of the workload, whether a
//! multiple or a divisor of P, keeps seeing the same instants. A re-arm
//! costs an ioctl and a wake-up of a thread on that CPU: once per window,
//! not per sample (per sample, at 1000 Hz, it would cost about what
//! sampling itself does).
//!
//! Weights: a window's samples stand for its period, not the mean one, or
//! a short run's sample count (its CPU time estimate) would depend on the
//! windows its target happened to run in: a target on CPU for 50 ms
//! stretches gets a count 8 % off in 3 s (simulated; measured 0.92x to 1.25x
//! of its CPU time in 3 s runs of `pytrace compare`). So each re-arm also
//! writes the period's weight for that CPU into the BPF map that the
//! program adds per sample (counts.rs: SAMPLE_WEIGHT per mean period).
//!
//! Rate: the interval between a window's last sample and the re-arm (the
//! wake-up's lateness) is lost; the thread measures it and shortens the
//! mean period of the next windows by as much, so the mean rate is -r.
//!
//! `--idle` is paced by user space instead (one pass of the thread iterator
//! per tick): each tick is P times a uniform draw from [1/2, 3/2] after
//! the previous one, for the same reason.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::tracing::perf_event::{self, PerfEventAttr, EXCLUDE_IDLE, PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};

/// A window lasts at least this long (k = ceil(WINDOW / P) samples), which
/// bounds the re-arms to 2 a second per CPU, whatever the rate. Windows of
/// 50 ms to 500 ms gave the same share estimates in simulation (the unit
/// tests below); a wake-up costs 50-100 µs on a loaded virtual machine
/// (each CPU's re-arm thread measured 80 µs, 0.4 ms a second at 200 ms).
const WINDOW: Duration = Duration::from_millis(500);

/// How far past a window's last sample the re-arm is aimed, so that the
/// last sample is surely taken before the period changes.
const AFTER_LAST: Duration = Duration::from_micros(20);

/// Periods are drawn from [P (1 - SPREAD), P (1 + SPREAD)]. A half-width
/// of P/2 keeps the share estimates' variance at the binomial one for
/// every workload period tried (simulated, from P/10 to 10 P); a quarter
/// left some near-commensurate periods with twice the variance.
const SPREAD: f64 = 0.5;

/// _IOW('$', 4, __u64)
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;

/// Opens a CPU-clock event on `cpu` firing every `period_ns`. Not while
/// the CPU idles: the program would run there for nothing (a thousand
/// runs a second per idle CPU at 1000 Hz, about 0.4 µs each measured here).
pub fn open_cpu_clock(cpu: i32, period_ns: u64) -> std::io::Result<OwnedFd> {
    let attr = PerfEventAttr { kind: PERF_TYPE_SOFTWARE, config: PERF_COUNT_SW_CPU_CLOCK, sample_period: period_ns, flags: EXCLUDE_IDLE, ..Default::default() };
    perf_event::open(attr, -1, cpu)
}

pub fn online_cpus() -> Result<Vec<i32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").context("failed to read /sys/devices/system/cpu/online")?;
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<i32>()?..=b.parse::<i32>()?);
    }
    Ok(cpus)
}

/// The sampling period for a rate, in ns.
pub fn period_ns(hz: u64) -> u64 {
    (1_000_000_000 / hz.max(1)).max(10_000)
}

/// A small fast generator (SplitMix64), seeded from the kernel: the draws
/// need to be unrelated to the target, not secret.
pub struct Random(u64);

impl Random {
    pub fn new() -> Self {
        let mut seed = [0u8; 8];
        // SAFETY: getrandom writes at most seed.len() bytes.
        let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
        let seed = if got == 8 { u64::from_ne_bytes(seed) } else { super::super::monotonic_ns() };
        Random(seed)
    }

    #[cfg(test)]
    pub fn seeded(seed: u64) -> Self {
        Random(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A period drawn around `mean`: uniform in [mean (1 - SPREAD), mean (1 + SPREAD)].
    pub fn around(&mut self, mean: f64) -> f64 {
        mean * (1.0 - SPREAD + 2.0 * SPREAD * self.unit())
    }
}

/// The re-arming plan, apart from the clock and the ioctls so that it can
/// be tested on its own: each window's period, and the rate correction.
pub struct Windows {
    period: f64,
    /// Samples per window.
    pub per_window: u32,
    /// Mean time lost per window (between the last sample and the re-arm),
    /// smoothed.
    lost: f64,
    random: Random,
}

impl Windows {
    pub fn new(hz: u64, random: Random) -> Self {
        let period = period_ns(hz) as f64;
        let per_window = (WINDOW.as_nanos() as f64 / period).ceil().max(1.0) as u32;
        Windows { period, per_window, lost: AFTER_LAST.as_nanos() as f64, random }
    }

    /// The next window's period, in ns: drawn around a mean shortened by
    /// the time lost per window, so that windows average `per_window`
    /// samples per `per_window` target periods.
    pub fn next_period(&mut self) -> u64 {
        let mean = (self.period - self.lost / self.per_window as f64).max(self.period * 0.75);
        (self.random.around(mean) as u64).max(10_000)
    }

    /// When to re-arm after arming with `period`: just after the window's
    /// last sample.
    pub fn window_ns(&self, period: u64) -> u64 {
        period * self.per_window as u64 + AFTER_LAST.as_nanos() as u64
    }

    /// Records how long after its window's last sample (at `period` ns) a
    /// re-arm came, `late` ns: the part that is not whole periods (those
    /// fired samples) was lost.
    pub fn observe(&mut self, late: u64, period: u64) {
        let lost = (late % period.max(1)) as f64;
        self.lost += (lost - self.lost) / 16.0;
    }
}

/// The threads that re-arm the events, one per CPU, until dropped. Each
/// runs on its CPU, where the ioctl is a local call (2.5 µs measured); from
/// another CPU it needs an IPI the caller spins on (8 µs here, far more on
/// a loaded virtual machine whose other vCPU is not running). A thread that
/// cannot be pinned (a cpuset without that CPU) re-arms from where it runs.
pub struct Rearming {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Rearming {
    /// Starts re-arming each CPU's event (a duplicate of the attached
    /// event's descriptor, owned by its thread: the links close theirs).
    /// `weights`: the BPF map of each CPU's sample weight (a duplicate of
    /// its descriptor, shared by the threads).
    pub fn start(events: Vec<(i32, OwnedFd)>, hz: u64, weights: OwnedFd) -> Result<Self> {
        crate::out_of_memory::ensure_room_for_threads(events.len())?;
        let mut rearming = Rearming { stop: Arc::new(AtomicBool::new(false)), threads: Vec::new() };
        let weights = Arc::new(weights);
        for (cpu, fd) in events {
            let stop = rearming.stop.clone();
            let weights = weights.clone();
            let thread = std::thread::Builder::new()
                .name(format!("pytrace-clock{cpu}"))
                .spawn(move || {
                    pin_to(cpu);
                    rearm(fd, cpu, &weights, Windows::new(hz, Random::new()), &stop)
                })
                .context("failed to start the sampling clock's threads")?;
            rearming.threads.push(thread);
        }
        Ok(rearming)
    }
}

impl Drop for Rearming {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

fn pin_to(cpu: i32) {
    // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn rearm(fd: OwnedFd, cpu: i32, weights: &OwnedFd, mut windows: Windows, stop: &AtomicBool) {
    let mean = windows.period as u64;
    while !stop.load(Ordering::SeqCst) {
        let period = windows.next_period();
        // SAFETY: the ioctl reads one u64 from the pointer. It fails only
        // for a CPU gone offline, whose event then no longer fires.
        unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_PERIOD, &period as *const u64) };
        // After the ioctl: its first sample comes a new period (at least
        // 50 µs) later, by when the weight is the new one.
        let (key, weight) = (cpu as u32, super::counts::weight_of(period, mean));
        // SAFETY: the map's keys and values are u32s. It fails only for a
        // CPU past MAX_WEIGHTED_CPUS, whose samples then count the mean.
        unsafe {
            libbpf_rs::libbpf_sys::bpf_map_update_elem(weights.as_raw_fd(), (&key as *const u32).cast(), (&weight as *const u32).cast(), 0);
        }
        let armed = Instant::now();
        let last_sample = armed + Duration::from_nanos(period * windows.per_window as u64);
        let rearm_at = armed + Duration::from_nanos(windows.window_ns(period));
        // Parked (a futex wait): the lightest wait that Drop can cut short.
        loop {
            let now = Instant::now();
            if now >= rearm_at || stop.load(Ordering::SeqCst) {
                break;
            }
            std::thread::park_timeout(rearm_at - now);
        }
        windows.observe(Instant::now().saturating_duration_since(last_sample).as_nanos() as u64, period);
    }
}

/// --idle: the ticks at which user space reads every thread.
pub struct IdleTicks {
    period: f64,
    next: Instant,
    random: Random,
    /// Ticks skipped because user space was late (a busy machine, or the
    /// previous pass long): what the targets ran meanwhile has fewer
    /// samples than its share by up to this many.
    pub missed: u64,
}

impl IdleTicks {
    pub fn new(hz: u64) -> Self {
        IdleTicks { period: period_ns(hz) as f64, next: Instant::now(), random: Random::new(), missed: 0 }
    }

    pub fn next(&self) -> Instant {
        self.next
    }

    /// The first tick is now.
    pub fn restart(&mut self) {
        self.next = Instant::now();
    }

    /// Moves to the next tick after one was taken at `now`; a tick missed
    /// (user space was late by more than a period) is not made up for.
    pub fn advance(&mut self, now: Instant) {
        self.next += Duration::from_nanos(self.random.around(self.period) as u64);
        if self.next < now {
            self.missed += 1 + ((now - self.next).as_nanos() as f64 / self.period) as u64;
            self.next = now + Duration::from_nanos(self.random.around(self.period) as u64);
        }
    }

    /// No tick before `at`: the ticks due before it are missed, and the
    /// next one is at `at`.
    pub fn not_before(&mut self, at: Instant) {
        if self.next >= at {
            return;
        }
        self.missed += 1 + ((at - self.next).as_nanos() as f64 / self.period) as u64;
        self.next = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks due before a pass may start again are missed, counted, and
    /// the next tick is then; a limit already past changes nothing.
    #[test]
    fn ticks_before_a_limit_are_counted_missed() {
        let mut ticks = IdleTicks::new(100);
        let t0 = ticks.next();
        ticks.not_before(t0 + Duration::from_millis(35));
        assert_eq!(ticks.missed, 4);
        assert_eq!(ticks.next(), t0 + Duration::from_millis(35));
        ticks.not_before(t0 + Duration::from_millis(20));
        assert_eq!(ticks.missed, 4);
        assert_eq!(ticks.next(), t0 + Duration::from_millis(35));
    }

    /// A workload periodic in time (period W): 60 % of each period in one
    /// function, 30 % in a second, 10 % in a third, as fixtures/cpu_split.py.
    fn function_at(t: f64, w: f64) -> usize {
        let phase = t.rem_euclid(w) / w;
        if phase < 0.6 {
            0
        } else if phase < 0.9 {
            1
        } else {
            2
        }
    }

    /// The instants the kernel would sample at under this plan, with a
    /// re-arm that comes `late` after each window's aim.
    fn instants(hz: u64, n: usize, seed: u64, late: impl Fn(&mut Random) -> f64) -> Vec<f64> {
        let mut windows = Windows::new(hz, Random::seeded(seed));
        let mut jitter = Random::seeded(seed ^ 0x5555);
        let mut t = 1e9 * jitter.unit();
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let period = windows.next_period();
            let rearm = t + windows.window_ns(period) as f64 + late(&mut jitter);
            // The event fires every period until the re-arm: k times, or
            // more when the re-arm is later than a period.
            let mut j = 1;
            while t + (j * period) as f64 <= rearm {
                out.push(t + (j * period) as f64);
                j += 1;
            }
            let last = t + (windows.per_window as u64 * period) as f64;
            windows.observe((rearm - last) as u64, period);
            t = rearm;
        }
        out.truncate(n);
        out
    }

    /// The plan against a periodic workload at every kind of rate: an exact
    /// multiple of the workload's period (10, 50 Hz against 100 Hz work),
    /// the same period, exact divisors (200, 500, 1000 Hz) and rates near
    /// them. A strictly periodic clock gives 100 % to one function at the
    /// exact ones. Each estimate is over 4,000 samples, whose binomial
    /// standard error for the 60 % share is 0.77 points; 200 estimates per
    /// rate. Asserted: no bias above 0.4 points (4 standard errors of the
    /// mean of 200), and a spread at most 1.3 times the binomial one (the
    /// windows correlate samples a little).
    #[test]
    fn periodic_work_gets_its_true_share_at_every_rate() {
        let w = 10e6; // 10 ms, in ns
        for hz in [10, 20, 33, 50, 97, 99, 100, 101, 125, 199, 200, 250, 499, 500, 997, 1000] {
            let (n, runs) = (4000, 200);
            let shares: Vec<f64> = (0..runs)
                .map(|run| {
                    let ts = instants(hz, n, hz * 1000 + run, |r| 30_000.0 + 200_000.0 * r.unit());
                    ts.iter().filter(|&&t| function_at(t, w) == 0).count() as f64 * 100.0 / n as f64
                })
                .collect();
            let mean = shares.iter().sum::<f64>() / runs as f64;
            let sd = (shares.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (runs - 1) as f64).sqrt();
            let binomial = (0.6f64 * 0.4 / n as f64).sqrt() * 100.0;
            assert!((mean - 60.0).abs() < 0.4, "{hz} Hz: mean share {mean:.2} %");
            assert!(sd < 1.3 * binomial, "{hz} Hz: spread {sd:.2} points, binomial {binomial:.2}");
        }
    }

    /// However late the re-arms come (here 30 µs to 3 ms), the mean rate
    /// stays the one asked for, within 1 %. Over 20,000 windows the mean
    /// of the drawn periods (each uniform over ±50 %, a standard deviation
    /// of 29 %) is off by 0.2 % (one standard error): 1 % is five.
    #[test]
    fn mean_rate_is_the_rate_asked_for() {
        for hz in [10, 99, 100, 250, 999, 1000] {
            for late_max in [0.0, 500_000.0, 3_000_000.0] {
                let n = 20_000 * Windows::new(hz, Random::seeded(1)).per_window as usize;
                let ts = instants(hz, n, hz, |r| 30_000.0 + late_max * r.unit());
                let rate = (n - 1) as f64 / ((ts[n - 1] - ts[0]) / 1e9);
                assert!((rate / hz as f64 - 1.0).abs() < 0.01, "{hz} Hz with re-arms up to {late_max} ns late: {rate:.1} Hz");
            }
        }
    }

    /// A count of samples estimates the CPU time of a target that runs in
    /// stretches (on CPU and off, each 50 ms on average, for 3 s) only if
    /// each sample counts for its window's period: counted equally, the
    /// estimate's spread over 300 runs is 8 % (a short-period window that
    /// the target happens to run through counts it at up to twice the
    /// rate). Weighted as BPF does (counts.rs's weight_of, each window's
    /// weight written at its re-arm): a spread of 0.2 %, every run within
    /// 3 %, unbiased.
    #[test]
    fn weighted_samples_measure_cpu_time_whichever_windows_the_target_runs_in() {
        use crate::tracing::sample::counts::{weight_of, SAMPLE_WEIGHT};
        let hz = 1000;
        let mean = period_ns(hz);
        let (mut unweighted, mut weighted) = (Vec::new(), Vec::new());
        for run in 0..300u64 {
            let mut stretches = Random::seeded(run ^ 0xabcd);
            let (mut t, mut on, mut cpu, mut intervals) = (0.0, run % 2 == 0, 0.0, Vec::new());
            while t < 3e9 {
                let d = (-50e6 * (1.0 - stretches.unit()).ln()).min(3e9 - t);
                if on {
                    intervals.push((t, t + d));
                    cpu += d;
                }
                t += d;
                on = !on;
            }
            let mut windows = Windows::new(hz, Random::seeded(run));
            let (mut t, mut i, mut count, mut weight) = (0.0, 0, 0u64, 0u64);
            while t < 3e9 {
                let period = windows.next_period();
                for _ in 0..windows.per_window {
                    t += period as f64;
                    while i < intervals.len() && intervals[i].1 < t {
                        i += 1;
                    }
                    if i < intervals.len() && intervals[i].0 <= t && t < intervals[i].1 {
                        count += 1;
                        weight += weight_of(period, mean) as u64;
                    }
                }
                t += AFTER_LAST.as_nanos() as f64;
            }
            let expected = cpu / mean as f64;
            unweighted.push(count as f64 / expected);
            weighted.push(weight as f64 / SAMPLE_WEIGHT as f64 / expected);
        }
        let spread = |v: &[f64]| {
            let m = v.iter().sum::<f64>() / v.len() as f64;
            (m, (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt())
        };
        let (m, sd) = spread(&weighted);
        assert!((m - 1.0).abs() < 0.005 && sd < 0.01, "weighted: mean {m:.4}, spread {sd:.4}");
        assert!(weighted.iter().all(|r| (r - 1.0).abs() < 0.03), "weighted: a run off by more than 3 %");
        let (_, sd) = spread(&unweighted);
        assert!(sd > 0.04, "unweighted spread {sd:.4}: the simulation no longer shows what weighting is for");
    }

    #[test]
    fn windows_last_about_500_ms() {
        assert_eq!(Windows::new(10, Random::seeded(1)).per_window, 5);
        assert_eq!(Windows::new(99, Random::seeded(1)).per_window, 50);
        assert_eq!(Windows::new(1000, Random::seeded(1)).per_window, 500);
        assert_eq!(Windows::new(1, Random::seeded(1)).per_window, 1);
    }
}
