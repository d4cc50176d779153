//! sample's terminal table: the functions with the most samples.

use super::Profile;
use crate::report::thousands;

impl Profile {
    pub fn to_table(&self, top: usize) -> String {
        let mut out = format!(
            "pytrace sample: {}, {} Hz, {:.2} s, {}, {} lost\n",
            self.subject(),
            self.hz,
            self.duration_ns as f64 / 1e9,
            crate::report::counted(self.total, "sample"),
            thousands(self.lost()),
        );
        out += &crate::report::counted_line(&self.counters);
        out += &format!("{:>7} {:>7}  {}\n", "self", "total", "function (file:line)");
        for f in self.functions().iter().take(top) {
            out += &format!("{:>6.1}% {:>6.1}%  {}\n", f.self_share * 100.0, f.total_share * 100.0, super::named_in(&f.name, &f.file, f.line));
        }
        out + &crate::report::dropped_line(&self.counters)
    }
}
