//! Per-thread profile tables and the shadow stack of hijacked returns.
//!
//! Each thread gets one anonymous mapping at its first instrumented call:
//! a [`Thread`] header, a statistics row per function, an open-addressed
//! caller → callee table and the shadow stack. Tables are linked into a global
//! list that is never unlinked, so a thread's results outlive the thread.
//!
//! Every table word is a [`Word`], read and written with volatile accesses:
//! the compiler may neither merge neighbouring updates into vector
//! instructions (the trampolines do not save vector registers) nor cache a
//! value a signal handler or the report may look at.
//!
//! # Safety
//!
//! A `Thread` is only ever written by its own thread. The `busy` flag keeps a
//! signal handler from touching the tables while the interrupted hook is
//! using them: re-entered hooks return after bumping a counter. Readers of
//! other threads' tables (the report) read words racily; a torn figure is
//! stale, never undefined memory, because the mapping is never unmapped.
#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering, compiler_fence};

use crate::sys;

/// Shadow-stack depth per thread; deeper calls run uninstrumented and are counted.
pub(crate) const DEPTH: u64 = 4096;
/// Stale shadow entries are discarded only when they lie less than this far
/// below the current frame: a signal handler on an alternate stack (which may
/// lie anywhere) must not discard the interrupted stack's entries.
const REAP_WINDOW: u64 = 256 << 20;
/// Probes per caller → callee lookup before the pair is counted as dropped.
const EDGE_PROBES: u64 = 8;
/// Counter events the counters probe reads at most.
pub const MAX_EVENTS: usize = 4;

/// A table word.
#[repr(transparent)]
pub(crate) struct Word(UnsafeCell<u64>);

impl Word {
    #[inline(always)]
    pub(crate) fn get(&self) -> u64 {
        // SAFETY: the word lives in a never-unmapped table; see the module docs for races.
        unsafe { self.0.get().read_volatile() }
    }

    #[inline(always)]
    pub(crate) fn set(&self, v: u64) {
        // SAFETY: as in `get`; only the owning thread writes.
        unsafe { self.0.get().write_volatile(v) }
    }

    #[inline(always)]
    fn add(&self, v: u64) {
        self.set(self.get().wrapping_add(v));
    }
}

/// One activation whose return was hijacked.
#[repr(C)]
pub(crate) struct Entry {
    /// Address of the return-address slot.
    slot: Word,
    /// The real return address.
    ret: Word,
    /// Entry timestamp.
    start: Word,
    /// Inclusive time of completed callees.
    child: Word,
    /// Function id.
    fid: Word,
    /// Session the activation began in (ids of older sessions mean other functions).
    epoch: Word,
    /// Counter values at entry.
    cstart: [Word; MAX_EVENTS],
    /// Counter deltas of completed callees.
    cchild: [Word; MAX_EVENTS],
}

/// Per-function totals of one thread, in ticks.
#[repr(C)]
pub(crate) struct Stats {
    pub calls: Word,
    pub exits: Word,
    pub unwound: Word,
    pub incl: Word,
    pub excl: Word,
    pub min: Word,
    pub max: Word,
    /// Activations currently open (recursion depth), so inclusive time counts the outermost only.
    pub active: Word,
    /// Inclusive counter deltas.
    pub cincl: [Word; MAX_EVENTS],
    /// Exclusive counter deltas.
    pub cexcl: [Word; MAX_EVENTS],
}

/// One caller → callee pair.
#[repr(C)]
pub(crate) struct Edge {
    /// `(caller + 1) << 32 | callee`; 0 when the slot is empty.
    pub key: Word,
    pub calls: Word,
    pub incl: Word,
}

