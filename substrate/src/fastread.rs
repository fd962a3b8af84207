//! Counter and group reads that skip `read(2)` wherever a user-space path
//! is exact, and say which path each read took ([`ReadPath`]).
//!
//! A member has a user-space path ([`UserPath`]) when the event counts the
//! calling thread (`Target::ThisThread`, not inherited) and either
//!
//! - it is `task-clock` or `cpu-clock`: its value grows 1:1 with the
//!   thread's running time, so it is read like virtual time
//!   ([`crate::vclock`]): the kernel's cap_user_time extrapolation, or the
//!   last `read(2)` plus the TSC time since, valid while the page's `lock`
//!   shows no context switch; or
//! - its page offers `cap_user_rdpmc` and it is on a counter (`index != 0`).
//!
//! rdpmc is never used for an event of another thread or a CPU: the
//! counter it reads belongs to whatever runs here. A read falls back to one
//! `read(2)` when any member lacks a user-space path at that moment (for a
//! group: so all values stay one consistent snapshot).

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::sync::Arc;

use perf_event_open_sys::bindings as b;
use serde::Serialize;

use crate::attr::EventAttr;
use crate::error::{Error, Result};
use crate::event::{Count, Counter, Target};
use crate::group::{Group, GroupCounts, Member};
use crate::mmap::{Mapping, NativeCpu, page_size};
use crate::sys::{self, Errno, Sys};
use crate::vclock::Hybrid;

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

/// The user-space path a member can take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum UserPath {
    /// task-clock/cpu-clock by the kernel's cap_user_time extrapolation.
    KernelTime,
    /// task-clock/cpu-clock by the last `read(2)` plus the TSC (page lock unchanged).
    Hybrid,
    /// The page's `offset` plus `rdpmc` when the page allows it at read time.
    Rdpmc,
    /// None: every read is a syscall.
    None {
        /// Why.
        reason: String,
    },
}

fn is_time_event(attr: &EventAttr) -> bool {
    attr.type_() == b::PERF_TYPE_SOFTWARE
        && (attr.config_value() == u64::from(b::PERF_COUNT_SW_TASK_CLOCK)
            || attr.config_value() == u64::from(b::PERF_COUNT_SW_CPU_CLOCK))
}

/// Decides a member's path from its description, target and mapped page.
fn classify(
    attr: &EventAttr,
    target: Target,
    page: &std::result::Result<Mapping, Errno>,
    hybrid_ok: bool,
) -> UserPath {
    let none = |reason: String| UserPath::None { reason };
    if target != Target::ThisThread {
        return none(format!(
            "{target:?} is not the calling thread: rdpmc and the page's times would describe another context"
        ));
    }
    if attr.inherit_value() {
        return none("inherited events also count children, which the page does not show".into());
    }
    let page = match page {
        Ok(p) => p,
        Err(e) => return none(format!("the event's page could not be mapped: {e}")),
    };
    let Some(r) = page.read(&NativeCpu, true) else {
        return none("the page's seqlock never settled".into());
    };
    if is_time_event(attr) {
        if r.caps.user_time {
            UserPath::KernelTime
        } else if hybrid_ok {
            UserPath::Hybrid
        } else {
            none("no cap_user_time and no usable TSC".into())
        }
    } else if r.caps.user_rdpmc {
        UserPath::Rdpmc
    } else {
        none(format!("`{}` has no user-space read here (the page offers no rdpmc)", attr.name()))
    }
}

fn map(sys: &dyn Sys, fd: std::os::fd::BorrowedFd<'_>) -> std::result::Result<Mapping, Errno> {
    sys.mmap(fd, page_size())
}

