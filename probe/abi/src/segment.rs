//! Reading a results segment ([`crate::layout`]) as untrusted input: the
//! target (or anything running in it) can write any value into any word, so
//! every position is recomputed from the header and checked, every id is
//! bounds-checked, and a bad segment gives a [`SegmentError`], never a panic
//! or a read outside the slice.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::layout::{self, Geometry, Shape, entry, hdr, node, proc, record, slot};
use crate::report::{Figures, NodeReport, ProcessReport, ThreadReport};

/// Why a segment cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentError {
    /// Smaller than its header says.
    Short {
        /// Words present.
        have: u64,
        /// Words the header describes.
        need: u64,
    },
    /// Not a results segment.
    Magic,
    /// Another layout version.
    Version(u64),
    /// The header's numbers are out of the limits.
    Geometry,
    /// A record names something out of range.
    Corrupt(&'static str),
}

impl std::fmt::Display for SegmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SegmentError::Short { have, need } => {
                write!(f, "results segment has {have} words, its header describes {need}")
            }
            SegmentError::Magic => write!(f, "not a papirus results segment (bad magic)"),
            SegmentError::Version(v) => {
                write!(f, "results segment layout {v}; this papirus reads layout {}", layout::VERSION)
            }
            SegmentError::Geometry => write!(f, "results segment header is out of limits"),
            SegmentError::Corrupt(what) => write!(f, "results segment is corrupt: {what}"),
        }
    }
}

impl std::error::Error for SegmentError {}

/// Attempts at a consistent copy of a record a live thread keeps writing.
const SEQ_TRIES: usize = 64;

/// A checked view of a segment.
#[derive(Debug)]
pub struct Segment<'a> {
    w: &'a [AtomicU64],
    g: Geometry,
}

/// One process' figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSample {
    /// Process id.
    pub pid: u32,
    /// Parent's process id.
    pub parent: u32,
    /// Threads folded into `exited`.
    pub exited_threads: u64,
    /// Live threads' figures.
    pub threads: Vec<ThreadReport>,
    /// Exited threads' figures folded together (`tid` 0).
    pub exited: ThreadReport,
}

/// An open activation whose return was hijacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFrame {
    /// Process record it belongs to.
    pub process: u32,
    /// Thread.
    pub tid: u32,
    /// Address of the return-address slot.
    pub slot: u64,
    /// The real return address.
    pub ret: u64,
    /// Entry timestamp.
    pub start: u64,
    /// Function id (`u64::MAX` for a frame a forked child inherited).
    pub function: u64,
    /// Shadow-stack depth (0: outermost).
    pub depth: u64,
}

/// What one drain of a slot's trace ring found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// The position to drain from next time (records written so far).
    pub next: u64,
    /// Records overwritten before they could be copied.
    pub lost: u64,
    /// Records appended to the buffer.
    pub records: u64,
}

/// One trace record, decoded ([`layout::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// [`record::RETURNED`], [`record::UNWOUND`] or [`record::THREAD`].
    pub kind: u64,
    /// Entry timestamp (a thread record: when the thread took the slot).
    pub start: u64,
    /// Exit timestamp (a thread record: `pid << 32 | tid`).
    pub end: u64,
    /// Function id.
    pub function: u32,
    /// Shadow-stack depth.
    pub depth: u32,
    /// The slot's thread generation (modulo 2^[`record::GEN_BITS`]).
    pub generation: u64,
}

impl TraceRecord {
    /// Decodes a record's first words (at least [`record::COUNTERS`]).
    pub fn decode(w: &[u64]) -> TraceRecord {
        let info = w.get(record::INFO).copied().unwrap_or(0);
        TraceRecord {
            kind: (info >> 48) & 3,
            start: w.first().copied().unwrap_or(0),
            end: w.get(record::END).copied().unwrap_or(0),
            function: info as u32,
            depth: ((info >> 32) & 0xffff) as u32,
            generation: info >> 50,
        }
    }
}

