//! The tables in the results segment and the hot-path operations on them.
//!
//! The segment's layout and memory ordering are written down in
//! [`papirus_probe_abi::layout`]; the structs here mirror it (asserted at
//! compile time). Every table word is an `AtomicU64` accessed with Relaxed
//! loads and stores by the one thread that owns the slot (on x86-64: plain
//! moves, as before), bracketed by the slot's sequence word so a reader in
//! the tool can take a consistent copy while the thread runs.
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
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::cell::Cell;

use papirus_probe_abi::layout::{self, Geometry, entry, hdr, proc, slot, stat};

use crate::sys;

/// Shadow-stack depth per thread; deeper calls are counted but not timed.
pub(crate) const DEPTH: u64 = 4096;
/// Stale shadow entries are discarded only when they lie less than this far
/// below the current frame: a signal handler on an alternate stack (which may
/// lie anywhere) must not discard the interrupted stack's entries.
const REAP_WINDOW: u64 = 256 << 20;
/// Probes per caller → callee lookup before the pair is counted as dropped.
const EDGE_PROBES: u64 = 8;
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
    _pad: AtomicU64,
    cstart: [AtomicU64; MAX_EVENTS],
    cchild: [AtomicU64; MAX_EVENTS],
    _pad2: [AtomicU64; 2],
}

/// The words of an [`Entry`], copied out.
type EntryWords = [u64; size_of::<Entry>() / 8];

