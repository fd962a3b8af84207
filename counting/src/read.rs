//! Reading a perf group by its fastest exact path: the one implementation
//! behind event sets, regions and the probe runtime's counters probe.
//!
//! Each member of a group is read by a [`ReadMethod`], decided once when
//! its page is mapped ([`crate::mapped`]):
//!
//! - [`ReadMethod::PageTime`]: task-clock or cpu-clock of the calling
//!   thread on a page with `cap_user_time`: the page's value plus the TSC
//!   time since the kernel wrote it, the documented extrapolation;
//! - [`ReadMethod::ReadPlusTsc`]: task-clock or cpu-clock without
//!   `cap_user_time` (KVM guests whose sched clock is kvm-clock): the value
//!   of the last `read(2)` plus the TSC time since, valid while the page's
//!   `lock` shows no context switch of the thread ([`TscSinceRead`]);
//! - [`ReadMethod::Rdpmc`]: an event on a hardware counter of the calling
//!   thread whose page offers `cap_user_rdpmc`: the seqlock, `offset` plus
//!   `rdpmc`;
//! - [`ReadMethod::Syscall`]: anything else (software counters, tracepoints,
//!   breakpoints, other threads, inherited events): `read(2)`.
//!
//! A group is read from user space only when every member has a user-space
//! method at that moment; otherwise by one `read(2)` of the whole group, so
//! its values stay one snapshot ([`GroupReader::read`]). That system call
//! is the caller's ([`GroupReader::read`] takes it as a closure): the
//! substrate issues it through its `Sys` seam, the probe runtime with a
//! `syscall` instruction of its own, tests with scripted buffers.
//!
//! # The hot path
//!
//! [`GroupReader::read`], [`decode_group`] and [`Count::since`] allocate
//! nothing, format nothing, use no floating point and call no library: the
//! probe runtime calls them from hooks that save only general registers
//! (its tests disassemble them). Their state is kept in atomics (Relaxed:
//! one thread reads a reader; atomics keep the compiler from merging the
//! words into vector moves).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::arch;
use crate::count::Count;
use crate::mmap::{Mapping, NativeCpu, mul_shift};

/// The TSC's rate, as ticks-to-nanoseconds conversion: `ns = (ticks ×
/// mult) >> shift`. Measured by the substrate's clock (or shipped to the
/// probe runtime by the tool), never by this crate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TscRate {
    /// The multiplier.
    pub mult: u64,
    /// The shift.
    pub shift: u32,
    /// Ticks per second.
    pub hz: f64,
}

/// How one member of a group is read (see the [module documentation](self)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum ReadMethod {
    /// The page's value and times extrapolated with the kernel's
    /// cap_user_time conversion.
    PageTime,
    /// The last `read(2)` plus the TSC time since, while the page's lock
    /// holds.
    ReadPlusTsc,
    /// The page's `offset` plus `rdpmc`.
    Rdpmc,
    /// `read(2)` on every read.
    Syscall {
        /// Why no user-space method exists.
        reason: String,
    },
}

impl ReadMethod {
    /// Whether this is a user-space method.
    pub fn user_space(&self) -> bool {
        !matches!(self, ReadMethod::Syscall { .. })
    }
}

/// How one read obtained its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPath {
    /// From mmap pages, rdpmc and the TSC: no system call.
    UserSpace,
    /// From user space after one `read(2)` that resynchronised the base
    /// (first read, after a context switch, or after the interval bound).
    Resync,
    /// One `read(2)`: no exact user-space path for some member right now.
    Syscall,
}

impl ReadPath {
    /// The path of a read made of two: the slower one.
    pub fn and(self, other: ReadPath) -> ReadPath {
        match (self, other) {
            (ReadPath::Syscall, _) | (_, ReadPath::Syscall) => ReadPath::Syscall,
            (ReadPath::Resync, _) | (_, ReadPath::Resync) => ReadPath::Resync,
            _ => ReadPath::UserSpace,
        }
    }
}

