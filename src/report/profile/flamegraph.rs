//! An SVG flamegraph, drawn by inferno from the folded stacks.

use anyhow::{Context, Result};

use inferno::flamegraph::color::{Color, PaletteMap};

use super::Profile;
use crate::model::samples::Frame;

impl Profile {
    /// An SVG flamegraph: Python frames green, native aqua, kernel orange,
    /// markers red; with --states each thread state has its own colour.
    pub fn to_flamegraph(&self) -> Result<Vec<u8>> {
        let folded = self.to_folded(true);
        let mut state_colours = self.state_colours();
        let mut opts = inferno::flamegraph::Options::default();
        opts.palette_map = Some(&mut state_colours);
        opts.title = format!("pytrace {}: {}, {}", self.weight.command(), self.subject(), self.weight.counted(self.total));
        opts.colors = inferno::flamegraph::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
        opts.count_name = self.weight.count_name().into();
        // A label too long for its frame is cut at its end, so that it keeps
        // the function's name (which comes first) rather than the file's.
        opts.text_truncate_direction = inferno::flamegraph::TextTruncateDirection::Right;
        let mut svg = Vec::new();
        if self.total == 0 {
            opts.title += " (no samples)";
            // inferno refuses an empty profile; an empty graph is still a graph.
            inferno::flamegraph::from_lines(&mut opts, ["[no samples] 1"].iter().copied(), &mut svg)
                .context("failed to draw the flamegraph")?;
        } else {
            inferno::flamegraph::from_lines(&mut opts, folded.lines(), &mut svg).context("failed to draw the flamegraph")?;
        }
        Ok(svg)
    }

    /// The thread-state root frames (--states), coloured by what the
    /// thread did, so a glance tells running from waiting: running with the
    /// GIL red, running without it yellow, waiting for the GIL purple,
    /// released (I/O, sleeps, preempted) blue. Every other frame keeps the
    /// palette's colour by kind.
    fn state_colours(&self) -> PaletteMap {
        let mut map = PaletteMap::default();
        for frame in self.stacks.keys().flat_map(|(_, stack)| stack.iter()) {
            let Frame::ThreadState(state) = frame.as_ref() else { continue };
            let (r, g, b) = match state.as_str() {
                s if s.starts_with("running (GIL held") => (230, 80, 60),
                s if s.starts_with("running") => (235, 200, 60),
                s if s.starts_with("waiting for the GIL") => (150, 90, 200),
                _ => (90, 140, 220),
            };
            map.insert(self.view.label(frame), Color { r, g, b });
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use crate::model::samples::{Frame, Sample};
    use crate::report::profile::Profile;

    /// A frame too narrow for its label shows the label's start, the
    /// function's name, and cuts the file: `do_GET (/srv/a..` rather than
    /// `..py:60)`. inferno cuts the static text on the right; the SVG's
    /// script, which cuts again in the browser on load and on zoom, must
    /// be told to do the same.
    #[test]
    fn a_cut_label_keeps_the_function_name() {
        let frame = |name: &str| {
            Rc::new(Frame::Python { name: name.into(), file: "/srv/app/deeply/nested/package/http_app.py".into(), line: 60, first_line: 58 })
        };
        let samples = vec![
            Sample { pid: 7, tid: 1, frames: vec![frame("main"), frame("busy_elsewhere")], count: 90 },
            Sample { pid: 7, tid: 1, frames: vec![frame("main"), frame("do_GET")], count: 10 },
        ];
        let info = crate::report::PythonInfo { version: "3.11.2".into(), mode: "sample".into() };
        let svg = String::from_utf8(Profile::new(7, info, 99, 1, Default::default(), &samples, None).to_flamegraph().unwrap()).unwrap();
        let texts: Vec<&str> = svg.split("<text").filter_map(|t| t.split_once('>').map(|(_, rest)| rest.split('<').next().unwrap())).collect();
        let do_get = texts.iter().find(|t| t.contains("do_GET")).unwrap_or_else(|| panic!("{texts:?}"));
        assert!(do_get.starts_with("do_GET (") && do_get.ends_with(".."), "{do_get:?}");
        assert!(svg.contains("var truncate_text_right = true;"), "the script cuts labels on the left");
    }

    /// Each thread state's root frame is drawn in its state's colour, the
    /// same for every sample in that state.
    #[test]
    fn thread_states_have_their_own_colours() {
        let main = Rc::new(Frame::Python { name: "main".into(), file: "/srv/app.py".into(), line: 1, first_line: 1 });
        let samples: Vec<Sample> = [("running (GIL held)", 5), ("waiting for the GIL", 3), ("released: read", 2), ("running (GIL released)", 1)]
            .into_iter()
            .map(|(state, count)| Sample { pid: 7, tid: 1, frames: vec![Rc::new(Frame::ThreadState(state.into())), main.clone()], count })
            .collect();
        let info = crate::report::PythonInfo { version: "3.11.2".into(), mode: "sample".into() };
        let svg = String::from_utf8(Profile::new(7, info, 99, 1, Default::default(), &samples, None).to_flamegraph().unwrap()).unwrap();
        // Each frame's title, then its rectangle's fill.
        let fill_of = |label: &str| {
            let at = svg.find(&format!("<title>[{label}]")).unwrap_or_else(|| panic!("no {label} in {svg}"));
            let rest = &svg[at..];
            rest[rest.find("fill=\"").unwrap() + 6..].split('"').next().unwrap().to_string()
        };
        assert_eq!(fill_of("running (GIL held)"), "rgb(230,80,60)");
        assert_eq!(fill_of("running (GIL released)"), "rgb(235,200,60)");
        assert_eq!(fill_of("waiting for the GIL"), "rgb(150,90,200)");
        assert_eq!(fill_of("released: read"), "rgb(90,140,220)");
    }
}