/// Reads one member from its page. `None`: no exact value right now.
fn page_value(path: &UserPath, page: &Mapping) -> Option<Count> {
    // Only these paths exist for events of the calling thread (`classify`),
    // so only they may let the reader execute rdpmc.
    if !matches!(path, UserPath::KernelTime | UserPath::Rdpmc) {
        return None;
    }
    let r = page.read(&NativeCpu, true)?;
    match path {
        UserPath::KernelTime => {
            let d = r.since_update?;
            // A software event's `offset` is its count at the last update;
            // a time event has run since, as has its running time.
            Some(Count {
                raw: (r.count as u64).wrapping_add(d),
                time_enabled: r.enabled,
                time_running: r.running.wrapping_add(d),
            })
        }
        UserPath::Rdpmc if r.pmc => {
            // Without cap_user_time the times are those of the last update;
            // they are only usable when the event was never multiplexed.
            if !r.caps.user_time && r.enabled != r.running {
                return None;
            }
            Some(Count { raw: r.count as u64, time_enabled: r.enabled, time_running: r.running })
        }
        _ => None,
    }
}

fn extrapolate(c: &Count, d: u64) -> Count {
    Count { raw: c.raw + d, time_enabled: c.time_enabled + d, time_running: c.time_running + d }
}

/// A [`Counter`] with its page mapped, read from user space when exact.
/// Not `Send`: its user-space path is valid on the opening thread only.
#[derive(Debug)]
pub struct MappedCounter {
    counter: Counter,
    page: Option<Mapping>,
    path: UserPath,
    hybrid: Option<Hybrid>,
    base: Cell<Count>,
    /// The last two syncs read the same value and enabled time: the event
    /// is stopped (disabled behind this handle's back, e.g. by prctl), so
    /// the value is not extrapolated until the page's lock moves again.
    frozen: Cell<bool>,
    enabled: Cell<bool>,
    _not_send: PhantomData<*const ()>,
}

impl MappedCounter {
    /// Opens `attr` on `target` in the real kernel and maps its page. Starts disabled.
    pub fn open(attr: &EventAttr, target: Target) -> Result<MappedCounter> {
        MappedCounter::open_with(sys::kernel(), attr, target)
    }

    /// Like [`open`](Self::open), through `sys`.
    pub fn open_with(sys: Arc<dyn Sys>, attr: &EventAttr, target: Target) -> Result<MappedCounter> {
        let counter = attr.open_with(sys.clone(), target)?;
        let page = map(&*sys, counter.as_fd());
        let hybrid = Hybrid::new();
        let path = classify(attr, target, &page, hybrid.is_some());
        Ok(MappedCounter {
            counter,
            page: page.ok(),
            hybrid: if path == UserPath::Hybrid { hybrid } else { None },
            path,
            base: Cell::new(Count::default()),
            frozen: Cell::new(false),
            enabled: Cell::new(false),
            _not_send: PhantomData,
        })
    }

    /// The path reads take when the event is enabled.
    pub fn path(&self) -> &UserPath {
        &self.path
    }

    /// One `read(2)` of the counter, bypassing the user-space path (the
    /// baseline to compare it with). The counter itself stays private so
    /// that its state changes go through this handle.
    pub fn read_syscall(&self) -> Result<Count> {
        self.counter.read()
    }

    /// Starts counting.
    pub fn enable(&self) -> Result<()> {
        self.counter.enable()?;
        self.enabled.set(true);
        Ok(())
    }

    /// Stops counting; reads become `read(2)` until enabled again.
    pub fn disable(&self) -> Result<()> {
        self.enabled.set(false);
        self.counter.disable()
    }

    /// Zeroes the value (the page's lock moves, so the next read resyncs).
    pub fn reset(&self) -> Result<()> {
        self.counter.reset()
    }

    /// The value with its times, and the path that produced it.
    #[inline]
    pub fn read(&self) -> Result<(Count, ReadPath)> {
        if self.enabled.get()
            && let Some(page) = &self.page
        {
            if let Some(h) = &self.hybrid {
                if let Some(d) = h.since_sync(page) {
                    let d = if self.frozen.get() { 0 } else { d };
                    return Ok((extrapolate(&self.base.get(), d), ReadPath::UserSpace));
                }
                let c = h.sync(page, || self.counter.read())?;
                let prev = self.base.replace(c);
                self.frozen.set(c.raw == prev.raw && c.time_enabled == prev.time_enabled);
                return Ok((c, ReadPath::Resync));
            }
            if let Some(c) = page_value(&self.path, page) {
                return Ok((c, ReadPath::UserSpace));
            }
        }
        Ok((self.counter.read()?, ReadPath::Syscall))
    }
}

