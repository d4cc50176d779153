//! `sample --native`'s merged stacks against gdb's backtrace of the same
//! process: the ground truth for the native unwinder, today's (framehop in
//! user space) and the kernel's planned in docs/design/native-unwind.md.
//! Each target (fixtures/native_truth.py) spins forever where it is, so the
//! stack every sample catches is the one gdb walks once pytrace is done:
//! `gdb -batch -p PID` with fixtures/gdb_frames.py (its physical frames,
//! inlined and inferred tail-call frames skipped), which then detaches and
//! leaves the target running.
//!
//! gdb's frames from the leaf to the outermost interpreter loop
//! (`_PyEval_EvalFrameDefault`), each loop frame replaced by the Python
//! frames the fixture says that C-level call runs, are the stack every
//! sample must have from its outermost Python frame on. (The interpreter's
//! start-up frames below the outermost Python frame are not compared:
//! libc's names there depend on whether its detached debug symbols, which
//! gdb reads, are installed.) A native frame is the same when it is in the
//! same file and named the same, less the suffixes the compiler adds to a
//! function's clones and parts (`.isra.0`, `.cold`, `.localalias`); where
//! pytrace has no name (a stripped file: `libffi.so.8.1.2+0x6250`) the
//! address gdb gives must be inside the unwind entry that starts there,
//! read with readelf.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::common::*;

/// At least this many samples per run. Only the target's CPU time is
/// sampled: 999 Hz for 4 s gives up to 4,000; 1,130 to 1,500 were
/// measured with two of these tests at once on this machine's two CPUs,
/// shared with other work (a load average of 6), and 440 to 696 with
/// three CPU-bound neighbours more (a load average of 7 to 10).
const MIN_SAMPLES: u64 = 200;

/// Of them, at least this share must have gdb's stack.
const MIN_AGREEMENT: f64 = 0.90;

/// One frame of gdb's backtrace.
struct GdbFrame {
    /// gdb's name for its function, None for `??`.
    name: Option<String>,
    /// The file holding the pc, its links resolved.
    file: PathBuf,
    /// The link-time address to look the frame up by: the pc less the
    /// file's load bias, less one for a return address (to fall in the call).
    svma: u64,
}

/// gdb's frames of `pid`'s thread, innermost first.
fn gdb_frames(pid: u32) -> Vec<GdbFrame> {
    let out = Command::new("timeout")
        .args(["120", "gdb", "-nx", "-batch", "-iex", "set debuginfod enabled off", "-iex", "set auto-load python-scripts off"])
        .args(["-p", &pid.to_string(), "-x", &fixture("gdb_frames.py")])
        .output()
        .unwrap_or_else(|e| panic!("gdb: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "gdb failed (installed by scripts/install.sh): {stdout}{stderr}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut frames = Vec::new();
    for line in stdout.lines().filter_map(|l| l.strip_prefix("FRAME ")) {
        let mut fields = line.splitn(3, ' ');
        let (pc, file, name) = (fields.next().unwrap(), fields.next().unwrap(), fields.next().unwrap());
        let pc = u64::from_str_radix(pc.trim_start_matches("0x"), 16).unwrap();
        let file = std::fs::canonicalize(file).unwrap_or_else(|_| PathBuf::from(file));
        let lookup = if frames.is_empty() { pc } else { pc - 1 };
        let svma = lookup - load_bias(&maps, &file);
        frames.push(GdbFrame { name: (name != "??").then(|| name.to_string()), file, svma });
    }
    assert!(!frames.is_empty(), "no frame from gdb: {stdout}{stderr}");
    frames
}

/// Where `file` is loaded in a process whose /proc/PID/maps is `maps`: the
/// start of its mapping at file offset 0, whose link-time address is 0 in
/// a shared object or a PIE executable (their first PT_LOAD segment).
fn load_bias(maps: &str, file: &Path) -> u64 {
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[2] == "00000000" && Path::new(f[5]) == file).then(|| u64::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap())
        })
        .min()
        .unwrap_or_else(|| panic!("{} is not mapped at offset 0", file.display()))
}

/// A function's name less what the compiler adds to it for its clones,
/// split-off parts and local aliases (C names have no dots).
fn base(name: &str) -> &str {
    name.split('.').next().unwrap()
}

/// The unwind entries (FDEs) of each file, as readelf reads them.
#[derive(Default)]
struct UnwindEntries(HashMap<PathBuf, Vec<(u64, u64)>>);

