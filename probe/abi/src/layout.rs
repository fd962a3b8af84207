//! The results segment: where the runtime keeps every figure and the tool reads them.
//!
//! # Object
//!
//! A memfd (`MFD_CLOEXEC | MFD_ALLOW_SEALING`) the runtime creates at set-up,
//! sizes with `ftruncate`, seals with `F_SEAL_SHRINK | F_SEAL_GROW |
//! F_SEAL_SEAL` (so nobody can make a mapping of it fault with SIGBUS), and
//! maps `MAP_SHARED`. The tool takes a copy of the fd with `pidfd_getfd`,
//! checks the seals and the size, maps it read-only, and closes the target's
//! fd (the target keeps only its mapping). The object outlives the target:
//! the tool reads it after any end, SIGKILL included. A child forked by the
//! target inherits the shared mapping and takes records of its own in it.
//!
//! # Layout
//!
//! The segment is an array of little-endian 64-bit words; every position
//! below is a word index, every offset counts words from the segment's start
//! (or, for the `*_AT` words of a slot, bytes from the slot's start); nothing
//! in it is a pointer the tool follows. [`Geometry`] computes every position
//! from five numbers of the header, so a reader recomputes and checks them.
//!
//! ```text
//! header      HEADER_WORDS                     hdr::*
//! processes   procs × proc_words               proc::* header, totals (funcs × STAT_WORDS), edges (edges × EDGE_WORDS)
//! slots       slots × slot_words               slot::* header, stats (funcs × STAT_WORDS), edges, stack (depth × ENTRY_WORDS)
//! ```
//!
//! A *slot* is one live thread's tables; a *process record* is one process
//! of the target's tree (the target, then each forked child) with the
//! per-function totals of its exited threads.
//!
//! # Ordering
//!
//! - A slot is written only by its thread. Each hook makes the slot's
//!   [`slot::SEQ`] odd (Relaxed store, then a Release fence), writes figures
//!   with Relaxed loads and stores, and makes it even again with a Release
//!   store. A reader loads `SEQ` with Acquire, copies, issues an Acquire
//!   fence and loads `SEQ` again: equal and even means a consistent copy.
//!   On x86-64 all of this compiles to plain moves, as the volatile words
//!   it replaces did. A reader that keeps losing the race takes the copy
//!   anyway: each word is whole (never undefined), the figures may mix two
//!   moments (the report says `torn`).
//! - [`slot::STATE`] goes 0 → 1 by compare-exchange (Acquire) when a thread
//!   claims the slot and 1 → 0 with a Release store after its figures were
//!   folded into its process record's totals at thread exit.
//! - A process record's totals are written under [`proc::LOCK`] (a
//!   compare-exchange spin lock taken on thread exit only) and bracketed by
//!   [`proc::SEQ`] like a slot.
//! - A thread's exit moves figures from its slot to the totals: a reader
//!   sampling during that move may count them twice or not at all; a reader
//!   of a stopped or ended target never does.

/// `PAPIRSEG`, little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PAPIRSEG");
/// Layout version; a reader refuses any other.
pub const VERSION: u64 = 1;
/// Header size.
pub const HEADER_WORDS: u64 = 32;
/// Counter events at most.
pub const MAX_EVENTS: usize = 4;

/// Header words.
pub mod hdr {
    /// [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// [`super::VERSION`].
    pub const VERSION: usize = 1;
    /// Functions (statistics rows per table).
    pub const FUNCS: usize = 2;
    /// Caller → callee slots per table (a power of two).
    pub const EDGES: usize = 3;
    /// Shadow-stack entries per slot.
    pub const DEPTH: usize = 4;
    /// Thread slots.
    pub const SLOTS: usize = 5;
    /// Process records.
    pub const PROCS: usize = 6;
    /// Total words of the segment.
    pub const TOTAL_WORDS: usize = 7;
    /// TSC at set-up.
    pub const START_TSC: usize = 8;
    /// Process records claimed so far.
    pub const NEXT_PROC: usize = 9;
    /// Threads that found no free slot (their calls run unmeasured).
    pub const SLOT_MISSES: usize = 10;
    /// Forked children that found no free process record (not measured).
    pub const PROC_MISSES: usize = 11;
    /// Threads that ended so far (numbers [`super::slot::ENDED`]).
    pub const ENDED: usize = 16;
    /// The probe: 0 empty, 1 wallclock, 2 counters.
    pub const PROBE: usize = 12;
    /// Counter events read.
    pub const NEVENTS: usize = 13;
    /// The exit stub's address in the target (hijacked return addresses hold it).
    pub const EXIT_STUB: usize = 15;
}

/// Words of a slot header.
pub const SLOT_HEADER_WORDS: u64 = 32;

