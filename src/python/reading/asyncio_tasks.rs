//! `sample --async` (CPython 3.14+): the asyncio task a sample's thread was
//! running, named from outside the target, and the tasks awaiting it.
//!
//! The BPF sampler records the running task's address per sample
//! (`_PyThreadStateImpl.asyncio_running_task`, an offset of the layout
//! row). The task object's own layout is not in any installed header: it
//! is in `_asyncio`'s debug section (`.AsyncioDebug`,
//! `_Py_AsyncioModuleDebugOffsets`), which CPython compiles into the
//! interpreter (3.15 as Debian builds it) or into the `_asyncio` extension
//! module (3.14), mapped once asyncio is imported. It is read from the
//! mapped file on disk, checked against the layout row (its running-task
//! offset must be the row's: two sources that agree), and every offset in
//! it bounded by the task's size.
//!
//! The target is not trusted: a task must be an `_asyncio.Task` (its
//! type's `tp_name` says so and its `is_task` flag is set), a name a str or
//! (an unnamed task, named lazily as `Task-N`) a one-digit int, the
//! awaiter chain at most MAX_AWAITERS long. Whatever does not check out is
//! an error, shown as an unreadable task, never a guessed name.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;

use super::code::read_str;
use crate::python::layouts::{Layout, NO_FIELD};
use crate::python::Python;
use crate::process::elf::ElfFile;
use crate::process::files;
use crate::process::proc::{self, Memory};

/// The section `_asyncio` puts its debug offsets in.
const SECTION: &str = ".AsyncioDebug";

/// `_Py_AsyncioModuleDebugOffsets` as 3.14 and 3.15 declare it: 13
/// 64-bit words (the task object's size and 6 offsets, the interpreter
/// state's size and 1, the thread state's size and 3). A section of
/// another size is a layout this reader does not know.
const SECTION_WORDS: usize = 13;

/// Tasks awaiting tasks, followed up from the running one: deeper chains
/// are cut (and marked) rather than walked without end through a crafted
/// cycle.
pub const MAX_AWAITERS: usize = 16;

/// Tasks named from a set of tasks awaiting one task: more are counted, not
/// shown.
pub const MAX_SET_AWAITERS: usize = 16;

/// Slots of a set of awaiters read at most (its table: 16 bytes a slot).
const MAX_SET_SLOTS: u64 = 4096;

/// Pending tasks read from one list: a longer list (or a crafted cycle
/// that never comes back to its head) is cut there, and says so.
pub const MAX_TASKS: usize = 10_000;

/// What the type of every task object says its name is.
const TASK_TYPE_NAME: &[u8] = b"_asyncio.Task";
/// The types of a native coroutine and of a code object.
const COROUTINE_TYPE_NAME: &[u8] = b"coroutine";
const CODE_TYPE_NAME: &[u8] = b"code";
const SET_TYPE_NAME: &[u8] = b"set";

/// Py_TPFLAGS_LONG_SUBCLASS and Py_TPFLAGS_UNICODE_SUBCLASS (object.h, the
/// same in every version).
const TPFLAGS_LONG: u64 = 1 << 24;
const TPFLAGS_UNICODE: u64 = 1 << 28;

/// Where a task object's fields are (TaskObj in Modules/_asynciomodule.c),
/// and the heads of the lists of pending tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLayout {
    pub size: u64,
    pub name: u64,
    pub awaited_by: u64,
    /// A byte: 1 in a Task, 0 in a plain Future.
    pub is_task: u64,
    /// A byte: `awaited_by` is a set of awaiters, not one.
    pub awaited_by_is_set: u64,
    /// The coroutine the task runs.
    pub coro: u64,
    /// The task's links (struct llist_node: next, prev) in the list of
    /// pending tasks of the thread that made it.
    pub node: u64,
    /// In the thread state: the running task, and the head of the list of
    /// pending tasks the thread made.
    pub tstate_running_task: u64,
    pub tstate_tasks_head: u64,
    /// In the interpreter state: the head of the list of pending tasks
    /// whose thread has exited.
    pub interp_tasks_head: u64,
}

