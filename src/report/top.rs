//! `pytrace top`'s live view: functions by their share of the samples in
//! the last interval and since the start (or, with `--calls`, by their
//! exact calls, self time and latencies), redrawn every second, drawn with
//! ratatui (a maintained terminal UI library: the alternate screen, raw
//! keys, and the terminal put back on every exit, panics included).

use std::collections::HashMap;
use std::time::Duration;

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::profile::{short_path, FunctionShare, Profile};
use super::terminal::LiveView;
use super::PythonInfo;
use crate::model::samples::Sample;
use crate::model::functions::{Function, FunctionStats};

/// What the rows are ordered by; keys 1 to 4 choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    OwnNow,
    TotalNow,
    OwnAll,
    TotalAll,
}

type Key = (String, String, u32);

/// A function's samples: in the last interval, and since the start.
#[derive(Debug, Clone, Default)]
struct Counts {
    own_now: u64,
    total_now: u64,
    own_all: u64,
    total_all: u64,
}

/// The state of the view between redraws.
pub struct TopView {
    pub title: String,
    pub hz: u64,
    pub sort: SortBy,
    cwd: Option<String>,
    previous: HashMap<Key, (u64, u64)>,
    rows: Vec<(Key, Counts)>,
    samples_all: u64,
    samples_now: u64,
    previous_total: u64,
    pub lost: u64,
    pub elapsed: Duration,
}

impl TopView {
    pub fn new(title: String, hz: u64, cwd: Option<String>) -> Self {
        TopView {
            title,
            hz,
            sort: SortBy::OwnNow,
            cwd,
            previous: HashMap::new(),
            rows: Vec::new(),
            samples_all: 0,
            samples_now: 0,
            previous_total: 0,
            lost: 0,
            elapsed: Duration::ZERO,
        }
    }

    /// A new reading of the cumulative shares: the interval's are the
    /// difference from the last one.
    pub fn update(&mut self, functions: &[FunctionShare], total: u64) {
        let mut now = HashMap::new();
        self.rows = functions
            .iter()
            .map(|f| {
                let key = (f.name.clone(), f.file.clone(), f.line);
                let (own_before, total_before) = self.previous.get(&key).copied().unwrap_or((0, 0));
                now.insert(key.clone(), (f.self_samples, f.total_samples));
                let counts = Counts {
                    own_now: f.self_samples - own_before.min(f.self_samples),
                    total_now: f.total_samples - total_before.min(f.total_samples),
                    own_all: f.self_samples,
                    total_all: f.total_samples,
                };
                (key, counts)
            })
            .collect();
        self.previous = now;
        self.samples_now = total.saturating_sub(self.previous_total);
        self.previous_total = total;
        self.samples_all = total;
        self.sort_rows();
    }

    fn sort_rows(&mut self) {
        let key = |c: &Counts| match self.sort {
            SortBy::OwnNow => (c.own_now, c.total_now),
            SortBy::TotalNow => (c.total_now, c.own_now),
            SortBy::OwnAll => (c.own_all, c.total_all),
            SortBy::TotalAll => (c.total_all, c.own_all),
        };
        self.rows.sort_by(|a, b| key(&b.1).cmp(&key(&a.1)).then_with(|| a.0.cmp(&b.0)));
    }

    /// A new reading from the samples so far (`total` taken by `elapsed`).
    pub fn update_from(&mut self, samples: &[Sample], total: u64, elapsed: Duration) {
        let python = PythonInfo { version: String::new(), mode: "sample".into() };
        let profile = Profile::new(0, python, self.hz, 0, Default::default(), samples, None);
        self.update(&profile.functions(), total);
        self.elapsed = elapsed;
    }

    pub fn sort_by(&mut self, sort: SortBy) {
        self.sort = sort;
        self.sort_rows();
    }

    pub fn draw(&self, frame: &mut Frame) {
        let header = vec![
            self.title.clone(),
            format!(
                "{} Hz, {:.0} s, {} samples ({} in the last interval), {} lost",
                self.hz,
                self.elapsed.as_secs_f64(),
                self.samples_all,
                self.samples_now,
                self.lost
            ),
        ];
        let pct = |n: u64, of: u64| if of == 0 { "0.0%".to_string() } else { format!("{:.1}%", n as f64 * 100.0 / of as f64) };
        let secs = |n: u64| format!("{:.2}s", n as f64 / self.hz.max(1) as f64);
        let marked = |title: &str, by: SortBy| if self.sort == by { format!("[{title}]") } else { title.to_string() };
        let titles = vec![
            Cell::from(marked("%Own", SortBy::OwnNow)),
            Cell::from(marked("%Total", SortBy::TotalNow)),
            Cell::from(marked("OwnTime", SortBy::OwnAll)),
            Cell::from(marked("TotalTime", SortBy::TotalAll)),
            Cell::from("Function (file:line)"),
        ];
        let rows = self.rows.iter().map(|((name, file, line), c)| {
            let place = if file.is_empty() { String::new() } else { format!(" ({}:{line})", short_path(file, self.cwd.as_deref())) };
            Row::new(vec![
                Cell::from(pct(c.own_now, self.samples_now)),
                Cell::from(pct(c.total_now, self.samples_now)),
                Cell::from(secs(c.own_all)),
                Cell::from(secs(c.total_all)),
                Cell::from(format!("{name}{place}")),
            ])
        });
        let widths = vec![Constraint::Length(7), Constraint::Length(8), Constraint::Length(9), Constraint::Length(11), Constraint::Min(20)];
        Screen { header, titles, widths, rows: rows.collect(), footer: vec![SORT_AND_QUIT.into()] }.draw(frame);
    }
}