thread_local! {
    /// This thread's id, cached: a read checks it on every call.
    static TID: Cell<i32> = const { Cell::new(0) };
}

fn current_tid() -> i32 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(crate::signal::gettid());
        }
        t.get()
    })
}

/// Whether a member can never have a user-space path, whatever its page
/// says: software events other than the clocks, tracepoints and
/// breakpoints are never on a counter (their `index` is always 0), so
/// their pages are not worth mapping.
fn never_user_space(attr: &EventAttr) -> Option<String> {
    let t = attr.type_();
    let kind = if t == b::PERF_TYPE_SOFTWARE && !is_time_event(attr) {
        "a software event"
    } else if t == b::PERF_TYPE_TRACEPOINT {
        "a tracepoint"
    } else if t == b::PERF_TYPE_BREAKPOINT {
        "a breakpoint"
    } else {
        return None;
    };
    Some(format!("`{}` is {kind}, never on a counter: read(2) only", attr.name()))
}

/// The user-space read state of one [`Group`], kept beside it rather than
/// owning it (as [`MappedGroup`] does): each member's mapped page, its
/// [`UserPath`], and the Hybrid base of the time events.
///
/// `Send`, so an owner that moves between threads can hold it: reads take
/// the user-space path only on the thread that built it (checked on every
/// read, a thread-local load), and only while the caller says the group is
/// enabled; otherwise they are one `read(2)`. Not `Sync` (its bases change
/// on `&self` reads).
#[derive(Debug)]
pub struct GroupPages {
    leader: u64,
    tid: i32,
    pages: Vec<Option<Mapping>>,
    paths: Vec<UserPath>,
    /// One timing base for all Hybrid members, keyed on the leader's page:
    /// the members run exactly when the group does.
    hybrid: Option<Hybrid>,
    bases: RefCell<Vec<Count>>,
    /// As [`MappedCounter`]'s: the group was stopped behind the owner's back.
    frozen: Cell<bool>,
    scratch: RefCell<GroupCounts>,
}

impl GroupPages {
    /// Maps the page of every member of `group` through `sys`, on the
    /// thread that opened it. `attrs` describe the members in group order
    /// (leader first), as opened; a member without an attr, or a group on
    /// another target, has no user-space path. Pages of members that can
    /// never be read from user space are not mapped, nor any page when
    /// some member is one of those (the group reads by `read(2)` anyway).
    pub fn map(sys: &dyn Sys, group: &Group, attrs: &[EventAttr]) -> GroupPages {
        let target = group.target();
        let hopeless = attrs.iter().find_map(never_user_space);
        let mapped: Vec<std::result::Result<Mapping, Errno>> = group
            .members()
            .map(|m| match (&hopeless, group.fd(&m)) {
                (None, Some(fd)) if target == Target::ThisThread => map(sys, fd),
                _ => Err(Errno(libc::EBADF)),
            })
            .collect();
        let tsc_ok = Hybrid::new().is_some();
        let path = |a: &EventAttr, p| {
            if let Some(reason) = never_user_space(a) {
                return UserPath::None { reason };
            }
            if let Some(why) = &hopeless {
                return UserPath::None { reason: format!("read(2) with its group: {why}") };
            }
            classify(a, target, p, tsc_ok)
        };
        let paths: Vec<UserPath> = mapped
            .iter()
            .enumerate()
            .map(|(i, p)| match attrs.get(i) {
                Some(a) => path(a, p),
                None => UserPath::None { reason: "no description of this member".into() },
            })
            .collect();
        GroupPages::assemble(group, mapped.into_iter().map(|p| p.ok()).collect(), paths)
    }

    /// No pages: every read is one `read(2)`, for `reason` (e.g. the
    /// leader's fd already carries a sampling ring).
    pub fn unmapped(group: &Group, reason: &str) -> GroupPages {
        let paths = group.members().map(|_| UserPath::None { reason: reason.to_string() }).collect();
        GroupPages::assemble(group, group.members().map(|_| None).collect(), paths)
    }