impl TaskLayout {
    /// From the bytes of `.AsyncioDebug`, checked against the thread state's
    /// running-task offset of the layout row.
    pub fn parse(section: &[u8], layout: &Layout) -> Result<Self> {
        ensure!(section.len() == SECTION_WORDS * 8, "{SECTION} holds {} bytes, not the {} of the layout this pytrace reads", section.len(), SECTION_WORDS * 8);
        let word = |i: usize| u64::from_ne_bytes(section[i * 8..i * 8 + 8].try_into().unwrap());
        let task = TaskLayout {
            size: word(0),
            name: word(1),
            awaited_by: word(2),
            is_task: word(3),
            awaited_by_is_set: word(4),
            coro: word(5),
            node: word(6),
            tstate_running_task: word(11),
            tstate_tasks_head: word(12),
            interp_tasks_head: word(8),
        };
        let (interp_size, tstate_size, running_task) = (word(7), word(9), word(11));
        ensure!(layout.tstate_asyncio_running_task != NO_FIELD, "Python {}.{} has no running asyncio task in its thread state", layout.version.0, layout.version.1);
        ensure!(
            running_task == layout.tstate_asyncio_running_task as u64 && running_task + 8 <= tstate_size,
            "{SECTION} puts the running task at {running_task} in the thread state, where this Python's headers say {}",
            layout.tstate_asyncio_running_task
        );
        ensure!((48..=4096).contains(&task.size), "{SECTION} gives a task object {} bytes", task.size);
        for (field, width) in [(task.name, 8), (task.awaited_by, 8), (task.is_task, 1), (task.awaited_by_is_set, 1), (task.coro, 8), (task.node, 16)] {
            ensure!(field >= 16 && field + width <= task.size, "{SECTION} puts a task field at {field}, outside a task of {} bytes", task.size);
        }
        ensure!(task.tstate_tasks_head + 16 <= tstate_size, "{SECTION} puts the thread's task list at {}, outside its state of {tstate_size} bytes", task.tstate_tasks_head);
        ensure!(
            interp_size <= 1 << 24 && task.interp_tasks_head + 16 <= interp_size,
            "{SECTION} puts the interpreter's task list at {}, outside its state of {interp_size} bytes",
            task.interp_tasks_head
        );
        Ok(task)
    }

    /// The target's: from the interpreter's own file, else from the mapped
    /// `_asyncio` extension module (an error until asyncio is imported).
    pub fn find(pid: u32, python: &Python) -> Result<Self> {
        if let Some(section) = python.elf.section(SECTION) {
            return Self::parse(section, &python.layout);
        }
        let maps = proc::file_mappings(pid)?;
        let module = maps
            .iter()
            .filter(|m| m.offset == 0)
            .find(|m| Path::new(&m.path).file_name().is_some_and(|n| n.to_string_lossy().starts_with("_asyncio.")))
            .context("the target has not imported asyncio's C module (_asyncio) yet")?;
        let elf = ElfFile::read(files::open_mapping(pid, module)?)?;
        let section = elf.section(SECTION).with_context(|| format!("{} has no {SECTION} section", module.path))?;
        Self::parse(section, &python.layout)
    }
}

/// Names tasks in one process's memory.
pub struct TaskReader {
    mem: Memory,
    layout: Layout,
    task: TaskLayout,
    /// Types already checked: whether each is `_asyncio.Task`.
    task_types: HashMap<u64, bool>,
}

/// A running task and those awaiting it, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskChain {
    /// The running task's name.
    pub name: String,
    /// The tasks awaiting it, outermost first.
    pub awaiters: Vec<String>,
    /// The outermost task shown (the running one if `awaiters` is empty)
    /// is awaited by several tasks at once: their names, sorted. The chain
    /// is not followed past them (it forks).
    pub several: Vec<String>,
    /// The chain went on past what is shown: more awaiters than
    /// MAX_AWAITERS, more awaiting one task than MAX_SET_AWAITERS, or a set
    /// of awaiters that could not be read.
    pub cut: bool,
}

/// The pending tasks of one list, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingTasks {
    /// Task addresses, in the list's order (oldest first).
    pub tasks: Vec<u64>,
    /// The list went on past MAX_TASKS, or a link could not be read: the
    /// tasks after it are not shown.
    pub cut: bool,
}

