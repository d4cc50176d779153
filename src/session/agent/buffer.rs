//! A destination's retry queue: the profiles it has not taken yet, at most
//! so many intervals and so many bytes. The sampler only ever adds (never
//! waits); the destination's push thread takes from the front, and drops
//! nothing until it has been delivered or given up on. When a new profile
//! would pass a cap the oldest go, each counted (`buffer_full`), so an
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
    /// Set at shutdown: the push thread delivers what it can until then.
    deadline: Option<Instant>,
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
        let size = item.pprof.len();
        if size > self.limits.bytes {
            self.metrics.dropped(Cause::BufferFull, 1);
            return;
        }
        while state.items.len() >= self.limits.intervals || state.bytes + size > self.limits.bytes {
            let Some(old) = state.items.pop_front() else { break };
            state.bytes -= old.pprof.len();
            self.metrics.dropped(Cause::BufferFull, 1);
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
            let gone = state.items.pop_front().map_or(0, |g| g.pprof.len());
            state.bytes -= gone;
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
        self.metrics.dropped(Cause::Shutdown, left);
        self.metrics.set_buffered(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn item(bytes: usize) -> Arc<Exported> {
        Arc::new(Exported { pid: 1, service: "s".into(), labels: BTreeMap::new(), start_unix_ns: 0, end_unix_ns: 0, pprof: vec![0; bytes] })
    }

    #[test]
    fn caps_drop_the_oldest_counted() {
        let metrics = Arc::new(DestinationMetrics::new("d"));
        let buffer = Buffer::new(BufferLimits { intervals: 3, bytes: 100 }, metrics.clone());
        for _ in 0..5 {
            buffer.push(item(10));
        }
        assert_eq!(metrics.dropped_by(Cause::BufferFull), 2);
        buffer.push(item(90));
        // 3 × 10 + 90 > 100: two more go, leaving one of 10 and the 90.
        assert_eq!(metrics.dropped_by(Cause::BufferFull), 4);
        buffer.push(item(101));
        assert_eq!(metrics.dropped_by(Cause::BufferFull), 5);
        let front = buffer.front().unwrap();
        buffer.remove(&front);
        assert_eq!(buffer.front().unwrap().pprof.len(), 90);
        buffer.shut_down(Instant::now());
        assert!(buffer.front().is_none());
        buffer.drop_rest();
        assert_eq!(metrics.dropped_by(Cause::Shutdown), 1);
    }
}
