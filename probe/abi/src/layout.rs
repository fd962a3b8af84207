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
//! Pages are backed only where written: memory grows with the call paths and
//! trace records actually kept, not with the geometry.
//!
//! # Layout
//!
//! The segment is an array of little-endian 64-bit words; every position
//! below is a word index, every offset counts words from the segment's start
//! (or, for the `*_AT` words of a slot, bytes from the slot's start); nothing
//! in it is a pointer the tool follows. [`Geometry`] computes every position
//! from the header's [`Shape`], so a reader recomputes and checks them.
//!
//! ```text
//! header      HEADER_WORDS                     hdr::*
//! processes   procs × proc_words               proc::* header, tree (proc_nodes × NODE_WORDS), index (proc_index × INDEX_WORDS)
//! slots       slots × slot_words               slot::* header, stack (depth × ENTRY_WORDS), tree (nodes × NODE_WORDS),
//!                                              index (index × INDEX_WORDS), trace ring (ring × record_words)
//! ```
//!
//! A *slot* is one live thread's tables; a *process record* is one process
//! of the target's tree (the target, then each forked child) with the
//! call-path tree of its exited threads.
//!
//! # Call-path trees
//!
//! A tree is an array of [`node`]s: node 0 is the root (no function; its
//! [`node::LINK`] is [`ROOT_LINK`]), every other node one distinct path of
//! instrumented functions from the thread's first instrumented call, its
//! parent's index and its function in [`node::LINK`]. A node's parent always
//! has a smaller index (nodes are appended), so one pass in index order sees
//! parents first. Recursion keeps one node per level (the path `fib → fib →
//! fib` is three nodes), so no node is open twice at once and every node's
//! inclusive time is exact; flat per-function figures and caller → callee
//! pairs are sums over the tree (a function's inclusive time counting only
//! nodes without an ancestor of the same function). A tree holds at most its
//! geometry's nodes: a call on a new path beyond them is left out of the
//! tree with everything it calls, each of those calls counted in
//! [`slot::NODE_OVERFLOW`] (their time stays in the caller's exclusive time,
//! as an uninstrumented call's would). Calls made inside frames a forked
//! child inherited start the child's own paths at its root.
//!
//! The *index* beside a tree maps (parent, function) to the node, open
//! addressing with linear probing (at most [`INDEX_PROBES`] places): the
//! entry hook looks a child up there only when the parent's
//! [`node::CACHE`] (the last child it found) is another function.
//!
//! # Trace rings
//!
//! With tracing on ([`Shape::ring`] > 0), each slot holds a ring of
//! [`Shape::record_words`]-word records ([`record`]), one per traced call
//! written when it closes, plus a [`record::THREAD`] record each time a
//! thread takes the slot. [`slot::TRACE_HEAD`] counts records ever written;
//! record `i` lives at position `i mod ring`. The ring overwrites: the
//! thread never waits for the tool, and the tool counts what it lost.
//!
//! # Ordering
//!
//! - A slot is written only by its thread. Each hook makes the slot's
//!   [`slot::SEQ`] odd (Relaxed store, then a Release fence), writes figures
//!   with Relaxed loads and stores, and makes it even again with a Release
//!   store. A reader loads `SEQ` with Acquire, copies, issues an Acquire
//!   fence and loads `SEQ` again: equal and even means a consistent copy.
//!   On x86-64 all of this compiles to plain moves. A reader that keeps
//!   losing the race takes the copy anyway: each word is whole (never
//!   undefined), the figures may mix two moments (the report says `torn`).
//! - A trace record's words are stored (Relaxed) inside a hook, after that
//!   hook's Release fence, then published by a Release store of
//!   [`slot::TRACE_HEAD`]. A drainer loads the head with Acquire, copies the
//!   records from its last position (at most `ring` back), issues an Acquire
//!   fence and loads the head again as `h2`: the writer may have begun to
//!   overwrite every record `i ≤ h2 − ring` (the fence pairs with the
//!   writer's, so any word it copied from a newer record shows in `h2`), so
//!   those are discarded and counted lost; the rest are whole.
//! - [`slot::STATE`] goes 0 → 1 by compare-exchange (Acquire) when a thread
//!   claims the slot and 1 → 0 with a Release store after its tree was
//!   folded into its process record's tree at thread exit. The ring and
//!   [`slot::TRACE_GEN`] are not reset: the next thread goes on writing
//!   after the last record, under the next generation.
//! - [`slot::OUTSIDE`] is stored (Relaxed, fenced against the compiler)
//!   by the slot's thread just before and after a hook's call out of the
//!   runtime; the tool reads it only while that thread is stopped, so it
//!   sees the thread's last store.
//! - A process record's tree is written under [`proc::LOCK`] (a
//!   compare-exchange spin lock taken on thread exit only) and bracketed by
//!   [`proc::SEQ`] like a slot.
//! - A thread's exit moves figures from its slot to the process' tree: a
//!   reader sampling during that move may count them twice or not at all; a
//!   reader of a stopped or ended target never does.
//! - The header is written by set-up before the segment is published to the
//!   target's threads; afterwards only the words documented as counters
//!   change (atomic adds).

