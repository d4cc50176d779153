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
