//! Naming native frames with blazesym, from each module's file on disk
//! (so a target that has exited can still be named), once per address.

use std::collections::HashMap;
use std::rc::Rc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::merge::NativeFrame;
use super::module::ModuleFile;
use super::unwind::RawFrame;
use crate::python::EVAL_FRAME_SYMBOL;
use crate::model::samples::Frame;

/// Names kept before the cache is emptied (a long run through many
/// libraries should not grow without end).
const MAX_NAMES: usize = 200_000;

pub struct Symbols {
    symbolizer: Symbolizer,
    /// (module, link-time address) -> frame; modules by address of their
    /// shared ModuleFile, which the key's Rc keeps alive.
    names: HashMap<(usize, u64), (Rc<ModuleFile>, NativeFrame)>,
    unknown: HashMap<u64, NativeFrame>,
}

impl Default for Symbols {
    fn default() -> Self {
        Symbols {
            symbolizer: Symbolizer::builder().enable_code_info(false).enable_inlined_fns(false).build(),
            names: HashMap::new(),
            unknown: HashMap::new(),
        }
    }
}

impl Symbols {
    pub fn frame(&mut self, raw: &RawFrame) -> NativeFrame {
        let Some(module) = &raw.module else {
            // Code in no file (a JIT's, or a library unmapped since).
            return self
                .unknown
                .entry(raw.address)
                .or_insert_with(|| NativeFrame { frame: Rc::new(Frame::Native { name: format!("{:#x}", raw.address), module: "?".into() }), is_eval: false })
                .clone();
        };
        let key = (Rc::as_ptr(module) as usize, raw.address);
        if let Some((_, f)) = self.names.get(&key) {
            return f.clone();
        }
        if self.names.len() >= MAX_NAMES {
            self.names.clear();
            self.unknown.clear();
        }
        let name = self.name(module, raw.address);
        // The interpreter loop, or its cold part split off by the compiler
        // (`_PyEval_EvalFrameDefault.cold`): one C-level eval call either way.
        let is_eval = name.strip_prefix(EVAL_FRAME_SYMBOL).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            || module.function_start(raw.address).is_some_and(|start| module.is_eval_cold_part(start));
        let frame = NativeFrame { frame: Rc::new(Frame::Native { name, module: module.name.clone() }), is_eval };
        self.names.insert(key, (module.clone(), frame.clone()));
        frame
    }

    /// The symbol holding `svma`; in a stripped file, where only exported
    /// functions are named, the start of the function its unwind entry
    /// covers (so samples in one unnamed function stay together), as
    /// `libc.so.6+0x85e50`: where in which file, as other tools write it.
    fn name(&self, module: &ModuleFile, svma: u64) -> String {
        if let Some(path) = &module.path {
            let src = Source::Elf(Elf::new(path));
            if let Ok(Symbolized::Sym(sym)) = self.symbolizer.symbolize_single(&src, Input::VirtOffset(svma)) {
                return sym.name.into_owned();
            }
        } else if let Some(name) = module.own_symbol(svma) {
            return name.to_string();
        }
        format!("{}+{:#x}", module.name, module.function_start(svma).unwrap_or(svma))
    }
}