/// The root frame of a task that could not be named.
pub const UNREADABLE_LABEL: &str = "task unreadable";
const TASK_LABEL: &str = "task ";
const AWAITER_LABEL: &str = "awaited by task ";
const SEVERAL_LABEL: &str = "awaited by tasks ";
const SEVERAL_SEPARATOR: &str = ", ";
const CUT_LABEL: &str = "awaited by more tasks";

impl TaskChain {
    /// The root frames `sample --async` puts a stack of this task under:
    /// the task, then the several tasks awaiting the outermost one shown
    /// (one frame, `awaited by tasks A, B`), then (if cut) a marker, then
    /// the tasks awaiting it one by one, outermost first.
    pub fn labels(&self) -> Vec<String> {
        let several = (!self.several.is_empty()).then(|| format!("{SEVERAL_LABEL}{}", self.several.join(SEVERAL_SEPARATOR)));
        let cut = self.cut.then(|| CUT_LABEL.to_string());
        let awaiters = self.awaiters.iter().map(|name| format!("{AWAITER_LABEL}{name}"));
        [format!("{TASK_LABEL}{}", self.name)].into_iter().chain(several).chain(cut).chain(awaiters).collect()
    }

    /// The chain `labels` made (None: no task, or an unreadable one).
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let mut labels = labels.into_iter().peekable();
        let first = labels.next()?;
        if first == UNREADABLE_LABEL {
            return None;
        }
        let name = first.strip_prefix(TASK_LABEL)?.to_string();
        // (A name holding the separator reads back as two: the frame is for
        // people; JSON reports carry what was read.)
        let several = labels.next_if(|l| l.starts_with(SEVERAL_LABEL)).map(|l| l[SEVERAL_LABEL.len()..].split(SEVERAL_SEPARATOR).map(str::to_string).collect()).unwrap_or_default();
        let cut = labels.next_if_eq(&CUT_LABEL).is_some();
        let awaiters = labels.map_while(|l| l.strip_prefix(AWAITER_LABEL).map(str::to_string)).collect();
        Some(TaskChain { name, awaiters, several, cut })
    }
}

impl TaskReader {
    pub fn new(mem: Memory, layout: Layout, task: TaskLayout) -> Self {
        TaskReader { mem, layout, task, task_types: HashMap::new() }
    }

    /// The task the thread whose PyThreadState is at `tstate` is running
    /// (0: none).
    pub fn running(&self, tstate: u64) -> Result<u64> {
        self.mem.read_u64_non_null(tstate + self.task.tstate_running_task)
    }

    /// The pending tasks a thread made (`tstate`), or (`None`) those of
    /// the interpreter at `interp` whose thread has exited: CPython links
    /// each task into its thread's list when it is made and out of it when
    /// it is done. Objects in it that are not tasks are left out.
    pub fn pending(&mut self, tstate: Option<u64>, interp: u64) -> Result<PendingTasks> {
        let head = match tstate {
            Some(tstate) => tstate + self.task.tstate_tasks_head,
            None => interp + self.task.interp_tasks_head,
        };
        let mut list = PendingTasks::default();
        let mut node = self.mem.read_u64_non_null(head)?;
        while node != head {
            if list.tasks.len() == MAX_TASKS {
                list.cut = true;
                break;
            }
            let task = node.wrapping_sub(self.task.node);
            if node == 0 || !self.is_task(task).unwrap_or(false) {
                // A link into something that is not a task: what follows
                // cannot be trusted.
                list.cut = true;
                break;
            }
            list.tasks.push(task);
            match self.mem.read_u64(node) {
                Ok(next) => node = next,
                Err(_) => {
                    list.cut = true;
                    break;
                }
            }
        }
        Ok(list)
    }

