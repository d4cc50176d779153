//! `pytrace sample --native` against fixtures whose split between C code and
//! Python is known, on both local 3.11 builds: Debian's (stripped, no frame
//! pointers, the interpreter in the executable, zlib built in) and the
//! probe-less build (libpython shared, zlib an extension module).

use crate::common::*;

/// A folded line's frames, outermost first, and its count.
fn parse(line: &str) -> (Vec<&str>, u64) {
    let (stack, n) = line.rsplit_once(' ').unwrap();
    (stack.split(';').collect(), n.parse().unwrap())
}

/// Python frames end in `(file)` (`(file:line)` with --lines), the file a
/// `.py` or `<frozen …>`-like; native ones in `(module)`; kernel frames
/// and markers have no parentheses.
fn is_python(frame: &str) -> bool {
    let Some((_, at)) = frame.strip_suffix(')').and_then(|f| f.rsplit_once(" (")) else { return false };
    let file = at.rsplit_once(':').filter(|(_, line)| line.parse::<u32>().is_ok()).map_or(at, |(file, _)| file);
    file.ends_with(".py") || file.starts_with('<')
}

fn is_native(frame: &str) -> bool {
    frame.ends_with(')') && frame.contains(" (") && !is_python(frame)
}

/// `sample --native` by PID of `script` (run 9 s, `args` added, its CPU
/// split written into `dir`) for 6 s at the native rate, from its first
/// measured round: the paths of the CPU split, the folded profile and the
/// JSON report, once both ended well.
fn sample_native_run(label: &str, python: &std::path::Path, script: &str, args: &[&str], dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (cpu_split, folded, json) = (dir.join("cpu-split.json"), dir.join("p.folded"), dir.join("p.json"));
    let seconds = longer(9.0);
    let mut script_args = vec!["--seconds", &seconds, "--cpu-split", cpu_split.to_str().unwrap()];
    script_args.extend(args);
    let mut target = start_waiting(python, script, &script_args);
    let tracer = start_tracer(&[
        "sample", "-p", &target.pid().to_string(), "-r", &native_rate().to_string(), "-d", &longer(6.0), "--native",
        "--folded", folded.to_str().unwrap(), "--json", json.to_str().unwrap(),
    ]);
    signal(target.pid(), libc::SIGUSR1);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{label}: {stderr}");
    assert!(target.0.wait().unwrap().success(), "{label}: the target failed");
    (cpu_split, folded, json)
}