/// `PAPIRSEG`, little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PAPIRSEG");
/// Layout version; a reader refuses any other.
pub const VERSION: u64 = 3;
/// Header size.
pub const HEADER_WORDS: u64 = 32;
/// Counter events at most.
pub const MAX_EVENTS: usize = 4;

/// Header words (written by set-up; the counters among them by any thread).
pub mod hdr {
    /// [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// [`super::VERSION`].
    pub const VERSION: usize = 1;
    /// Functions (ids `0..FUNCS`).
    pub const FUNCS: usize = 2;
    /// Call-path tree nodes per slot.
    pub const NODES: usize = 3;
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
    /// Process records claimed so far (counter).
    pub const NEXT_PROC: usize = 9;
    /// Threads that found no free slot (their calls run unmeasured; counter).
    pub const SLOT_MISSES: usize = 10;
    /// Forked children that found no free process record (not measured; counter).
    pub const PROC_MISSES: usize = 11;
    /// The probe: 0 empty, 1 wallclock, 2 counters.
    pub const PROBE: usize = 12;
    /// Counter events read.
    pub const NEVENTS: usize = 13;
    /// Call-path tree nodes per process record.
    pub const PROC_NODES: usize = 14;
    /// The exit stub's address in the target (hijacked return addresses hold it).
    pub const EXIT_STUB: usize = 15;
    /// Threads that ended so far (numbers [`super::slot::ENDED`]; counter).
    pub const ENDED: usize = 16;
    /// Records per slot's trace ring (a power of two), 0 without tracing.
    pub const RING: usize = 17;
    /// Words per trace record: 3 + 2 × the counter events a record carries.
    pub const RECORD_WORDS: usize = 18;
    /// Calls shorter than this many ticks are not traced.
    pub const TRACE_MIN_TICKS: usize = 19;
    /// Calls this deep or deeper (0: the outermost) are not traced.
    pub const TRACE_DEPTH: usize = 20;
    /// Functions traced: ids below this (the tool numbers traced functions first).
    pub const TRACE_FUNCS: usize = 21;
    /// Slots ever claimed: a thread claims the lowest free slot, so none at
    /// or above this was ever written, and readers stop here rather than
    /// touch (and so allocate) the pages of the rest (counter, a maximum).
    pub const SLOTS_USED: usize = 22;
}

/// Words of a slot header.
pub const SLOT_HEADER_WORDS: u64 = 32;