impl Entry {
    fn words(&self) -> [&AtomicU64; size_of::<Entry>() / 8] {
        let [c0, c1, c2, c3] = &self.cstart;
        let [h0, h1, h2, h3] = &self.cchild;
        let [p0, p1] = &self._pad2;
        [
            &self.slot,
            &self.ret,
            &self.start,
            &self.child,
            &self.fid,
            &self._pad,
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

/// Per-function totals ([`layout::stat`]).
#[repr(C)]
pub(crate) struct Stats {
    pub calls: AtomicU64,
    pub exits: AtomicU64,
    pub unwound: AtomicU64,
    pub incl: AtomicU64,
    pub excl: AtomicU64,
    pub min: AtomicU64,
    pub max: AtomicU64,
    /// Activations currently open (recursion depth), so inclusive time counts the outermost only.
    pub active: AtomicU64,
    pub cincl: [AtomicU64; MAX_EVENTS],
    pub cexcl: [AtomicU64; MAX_EVENTS],
}

/// One caller → callee pair.
#[repr(C)]
pub(crate) struct Edge {
    /// `(caller + 1) << 32 | callee`; 0 when the slot is empty.
    pub key: AtomicU64,
    pub calls: AtomicU64,
    pub incl: AtomicU64,
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
    edge_overflow: AtomicU64,
    /// Counter values of the current hook (written by the counters reader).
    pub cnow: [AtomicU64; MAX_EVENTS],
    /// Counter events this thread reads (0 without an XSAVE area).
    pub nevents: AtomicU64,
    /// Errno of a counter group the kernel refused.
    pub counters_errno: AtomicU64,
    /// Order in which a kept thread ended.
    ended: AtomicU64,
    /// A hook of this thread is in a call out of the runtime ([`slot::OUTSIDE`]).
    pub outside: AtomicU64,
    // Private words: the runtime's own, in bytes from the slot or addresses in this process.
    nfuncs: AtomicU64,
    edge_mask: AtomicU64,
    stats_at: AtomicU64,
    edges_at: AtomicU64,
    stack_at: AtomicU64,
    /// The counters reader's XSAVE area, 64-byte aligned, or 0.
    pub xsave: AtomicU64,
    /// The counters reader's per-thread state (a pointer it owns), 0 until its first read.
    pub counters: AtomicU64,
    _private: [AtomicU64; 9],
}

const _: () = {
    assert!(size_of::<Thread>() == layout::SLOT_HEADER_WORDS as usize * 8);
    assert!(core::mem::offset_of!(Thread, seq) == slot::SEQ * 8);
    assert!(core::mem::offset_of!(Thread, state) == slot::STATE * 8);
    assert!(core::mem::offset_of!(Thread, tid) == slot::TID * 8);
    assert!(core::mem::offset_of!(Thread, process) == slot::PROC * 8);
    assert!(core::mem::offset_of!(Thread, depth) == slot::DEPTH * 8);
    assert!(core::mem::offset_of!(Thread, reentered) == slot::REENTERED * 8);
    assert!(core::mem::offset_of!(Thread, untimed) == slot::UNTIMED * 8);
    assert!(core::mem::offset_of!(Thread, edge_overflow) == slot::EDGE_OVERFLOW * 8);
    assert!(core::mem::offset_of!(Thread, cnow) == slot::CNOW * 8);
    assert!(core::mem::offset_of!(Thread, nevents) == slot::NEVENTS * 8);
    assert!(core::mem::offset_of!(Thread, counters_errno) == slot::COUNTERS_ERRNO * 8);
    assert!(core::mem::offset_of!(Thread, ended) == slot::ENDED * 8);
    assert!(core::mem::offset_of!(Thread, outside) == slot::OUTSIDE * 8);
    assert!(core::mem::offset_of!(Thread, nfuncs) == slot::PRIVATE * 8);
    assert!(size_of::<Stats>() == layout::STAT_WORDS as usize * 8);
    assert!(core::mem::offset_of!(Stats, calls) == stat::CALLS * 8);
    assert!(core::mem::offset_of!(Stats, exits) == stat::EXITS * 8);
    assert!(core::mem::offset_of!(Stats, unwound) == stat::UNWOUND * 8);
    assert!(core::mem::offset_of!(Stats, incl) == stat::INCL * 8);
    assert!(core::mem::offset_of!(Stats, excl) == stat::EXCL * 8);
    assert!(core::mem::offset_of!(Stats, min) == stat::MIN * 8);
    assert!(core::mem::offset_of!(Stats, max) == stat::MAX * 8);
    assert!(core::mem::offset_of!(Stats, active) == stat::ACTIVE * 8);
    assert!(core::mem::offset_of!(Stats, cincl) == stat::CINCL * 8);
    assert!(core::mem::offset_of!(Stats, cexcl) == stat::CEXCL * 8);
    assert!(size_of::<Edge>() == layout::EDGE_WORDS as usize * 8);
    assert!(size_of::<Entry>() == layout::ENTRY_WORDS as usize * 8);
    assert!(core::mem::offset_of!(Entry, slot) == entry::SLOT * 8);
    assert!(core::mem::offset_of!(Entry, ret) == entry::RET * 8);
    assert!(core::mem::offset_of!(Entry, start) == entry::START * 8);
    assert!(core::mem::offset_of!(Entry, child) == entry::CHILD * 8);
    assert!(core::mem::offset_of!(Entry, fid) == entry::FID * 8);
    assert!(core::mem::offset_of!(Entry, cstart) == entry::CSTART * 8);
    assert!(core::mem::offset_of!(Entry, cchild) == entry::CCHILD * 8);
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
/// A slot state private to the runtime: being folded by another thread.
const FOLDING: u64 = 3;

/// The session's geometry as plain words, written at set-up before [`BASE`]
/// is published: what registration needs, without the (vector-copied,
/// GOT-called) [`Geometry`] on a path the hooks reach.
pub(crate) struct Flat {
    pub funcs: AtomicU64,
    pub edges: AtomicU64,
    pub slots: AtomicU64,
    pub slots_at: AtomicU64,
    pub slot_words: AtomicU64,
    pub procs: AtomicU64,
    pub proc_words: AtomicU64,
}

pub(crate) static FLAT: Flat = Flat {
    funcs: AtomicU64::new(0),
    edges: AtomicU64::new(0),
    slots: AtomicU64::new(0),
    slots_at: AtomicU64::new(0),
    slot_words: AtomicU64::new(0),
    procs: AtomicU64::new(0),
    proc_words: AtomicU64::new(0),
};

impl Flat {
    /// Records `g` (set-up, before publishing the segment).
    pub(crate) fn set(&self, g: &Geometry) {
        self.funcs.set(g.funcs);
        self.edges.set(g.edges);
        self.slots.set(g.slots);
        self.slots_at.set(g.slot_at(0));
        self.slot_words.set(g.slot_words);
        self.procs.set(g.procs);
        self.proc_words.set(g.proc_words);
    }
}

/// A word of the mapped segment at `base`.
#[inline(always)]
fn word_at(base: usize, i: u64) -> &'static AtomicU64 {
    // SAFETY: callers pass positions inside the session's mapping at `base` (from FLAT).
    unsafe { &*((base + i as usize * 8) as *const AtomicU64) }
}

/// Claims a free slot of the segment at `base` for thread `tid` of record `p`.
fn claim(base: usize, p: u64, tid: u64) -> Option<&'static Thread> {
    let (slots, at, words) = (FLAT.slots.get(), FLAT.slots_at.get(), FLAT.slot_words.get());
    for i in 0..slots {
        let w = word_at(base, at + i * words);
        // SAFETY: slot `i` lies inside the mapping; Thread mirrors its header.
        let t = unsafe { &*(w as *const AtomicU64 as *const Thread) };
        if t.state.compare_exchange(slot::FREE, slot::LIVE, Ordering::Acquire, Ordering::Relaxed).is_ok() {
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
        let g = Geometry::new(n(hdr::FUNCS), n(hdr::EDGES), n(hdr::DEPTH), n(hdr::SLOTS), n(hdr::PROCS))?;
        Some(Seg { base, g })
    }

    /// Word `i` of the segment.
    pub(crate) fn word(&self, i: u64) -> &'static AtomicU64 {
        debug_assert!(i < self.g.total_words);
        // SAFETY: callers pass positions from the geometry, all inside the mapping.
        unsafe { &*((self.base + i as usize * 8) as *const AtomicU64) }
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
            for i in 0..self.g.slots {
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
            let Some((_, t)) = oldest.filter(|_| kept > self.g.slots / 2) else { return };
            if t.state.compare_exchange(slot::KEPT, FOLDING, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                t.fold(self);
                t.state.store(slot::FREE, Ordering::Release);
            }
        }
    }

    fn proc_word(&self, p: u64, w: usize) -> &'static AtomicU64 {
        self.word(self.g.proc_at(p) + w as u64)
    }

    fn proc_stats(&self, p: u64, fid: u64) -> &'static Stats {
        let at = self.g.proc_at(p) + self.g.proc_stats() + fid * layout::STAT_WORDS;
        // SAFETY: fid < funcs, so the row lies inside the record.
        unsafe { &*(self.word(at) as *const AtomicU64 as *const Stats) }
    }

