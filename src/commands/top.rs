//! `pytrace top`: a live view of where the target spends CPU time, like
//! `py-spy top` and Linux `top`: the sampler runs as for `sample`, and
//! every second the profile so far is redrawn in the terminal.

use std::io::IsTerminal;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::report::profile::Profile;
use crate::report::top::{SortBy, TopView};
use crate::report::PythonInfo;
use crate::session::{Live, Target, TargetSpec};
use crate::tracing::sample::{self, Options as SampleOptions, Targets};

const REDRAW_EVERY: Duration = Duration::from_secs(1);

pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub hz: u64,
    /// Exact counts from the calls session instead of samples.
    pub calls: bool,
}

/// The terminal in the view's mode (alternate screen, raw keys) while this
/// lives; put back when dropped, whatever the exit (ratatui's panic hook
/// covers panics).
pub(super) struct Screen(pub(super) ratatui::DefaultTerminal);

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

pub fn run(opts: Options) -> Result<i32> {
    if opts.calls {
        return super::top_calls::run(opts);
    }
    if !std::io::stdout().is_terminal() {
        bail!("pytrace top draws on a terminal and standard output is not one: use `pytrace sample` to write a profile");
    }
    let (mut target, python) = Target::prepare(opts.target)?;
    let pid = target.pid;
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok().and_then(|p| p.to_str().map(str::to_string));
    let title = format!("pytrace top: PID {pid}, Python {}", python.version);
    let mut view = TopView::new(title, opts.hz, cwd);
    let live = Live::new(&mut target, &python, "sample", opts.duration);
    // Entered once the target is attached and the line scripts wait for
    // is out (errors before then print as usual).
    let mut screen: Option<Screen> = None;
    let mut last_update: Option<Instant> = None;
    let mut object = MaybeUninit::uninit();
    let session = sample::Session::start(&mut object, Targets::One(pid, &python), &SampleOptions { hz: opts.hz, kernel: false, idle: false, native: false, threads: false, gil: false, states: false })?;
    live.drive(
        session,
        |_, target| target.release(),
        |session| {
            let Screen(terminal) = screen.get_or_insert_with(|| Screen(ratatui::init()));
            let mut redraw = match read_keys()? {
                Keys::Quit => return Ok(false),
                Keys::Sort(column) => {
                    view.sort_by([SortBy::OwnNow, SortBy::TotalNow, SortBy::OwnAll, SortBy::TotalAll][column]);
                    true
                }
                Keys::None => false,
            };
            // The interval's shares are read once a second; a key redraws
            // the same reading.
            if last_update.is_none_or(|t| t.elapsed() >= REDRAW_EVERY) {
                let samples = session.samples_so_far();
                let info = PythonInfo { version: python.version.to_string(), mode: "sample".into() };
                let profile = Profile::new(pid, info, opts.hz, 0, Default::default(), &samples, None);
                view.update(&profile.functions(), session.total());
                view.elapsed = live.elapsed();
                last_update = Some(Instant::now());
                redraw = true;
            }
            if redraw {
                terminal.draw(|frame| view.draw(frame))?;
            }
            Ok(true)
        },
    )?;
    drop(screen);
    drop(live);
    Ok(target.exit_code())
}

/// What the keys pressed since the last look ask for.
pub(super) enum Keys {
    /// `q`, Esc, or Ctrl-C (a key in raw mode, not a signal).
    Quit,
    /// The last of the keys 1 to 4: sort by that column (0 to 3).
    Sort(usize),
    None,
}

/// Reads every key waiting, without blocking.
pub(super) fn read_keys() -> Result<Keys> {
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