/// Slot header words (written by the slot's thread unless said otherwise).
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
    /// Calls past the shadow-stack bound: not timed, not in the tree.
    pub const UNTIMED: usize = 6;
    /// Calls left out of the tree: on a new path beyond its nodes, or made
    /// from such a call.
    pub const NODE_OVERFLOW: usize = 7;
    /// Counter values of the current hook.
    pub const CNOW: usize = 8;
    /// Counter events this thread reads.
    pub const NEVENTS: usize = 12;
    /// Errno of the counter group this thread could not open (0: none).
    pub const COUNTERS_ERRNO: usize = 13;
    /// For a [`KEPT`] slot, the order its thread ended in (1, 2, …).
    pub const ENDED: usize = 14;
    /// Nodes of the tree in use, the root included (≥ 1 once claimed).
    pub const NODES_USED: usize = 15;
    /// Trace records ever written to this slot's ring (Release store).
    pub const TRACE_HEAD: usize = 16;
    /// Generation of the slot's current thread in its trace records (bumped
    /// at each claim, never reset).
    pub const TRACE_GEN: usize = 17;
    /// 1 while a hook of this thread runs code outside the runtime (the
    /// counters reader opening its groups at the thread's registration, in
    /// libc; its reads issue their own `syscall`) and will write the slot again when that returns: its PC may
    /// lie in libc meanwhile. Written by the owner (Relaxed; the tool reads
    /// it with the thread stopped); the tool ends a session only while it is
    /// 0 in every live slot, as it waits for [`super::proc::COLD`].
    pub const OUTSIDE: usize = 18;
    /// First word of the runtime's private words (addresses in the target
    /// that only the runtime uses; the tool never reads them).
    pub const PRIVATE: usize = 20;
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
    /// Threads whose figures were folded into the tree.
    pub const EXITED_THREADS: usize = 4;
    /// Spin lock of the tree.
    pub const LOCK: usize = 5;
    /// Threads that ever took a slot.
    pub const THREADS: usize = 6;
    /// Exited threads' [`super::slot::REENTERED`], summed.
    pub const REENTERED: usize = 7;
    /// Exited threads' [`super::slot::UNTIMED`], summed.
    pub const UNTIMED: usize = 8;
    /// Exited threads' [`super::slot::NODE_OVERFLOW`], summed, plus calls of
    /// their nodes that found no place in this tree.
    pub const NODE_OVERFLOW: usize = 9;
    /// Threads of this process inside a cold path of the runtime that calls
    /// out of it (thread registration, thread exit, the fork handler) and
    /// touches the segment again after the call: such a thread's PC may lie
    /// in libc while its return address leads back into the runtime. The
    /// tool ends the session only while it is 0 and no PC is in the runtime.
    pub const COLD: usize = 10;
    /// Nodes of the tree in use, the root included.
    pub const NODES_USED: usize = 11;
}

/// Words of a process record header.
pub const PROC_HEADER_WORDS: u64 = 16;

/// Words of a call-path tree node.
pub const NODE_WORDS: u64 = 16;

/// [`node::LINK`] of a tree's root.
pub const ROOT_LINK: u64 = u64::MAX;

/// No node (a call left out of the tree), as a node index.
pub const NO_NODE: u64 = u32::MAX as u64;

/// Node words (ticks for times).
pub mod node {
    /// `parent << 32 | function`; [`super::ROOT_LINK`] for the root.
    pub const LINK: usize = 0;
    /// The runtime's lookup cache: `(function + 1) << 32 | child`, the
    /// child this node found last (0: none). Readers ignore it.
    pub const CACHE: usize = 1;
    /// Entries.
    pub const CALLS: usize = 2;
    /// Activations closed without returning (longjmp, exception, thread exit).
    pub const UNWOUND: usize = 3;
    /// Inclusive time of closed activations.
    pub const INCL: usize = 4;
    /// Exclusive time: inclusive minus the node's children.
    pub const EXCL: usize = 5;
    /// Shortest activation (`u64::MAX` until one closes).
    pub const MIN: usize = 6;
    /// Longest activation.
    pub const MAX: usize = 7;
    /// Inclusive counter deltas (4 words).
    pub const CINCL: usize = 8;
    /// Exclusive counter deltas (4 words).
    pub const CEXCL: usize = 12;
}

/// Words of an index entry: [`INDEX_KEY`]`, node.
pub const INDEX_WORDS: u64 = 2;

/// An index entry's key: `(parent + 1) << 32 | function` (0: empty).
pub const INDEX_KEY: usize = 0;

/// Places an index lookup probes before the node counts as overflow.
pub const INDEX_PROBES: u64 = 16;

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
    /// Inclusive time of completed callees in the tree.
    pub const CHILD: usize = 3;
    /// Function id (`u64::MAX`: a frame a forked child inherited).
    pub const FID: usize = 4;
    /// Tree node ([`super::NO_NODE`]: left out of the tree; 0, the root,
    /// for a frame a forked child inherited).
    pub const NODE: usize = 5;
    /// Counter values at entry (4 words).
    pub const CSTART: usize = 6;
    /// Counter deltas of completed callees (4 words).
    pub const CCHILD: usize = 10;
}

