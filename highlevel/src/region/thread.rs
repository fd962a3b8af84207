//! The owning thread's regions: its counters, its region tree and the
//! stack of open regions with their readings at begin.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use papirus_lowlevel::{Tid, thread_id};

use super::RegionError;
use super::cells::{RegionCell, ThreadShared, threads};
use super::config::{Setup, setup};
use super::counters::{Reading, ThreadCounters};

const NO_PARENT: u32 = u32::MAX;

#[derive(Debug)]
pub(super) struct ThreadRegions {
    pub(super) shared: Arc<ThreadShared>,
    setup: &'static Setup,
    pub(super) counters: ThreadCounters,
    names: HashMap<Box<str>, u32>,
    nodes: HashMap<(u32, u32), u32>,
    /// The owner's handles, indexed by region id.
    cells: Vec<Arc<RegionCell>>,
    /// Open regions, innermost last.
    pub(super) stack: Vec<u32>,
    /// Readings at begin, one per open region (kept beyond the depth for reuse).
    starts: Vec<Reading>,
    now: Reading,
    deltas: Vec<i64>,
}

impl ThreadRegions {
    pub(super) fn new() -> Result<ThreadRegions, RegionError> {
        let setup = setup()?;
        let tid = thread_id();
        let counters = ThreadCounters::open(&setup.plans).map_err(|source| RegionError::Counters {
            thread: tid,
            op: "open",
            source: Box::new(source),
        })?;
        let shared = Arc::new(ThreadShared {
            tid,
            name: std::thread::current().name().unwrap_or("").to_string(),
            exited: AtomicBool::new(false),
            guard_errors: AtomicU64::new(0),
            regions: Mutex::new(vec![]),
        });
        threads().push(shared.clone());
        Ok(ThreadRegions {
            shared,
            setup,
            now: counters.reading(),
            counters,
            names: HashMap::new(),
            nodes: HashMap::new(),
            cells: vec![],
            stack: vec![],
            starts: vec![],
            deltas: vec![0; setup.metrics.len()],
        })
    }

    fn node(&mut self, name: &str) -> u32 {
        let parent = self.stack.last().copied().unwrap_or(NO_PARENT);
        let name_id = match self.names.get(name) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.insert(name.into(), id);
                id
            }
        };
        if let Some(&n) = self.nodes.get(&(parent, name_id)) {
            return n;
        }
        let id = self.cells.len() as u32;
        let cell = Arc::new(RegionCell::new(
            name,
            id,
            (parent != NO_PARENT).then_some(parent),
            self.setup.metrics.len(),
        ));
        self.shared.regions().push(cell.clone());
        self.cells.push(cell);
        self.nodes.insert((parent, name_id), id);
        id
    }

    fn failed(&self, source: papirus_substrate::Error) -> RegionError {
        RegionError::Counters { thread: self.shared.tid, op: "read", source: Box::new(source) }
    }

    pub(super) fn begin(&mut self, name: &str) -> Result<(), RegionError> {
        let node = self.node(name);
        let depth = self.stack.len();
        while self.starts.len() <= depth {
            self.starts.push(self.counters.reading());
        }
        self.counters.read(&mut self.starts[depth], true).map_err(|e| self.failed(e))?;
        self.cells[node as usize].opened();
        self.stack.push(node);
        Ok(())
    }

    pub(super) fn end(&mut self, name: &str) -> Result<(), RegionError> {
        let tid = self.shared.tid;
        let Some(&top) = self.stack.last() else {
            return Err(not_open_here(name, tid));
        };
        if &*self.cells[top as usize].name != name {
            if self.stack.iter().any(|&n| &*self.cells[n as usize].name == name) {
                return Err(RegionError::OutOfOrder {
                    ended: name.into(),
                    innermost: self.cells[top as usize].name.to_string(),
                    thread: tid,
                });
            }
            return Err(not_open_here(name, tid));
        }
        self.counters.read(&mut self.now, false).map_err(|e| self.failed(e))?;
        let start = &self.starts[self.stack.len() - 1];
        self.counters.deltas(start, &self.now, &mut self.deltas);
        self.cells[top as usize].record(&self.deltas);
        self.stack.pop();
        Ok(())
    }
}

/// The error for ending a region not open in the calling thread: which
/// thread has it open, if any.
fn not_open_here(name: &str, tid: Tid) -> RegionError {
    for t in threads().iter() {
        if t.tid != tid && t.regions().iter().any(|c| &*c.name == name && c.is_open()) {
            return RegionError::OtherThread { name: name.into(), begun_in: t.tid, ended_in: tid };
        }
    }
    RegionError::NotBegun { name: name.into(), thread: tid }
}

impl Drop for ThreadRegions {
    fn drop(&mut self) {
        self.shared.exited.store(true, Ordering::Release);
    }
}
