//! The tables in the results segment and the hot-path operations on them.
//!
//! The segment's layout and memory ordering are written down in
//! [`papirus_probe_abi::layout`]; the structs here mirror it (asserted at
//! compile time). Every table word is an `AtomicU64` accessed with Relaxed
//! loads and stores by the one thread that owns the slot (on x86-64: plain
//! moves), bracketed by the slot's sequence word so a reader in the tool can
//! take a consistent copy while the thread runs.
//!
//! Each thread keeps a call-path tree: the entry hook finds the node of the
//! new activation under its caller's node through the caller's one-entry
//! cache (the last child it found: a loop calling one function never looks
//! further), else through the tree's index, appending a node for a new
//! path. The exit hook adds the activation's figures to its node and, with
//! tracing on, writes one record to the thread's ring.
//!
//! # Safety
//!
//! A thread reaches its slot through its initial-exec TLS words (address and
//! session epoch, [`sys::tls_get`]). The address is used only while the
//! epoch matches [`EPOCH`], which set-up and teardown bump: the segment is
//! unmapped only by teardown, which the tool runs while no thread is inside
//! the runtime and after every hijacked return address was put back. Inside
//! means a PC in the runtime's code, or a thread counted in its process
//! record's [`proc::COLD`] word: a cold path that calls into libc (whose PC
//! is then elsewhere) and uses the segment after that call ([`Cold`]). The
//! sequence word keeps a signal handler from touching the tables while the
//! interrupted hook uses them: re-entered hooks return after bumping a counter.
//! Node, index and ring positions are bounded by the slot's private words,
//! which set-up's geometry fills and nothing else writes.
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::cell::Cell;

use papirus_probe_abi::layout::{
    self, Geometry, INDEX_PROBES, NO_NODE, ROOT_LINK, Shape, entry, hdr, node, proc, record, slot,
};

use crate::sys;

/// Shadow-stack depth per thread; deeper calls are counted but not timed.
pub(crate) const DEPTH: u64 = 4096;
/// Stale shadow entries are discarded only when they lie less than this far
/// below the current frame: a signal handler on an alternate stack (which may
/// lie anywhere) must not discard the interrupted stack's entries.
const REAP_WINDOW: u64 = 256 << 20;
/// Counter events the counters probe reads at most.
pub const MAX_EVENTS: usize = layout::MAX_EVENTS;

/// Owner-only access to a table word (module docs: Relaxed is enough).
pub(crate) trait Word {
    fn get(&self) -> u64;
    fn set(&self, v: u64);
    fn add(&self, v: u64);
}

impl Word for AtomicU64 {
    #[inline(always)]
    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn set(&self, v: u64) {
        self.store(v, Ordering::Relaxed)
    }

    #[inline(always)]
    fn add(&self, v: u64) {
        self.set(self.get().wrapping_add(v));
    }
}

/// One activation whose return was hijacked ([`layout::entry`]).
#[repr(C)]
pub(crate) struct Entry {
    slot: AtomicU64,
    ret: AtomicU64,
    start: AtomicU64,
    child: AtomicU64,
    fid: AtomicU64,
    node: AtomicU64,
    cstart: [AtomicU64; MAX_EVENTS],
    cchild: [AtomicU64; MAX_EVENTS],
    _pad: [AtomicU64; 2],
}

/// The words of an [`Entry`], copied out.
type EntryWords = [u64; size_of::<Entry>() / 8];

impl Entry {
    fn words(&self) -> [&AtomicU64; size_of::<Entry>() / 8] {
        let [c0, c1, c2, c3] = &self.cstart;
        let [h0, h1, h2, h3] = &self.cchild;
        let [p0, p1] = &self._pad;
        [
            &self.slot,
            &self.ret,
            &self.start,
            &self.child,
            &self.fid,
            &self.node,
            c0,
            c1,
            c2,
            c3,
            h0,
            h1,
            h2,
            h3,
            p0,
            p1,
        ]
    }

    fn snapshot(&self) -> EntryWords {
        self.words().map(|w| w.load(Ordering::Relaxed))
    }

    fn restore(&self, v: &EntryWords) {
        for (w, v) in self.words().iter().zip(v) {
            w.store(*v, Ordering::Relaxed);
        }
    }
}

/// A call-path tree node ([`layout::node`]).
#[repr(C)]
pub(crate) struct Node {
    link: AtomicU64,
    cache: AtomicU64,
    calls: AtomicU64,
    unwound: AtomicU64,
    incl: AtomicU64,
    excl: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
    cincl: [AtomicU64; MAX_EVENTS],
    cexcl: [AtomicU64; MAX_EVENTS],
}

impl Node {
    /// Every word, for zeroing.
    fn words(&self) -> &[AtomicU64; layout::NODE_WORDS as usize] {
        // SAFETY: Node is 16 AtomicU64s in a row (asserted below).
        unsafe { &*(self as *const Node as *const [AtomicU64; layout::NODE_WORDS as usize]) }
    }

    /// Adds `from`'s figures (another tree's node of the same path).
    fn merge(&self, from: &Node) {
        for (a, b) in [
            (&self.calls, &from.calls),
            (&self.unwound, &from.unwound),
            (&self.incl, &from.incl),
            (&self.excl, &from.excl),
        ] {
            a.add(b.get());
        }
        self.min.set(self.min.get().min(from.min.get()));
        self.max.set(self.max.get().max(from.max.get()));
        for i in 0..MAX_EVENTS {
            self.cincl[i].add(from.cincl[i].get());
            self.cexcl[i].add(from.cexcl[i].get());
        }
    }
}

/// An index entry: `(parent + 1) << 32 | function`, node.
#[repr(C)]
struct IndexEntry {
    key: AtomicU64,
    node: AtomicU64,
}