impl UnwindEntries {
    /// The start of the unwind entry covering `svma` in `file`.
    fn start(&mut self, file: &Path, svma: u64) -> Option<u64> {
        let entries = self.0.entry(file.to_path_buf()).or_insert_with(|| {
            let out = Command::new("readelf").arg("--debug-dump=frames").arg(file).output().expect("readelf (binutils, with gcc)");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_once(" FDE ")?.1.split_once("pc=")?.1.split_once(".."))
                .map(|(a, b)| (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b.trim(), 16).unwrap()))
                .collect()
        });
        entries.iter().find(|(a, b)| (*a..*b).contains(&svma)).map(|(a, _)| *a)
    }
}

/// One frame of the stack a sample must have.
enum Want<'a> {
    Native(&'a GdbFrame),
    /// A Python frame's folded label, `name (file)` (with --full-paths).
    Python(String),
}

/// A Python frame as the fixture reports it.
#[derive(serde::Deserialize)]
struct PyFrame {
    name: String,
    file: String,
}

/// gdb's frames from the leaf to its outermost interpreter loop, each loop
/// frame replaced by the Python frames of its call (`calls`: outermost call
/// first, each call's frames outermost first), outermost first. gdb's loop
/// frames and the fixture's calls must be as many.
fn wanted<'a>(label: &str, gdb: &'a [GdbFrame], calls: &[Vec<PyFrame>]) -> Vec<Want<'a>> {
    let is_eval = |f: &GdbFrame| f.name.as_deref().is_some_and(|n| base(n) == "_PyEval_EvalFrameDefault");
    let evals = gdb.iter().filter(|f| is_eval(f)).count();
    assert_eq!(evals, calls.len(), "{label}: gdb has {evals} interpreter loop frames, the fixture {} calls", calls.len());
    let mut want = Vec::new();
    let mut inner_calls = calls.iter().rev();
    for f in gdb {
        if !is_eval(f) {
            want.push(Want::Native(f));
            continue;
        }
        let call = inner_calls.next().unwrap();
        want.extend(call.iter().rev().map(|p| Want::Python(format!("{} ({})", p.name, p.file))));
        if inner_calls.len() == 0 {
            break;
        }
    }
    want.reverse();
    want
}

/// Whether pytrace's folded frame `label` is the frame gdb saw.
fn same_frame(label: &str, want: &Want, entries: &mut UnwindEntries) -> bool {
    let f = match want {
        Want::Python(p) => return label == p,
        Want::Native(f) => f,
    };
    let Some((name, module)) = label.strip_suffix(')').and_then(|l| l.rsplit_once(" (")) else { return false };
    if f.file.file_name().and_then(|n| n.to_str()) != Some(module) {
        return false;
    }
    // Unnamed in pytrace: `module+0xSTART`, START its unwind entry's.
    if let Some(start) = name.strip_prefix(module).and_then(|s| s.strip_prefix("+0x")) {
        return u64::from_str_radix(start, 16).ok() == entries.start(&f.file, f.svma);
    }
    f.name.as_deref().is_some_and(|g| base(g) == base(name))
}

/// A stack for a message: repeated frames counted, not listed.
fn show<'a>(frames: impl IntoIterator<Item = &'a str>) -> String {
    let mut out: Vec<(String, usize)> = Vec::new();
    for f in frames {
        match out.last_mut() {
            Some((last, n)) if last == f => *n += 1,
            _ => out.push((f.to_string(), 1)),
        }
    }
    out.iter().map(|(f, n)| if *n > 1 { format!("{f} x{n}") } else { f.clone() }).collect::<Vec<_>>().join("\n  ")
}

fn want_label(w: &Want) -> String {
    match w {
        Want::Python(p) => p.clone(),
        Want::Native(f) => format!("{} ({})", f.name.as_deref().unwrap_or("??"), f.file.file_name().unwrap().to_string_lossy()),
    }
}

