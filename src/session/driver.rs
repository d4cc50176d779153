//! The one poll loop every subcommand's BPF session runs in: read the ring
//! buffers, give the session its periodic work, ask the command whether to
//! keep going, then stop the probes before anything is read, drain, and
//! collect. A session (src/tracing/) says only what it does at each step.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{RingBuffer, RingBufferBuilder};

use crate::tracing::Tracing;

/// The longest one wait for records lasts in a session without periodic
/// checks (each round is then its check): a stop (target exit, duration,
/// Ctrl-C) is seen within this. A session with checks waits for its next
/// one: a stop is only looked for there, and BPF wakes the loop early for
/// records that cannot wait (bpf/ring.bpf.h).
const POLL_AT_MOST: Duration = Duration::from_millis(100);

/// How early a periodic check may run: the ring buffer's wait counts whole
/// milliseconds.
const CHECK_SLACK: Duration = Duration::from_millis(1);

/// Runs `session`: calls `attached` once its ring buffers are read (the
/// command lets the target run there), then polls until `keep_going`
/// (asked with the session, to read the profile so far) says stop; ends
/// the traced window, runs `ending` (put back what the run changed in the
/// target, while the probes, which no longer count, are still attached:
/// nothing then waits on the kernel's detach), detaches, drains and
/// collects; all of it even if polling failed.
pub fn drive<T: Tracing>(
    session: T,
    attached: impl FnOnce(&T) -> Result<()>,
    mut keep_going: impl FnMut(&T) -> Result<bool>,
    ending: impl FnOnce(&T),
) -> Result<T::Data> {
    let what = session.what();
    let ring = match session.has_records() {
        true => {
            let mut builder = RingBufferBuilder::new();
            session.add_to(&mut builder)?;
            Some(builder.build()?)
        }
        false => None,
    };
    let polled = attached(&session).and_then(|()| poll(&session, ring.as_ref(), &what, &mut keep_going));
    session.stop_counting();
    ending(&session);
    session.detach();
    polled?;
    if let Some(ring) = &ring {
        ring.consume().with_context(|| format!("failed to drain the {what} ring buffer"))?;
    }
    drop(ring);
    session.finish()
}

/// The loop. The BPF side mostly does not wake us (bpf/ring.bpf.h), so each
/// round also consumes whatever arrived during the wait.
fn poll<T: Tracing>(session: &T, ring: Option<&RingBuffer>, what: &str, keep_going: &mut impl FnMut(&T) -> Result<bool>) -> Result<()> {
    let mut last_check: Option<Instant> = None;
    let mut interrupted = false;
    loop {
        // A check less than a millisecond away is made now: the ring
        // buffer's wait takes whole milliseconds and rounds down, so such a
        // wait returned at once, over and over, until the check was due (50
        // empty wake-ups a second of `sample`, measured with strace).
        if interrupted || last_check.is_none_or(|t| t.elapsed() + CHECK_SLACK >= session.check_every()) {
            last_check = Some(Instant::now());
            session.between_polls()?;
            if !keep_going(session)? {
                return Ok(());
            }
        }
        // Woken for the next check, and not before: waking in between only
        // to find nothing due cost `sample` 6 wake-ups a second, each about
        // 100 µs of CPU on a virtual machine.
        let mut timeout = match last_check.filter(|_| !session.check_every().is_zero()) {
            Some(checked) => session.check_every().saturating_sub(checked.elapsed()),
            None => POLL_AT_MOST,
        };
        if let Some(due) = session.next_due() {
            if Instant::now() >= due {
                session.run_due()?;
            }
            if let Some(due) = session.next_due() {
                timeout = timeout.min(due.saturating_duration_since(Instant::now()));
            }
        }
        interrupted = false;
        let Some(ring) = ring else {
            // Nothing to read: a stop signal is seen within the wait.
            std::thread::sleep(timeout);
            continue;
        };
        match ring.poll(timeout) {
            Ok(()) => {}
            // A signal (Ctrl-C) interrupted the wait: keep_going decides, now.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => interrupted = true,
            Err(e) => return Err(e).with_context(|| format!("failed to read the {what} ring buffer")),
        }
        ring.consume().with_context(|| format!("failed to read the {what} ring buffer"))?;
        session.after_poll();
    }
}