    fn assemble(group: &Group, pages: Vec<Option<Mapping>>, paths: Vec<UserPath>) -> GroupPages {
        let hybrid = paths.contains(&UserPath::Hybrid).then(Hybrid::new).flatten();
        GroupPages {
            leader: group.leader().id(),
            tid: current_tid(),
            bases: RefCell::new(vec![Count::default(); pages.len()]),
            pages,
            paths,
            hybrid,
            frozen: Cell::new(false),
            scratch: RefCell::new(GroupCounts::default()),
        }
    }

    /// Each member's path, in group order.
    pub fn paths(&self) -> &[UserPath] {
        &self.paths
    }

    /// Whether enabled reads take the user-space path (every member has one).
    pub fn user_space(&self) -> bool {
        !self.paths.iter().any(|p| matches!(p, UserPath::None { .. }))
    }

    fn syscall(&self, group: &Group, out: &mut [Count]) -> Result<()> {
        let mut counts = self.scratch.borrow_mut();
        group.read_into(&mut counts)?;
        for (slot, m) in out.iter_mut().zip(group.members()) {
            *slot = counts.get(&m).copied().unwrap_or_default();
        }
        Ok(())
    }

    /// One `read(2)` of `group` into `out` (indexed by `Member::index`),
    /// bypassing the user-space path.
    pub fn read_syscall(&self, group: &Group, out: &mut Vec<Count>) -> Result<()> {
        out.resize(group.len(), Count::default());
        self.syscall(group, out)
    }

    /// Reads every member of `group` (the group these pages were mapped
    /// for; any other is read by `read(2)`) into `out` (indexed by
    /// `Member::index`, resized to the group) and says how. `enabled`:
    /// the caller enabled the group and has not disabled it since; a
    /// disabled group is read by `read(2)`, as its pages are not updated.
    pub fn read_into(&self, group: &Group, enabled: bool, out: &mut Vec<Count>) -> Result<ReadPath> {
        out.resize(group.len(), Count::default());
        let out = out.as_mut_slice();
        if !enabled
            || !self.user_space()
            || group.leader().id() != self.leader
            || out.len() != self.pages.len()
            || current_tid() != self.tid
        {
            self.syscall(group, out)?;
            return Ok(ReadPath::Syscall);
        }
        let mut path = ReadPath::UserSpace;
        let mut since = None;
        if let (Some(h), Some(Some(leader))) = (&self.hybrid, self.pages.first()) {
            since = h.since_sync(leader);
            if since.is_none() {
                h.sync(leader, || self.syscall(group, out))?;
                let mut bases = self.bases.borrow_mut();
                let same = |(c, b): (&Count, &Count)| c.raw == b.raw && c.time_enabled == b.time_enabled;
                self.frozen.set(out.iter().zip(bases.iter()).all(same));
                bases.copy_from_slice(out);
                since = Some(0);
                path = ReadPath::Resync;
            } else if self.frozen.get() {
                since = Some(0);
            }
        }
        let bases = self.bases.borrow();
        for (i, (p, page)) in self.paths.iter().zip(&self.pages).enumerate() {
            let v = match (p, page) {
                (UserPath::Hybrid, _) => since.map(|d| extrapolate(&bases[i], d)),
                (_, Some(page)) => page_value(p, page),
                _ => None,
            };
            match v {
                Some(c) => out[i] = c,
                None => {
                    self.syscall(group, out)?;
                    return Ok(ReadPath::Syscall);
                }
            }
        }
        Ok(path)
    }
}

/// A [`Group`] with every member's page mapped, read from user space when
/// every member has an exact path. Not `Send`, like [`MappedCounter`].
#[derive(Debug)]
pub struct MappedGroup {
    group: Group,
    members: Vec<Member>,
    pages: GroupPages,
    enabled: Cell<bool>,
    _not_send: PhantomData<*const ()>,
}

impl MappedGroup {
    /// Opens `attrs` (the first is the leader) as a group on `target` in
    /// the real kernel and maps each member's page. Starts disabled.
    pub fn open(attrs: &[EventAttr], target: Target) -> Result<MappedGroup> {
        MappedGroup::open_with(sys::kernel(), attrs, target)
    }

