//! Plain data every other layer shares: what a profile is made of
//! (`samples`), the one per-function call record outside BPF
//! (`functions`), gc's and imports' events (`events`), latencies as the kernel buckets them (`latency`),
//! counters with their kind (`counters`), and what the eval-frame hook
//! went through in a calls run (`hook`), a heap census (`heap`). Nothing here imports another
//! layer of pytrace: tracing produces these, reports read them.

pub mod counters;
pub mod events;
pub mod functions;
pub mod hook;
pub mod latency;
pub mod samples;
pub mod memory;
pub mod heap;