/// The longest a [`TscSinceRead`] extrapolates from one `read(2)`: bounds
/// the error from host steal time, which the TSC counts and the kernel
/// does not.
pub const MAX_SYNC_INTERVAL: Duration = Duration::from_micros(200);
/// The longest TSC bracket around a sync's system call accepted as a base:
/// a longer one held a VM exit or an interrupt, and its midpoint could be
/// that far off. Longer brackets are retried.
pub const MAX_SYNC_BRACKET: Duration = Duration::from_micros(4);
/// The stated bound on a [`TscSinceRead`] value's error against its source
/// (steal time inside one sync interval plus half the largest bracket).
pub const ERROR_BOUND: Duration = Duration::from_micros(200 + 2);
const _: () =
    assert!(ERROR_BOUND.as_nanos() == MAX_SYNC_INTERVAL.as_nanos() + MAX_SYNC_BRACKET.as_nanos() / 2);
/// Sync attempts before a value is taken without a base (the page moving
/// during every attempt means the thread is being switched constantly).
const SYNC_ATTEMPTS: usize = 4;

/// A lock value no page shows between updates: the first read syncs.
const NO_SEQ: u32 = 1;

/// The state of [`ReadMethod::ReadPlusTsc`]: the TSC at the last sync and
/// the page `lock` it held under. The kernel rewrites a per-thread event's
/// page (its `lock` moves) at every context switch of the thread and on
/// enable, disable and reset, but not on `read(2)`; while the lock is
/// unchanged the thread has run without interruption since the sync, so
/// its clocks advanced exactly by the TSC time.
#[derive(Debug)]
pub struct TscSinceRead {
    tsc: AtomicU64,
    seq: AtomicU32,
    mult: u64,
    shift: u32,
    max_ticks: u64,
    max_bracket: u64,
    syncs: AtomicU64,
}

impl TscSinceRead {
    /// A state for a TSC of `rate`; the first read syncs.
    pub fn new(rate: TscRate) -> TscSinceRead {
        TscSinceRead {
            tsc: AtomicU64::new(0),
            seq: AtomicU32::new(NO_SEQ),
            mult: rate.mult,
            shift: rate.shift,
            max_ticks: (MAX_SYNC_INTERVAL.as_secs_f64() * rate.hz) as u64,
            max_bracket: (MAX_SYNC_BRACKET.as_secs_f64() * rate.hz) as u64,
            syncs: AtomicU64::new(0),
        }
    }

    /// Nanoseconds from the last sync to TSC value `now`, if the page's lock
    /// is unchanged since and the interval bound holds. `now` must have been
    /// read before this call (program order): a context switch after the
    /// sync and before the lock is loaded here has moved the lock.
    #[inline(always)]
    pub fn since_sync(&self, page: &Mapping, now: u64) -> Option<u64> {
        let seq = page.lock();
        let d = now.wrapping_sub(self.tsc.load(Ordering::Relaxed));
        (seq == self.seq.load(Ordering::Relaxed) && d < self.max_ticks)
            .then(|| mul_shift(d, self.mult, self.shift))
    }

    /// Runs `sync` between two reads of the page's lock and the TSC until
    /// the lock holds still across it (at most a few times), and keeps the
    /// TSC midpoint as the new base. Returns `sync`'s value; if the lock
    /// never held still, no base is kept and the next read syncs again.
    /// (Inlined: the probe runtime's hooks must call nothing through the
    /// GOT, and a call out of the crate would go through it.)
    #[inline(always)]
    pub fn sync<T, E>(&self, page: &Mapping, mut sync: impl FnMut() -> Result<T, E>) -> Result<T, E> {
        self.syncs.store(self.syncs.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let s0 = page.lock();
            let t0 = arch::rdtsc_ordered();
            let value = sync()?;
            let t1 = arch::rdtsc_ordered();
            let stable = page.lock() == s0 && s0 & 1 == 0 && t1.wrapping_sub(t0) <= self.max_bracket;
            if stable || attempt == SYNC_ATTEMPTS {
                self.tsc.store(t0.wrapping_add(t1.wrapping_sub(t0) / 2), Ordering::Relaxed);
                self.seq.store(if stable { s0 } else { NO_SEQ }, Ordering::Relaxed);
                return Ok(value);
            }
        }
    }