/// Runs fixtures/native_truth.py with `args` under `python` until it
/// reports its Python stack (it then spins), samples it with
/// `sample --native` for 4 s at the native rate, walks it with gdb and
/// compares: at least MIN_SAMPLES samples, MIN_AGREEMENT of them with
/// gdb's stack (see the module's comment). `check_gdb` looks at gdb's
/// frames first (the fixture's own shape).
fn compare_with_gdb(label: &str, python: &Path, args: &[&str], check_gdb: impl Fn(&[GdbFrame])) {
    let started = Instant::now();
    let mut target = Proc(Command::new(python).arg(fixture("native_truth.py")).args(args).stdout(Stdio::piped()).spawn().expect("start the fixture"));
    let mut line = String::new();
    BufReader::new(target.0.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let calls: Vec<Vec<PyFrame>> = serde_json::from_value(serde_json::from_str::<serde_json::Value>(&line).unwrap_or_else(|e| panic!("{label}: {e}: {line:?}"))["calls"].take()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (folded, json) = (dir.path().join("p.folded"), dir.path().join("p.json"));
    let pid = target.pid().to_string();
    let tracer = start_tracer(&[
        "sample", "--native", "-p", &pid, "-r", &native_rate().to_string(), "-d", &longer(4.0), "--full-paths",
        "--folded", folded.to_str().unwrap(), "--json", json.to_str().unwrap(),
    ]);
    let (code, _, stderr) = tracer.finish();
    assert_eq!(code, 0, "{label}: {stderr}");
    let gdb = gdb_frames(target.pid());
    assert!(target.0.try_wait().unwrap().is_none(), "{label}: the target ended under gdb");
    check_gdb(&gdb);
    let want = wanted(label, &gdb, &calls);
    let Want::Python(outermost) = &want[0] else { unreachable!("a Python frame first") };
    let mut entries = UnwindEntries::default();
    let (mut total, mut same) = (0u64, 0u64);
    let mut differing = Vec::new();
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        let frames: Vec<&str> = stack.split(';').collect();
        let from = frames.iter().position(|f| f == outermost).unwrap_or(frames.len());
        let ours = &frames[from..];
        if ours.len() == want.len() && ours.iter().zip(&want).all(|(f, w)| same_frame(f, w, &mut entries)) {
            same += n;
        } else {
            differing.push((n, show(frames.iter().copied())));
        }
    }
    let counters = read_report(&json)["counters"].clone();
    differing.sort_by_key(|d| std::cmp::Reverse(d.0));
    let wanted_labels: Vec<String> = want.iter().map(want_label).collect();
    let share = same as f64 / total.max(1) as f64;
    println!("{label}: {same} of {total} samples ({:.1} %) have gdb's stack, {:.1} s", share * 100.0, started.elapsed().as_secs_f64());
    assert!(total >= MIN_SAMPLES, "{label}: {total} samples, at least {MIN_SAMPLES} needed: {counters}");
    assert!(
        share >= MIN_AGREEMENT,
        "{label}: {same} of {total} samples ({:.1} %) have gdb's stack, {:.0} % needed; counters {counters}\ngdb's, outermost first:\n  {}\nthe most common of the others' stacks:\n{}",
        share * 100.0,
        MIN_AGREEMENT * 100.0,
        show(wanted_labels.iter().map(String::as_str)),
        differing.iter().take(2).map(|(n, s)| format!("{n} samples:\n  {s}")).collect::<Vec<_>>().join("\n"),
    );
}

/// How fixtures/native_recursion.c (and its middle translation unit) is
/// compiled: gcc's flags for each.
struct Build {
    flags: &'static [&'static str],
    middle_flags: &'static [&'static str],
}

/// Every function with a frame pointer: rbp-based unwind rules.
const FRAME_POINTERS: Build = Build { flags: &["-O2", "-fno-omit-frame-pointer"], middle_flags: &["-O2", "-fno-omit-frame-pointer"] };

/// No frame pointers: rsp-based rules, rbp left alone.
const NO_FRAME_POINTERS: Build = Build { flags: &["-O2", "-fomit-frame-pointer"], middle_flags: &["-O2", "-fomit-frame-pointer"] };

/// middle without unwind information but with its frame pointer, the rest
/// with frame pointers: the stack scan (src/native/scan.rs) finds middle's
/// caller, whose rbp is the one middle saved. (Going on with middle's own
/// rbp lost recurse's outer 101 frames, and libffi's and ctypes', unmarked.)
const MIDDLE_WITHOUT_UNWIND_INFO: Build = Build {
    flags: &["-O2", "-fno-omit-frame-pointer"],
    middle_flags: &["-O2", "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"],
};