    /// The name of the coroutine function a task runs (its outermost
    /// coroutine), e.g. `Server.handle`: a native coroutine's frame's code
    /// object's qualified name (3.13+, where the layout says where a
    /// coroutine keeps its frame).
    pub fn coroutine(&mut self, task: u64) -> Result<String> {
        ensure!(self.layout.gen_iframe != NO_FIELD, "Python {}.{} has no coroutine frame layout", self.layout.version.0, self.layout.version.1);
        let coro = self.mem.read_u64_non_null(task + self.task.coro)?;
        ensure!(self.type_name_is(coro, COROUTINE_TYPE_NAME)?, "the task at {task:#x} runs no native coroutine");
        let tag_bits = self.layout.code_tag_bits as u64;
        let code = self.mem.read_u64_non_null(coro + self.layout.gen_iframe as u64 + self.layout.frame_code as u64)? & !tag_bits;
        ensure!(self.type_name_is(code, CODE_TYPE_NAME)?, "the coroutine at {coro:#x} has no code object");
        read_str(&self.mem, &self.layout, self.mem.read_u64_non_null(code + self.layout.code_qualname as u64)?)
    }

    /// Whether the type of the object at `obj` is named `name`.
    fn type_name_is(&self, obj: u64, name: &[u8]) -> Result<bool> {
        self.type_named(self.mem.read_u64_non_null(obj + self.layout.object_type as u64)?, name)
    }

    /// Whether the type object at `ty` is named `name` (its tp_name, a C
    /// string, compared whole).
    fn type_named(&self, ty: u64, name: &[u8]) -> Result<bool> {
        // tp_name is the word before tp_basicsize in every layout.
        let tp_name = self.mem.read_u64_non_null(ty + self.layout.objects.type_basicsize as u64 - 8)?;
        let mut bytes = vec![0u8; name.len() + 1];
        self.mem.read(tp_name, &mut bytes)?;
        Ok(bytes[..name.len()] == *name && bytes[name.len()] == 0)
    }

    /// The task at `addr`, and the chain of tasks awaiting it.
    pub fn chain(&mut self, addr: u64) -> Result<TaskChain> {
        let name = self.name(addr)?;
        let mut awaiters = Vec::new();
        let mut at = addr;
        let (mut cut, mut several) = (false, Vec::new());
        loop {
            if self.mem.read_u8(at + self.task.awaited_by_is_set)? != 0 {
                match self.awaiting_set(at) {
                    Ok((names, complete)) => (several, cut) = (names, !complete),
                    Err(_) => cut = true,
                }
                break;
            }
            let awaiter = self.mem.read_u64_non_null(at + self.task.awaited_by)?;
            if awaiter == 0 || !self.is_task(awaiter)? {
                break;
            }
            if awaiters.len() == MAX_AWAITERS {
                cut = true;
                break;
            }
            awaiters.push(self.name(awaiter)?);
            at = awaiter;
        }
        awaiters.reverse();
        Ok(TaskChain { name, awaiters, several, cut })
    }

    /// The names of the tasks in the set awaiting the task at `task`,
    /// sorted, and whether they are all there (at most MAX_SET_AWAITERS;
    /// the set's own count of entries must be met). Slots that hold no
    /// task (empty, or the dummy key of a removed entry) are skipped.
    fn awaiting_set(&mut self, task: u64) -> Result<(Vec<String>, bool)> {
        let o = self.layout.objects.clone();
        let set = self.mem.read_u64_non_null(task + self.task.awaited_by)?;
        ensure!(self.type_name_is(set, SET_TYPE_NAME)?, "a task's awaiters at {set:#x} are not a set");
        let (used, mask) = (self.mem.read_u64_non_null(set + o.set_used as u64)?, self.mem.read_u64_non_null(set + o.set_mask as u64)?);
        ensure!(mask < MAX_SET_SLOTS && (mask + 1).is_power_of_two() && used <= mask + 1, "a set of {used} awaiters in {} slots", mask.wrapping_add(1));
        let table = self.mem.read_u64_non_null(set + o.set_table as u64)?;
        let entry = o.set_entry_size as usize;
        ensure!(entry >= o.set_entry_key as usize + 8, "a set entry of {entry} bytes");
        let mut slots = vec![0u8; (mask as usize + 1) * entry];
        self.mem.read(table, &mut slots)?;
        let mut names = Vec::new();
        let mut found = 0;
        for slot in slots.chunks_exact(entry) {
            let key = u64::from_ne_bytes(slot[o.set_entry_key as usize..o.set_entry_key as usize + 8].try_into().unwrap());
            if key == 0 || !self.is_task(key).unwrap_or(false) {
                continue;
            }
            found += 1;
            if names.len() < MAX_SET_AWAITERS {
                names.push(self.name(key)?);
            }
        }
        names.sort();
        Ok((names, found == used && found as usize <= MAX_SET_AWAITERS))
    }

