//! Reading a results segment ([`crate::layout`]) as untrusted input: the
//! target (or anything running in it) can write any value into any word, so
//! every position is recomputed from the header and checked, every id is
//! bounds-checked, and a bad segment gives a [`SegmentError`], never a panic
//! or a read outside the slice.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::layout::{self, Geometry, entry, hdr, proc, slot, stat};
use crate::report::{EdgeReport, FunctionReport, ProcessReport, ThreadReport};

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
        let g = Geometry::new(n(hdr::FUNCS), n(hdr::EDGES), n(hdr::DEPTH), n(hdr::SLOTS), n(hdr::PROCS))
            .ok_or(SegmentError::Geometry)?;
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

    /// Threads of process record `record` inside the runtime's cold paths
    /// ([`proc::COLD`]) or in a hook's call out of the runtime
    /// ([`slot::OUTSIDE`] of its live slots); 0 for a record past the end.
    pub fn cold(&self, record: u32) -> u64 {
        let g = &self.g;
        if u64::from(record) >= g.procs {
            return 0;
        }
        let outside = (0..g.slots)
            .map(|i| g.slot_at(i))
            .filter(|&at| {
                self.at(at + slot::STATE as u64) == slot::LIVE
                    && self.at(at + slot::PROC as u64) == u64::from(record)
                    && self.at(at + slot::OUTSIDE as u64) != 0
            })
            .count() as u64;
        self.at(g.proc_at(u64::from(record)) + proc::COLD as u64) + outside
    }

    /// Copies `len` words from `start` consistently with the sequence word at
    /// `start` when it can; `(words, torn)`.
    fn copy(&self, start: u64, len: u64) -> (Vec<u64>, bool) {
        let range = |s: u64| {
            let s = s as usize;
            &self.w[s..s + len as usize]
        };
        let words = range(start);
        let mut out = vec![0; len as usize];
        for _ in 0..SEQ_TRIES {
            let s1 = words[0].load(Ordering::Acquire);
            if s1 & 1 == 0 {
                for (o, w) in out.iter_mut().zip(words) {
                    *o = w.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                if words[0].load(Ordering::Relaxed) == s1 {
                    return (out, false);
                }
            }
            std::thread::yield_now();
        }
        for (o, w) in out.iter_mut().zip(words) {
            *o = w.load(Ordering::Relaxed);
        }
        (out, true)
    }

    fn nevents(&self) -> usize {
        (self.header(hdr::NEVENTS) as usize).min(layout::MAX_EVENTS)
    }

    fn functions(&self, rows: &[u64]) -> Vec<FunctionReport> {
        let nev = self.nevents();
        rows.chunks_exact(layout::STAT_WORDS as usize)
            .enumerate()
            .filter(|(_, r)| r[stat::CALLS] > 0)
            .map(|(id, r)| FunctionReport {
                id: id as u32,
                calls: r[stat::CALLS],
                exits: r[stat::EXITS],
                unwound: r[stat::UNWOUND],
                incl_ticks: r[stat::INCL],
                excl_ticks: r[stat::EXCL],
                min_ticks: r[stat::MIN],
                max_ticks: r[stat::MAX],
                counters_incl: r[stat::CINCL..stat::CINCL + nev].to_vec(),
                counters_excl: r[stat::CEXCL..stat::CEXCL + nev].to_vec(),
            })
            .collect()
    }

    fn edges(&self, words: &[u64]) -> Result<Vec<EdgeReport>, SegmentError> {
        let mut out = Vec::new();
        for e in words.chunks_exact(layout::EDGE_WORDS as usize).filter(|e| e[0] != 0) {
            let (caller, callee) = ((e[0] >> 32).wrapping_sub(1), e[0] & 0xffff_ffff);
            if caller >= self.g.funcs || callee >= self.g.funcs {
                return Err(SegmentError::Corrupt("a caller → callee pair names an unknown function"));
            }
            out.push(EdgeReport {
                caller: caller as u32,
                callee: callee as u32,
                calls: e[1],
                incl_ticks: e[2],
            });
        }
        Ok(out)
    }

    /// Every process record's figures, in record order (the target first).
    pub fn sample(&self) -> Result<Vec<ProcessSample>, SegmentError> {
        let g = self.g;
        let claimed = self.header(hdr::NEXT_PROC).min(g.procs);
        let mut procs: Vec<ProcessSample> = Vec::new();
        // Record index → position in `procs`.
        let mut index = vec![None; claimed as usize];
        for i in 0..claimed {
            let at = g.proc_at(i);
            let (words, torn) = self.copy(at, g.proc_words);
            if words[proc::STATE] == 0 {
                continue;
            }
            let stats = &words[g.proc_stats() as usize..g.proc_edges() as usize];
            let exited = ThreadReport {
                tid: 0,
                pid: words[proc::PID] as u32,
                exited_threads: words[proc::EXITED_THREADS],
                torn,
                functions: self.functions(stats),
                callees: self.edges(&words[g.proc_edges() as usize..])?,
                reentered: words[proc::REENTERED],
                overflow: words[proc::UNTIMED],
                edge_overflow: words[proc::EDGE_OVERFLOW],
                ..Default::default()
            };
            index[i as usize] = Some(procs.len());
            procs.push(ProcessSample {
                pid: words[proc::PID] as u32,
                parent: words[proc::PARENT] as u32,
                exited_threads: words[proc::EXITED_THREADS],
                threads: Vec::new(),
                exited,
            });
        }
        // Slots: header, statistics and edges (not the shadow stack).
        let len = g.slot_stack();
        for i in 0..g.slots {
            let at = g.slot_at(i);
            if self.at(at + slot::STATE as u64) == 0 {
                continue;
            }
            let (words, torn) = self.copy(at, len);
            if words[slot::STATE] == slot::FREE {
                continue;
            }
            let p = usize::try_from(words[slot::PROC]).unwrap_or(usize::MAX);
            let Some(&Some(pos)) = index.get(p) else {
                return Err(SegmentError::Corrupt("a thread belongs to no process record"));
            };
            let ps = &mut procs[pos];
            let pid = ps.pid;
            let errno = words[slot::COUNTERS_ERRNO];
            ps.threads.push(ThreadReport {
                tid: words[slot::TID] as u32,
                pid,
                exited_threads: 0,
                ended: words[slot::STATE] == slot::KEPT,
                torn,
                functions: self.functions(&words[g.slot_stats() as usize..g.slot_edges() as usize]),
                callees: self.edges(&words[g.slot_edges() as usize..])?,
                open: words[slot::DEPTH].min(g.depth),
                reentered: words[slot::REENTERED],
                overflow: words[slot::UNTIMED],
                edge_overflow: words[slot::EDGE_OVERFLOW],
                counters_error: (errno != 0)
                    .then(|| format!("the kernel refused the counter group (errno {errno})")),
            });
        }
        Ok(procs)
    }

    /// Every open activation of every live slot whose return address the
    /// runtime replaced, innermost first per thread (the order to put them
    /// back in). Read while the target is stopped.
    pub fn open_frames(&self) -> Vec<OpenFrame> {
        let g = self.g;
        let mut out = Vec::new();
        for i in 0..g.slots {
            let at = g.slot_at(i);
            if self.at(at + slot::STATE as u64) != slot::LIVE {
                continue;
            }
            let depth = self.at(at + slot::DEPTH as u64).min(g.depth);
            let tid = self.at(at + slot::TID as u64) as u32;
            let process = self.at(at + slot::PROC as u64).min(g.procs) as u32;
            for d in (0..depth).rev() {
                let e = at + g.slot_stack() + d * layout::ENTRY_WORDS;
                out.push(OpenFrame {
                    process,
                    tid,
                    slot: self.at(e + entry::SLOT as u64),
                    ret: self.at(e + entry::RET as u64),
                });
            }
        }
        out
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
        if p.exited_threads > 0 || !p.exited.functions.is_empty() {
            threads.push(p.exited);
        }
    }
    (threads, processes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(g: Geometry) -> Vec<AtomicU64> {
        let w: Vec<AtomicU64> = (0..g.total_words).map(|_| AtomicU64::new(0)).collect();
        let set = |i: u64, v: u64| w[i as usize].store(v, Ordering::Relaxed);
        set(hdr::MAGIC as u64, layout::MAGIC);
        set(hdr::VERSION as u64, layout::VERSION);
        set(hdr::FUNCS as u64, g.funcs);
        set(hdr::EDGES as u64, g.edges);
        set(hdr::DEPTH as u64, g.depth);
        set(hdr::SLOTS as u64, g.slots);
        set(hdr::PROCS as u64, g.procs);
        set(hdr::TOTAL_WORDS as u64, g.total_words);
        w
    }

    #[test]
    fn reads_threads_and_totals() {
        let g = Geometry::new(3, 256, 4, 2, 2).unwrap();
        let w = segment(g);
        let set = |i: u64, v: u64| w[i as usize].store(v, Ordering::Relaxed);
        set(hdr::NEXT_PROC as u64, 1);
        let p = g.proc_at(0);
        set(p + proc::STATE as u64, 1);
        set(p + proc::PID as u64, 42);
        set(p + proc::EXITED_THREADS as u64, 7);
        set(p + g.proc_stats() + 2 * layout::STAT_WORDS, 700);
        let s = g.slot_at(1);
        set(s + slot::STATE as u64, 1);
        set(s + slot::TID as u64, 43);
        set(s + g.slot_stats() + stat::CALLS as u64, 5);
        set(s + g.slot_edges(), (1 << 32) | 2);
        set(s + g.slot_edges() + 1, 9);
        let seg = Segment::new(&w).unwrap();
        let procs = seg.sample().unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!((procs[0].pid, procs[0].exited_threads), (42, 7));
        assert_eq!(procs[0].exited.functions[0].id, 2);
        assert_eq!(procs[0].exited.functions[0].calls, 700);
        let t = &procs[0].threads[0];
        assert_eq!((t.tid, t.pid, t.functions[0].calls), (43, 42, 5));
        assert_eq!(t.callees[0], EdgeReport { caller: 0, callee: 2, calls: 9, incl_ticks: 0 });
        // Threads in the runtime's cold paths, per record; none past the last record.
        assert!((proc::COLD as u64) < layout::PROC_HEADER_WORDS);
        set(p + proc::COLD as u64, 2);
        assert_eq!((seg.cold(0), seg.cold(1), seg.cold(2), seg.cold(u32::MAX)), (2, 0, 0, 0));
    }

    #[test]
    fn hostile_segments_give_errors() {
        let g = Geometry::new(3, 256, 4, 2, 2).unwrap();
        let w = segment(g);
        assert!(matches!(Segment::new(&w[..w.len() - 1]), Err(SegmentError::Short { .. })));
        w[hdr::FUNCS].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(Segment::new(&w).unwrap_err(), SegmentError::Geometry);
        w[hdr::FUNCS].store(3, Ordering::Relaxed);
        w[hdr::TOTAL_WORDS].store(1, Ordering::Relaxed);
        assert_eq!(Segment::new(&w).unwrap_err(), SegmentError::Geometry);
        w[hdr::TOTAL_WORDS].store(g.total_words, Ordering::Relaxed);
        // An edge naming function 2^31, a thread in a record never claimed.
        w[hdr::NEXT_PROC].store(u64::MAX, Ordering::Relaxed);
        let p = g.proc_at(0);
        w[(p + proc::STATE as u64) as usize].store(1, Ordering::Relaxed);
        w[(p + g.proc_edges()) as usize].store(1 << 31, Ordering::Relaxed);
        let seg = Segment::new(&w).unwrap();
        assert!(matches!(seg.sample(), Err(SegmentError::Corrupt(_))));
        w[(p + g.proc_edges()) as usize].store(0, Ordering::Relaxed);
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
        let g = Geometry::new(5, 256, 8, 4, 3).unwrap();
        let w = segment(g);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
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
            assert!(seg.open_frames().len() as u64 <= g.slots * g.depth);
        }
    }
}
