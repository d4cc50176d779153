//! The terminal a live view (`pytrace top`) draws on: put in the view's
//! mode (alternate screen, raw keys) at the first round and back when done,
//! keys read without blocking, the view redrawn once a second or at a key.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::Frame;

/// How often the view takes a new reading.
const REDRAW_EVERY: Duration = Duration::from_secs(1);

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

/// Reads every key waiting, without blocking. A terminal that hung up
/// (its window closed, its tmux session killed) ends the view: crossterm's
/// poll would read its end of file again and again without returning (seen
/// as a `pytrace top` left spinning at 65 % of a CPU, its SIGTERM unread).
fn read_keys() -> Result<Keys> {
    if terminal_hung_up() {
        return Ok(Keys::Quit);
    }
    let mut keys = Keys::None;
    while event::poll(Duration::ZERO)? {
        let Event::Key(key) = event::read()? else { continue };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Ok(Keys::Quit),
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(Keys::Quit),
            KeyCode::Char(c @ '1'..='4') => keys = Keys::Sort(c as usize - '1' as usize),
            _ => {}
        }
    }
    Ok(keys)
}

/// Whether standard input is a terminal that has hung up. Not a terminal
/// (crossterm then reads /dev/tty itself): false.
fn terminal_hung_up() -> bool {
    std::io::stdin().is_terminal() && hung_up(0)
}

/// Whether poll() says `fd` hung up (POLLHUP or POLLERR: the other end of a
/// pseudo-terminal is closed).
fn hung_up(fd: i32) -> bool {
    let mut fd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, no wait.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready > 0 && fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pseudo-terminal's own side has not hung up while the other side
    /// is open, and has once it is closed (as when a terminal window or a
    /// tmux session goes away).
    #[test]
    fn a_closed_pseudo_terminal_reads_as_hung_up() {
        let (mut main, mut own) = (0, 0);
        // SAFETY: two out-parameters; no name, settings or size asked for.
        let opened = unsafe { libc::openpty(&mut main, &mut own, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
        assert_eq!(opened, 0);
        assert!(!hung_up(own));
        // SAFETY: our own descriptors, closed once.
        unsafe { libc::close(main) };
        assert!(hung_up(own));
        unsafe { libc::close(own) };
    }
}
