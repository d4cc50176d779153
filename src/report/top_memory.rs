//! `pytrace top --memory`'s live view: the rows of `pytrace memory`'s
//! table, read once a second while the target runs: per Python stack
//! (innermost frame first) and allocator path, the bytes live now and the
//! bytes the heap grew by since the start, each with its 95 % interval and
//! the kept events it rests on, under the totals and over what was
//! dropped. Drawn on top's screen (`top::Screen`).

use std::time::Duration;

use ratatui::layout::{Alignment, Constraint};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Row};
use ratatui::Frame;

use super::memory::{bytes, stack_rows, StackRow, MIN_RELIABLE_KEPT};
use super::profile::FrameView;
use super::terminal::LiveView;
use super::top::Screen;
use super::{dropped_line, thousands};
use crate::model::counters::Counters;
use crate::model::memory::{Estimate, MemoryData};

/// What the rows are ordered by; keys 1 to 3 choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySortBy {
    Live,
    Grown,
    Kept,
}

/// The state of the view between readings: the last reading's rows and
/// totals.
pub struct MemoryTopView {
    pub title: String,
    pub sort: MemorySortBy,
    /// How frames are named: per line, the target's own files relative to
    /// its working directory (memory's table gives full paths; a screen
    /// has no room for them).
    frames: FrameView,
    rows: Vec<StackRow>,
    live: Estimate,
    grown: Estimate,
    every: u64,
    blocks_read: u64,
    blocks_gone: u64,
    counters: Counters,
    elapsed: Duration,
}

impl MemoryTopView {
    pub fn new(title: String, cwd: Option<String>) -> Self {
        MemoryTopView {
            title,
            sort: MemorySortBy::Live,
            frames: FrameView { lines: true, full_paths: false, cwd },
            rows: Vec::new(),
            live: Estimate::default(),
            grown: Estimate::default(),
            every: 0,
            blocks_read: 0,
            blocks_gone: 0,
            counters: Counters::default(),
            elapsed: Duration::ZERO,
        }
    }

    /// A new reading: the rows so far at `elapsed`, merged as the table
    /// merges them.
    pub fn update(&mut self, data: MemoryData, elapsed: Duration) {
        let (rows, live, grown) = stack_rows(&data.stacks, |f| self.frames.label(f));
        self.rows = rows;
        self.live = live;
        self.grown = grown;
        self.every = data.every;
        self.blocks_read = data.blocks_read;
        self.blocks_gone = data.blocks_gone;
        self.counters = data.counters;
        self.elapsed = elapsed;
        self.sort_rows();
    }

    fn sort_rows(&mut self) {
        let key = |r: &StackRow| match self.sort {
            MemorySortBy::Live => (r.live.bytes, r.grown.bytes),
            MemorySortBy::Grown => (r.grown.bytes, r.live.bytes),
            MemorySortBy::Kept => (r.grown.kept as f64, r.live.bytes),
        };
        self.rows.sort_by(|a, b| {
            let (a_key, b_key) = (key(a), key(b));
            b_key.0.total_cmp(&a_key.0).then(b_key.1.total_cmp(&a_key.1)).then_with(|| a.frames.cmp(&b.frames))
        });
    }

    pub fn sort_by(&mut self, sort: MemorySortBy) {
        self.sort = sort;
        self.sort_rows();
    }