    /// How many syncs (system calls) there were.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

/// A [`Count`] in atomics: a base or a high-water mark of a member.
#[derive(Debug, Default)]
struct Slot {
    raw: AtomicU64,
    enabled: AtomicU64,
    running: AtomicU64,
}

impl Slot {
    #[inline(always)]
    fn set(&self, c: &Count) {
        self.raw.store(c.raw, Ordering::Relaxed);
        self.enabled.store(c.time_enabled, Ordering::Relaxed);
        self.running.store(c.time_running, Ordering::Relaxed);
    }

    /// The base plus `d` nanoseconds of running.
    #[inline(always)]
    fn plus(&self, d: u64) -> Count {
        Count {
            raw: self.raw.load(Ordering::Relaxed).wrapping_add(d),
            time_enabled: self.enabled.load(Ordering::Relaxed).wrapping_add(d),
            time_running: self.running.load(Ordering::Relaxed).wrapping_add(d),
        }
    }
}

/// The user-space read state of one perf group: each member's method and
/// mapped page, the [`TscSinceRead`] base of its clock members (one, keyed
/// on the leader's page: the members run exactly when the group does), and
/// each member's highest value returned (reads never go down).
///
/// `Send` and `Sync`; user-space methods are valid only on the thread the
/// reader was made for ([`owner`](Self::owner)), which the caller checks.
#[derive(Debug)]
pub struct GroupReader {
    methods: Vec<ReadMethod>,
    pages: Vec<Option<Mapping>>,
    user_space: bool,
    owner: i32,
    tsc: Option<TscSinceRead>,
    bases: Vec<Slot>,
    high: Vec<AtomicU64>,
    /// The last two syncs read the same value and enabled time: the group
    /// is stopped (disabled behind its owner's back, e.g. by prctl), so it
    /// is not extrapolated until the page's lock moves again.
    frozen: AtomicBool,
}

impl GroupReader {
    /// A reader of members read by `methods`, with their `pages` (same
    /// order, leader first), for thread `owner`. A [`ReadMethod::ReadPlusTsc`]
    /// member without a TSC `rate`, or without the leader's page, is read by
    /// `read(2)`.
    pub fn new(
        mut methods: Vec<ReadMethod>,
        mut pages: Vec<Option<Mapping>>,
        rate: Option<TscRate>,
        owner: i32,
    ) -> GroupReader {
        pages.resize_with(methods.len(), || None);
        let tsc_ok = rate.is_some() && pages.first().is_some_and(Option::is_some);
        for m in &mut methods {
            if *m == ReadMethod::ReadPlusTsc && !tsc_ok {
                *m = ReadMethod::Syscall { reason: "no usable TSC or no page to watch".into() };
            }
        }
        let tsc = rate.filter(|_| methods.contains(&ReadMethod::ReadPlusTsc)).map(TscSinceRead::new);
        GroupReader {
            user_space: methods.iter().all(ReadMethod::user_space),
            bases: methods.iter().map(|_| Slot::default()).collect(),
            high: methods.iter().map(|_| AtomicU64::new(0)).collect(),
            methods,
            pages,
            owner,
            tsc,
            frozen: AtomicBool::new(false),
        }
    }

    /// Each member's method, in group order.
    pub fn methods(&self) -> &[ReadMethod] {
        &self.methods
    }

    /// Whether reads can take the user-space path (every member has a method).
    pub fn user_space(&self) -> bool {
        self.user_space
    }

    /// The thread whose reads may take the user-space path.
    pub fn owner(&self) -> i32 {
        self.owner
    }

    /// The syncs of the clock members' base so far (0 without one).
    pub fn syncs(&self) -> u64 {
        self.tsc.as_ref().map_or(0, TscSinceRead::syncs)
    }