/// A slot's header ([`layout::slot`]); the tables follow it in the segment.
#[repr(C)]
pub(crate) struct Thread {
    seq: AtomicU64,
    state: AtomicU64,
    tid: AtomicU64,
    process: AtomicU64,
    depth: AtomicU64,
    reentered: AtomicU64,
    untimed: AtomicU64,
    node_overflow: AtomicU64,
    /// Counter values of the current hook (written by the counters reader).
    pub cnow: [AtomicU64; MAX_EVENTS],
    /// Counter events this thread reads (0 when they could not be opened).
    pub nevents: AtomicU64,
    /// Errno of a counter group the kernel refused.
    pub counters_errno: AtomicU64,
    /// Order in which a kept thread ended.
    ended: AtomicU64,
    nodes_used: AtomicU64,
    trace_head: AtomicU64,
    trace_gen: AtomicU64,
    /// A hook of this thread is in a call out of the runtime ([`slot::OUTSIDE`]).
    pub outside: AtomicU64,
    _public: [AtomicU64; 1],
    // Private words: the runtime's own, in bytes from the slot or addresses in this process.
    nfuncs: AtomicU64,
    nodes_max: AtomicU64,
    index_mask: AtomicU64,
    stack_at: AtomicU64,
    nodes_at: AtomicU64,
    index_at: AtomicU64,
    ring_at: AtomicU64,
    ring_mask: AtomicU64,
    record_words: AtomicU64,
    /// The counters reader's per-thread state (a pointer it owns), 0 until
    /// the thread's registration opened its counters.
    pub counters: AtomicU64,
    _private: [AtomicU64; 2],
}

const _: () = {
    use core::mem::offset_of;
    assert!(size_of::<Thread>() == layout::SLOT_HEADER_WORDS as usize * 8);
    assert!(offset_of!(Thread, seq) == slot::SEQ * 8);
    assert!(offset_of!(Thread, state) == slot::STATE * 8);
    assert!(offset_of!(Thread, tid) == slot::TID * 8);
    assert!(offset_of!(Thread, process) == slot::PROC * 8);
    assert!(offset_of!(Thread, depth) == slot::DEPTH * 8);
    assert!(offset_of!(Thread, reentered) == slot::REENTERED * 8);
    assert!(offset_of!(Thread, untimed) == slot::UNTIMED * 8);
    assert!(offset_of!(Thread, node_overflow) == slot::NODE_OVERFLOW * 8);
    assert!(offset_of!(Thread, cnow) == slot::CNOW * 8);
    assert!(offset_of!(Thread, nevents) == slot::NEVENTS * 8);
    assert!(offset_of!(Thread, counters_errno) == slot::COUNTERS_ERRNO * 8);
    assert!(offset_of!(Thread, ended) == slot::ENDED * 8);
    assert!(offset_of!(Thread, nodes_used) == slot::NODES_USED * 8);
    assert!(offset_of!(Thread, trace_head) == slot::TRACE_HEAD * 8);
    assert!(offset_of!(Thread, trace_gen) == slot::TRACE_GEN * 8);
    assert!(offset_of!(Thread, outside) == slot::OUTSIDE * 8);
    assert!(offset_of!(Thread, nfuncs) == slot::PRIVATE * 8);
    assert!(size_of::<Node>() == layout::NODE_WORDS as usize * 8);
    assert!(offset_of!(Node, link) == node::LINK * 8);
    assert!(offset_of!(Node, cache) == node::CACHE * 8);
    assert!(offset_of!(Node, calls) == node::CALLS * 8);
    assert!(offset_of!(Node, unwound) == node::UNWOUND * 8);
    assert!(offset_of!(Node, incl) == node::INCL * 8);
    assert!(offset_of!(Node, excl) == node::EXCL * 8);
    assert!(offset_of!(Node, min) == node::MIN * 8);
    assert!(offset_of!(Node, max) == node::MAX * 8);
    assert!(offset_of!(Node, cincl) == node::CINCL * 8);
    assert!(offset_of!(Node, cexcl) == node::CEXCL * 8);
    assert!(size_of::<IndexEntry>() == layout::INDEX_WORDS as usize * 8);
    assert!(offset_of!(IndexEntry, key) == layout::INDEX_KEY * 8);
    assert!(size_of::<Entry>() == layout::ENTRY_WORDS as usize * 8);
    assert!(offset_of!(Entry, slot) == entry::SLOT * 8);
    assert!(offset_of!(Entry, ret) == entry::RET * 8);
    assert!(offset_of!(Entry, start) == entry::START * 8);
    assert!(offset_of!(Entry, child) == entry::CHILD * 8);
    assert!(offset_of!(Entry, fid) == entry::FID * 8);
    assert!(offset_of!(Entry, node) == entry::NODE * 8);
    assert!(offset_of!(Entry, cstart) == entry::CSTART * 8);
    assert!(offset_of!(Entry, cchild) == entry::CCHILD * 8);
};

/// The current session: TLS words of another epoch are stale. 0 until the
/// first set-up (so threads register nothing before it); bumped by set-up
/// and teardown.
pub(crate) static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Base address of the segment's mapping in this process (0: none).
pub(crate) static BASE: AtomicUsize = AtomicUsize::new(0);
/// This process' record index (`u64::MAX`: none, a child that found no free record).
pub(crate) static PROCESS: AtomicU64 = AtomicU64::new(0);
/// Ended threads keep their slots (up to half of them) instead of folding at once.
pub(crate) static PER_THREAD: AtomicBool = AtomicBool::new(false);
/// Whether closed calls are written to the trace rings.
pub(crate) static TRACING: AtomicBool = AtomicBool::new(false);
/// A slot state private to the runtime: being folded by another thread.
const FOLDING: u64 = 3;

/// The session's geometry as plain words, written at set-up before [`BASE`]
/// is published: what registration and the hooks need, without the
/// (vector-copied, GOT-called) [`Geometry`] on a path the hooks reach.
pub(crate) struct Flat {
    pub funcs: AtomicU64,
    pub nodes: AtomicU64,
    pub index: AtomicU64,
    pub slots: AtomicU64,
    pub slots_at: AtomicU64,
    pub slot_words: AtomicU64,
    pub procs: AtomicU64,
    pub proc_words: AtomicU64,
    pub proc_nodes: AtomicU64,
    pub proc_index: AtomicU64,
    pub stack_at: AtomicU64,
    pub nodes_at: AtomicU64,
    pub index_at: AtomicU64,
    pub ring_at: AtomicU64,
    pub ring: AtomicU64,
    pub record_words: AtomicU64,
    /// Trace filters: calls shorter than this many ticks are not traced …
    pub trace_min: AtomicU64,
    /// … nor calls this deep or deeper …
    pub trace_depth: AtomicU64,
    /// … nor functions with ids from this one on.
    pub trace_funcs: AtomicU64,
}