impl<'a> Segment<'a> {
    /// Checks the header against the slice.
    pub fn new(w: &'a [AtomicU64]) -> Result<Segment<'a>, SegmentError> {
        let have = w.len() as u64;
        let get = |i: usize| w.get(i).map(|a| a.load(Ordering::Relaxed));
        if have < layout::HEADER_WORDS {
            return Err(SegmentError::Short { have, need: layout::HEADER_WORDS });
        }
        if get(hdr::MAGIC) != Some(layout::MAGIC) {
            return Err(SegmentError::Magic);
        }
        let v = get(hdr::VERSION).unwrap_or(0);
        if v != layout::VERSION {
            return Err(SegmentError::Version(v));
        }
        let n = |i| get(i).unwrap_or(0);
        let g = Geometry::new(Shape::from_header(n)).ok_or(SegmentError::Geometry)?;
        if g.total_words != n(hdr::TOTAL_WORDS) {
            return Err(SegmentError::Geometry);
        }
        if have < g.total_words {
            return Err(SegmentError::Short { have, need: g.total_words });
        }
        Ok(Segment { w, g })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.g
    }

    /// A word (0 past the end, which [`Segment::new`] rules out for every position it computes).
    fn at(&self, i: u64) -> u64 {
        usize::try_from(i).ok().and_then(|i| self.w.get(i)).map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// A header word.
    pub fn header(&self, i: usize) -> u64 {
        self.at(i as u64)
    }

    /// Slots ever claimed ([`hdr::SLOTS_USED`]): the slots worth reading.
    pub fn slots_used(&self) -> u64 {
        self.header(hdr::SLOTS_USED).min(self.g.shape.slots)
    }

    /// Threads of process record `record` inside the runtime's cold paths
    /// ([`proc::COLD`]) or in a hook's call out of the runtime
    /// ([`slot::OUTSIDE`] of its live slots); 0 for a record past the end.
    pub fn cold(&self, record: u32) -> u64 {
        let g = &self.g;
        if u64::from(record) >= g.shape.procs {
            return 0;
        }
        let outside = (0..self.slots_used())
            .map(|i| g.slot_at(i))
            .filter(|&at| {
                self.at(at + slot::STATE as u64) == slot::LIVE
                    && self.at(at + slot::PROC as u64) == u64::from(record)
                    && self.at(at + slot::OUTSIDE as u64) != 0
            })
            .count() as u64;
        self.at(g.proc_at(u64::from(record)) + proc::COLD as u64) + outside
    }

    /// Copies the words of `ranges` (start, length; inside the segment)
    /// consistently with the sequence word at `seq` when it can, one range
    /// after the other; `(words, torn)`.
    fn copy(&self, seq: u64, ranges: &[(u64, u64)]) -> (Vec<u64>, bool) {
        let seq = &self.w[seq as usize];
        let mut out = Vec::with_capacity(ranges.iter().map(|r| r.1 as usize).sum());
        let fill = |out: &mut Vec<u64>| {
            out.clear();
            for &(s, len) in ranges {
                out.extend(self.w[s as usize..(s + len) as usize].iter().map(|w| w.load(Ordering::Relaxed)));
            }
        };
        for _ in 0..SEQ_TRIES {
            let s1 = seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                fill(&mut out);
                fence(Ordering::Acquire);
                if seq.load(Ordering::Relaxed) == s1 {
                    return (out, false);
                }
            }
            std::thread::yield_now();
        }
        fill(&mut out);
        (out, true)
    }

    fn nevents(&self) -> usize {
        (self.header(hdr::NEVENTS) as usize).min(layout::MAX_EVENTS)
    }

    /// A tree from its node words (root first) and the nodes open on the
    /// thread's stack: the report's nodes, root left out, renumbered.
    fn tree(&self, words: &[u64], open: &[u64]) -> Result<Vec<NodeReport>, SegmentError> {
        let nev = self.nevents();
        let nw = layout::NODE_WORDS as usize;
        let mut nodes: Vec<NodeReport> = Vec::with_capacity(words.len() / nw);
        let mut open_at = vec![0u64; words.len() / nw];
        for &n in open {
            if let Some(o) = open_at.get_mut(n as usize) {
                *o += 1;
            }
        }
        for (i, w) in words.chunks_exact(nw).enumerate().skip(1) {
            let link = w[node::LINK];
            let (parent, function) = (link >> 32, link & 0xffff_ffff);
            if parent >= i as u64 || function >= self.g.shape.funcs {
                return Err(SegmentError::Corrupt("a tree node names an unknown parent or function"));
            }
            let (calls, unwound) = (w[node::CALLS], w[node::UNWOUND]);
            nodes.push(NodeReport {
                parent: (parent > 0).then(|| parent as u32 - 1),
                function: function as u32,
                figures: Figures {
                    calls,
                    exits: calls.saturating_sub(unwound).saturating_sub(open_at[i]),
                    unwound,
                    incl_ticks: w[node::INCL],
                    excl_ticks: w[node::EXCL],
                    min_ticks: if w[node::MIN] == u64::MAX { 0 } else { w[node::MIN] },
                    max_ticks: w[node::MAX],
                    counters_incl: w[node::CINCL..node::CINCL + nev].to_vec(),
                    counters_excl: w[node::CEXCL..node::CEXCL + nev].to_vec(),
                },
            });
        }
        Ok(nodes)
    }

    /// Every process record's figures, in record order (the target first).
    pub fn sample(&self) -> Result<Vec<ProcessSample>, SegmentError> {
        let g = self.g;
        let nw = layout::NODE_WORDS;
        let claimed = self.header(hdr::NEXT_PROC).min(g.shape.procs);
        let mut procs: Vec<ProcessSample> = Vec::new();
        // Record index → position in `procs`.
        let mut index = vec![None; claimed as usize];
        for i in 0..claimed {
            let at = g.proc_at(i);
            if self.at(at + proc::STATE as u64) == 0 {
                continue;
            }
            let used = self.at(at + proc::NODES_USED as u64).clamp(1, g.shape.proc_nodes);
            let hw = layout::PROC_HEADER_WORDS;
            let (words, torn) = self.copy(at, &[(at, hw), (at + g.proc_nodes(), used * nw)]);
            if words[proc::STATE] == 0 {
                continue;
            }
            let mut exited = ThreadReport {
                tid: 0,
                pid: words[proc::PID] as u32,
                exited_threads: words[proc::EXITED_THREADS],
                torn,
                tree: self.tree(&words[hw as usize..], &[])?,
                reentered: words[proc::REENTERED],
                overflow: words[proc::UNTIMED],
                node_overflow: words[proc::NODE_OVERFLOW],
                ..Default::default()
            };
            exited.derive();
            index[i as usize] = Some(procs.len());
            procs.push(ProcessSample {
                pid: words[proc::PID] as u32,
                parent: words[proc::PARENT] as u32,
                exited_threads: words[proc::EXITED_THREADS],
                threads: Vec::new(),
                exited,
            });
        }
        let hw = layout::SLOT_HEADER_WORDS;
        for i in 0..self.slots_used() {
            let at = g.slot_at(i);
            if self.at(at + slot::STATE as u64) == slot::FREE {
                continue;
            }
            let depth = self.at(at + slot::DEPTH as u64).min(g.shape.depth);
            let used = self.at(at + slot::NODES_USED as u64).clamp(1, g.shape.nodes);
            let ew = layout::ENTRY_WORDS;
            let (words, torn) = self
                .copy(at, &[(at, hw), (at + g.slot_stack(), depth * ew), (at + g.slot_nodes(), used * nw)]);
            if words[slot::STATE] == slot::FREE {
                continue;
            }
            let p = usize::try_from(words[slot::PROC]).unwrap_or(usize::MAX);
            let Some(&Some(pos)) = index.get(p) else {
                return Err(SegmentError::Corrupt("a thread belongs to no process record"));
            };
            let stack = &words[hw as usize..(hw + depth * ew) as usize];
            let open: Vec<u64> = stack.chunks_exact(ew as usize).map(|e| e[entry::NODE]).collect();
            let ps = &mut procs[pos];
            let errno = words[slot::COUNTERS_ERRNO];
            let mut t = ThreadReport {
                tid: words[slot::TID] as u32,
                pid: ps.pid,
                exited_threads: 0,
                ended: words[slot::STATE] == slot::KEPT,
                torn,
                tree: self.tree(&words[(hw + depth * ew) as usize..], &open)?,
                open: depth,
                reentered: words[slot::REENTERED],
                overflow: words[slot::UNTIMED],
                node_overflow: words[slot::NODE_OVERFLOW],
                counters_error: (errno != 0)
                    .then(|| format!("the kernel refused the counter group (errno {errno})")),
                ..Default::default()
            };
            t.derive();
            ps.threads.push(t);
        }
        Ok(procs)
    }

    /// Every open activation of every live slot whose return address the
    /// runtime replaced, innermost first per thread (the order to put them
    /// back in). Read while the target is stopped, or after it ended.
    pub fn open_frames(&self) -> Vec<OpenFrame> {
        let g = self.g;
        let mut out = Vec::new();
        for i in 0..self.slots_used() {
            let at = g.slot_at(i);
            if self.at(at + slot::STATE as u64) != slot::LIVE {
                continue;
            }
            let depth = self.at(at + slot::DEPTH as u64).min(g.shape.depth);
            let tid = self.at(at + slot::TID as u64) as u32;
            let process = self.at(at + slot::PROC as u64).min(g.shape.procs) as u32;
            for d in (0..depth).rev() {
                let e = at + g.slot_stack() + d * layout::ENTRY_WORDS;
                out.push(OpenFrame {
                    process,
                    tid,
                    slot: self.at(e + entry::SLOT as u64),
                    ret: self.at(e + entry::RET as u64),
                    start: self.at(e + entry::START as u64),
                    function: self.at(e + entry::FID as u64),
                    depth: d,
                });
            }
        }
        out
    }

    /// The thread id and trace generation a slot holds now.
    pub fn slot_owner(&self, i: u64) -> Option<(u32, u64)> {
        (i < self.g.shape.slots).then(|| {
            let at = self.g.slot_at(i);
            (self.at(at + slot::TID as u64) as u32, self.at(at + slot::TRACE_GEN as u64))
        })
    }

    /// The process record index slot `i`'s thread belongs to.
    pub fn slot_process(&self, i: u64) -> u64 {
        if i >= self.g.shape.slots {
            return u64::MAX;
        }
        self.at(self.g.slot_at(i) + slot::PROC as u64)
    }

    /// The pid of process record `record` (0 when out of range or not yet claimed).
    pub fn process_pid(&self, record: u64) -> u32 {
        if record >= self.g.shape.procs {
            return 0;
        }
        self.at(self.g.proc_at(record) + proc::PID as u64) as u32
    }

    /// Appends the trace records of slot `i` written since position `from`
    /// to `out` (each [`Shape::record_words`] words, oldest first), following
    /// the ring's ordering rules ([`layout`]): records overwritten before they
    /// were copied are counted in [`Drained::lost`], never returned.
    pub fn drain(&self, i: u64, from: u64, out: &mut Vec<u64>) -> Drained {
        let g = self.g;
        let (ring, rw) = (g.shape.ring, g.shape.record_words);
        if ring == 0 || i >= g.shape.slots {
            return Drained { next: from, lost: 0, records: 0 };
        }
        let at = g.slot_at(i);
        let head_word = &self.w[(at + slot::TRACE_HEAD as u64) as usize];
        let head = head_word.load(Ordering::Acquire);
        // A head that went backwards (a hostile target) restarts the count there.
        let from = if from > head { head } else { from };
        let first = from.max(head.saturating_sub(ring));
        let base = at + g.slot_ring();
        let mark = out.len();
        // At most two runs of the ring: up to its end, then from its start.
        let (a, n) = (first & (ring - 1), head - first);
        let first_run = n.min(ring - a);
        for (from_record, records) in [(a, first_run), (0, n - first_run)] {
            let s = (base + from_record * rw) as usize;
            out.extend(self.w[s..s + (records * rw) as usize].iter().map(|w| w.load(Ordering::Relaxed)));
        }
        fence(Ordering::Acquire);
        let h2 = head_word.load(Ordering::Relaxed);
        // Records at or below h2 − ring may have been overwritten while copied.
        let valid = h2.saturating_add(1).saturating_sub(ring).max(first).min(head);
        let torn = valid - first;
        out.drain(mark..mark + (torn * rw) as usize);
        Drained { next: head, lost: first - from + torn, records: head - valid }
    }
}

/// The report's thread list and process list from samples: per process its
/// live threads, then its exited threads folded (when there were any). The
/// processes' `ended` is left empty for the caller, which knows how they ended.
pub fn flatten(procs: Vec<ProcessSample>) -> (Vec<ThreadReport>, Vec<ProcessReport>) {
    let mut threads = Vec::new();
    let mut processes = Vec::new();
    for p in procs {
        processes.push(ProcessReport {
            pid: p.pid,
            parent: p.parent,
            ended: String::new(),
            exited_threads: p.exited_threads,
        });
        threads.extend(p.threads);
        if p.exited_threads > 0 || !p.exited.tree.is_empty() {
            threads.push(p.exited);
        }
    }
    (threads, processes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ROOT_LINK, Shape};

    fn shape() -> Shape {
        Shape { funcs: 3, nodes: 8, proc_nodes: 16, depth: 4, slots: 2, procs: 2, ring: 0, record_words: 3 }
    }

    fn segment(g: Geometry) -> Vec<AtomicU64> {
        let w: Vec<AtomicU64> = (0..g.total_words).map(|_| AtomicU64::new(0)).collect();
        let set = |i: usize, v: u64| w[i].store(v, Ordering::Relaxed);
        set(hdr::MAGIC, layout::MAGIC);
        set(hdr::VERSION, layout::VERSION);
        set(hdr::TOTAL_WORDS, g.total_words);
        for (i, v) in g.shape.header() {
            set(i, v);
        }
        set(hdr::SLOTS_USED, g.shape.slots);
        w
    }

    /// Writes node `i` of the tree at word `at`: (parent, function, calls, unwound, incl, excl).
    fn node(w: &[AtomicU64], at: u64, i: u64, n: (u64, u64, u64, u64, u64, u64)) {
        let set =
            |k: usize, v: u64| w[(at + i * layout::NODE_WORDS) as usize + k].store(v, Ordering::Relaxed);
        set(node::LINK, if i == 0 { ROOT_LINK } else { n.0 << 32 | n.1 });
        set(node::CALLS, n.2);
        set(node::UNWOUND, n.3);
        set(node::INCL, n.4);
        set(node::EXCL, n.5);
        set(node::MIN, if n.2 > 0 { 1 } else { u64::MAX });
        set(node::MAX, n.4);
    }

    #[test]
    fn reads_trees_and_derives_flat_figures() {
        let g = Geometry::new(shape()).unwrap();
        let w = segment(g);
        let set = |i: u64, v: u64| w[i as usize].store(v, Ordering::Relaxed);
        set(hdr::NEXT_PROC as u64, 1);
        let p = g.proc_at(0);
        set(p + proc::STATE as u64, 1);
        set(p + proc::PID as u64, 42);
        set(p + proc::EXITED_THREADS as u64, 7);
        set(p + proc::NODES_USED as u64, 2);
        node(&w, p + g.proc_nodes(), 0, (0, 0, 0, 0, 0, 0));
        node(&w, p + g.proc_nodes(), 1, (0, 2, 700, 0, 7000, 7000));
        // A live thread: main (0) → fib (1) → fib (1), fib called 3 times in
        // all, the inner one still open on the stack.
        let s = g.slot_at(1);
        set(s + slot::STATE as u64, slot::LIVE);
        set(s + slot::TID as u64, 43);
        set(s + slot::NODES_USED as u64, 4);
        set(s + slot::DEPTH as u64, 1);
        set(s + g.slot_stack() + entry::NODE as u64, 3);
        let t = s + g.slot_nodes();
        node(&w, t, 0, (0, 0, 0, 0, 0, 0));
        node(&w, t, 1, (0, 0, 1, 0, 100, 40));
        node(&w, t, 2, (1, 1, 2, 1, 60, 50));
        node(&w, t, 3, (2, 1, 1, 0, 0, 0));
        let seg = Segment::new(&w).unwrap();
        let procs = seg.sample().unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!((procs[0].pid, procs[0].exited_threads), (42, 7));
        assert_eq!(procs[0].exited.functions[0].id, 2);
        assert_eq!(procs[0].exited.functions[0].figures.calls, 700);
        let th = &procs[0].threads[0];
        assert_eq!((th.tid, th.pid, th.open), (43, 42, 1));
        assert_eq!(th.tree.len(), 3);
        assert_eq!((th.tree[1].parent, th.tree[2].parent), (Some(0), Some(1)));
        assert_eq!(
            (th.tree[2].figures.exits, th.tree[2].figures.min_ticks),
            (0, 1),
            "the open activation is not an exit"
        );
        let fib = th.functions.iter().find(|f| f.id == 1).unwrap();
        // Three calls, one unwound, one open; inclusive only from the outermost level.
        assert_eq!(
            (
                fib.figures.calls,
                fib.figures.exits,
                fib.figures.unwound,
                fib.figures.incl_ticks,
                fib.figures.excl_ticks
            ),
            (3, 1, 1, 60, 50)
        );
        assert_eq!(th.callees.len(), 2);
        assert_eq!((th.callees[0].caller, th.callees[0].callee, th.callees[0].calls), (0, 1, 2));
        assert_eq!((th.callees[1].caller, th.callees[1].callee, th.callees[1].calls), (1, 1, 1));
        // Threads in the runtime's cold paths, per record; none past the last record.
        assert!((proc::COLD as u64) < layout::PROC_HEADER_WORDS);
        set(p + proc::COLD as u64, 2);
        assert_eq!((seg.cold(0), seg.cold(1), seg.cold(2), seg.cold(u32::MAX)), (2, 0, 0, 0));
        let open = seg.open_frames();
        assert_eq!((open.len(), open[0].tid, open[0].depth), (1, 43, 0));
        // Slots at or above the claimed bound are never read (their pages stay unallocated).
        set(hdr::SLOTS_USED as u64, 1);
        assert!(seg.sample().unwrap()[0].threads.is_empty());
        assert!(seg.open_frames().is_empty());
        set(p + proc::COLD as u64, 0);
        set(s + slot::OUTSIDE as u64, 1);
        assert_eq!(seg.cold(0), 0);
        set(hdr::SLOTS_USED as u64, 2);
        assert_eq!(seg.cold(0), 1);
    }

    #[test]
    fn hostile_segments_give_errors() {
        let g = Geometry::new(shape()).unwrap();
        let w = segment(g);
        assert!(matches!(Segment::new(&w[..w.len() - 1]), Err(SegmentError::Short { .. })));
        w[hdr::FUNCS].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(Segment::new(&w).unwrap_err(), SegmentError::Geometry);
        w[hdr::FUNCS].store(3, Ordering::Relaxed);
        w[hdr::TOTAL_WORDS].store(1, Ordering::Relaxed);
        assert_eq!(Segment::new(&w).unwrap_err(), SegmentError::Geometry);
        w[hdr::TOTAL_WORDS].store(g.total_words, Ordering::Relaxed);
        // A node naming function 2^31, then a node whose parent follows it,
        // then a thread in a record never claimed.
        w[hdr::NEXT_PROC].store(u64::MAX, Ordering::Relaxed);
        let p = g.proc_at(0);
        w[(p + proc::STATE as u64) as usize].store(1, Ordering::Relaxed);
        w[(p + proc::NODES_USED as u64) as usize].store(2, Ordering::Relaxed);
        let link = (p + g.proc_nodes() + layout::NODE_WORDS) as usize;
        w[link].store(1 << 31, Ordering::Relaxed);
        let seg = Segment::new(&w).unwrap();
        assert!(matches!(seg.sample(), Err(SegmentError::Corrupt(_))));
        w[link].store(5 << 32, Ordering::Relaxed);
        assert!(matches!(seg.sample(), Err(SegmentError::Corrupt(_))));
        w[link].store(0, Ordering::Relaxed);
        let s = g.slot_at(0);
        w[(s + slot::STATE as u64) as usize].store(1, Ordering::Relaxed);
        w[(s + slot::PROC as u64) as usize].store(u64::MAX, Ordering::Relaxed);
        w[(s + slot::DEPTH as u64) as usize].store(u64::MAX, Ordering::Relaxed);
        assert!(matches!(seg.sample(), Err(SegmentError::Corrupt(_))));
        assert_eq!(seg.open_frames().len(), 4);
        w[hdr::MAGIC].store(1, Ordering::Relaxed);
        assert_eq!(Segment::new(&w).unwrap_err(), SegmentError::Magic);
    }

    #[test]
    fn random_words_never_panic() {
        let g = Geometry::new(Shape { funcs: 5, slots: 4, procs: 3, ring: 4, ..shape() }).unwrap();
        let w = segment(g);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut buf = Vec::new();
        for round in 0..200 {
            for a in w.iter().skip(layout::HEADER_WORDS as usize) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly small values, so states, ids and depths hit their edges.
                a.store(if round % 2 == 0 { x % 4 } else { x }, Ordering::Relaxed);
            }
            w[hdr::NEXT_PROC].store(x % 8, Ordering::Relaxed);
            w[hdr::NEVENTS].store(x % 9, Ordering::Relaxed);
            let seg = Segment::new(&w).unwrap();
            let _ = seg.sample();
            assert!(seg.open_frames().len() as u64 <= g.shape.slots * g.shape.depth);
            for i in 0..g.shape.slots + 1 {
                buf.clear();
                let d = seg.drain(i, x % 16, &mut buf);
                assert!(d.records <= 4 && buf.len() as u64 == d.records * 3);
            }
        }
    }