/// The same, the rest without frame pointers: rbp-based rules above middle
/// are only libffi's (ffi_call_unix64's CFA is rbp+32).
const MIDDLE_WITHOUT_UNWIND_INFO_REST_WITHOUT_FRAME_POINTERS: Build = Build {
    flags: &["-O2", "-fomit-frame-pointer"],
    middle_flags: &["-O2", "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"],
};

/// The fixture built with `build` into a shared library in `dir`.
fn build_library(build: &Build, dir: &Path) -> PathBuf {
    let library = dir.join("libnative_recursion.so");
    for (source, flags, object) in [("native_recursion.c", build.flags, "recursion.o"), ("native_recursion_middle.c", build.middle_flags, "middle.o")] {
        let out = Command::new("gcc").args(flags).args(["-fPIC", "-c", &fixture(source), "-o"]).arg(dir.join(object)).output().expect("gcc (scripts/install.sh)");
        assert!(out.status.success(), "gcc {source}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = Command::new("gcc").args(["-shared", "-o"]).arg(&library).arg(dir.join("recursion.o")).arg(dir.join("middle.o")).output().unwrap();
    assert!(out.status.success(), "gcc -shared: {}", String::from_utf8_lossy(&out.stderr));
    library
}

/// fixtures/native_truth.py's `recurse` on pyenv's 3.12 (symbols in
/// libpython, for gdb and pytrace to name its frames): recurse(200) from
/// Python through ctypes and libffi, whose leaf spins. gdb's frames must be
/// the fixture's own shape (200 recurse frames, one middle, spin_leaf on
/// top); at least 90 % of the samples must have them, from the leaf down
/// to call_native, main and the module's body.
fn deep_c_recursion_equals_gdb(build: &Build) {
    let python = pyenv_python(12);
    let dir = tempfile::tempdir().unwrap();
    let library = build_library(build, dir.path());
    let label = format!("recurse(200) built with {:?}, middle {:?}", build.flags, build.middle_flags);
    compare_with_gdb(&label, &python, &["recurse", library.to_str().unwrap()], |gdb| {
        let count = |name: &str| gdb.iter().filter(|f| f.name.as_deref().map(base) == Some(name)).count();
        assert_eq!(gdb[0].name.as_deref(), Some("spin_leaf"), "{label}: gdb's leaf");
        assert_eq!((count("recurse"), count("middle")), (200, 1), "{label}: gdb's recurse and middle frames");
    });
}

/// fixtures/native_truth.py's `sorted`: the key function spins, called by
/// list.sort's C code, called by sorted from Python.
fn sorted_key_equals_gdb(python: PathBuf) {
    compare_with_gdb(&format!("sorted on {}", python.display()), &python, &["sorted"], |gdb| {
        assert!(gdb.iter().any(|f| f.name.as_deref().map(base) == Some("list_sort_impl")), "list.sort's C code is not on gdb's stack");
    });
}

/// fixtures/native_truth.py's `json`: the default hook spins, called by
/// json's C encoder, called by JSONEncoder.iterencode.
fn json_default_equals_gdb(python: PathBuf) {
    compare_with_gdb(&format!("json on {}", python.display()), &python, &["json"], |gdb| {
        assert!(gdb.iter().any(|f| f.name.as_deref().map(base) == Some("encoder_listencode_obj")), "the C encoder is not on gdb's stack");
    });
}

over_builds! {
    frame_pointers(&FRAME_POINTERS): deep_c_recursion_equals_gdb;
    no_frame_pointers(&NO_FRAME_POINTERS): deep_c_recursion_equals_gdb;
    middle_without_unwind_info(&MIDDLE_WITHOUT_UNWIND_INFO): deep_c_recursion_equals_gdb;
    middle_without_unwind_info_rest_without_frame_pointers(&MIDDLE_WITHOUT_UNWIND_INFO_REST_WITHOUT_FRAME_POINTERS): deep_c_recursion_equals_gdb;
    pyenv_3_9(pyenv_python(9)): sorted_key_equals_gdb, json_default_equals_gdb;
    pyenv_3_10(pyenv_python(10)): sorted_key_equals_gdb, json_default_equals_gdb;
    pyenv_3_11(pyenv_python(11)): sorted_key_equals_gdb, json_default_equals_gdb;
    pyenv_3_12(pyenv_python(12)): sorted_key_equals_gdb, json_default_equals_gdb;
    pyenv_3_13(pyenv_python(13)): sorted_key_equals_gdb, json_default_equals_gdb;
}