    /// Forgets the highest values returned: after a reset of the counters
    /// (`PERF_EVENT_IOC_RESET`) values legitimately go down, and a caller
    /// that wants the kernel's own values from now on asks for them.
    pub fn forget_high(&self) {
        for h in &self.high {
            h.store(0, Ordering::Relaxed);
        }
    }

    /// Reads every member into `out` (group order; a length other than the
    /// group's is read by `syscall` alone) and says how. `user_space`: the
    /// caller enabled the group, has not disabled it since, and runs on the
    /// [`owner`](Self::owner) thread; otherwise the values come from
    /// `syscall`, which fills `out` with one `read(2)` of the group. `now`
    /// is the TSC, read by the caller just before (the probe runtime shares
    /// its timestamp). Values are held at the highest returned before, so
    /// a value extrapolated a little ahead of the kernel's is never taken
    /// back, until [`forget_high`](Self::forget_high).
    #[inline(always)]
    pub fn read<E>(
        &self,
        user_space: bool,
        now: u64,
        out: &mut [Count],
        mut syscall: impl FnMut(&mut [Count]) -> Result<(), E>,
    ) -> Result<ReadPath, E> {
        if !user_space || !self.user_space || out.len() != self.methods.len() {
            syscall(out)?;
            self.hold_high(out);
            return Ok(ReadPath::Syscall);
        }
        let mut path = ReadPath::UserSpace;
        let mut since = 0;
        if let (Some(t), Some(Some(leader))) = (&self.tsc, self.pages.first()) {
            match t.since_sync(leader, now) {
                Some(d) if !self.frozen.load(Ordering::Relaxed) => since = d,
                Some(_) => {}
                None => {
                    self.resync(t, leader, out, &mut syscall)?;
                    path = ReadPath::Resync;
                }
            }
        }
        let members = self.methods.iter().zip(&self.pages).zip(&self.bases);
        for (((m, page), base), o) in members.zip(out.iter_mut()) {
            let v = match (m, page) {
                (ReadMethod::ReadPlusTsc, _) => Some(base.plus(since)),
                (ReadMethod::PageTime, Some(p)) => page_time(p),
                (ReadMethod::Rdpmc, Some(p)) => page_rdpmc(p),
                _ => None,
            };
            match v {
                Some(c) => o.store(c),
                None => {
                    syscall(out)?;
                    path = ReadPath::Syscall;
                    break;
                }
            }
        }
        self.hold_high(out);
        Ok(path)
    }

    /// One `read(2)` (by `syscall`) under the TSC bracket; the values become
    /// the clock members' base.
    #[inline(always)]
    fn resync<E>(
        &self,
        t: &TscSinceRead,
        leader: &Mapping,
        out: &mut [Count],
        syscall: &mut impl FnMut(&mut [Count]) -> Result<(), E>,
    ) -> Result<(), E> {
        t.sync(leader, || syscall(out))?;
        let mut same = true;
        for (c, b) in out.iter().zip(&self.bases) {
            same &=
                c.raw == b.raw.load(Ordering::Relaxed) && c.time_enabled == b.enabled.load(Ordering::Relaxed);
            b.set(c);
        }
        self.frozen.store(same, Ordering::Relaxed);
        Ok(())
    }