pub(crate) static FLAT: Flat = Flat {
    funcs: AtomicU64::new(0),
    nodes: AtomicU64::new(0),
    index: AtomicU64::new(0),
    slots: AtomicU64::new(0),
    slots_at: AtomicU64::new(0),
    slot_words: AtomicU64::new(0),
    procs: AtomicU64::new(0),
    proc_words: AtomicU64::new(0),
    proc_nodes: AtomicU64::new(0),
    proc_index: AtomicU64::new(0),
    stack_at: AtomicU64::new(0),
    nodes_at: AtomicU64::new(0),
    index_at: AtomicU64::new(0),
    ring_at: AtomicU64::new(0),
    ring: AtomicU64::new(0),
    record_words: AtomicU64::new(0),
    trace_min: AtomicU64::new(0),
    trace_depth: AtomicU64::new(0),
    trace_funcs: AtomicU64::new(0),
};

impl Flat {
    /// Records `g` and the trace filters (set-up, before publishing the segment).
    pub(crate) fn set(&self, g: &Geometry, trace_min: u64, trace_depth: u64, trace_funcs: u64) {
        let s = g.shape;
        self.funcs.set(s.funcs);
        self.nodes.set(s.nodes);
        self.index.set(g.index);
        self.slots.set(s.slots);
        self.slots_at.set(g.slot_at(0));
        self.slot_words.set(g.slot_words);
        self.procs.set(s.procs);
        self.proc_words.set(g.proc_words);
        self.proc_nodes.set(s.proc_nodes);
        self.proc_index.set(g.proc_index);
        self.stack_at.set(g.slot_stack());
        self.nodes_at.set(g.slot_nodes());
        self.index_at.set(g.slot_index());
        self.ring_at.set(g.slot_ring());
        self.ring.set(s.ring);
        self.record_words.set(s.record_words);
        self.trace_min.set(trace_min);
        self.trace_depth.set(trace_depth);
        self.trace_funcs.set(trace_funcs);
        TRACING.store(s.ring > 0, Ordering::Relaxed);
    }
}

/// A word of the mapped segment at `base`.
#[inline(always)]
fn word_at(base: usize, i: u64) -> &'static AtomicU64 {
    // SAFETY: callers pass positions inside the session's mapping at `base` (from FLAT).
    unsafe { &*((base + i as usize * 8) as *const AtomicU64) }
}

/// The position of `key` in an index of `mask + 1` entries, before probing.
#[inline(always)]
fn hash(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32
}

/// A call-path tree and its index, wherever they lie (a slot or a process
/// record): node and entry positions are masked or bounded by its numbers.
struct Tree<'a> {
    nodes: usize,
    index: usize,
    mask: u64,
    max: u64,
    used: &'a AtomicU64,
}

// Inlined into the hooks' out-of-line helpers: a plain Rust call from them
// would go through the GOT, out of the runtime's own code.
impl<'a> Tree<'a> {
    #[inline(always)]
    fn node(&self, i: u64) -> &'a Node {
        debug_assert!(i < self.max);
        // SAFETY: callers pass i < max (nodes in use, or one being appended
        // under that bound); the tree lies in the mapping.
        unsafe { &*(self.nodes as *const Node).add(i as usize) }
    }

    #[inline(always)]
    fn entry(&self, i: u64) -> &'a IndexEntry {
        // SAFETY: the position is masked to the index, which lies in the mapping.
        unsafe { &*(self.index as *const IndexEntry).add((i & self.mask) as usize) }
    }

    /// The child of `parent` for function `fid`, appended when the path is
    /// new; [`NO_NODE`] when the tree or the index has no place for it.
    #[inline(always)]
    fn child(&self, parent: u64, fid: u64) -> u64 {
        let key = ((parent + 1) << 32) | fid;
        let h = hash(key);
        for i in 0..INDEX_PROBES {
            let e = self.entry(h + i);
            let k = e.key.get();
            if k == key {
                return e.node.get();
            }
            if k == 0 {
                let n = self.used.get();
                if n >= self.max {
                    return NO_NODE;
                }
                let node = self.node(n);
                node.link.set((parent << 32) | fid);
                node.min.set(u64::MAX);
                self.used.set(n + 1);
                e.node.set(n);
                e.key.set(key);
                return n;
            }
        }
        NO_NODE
    }

    /// Empties the tree (every node but the root zeroed, the index emptied)
    /// in time proportional to the nodes in use: their index entries are
    /// removed newest first, which undoes linear probing's insertions exactly.
    fn clear(&self) {
        let used = self.used.get().min(self.max);
        for n in (1..used).rev() {
            let node = self.node(n);
            let link = node.link.get();
            let key = (((link >> 32) + 1) << 32) | (link & 0xffff_ffff);
            let h = hash(key);
            for i in 0..INDEX_PROBES {
                let e = self.entry(h + i);
                if e.key.get() == key {
                    e.key.set(0);
                    e.node.set(0);
                    break;
                }
            }
            for w in node.words() {
                w.set(0);
            }
        }
        self.node(0).cache.set(0);
        self.used.set(1);
    }
}

/// Claims a free slot of the segment at `base` for thread `tid` of record `p`.
fn claim(base: usize, p: u64, tid: u64) -> Option<&'static Thread> {
    let (slots, at, words) = (FLAT.slots.get(), FLAT.slots_at.get(), FLAT.slot_words.get());
    for i in 0..slots {
        let w = word_at(base, at + i * words);
        // SAFETY: slot `i` lies inside the mapping; Thread mirrors its header.
        let t = unsafe { &*(w as *const AtomicU64 as *const Thread) };
        if t.state.compare_exchange(slot::FREE, slot::LIVE, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            word_at(base, hdr::SLOTS_USED as u64).fetch_max(i + 1, Ordering::Relaxed);
            t.init(p, tid);
            let rec = layout::HEADER_WORDS + p * FLAT.proc_words.get();
            word_at(base, rec + proc::THREADS as u64).fetch_add(1, Ordering::Relaxed);
            return Some(t);
        }
    }
    word_at(base, hdr::SLOT_MISSES as u64).fetch_add(1, Ordering::Relaxed);
    None
}

