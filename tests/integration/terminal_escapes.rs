//! A target's names never reach a terminal raw: fixtures/hostile_names.py
//! imports a module named "EVIL_\x1b]0;title\x07\x1b[2J" (an escape that
//! retitles and clears the terminal) and runs a function, file and thread
//! named with a C1 CSI (U+009B), DEL, bidi overrides and invisible format
//! characters. Every table and line pytrace prints must carry none of
//! those characters, and must still show the name (escaped), so the check
//! is not passed by leaving the row out.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// The characters the fixture puts in its names, none of which a table may
/// contain. ESC itself is among them: no report table needs one.
const FORBIDDEN: &[char] = &['\x1b', '\x07', '\u{9b}', '\u{7f}', '\u{202e}', '\u{2066}', '\u{200f}', '\u{61c}', '\u{200b}', '\u{feff}'];

fn assert_clean(what: &str, output: &[u8], name_shown: &str) {
    let text = String::from_utf8_lossy(output);
    for c in FORBIDDEN {
        assert!(!text.contains(*c), "{what}: U+{:04X} reached the terminal:\n{text}", *c as u32);
    }
    assert!(text.contains(name_shown), "{what}: the hostile name is not shown (escaped) at all:\n{text}");
}

/// The module and function names, as `printable` writes them.
const MODULE_SHOWN: &str = "EVIL_\\u{1b}]0;title\\u{7}\\u{1b}[2J";
const NAME_SHOWN: &str = "EVIL_\\u{9b}2J\\u{7f}\\u{202e}RLO\\u{2066}\\u{200f}\\u{61c}\\u{200b}\\u{feff}end";

fn traced(args: &[&str]) -> std::process::Output {
    let python = "/usr/bin/python3.11";
    let script = fixture("hostile_names.py");
    let mut all = args.to_vec();
    all.extend(["--", python, &script]);
    let out = pytrace(&all);
    assert!(out.status.success(), "pytrace {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn imports_escape_module_names_from_the_usdt_probes_and_from_uprobes() {
    let _machine = shared();
    // USDT (Debian's default): the name is a C string, C0 controls and all.
    let out = traced(&["imports", "--mode", "usdt"]);
    assert_clean("imports usdt", &out.stdout, MODULE_SHOWN);
    assert_clean("imports usdt", &out.stdout, NAME_SHOWN);
    assert_clean("imports usdt (stderr)", &out.stderr, "attached");
    // Uprobe: names are str objects; one with C0 controls is refused, so
    // the other name is the one to see.
    let out = traced(&["imports", "--mode", "uprobe"]);
    assert_clean("imports uprobe", &out.stdout, NAME_SHOWN);
}

#[test]
fn calls_sample_and_gil_tables_escape_function_and_file_names() {
    let _machine = shared();
    for (what, args) in [("calls", &["calls"][..]), ("sample", &["sample", "-r", "999", "--threads"]), ("gil", &["gil"])] {
        let out = traced(args);
        assert_clean(what, &out.stdout, NAME_SHOWN);
        assert_clean(what, &out.stdout, &format!("{NAME_SHOWN}.py"));
    }
}

#[test]
fn dump_escapes_function_file_and_thread_names() {
    let _machine = shared();
    let target = start_waiting(std::path::Path::new("/usr/bin/python3.11"), "hostile_names.py", &["--seconds", "30"]);
    signal(target.pid(), libc::SIGUSR1);
    // The hostile thread runs once both imports are done: give it time.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = pytrace(&["dump", "-p", &target.pid().to_string()]);
        assert!(out.status.success(), "dump: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains(&format!("({NAME_SHOWN}, OS name")) || std::time::Instant::now() > deadline {
            assert_clean("dump", &out.stdout, &format!("Thread {}", target.pid()));
            assert_clean("dump", &out.stdout, &format!("({NAME_SHOWN}, OS name"));
            assert_clean("dump", &out.stdout, &format!("{NAME_SHOWN} ({NAME_SHOWN}.py:"));
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `pytrace top` draws through ratatui, not through the line printer: its
/// raw terminal bytes, as `script` records them in a tmux pane (a real
/// 100×24 terminal), carry none of the characters, but the row's name does
/// show, with U+FFFD where they were. ESC is left out of the check: the
/// view itself is drawn with escape sequences.
#[test]
fn top_screen_bytes_escape_function_names() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let typescript = dir.path().join("top.typescript");
    let session = format!("pytrace-escapes-{}", std::process::id());
    let command = format!("script -q -c '{PYTRACE} top -d 4 -- /usr/bin/python3.11 {} --seconds 30' {}", fixture("hostile_names.py"), typescript.display());
    let started = Command::new("tmux").args(["new-session", "-d", "-s", &session, "-x", "100", "-y", "24", &command]).status().expect("tmux is installed by scripts/test-tools.sh");
    assert!(started.success());
    // `top -d 4` ends by itself; the pane closes when script does.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while Command::new("tmux").args(["has-session", "-t", &session]).output().unwrap().status.success() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = Command::new("tmux").args(["kill-session", "-t", &session]).status();
    let bytes = std::fs::read(&typescript).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    for c in FORBIDDEN.iter().filter(|&&c| c != '\x1b') {
        assert!(!text.contains(*c), "top: U+{:04X} reached the terminal", *c as u32);
    }
    assert!(!text.contains("\x1b]0;"), "top: a title escape reached the terminal");
    assert!(text.contains("EVIL_") && text.contains('\u{fffd}'), "top: the hostile row is not drawn:\n{text}");
}