/// Slot header words.
pub mod slot {
    /// Sequence: odd while a hook writes the slot.
    pub const SEQ: usize = 0;
    /// [`FREE`], [`LIVE`] (held by a running thread) or [`KEPT`] (an ended
    /// thread's figures kept per thread on request).
    pub const STATE: usize = 1;
    /// Slot state: free.
    pub const FREE: u64 = 0;
    /// Slot state: held by a running thread.
    pub const LIVE: u64 = 1;
    /// Slot state: an ended thread's figures, kept until the slot is needed.
    pub const KEPT: u64 = 2;
    /// Kernel thread id.
    pub const TID: usize = 2;
    /// Index of the thread's process record.
    pub const PROC: usize = 3;
    /// Open activations on the shadow stack (the first `DEPTH` entries are valid).
    pub const DEPTH: usize = 4;
    /// Calls made from a signal handler that interrupted a hook (not counted).
    pub const REENTERED: usize = 5;
    /// Calls past the shadow-stack bound: counted in `calls`, not timed.
    pub const UNTIMED: usize = 6;
    /// Caller → callee pairs dropped because the table was full.
    pub const EDGE_OVERFLOW: usize = 7;
    /// Counter values of the current hook.
    pub const CNOW: usize = 8;
    /// Counter events this thread reads.
    pub const NEVENTS: usize = 12;
    /// Errno of the counter group this thread could not open (0: none).
    pub const COUNTERS_ERRNO: usize = 13;
    /// For a [`KEPT`] slot, the order its thread ended in (1, 2, …).
    pub const ENDED: usize = 14;
    /// 1 while a hook of this thread runs code outside the runtime (the
    /// counters reader opening its group or reading it with `read(2)`, in
    /// libc) and will write the slot again when that returns: its PC may
    /// lie in libc meanwhile. Written by the owner (Relaxed; the tool reads
    /// it with the thread stopped); the tool ends a session only while it is
    /// 0 in every live slot, as it waits for [`super::proc::COLD`].
    pub const OUTSIDE: usize = 15;
    /// First word of the runtime's private words (addresses in the target
    /// that only the runtime uses; the tool never reads them).
    pub const PRIVATE: usize = 16;
}

/// Process record header words.
pub mod proc {
    /// Sequence, as a slot's.
    pub const SEQ: usize = 0;
    /// 0 free, 1 claimed.
    pub const STATE: usize = 1;
    /// Process id.
    pub const PID: usize = 2;
    /// Parent's process id.
    pub const PARENT: usize = 3;
    /// Threads whose figures were folded into the totals.
    pub const EXITED_THREADS: usize = 4;
    /// Spin lock of the totals.
    pub const LOCK: usize = 5;
    /// Threads that ever took a slot.
    pub const THREADS: usize = 6;
    /// Exited threads' [`super::slot::REENTERED`], summed.
    pub const REENTERED: usize = 7;
    /// Exited threads' [`super::slot::UNTIMED`], summed.
    pub const UNTIMED: usize = 8;
    /// Exited threads' dropped pairs, plus pairs that found no place in the totals.
    pub const EDGE_OVERFLOW: usize = 9;
    /// Threads of this process inside a cold path of the runtime that calls
    /// out of it (thread registration, thread exit, the fork handler) and
    /// touches the segment again after the call: such a thread's PC may lie
    /// in libc while its return address leads back into the runtime. The
    /// tool ends the session only while it is 0 and no PC is in the runtime.
    pub const COLD: usize = 10;
}

/// Words of a process record header.
pub const PROC_HEADER_WORDS: u64 = 16;

/// Words of a statistics row.
pub const STAT_WORDS: u64 = 16;

/// Statistics row words (per function): ticks for times.
pub mod stat {
    /// Entries.
    pub const CALLS: usize = 0;
    /// Returns.
    pub const EXITS: usize = 1;
    /// Activations closed without returning.
    pub const UNWOUND: usize = 2;
    /// Inclusive time (outermost activations).
    pub const INCL: usize = 3;
    /// Exclusive time.
    pub const EXCL: usize = 4;
    /// Shortest activation.
    pub const MIN: usize = 5;
    /// Longest activation.
    pub const MAX: usize = 6;
    /// Activations open now.
    pub const ACTIVE: usize = 7;
    /// Inclusive counter deltas (4 words).
    pub const CINCL: usize = 8;
    /// Exclusive counter deltas (4 words).
    pub const CEXCL: usize = 12;
}

/// Words of a caller → callee slot: key (`(caller + 1) << 32 | callee`, 0 empty), calls, inclusive ticks.
pub const EDGE_WORDS: u64 = 3;

/// Words of a shadow-stack entry.
pub const ENTRY_WORDS: u64 = 16;