/// The segment as words, for the runtime's cold paths.
pub(crate) struct Seg {
    base: usize,
    pub g: Geometry,
}

impl Seg {
    /// The mapped segment, if a session is active.
    pub(crate) fn current() -> Option<Seg> {
        let base = BASE.load(Ordering::Acquire);
        if base == 0 {
            return None;
        }
        // SAFETY: a non-zero BASE is a live mapping whose header was written
        // before BASE was published (Release in set-up).
        let w = unsafe { &*(base as *const [AtomicU64; layout::HEADER_WORDS as usize]) };
        let n = |i: usize| w[i].load(Ordering::Relaxed);
        let g = Geometry::new(Shape::from_header(n))?;
        Some(Seg { base, g })
    }

    /// Word `i` of the segment.
    pub(crate) fn word(&self, i: u64) -> &'static AtomicU64 {
        debug_assert!(i < self.g.total_words);
        // SAFETY: callers pass positions from the geometry, all inside the mapping.
        unsafe { &*((self.base + i as usize * 8) as *const AtomicU64) }
    }

    /// Slots ever claimed ([`hdr::SLOTS_USED`]).
    fn slots_used(&self) -> u64 {
        self.word(hdr::SLOTS_USED as u64).load(Ordering::Relaxed).min(self.g.shape.slots)
    }

    /// The whole segment as a slice (for snapshots of this process).
    pub(crate) fn words(&self) -> &'static [AtomicU64] {
        // SAFETY: the mapping spans `total_words` words and is only unmapped by teardown.
        unsafe { core::slice::from_raw_parts(self.base as *const AtomicU64, self.g.total_words as usize) }
    }

    /// Per-thread mode: while more than half the slots hold ended threads,
    /// folds the one that ended first and frees its slot.
    fn fold_oldest_kept(&self) {
        loop {
            let mut kept = 0;
            let mut oldest: Option<(u64, &'static Thread)> = None;
            for i in 0..self.slots_used() {
                let at = self.g.slot_at(i);
                // SAFETY: slot `i` lies inside the mapping; Thread mirrors its header.
                let t = unsafe { &*(self.word(at) as *const AtomicU64 as *const Thread) };
                if t.state.load(Ordering::Acquire) == slot::KEPT {
                    kept += 1;
                    let n = t.ended.get();
                    if oldest.is_none_or(|(m, _)| n < m) {
                        oldest = Some((n, t));
                    }
                }
            }
            let Some((_, t)) = oldest.filter(|_| kept > self.g.shape.slots / 2) else { return };
            if t.state.compare_exchange(slot::KEPT, FOLDING, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                t.fold(self);
                t.state.store(slot::FREE, Ordering::Release);
            }
        }
    }

    fn proc_word(&self, p: u64, w: usize) -> &'static AtomicU64 {
        self.word(self.g.proc_at(p) + w as u64)
    }

    /// Process record `p`'s tree.
    fn proc_tree(&self, p: u64) -> Tree<'static> {
        let at = self.g.proc_at(p);
        Tree {
            nodes: self.word(at + self.g.proc_nodes()) as *const AtomicU64 as usize,
            index: self.word(at + self.g.proc_index()) as *const AtomicU64 as usize,
            mask: self.g.proc_index - 1,
            max: self.g.shape.proc_nodes,
            used: self.proc_word(p, proc::NODES_USED),
        }
    }

    /// Makes record `p` a fresh process' (set-up, a forked child): an empty tree.
    pub(crate) fn init_proc(&self, p: u64) {
        self.proc_tree(p).node(0).link.set(ROOT_LINK);
        self.proc_word(p, proc::NODES_USED).set(1);
    }
}

/// The calling thread's tables; `None` before set-up, after teardown, or
/// when no slot is free.
#[inline(always)]
pub(crate) fn current() -> Option<&'static Thread> {
    let (p, epoch) = sys::tls_get();
    if epoch != EPOCH.load(Ordering::Relaxed) {
        return register();
    }
    // SAFETY: a non-zero address of the current epoch is this thread's live slot (module docs).
    unsafe { (p as *const Thread).as_ref() }
}

#[cold]
#[inline(never)]
extern "C" fn register() -> Option<&'static Thread> {
    let epoch = EPOCH.load(Ordering::Acquire);
    // Until a slot is found, nested calls (malloc inside the registration) run unmeasured.
    sys::tls_set(0, epoch);
    let base = BASE.load(Ordering::Acquire);
    let p = PROCESS.load(Ordering::Relaxed);
    if base == 0 || p >= FLAT.procs.get() {
        return None;
    }
    // The exit handler's registration calls into libc, and the hook then
    // uses the slot: counted until it returns (the slot is in the segment).
    let _cold = Cold::enter(base, p);
    let t = claim(base, p, u64::from(sys::gettid()))?;
    sys::tls_set(t as *const Thread as usize, epoch);
    crate::counters::register(t);
    Some(t)
}

/// A thread of process record `p` counted in the record's [`proc::COLD`]
/// while this lives: it is inside a cold path that calls out of the runtime
/// (its PC may be in libc) and comes back to the segment. Taken while the PC
/// is still in the runtime's code, after the segment's address was read, and
/// dropped before the last return into code outside it, so a tool that sees
/// no PC in the runtime and the word at 0 knows no thread will touch the
/// segment again (module docs).
pub(crate) struct Cold(&'static AtomicU64);

impl Cold {
    fn enter(base: usize, p: u64) -> Option<Cold> {
        if base == 0 || p >= FLAT.procs.get() {
            return None;
        }
        let w = word_at(base, layout::HEADER_WORDS + p * FLAT.proc_words.get() + proc::COLD as u64);
        w.fetch_add(1, Ordering::SeqCst);
        Some(Cold(w))
    }
}

impl Drop for Cold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The session's thread-exit key (`pthread_key_t` + 1; 0: none): a key, not
/// a thread-local destructor (`__cxa_thread_atexit_impl`), because glibc
/// never unloads a library a pending thread-local destructor points into,
/// and a key is gone with [`delete_exit_key`].
static EXIT_KEY: AtomicU64 = AtomicU64::new(0);

/// Creates the session's thread-exit key (set-up); without one, no slot is recycled.
pub(crate) fn create_exit_key() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a live local; the destructor is a function of this library.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) } == 0 {
        EXIT_KEY.store(u64::from(key) + 1, Ordering::Release);
    }
}

