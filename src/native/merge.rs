//! Putting a sample's native frames between its Python frames, the way
//! py-spy --native does: each `_PyEval_EvalFrameDefault` native frame is
//! replaced by the Python frames that C-level call was running, and every
//! other native frame (a C extension, libc, the interpreter's own C code)
//! stays where it is between them.
//!
//! Which Python frames belong to one eval call comes from BPF (bpf/sample.h,
//! `entry`): on 3.9 and 3.10 every frame is its own call; from 3.11 one call
//! runs several frames (calls from Python to Python are inlined), and the
//! outermost of them is flagged. Both stacks are innermost first here. When
//! the count of eval frames and of calls disagree the frames are never
//! paired by guess: the whole native stack goes below the Python stack,
//! under a marker.

use std::rc::Rc;

use crate::model::samples::Frame;

/// How a native unwind ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// At the thread's first frame (`_start`, `clone3`): the stack is whole.
    Complete,
    /// Early: the copied stack ran out, or code without unwind information.
    Early,
}

/// A native frame and whether it is a `_PyEval_EvalFrameDefault` call.
#[derive(Debug, Clone)]
pub struct NativeFrame {
    pub frame: Rc<Frame>,
    pub is_eval: bool,
}

/// What merging made of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every eval frame replaced by its Python frames.
    Merged,
    /// Merged as far as the native stack went; the rest of the Python
    /// frames follow a `[native stack incomplete]` marker.
    Incomplete,
    /// The counts disagree: native frames below the Python ones, unpaired.
    Unmatched,
}

/// One sample's Python frames, innermost first, with what BPF recorded.
pub struct PythonStack<'a> {
    pub frames: &'a [Rc<Frame>],
    /// entry[i]: frame i began its C-level eval call.
    pub entry: &'a [bool],
    /// More Python frames exist outside the recorded ones.
    pub truncated: bool,
}

/// The Python frames split into the frames of each C-level eval call,
/// innermost call first, each call's frames innermost first.
fn eval_calls<'a>(python: &PythonStack<'a>) -> Vec<&'a [Rc<Frame>]> {
    let mut calls = Vec::new();
    let mut start = 0;
    for i in 0..python.frames.len() {
        if python.entry.get(i).copied().unwrap_or(false) {
            calls.push(&python.frames[start..=i]);
            start = i + 1;
        }
    }
    if start < python.frames.len() {
        // The outermost recorded frames without their entry frame: the
        // record was cut there, and they belong to the next eval call out.
        calls.push(&python.frames[start..]);
    }
    calls
}

/// The sample's frames, innermost first, and how they were put together.
/// `markers` are the frames for `[truncated]`, `[native stack incomplete]`
/// and `[native stack unmatched]`.
pub fn merge(python: &PythonStack, native: &[NativeFrame], end: End, markers: &Markers) -> (Vec<Rc<Frame>>, Outcome) {
    let calls = eval_calls(python);
    let evals = native.iter().filter(|f| f.is_eval).count();
    let native_more = end == End::Early;
    // What each side may be missing decides which counts are consistent:
    // a stack that ended early has fewer eval frames than there are calls,
    // a Python record cut at its depth limit has fewer calls than evals.
    let consistent = match (native_more, python.truncated) {
        (false, false) => evals == calls.len(),
        (true, false) => evals <= calls.len(),
        (false, true) => evals >= calls.len(),
        (true, true) => true,
    };
    let mut out = Vec::with_capacity(python.frames.len() + native.len() + 2);
    if !consistent {
        out.extend(python.frames.iter().cloned());
        if python.truncated {
            out.push(markers.truncated.clone());
        }
        out.push(markers.unmatched.clone());
        out.extend(native.iter().map(|f| f.frame.clone()));
        if native_more {
            out.push(markers.incomplete.clone());
        }
        return (out, Outcome::Unmatched);
    }
    let paired = evals.min(calls.len());
    let mut matched = 0;
    for f in native {
        if !f.is_eval {
            out.push(f.frame.clone());
            continue;
        }
        if matched == paired {
            // Eval calls outside the recorded Python frames: what lies
            // outside them is not known, and is cut at [truncated].
            break;
        }
        out.extend(calls[matched].iter().cloned());
        matched += 1;
    }
    let mut outcome = Outcome::Merged;
    if native_more {
        out.push(markers.incomplete.clone());
        outcome = Outcome::Incomplete;
    }
    for call in &calls[paired..] {
        out.extend(call.iter().cloned());
    }
    if python.truncated {
        // Native frames outside the outermost recorded call are dropped
        // with the Python frames they were between.
        let cut = out.iter().rposition(|f| python.frames.last().is_some_and(|last| Rc::ptr_eq(f, last)));
        if let Some(i) = cut {
            out.truncate(i + 1);
        }
        out.push(markers.truncated.clone());
    }
    (out, outcome)
}