    #[inline(always)]
    fn hold_high(&self, out: &mut [Count]) {
        for (c, h) in out.iter_mut().zip(&self.high) {
            let high = h.load(Ordering::Relaxed);
            if c.raw < high {
                c.raw = high;
            } else {
                h.store(c.raw, Ordering::Relaxed);
            }
        }
    }
}

/// A clock member's value from a cap_user_time page: its `offset` is the
/// count at the last update, and it has run since, as has its running time.
#[inline(always)]
fn page_time(page: &Mapping) -> Option<Count> {
    let r = page.read(&NativeCpu, true)?;
    let d = r.since_update?;
    Some(Count {
        raw: (r.count as u64).wrapping_add(d),
        time_enabled: r.enabled,
        time_running: r.running.wrapping_add(d),
    })
}

/// A counter's value by rdpmc. Without cap_user_time the times are those of
/// the last update, usable only when the event was never multiplexed.
#[inline(always)]
fn page_rdpmc(page: &Mapping) -> Option<Count> {
    let r = page.read(&NativeCpu, true)?;
    if !r.pmc || (!r.caps.user_time && r.enabled != r.running) {
        return None;
    }
    Some(Count { raw: r.count as u64, time_enabled: r.enabled, time_running: r.running })
}

/// Why a group read buffer was refused ([`decode_group`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadGroupRead {
    /// Fewer words than the header and every member need.
    Short {
        /// Words read.
        got: usize,
        /// Words needed.
        need: usize,
    },
    /// The kernel reports another number of members.
    Members {
        /// The number it reports.
        nr: u64,
    },
    /// Value `index` is for an event id that is not in the group.
    Foreign {
        /// The value's position in the buffer.
        index: usize,
        /// Its event id.
        id: u64,
    },
    /// An event id appears twice.
    Twice {
        /// The id.
        id: u64,
    },
}

/// Words of a group read (`PERF_FORMAT_GROUP | ID | TOTAL_TIME_ENABLED |
/// TOTAL_TIME_RUNNING`) of `members` events: `nr, time_enabled,
/// time_running`, then `value, id` per member.
#[inline]
pub const fn group_words(members: usize) -> usize {
    3 + 2 * members
}