/// libz's deflate runs inside zlib.compress, called from compress_work: its
/// frames must come after compress_work (further from the root) with no
/// Python frame after them. The fixture spends as much CPU in compress_work
/// as in spin_work and measures both, and the part of compress_work's
/// inside zlib.compress (`--cpu-split`); the shares of compress_work and
/// of libz under it must be those (common's assert_native_split: four
/// standard errors plus a point). Of compress_work's samples outside its
/// clock reads (time.process_time: libc's and the vDSO's clock_gettime, a
/// system call for this clock, which emulation in scripts/kernels.sh's VMs
/// makes as dear as a deflate call), all but its own loop and zlib's glue
/// around libz (about 3.5 %, measured; 5 to 6 % under emulation) have libz
/// frames above it: at least 95 % (90 in a VM). libz's exported functions (deflate, deflateInit2_, deflateEnd) are
/// in its dynamic symbol table, so the way into libz is named even though
/// the file is stripped. At 999 Hz for 6 s there are up to 6000 samples; in
/// the VMs, at the rate their user space keeps up with (common's
/// native_rate), for 15 s about 1500.
#[test]
fn native_frames_sit_between_the_python_caller_and_the_leaf() {
    // Both CPUs for its target, or the sample counts it relies on drop.
    let _machine = alone();
    for (label, python) in pythons() {
        let dir = tempfile::tempdir().unwrap();
        let (cpu_split, folded, json) = sample_native_run(label, &python, "native_split.py", &[], dir.path());
        let (mut split, mut named_entry, mut in_clock, mut incomplete) = (NativeSplit::default(), 0, 0, 0);
        let mut libz_whole = 0;
        for line in std::fs::read_to_string(&folded).unwrap().lines() {
            let (frames, n) = parse(line);
            if let Some(at) = frames.iter().position(|f| f.starts_with("compress_work (")) {
                split.compress += n;
                let above = &frames[at + 1..];
                let libz = above.iter().position(|f| f.contains(" (libz.so"));
                if in_zlib_call(above) {
                    split.in_call += n;
                }
                if above.iter().any(|f| f.starts_with("clock_gettime (")) {
                    in_clock += n;
                } else if frames.contains(&"[native stack incomplete]") {
                    incomplete += n;
                }
                if let Some(z) = libz {
                    assert!(!above[z..].iter().any(|f| is_python(f)), "{label}: a Python frame above libz: {line}");
                    assert!(frames[..at].iter().any(|f| f.starts_with("main (")), "{label}: main below compress_work: {line}");
                    split.in_libz += n;
                    if !frames.contains(&"[native stack incomplete]") {
                        libz_whole += n;
                    }
                    named_entry += if above[z].starts_with("libz.so") && above[z].contains("+0x") { 0 } else { n };
                }
            }
            if frames.iter().any(|f| f.starts_with("spin_work (")) {
                split.spin += n;
            }
        }
        let total = (split.compress + split.spin) as f64;
        // In a VM, at its lower rate and with its late timers, about 1,000.
        let min_samples = if slowdown() > 1.0 { 400.0 } else { 1000.0 };
        assert!(total > min_samples, "{label}: only {total} samples");
        assert_native_split(label, &split, &cpu_split);
        // Of those whose native stack was unwound to its end (the others are
        // counted below).
        let whole = split.compress - in_clock - incomplete;
        // zlib.compress's own glue (its output's allocation, whose page
        // faults emulation makes dear) read 5.1 and 6.3 % in the VMs.
        let in_c = libz_whole as f64 / whole as f64 * 100.0;
        let at_least = if slowdown() > 1.0 { 90.0 } else { 95.0 };
        assert!(in_c >= at_least, "{label}: libz above compress_work in {in_c:.1}% of its {whole} samples outside clock reads unwound to the end, expected {at_least}% or more ({incomplete} incomplete)");
        assert!(named_entry as f64 >= split.in_libz as f64 * 0.99, "{label}: the way into libz named in {named_entry} of {}", split.in_libz);
        // Merging failed for almost none (only start-up, before the thread
        // state exists, or a sample caught entering an eval call), and
        // almost no record was lost to a full ring buffer (losses, which
        // come in bursts, would skew the shares above).
        let report = read_report(&json);
        let counters = &report["counters"];
        let failed: u64 = ["lost", "native_unmatched", "native_unwind_lost", "native_stack_cut", "native_unavailable"]
            .iter()
            .map(|c| counters[*c].as_u64().unwrap_or_else(|| panic!("{label}: no counter {c}")))
            .sum();
        let incomplete_stacks: Vec<String> = std::fs::read_to_string(&folded).unwrap().lines().filter(|l| l.contains("[native stack incomplete]")).take(5).map(str::to_string).collect();
        assert!((failed as f64) < total * 0.01, "{label}: {failed} of {total} samples not merged: {counters}; incomplete stacks: {incomplete_stacks:#?}");
        assert_eq!(report["lost_events"], 0, "{label}");
    }
}

/// Without --native nothing changes: only Python frames, and none of the
/// --native counters.
#[test]
fn without_native_only_python_frames_are_shown() {
    // Both CPUs for its target, or the sample counts it relies on drop.
    let _machine = alone();
    let (label, python) = pythons().remove(1);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let out = pytrace(&[
        "sample", "-r", "499", "--folded", "-", "--json", json.to_str().unwrap(), "--",
        python.to_str().unwrap(), &fixture("native_split.py"), "--seconds", "1",
    ]);
    assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let (frames, _) = parse(line);
        assert!(frames.iter().all(|f| is_python(f) || *f == "[no Python code]" || *f == "[unreadable frame]"), "{label}: {line}");
    }
    let counters: Vec<String> = read_report(&json)["counters"].as_object().unwrap().keys().cloned().collect();
    assert!(counters.iter().any(|c| c == "lost") && !counters.iter().any(|c| c.starts_with("native_")), "{label}: {counters:?}");
}

/// --native with --kernel: a system call's kernel frames sit above the
/// native frame that made it (libc's, the vDSO's, the dynamic loader's),
/// never above a Python frame; with --threads each stack is rooted at its
/// thread. The user registers of a sample that interrupted the kernel come
/// from bpf_task_pt_regs (5.15), or before it from the top of the thread's
/// kernel stack: almost no sample goes without (native_no_user_regs: only
/// a kernel thread's, or the `--` target's before it runs Python).
#[test]
fn kernel_frames_go_above_the_native_frames_that_entered_the_kernel() {
    // Both CPUs for its target, or the sample counts it relies on drop.
    let _machine = alone();
    kernel_frames_above_native_frames(&[]);
}

/// The same by the kernel stack's top on kernels that have
/// bpf_task_pt_regs, as 5.10 does (Debian 11's kernel runs it natively in
/// scripts/kernels.sh's VM).
#[test]
fn kernel_frames_go_above_the_native_frames_without_bpf_task_pt_regs() {
    // Both CPUs for its target, or the sample counts it relies on drop.
    let _machine = alone();
    kernel_frames_above_native_frames(&[("PYTRACE_NO_TASK_PT_REGS", "1")]);
}