/// Trace record words: one closed call, or a thread taking the slot.
pub mod record {
    /// Entry timestamp ([`THREAD`]: when the thread took the slot).
    pub const START: usize = 0;
    /// Exit timestamp ([`THREAD`]: `pid << 32 | tid`).
    pub const END: usize = 1;
    /// `gen << 50 | kind << 48 | depth << 32 | function`; depth is the
    /// call's shadow-stack depth (0: outermost), saturated at 65,535; gen is
    /// [`super::slot::TRACE_GEN`] modulo 2^14.
    pub const INFO: usize = 2;
    /// Counter values at entry, then at exit (`record_words − 3` words).
    pub const COUNTERS: usize = 3;
    /// Kind: the call returned.
    pub const RETURNED: u64 = 0;
    /// Kind: the call was closed without returning (longjmp, exception, thread exit).
    pub const UNWOUND: u64 = 1;
    /// Kind: a thread took the slot.
    pub const THREAD: u64 = 2;
    /// Bits of the generation field.
    pub const GEN_BITS: u32 = 14;
}

/// Limits a reader accepts (a writer never exceeds them).
pub const MAX_FUNCS: u64 = 1 << 20;
/// Largest tree.
pub const MAX_NODES: u64 = 1 << 24;
/// Deepest shadow stack.
pub const MAX_DEPTH: u64 = 1 << 16;
/// Most slots.
pub const MAX_SLOTS: u64 = 1 << 14;
/// Most process records.
pub const MAX_PROCS: u64 = 1 << 12;
/// Largest trace ring (records).
pub const MAX_RING: u64 = 1 << 26;
/// Largest segment (words): 512 GiB of address space, backed only where written.
pub const MAX_TOTAL_WORDS: u64 = 1 << 36;

/// What a session's segment holds: the numbers set-up writes into the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Functions.
    pub funcs: u64,
    /// Tree nodes per slot.
    pub nodes: u64,
    /// Tree nodes per process record.
    pub proc_nodes: u64,
    /// Shadow-stack entries per slot.
    pub depth: u64,
    /// Thread slots.
    pub slots: u64,
    /// Process records.
    pub procs: u64,
    /// Trace records per slot (a power of two), 0 without tracing.
    pub ring: u64,
    /// Words per trace record (3 + 2 × events; 3 without tracing).
    pub record_words: u64,
}

impl Shape {
    /// The header words ([`hdr`]) that hold the shape, with their values.
    pub fn header(&self) -> [(usize, u64); 8] {
        [
            (hdr::FUNCS, self.funcs),
            (hdr::NODES, self.nodes),
            (hdr::PROC_NODES, self.proc_nodes),
            (hdr::DEPTH, self.depth),
            (hdr::SLOTS, self.slots),
            (hdr::PROCS, self.procs),
            (hdr::RING, self.ring),
            (hdr::RECORD_WORDS, self.record_words),
        ]
    }

    /// The shape a header holds, `word(i)` giving header word `i`.
    pub fn from_header(word: impl Fn(usize) -> u64) -> Shape {
        Shape {
            funcs: word(hdr::FUNCS),
            nodes: word(hdr::NODES),
            proc_nodes: word(hdr::PROC_NODES),
            depth: word(hdr::DEPTH),
            slots: word(hdr::SLOTS),
            procs: word(hdr::PROCS),
            ring: word(hdr::RING),
            record_words: word(hdr::RECORD_WORDS),
        }
    }
}

/// Where everything is, from a [`Shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// The numbers it was computed from.
    pub shape: Shape,
    /// Index entries beside a slot's tree (a power of two, twice the nodes or more).
    pub index: u64,
    /// Index entries beside a process record's tree.
    pub proc_index: u64,
    /// Words per process record.
    pub proc_words: u64,
    /// Words per slot.
    pub slot_words: u64,
    /// Total words.
    pub total_words: u64,
}