    #[test]
    fn drains_whole_records_and_counts_the_overwritten() {
        let g = Geometry::new(Shape { ring: 4, record_words: 3, ..shape() }).unwrap();
        let w = segment(g);
        let s = g.slot_at(0);
        let write = |i: u64| {
            let at = (s + g.slot_ring() + (i % 4) * 3) as usize;
            let info = (record::RETURNED << 48) | (2u64 << 32) | 1;
            w[at].store(10 * i, Ordering::Relaxed);
            w[at + 1].store(10 * i + 5, Ordering::Relaxed);
            w[at + 2].store(info, Ordering::Relaxed);
            w[(s + slot::TRACE_HEAD as u64) as usize].store(i + 1, Ordering::Release);
        };
        let seg = Segment::new(&w).unwrap();
        let mut buf = Vec::new();
        for i in 0..3 {
            write(i);
        }
        let d = seg.drain(0, 0, &mut buf);
        assert_eq!(d, Drained { next: 3, lost: 0, records: 3 });
        let r = TraceRecord::decode(&buf[6..9]);
        assert_eq!((r.start, r.end, r.function, r.depth, r.kind), (20, 25, 1, 2, record::RETURNED));
        // Ten more records: six were overwritten before this drain, and the
        // writer may be overwriting a seventh (its next record's place).
        for i in 3..13 {
            write(i);
        }
        buf.clear();
        let d = seg.drain(0, 3, &mut buf);
        assert_eq!(d, Drained { next: 13, lost: 7, records: 3 });
        assert_eq!(buf[0], 100, "the oldest record kept is number 10");
        // A head that goes backwards does not make the reader copy the ring again.
        w[(s + slot::TRACE_HEAD as u64) as usize].store(2, Ordering::Release);
        assert_eq!(seg.drain(0, 13, &mut buf).records, 0);
    }
}