/// What `top --calls` rows are ordered by; keys 1 to 4 choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallsSortBy {
    RateNow,
    CallsAll,
    SelfNow,
    P99,
}

/// A function's exact counts: the totals since the start, and its calls
/// and self time in the last interval.
struct CallsRow {
    key: Key,
    all: FunctionStats,
    calls_now: u64,
    self_ns_now: u64,
}

/// `top --calls`: the calls session's exact counts, self time and latency
/// percentiles, read from the kernel's map every second.
pub struct CallsTopView {
    pub title: String,
    pub sort: CallsSortBy,
    cwd: Option<String>,
    previous: HashMap<Key, (u64, u64)>,
    rows: Vec<CallsRow>,
    interval: Duration,
    last_elapsed: Duration,
    pub lost: u64,
    pub elapsed: Duration,
}

impl CallsTopView {
    pub fn new(title: String, cwd: Option<String>) -> Self {
        CallsTopView {
            title,
            sort: CallsSortBy::RateNow,
            cwd,
            previous: HashMap::new(),
            rows: Vec::new(),
            interval: Duration::ZERO,
            last_elapsed: Duration::ZERO,
            lost: 0,
            elapsed: Duration::ZERO,
        }
    }

    /// A new reading of the totals at `elapsed`, one record per code object
    /// (merged by name, file and line as the calls report does).
    pub fn update(&mut self, functions: Vec<Function>, elapsed: Duration) {
        let mut merged: HashMap<Key, FunctionStats> = HashMap::new();
        for f in functions {
            merged.entry((f.name, f.file, f.line)).or_default().merge(&f.stats);
        }
        let mut now = HashMap::new();
        self.rows = merged
            .into_iter()
            .map(|(key, all)| {
                let (calls_before, self_before) = self.previous.get(&key).copied().unwrap_or((0, 0));
                now.insert(key.clone(), (all.calls, all.self_ns));
                CallsRow { calls_now: all.calls.saturating_sub(calls_before), self_ns_now: all.self_ns.saturating_sub(self_before), key, all }
            })
            .collect();
        self.previous = now;
        self.interval = elapsed.saturating_sub(self.last_elapsed);
        self.last_elapsed = elapsed;
        self.elapsed = elapsed;
        self.sort_rows();
    }

    fn sort_rows(&mut self) {
        let key = |r: &CallsRow| match self.sort {
            CallsSortBy::RateNow => (r.calls_now, r.all.calls),
            CallsSortBy::CallsAll => (r.all.calls, r.calls_now),
            CallsSortBy::SelfNow => (r.self_ns_now, r.all.self_ns),
            CallsSortBy::P99 => (r.all.latency_at(0.99), r.all.calls),
        };
        self.rows.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.key.cmp(&b.key)));
    }

    pub fn sort_by(&mut self, sort: CallsSortBy) {
        self.sort = sort;
        self.sort_rows();
    }

    pub fn draw(&self, frame: &mut Frame) {
        let seconds = self.interval.as_secs_f64();
        let calls: u64 = self.rows.iter().map(|r| r.all.calls).sum();
        let calls_now: u64 = self.rows.iter().map(|r| r.calls_now).sum();
        let rate = |n: u64| if seconds > 0.0 { format!("{:.0}", n as f64 / seconds) } else { "-".into() };
        let header = vec![
            self.title.clone(),
            format!(
                "exact calls, {:.0} s, {} functions, {} calls ({}/s now), {} lost",
                self.elapsed.as_secs_f64(),
                self.rows.len(),
                calls,
                rate(calls_now),
                self.lost
            ),
        ];
        let marked = |title: &str, by: CallsSortBy| if self.sort == by { format!("[{title}]") } else { title.to_string() };
        let titles = vec![
            Cell::from(marked("Calls/s", CallsSortBy::RateNow)),
            Cell::from(marked("Calls", CallsSortBy::CallsAll)),
            Cell::from(marked("%Self", CallsSortBy::SelfNow)),
            Cell::from("p50"),
            Cell::from(marked("p99", CallsSortBy::P99)),
            Cell::from("Function (file:line)"),
        ];
        let self_share = |ns: u64| if seconds > 0.0 { format!("{:.1}%", ns as f64 / 1e7 / seconds) } else { "-".into() };
        let rows = self.rows.iter().map(|r| {
            let (name, file, line) = &r.key;
            let place = if file.is_empty() { String::new() } else { format!(" ({}:{line})", short_path(file, self.cwd.as_deref())) };
            Row::new(vec![
                Cell::from(rate(r.calls_now)),
                Cell::from(r.all.calls.to_string()),
                Cell::from(self_share(r.self_ns_now)),
                Cell::from(super::human_ns(r.all.latency_at(0.5))),
                Cell::from(super::human_ns(r.all.latency_at(0.99))),
                Cell::from(format!("{name}{place}")),
            ])
        });
        let widths = vec![Constraint::Length(9), Constraint::Length(10), Constraint::Length(7), Constraint::Length(8), Constraint::Length(8), Constraint::Min(20)];
        Screen { header, titles, widths, rows: rows.collect(), footer: vec![SORT_AND_QUIT.into()] }.draw(frame);
    }
}