/// Decodes a group read of `words` into `out`, matching each value to its
/// member by the kernel's event id (`ids`, group order), never by position.
#[inline]
pub fn decode_group(words: &[u64], ids: &[u64], out: &mut [Count]) -> Result<(), BadGroupRead> {
    let members = ids.len();
    let need = group_words(members);
    let (Some(&nr), Some(&enabled), Some(&running)) = (words.first(), words.get(1), words.get(2)) else {
        return Err(BadGroupRead::Short { got: words.len(), need });
    };
    if nr != members as u64 {
        return Err(BadGroupRead::Members { nr });
    }
    let pairs = words.get(3..need).ok_or(BadGroupRead::Short { got: words.len(), need })?;
    for o in out.iter_mut() {
        o.store(Count { raw: 0, time_enabled: enabled, time_running: running });
    }
    for (index, pair) in pairs.chunks_exact(2).enumerate() {
        let (value, id) = (pair[0], pair[1]);
        let Some(at) = ids.iter().position(|&m| m == id) else {
            return Err(BadGroupRead::Foreign { index, id });
        };
        if pairs.chunks_exact(2).take(index).any(|p| p[1] == id) {
            return Err(BadGroupRead::Twice { id });
        }
        if let Some(o) = out.get_mut(at) {
            o.raw = value;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmap::{Caps, PageImage};
    use std::sync::Arc;

    fn rate() -> TscRate {
        // 1 ns per tick in the conversion; a rate so high that the real
        // TSC never exceeds the interval or bracket bounds in a test.
        TscRate { mult: 1, shift: 0, hz: 1e12 }
    }

    /// A reader of one clock member extrapolated from `read(2)` on `img`.
    fn clock_reader(img: &Arc<PageImage>) -> GroupReader {
        GroupReader::new(
            vec![ReadMethod::ReadPlusTsc],
            vec![Some(Mapping::from_image(img.clone()))],
            Some(rate()),
            0,
        )
    }

    /// A scripted `read(2)` of a group: each call returns the next counts.
    struct Kernel {
        reads: Vec<Vec<Count>>,
        calls: usize,
    }

    impl Kernel {
        fn new(reads: Vec<Vec<Count>>) -> Kernel {
            Kernel { reads, calls: 0 }
        }
        fn read(&mut self, out: &mut [Count]) -> Result<(), &'static str> {
            let r = self.reads.get(self.calls).ok_or("no more reads")?;
            out.copy_from_slice(r);
            self.calls += 1;
            Ok(())
        }
    }

    fn c(raw: u64, e: u64, r: u64) -> Count {
        Count { raw, time_enabled: e, time_running: r }
    }

    fn page() -> Arc<PageImage> {
        let p = PageImage::new();
        p.bump_lock(2);
        p
    }

    #[test]
    fn clock_members_extrapolate_from_one_read_while_the_lock_holds() {
        let img = page();
        let r = GroupReader::new(
            vec![ReadMethod::ReadPlusTsc, ReadMethod::ReadPlusTsc],
            vec![Some(Mapping::from_image(img.clone())), None],
            Some(rate()),
            0,
        );
        let mut k = Kernel::new(vec![vec![c(100, 100, 100), c(50, 100, 100)], vec![c(500, 500, 500); 2]]);
        let mut out = [Count::ZERO; 2];
        // The first read syncs: the kernel's values. The TSC base is the
        // midpoint of the bracket around the read, so ask from its end.
        let now = arch::rdtsc();
        assert_eq!(r.read(true, now, &mut out, |o| k.read(o)), Ok(ReadPath::Resync));
        assert_eq!(out, [c(100, 100, 100), c(50, 100, 100)]);
        // The lock holds: the base plus the TSC time, no read.
        let later = r.tsc.as_ref().unwrap().tsc.load(Ordering::Relaxed) + 40;
        assert_eq!(r.read(true, later, &mut out, |o| k.read(o)), Ok(ReadPath::UserSpace));
        assert_eq!(out, [c(140, 140, 140), c(90, 140, 140)]);
        assert_eq!(k.calls, 1);
        // A context switch moved the lock: one read again.
        img.bump_lock(2);
        assert_eq!(r.read(true, later, &mut out, |o| k.read(o)), Ok(ReadPath::Resync));
        assert_eq!(out[0], c(500, 500, 500));
        assert_eq!(r.syncs(), 2);
    }

    #[test]
    fn values_never_go_down_and_a_syscall_fallback_is_whole() {
        let img = page();
        let r = clock_reader(&img);
        let mut k =
            Kernel::new(vec![vec![c(1000, 1000, 1000)], vec![c(990, 1010, 1010)], vec![c(980, 1, 1)]]);
        let mut out = [Count::ZERO];
        r.read(true, arch::rdtsc(), &mut out, |o| k.read(o)).unwrap();
        let base = r.tsc.as_ref().unwrap().tsc.load(Ordering::Relaxed);
        r.read(true, base + 30, &mut out, |o| k.read(o)).unwrap();
        assert_eq!(out[0].raw, 1030, "extrapolated ahead of the kernel's next value");
        img.bump_lock(2);
        r.read(true, base, &mut out, |o| k.read(o)).unwrap();
        assert_eq!(out[0].raw, 1030, "held at the highest returned");
        // By read(2) (disabled, another thread): still held.
        r.read(false, base, &mut out, |o| k.read(o)).unwrap();
        assert_eq!(out[0].raw, 1030);
        // Until the caller forgets what it was given: the kernel's own value.
        r.forget_high();
        k.calls -= 1;
        r.read(false, base, &mut out, |o| k.read(o)).unwrap();
        assert_eq!(out[0], c(980, 1, 1));
        // A reader whose member cannot be read from user space reads the group whole.
        let mixed = GroupReader::new(
            vec![ReadMethod::ReadPlusTsc, ReadMethod::Syscall { reason: "page-faults".into() }],
            vec![Some(Mapping::from_image(page())), None],
            Some(rate()),
            0,
        );
        assert!(!mixed.user_space());
        let mut k = Kernel::new(vec![vec![c(1, 1, 1), c(2, 1, 1)]]);
        let mut two = [Count::ZERO; 2];
        assert_eq!(mixed.read(true, 0, &mut two, |o| k.read(o)), Ok(ReadPath::Syscall));
        assert_eq!(two, [c(1, 1, 1), c(2, 1, 1)]);
    }

    #[test]
    fn without_a_tsc_clock_members_are_read_by_syscall() {
        let r =
            GroupReader::new(vec![ReadMethod::ReadPlusTsc], vec![Some(Mapping::from_image(page()))], None, 0);
        assert!(matches!(&r.methods()[0], ReadMethod::Syscall { reason } if reason.contains("TSC")));
    }

    #[test]
    fn a_stopped_group_is_not_extrapolated() {
        let img = page();
        let r = clock_reader(&img);
        let mut k = Kernel::new(vec![vec![c(7, 9, 9)]; 3]);
        let mut out = [Count::ZERO];
        r.read(true, arch::rdtsc(), &mut out, |o| k.read(o)).unwrap();
        img.bump_lock(2);
        r.read(true, arch::rdtsc(), &mut out, |o| k.read(o)).unwrap();
        // Two syncs found the same value and enabled time: frozen.
        let base = r.tsc.as_ref().unwrap().tsc.load(Ordering::Relaxed);
        assert_eq!(r.read(true, base + 100, &mut out, |o| k.read(o)), Ok(ReadPath::UserSpace));
        assert_eq!(out[0], c(7, 9, 9));
    }

    #[test]
    fn page_methods_read_the_page() {
        // ~0 ns since the page's update.
        let img = PageImage::user_time_now(5_000, 4_000);
        img.set_offset(3_000);
        img.bump_lock(2);
        let r = GroupReader::new(vec![ReadMethod::PageTime], vec![Some(Mapping::from_image(img))], None, 0);
        let mut out = [Count::ZERO];
        let never = |_: &mut [Count]| -> Result<(), ()> { Err(()) };
        assert_eq!(r.read(true, 0, &mut out, never), Ok(ReadPath::UserSpace));
        let d = out[0].raw - 3_000;
        assert!(d < 1_000_000_000, "{out:?}");
        assert_eq!(out[0].time_running, 4_000 + d);
        // An rdpmc member whose page has no counter index right now: read(2).
        let img = PageImage::new();
        img.set_caps(Caps { user_rdpmc: true, ..Caps::default() });
        img.bump_lock(2);
        let r = GroupReader::new(vec![ReadMethod::Rdpmc], vec![Some(Mapping::from_image(img))], None, 0);
        let mut k = Kernel::new(vec![vec![c(11, 1, 1)]]);
        assert_eq!(r.read(true, 0, &mut out, |o| k.read(o)), Ok(ReadPath::Syscall));
        assert_eq!(out[0].raw, 11);
    }

    #[test]
    fn group_reads_decode_by_id() {
        let ids = [1000, 1137, 1274];
        let mut out = [Count::ZERO; 3];
        decode_group(&[3, 900, 300, 7, 1274, 5, 1000, 2, 1137], &ids, &mut out).unwrap();
        assert_eq!(out, [c(5, 900, 300), c(2, 900, 300), c(7, 900, 300)]);
        assert_eq!(
            decode_group(&[3, 1, 1, 7, 1274], &ids, &mut out),
            Err(BadGroupRead::Short { got: 5, need: 9 })
        );
        assert_eq!(decode_group(&[3, 1], &ids, &mut out), Err(BadGroupRead::Short { got: 2, need: 9 }));
        assert_eq!(
            decode_group(&[2, 1, 1, 7, 1274, 5, 1000], &ids, &mut out),
            Err(BadGroupRead::Members { nr: 2 })
        );
        assert_eq!(
            decode_group(&[3, 1, 1, 7, 1274, 5, 42, 2, 1137], &ids, &mut out),
            Err(BadGroupRead::Foreign { index: 1, id: 42 })
        );
        assert_eq!(
            decode_group(&[3, 1, 1, 7, 1274, 5, 1274, 2, 1137], &ids, &mut out),
            Err(BadGroupRead::Twice { id: 1274 })
        );
        assert_eq!(
            decode_group(&[u64::MAX, 0, 0], &ids, &mut out),
            Err(BadGroupRead::Members { nr: u64::MAX })
        );
    }
}