/// The marker frames merging adds, shared by every sample.
pub struct Markers {
    pub truncated: Rc<Frame>,
    pub incomplete: Rc<Frame>,
    pub unmatched: Rc<Frame>,
}

impl Default for Markers {
    fn default() -> Self {
        Markers {
            truncated: Rc::new(Frame::Truncated),
            incomplete: Rc::new(Frame::NativeIncomplete),
            unmatched: Rc::new(Frame::NativeUnmatched),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::profile::label;

    fn py(name: &str) -> Rc<Frame> {
        Rc::new(Frame::Python { name: name.into(), file: "f.py".into(), line: 1, first_line: 1 })
    }

    fn c(name: &str) -> NativeFrame {
        NativeFrame { frame: Rc::new(Frame::Native { name: name.into(), module: "m.so".into() }), is_eval: name == "eval" }
    }

    /// Labels outermost first, as the reports show them, without modules.
    fn names(frames: &[Rc<Frame>]) -> Vec<String> {
        frames.iter().rev().map(|f| label(f).replace(" (f.py:1)", "").replace(" (m.so)", "")).collect()
    }

    fn run(py_frames: &[&str], entry: &[bool], truncated: bool, native: &[&str], end: End) -> (Vec<String>, Outcome) {
        let frames: Vec<Rc<Frame>> = py_frames.iter().map(|n| py(n)).collect();
        let native: Vec<NativeFrame> = native.iter().map(|n| c(n)).collect();
        let (out, outcome) = merge(&PythonStack { frames: &frames, entry, truncated }, &native, end, &Markers::default());
        (names(&out), outcome)
    }

    /// 3.11: main() calls work() inline (one eval call), work() calls
    /// zlib.compress, which calls deflate; a second eval call (a callback
    /// from C) runs cb(). Innermost first throughout.
    #[test]
    fn each_eval_frame_becomes_its_python_frames_with_c_frames_between() {
        let (out, outcome) = run(
            &["cb", "work", "main"],
            &[true, false, true],
            false,
            &["deflate_slow", "deflate", "eval", "call_cb", "zlib_compress", "eval", "main", "_start"],
            End::Complete,
        );
        assert_eq!(outcome, Outcome::Merged);
        assert_eq!(out, ["_start", "main", "main", "work", "zlib_compress", "call_cb", "cb", "deflate", "deflate_slow"]);
    }

    /// 3.9/3.10: every Python frame is an eval call of its own.
    #[test]
    fn one_frame_per_eval_call_before_3_11() {
        let (out, outcome) = run(&["b", "a"], &[true, true], false, &["eval", "call", "eval", "main"], End::Complete);
        assert_eq!(outcome, Outcome::Merged);
        assert_eq!(out, ["main", "a", "call", "b"]);
    }

    #[test]
    fn mismatched_counts_put_native_frames_below_a_marker() {
        // Two eval frames, one eval call: caught mid-entry, never guessed.
        let (out, outcome) = run(&["b", "a"], &[false, true], false, &["eval", "call", "eval", "main"], End::Complete);
        assert_eq!(outcome, Outcome::Unmatched);
        assert_eq!(out, ["main", "eval", "call", "eval", "[native stack unmatched]", "a", "b"]);
    }

    #[test]
    fn an_early_end_pairs_the_inner_calls_and_marks_the_rest() {
        // The unwind stopped after the inner eval frame: a (outer call) is
        // placed outside the marker.
        let (out, outcome) = run(&["b", "a"], &[true, true], false, &["leaf", "eval", "call"], End::Early);
        assert_eq!(outcome, Outcome::Incomplete);
        assert_eq!(out, ["a", "[native stack incomplete]", "call", "b", "leaf"]);
        // More eval frames than calls cannot come from an early end.
        let (_, outcome) = run(&["b"], &[true], false, &["eval", "eval"], End::Early);
        assert_eq!(outcome, Outcome::Unmatched);
    }

    #[test]
    fn a_truncated_python_stack_drops_native_frames_outside_it() {
        // 256 recorded frames of a deeper 3.9 recursion: the outer eval
        // frames have no recorded Python frames.
        let (out, outcome) = run(&["c", "b"], &[true, true], true, &["leaf", "eval", "eval", "eval", "main"], End::Complete);
        assert_eq!(outcome, Outcome::Merged);
        assert_eq!(out, ["[truncated]", "b", "c", "leaf"]);
        // 3.11: one inlined call deeper than the record keeps its eval
        // frame's inner side and drops main.
        let (out, _) = run(&["c", "b"], &[false, false], true, &["eval", "main"], End::Complete);
        assert_eq!(out, ["[truncated]", "b", "c"]);
    }

    #[test]
    fn a_thread_without_python_keeps_its_native_stack() {
        let (out, outcome) = run(&[], &[], false, &["poll", "worker", "start_thread"], End::Complete);
        assert_eq!(outcome, Outcome::Merged);
        assert_eq!(out, ["start_thread", "worker", "poll"]);
    }
}