/// Deletes the session's thread-exit key (teardown): threads that end from
/// now on call nothing of this library.
pub(crate) fn delete_exit_key() {
    let key = EXIT_KEY.swap(0, Ordering::AcqRel);
    if key != 0 {
        // SAFETY: a key this library created and has not deleted (swapped out above).
        unsafe { libc::pthread_key_delete((key - 1) as libc::pthread_key_t) };
    }
}

/// Registers [`thread_exit`] for the calling thread and the current session.
pub(crate) extern "C" fn register_thread_exit() {
    let epoch = EPOCH.load(Ordering::Acquire);
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != 0 {
        // SAFETY: the session's live key; the value is a plain non-zero integer.
        unsafe {
            libc::pthread_setspecific((key - 1) as libc::pthread_key_t, epoch as usize as *const libc::c_void)
        };
    }
}

/// Runs when a thread other than the main one ends (return from its start
/// routine, `pthread_exit`): frames still open are closed as unwound, the
/// figures folded into the process' tree, the slot freed.
unsafe extern "C" fn thread_exit(arg: *mut libc::c_void) {
    let epoch = arg as usize as u64;
    let (p, e) = sys::tls_get();
    if e != epoch || epoch != EPOCH.load(Ordering::Acquire) || p == 0 {
        return;
    }
    // SAFETY: as in `current`.
    let t = unsafe { &*(p as *const Thread) };
    if t.tid.get() == u64::from(std::process::id()) {
        // The main thread at exit(): the process ends, nothing to recycle, and
        // atexit handlers may still call instrumented functions.
        return;
    }
    // A later instrumented call (another destructor) registers afresh.
    sys::tls_set(0, 0);
    let Some(seg) = Seg::current() else { return };
    // Entered from libc, not through patched code; retiring may free memory.
    let _cold = Cold::enter(seg.base, PROCESS.load(Ordering::Relaxed));
    t.retire(&seg);
}

impl Thread {
    /// Prepares a freshly claimed slot (its tree empty, as folding left it).
    fn init(&self, p: u64, tid: u64) {
        self.tid.set(tid);
        self.process.set(p);
        self.depth.set(0);
        self.reentered.set(0);
        self.untimed.set(0);
        self.node_overflow.set(0);
        self.counters_errno.set(0);
        self.ended.set(0);
        self.outside.set(0);
        self.nfuncs.set(FLAT.funcs.get());
        self.nodes_max.set(FLAT.nodes.get());
        self.index_mask.set(FLAT.index.get() - 1);
        self.stack_at.set(FLAT.stack_at.get() * 8);
        self.nodes_at.set(FLAT.nodes_at.get() * 8);
        self.index_at.set(FLAT.index_at.get() * 8);
        self.ring_at.set(FLAT.ring_at.get() * 8);
        self.ring_mask.set(FLAT.ring.get().wrapping_sub(1));
        self.record_words.set(FLAT.record_words.get());
        self.tree().node(0).link.set(ROOT_LINK);
        self.nodes_used.set(1);
        let nevents = crate::counters::NEVENTS.load(Ordering::Acquire) as u64;
        self.nevents.set(nevents.min(MAX_EVENTS as u64));
        self.counters.set(0);
        self.trace_gen.add(1);
        if TRACING.load(Ordering::Relaxed) {
            let pid = u64::from(sys::getpid());
            let info = (record::THREAD << 48) | (self.trace_gen.get() << 50);
            self.write_record(sys::rdtsc(), (pid << 32) | (tid & 0xffff_ffff), info, None);
        }
    }