fn kernel_frames_above_native_frames(envs: &[(&str, &str)]) {
    let (label, python) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let out = std::process::Command::new(PYTRACE)
        .args([
            "sample", "-r", "499", "--native", "--kernel", "--threads", "--folded", "-", "--json", json.to_str().unwrap(), "--",
            python.to_str().unwrap(), &fixture("native_split.py"), "--seconds", "1.5",
        ])
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{label} {envs:?}: {}", String::from_utf8_lossy(&out.stderr));
    let folded = String::from_utf8(out.stdout).unwrap();
    let (mut syscalls, mut total) = (0, 0);
    for line in folded.lines() {
        let (frames, n) = parse(line);
        total += n;
        let thread = frames[0].rsplit_once(" (").is_some_and(|(_, tid)| tid.trim_end_matches(')').parse::<u32>().is_ok());
        assert!(thread, "{label} {envs:?}: the thread first: {line}");
        // spin_work's time.process_time() is a real system call, made by
        // the vDSO's clock_gettime for a clock it cannot read itself.
        if let Some(entry) = frames.iter().position(|f| *f == "entry_SYSCALL_64_after_hwframe") {
            assert!(is_native(frames[entry - 1]), "{label} {envs:?}: {line}");
            assert!(!frames[entry..].iter().any(|f| is_python(f) || is_native(f)), "{label} {envs:?}: {line}");
            syscalls += n;
        }
    }
    assert!(syscalls > 50, "{label} {envs:?}: only {syscalls} samples in system calls");
    let without = read_report(&json)["counters"]["native_no_user_regs"].as_u64().unwrap_or_else(|| panic!("{label}: no native_no_user_regs counter"));
    assert!((without as f64) < total as f64 * 0.01, "{label} {envs:?}: {without} of {total} samples without user registers");
}

/// --idle --native: a thread blocked in time.sleep shows the libc call it
/// waits in above its Python frame (its registers were saved when it
/// entered the kernel).
#[test]
fn idle_shows_where_a_sleeping_thread_waits() {
    // Both CPUs for its target, or the sample counts it relies on drop.
    let _machine = alone();
    let (label, python) = pythons().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let out = pytrace(&[
        "sample", "-r", "199", "--idle", "--native", "--folded", "-", "--json", json.to_str().unwrap(), "--",
        python.to_str().unwrap(), &fixture("sleep_and_spin.py"), "2",
    ]);
    assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
    let (mut sleeper, mut in_libc) = (0, 0);
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let (frames, n) = parse(line);
        if let Some(at) = frames.iter().position(|f| f.starts_with("sleeper (")) {
            sleeper += n;
            if frames[at + 1..].iter().any(|f| f.ends_with("(libc.so.6)")) {
                in_libc += n;
            }
        }
    }
    assert!(sleeper > 100, "{label}: only {sleeper} samples of the sleeper");
    assert!(in_libc as f64 >= sleeper as f64 * 0.9, "{label}: libc above sleeper in {in_libc} of {sleeper}");
    assert!(read_report(&json)["counters"]["native_on_cpu"].is_u64(), "{label}: running threads are counted");
}

