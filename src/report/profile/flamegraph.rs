//! An SVG flamegraph, drawn by inferno from the folded stacks.

use anyhow::{Context, Result};

use super::Profile;

impl Profile {
    /// An SVG flamegraph: Python frames green, native aqua, kernel orange,
    /// markers red.
    pub fn to_flamegraph(&self) -> Result<Vec<u8>> {
        let folded = self.to_folded(true);
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = format!("pytrace sample: {}, {}", self.subject(), crate::report::counted(self.total, "sample"));
        opts.colors = inferno::flamegraph::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
        opts.count_name = "samples".into();
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
}