    /// Like [`open`](Self::open), through `sys`. An empty `attrs` is
    /// [`Error::Malformed`]: a group needs a leader.
    pub fn open_with(sys: Arc<dyn Sys>, attrs: &[EventAttr], target: Target) -> Result<MappedGroup> {
        let Some((leader, rest)) = attrs.split_first() else {
            return Err(Error::Malformed {
                event: String::new(),
                reason: "a group needs at least one event".into(),
            });
        };
        let mut group = Group::open_with(sys.clone(), leader, target)?;
        for a in rest {
            group.add(a)?;
        }
        let pages = GroupPages::map(&*sys, &group, attrs);
        Ok(MappedGroup {
            members: group.members().collect(),
            group,
            pages,
            enabled: Cell::new(false),
            _not_send: PhantomData,
        })
    }

    /// Each member's path, in group order.
    pub fn paths(&self) -> &[UserPath] {
        self.pages.paths()
    }

    /// Whether enabled reads take the user-space path (every member has one).
    pub fn user_space(&self) -> bool {
        self.pages.user_space()
    }

    /// The members, leader first (index `out` of [`read_into`](Self::read_into) with `member.index()`).
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// One `read(2)` of the group into `out` (indexed by `Member::index`),
    /// bypassing the user-space path: the baseline to compare it with.
    pub fn read_syscall(&self, out: &mut Vec<Count>) -> Result<()> {
        self.pages.read_syscall(&self.group, out)
    }

    /// Starts every member.
    pub fn enable(&self) -> Result<()> {
        self.group.enable()?;
        self.enabled.set(true);
        Ok(())
    }

    /// Stops every member; reads become `read(2)` until enabled again.
    pub fn disable(&self) -> Result<()> {
        self.enabled.set(false);
        self.group.disable()
    }

    /// Zeroes every member.
    pub fn reset(&self) -> Result<()> {
        self.group.reset()
    }