/// A native function with no symbol (Debian's python3.11 is stripped) is
/// named where it is, `python3.11+0x645690`, in the table: never a bare
/// address with a line of 0 (`0x645690 (python3.11:0)`), nor the module
/// twice. At least one such frame must show, so the check is not empty.
#[test]
fn unnamed_native_functions_are_module_plus_offset_in_the_table() {
    let _machine = shared();
    let out = pytrace(&["sample", "--native", "-r", "499", "--top", "300", "--", "/usr/bin/python3.11", &fixture("native_split.py"), "--cpu-seconds", &longer(1.0)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = table.lines().filter(|l| l.contains('%')).collect();
    let unnamed = rows.iter().filter(|l| l.split_whitespace().nth(2).is_some_and(|f| f.starts_with("python3.11+0x") && !l.contains(" ("))).count();
    assert!(unnamed >= 1, "no unnamed function of the stripped interpreter:\n{table}");
    for row in rows {
        assert!(!row.contains(":0)") && !row.split_whitespace().nth(2).is_some_and(|f| f.starts_with("0x")), "{row}");
    }
}

/// The Python of scripts/test-tools.sh's numpy venv (numpy's wheel, with
/// its own OpenBLAS); missing, the test fails, never skips.
fn numpy_python() -> std::path::PathBuf {
    let viewers = std::env::var("PYTRACE_VIEWERS").unwrap_or_else(|_| "/var/cache/pytrace/viewers".into());
    let python = std::path::PathBuf::from(viewers).join("numpy/bin/python");
    assert!(python.exists(), "numpy's venv is missing: run scripts/test-tools.sh");
    python
}

/// numpy's OpenBLAS kernels (dgemm_kernel_HASWELL...) are hand-written
/// assembly without unwind entries: their callers are found by the checked
/// stack scan (src/native/scan.rs). fixtures/numpy_blas.py calls np.dot from
/// matmul_work and np.linalg.solve from solve_work (through numpy's
/// _linalg.py `solve`), and spins in spin_work, each for the same CPU time
/// of its thread, which it measures. With one BLAS thread every BLAS sample
/// is on the main thread: at least 100 of them (999 Hz for 6 s gives about
/// 4,000), and at least 70 % unwound whole to their right Python caller
/// (32 % before the scan; measured 81.5 and 82.5 % with it: the misses are
/// dgemm_kernel_HASWELL under LAPACK's solve path, whose caller no scan
/// finds, and their part moves with how much of the run solve takes),
/// none to a wrong one; matmul_work's share of the three functions'
/// samples is its share of their CPU time within 10 points. With four,
/// OpenBLAS's workers run part of the work: their samples carry
/// `[thread started by native code]` and no Python frame. In both, every
/// `[native stack incomplete]` sample is counted under a cause.
#[test]
fn blas_frames_unwind_to_their_python_caller() {
    // Both CPUs for its target, or the sample counts it relies on drop.
    let _machine = alone();
    let python = numpy_python();
    for threads in ["1", "4"] {
        let label = format!("OPENBLAS_NUM_THREADS={threads}");
        let dir = tempfile::tempdir().unwrap();
        let (cpu_split, folded, json) = sample_native_run(&label, &python, "numpy_blas.py", &["--blas-threads", threads], dir.path());
        let (mut main_blas, mut right, mut wrong, mut workers, mut incomplete) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut matmul, mut solve, mut spin) = (0u64, 0u64, 0u64);
        let mut wrong_lines = Vec::new();
        for line in std::fs::read_to_string(&folded).unwrap().lines() {
            let (frames, n) = parse(line);
            let has = |name: &str| frames.iter().any(|f| f.starts_with(name));
            matmul += if has("matmul_work (") { n } else { 0 };
            solve += if has("solve_work (") { n } else { 0 };
            spin += if has("spin_work (") { n } else { 0 };
            let is_incomplete = frames.contains(&"[native stack incomplete]");
            incomplete += if is_incomplete { n } else { 0 };
            let Some(blas) = frames.iter().position(|f| f.contains(" (libscipy_openblas64_")) else { continue };
            if frames.contains(&"[thread started by native code]") {
                assert!(!frames.iter().any(|f| is_python(f)), "{label}: a Python frame on a native thread: {line}");
                workers += n;
                continue;
            }
            main_blas += n;
            // Not merged (counted in native_unmatched): no caller claimed.
            if is_incomplete || frames.contains(&"[native stack unmatched]") {
                continue;
            }
            // The innermost Python frame below the first BLAS frame.
            let caller = frames[..blas].iter().rev().find(|f| is_python(f)).copied().unwrap_or("");
            let solve_under = frames[..blas].iter().any(|f| f.starts_with("solve_work ("));
            if caller.starts_with("matmul_work (") || (caller.starts_with("solve (") && solve_under) {
                right += n;
            } else {
                wrong += n;
                wrong_lines.push(line.to_string());
            }
        }
        let counters = &read_report(&json)["counters"];
        let counter = |c: &str| counters[c].as_u64().unwrap_or_else(|| panic!("{label}: no counter {c}"));
        let causes = counter("native_no_unwind_info") + counter("native_stack_cut") + counter("native_unwind_lost");
        assert_eq!(incomplete, causes, "{label}: incomplete samples and their causes: {counters}");
        assert!(wrong == 0, "{label}: {wrong} BLAS samples under a wrong caller: {:#?}", &wrong_lines[..wrong_lines.len().min(5)]);
        assert!(main_blas >= 100, "{label}: only {main_blas} BLAS samples on the main thread");
        if threads == "1" {
            assert_eq!(workers, 0, "{label}");
            let share = right as f64 / main_blas as f64 * 100.0;
            assert!(share >= 70.0, "{label}: {right} of {main_blas} BLAS samples ({share:.1}%) unwound to their Python caller: {counters}");
        } else {
            assert!(workers > 0, "{label}: no sample of OpenBLAS's worker threads: {counters}");
            assert_eq!(counter("native_threads"), workers, "{label}");
        }
        let split = read_json(&cpu_split);
        let cpu = |f: &str| split[f].as_f64().unwrap();
        let expected = cpu("matmul_work") / (cpu("matmul_work") + cpu("solve_work") + cpu("spin_work")) * 100.0;
        let sampled = matmul as f64 / (matmul + solve + spin) as f64 * 100.0;
        assert!((sampled - expected).abs() <= 10.0, "{label}: matmul_work has {sampled:.1}% of the samples, {expected:.1}% of the CPU");
    }
}