/// A thread's tables.
#[repr(C)]
pub(crate) struct Thread {
    busy: Word,
    /// Session the statistics belong to.
    pub epoch: Word,
    /// Hooks entered while `busy` (signal handlers interrupting a hook).
    pub reentered: Word,
    pub depth: Word,
    pub nfuncs: u64,
    pub edge_mask: u64,
    pub tid: u64,
    /// Calls not instrumented because the shadow stack was full or the id unknown.
    pub overflow: Word,
    /// Caller → callee pairs not recorded because the table was full.
    pub edge_overflow: Word,
    /// Counter values of the current hook (written by the counters reader).
    pub cnow: [Word; MAX_EVENTS],
    /// Counter events this thread reads (0 without an XSAVE area).
    pub nevents: u64,
    /// The counters reader's XSAVE area, 64-byte aligned, or null.
    pub xsave: *mut u8,
    /// The counters reader's per-thread state (a pointer it owns), 0 until its first read.
    pub counters: Word,
    next: *mut Thread,
    stats: *mut Stats,
    edges: *mut Edge,
    stack: *mut Entry,
}

/// Head of the list of every thread's tables.
static THREADS: AtomicPtr<Thread> = AtomicPtr::new(null_mut());
/// Statistics rows per thread; 0 until the runtime is set up.
pub(crate) static CAPACITY: AtomicU64 = AtomicU64::new(0);
/// Functions of the current session (sizes new caller → callee tables).
pub(crate) static FUNCS: AtomicU64 = AtomicU64::new(0);
/// Most functions any session had: the statistics rows a new session clears.
pub(crate) static ROWS: AtomicU64 = AtomicU64::new(0);
/// The current session. A thread whose tables belong to an older one clears
/// them at its next hook; its open activations of the older session still
/// return through the stub but are not recorded.
pub(crate) static EPOCH: AtomicU64 = AtomicU64::new(1);

/// The calling thread's tables, created on first use; `None` before set-up
/// or when the kernel refuses the memory.
#[inline(always)]
pub(crate) fn current() -> Option<&'static Thread> {
    let p = sys::tls_get() as *const Thread;
    if p.is_null() {
        return register();
    }
    // SAFETY: a non-null slot always points at this thread's live, never unmapped tables.
    Some(unsafe { &*p })
}

#[cold]
#[inline(never)]
extern "C" fn register() -> Option<&'static Thread> {
    let nfuncs = CAPACITY.load(Ordering::Acquire);
    if nfuncs == 0 {
        return None;
    }
    let edge_cap = (FUNCS.load(Ordering::Relaxed) * 4).clamp(256, 1 << 16).next_power_of_two();
    let head = size_of::<Thread>().next_multiple_of(64);
    let stats_len = nfuncs as usize * size_of::<Stats>();
    let edges_len = edge_cap as usize * size_of::<Edge>();
    let stack_len = DEPTH as usize * size_of::<Entry>();
    let base = sys::mmap_zeroed(head + stats_len + edges_len + stack_len)?;
    let t = base as *mut Thread;
    let nevents = crate::counters::NEVENTS.load(Ordering::Acquire) as u64;
    let xsave = if nevents > 0 { crate::counters::xsave_area() } else { None };
    // SAFETY: `base` is a fresh zeroed mapping large enough for the header and
    // the three tables laid out after it; zero is a valid value of every field.
    unsafe {
        (*t).nfuncs = nfuncs;
        if let Some(area) = xsave {
            (*t).xsave = area;
            (*t).nevents = nevents.min(MAX_EVENTS as u64);
        }
        (*t).epoch.set(EPOCH.load(Ordering::Acquire));
        (*t).edge_mask = edge_cap - 1;
        (*t).tid = u64::from(sys::gettid());
        (*t).stats = base.add(head) as *mut Stats;
        (*t).edges = base.add(head + stats_len) as *mut Edge;
        (*t).stack = base.add(head + stats_len + edges_len) as *mut Entry;
    }
    let mut old = THREADS.load(Ordering::Relaxed);
    loop {
        // SAFETY: the header is not yet shared.
        unsafe { (*t).next = old };
        match THREADS.compare_exchange_weak(old, t, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => old = now,
        }
    }
    sys::tls_set(t as usize);
    // SAFETY: just initialised, never unmapped.
    Some(unsafe { &*t })
}

