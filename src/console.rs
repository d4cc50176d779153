//! The one way out to a terminal: every line pytrace prints on standard
//! output or standard error goes through `out` or `err`, which pass it
//! through `printable` first.
//!
//! Names in reports come from the target (functions, modules, threads,
//! files, symbols), and a hostile target can name a module
//! "\x1b]0;title\x07\x1b[2J" to retitle and clear root's terminal, or put a
//! right-to-left override in a function name to make a row read as another.
//! So the filter sits here, where bytes leave, not where names enter: no
//! new report or message can forget it. (`clippy.toml` forbids `print!`
//! and friends elsewhere.) `pytrace top` draws through ratatui instead,
//! and its screen is filtered cell by cell in `report/terminal.rs` with the same
//! `is_unsafe`. Files (JSON, folded stacks, ...) keep names exact, escaped
//! as their format escapes them.
//!
//! It sits at the crate's root, below every layer, not in report/: python/,
//! tracing/ and session/ say things too, and a lower layer must not reach up
//! into the one that formats reports.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write;

use anyhow::{Context, Result};

/// Characters a terminal acts on or that change how text reads without
/// showing: C0 controls but the newline, DEL, C1 controls (U+009B is a
/// one-character CSI to some terminals), Unicode's format characters (Cf:
/// bidirectional embeddings, overrides and isolates, zero-width spaces and
/// joiners, the BOM, tags) and the line and paragraph separators (Zl, Zp).
pub fn is_unsafe(c: char) -> bool {
    // Cf as of Unicode 16, by range; the list is short and stable, so a
    // crate for it would cost every branch a lock-file change for nothing.
    const FORMAT: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x0600, 0x0605),
        (0x061C, 0x061C),
        (0x06DD, 0x06DD),
        (0x070F, 0x070F),
        (0x0890, 0x0891),
        (0x08E2, 0x08E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x2028, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let code = c as u32;
    (c != '\n' && c.is_control()) || FORMAT.iter().any(|&(low, high)| (low..=high).contains(&code))
}

/// `text` with every unsafe character written out as `\u{..}`, so a name
/// that carries one is still seen, and seen to carry it.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes `text` on standard output. A reader that went away (`| head`,
/// `| true`) is an error the caller returns, so the run still ends as it
/// should: hook restored, files written, one sentence, exit 1.
#[allow(clippy::disallowed_methods)]
pub fn out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(printable(text).as_bytes()).and_then(|()| stdout.flush()).context("failed to write to standard output")
}

/// Writes `text` on standard error; a closed standard error is no reason
/// to stop a run, so what cannot be written is dropped.
#[allow(clippy::disallowed_methods)]
pub fn err(text: &str) {
    let _ = std::io::stderr().lock().write_all(printable(text).as_bytes());
}

/// Rewinds standard error's line for a progress line that redraws itself:
/// the one control character pytrace writes on purpose.
#[allow(clippy::disallowed_methods)]
pub fn err_rewind_line() {
    let _ = std::io::stderr().lock().write_all(b"\r");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("EVIL_\x1b]0;title\x07\x1b[2J"), "EVIL_\\u{1b}]0;title\\u{7}\\u{1b}[2J");
        assert_eq!(printable("a\u{9b}31mb\u{7f}"), "a\\u{9b}31mb\\u{7f}");
        assert_eq!(printable("abc\u{202e}fed\u{2066}\u{200f}\u{61c}\u{feff}"), "abc\\u{202e}fed\\u{2066}\\u{200f}\\u{61c}\\u{feff}");
        assert_eq!(printable("tab\there\r"), "tab\\u{9}here\\u{d}");
    }

    #[test]
    fn leaves_ordinary_text_and_newlines_alone() {
        let table = "function  calls\nfé λ 😀 日本  1,234\n";
        assert!(matches!(printable(table), Cow::Borrowed(_)));
    }
}
