//! A destination's retry queue: the profiles it has not taken yet, at most
//! so many intervals (each one profile per process) and so many bytes. The sampler only ever adds (never
//! waits); the destination's push thread takes from the front, and drops
//! nothing until it has been delivered or given up on. When a new profile
//! would pass a cap the oldest interval goes, each of its profiles counted
//! (`buffer_full`), so an
//! outage longer than the buffer loses its start, exactly counted, and
//! memory stays bounded whatever the destination does.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::config::BufferLimits;
use super::metrics::{Cause, DestinationMetrics};
use super::Exported;

pub struct Buffer {
    state: Mutex<State>,
    changed: Condvar,
    limits: BufferLimits,
    metrics: Arc<DestinationMetrics>,
}

#[derive(Default)]
struct State {
    items: VecDeque<Arc<Exported>>,
    bytes: usize,
    /// How many intervals `items` holds (they come in interval order).
    intervals: usize,
    /// Set at shutdown: the push thread delivers what it can until then.
    deadline: Option<Instant>,
}

impl State {
    fn pop_front(&mut self) {
        let Some(gone) = self.items.pop_front() else { return };
        self.bytes -= gone.bytes();
        if self.items.front().is_none_or(|f| f.interval != gone.interval) {
            self.intervals -= 1;
        }
    }
}

impl Buffer {
    pub fn new(limits: BufferLimits, metrics: Arc<DestinationMetrics>) -> Self {
        Buffer { state: Mutex::default(), changed: Condvar::new(), limits, metrics }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a profile, dropping the oldest (counted) past the caps; one
    /// larger than the whole byte cap is dropped itself.
    pub fn push(&self, item: Arc<Exported>) {
        let mut state = self.lock();
        let size = item.bytes();
        if size > self.limits.bytes {
            self.metrics.dropped(Cause::BufferFull, 1);
            return;
        }
        let new_interval = state.items.back().is_none_or(|back| back.interval != item.interval);
        while (new_interval && state.intervals >= self.limits.intervals) || state.bytes + size > self.limits.bytes {
            // The whole oldest interval goes.
            let Some(oldest) = state.items.front().map(|f| f.interval) else { break };
            while state.items.front().is_some_and(|f| f.interval == oldest) {
                state.pop_front();
                self.metrics.dropped(Cause::BufferFull, 1);
            }
        }
        if state.items.back().is_none_or(|back| back.interval != item.interval) {
            state.intervals += 1;
        }
        state.bytes += size;
        state.items.push_back(item);
        self.metrics.set_buffered(state.items.len(), state.bytes);
        self.changed.notify_all();
    }

    /// The oldest profile, waiting for one; None once shut down and empty,
    /// or past the shutdown deadline.
    pub fn front(&self) -> Option<Arc<Exported>> {
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.front() {
                if state.deadline.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                return Some(item.clone());
            }
            if state.deadline.is_some() {
                return None;
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Takes `item` off (delivered, or given up on), if still there.
    pub fn remove(&self, item: &Arc<Exported>) {
        let mut state = self.lock();
        if state.items.front().is_some_and(|front| Arc::ptr_eq(front, item)) {
            state.pop_front();
        }
        self.metrics.set_buffered(state.items.len(), state.bytes);
    }

    /// Waits `wait` before a retry, or less if the shutdown deadline comes
    /// first; says whether to retry.
    pub fn back_off(&self, wait: std::time::Duration) -> bool {
        let until = Instant::now() + wait;
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let end = state.deadline.map_or(until, |d| d.min(until));
            if now >= end {
                return state.deadline.is_none_or(|d| now < d);
            }
            state = self.changed.wait_timeout(state, end - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// No more profiles come: deliver until `deadline`.
    pub fn shut_down(&self, deadline: Instant) {
        self.lock().deadline = Some(deadline);
        self.changed.notify_all();
    }

    /// At exit: what is left is dropped, counted.
    pub fn drop_rest(&self) {
        let mut state = self.lock();
        let left = state.items.len() as u64;
        state.items.clear();
        state.bytes = 0;
        state.intervals = 0;
        self.metrics.dropped(Cause::Shutdown, left);
        self.metrics.set_buffered(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn item(interval: u64, bytes: usize) -> Arc<Exported> {
        Arc::new(Exported { interval, time: "cpu", pid: 1, service: "s".into(), labels: BTreeMap::new(), start_unix_ns: 0, end_unix_ns: 0, pprof: vec![0; bytes], otlp: None })
    }

    #[test]
    fn caps_drop_the_oldest_interval_counted() {
        let metrics = Arc::new(DestinationMetrics::new("d"));
        let buffer = Buffer::new(BufferLimits { intervals: 2, bytes: 100 }, metrics.clone());
        // Two profiles (processes) an interval, three intervals: the first goes.
        for interval in 1..=3 {
            buffer.push(item(interval, 10));
            buffer.push(item(interval, 10));
        }
        assert_eq!(metrics.dropped_by(Cause::BufferFull), 2);
        assert_eq!(buffer.front().unwrap().interval, 2);
        // 4 × 10 + 70 > 100: interval 2 goes, though the count would fit.
        buffer.push(item(3, 70));
        assert_eq!(metrics.dropped_by(Cause::BufferFull), 4);
        buffer.push(item(4, 101));
        assert_eq!(metrics.dropped_by(Cause::BufferFull), 5, "one larger than the cap is dropped itself");
        let front = buffer.front().unwrap();
        buffer.remove(&front);
        buffer.remove(&buffer.front().unwrap());
        assert_eq!(buffer.front().unwrap().bytes(), 70);
        buffer.shut_down(Instant::now());
        assert!(buffer.front().is_none());
        buffer.drop_rest();
        assert_eq!(metrics.dropped_by(Cause::Shutdown), 1);
    }
}