/// Shadow-stack entry words.
pub mod entry {
    /// Address of the return-address slot on the thread's stack.
    pub const SLOT: usize = 0;
    /// The real return address.
    pub const RET: usize = 1;
    /// Entry timestamp.
    pub const START: usize = 2;
    /// Inclusive time of completed callees.
    pub const CHILD: usize = 3;
    /// Function id.
    pub const FID: usize = 4;
    /// Counter values at entry (4 words).
    pub const CSTART: usize = 6;
    /// Counter deltas of completed callees (4 words).
    pub const CCHILD: usize = 10;
}

/// Limits a reader accepts (a writer never exceeds them).
pub const MAX_FUNCS: u64 = 1 << 20;
/// Largest caller → callee table.
pub const MAX_EDGES: u64 = 1 << 20;
/// Deepest shadow stack.
pub const MAX_DEPTH: u64 = 1 << 16;
/// Most slots.
pub const MAX_SLOTS: u64 = 1 << 14;
/// Most process records.
pub const MAX_PROCS: u64 = 1 << 12;
/// Largest segment (words): 64 GiB of address space, backed only where written.
pub const MAX_TOTAL_WORDS: u64 = 1 << 33;

/// Where everything is, from the header's five numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Functions.
    pub funcs: u64,
    /// Caller → callee slots per table.
    pub edges: u64,
    /// Shadow-stack entries per slot.
    pub depth: u64,
    /// Thread slots.
    pub slots: u64,
    /// Process records.
    pub procs: u64,
    /// Words per process record.
    pub proc_words: u64,
    /// Words per slot.
    pub slot_words: u64,
    /// Total words.
    pub total_words: u64,
}

impl Geometry {
    /// The geometry, or `None` when a number is out of the limits above.
    pub fn new(funcs: u64, edges: u64, depth: u64, slots: u64, procs: u64) -> Option<Geometry> {
        let ok = (1..=MAX_FUNCS).contains(&funcs)
            && (1..=MAX_EDGES).contains(&edges)
            && edges.is_power_of_two()
            && (1..=MAX_DEPTH).contains(&depth)
            && (1..=MAX_SLOTS).contains(&slots)
            && (1..=MAX_PROCS).contains(&procs);
        if !ok {
            return None;
        }
        let proc_words = PROC_HEADER_WORDS + funcs * STAT_WORDS + edges * EDGE_WORDS;
        let slot_words = SLOT_HEADER_WORDS + funcs * STAT_WORDS + edges * EDGE_WORDS + depth * ENTRY_WORDS;
        let total_words = HEADER_WORDS
            .checked_add(procs.checked_mul(proc_words)?)?
            .checked_add(slots.checked_mul(slot_words)?)?;
        (total_words <= MAX_TOTAL_WORDS).then_some(Geometry {
            funcs,
            edges,
            depth,
            slots,
            procs,
            proc_words,
            slot_words,
            total_words,
        })
    }

    /// Edge slots for `funcs` functions: four per function, 256 to 65,536.
    pub fn edges_for(funcs: u64) -> u64 {
        (funcs.saturating_mul(4)).clamp(256, 1 << 16).next_power_of_two()
    }

    /// First word of process record `i`.
    pub fn proc_at(&self, i: u64) -> u64 {
        HEADER_WORDS + i * self.proc_words
    }

    /// First word of slot `i`.
    pub fn slot_at(&self, i: u64) -> u64 {
        HEADER_WORDS + self.procs * self.proc_words + i * self.slot_words
    }

    /// Offset of the statistics rows within a slot or process record header's end.
    pub fn slot_stats(&self) -> u64 {
        SLOT_HEADER_WORDS
    }

    /// Offset of a slot's edge table.
    pub fn slot_edges(&self) -> u64 {
        SLOT_HEADER_WORDS + self.funcs * STAT_WORDS
    }

    /// Offset of a slot's shadow stack.
    pub fn slot_stack(&self) -> u64 {
        self.slot_edges() + self.edges * EDGE_WORDS
    }

    /// Offset of a process record's totals.
    pub fn proc_stats(&self) -> u64 {
        PROC_HEADER_WORDS
    }

    /// Offset of a process record's edge table.
    pub fn proc_edges(&self) -> u64 {
        PROC_HEADER_WORDS + self.funcs * STAT_WORDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_checks_limits_and_places_tables() {
        assert!(Geometry::new(0, 256, 16, 1, 1).is_none());
        assert!(Geometry::new(1, 255, 16, 1, 1).is_none());
        assert!(Geometry::new(MAX_FUNCS, MAX_EDGES, MAX_DEPTH, MAX_SLOTS, MAX_PROCS).is_none());
        let g = Geometry::new(10, 256, 16, 3, 2).unwrap();
        assert_eq!(g.slot_at(0), HEADER_WORDS + 2 * g.proc_words);
        assert_eq!(g.slot_at(3), g.total_words);
        assert_eq!(g.slot_stack() + 16 * ENTRY_WORDS, g.slot_words);
        assert_eq!(Geometry::edges_for(10), 256);
        assert_eq!(Geometry::edges_for(100_000), 1 << 16);
    }
}