    fn proc_edge(&self, p: u64, i: u64) -> &'static Edge {
        let at = self.g.proc_at(p) + self.g.proc_edges() + (i & (self.g.edges - 1)) * layout::EDGE_WORDS;
        // SAFETY: the index is masked to the table.
        unsafe { &*(self.word(at) as *const AtomicU64 as *const Edge) }
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
    crate::counters::register_exit(t);
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
/// figures folded into the process' exited-thread totals, the slot freed.
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
    /// Prepares a freshly claimed slot (zero tables, as folding left them).
    fn init(&self, p: u64, tid: u64) {
        let (funcs, edges) = (FLAT.funcs.get(), FLAT.edges.get());
        let stats = layout::SLOT_HEADER_WORDS;
        let edges_at = stats + funcs * layout::STAT_WORDS;
        let stack_at = edges_at + edges * layout::EDGE_WORDS;
        self.tid.set(tid);
        self.process.set(p);
        self.depth.set(0);
        self.reentered.set(0);
        self.untimed.set(0);
        self.edge_overflow.set(0);
        self.counters_errno.set(0);
        self.ended.set(0);
        self.outside.set(0);
        self.nfuncs.set(funcs);
        self.edge_mask.set(edges - 1);
        self.stats_at.set(stats * 8);
        self.edges_at.set(edges_at * 8);
        self.stack_at.set(stack_at * 8);
        let nevents = crate::counters::NEVENTS.load(Ordering::Acquire) as u64;
        let xsave = if nevents > 0 { crate::counters::xsave_area() } else { None };
        match xsave {
            Some(area) => {
                self.xsave.set(area as u64);
                self.nevents.set(nevents.min(MAX_EVENTS as u64));
            }
            None => {
                self.xsave.set(0);
                self.nevents.set(0);
            }
        }
        self.counters.set(0);
    }

    /// Closes the thread's open frames as unwound, then folds its figures
    /// into its process record and frees the slot, or (per-thread mode)
    /// keeps the slot and folds the oldest kept one beyond the bound.
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