    /// A task's name: a str, or for a task not given one, the int its
    /// `get_name()` would format as `Task-N`.
    pub fn name(&mut self, task: u64) -> Result<String> {
        ensure!(self.is_task(task)?, "the object at {task:#x} is not an asyncio task");
        let name = self.mem.read_u64_non_null(task + self.task.name)?;
        let flags = self.mem.read_u64_non_null(self.mem.read_u64_non_null(name + self.layout.object_type as u64)? + self.layout.objects.type_flags as u64)?;
        if flags & TPFLAGS_UNICODE != 0 {
            return read_str(&self.mem, &self.layout, name);
        }
        if flags & TPFLAGS_LONG != 0 {
            let o = &self.layout.objects;
            // lv_tag (3.12+, so every version with tasks to read): the
            // digit count above three flag bits, the sign in the low two
            // (0: positive); 3.14 marks a cached small int in the third.
            let tag = self.mem.read_u64_non_null(name + o.long_size as u64)?;
            ensure!(tag >> 3 == 1 && tag & 3 == 0, "a task's number is not a one-digit positive int");
            let mut digit = [0u8; 4];
            self.mem.read(name + o.long_digits as u64, &mut digit)?;
            let n = u32::from_ne_bytes(digit);
            ensure!(n >> o.long_shift == 0, "garbage in a task's number");
            return Ok(format!("Task-{n}"));
        }
        bail!("the name of the task at {task:#x} is neither a str nor an int")
    }

    /// An `_asyncio.Task` (or a subclass whose tp_name says so), with its
    /// is_task flag set.
    fn is_task(&mut self, obj: u64) -> Result<bool> {
        let ty = self.mem.read_u64_non_null(obj + self.layout.object_type as u64)?;
        let is_task_type = match self.task_types.get(&ty) {
            Some(&known) => known,
            None => {
                let known = self.type_named(ty, TASK_TYPE_NAME)?;
                self.task_types.insert(ty, known);
                known
            }
        };
        Ok(is_task_type && self.mem.read_u8(obj + self.task.is_task)? == 1)
    }
}

/// The refusal of `what` (`sample --async`) for a Python without asyncio's
/// debug offsets, or None.
pub fn unsupported(python: &Python, what: &str) -> Option<String> {
    (python.layout.tstate_asyncio_running_task == NO_FIELD).then(|| {
        format!(
            "{what} needs CPython 3.14 or later, which exposes asyncio's debug offsets; this target runs {}.{}",
            python.version.major, python.version.minor
        )
    })
}

/// A pending task of the target, as `dump --async` lists it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PendingTask {
    /// The thread that made it (whose list holds it); None for a task whose
    /// thread has exited (the interpreter's list).
    pub tid: Option<u32>,
    /// Its address, as `python -m asyncio ps` shows a task's id.
    pub id: String,
    /// None: its name could not be read.
    pub name: Option<String>,
    /// "running" (its thread's running task) or "waiting".
    pub state: &'static str,
    /// Its coroutine function's qualified name, None if not readable (or
    /// not a native coroutine).
    pub coroutine: Option<String>,
    /// The tasks awaiting it one by one, the nearest first.
    pub awaited_by: Vec<String>,
    /// The tasks awaiting the last of `awaited_by` (or this task, if that
    /// is empty) when several do at once, sorted; not followed further.
    pub awaited_by_several: Vec<String>,
    /// The awaiters went on past those shown.
    pub more_awaiters: bool,
}

/// Every pending task of the target: those of each thread in
/// `thread_states` (TID, PyThreadState), then those whose thread exited.
pub struct TaskList {
    pub tasks: Vec<PendingTask>,
    /// A list was cut (past MAX_TASKS, or at a link that did not check out).
    pub cut: bool,
}