/// The keys' line of a view whose keys 1 to 4 each sort by a column.
const SORT_AND_QUIT: &str = "1-4 sort by a column, q quit";

/// What every live view draws, top to bottom: its header lines, its table
/// under a reversed row of column titles, and its footer lines (the keys'
/// line last). Header and footer lines are wrapped to the screen's width,
/// so that nothing they say (a drop counter) is cut off at its edge.
pub(super) struct Screen<'a> {
    pub header: Vec<String>,
    pub titles: Vec<Cell<'a>>,
    pub widths: Vec<Constraint>,
    pub rows: Vec<Row<'a>>,
    pub footer: Vec<String>,
}

impl Screen<'_> {
    pub fn draw(self, frame: &mut Frame) {
        let width = frame.area().width as usize;
        let lines = |text: &[String]| -> Vec<Line> { text.iter().flat_map(|t| wrapped(t, width)).map(Line::from).collect() };
        let (header, footer) = (lines(&self.header), lines(&self.footer));
        let [top, table, bottom] =
            Layout::vertical([Constraint::Length(header.len() as u16), Constraint::Min(1), Constraint::Length(footer.len() as u16)]).areas(frame.area());
        frame.render_widget(Paragraph::new(header), top);
        let head = Row::new(self.titles).style(Style::default().add_modifier(Modifier::REVERSED));
        frame.render_widget(Table::new(self.rows, self.widths).header(head), table);
        frame.render_widget(Paragraph::new(footer), bottom);
    }
}

/// `text` in lines of at most `width` characters, broken at spaces (a
/// word longer than a line is left whole, and cut where the screen ends).
fn wrapped(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let have = line.chars().count();
        if have > 0 && have + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        } else if have > 0 {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

impl LiveView for TopView {
    fn sort_by_column(&mut self, column: usize) {
        self.sort_by([SortBy::OwnNow, SortBy::TotalNow, SortBy::OwnAll, SortBy::TotalAll][column]);
    }

    fn draw(&self, frame: &mut Frame) {
        TopView::draw(self, frame)
    }
}

impl LiveView for CallsTopView {
    fn sort_by_column(&mut self, column: usize) {
        self.sort_by([CallsSortBy::RateNow, CallsSortBy::CallsAll, CallsSortBy::SelfNow, CallsSortBy::P99][column]);
    }

    fn draw(&self, frame: &mut Frame) {
        CallsTopView::draw(self, frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str, calls: u64, self_ns: u64) -> Function {
        Function { name: name.into(), file: "app.py".into(), line: 1, stats: FunctionStats { calls, self_ns, ..Default::default() } }
    }

    #[test]
    fn calls_view_merges_code_objects_and_takes_the_interval_as_a_difference() {
        let mut view = CallsTopView::new("t".into(), None);
        view.update(vec![function("f", 10, 100), function("f", 5, 50), function("g", 1, 1)], Duration::from_secs(1));
        let f = view.rows.iter().find(|r| r.key.0 == "f").unwrap();
        assert_eq!((f.all.calls, f.calls_now, f.self_ns_now), (15, 15, 150));
        view.update(vec![function("f", 30, 400), function("g", 1, 1)], Duration::from_secs(3));
        let f = view.rows.iter().find(|r| r.key.0 == "f").unwrap();
        assert_eq!((f.all.calls, f.calls_now, f.self_ns_now), (30, 15, 250));
        assert_eq!(view.interval, Duration::from_secs(2));
        assert_eq!(view.rows[0].key.0, "f", "most calls in the interval first");
        view.sort_by(CallsSortBy::CallsAll);
        assert_eq!(view.rows.iter().map(|r| r.key.0.as_str()).collect::<Vec<_>>(), ["f", "g"]);
    }
}