    /// This slot's tree.
    #[inline(always)]
    fn tree(&self) -> Tree<'_> {
        let at = self as *const Thread as usize;
        Tree {
            nodes: at + self.nodes_at.get() as usize,
            index: at + self.index_at.get() as usize,
            mask: self.index_mask.get(),
            max: self.nodes_max.get(),
            used: &self.nodes_used,
        }
    }

    /// Element `i` of the table of `T`s at byte offset `at` from the slot.
    #[inline(always)]
    fn table<T>(&self, at: &AtomicU64, i: u64) -> &T {
        // SAFETY: callers pass one of the slot's private table offsets (set
        // from the geometry) and an index within that table's bound.
        unsafe { &*((self as *const Thread as *const u8).add(at.get() as usize) as *const T).add(i as usize) }
    }

    /// Node `i` of this slot's tree (i < nodes_used <= nodes_max).
    #[inline(always)]
    fn node(&self, i: u64) -> &Node {
        self.table(&self.nodes_at, i)
    }

    /// Appends a trace record: its three words and, with `counters`, the
    /// counter values at entry (from the entry) and now, as many as a record holds.
    #[inline(always)]
    fn write_record(&self, start: u64, end: u64, info: u64, counters: Option<(&Entry, usize)>) {
        let h = self.trace_head.get();
        let rw = self.record_words.get();
        let at = self.ring_at.get() + (h & self.ring_mask.get()) * rw * 8;
        // SAFETY: the position is masked to the ring, which lies in the slot.
        let r = unsafe { (self as *const Thread as *const u8).add(at as usize) as *const AtomicU64 };
        // SAFETY: words 0..rw of the record (rw is the geometry's record size).
        let w = |i: u64| unsafe { &*r.add(i as usize) };
        w(record::START as u64).set(start);
        w(record::END as u64).set(end);
        w(record::INFO as u64).set(info);
        if let Some((e, nev)) = counters {
            let n = (nev as u64).min(rw.saturating_sub(3) / 2);
            for (i, (s, c)) in e.cstart.iter().zip(&self.cnow).take(n as usize).enumerate() {
                w(record::COUNTERS as u64 + i as u64).set(s.get());
                w(record::COUNTERS as u64 + n + i as u64).set(c.get());
            }
        }
        // ATOMICS: publishes the record (layout docs: the drainer's Acquire load pairs with it).
        self.trace_head.store(h.wrapping_add(1), Ordering::Release);
    }

    /// Closes the thread's open frames as unwound, then folds its tree into
    /// its process record and frees the slot, or (per-thread mode) keeps
    /// the slot and folds the oldest kept one beyond the bound.
    fn retire(&'static self, seg: &Seg) {
        let Some(g) = self.enter() else { return };
        let now = crate::hooks::now();
        while g.depth() > 0 {
            g.pop(now, 0, true);
        }
        crate::counters::release(self);
        drop(g);
        if !PER_THREAD.load(Ordering::Relaxed) {
            self.fold(seg);
            self.state.store(slot::FREE, Ordering::Release);
            return;
        }
        self.ended.set(seg.word(hdr::ENDED as u64).fetch_add(1, Ordering::Relaxed) + 1);
        self.state.store(slot::KEPT, Ordering::Release);
        seg.fold_oldest_kept();
    }

    /// Folds the tree into the process record's (under its lock) and empties it.
    fn fold(&self, seg: &Seg) {
        let p = self.process.get();
        if p >= seg.g.shape.procs {
            return;
        }
        let mine = &self.seq;
        mine.store(mine.get().wrapping_add(1), Ordering::Relaxed);
        let lock = seg.proc_word(p, proc::LOCK);
        while lock.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
        let seq = seg.proc_word(p, proc::SEQ);
        seq.store(seq.get().wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.fold_into(seg, p);
        seg.proc_word(p, proc::EXITED_THREADS).add(1);
        seg.proc_word(p, proc::REENTERED).add(self.reentered.get());
        seg.proc_word(p, proc::UNTIMED).add(self.untimed.get());
        seg.proc_word(p, proc::NODE_OVERFLOW).add(self.node_overflow.get());
        seq.store(seq.get().wrapping_add(1), Ordering::Release);
        lock.store(0, Ordering::Release);
        mine.store(mine.get().wrapping_add(1), Ordering::Release);
    }

    /// Adds every node into the same path of record `p`'s tree, then empties
    /// this tree. Parents come first, so each node's parent is already
    /// placed; its place is kept in the node's cache word meanwhile.
    fn fold_into(&self, seg: &Seg, p: u64) {
        let mine = self.tree();
        let theirs = seg.proc_tree(p);
        let used = mine.used.get().min(mine.max);
        mine.node(0).cache.set(0);
        for i in 1..used {
            let n = mine.node(i);
            let link = n.link.get();
            let (parent, fid) = (link >> 32, link & 0xffff_ffff);
            let at = if parent < i { mine.node(parent).cache.get() } else { NO_NODE };
            let to = if at == NO_NODE { NO_NODE } else { theirs.child(at, fid) };
            n.cache.set(to);
            if to == NO_NODE {
                seg.proc_word(p, proc::NODE_OVERFLOW).add(n.calls.get());
            } else {
                theirs.node(to).merge(n);
            }
        }
        mine.clear();
    }

    /// Claims the tables for a hook; `None` if a hook of this thread is already
    /// running (a signal handler interrupted it).
    #[inline(always)]
    pub(crate) fn enter(&'static self) -> Option<Guard> {
        let s = self.seq.get();
        if s & 1 != 0 {
            self.reentered.add(1);
            return None;
        }
        self.seq.set(s.wrapping_add(1));
        // ATOMICS: orders the odd sequence before the figures' stores (a compiler barrier on x86-64).
        fence(Ordering::Release);
        Some(Guard(self))
    }

    /// Shadow-stack entry `i` (i < depth <= DEPTH).
    #[inline(always)]
    fn entry(&self, i: u64) -> &Entry {
        self.table(&self.stack_at, i)
    }
}

/// Exclusive use of a thread's tables by the hook that holds it.
#[repr(transparent)]
pub(crate) struct Guard(&'static Thread);

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        let seq = &self.0.seq;
        // ATOMICS: Release publishes the figures with the even sequence.
        seq.store(seq.get().wrapping_add(1), Ordering::Release);
    }
}

impl Guard {
    /// Number of open activations.
    #[inline(always)]
    pub(crate) fn depth(&self) -> u64 {
        self.0.depth.get()
    }

    /// The return slot and real return address of the `i`-th open activation (0 = outermost).
    #[inline(always)]
    pub(crate) fn frame(&self, i: u64) -> (u64, u64) {
        let e = self.0.entry(i);
        (e.slot.get(), e.ret.get())
    }

    /// Records an activation at depth `d` (the thread's depth, as
    /// [`Guard::reap_below`] returned it); `false` when its return cannot be
    /// tracked (the call is then only counted, per thread).
    #[inline(always)]
    pub(crate) fn push(&self, d: u64, fid: u32, slot: u64, ret: u64, now: u64, nev: usize) -> bool {
        let t = self.0;
        let fid = u64::from(fid);
        if d >= DEPTH || fid >= t.nfuncs.get() {
            self.untracked();
            return false;
        }
        let parent = if d > 0 { t.entry(d - 1).node.get() } else { 0 };
        let node = if parent == NO_NODE {
            // Called from a call left out of the tree: left out too, and counted.
            t.node_overflow.add(1);
            NO_NODE
        } else {
            let c = t.node(parent).cache.get();
            if c >> 32 == fid + 1 { c & 0xffff_ffff } else { self.child(parent, fid) }
        };
        let e = t.entry(d);
        e.slot.set(slot);
        e.ret.set(ret);
        e.start.set(now);
        e.child.set(0);
        e.fid.set(fid);
        e.node.set(node);
        for i in 0..nev.min(MAX_EVENTS) {
            e.cstart[i].set(t.cnow[i].get());
            e.cchild[i].set(0);
        }
        t.depth.set(d + 1);
        if node != NO_NODE {
            t.node(node).calls.add(1);
        }
        true
    }