    pub fn draw(&self, frame: &mut Frame) {
        let header = vec![
            self.title.clone(),
            format!(
                "{:.0} s, live {} ± {}, grown {} ± {} (95 %)",
                self.elapsed.as_secs_f64(),
                bytes(self.live.bytes),
                bytes(self.live.interval95()),
                bytes(self.grown.bytes),
                bytes(self.grown.interval95())
            ),
            format!(
                "one event kept per {} on average; {} kept blocks read, {} gone since",
                bytes(self.every as f64),
                thousands(self.blocks_read),
                thousands(self.blocks_gone)
            ),
        ];
        // Numbers to the right, as in memory's table: digits of one unit
        // line up, under their column's title.
        let number = |text: String| Cell::from(Line::from(text).alignment(Alignment::Right));
        let marked = |title: &str, by: MemorySortBy| number(if self.sort == by { format!("[{title}]") } else { title.to_string() });
        let titles = vec![
            marked("live", MemorySortBy::Live),
            number("±95%".into()),
            marked("grown", MemorySortBy::Grown),
            number("±95%".into()),
            marked("kept", MemorySortBy::Kept),
            Cell::from("from"),
            Cell::from("stack (innermost first)"),
        ];
        let rows = self.rows.iter().map(|row| {
            let inner: Vec<&str> = row.frames.iter().rev().map(String::as_str).collect();
            let mark = if row.grown.kept < MIN_RELIABLE_KEPT { " (few events)" } else { "" };
            Row::new(vec![
                number(bytes(row.live.bytes)),
                number(bytes(row.live_interval95)),
                number(bytes(row.grown.bytes)),
                number(bytes(row.grown_interval95)),
                number(thousands(row.grown.kept)),
                Cell::from(row.source.name()),
                Cell::from(format!("{}{mark}", inner.join(" < "))),
            ])
        });
        let widths = vec![
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(6),
            Constraint::Min(20),
        ];
        let footer = vec![dropped_line(&self.counters).trim_end().to_string(), "1-3 sort by live, grown, kept; q quit".into()];
        Screen { header, titles, widths, rows: rows.collect(), footer }.draw(frame);
    }
}

impl LiveView for MemoryTopView {
    fn sort_by_column(&mut self, column: usize) {
        // Key 4 sorts by nothing here: three columns can be sorted by.
        if let Some(&sort) = [MemorySortBy::Live, MemorySortBy::Grown, MemorySortBy::Kept].get(column) {
            self.sort_by(sort);
        }
    }

    fn draw(&self, frame: &mut Frame) {
        MemoryTopView::draw(self, frame)
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::model::memory::{MemoryStack, Source};
    use crate::model::samples::Frame as StackFrame;

    fn stack(function: &str, line: u32, live: f64, grown: f64, kept: u64) -> MemoryStack {
        let frame = |name: &str, line| Rc::new(StackFrame::Python { name: name.into(), file: "/srv/app/app.py".into(), line, first_line: 1 });
        let estimate = |bytes| Estimate { bytes, variance: 0.0, kept, objects: 1.0 };
        MemoryStack { frames: vec![frame("main", 9), frame(function, line)], source: Source::Pool, grown: estimate(grown), live: estimate(live) }
    }

    /// Stacks that differ in a frame's instruction only are one row, as
    /// in memory's table; the rows go by live bytes, then by the key
    /// pressed; frames are named relative to the target's directory.
    #[test]
    fn memory_view_merges_as_the_table_and_sorts_by_key() {
        let mut view = MemoryTopView::new("t".into(), Some("/srv/app".into()));
        let data = MemoryData {
            stacks: vec![stack("held", 3, 100.0, 100.0, 2), stack("held", 3, 50.0, 60.0, 1), stack("churn", 5, 10.0, 900.0, 40)],
            every: 1024,
            blocks_read: 3,
            blocks_gone: 0,
            counters: Counters::default(),
            allocations: None,
        };
        view.update(data, Duration::from_secs(2));
        let firsts = |view: &MemoryTopView| view.rows.iter().map(|r| r.frames.last().unwrap().clone()).collect::<Vec<_>>();
        assert_eq!(firsts(&view), ["held (app.py:3)", "churn (app.py:5)"]);
        assert_eq!((view.rows[0].live.bytes, view.rows[0].grown.kept, view.live.bytes), (150.0, 3, 160.0));
        view.sort_by_column(1);
        assert_eq!(firsts(&view), ["churn (app.py:5)", "held (app.py:3)"]);
        view.sort_by_column(3);
        assert_eq!(view.sort, MemorySortBy::Grown, "key 4 sorts by nothing here");
    }
}