    /// Reads every member into `out` (indexed by `Member::index`; resized
    /// to the group, so it allocates only on first use) and says how.
    pub fn read_into(&self, out: &mut Vec<Count>) -> Result<ReadPath> {
        self.pages.read_into(&self.group, self.enabled.get(), out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Kind;
    use crate::mmap::{Caps, PageImage};
    use crate::sys::mock::MockSys;

    /// A kernel with an rdpmc-capable page per opened event.
    fn rdpmc_kernel() -> Arc<MockSys> {
        let k = MockSys::new();
        k.map_pages(|| {
            let img = PageImage::new();
            img.set_caps(Caps { user_rdpmc: true, ..Caps::default() });
            img.set_pmc_width(48);
            img.set_index(0);
            img.set_offset(1000);
            img.set_times(500, 500);
            img.bump_lock(2);
            img
        });
        k
    }

    /// Opens `attr` as the only event of `k`, whose reads then always give
    /// value 7, enabled 9, running 9 (reads the user-space path must avoid).
    fn open_only(k: &Arc<MockSys>, attr: &EventAttr, target: Target) -> MappedCounter {
        let c = MappedCounter::open_with(k.clone(), attr, target).unwrap();
        k.steady_read(&[7, 9, 9, k.id_of(0)]);
        c
    }

    // An owner that moves between threads (an event set) can hold one.
    const _: () = {
        const fn send<T: Send>() {}
        send::<GroupPages>();
    };

    #[test]
    fn hopeless_members_map_no_page() {
        let k = rdpmc_kernel();
        let tc = EventAttr::new("task-clock", Kind::Software, b::PERF_TYPE_SOFTWARE, 1);
        let pf = EventAttr::new("page-faults", Kind::Software, b::PERF_TYPE_SOFTWARE, 2);
        let mut g = Group::open_with(k.clone(), &tc, Target::ThisThread).unwrap();
        g.add(&pf).unwrap();
        let pages = GroupPages::map(&*k, &g, &[tc.clone(), pf]);
        assert!(!pages.user_space());
        assert!(
            matches!(&pages.paths()[0], UserPath::None { reason } if reason.contains("page-faults")),
            "{:?}",
            pages.paths()
        );
        assert!(pages.pages.iter().all(Option::is_none), "no page mapped for a group read by read(2)");
        let off = GroupPages::unmapped(&g, "sampling");
        assert!(matches!(&off.paths()[1], UserPath::None { reason } if reason == "sampling"));
        let alone = Group::open_with(k.clone(), &tc, Target::ThisThread).unwrap();
        let pages = GroupPages::map(&*k, &alone, std::slice::from_ref(&tc));
        if Hybrid::new().is_some() {
            assert_eq!(pages.paths(), &[UserPath::Hybrid]);
        }
    }

    #[test]
    fn an_empty_group_is_an_error_not_a_panic() {
        let r = MappedGroup::open_with(rdpmc_kernel(), &[], Target::ThisThread);
        assert!(matches!(r, Err(Error::Malformed { .. })), "{r:?}");
    }

    #[test]
    fn a_stopped_time_event_is_not_extrapolated() {
        if Hybrid::new().is_none() {
            eprintln!("no usable TSC here: the hybrid path is not used");
            return;
        }
        // The fake read() always returns 7: an event stopped behind the
        // handle's back (prctl), seen through its unchanging value.
        let k = rdpmc_kernel();
        let tc = EventAttr::new("task-clock", Kind::Software, b::PERF_TYPE_SOFTWARE, 1);
        let c = open_only(&k, &tc, Target::ThisThread);
        assert_eq!(c.path(), &UserPath::Hybrid);
        c.enable().unwrap();
        assert_eq!(c.read().unwrap(), (Count { raw: 7, time_enabled: 9, time_running: 9 }, ReadPath::Resync));
        std::thread::sleep(crate::vclock::MAX_SYNC_INTERVAL * 2);
        // The interval forces a resync, which finds the same value: frozen.
        assert_eq!(c.read().unwrap().1, ReadPath::Resync);
        // Frozen: the value stays 7 whichever path the read takes. It is a
        // user-space read unless this thread was descheduled past the sync
        // interval in between (a loaded machine), which forces a resync.
        let since = std::time::Instant::now();
        let (v, path) = c.read().unwrap();
        assert_eq!(v.raw, 7, "a stopped event must not advance");
        if since.elapsed() < crate::vclock::MAX_SYNC_INTERVAL / 2 {
            assert_eq!(path, ReadPath::UserSpace);
        }
        // A page update (an enable, a context switch) resyncs.
        k.page(0).bump_lock(2);
        assert_eq!(c.read().unwrap().1, ReadPath::Resync);
    }

    fn raw_event() -> EventAttr {
        EventAttr::new("r00c0", Kind::Hardware, b::PERF_TYPE_RAW, 0xc0)
    }

    #[test]
    fn rdpmc_path_needs_the_calling_thread_and_a_counter_index() {
        let k_other = rdpmc_kernel();
        let other = open_only(&k_other, &raw_event(), Target::Task(1));
        assert!(
            matches!(other.path(), UserPath::None { reason } if reason.contains("not the calling thread"))
        );
        let mut inherited = raw_event();
        inherited.inherit(true);
        let inh = MappedCounter::open_with(rdpmc_kernel(), &inherited, Target::ThisThread).unwrap();
        assert!(matches!(inh.path(), UserPath::None { .. }));

        let k = rdpmc_kernel();
        let c = open_only(&k, &raw_event(), Target::ThisThread);
        assert_eq!(c.path(), &UserPath::Rdpmc);
        // Disabled: read(2).
        assert_eq!(
            c.read().unwrap(),
            (Count { raw: 7, time_enabled: 9, time_running: 9 }, ReadPath::Syscall)
        );
        c.enable().unwrap();
        // index 0 (not on a counter right now): read(2), never rdpmc.
        assert_eq!(c.read().unwrap().1, ReadPath::Syscall);
        // The `other` counter never ran rdpmc: it would have faulted here,
        // since this machine's CPU has not enabled user rdpmc.
        other.enable().unwrap();
        k_other.page(0).set_index(1);
        assert_eq!(other.read().unwrap().1, ReadPath::Syscall);
        assert_eq!(k.read_calls(), 2);
        assert_eq!(k_other.read_calls(), 1);
    }
}