    /// The node of a call of `fid` under `parent` when the parent's cache
    /// holds another function: the index, or a new node; the cache then
    /// holds this one.
    #[cold]
    #[inline(never)]
    extern "C" fn child(&self, parent: u64, fid: u64) -> u64 {
        let t = self.0;
        let n = t.tree().child(parent, fid);
        if n == NO_NODE {
            t.node_overflow.add(1);
        } else {
            t.node(parent).cache.set(((fid + 1) << 32) | n);
        }
        n
    }

    #[cold]
    #[inline(never)]
    extern "C" fn untracked(&self) {
        self.0.untimed.add(1);
    }

    /// Closes every activation whose return slot lies below `slot` (frames
    /// left by longjmp or an exception), recording each as unwound at `now`.
    /// With `same_too`, an activation at `slot` itself is closed as well: a
    /// new call through a slot that holds a real return address (not the exit
    /// stub, as a tail call's would) means the old activation there is gone.
    /// Returns the depth left (the hooks pass it on rather than load it again).
    #[inline(always)]
    pub(crate) fn reap_below(&self, slot: u64, same_too: bool, now: u64, nev: usize) -> u64 {
        // Nothing to close on almost every call: test the innermost entry here
        // and keep the loop (a second inlined `pop`) out of the hooks' hot paths.
        let d = self.0.depth.get();
        if d == 0 {
            return 0;
        }
        let s = self.0.entry(d - 1).slot.get();
        let stale = s < slot || (same_too && s == slot);
        if stale && slot - s < REAP_WINDOW { self.reap_slow(slot, same_too, now, nev) } else { d }
    }

    // extern "C", like the other out-of-line helpers, so hooks call it directly, not through the GOT.
    #[cold]
    #[inline(never)]
    extern "C" fn reap_slow(&self, slot: u64, same_too: bool, now: u64, nev: usize) -> u64 {
        loop {
            let d = self.0.depth.get();
            if d == 0 {
                return 0;
            }
            let s = self.0.entry(d - 1).slot.get();
            let stale = s < slot || (same_too && s == slot);
            if !stale || slot - s >= REAP_WINDOW {
                return d;
            }
            self.pop_at(d - 1, now, nev, true);
        }
    }

    /// Closes the activation whose return slot is `slot` at `now` and returns
    /// its real return address (the exit stub's case); `None` when none is
    /// open. On almost every return it is the innermost; otherwise the stale
    /// ones below `slot` are closed first and the one at `slot` (or, with
    /// none there, the innermost) is closed.
    #[inline(always)]
    pub(crate) fn close_at(&self, slot: u64, now: u64, nev: usize) -> Option<u64> {
        let mut d = self.0.depth.get();
        if d == 0 || self.0.entry(d - 1).slot.get() != slot {
            d = self.settle_at(slot, now, nev);
            if d == 0 {
                return None;
            }
        }
        Some(self.pop_at(d - 1, now, nev, false))
    }

    /// [`Guard::close_at`]'s uncommon case: returns the depth once the
    /// activation to close is the innermost.
    #[cold]
    #[inline(never)]
    extern "C" fn settle_at(&self, slot: u64, now: u64, nev: usize) -> u64 {
        let d = self.reap_below(slot, false, now, nev);
        if d > 0 {
            self.innermost_at(slot);
        }
        d
    }

    /// Makes the activation whose return slot is `slot` the innermost one.
    /// Activations of another stack can lie above it: a coroutine that
    /// `swapcontext` left is still open on its own stack, and the return
    /// through the stub at `slot` is not its return.
    #[inline(always)]
    fn innermost_at(&self, slot: u64) {
        let d = self.0.depth.get();
        if d > 0 && self.0.entry(d - 1).slot.get() != slot {
            self.raise_slot(slot);
        }
    }

    #[cold]
    #[inline(never)]
    extern "C" fn raise_slot(&self, slot: u64) {
        let t = self.0;
        let d = t.depth.get();
        // No activation at `slot`: the innermost is all there is to return to.
        let Some(k) = (0..d).rev().find(|&i| t.entry(i).slot.get() == slot) else { return };
        let kept = t.entry(k).snapshot();
        for i in k..d - 1 {
            t.entry(i).restore(&t.entry(i + 1).snapshot());
        }
        t.entry(d - 1).restore(&kept);
    }

    /// Closes the innermost activation at `now` and returns its real return
    /// address (the caller checked that there is one).
    pub(crate) fn pop(&self, now: u64, nev: usize, unwound: bool) -> u64 {
        self.pop_at(self.0.depth.get() - 1, now, nev, unwound)
    }

    /// [`Guard::pop`] with the innermost activation's index `d` (depth − 1)
    /// already loaded.
    #[inline(always)]
    fn pop_at(&self, d: u64, now: u64, nev: usize, unwound: bool) -> u64 {
        let t = self.0;
        t.depth.set(d);
        let e = t.entry(d);
        let fid = e.fid.get();
        if fid >= t.nfuncs.get() {
            // Begun before a fork, in the parent: only its return matters here.
            return e.ret.get();
        }
        let start = e.start.get();
        let dur = now.saturating_sub(start);
        let n = e.node.get();
        if n != NO_NODE {
            let node = t.node(n);
            if unwound {
                node.unwound.add(1);
            }
            node.incl.add(dur);
            node.excl.add(dur.saturating_sub(e.child.get()));
            if dur < node.min.get() {
                node.min.set(dur);
            }
            if dur > node.max.get() {
                node.max.set(dur);
            }
            let parent = (d > 0).then(|| t.entry(d - 1));
            for i in 0..nev.min(MAX_EVENTS) {
                let delta = t.cnow[i].get().saturating_sub(e.cstart[i].get());
                node.cincl[i].add(delta);
                node.cexcl[i].add(delta.saturating_sub(e.cchild[i].get()));
                if let Some(p) = parent {
                    p.cchild[i].add(delta);
                }
            }
            // A call left out of the tree stays in its caller's exclusive time.
            if let Some(p) = parent {
                p.child.add(dur);
            }
        }
        if TRACING.load(Ordering::Relaxed)
            && fid < FLAT.trace_funcs.get()
            && d < FLAT.trace_depth.get()
            && dur >= FLAT.trace_min.get()
        {
            self.trace(e, fid, d, now, nev, unwound);
        }
        e.ret.get()
    }

