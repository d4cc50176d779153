//! --kernel: names kernel return addresses from /proc/kallsyms, once each.

use std::collections::HashMap;
use std::rc::Rc;

use crate::model::samples::Frame;

pub struct KernelFrames {
    /// Text symbols by address.
    sorted: Vec<(u64, Rc<str>)>,
    /// One frame per address seen (kernel code is finite: this stays small).
    by_address: HashMap<u64, Rc<Frame>>,
    /// One frame per function, shared by its addresses.
    by_name: HashMap<Rc<str>, Rc<Frame>>,
}

impl KernelFrames {
    pub fn load() -> Self {
        let mut sorted: Vec<(u64, Rc<str>)> = std::fs::read_to_string("/proc/kallsyms")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then(|| (addr, Rc::from(name)))
            })
            .collect();
        sorted.sort();
        KernelFrames { sorted, by_address: HashMap::new(), by_name: HashMap::new() }
    }

    /// The frame of a kernel return address.
    pub fn frame(&mut self, ip: u64) -> Rc<Frame> {
        if let Some(f) = self.by_address.get(&ip) {
            return f.clone();
        }
        let name: Rc<str> = match self.sorted.partition_point(|(a, _)| *a <= ip) {
            0 => Rc::from(format!("{ip:#x}")),
            i => self.sorted[i - 1].1.clone(),
        };
        let frame = self.by_name.entry(name.clone()).or_insert_with(|| Rc::new(Frame::Kernel(name.to_string()))).clone();
        self.by_address.insert(ip, frame.clone());
        frame
    }
}