/// Every thread's tables, newest first.
pub(crate) fn threads() -> impl Iterator<Item = &'static Thread> {
    let mut p = THREADS.load(Ordering::Acquire);
    core::iter::from_fn(move || {
        // SAFETY: list nodes are never freed; `next` is written before publication.
        let t = unsafe { p.as_ref()? };
        p = t.next;
        Some(t)
    })
}

/// Exclusive use of a thread's tables by the hook that holds it.
#[repr(transparent)]
pub(crate) struct Guard(&'static Thread);

impl Thread {
    /// Claims the tables for a hook; `None` if a hook of this thread is already
    /// running (a signal handler interrupted it).
    #[inline(always)]
    pub(crate) fn enter(&'static self) -> Option<Guard> {
        if self.busy.get() != 0 {
            self.reentered.add(1);
            return None;
        }
        self.busy.set(1);
        compiler_fence(Ordering::SeqCst);
        let epoch = EPOCH.load(Ordering::Relaxed);
        if self.epoch.get() != epoch {
            self.renew(epoch);
        }
        Some(Guard(self))
    }

    /// Clears the statistics for a new session (the shadow stack stays: its
    /// activations still return through the stub).
    #[cold]
    #[inline(never)]
    extern "C" fn renew(&self, epoch: u64) {
        let rows = ROWS.load(Ordering::Relaxed).min(self.nfuncs);
        for i in 0..rows {
            let s = self.stats(i);
            for w in [&s.calls, &s.exits, &s.unwound, &s.incl, &s.excl, &s.min, &s.max, &s.active] {
                w.set(0);
            }
            for i in 0..MAX_EVENTS {
                s.cincl[i].set(0);
                s.cexcl[i].set(0);
            }
        }
        for i in 0..=self.edge_mask {
            let e = self.edge(i);
            e.key.set(0);
            e.calls.set(0);
            e.incl.set(0);
        }
        self.overflow.set(0);
        self.edge_overflow.set(0);
        self.reentered.set(0);
        self.epoch.set(epoch);
    }

    /// A statistics row.
    #[inline(always)]
    pub(crate) fn stats(&self, fid: u64) -> &Stats {
        // SAFETY: callers check fid < nfuncs; rows live as long as the thread list.
        unsafe { &*self.stats.add(fid as usize) }
    }

    /// A caller → callee slot.
    #[inline(always)]
    pub(crate) fn edge(&self, i: u64) -> &Edge {
        // SAFETY: callers mask i with edge_mask.
        unsafe { &*self.edges.add((i & self.edge_mask) as usize) }
    }

    #[inline(always)]
    fn entry(&self, i: u64) -> &Entry {
        // SAFETY: callers pass i < depth <= DEPTH.
        unsafe { &*self.stack.add(i as usize) }
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        self.0.busy.set(0);
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

    /// Records an activation; `false` (and nothing recorded) when it cannot be tracked.
    #[inline(always)]
    pub(crate) fn push(&self, fid: u32, slot: u64, ret: u64, now: u64, nev: usize) -> bool {
        let t = self.0;
        let fid = u64::from(fid);
        let d = t.depth.get();
        if d >= DEPTH || fid >= t.nfuncs {
            t.overflow.add(1);
            return false;
        }
        let e = t.entry(d);
        e.slot.set(slot);
        e.ret.set(ret);
        e.start.set(now);
        e.child.set(0);
        e.fid.set(fid);
        e.epoch.set(t.epoch.get());
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

    /// Closes the innermost activation at `now` and returns its real return
    /// address (the caller checked that there is one).
    #[inline(always)]
    pub(crate) fn pop(&self, now: u64, nev: usize, unwound: bool) -> u64 {
        let t = self.0;
        let d = t.depth.get() - 1;
        t.depth.set(d);
        let e = t.entry(d);
        if e.epoch.get() != t.epoch.get() {
            return e.ret.get();
        }
        let fid = e.fid.get();
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
        let parent = (d > 0 && t.entry(d - 1).epoch.get() == t.epoch.get()).then(|| t.entry(d - 1));
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
            self.add_edge(parent.fid.get(), fid, dur);
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