    /// Writes the trace record of the activation `e` closing at `now`.
    #[inline(never)]
    extern "C" fn trace(&self, e: &Entry, fid: u64, depth: u64, now: u64, nev: usize, unwound: bool) {
        let t = self.0;
        let kind = if unwound { record::UNWOUND } else { record::RETURNED };
        let info = (t.trace_gen.get() << 50) | (kind << 48) | (depth.min(0xffff) << 32) | fid;
        t.write_record(e.start.get(), now, info, Some((e, nev)));
    }
}

// Forks: the child inherits the shared mapping, so it must stop writing the
// parent's slot at once. The forking thread's open activations are copied
// before the fork (the parent's thread goes on changing them after it) and
// given to the child's own slot, so its hijacked returns still work.
thread_local! {
    /// The copy: an anonymous mapping of `[slot, ret]` pairs (address,
    /// pairs), freed after the fork. A plain word: a Rust thread-local with a
    /// destructor would keep the library from ever being unloaded.
    static FORK_COPY: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// `pthread_atfork` prepare handler.
pub(crate) extern "C" fn before_fork() {
    let (p, e) = sys::tls_get();
    FORK_COPY.set((0, 0));
    if p == 0 || e != EPOCH.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: as in `current`.
    let t = unsafe { &*(p as *const Thread) };
    let n = t.depth.get().min(DEPTH) as usize;
    if n == 0 {
        return;
    }
    let Some(buf) = sys::mmap_zeroed(n * 16) else { return };
    for i in 0..n {
        let en = t.entry(i as u64);
        // SAFETY: `buf` holds n pairs.
        unsafe { (buf as *mut [u64; 2]).add(i).write([en.slot.get(), en.ret.get()]) };
    }
    FORK_COPY.set((buf as usize, n));
}

/// The copy [`before_fork`] made, freed.
fn take_fork_copy() -> Vec<[u64; 2]> {
    let (buf, n) = FORK_COPY.replace((0, 0));
    if buf == 0 {
        return Vec::new();
    }
    // SAFETY: `buf` is the live mapping of `n` pairs written by `before_fork`.
    let frames = unsafe { core::slice::from_raw_parts(buf as *const [u64; 2], n) }.to_vec();
    sys::munmap(buf as *mut u8, n * 16);
    frames
}

/// `pthread_atfork` parent handler: frees the copy.
pub(crate) extern "C" fn after_fork_parent() {
    take_fork_copy();
}

/// `pthread_atfork` child handler: a process record and a slot of its own.
pub(crate) extern "C" fn after_fork_child() {
    let epoch = EPOCH.load(Ordering::Acquire);
    let (p, e) = sys::tls_get();
    let Some(seg) = Seg::current() else { return };
    let parent_rec = PROCESS.load(Ordering::Relaxed);
    let rec = seg.word(hdr::NEXT_PROC as u64).fetch_add(1, Ordering::AcqRel);
    let frames = take_fork_copy();
    if rec >= seg.g.shape.procs {
        seg.word(hdr::PROC_MISSES as u64).fetch_add(1, Ordering::Relaxed);
        PROCESS.store(u64::MAX, Ordering::Relaxed);
        if e == epoch && p != 0 && !frames.is_empty() {
            // Returns must still find their frames: a private slot, never reported.
            private_slot(&seg, &frames, epoch);
        } else {
            sys::tls_set(0, epoch);
        }
        return;
    }
    let parent_pid =
        if parent_rec < seg.g.shape.procs { seg.proc_word(parent_rec, proc::PID).get() } else { 0 };
    // Counted before the tool can see the record: from then on it may hold
    // this child and restore it, and this handler goes on into libc
    // (`pthread_setspecific`) and back, so no look at the PCs alone may
    // let the tool unmap the runtime under it.
    let _cold = Cold::enter(seg.base, rec);
    seg.proc_word(rec, proc::PID).set(u64::from(sys::getpid()));
    seg.proc_word(rec, proc::PARENT).set(parent_pid);
    seg.init_proc(rec);
    seg.proc_word(rec, proc::STATE).store(1, Ordering::Release);
    PROCESS.store(rec, Ordering::Relaxed);
    sys::tls_set(0, epoch);
    if e != epoch || p == 0 {
        return;
    }
    match claim(seg.base, rec, u64::from(sys::gettid())) {
        Some(t) => {
            t.adopt(&frames);
            sys::tls_set(t as *const Thread as usize, epoch);
            register_thread_exit();
        }
        None if !frames.is_empty() => private_slot(&seg, &frames, epoch),
        None => {}
    }
}

/// A slot in private memory for a thread that must keep its frames but has
/// no place in the segment: its shadow stack and a tree of its own (a
/// private slot's figures are never reported), no trace ring.
fn private_slot(seg: &Seg, frames: &[[u64; 2]], epoch: u64) {
    let Some(base) =
        sys::mmap_zeroed((seg.g.slot_words - seg.g.shape.ring * seg.g.shape.record_words) as usize * 8)
    else {
        sys::die(b"papirus-probe-runtime: no memory for a forked child's return addresses\n")
    };
    // SAFETY: a fresh zeroed mapping of a slot's size less its ring; zero is valid for every word.
    let t = unsafe { &*(base as *const Thread) };
    TRACING.store(false, Ordering::Relaxed);
    t.init(u64::MAX, u64::from(sys::gettid()));
    t.adopt(frames);
    sys::tls_set(t as *const Thread as usize, epoch);
}

impl Thread {
    /// Takes over open activations (real returns) copied from the parent.
    fn adopt(&self, frames: &[[u64; 2]]) {
        for (i, [s, r]) in frames.iter().enumerate() {
            let e = self.entry(i as u64);
            e.slot.set(*s);
            e.ret.set(*r);
            // Frames begun in the parent are not timed or counted in the
            // child; what they call starts the child's own paths.
            e.fid.set(u64::MAX);
            e.node.set(0);
        }
        self.depth.set(frames.len() as u64);
    }
}