impl TaskList {
    pub fn read(pid: u32, python: &Python, thread_states: &[(u32, u64)]) -> Result<Self> {
        let layout = TaskLayout::find(pid, python)?;
        let mut reader = TaskReader::new(Memory::open(pid)?, python.layout.clone(), layout);
        let interp = reader.mem.read_u64_non_null(python.runtime_address(crate::python::RUNTIME_SYMBOL)? + python.layout.runtime_interpreters_main as u64)?;
        let mut list = TaskList { tasks: Vec::new(), cut: false };
        let mut sorted = thread_states.to_vec();
        sorted.sort_unstable();
        let threads = sorted.into_iter().map(|(tid, tstate)| (Some(tid), Some(tstate))).chain([(None, None)]);
        for (tid, tstate) in threads {
            let running = tstate.map(|t| reader.running(t).unwrap_or(0)).unwrap_or(0);
            let pending = reader.pending(tstate, interp)?;
            list.cut |= pending.cut;
            for task in pending.tasks {
                if list.tasks.len() == MAX_TASKS {
                    list.cut = true;
                    return Ok(list);
                }
                let chain = reader.chain(task).ok();
                list.tasks.push(PendingTask {
                    tid,
                    id: format!("{task:#x}"),
                    name: chain.as_ref().map(|c| c.name.clone()),
                    state: if task == running { "running" } else { "waiting" },
                    coroutine: reader.coroutine(task).ok(),
                    awaited_by: chain.as_ref().map(|c| c.awaiters.iter().rev().cloned().collect()).unwrap_or_default(),
                    awaited_by_several: chain.as_ref().map(|c| c.several.clone()).unwrap_or_default(),
                    more_awaiters: chain.is_some_and(|c| c.cut),
                });
            }
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layouts::LAYOUTS;

    fn row(version: (u32, u32)) -> &'static Layout {
        LAYOUTS.iter().find(|l| l.version == version && !l.free_threaded).unwrap()
    }

    fn section(words: [u64; SECTION_WORDS]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    /// The words Debian's 3.14 _asyncio module holds, with `running` as
    /// its running-task offset.
    fn debian_314(running: u64) -> [u64; SECTION_WORDS] {
        [0xa8, 0x88, 0x60, 0x6c, 0x6d, 0x80, 0x98, 0x37248, 0x2a80, 0x3a8, 0x360, running, 0x370]
    }

    /// Objects laid out as the 3.14 row and Debian's task layout say, in
    /// this process's memory, read back through /proc as a target's are.
    struct Fakes {
        task: Vec<u64>,
        task_type: Vec<u64>,
        int_type: Vec<u64>,
        number: Vec<u64>,
        type_name: Vec<u8>,
    }

    fn fakes(type_name: &str) -> Box<Fakes> {
        let mut f = Box::new(Fakes { task: vec![0; 0xa8 / 8], task_type: vec![0; 64], int_type: vec![0; 64], number: vec![0; 4], type_name: format!("{type_name}\0").into_bytes() });
        let l = row((3, 14));
        let o = &l.objects;
        f.task_type[(o.type_basicsize as usize - 8) / 8] = f.type_name.as_ptr() as u64;
        f.int_type[o.type_flags as usize / 8] = TPFLAGS_LONG;
        f.number[l.object_type as usize / 8] = f.int_type.as_ptr() as u64;
        f.number[o.long_size as usize / 8] = 1 << 3;
        f.number[o.long_digits as usize / 8] = 7;
        f.task[l.object_type as usize / 8] = f.task_type.as_ptr() as u64;
        f.task[0x88 / 8] = f.number.as_ptr() as u64;
        // is_task (0x6c) = 1, awaited_by_is_set (0x6d) = 0.
        f.task[0x68 / 8] = 1 << 32;
        f
    }

    fn reader() -> TaskReader {
        let l = row((3, 14));
        TaskReader::new(Memory::open(std::process::id()).unwrap(), l.clone(), TaskLayout::parse(&section(debian_314(l.tstate_asyncio_running_task as u64)), l).unwrap())
    }

    #[test]
    fn an_unnamed_task_is_task_n_and_a_cycle_of_awaiters_is_cut() {
        let mut f = fakes("_asyncio.Task");
        assert_eq!(reader().chain(f.task.as_ptr() as u64).unwrap(), TaskChain { name: "Task-7".into(), awaiters: vec![], several: vec![], cut: false });
        // Awaited by itself: a crafted cycle ends at MAX_AWAITERS.
        f.task[0x60 / 8] = f.task.as_ptr() as u64;
        let chain = reader().chain(f.task.as_ptr() as u64).unwrap();
        assert!(chain.cut && chain.awaiters.len() == MAX_AWAITERS, "{chain:?}");
        // Awaiters said to be a set that is not one: cut.
        f.task[0x68 / 8] |= 1 << 40;
        assert_eq!(reader().chain(f.task.as_ptr() as u64).unwrap(), TaskChain { name: "Task-7".into(), awaiters: vec![], several: vec![], cut: true });
    }

    #[test]
    fn a_set_of_awaiters_is_named_whole_or_cut() {
        let l = row((3, 14));
        let o = &l.objects;
        let mut awaited = fakes("_asyncio.Task");
        let (first, mut second) = (fakes("_asyncio.Task"), fakes("_asyncio.Task"));
        second.number[o.long_digits as usize / 8] = 9;
        let set_name = b"set\0".to_vec();
        let mut set_type = vec![0u64; 64];
        set_type[(o.type_basicsize as usize - 8) / 8] = set_name.as_ptr() as u64;
        // Eight slots: the two tasks, a removed entry's dummy key (an int
        // here: not a task) and empty ones.
        let mut table = vec![0u64; 8 * o.set_entry_size as usize / 8];
        let slot = |i: usize| (i * o.set_entry_size as usize + o.set_entry_key as usize) / 8;
        table[slot(1)] = first.task.as_ptr() as u64;
        table[slot(4)] = first.number.as_ptr() as u64;
        table[slot(6)] = second.task.as_ptr() as u64;
        let mut set = vec![0u64; 32];
        set[l.object_type as usize / 8] = set_type.as_ptr() as u64;
        set[o.set_used as usize / 8] = 2;
        set[o.set_mask as usize / 8] = 7;
        set[o.set_table as usize / 8] = table.as_ptr() as u64;
        awaited.task[0x60 / 8] = set.as_ptr() as u64;
        awaited.task[0x68 / 8] |= 1 << 40;
        let at = awaited.task.as_ptr() as u64;
        let want = |cut| TaskChain { name: "Task-7".into(), awaiters: vec![], several: vec!["Task-7".into(), "Task-9".into()], cut };
        assert_eq!(reader().chain(at).unwrap(), want(false));
        // The set counts an entry that is not there: named, and cut.
        set[o.set_used as usize / 8] = 3;
        assert_eq!(reader().chain(at).unwrap(), want(true));
        // A table too large to be a set's, or not a power of two: cut.
        for mask in [1 << 40, 6] {
            set[o.set_mask as usize / 8] = mask;
            assert_eq!(reader().chain(at).unwrap(), TaskChain { name: "Task-7".into(), awaiters: vec![], several: vec![], cut: true });
        }
    }

    #[test]
    fn pending_tasks_are_read_from_a_threads_list_and_a_bad_link_cuts_it() {
        let mut f = fakes("_asyncio.Task");
        let mut tstate = vec![0u64; 0x3a8 / 8];
        let head = tstate.as_ptr() as u64 + 0x370;
        let node = f.task.as_ptr() as u64 + 0x98;
        tstate[0x370 / 8] = node;
        f.task[0x98 / 8] = head;
        let tasks = reader().pending(Some(tstate.as_ptr() as u64), 0).unwrap();
        assert_eq!(tasks, PendingTasks { tasks: vec![f.task.as_ptr() as u64], cut: false });
        // An empty list: its head links to itself.
        tstate[0x370 / 8] = head;
        assert_eq!(reader().pending(Some(tstate.as_ptr() as u64), 0).unwrap(), PendingTasks::default());
        // A crafted cycle that never comes back to the head ends at MAX_TASKS.
        tstate[0x370 / 8] = node;
        f.task[0x98 / 8] = node;
        let tasks = reader().pending(Some(tstate.as_ptr() as u64), 0).unwrap();
        assert!(tasks.cut && tasks.tasks.len() == MAX_TASKS);
        // A link to something that is not a task cuts the list there.
        f.task[0x98 / 8] = tstate.as_ptr() as u64;
        let tasks = reader().pending(Some(tstate.as_ptr() as u64), 0).unwrap();
        assert_eq!(tasks, PendingTasks { tasks: vec![f.task.as_ptr() as u64], cut: true });
    }

    #[test]
    fn chains_read_back_from_their_labels() {
        for chain in [
            TaskChain { name: "alpha".into(), awaiters: vec!["Task-1".into(), "main".into()], several: vec![], cut: false },
            TaskChain { name: "Task-7".into(), awaiters: vec!["outer".into()], several: vec![], cut: true },
            TaskChain { name: "lonely".into(), awaiters: vec![], several: vec![], cut: false },
            TaskChain { name: "shared".into(), awaiters: vec!["main".into()], several: vec!["waiter-1".into(), "waiter-2".into()], cut: false },
            TaskChain { name: "wide".into(), awaiters: vec![], several: vec!["a".into(), "b".into()], cut: true },
        ] {
            let labels = chain.labels();
            assert_eq!(TaskChain::from_labels(labels.iter().map(String::as_str)), Some(chain));
        }
        assert_eq!(TaskChain::from_labels([UNREADABLE_LABEL]), None);
    }

    #[test]
    fn objects_that_are_not_tasks_or_names_are_refused() {
        let f = fakes("_asyncio.Taskette");
        assert!(reader().chain(f.task.as_ptr() as u64).is_err(), "another type's object");
        let mut f = fakes("_asyncio.Task");
        f.task[0x68 / 8] = 0;
        assert!(reader().chain(f.task.as_ptr() as u64).is_err(), "is_task not set");
        let mut f = fakes("_asyncio.Task");
        f.number[2] = 2 << 3;
        assert!(reader().chain(f.task.as_ptr() as u64).is_err(), "a two-digit number");
        let mut f = fakes("_asyncio.Task");
        f.int_type[row((3, 14)).objects.type_flags as usize / 8] = 0;
        assert!(reader().chain(f.task.as_ptr() as u64).is_err(), "a name neither str nor int");
        let mut f = fakes("_asyncio.Task");
        f.task[0x88 / 8] = 8;
        assert!(reader().chain(f.task.as_ptr() as u64).is_err(), "a name pointer into nothing");
    }

    #[test]
    fn a_section_that_agrees_with_the_headers_is_read() {
        let l = row((3, 14));
        let t = TaskLayout::parse(&section(debian_314(l.tstate_asyncio_running_task as u64)), l).unwrap();
        assert_eq!(
            t,
            TaskLayout {
                size: 0xa8,
                name: 0x88,
                awaited_by: 0x60,
                is_task: 0x6c,
                awaited_by_is_set: 0x6d,
                coro: 0x80,
                node: 0x98,
                tstate_running_task: l.tstate_asyncio_running_task as u64,
                tstate_tasks_head: 0x370,
                interp_tasks_head: 0x2a80
            }
        );
    }

    #[test]
    fn a_section_that_disagrees_or_is_out_of_bounds_is_refused() {
        let l = row((3, 14));
        let good = debian_314(l.tstate_asyncio_running_task as u64);
        let mut other = good;
        other[11] += 8;
        assert!(TaskLayout::parse(&section(other), l).is_err(), "a running-task offset the headers do not give");
        let mut outside = good;
        outside[1] = 0xa8;
        assert!(TaskLayout::parse(&section(outside), l).is_err(), "a name past the task's end");
        let mut huge = good;
        huge[0] = 1 << 40;
        assert!(TaskLayout::parse(&section(huge), l).is_err(), "a task of a terabyte");
        assert!(TaskLayout::parse(&section(good)[..96], l).is_err(), "a short section");
        assert!(TaskLayout::parse(&section(good), row((3, 13))).is_err(), "3.13 has no running task");
    }
}