impl Geometry {
    /// The geometry, or `None` when a number is out of the limits above.
    pub fn new(s: Shape) -> Option<Geometry> {
        let ok = (1..=MAX_FUNCS).contains(&s.funcs)
            && (2..=MAX_NODES).contains(&s.nodes)
            && (2..=MAX_NODES).contains(&s.proc_nodes)
            && (1..=MAX_DEPTH).contains(&s.depth)
            && (1..=MAX_SLOTS).contains(&s.slots)
            && (1..=MAX_PROCS).contains(&s.procs)
            && s.ring <= MAX_RING
            && (s.ring == 0 || s.ring.is_power_of_two())
            && (3..=3 + 2 * MAX_EVENTS as u64).contains(&s.record_words);
        if !ok {
            return None;
        }
        let index = Self::index_for(s.nodes);
        let proc_index = Self::index_for(s.proc_nodes);
        let proc_words = PROC_HEADER_WORDS + s.proc_nodes * NODE_WORDS + proc_index * INDEX_WORDS;
        // Rings round up to whole 8-word blocks, so every slot starts on a 64-byte boundary.
        let ring_words = (s.ring * s.record_words).next_multiple_of(8);
        let slot_words = SLOT_HEADER_WORDS
            + s.depth * ENTRY_WORDS
            + s.nodes * NODE_WORDS
            + index * INDEX_WORDS
            + ring_words;
        let total_words = HEADER_WORDS
            .checked_add(s.procs.checked_mul(proc_words)?)?
            .checked_add(s.slots.checked_mul(slot_words)?)?;
        (total_words <= MAX_TOTAL_WORDS).then_some(Geometry {
            shape: s,
            index,
            proc_index,
            proc_words,
            slot_words,
            total_words,
        })
    }

    /// Index entries for a tree of `nodes`: at least twice as many, a power of two.
    pub fn index_for(nodes: u64) -> u64 {
        nodes.saturating_mul(2).next_power_of_two()
    }

    /// First word of process record `i`.
    pub fn proc_at(&self, i: u64) -> u64 {
        HEADER_WORDS + i * self.proc_words
    }

    /// First word of slot `i`.
    pub fn slot_at(&self, i: u64) -> u64 {
        HEADER_WORDS + self.shape.procs * self.proc_words + i * self.slot_words
    }

    /// Offset of a slot's shadow stack.
    pub fn slot_stack(&self) -> u64 {
        SLOT_HEADER_WORDS
    }

    /// Offset of a slot's tree.
    pub fn slot_nodes(&self) -> u64 {
        self.slot_stack() + self.shape.depth * ENTRY_WORDS
    }

    /// Offset of a slot's index.
    pub fn slot_index(&self) -> u64 {
        self.slot_nodes() + self.shape.nodes * NODE_WORDS
    }

    /// Offset of a slot's trace ring.
    pub fn slot_ring(&self) -> u64 {
        self.slot_index() + self.index * INDEX_WORDS
    }

    /// Offset of a process record's tree.
    pub fn proc_nodes(&self) -> u64 {
        PROC_HEADER_WORDS
    }

    /// Offset of a process record's index.
    pub fn proc_index(&self) -> u64 {
        PROC_HEADER_WORDS + self.shape.proc_nodes * NODE_WORDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            funcs: 10,
            nodes: 64,
            proc_nodes: 256,
            depth: 16,
            slots: 3,
            procs: 2,
            ring: 0,
            record_words: 3,
        }
    }

    #[test]
    fn geometry_checks_limits_and_places_tables() {
        assert!(Geometry::new(Shape { funcs: 0, ..shape() }).is_none());
        assert!(Geometry::new(Shape { nodes: 1, ..shape() }).is_none());
        assert!(Geometry::new(Shape { ring: 100, ..shape() }).is_none());
        assert!(Geometry::new(Shape { record_words: 12, ..shape() }).is_none());
        let big = Shape {
            funcs: MAX_FUNCS,
            nodes: MAX_NODES,
            proc_nodes: MAX_NODES,
            depth: MAX_DEPTH,
            slots: MAX_SLOTS,
            procs: MAX_PROCS,
            ring: MAX_RING,
            record_words: 11,
        };
        assert!(Geometry::new(big).is_none());
        let g = Geometry::new(shape()).unwrap();
        assert_eq!(g.index, 128);
        assert_eq!(g.slot_at(0), HEADER_WORDS + 2 * g.proc_words);
        assert_eq!(g.slot_at(3), g.total_words);
        assert_eq!(g.slot_ring(), g.slot_words);
        assert_eq!(g.proc_index() + g.proc_index * INDEX_WORDS, g.proc_words);
        let traced = Geometry::new(Shape { ring: 1024, record_words: 5, ..shape() }).unwrap();
        assert_eq!(traced.slot_words, g.slot_words + 1024 * 5);
        // Every slot starts on a 64-byte boundary.
        let odd = Geometry::new(Shape { ring: 1, record_words: 5, ..shape() }).unwrap();
        assert_eq!(odd.slot_at(1) % 8, 0);
    }
}