    /// Folds the figures into the process record (under its lock) and zeroes them.
    fn fold(&self, seg: &Seg) {
        let p = self.process.get();
        if p >= seg.g.procs {
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
        seg.proc_word(p, proc::EDGE_OVERFLOW).add(self.edge_overflow.get());
        seq.store(seq.get().wrapping_add(1), Ordering::Release);
        lock.store(0, Ordering::Release);
        mine.store(mine.get().wrapping_add(1), Ordering::Release);
    }

    /// Adds every row and pair into record `p` and zeroes them here.
    fn fold_into(&self, seg: &Seg, p: u64) {
        for fid in 0..self.nfuncs.get().min(seg.g.funcs) {
            let s = self.stats(fid);
            let calls = s.calls.get();
            if calls == 0 {
                continue;
            }
            let d = seg.proc_stats(p, fid);
            let closed_before = d.exits.get() + d.unwound.get();
            let closed = s.exits.get() + s.unwound.get();
            if closed > 0 {
                if closed_before == 0 || s.min.get() < d.min.get() {
                    d.min.set(s.min.get());
                }
                d.max.set(d.max.get().max(s.max.get()));
            }
            for (a, b) in [
                (&d.calls, &s.calls),
                (&d.exits, &s.exits),
                (&d.unwound, &s.unwound),
                (&d.incl, &s.incl),
                (&d.excl, &s.excl),
            ] {
                a.add(b.get());
            }
            for i in 0..MAX_EVENTS {
                d.cincl[i].add(s.cincl[i].get());
                d.cexcl[i].add(s.cexcl[i].get());
            }
            for w in [&s.calls, &s.exits, &s.unwound, &s.incl, &s.excl, &s.min, &s.max, &s.active] {
                w.set(0);
            }
            for i in 0..MAX_EVENTS {
                s.cincl[i].set(0);
                s.cexcl[i].set(0);
            }
        }
        for i in 0..=self.edge_mask.get() {
            let e = self.edge(i);
            let key = e.key.get();
            if key == 0 {
                continue;
            }
            let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
            let mut placed = false;
            for j in 0..EDGE_PROBES {
                let d = seg.proc_edge(p, h + j);
                let k = d.key.get();
                if k == key || k == 0 {
                    d.key.set(key);
                    d.calls.add(e.calls.get());
                    d.incl.add(e.incl.get());
                    placed = true;
                    break;
                }
            }
            if !placed {
                seg.proc_word(p, proc::EDGE_OVERFLOW).add(1);
            }
            e.key.set(0);
            e.calls.set(0);
            e.incl.set(0);
        }
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

    /// A statistics row.
    #[inline(always)]
    pub(crate) fn stats(&self, fid: u64) -> &Stats {
        // SAFETY: callers check fid < nfuncs; rows follow the header in the slot.
        unsafe {
            &*((self as *const Thread as *const u8).add(self.stats_at.get() as usize) as *const Stats)
                .add(fid as usize)
        }
    }

    /// A caller → callee slot.
    #[inline(always)]
    pub(crate) fn edge(&self, i: u64) -> &Edge {
        // SAFETY: the index is masked to the table, which lies in the slot.
        unsafe {
            &*((self as *const Thread as *const u8).add(self.edges_at.get() as usize) as *const Edge)
                .add((i & self.edge_mask.get()) as usize)
        }
    }

    #[inline(always)]
    fn entry(&self, i: u64) -> &Entry {
        // SAFETY: callers pass i < depth <= DEPTH; the stack lies in the slot.
        unsafe {
            &*((self as *const Thread as *const u8).add(self.stack_at.get() as usize) as *const Entry)
                .add(i as usize)
        }
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

    /// Records an activation; `false` when its return cannot be tracked (the
    /// call is still counted when the shadow stack is full).
    #[inline(always)]
    pub(crate) fn push(&self, fid: u32, slot: u64, ret: u64, now: u64, nev: usize) -> bool {
        let t = self.0;
        let fid = u64::from(fid);
        let d = t.depth.get();
        if d >= DEPTH || fid >= t.nfuncs.get() {
            self.untracked(fid);
            return false;
        }
        let e = t.entry(d);
        e.slot.set(slot);
        e.ret.set(ret);
        e.start.set(now);
        e.child.set(0);
        e.fid.set(fid);
        for i in 0..nev.min(MAX_EVENTS) {
            e.cstart[i].set(t.cnow[i].get());
            e.cchild[i].set(0);
        }
        t.depth.set(d + 1);
        let s = t.stats(fid);
        s.calls.add(1);
        s.active.add(1);
        true
    }

    #[cold]
    #[inline(never)]
    extern "C" fn untracked(&self, fid: u64) {
        let t = self.0;
        t.untimed.add(1);
        if fid < t.nfuncs.get() {
            t.stats(fid).calls.add(1);
        }
    }

    /// Closes every activation whose return slot lies below `slot` (frames
    /// left by longjmp or an exception), recording each as unwound at `now`.
    /// With `same_too`, an activation at `slot` itself is closed as well: a
    /// new call through a slot that holds a real return address (not the exit
    /// stub, as a tail call's would) means the old activation there is gone.
    #[inline(always)]
    pub(crate) fn reap_below(&self, slot: u64, same_too: bool, now: u64, nev: usize) {
        // Nothing to close on almost every call: test the innermost entry here
        // and keep the loop (a second inlined `pop`) out of the hooks' hot paths.
        let d = self.0.depth.get();
        if d == 0 {
            return;
        }
        let s = self.0.entry(d - 1).slot.get();
        let stale = s < slot || (same_too && s == slot);
        if stale && slot - s < REAP_WINDOW {
            self.reap_slow(slot, same_too, now, nev);
        }
    }

    // extern "C", like the other out-of-line helpers, so hooks call it directly, not through the GOT.
    #[cold]
    #[inline(never)]
    extern "C" fn reap_slow(&self, slot: u64, same_too: bool, now: u64, nev: usize) {
        loop {
            let d = self.0.depth.get();
            if d == 0 {
                return;
            }
            let s = self.0.entry(d - 1).slot.get();
            let stale = s < slot || (same_too && s == slot);
            if !stale || slot - s >= REAP_WINDOW {
                return;
            }
            self.pop(now, nev, true);
        }
    }

    /// Makes the activation whose return slot is `slot` the innermost one.
    /// Activations of another stack can lie above it: a coroutine that
    /// `swapcontext` left is still open on its own stack, and the return
    /// through the stub at `slot` is not its return.
    #[inline(always)]
    pub(crate) fn innermost_at(&self, slot: u64) {
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
    #[inline(always)]
    pub(crate) fn pop(&self, now: u64, nev: usize, unwound: bool) -> u64 {
        let t = self.0;
        let d = t.depth.get() - 1;
        t.depth.set(d);
        let e = t.entry(d);
        let fid = e.fid.get();
        if fid >= t.nfuncs.get() {
            // Begun before a fork, in the parent: only its return matters here.
            return e.ret.get();
        }
        let dur = now.saturating_sub(e.start.get());
        let excl = dur.saturating_sub(e.child.get());
        let s = t.stats(fid);
        let n = s.exits.get() + s.unwound.get();
        if unwound {
            s.unwound.add(1)
        } else {
            s.exits.add(1)
        }
        let active = s.active.get().saturating_sub(1);
        s.active.set(active);
        if active == 0 {
            s.incl.add(dur);
        }
        s.excl.add(excl);
        if n == 0 || dur < s.min.get() {
            s.min.set(dur);
        }
        if dur > s.max.get() {
            s.max.set(dur);
        }
        let outer = active == 0;
        let parent = (d > 0).then(|| t.entry(d - 1));
        for i in 0..nev.min(MAX_EVENTS) {
            let delta = t.cnow[i].get().saturating_sub(e.cstart[i].get());
            if outer {
                s.cincl[i].add(delta);
            }
            s.cexcl[i].add(delta.saturating_sub(e.cchild[i].get()));
            if let Some(p) = parent {
                p.cchild[i].add(delta);
            }
        }
        if let Some(parent) = parent {
            parent.child.add(dur);
            let caller = parent.fid.get();
            if caller < t.nfuncs.get() {
                self.add_edge(caller, fid, dur);
            }
        }
        e.ret.get()
    }

    #[inline(always)]
    fn add_edge(&self, caller: u64, callee: u64, dur: u64) {
        let key = ((caller + 1) << 32) | callee;
        let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        for i in 0..EDGE_PROBES {
            let e = self.0.edge(h + i);
            let k = e.key.get();
            if k == key || k == 0 {
                e.key.set(key);
                e.calls.add(1);
                e.incl.add(dur);
                return;
            }
        }
        self.0.edge_overflow.add(1);
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
    if rec >= seg.g.procs {
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
    let parent_pid = if parent_rec < seg.g.procs { seg.proc_word(parent_rec, proc::PID).get() } else { 0 };
    seg.proc_word(rec, proc::PID).set(u64::from(std::process::id()));
    seg.proc_word(rec, proc::PARENT).set(parent_pid);
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

/// A slot in private memory for a thread that must keep its frames but has no place in the segment.
fn private_slot(seg: &Seg, frames: &[[u64; 2]], epoch: u64) {
    let Some(base) = sys::mmap_zeroed(seg.g.slot_words as usize * 8) else {
        sys::die(b"papirus-probe-runtime: no memory for a forked child's return addresses\n")
    };
    // SAFETY: a fresh zeroed mapping of a slot's size; zero is valid for every word.
    let t = unsafe { &*(base as *const Thread) };
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
            // Frames begun in the parent are not timed or counted in the child.
            e.fid.set(u64::MAX);
        }
        self.depth.set(frames.len() as u64);
    }
}
