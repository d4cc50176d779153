//! The terminal a live view (`pytrace top`) draws on: put in the view's
//! mode (alternate screen, raw keys) at the first round and back when done,
//! keys read without blocking, the view redrawn once a second or at a key.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ratatui::Frame;

/// How often the view takes a new reading.
pub const REDRAW_EVERY: Duration = Duration::from_secs(1);

/// A view the terminal shows live: keys 1 to 4 sort it by a column.
pub trait LiveView {
    /// Sorts by column `column` (0 to 3).
    fn sort_by_column(&mut self, column: usize);
    fn draw(&self, frame: &mut Frame);
}

/// Fails, saying what to use instead (`instead`), unless standard output
/// is a terminal.
pub fn require_terminal(instead: &str) -> Result<()> {
    #[allow(clippy::disallowed_methods)]
    if !std::io::stdout().is_terminal() {
        bail!("pytrace top draws on a terminal and standard output is not one: {instead}");
    }
    Ok(())
}

/// The terminal in the view's mode while this lives, entered at the first
/// `round`: once the target is attached and the line scripts wait for is
/// out, so errors before then print as usual and that line is not drawn
/// over. Put back when dropped, whatever the exit (ratatui's panic hook
/// covers panics).
#[derive(Default)]
pub struct LiveScreen {
    terminal: Option<ratatui::DefaultTerminal>,
    last_update: Option<Instant>,
}

impl LiveScreen {
    /// One round between polls: false once a key asks to quit. A sort key
    /// redraws the same reading; `update` takes a new one once a second.
    pub fn round<V: LiveView>(&mut self, view: &mut V, update: impl FnOnce(&mut V) -> Result<()>) -> Result<bool> {
        let terminal = self.terminal.get_or_insert_with(ratatui::init);
        let mut redraw = match read_keys()? {
            Keys::Quit => return Ok(false),
            Keys::Sort(column) => {
                view.sort_by_column(column);
                true
            }
            Keys::None => false,
        };
        if self.last_update.is_none_or(|t| t.elapsed() >= REDRAW_EVERY) {
            update(view)?;
            self.last_update = Some(Instant::now());
            redraw = true;
        }
        if redraw {
            terminal.draw(|frame| {
                view.draw(frame);
                blank_unsafe_cells(frame.buffer_mut());
            })?;
        }
        Ok(true)
    }
}

impl Drop for LiveScreen {
    fn drop(&mut self) {
        if self.terminal.is_some() {
            ratatui::restore();
        }
    }
}

/// Every cell of the screen about to be drawn whose text a terminal would
/// act on, or that changes how the row reads (a name from the target with
/// an escape sequence or a bidi override), is shown as U+FFFD instead:
/// the one place every cell passes, whatever view drew it.
fn blank_unsafe_cells(buffer: &mut ratatui::buffer::Buffer) {
    for cell in buffer.content.iter_mut() {
        if cell.symbol().chars().any(crate::console::is_unsafe) {
            cell.set_symbol("\u{fffd}");
        }
    }
}

/// What the keys pressed since the last look ask for.
enum Keys {
    /// `q`, Esc, or Ctrl-C (a key in raw mode, not a signal).
    Quit,
    /// The last of the keys 1 to 4: sort by that column (0 to 3).
    Sort(usize),
    None,
}

/// Reads every key waiting, without blocking, from the terminal (standard
/// input, or /dev/tty where standard input is not one). Read here rather than by crossterm's event poll: on a
/// terminal that reads as at its end (hung up, its window closed or its
/// tmux session killed) that poll read the end of file again and again
/// without returning, and two `pytrace top --async` runs spun at 65 % of
/// a CPU for an hour, their targets long gone and SIGTERM unread. Such a
/// terminal ends the view.
fn read_keys() -> Result<Keys> {
    let Some(input) = key_input() else { return Ok(Keys::None) };
    let mut keys = Keys::None;
    let mut bytes = [0u8; 256];
    loop {
        let mut fd = libc::pollfd { fd: input, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        let ready = unsafe { libc::poll(&mut fd, 1, 0) };
        if ready <= 0 {
            return Ok(keys);
        }
        if fd.revents & libc::POLLIN == 0 {
            // Hung up or in error with nothing left to read.
            return Ok(Keys::Quit);
        }
        // SAFETY: reads into our own buffer, at most its length.
        let n = unsafe { libc::read(input, bytes.as_mut_ptr().cast(), bytes.len()) };
        match n {
            0 => return Ok(Keys::Quit),
            n if n < 0 => {
                let error = std::io::Error::last_os_error();
                match error.kind() {
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => return Ok(keys),
                    // EIO: the terminal hung up.
                    _ => return Ok(Keys::Quit),
                }
            }
            n => {
                if let Some(quit_or_sort) = keys_in(&bytes[..n as usize]) {
                    match quit_or_sort {
                        Keys::Quit => return Ok(Keys::Quit),
                        sort => keys = sort,
                    }
                }
            }
        }
    }
}

/// The descriptor keys are read from: standard input when it is a
/// terminal, else /dev/tty opened once (None: no terminal to read keys
/// from; the view then ends by -d or a signal).
fn key_input() -> Option<i32> {
    static TTY: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    if std::io::stdin().is_terminal() {
        return Some(0);
    }
    TTY.get_or_init(|| std::fs::File::open("/dev/tty").ok()).as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
}

/// What a read of raw keys asks for: `q`, Esc alone or Ctrl-C quits; the
/// last of 1 to 4 sorts; other keys and escape sequences (arrows, mouse)
/// ask for nothing.
fn keys_in(bytes: &[u8]) -> Option<Keys> {
    let mut keys = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'q' | 0x03 => return Some(Keys::Quit),
            0x1b if i + 1 == bytes.len() => return Some(Keys::Quit),
            // An escape sequence: ESC, then [ or O and what follows up to
            // its final letter (or ~).
            0x1b => {
                i += 2;
                while i < bytes.len() && !(bytes[i].is_ascii_alphabetic() || bytes[i] == b'~') {
                    i += 1;
                }
            }
            c @ b'1'..=b'4' => keys = Some(Keys::Sort((c - b'1') as usize)),
            _ => {}
        }
        i += 1;
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw key bytes as a terminal sends them: q, Ctrl-C and a lone Esc
    /// quit, the last digit of 1 to 4 sorts, an arrow key's sequence (ESC [
    /// A) and other keys do nothing.
    #[test]
    fn raw_keys_read_as_the_view_acts_on_them() {
        assert!(matches!(keys_in(b"q"), Some(Keys::Quit)));
        assert!(matches!(keys_in(b"\x03"), Some(Keys::Quit)));
        assert!(matches!(keys_in(b"\x1b"), Some(Keys::Quit)));
        assert!(matches!(keys_in(b"13"), Some(Keys::Sort(2))));
        assert!(keys_in(b"\x1b[A").is_none());
        assert!(matches!(keys_in(b"\x1b[A2"), Some(Keys::Sort(1))));
        assert!(keys_in(b"x5").is_none());
    }
}
