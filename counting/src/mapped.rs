//! Groups and counters with their pages mapped and each member's
//! [`ReadMethod`] decided: the set-up side of [`crate::read`].
//!
//! A member has a user-space method when the event counts the calling
//! thread ([`Target::ThisThread`], not inherited) and either it is a clock
//! ([`EventAttr::is_clock`]: task-clock, cpu-clock, read like the thread's
//! CPU time) or its page offers `cap_user_rdpmc` (a hardware counter).
//! rdpmc is never used for an event of another thread or a CPU: the counter
//! it reads belongs to whatever runs here.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use crate::arch;
use crate::attr::EventAttr;
use crate::count::Count;
use crate::error::{Error, Result};
use crate::event::{Counter, Target};
use crate::group::{Group, Member};
use crate::mmap::{Mapping, NativeCpu, page_size};
use crate::read::{GroupReader, ReadMethod, ReadPath, TscRate};
use crate::sys::{self, Errno, Sys};

/// Decides a member's method from its description, target and mapped page.
fn classify(
    attr: &EventAttr,
    target: Target,
    page: &std::result::Result<Mapping, Errno>,
    tsc: bool,
) -> ReadMethod {
    let none = |reason: String| ReadMethod::Syscall { reason };
    if target != Target::ThisThread {
        return none(format!(
            "{target:?} is not the calling thread: rdpmc and the page's times would describe another context"
        ));
    }
    if attr.is_inherited() {
        return none("inherited events also count children, which the page does not show".into());
    }
    let page = match page {
        Ok(p) => p,
        Err(e) => return none(format!("the event's page could not be mapped: {e}")),
    };
    let Some(r) = page.read(&NativeCpu, true) else {
        return none("the page's seqlock never settled".into());
    };
    if attr.is_clock() {
        if r.caps.user_time {
            ReadMethod::PageTime
        } else if tsc {
            ReadMethod::ReadPlusTsc
        } else {
            none("no cap_user_time and no usable TSC".into())
        }
    } else if r.caps.user_rdpmc {
        ReadMethod::Rdpmc
    } else {
        none(format!("`{}` has no user-space read here (the page offers no rdpmc)", attr.name()))
    }
}

/// Why a member can never be read from user space, whatever its page says:
/// software events other than the clocks, tracepoints and breakpoints are
/// never on a counter (their `index` is always 0), so their pages are not
/// worth mapping.
fn never_user_space(attr: &EventAttr) -> Option<String> {
    let kind = match crate::layout::Role::of(attr) {
        crate::layout::Role::Kernel if attr.kind() == crate::attr::Kind::Software => "a software event",
        crate::layout::Role::Kernel if attr.kind() == crate::attr::Kind::Tracepoint => "a tracepoint",
        crate::layout::Role::Breakpoint => "a breakpoint",
        _ => return None,
    };
    Some(format!("`{}` is {kind}, never on a counter: read(2) only", attr.name()))
}

thread_local! {
    /// This thread's id, cached: readers check it on every read.
    static TID: Cell<i32> = const { Cell::new(0) };
}

/// The calling thread's id (cached per thread).
pub fn current_tid() -> i32 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(sys::gettid());
        }
        t.get()
    })
}

impl GroupReader {
    /// Maps the page of every member of `group` through `sys`, on the
    /// thread that opened it, and decides each member's method. `attrs`
    /// describe the members in group order (leader first), as opened; a
    /// member without one, or a group on another target, is read by
    /// `read(2)`. No page is mapped when some member can never be read from
    /// user space (the group is read by `read(2)` anyway). `rate`: the TSC's,
    /// for clock members without `cap_user_time`.
    pub fn map(sys: &dyn Sys, group: &Group, attrs: &[EventAttr], rate: Option<TscRate>) -> GroupReader {
        let target = group.target();
        let hopeless = attrs.iter().find_map(never_user_space);
        let mapped: Vec<std::result::Result<Mapping, Errno>> = group
            .members()
            .map(|m| match (&hopeless, group.fd(&m)) {
                (None, Some(fd)) if target == Target::ThisThread => sys.mmap(fd, page_size()),
                _ => Err(Errno(libc::EBADF)),
            })
            .collect();
        let methods = mapped
            .iter()
            .enumerate()
            .map(|(i, p)| match attrs.get(i) {
                Some(a) => match (never_user_space(a), &hopeless) {
                    (Some(reason), _) => ReadMethod::Syscall { reason },
                    (None, Some(why)) => {
                        ReadMethod::Syscall { reason: format!("read(2) with its group: {why}") }
                    }
                    (None, None) => classify(a, target, p, rate.is_some()),
                },
                None => ReadMethod::Syscall { reason: "no description of this member".into() },
            })
            .collect();
        GroupReader::new(methods, mapped.into_iter().map(Result::ok).collect(), rate, current_tid())
    }

    /// No pages: every read of `group` is one `read(2)`, for `reason` (e.g.
    /// the leader's fd already carries a sampling ring).
    pub fn unmapped(group: &Group, reason: &str) -> GroupReader {
        let methods = group.members().map(|_| ReadMethod::Syscall { reason: reason.to_string() }).collect();
        GroupReader::new(methods, vec![], None, current_tid())
    }

    /// Reads every member of `group` (the group this reader was mapped for)
    /// into `out` (resized to the group, so it allocates only on first use),
    /// by user space when `enabled` (the caller enabled the group and has
    /// not disabled it since) and on the thread the reader was made on.
    #[inline]
    pub fn read_group(&self, group: &Group, enabled: bool, out: &mut Vec<Count>) -> Result<ReadPath> {
        out.resize(group.len(), Count::ZERO);
        let user_space = enabled && current_tid() == self.owner();
        self.read(user_space, arch::rdtsc(), out, |o| group.read_counts(o))
    }
}

/// A [`Counter`] with its page mapped, read from user space when exact.
/// Not `Send`: its user-space method is valid on the opening thread only.
#[derive(Debug)]
pub struct MappedCounter {
    counter: Counter,
    reader: GroupReader,
    enabled: Cell<bool>,
    _not_send: PhantomData<*const ()>,
}

impl MappedCounter {
    /// Opens `attr` on `target` through `sys` and maps its page. Starts
    /// disabled. `rate`: the TSC's (see [`GroupReader::map`]).
    pub fn open_with(
        sys: Arc<dyn Sys>,
        attr: &EventAttr,
        target: Target,
        rate: Option<TscRate>,
    ) -> Result<MappedCounter> {
        let counter = attr.open_with(sys.clone(), target)?;
        let page = sys.mmap(counter.as_fd(), page_size());
        let method = classify(attr, target, &page, rate.is_some());
        let reader = GroupReader::new(vec![method], vec![page.ok()], rate, current_tid());
        Ok(MappedCounter { counter, reader, enabled: Cell::new(false), _not_send: PhantomData })
    }

    /// The method reads take when the event is enabled.
    pub fn method(&self) -> &ReadMethod {
        &self.reader.methods()[0]
    }

    /// One `read(2)` of the counter, bypassing the user-space method (the
    /// baseline to compare it with).
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
        self.counter.reset()?;
        self.reader.forget_high();
        Ok(())
    }

    /// The value with its times, and the path that produced it.
    #[inline]
    pub fn read(&self) -> Result<(Count, ReadPath)> {
        let mut out = [Count::ZERO];
        let path = self.reader.read(self.enabled.get(), arch::rdtsc(), &mut out, |o| {
            o[0] = self.counter.read()?;
            Ok::<_, Error>(())
        })?;
        Ok((out[0], path))
    }
}

/// A [`Group`] with every member's page mapped, read from user space when
/// every member has an exact method. Not `Send`, like [`MappedCounter`].
#[derive(Debug)]
pub struct MappedGroup {
    group: Group,
    members: Vec<Member>,
    reader: GroupReader,
    enabled: Cell<bool>,
    _not_send: PhantomData<*const ()>,
}

impl MappedGroup {
    /// Opens `attrs` (the first is the leader) as a group on `target`
    /// through `sys` and maps each member's page. Starts disabled. An empty
    /// `attrs` is [`Error::Malformed`]: a group needs a leader.
    pub fn open_with(
        sys: Arc<dyn Sys>,
        attrs: &[EventAttr],
        target: Target,
        rate: Option<TscRate>,
    ) -> Result<MappedGroup> {
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
        let reader = GroupReader::map(&*sys, &group, attrs, rate);
        Ok(MappedGroup {
            members: group.members().collect(),
            group,
            reader,
            enabled: Cell::new(false),
            _not_send: PhantomData,
        })
    }

    /// Each member's method, in group order.
    pub fn methods(&self) -> &[ReadMethod] {
        self.reader.methods()
    }

    /// Whether enabled reads take the user-space path (every member has a method).
    pub fn user_space(&self) -> bool {
        self.reader.user_space()
    }

    /// The members, leader first (index `out` of [`read_into`](Self::read_into) with `member.index()`).
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// One `read(2)` of the group into `out` (indexed by `Member::index`),
    /// bypassing the user-space path: the baseline to compare it with.
    pub fn read_syscall(&self, out: &mut Vec<Count>) -> Result<()> {
        out.resize(self.group.len(), Count::ZERO);
        self.group.read_counts(out)
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

    /// Reads every member into `out` (indexed by `Member::index`; resized
    /// to the group, so it allocates only on first use) and says how.
    pub fn read_into(&self, out: &mut Vec<Count>) -> Result<ReadPath> {
        self.reader.read_group(&self.group, self.enabled.get(), out)
    }

    /// The group's leader descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Kind;
    use crate::attr::consts::{PERF_TYPE_RAW, PERF_TYPE_SOFTWARE};
    use crate::mmap::{Caps, PageImage};
    use crate::sys::mock::MockSys;

    const RATE: TscRate = TscRate { mult: 1, shift: 0, hz: 1e12 };

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
        let c = MappedCounter::open_with(k.clone(), attr, target, Some(RATE)).unwrap();
        k.steady_read(&[7, 9, 9, k.id_of(0)]);
        c
    }

    // An owner that moves between threads (an event set) can hold one.
    const _: () = {
        const fn send_sync<T: Send + Sync>() {}
        send_sync::<GroupReader>();
    };

    fn sw(name: &str, config: u64) -> EventAttr {
        EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, config)
    }

    #[test]
    fn hopeless_members_map_no_page() {
        let k = rdpmc_kernel();
        let (tc, pf) = (sw("task-clock", 1), sw("page-faults", 2));
        let mut g = Group::open_with(k.clone(), &tc, Target::ThisThread).unwrap();
        g.add(&pf).unwrap();
        let r = GroupReader::map(&*k, &g, &[tc.clone(), pf], Some(RATE));
        assert!(!r.user_space());
        assert!(
            matches!(&r.methods()[0], ReadMethod::Syscall { reason } if reason.contains("page-faults")),
            "{:?}",
            r.methods()
        );
        let off = GroupReader::unmapped(&g, "sampling");
        assert!(matches!(&off.methods()[1], ReadMethod::Syscall { reason } if reason == "sampling"));
        let alone = Group::open_with(k.clone(), &tc, Target::ThisThread).unwrap();
        let r = GroupReader::map(&*k, &alone, std::slice::from_ref(&tc), Some(RATE));
        assert_eq!(r.methods(), &[ReadMethod::ReadPlusTsc]);
        let r = GroupReader::map(&*k, &alone, std::slice::from_ref(&tc), None);
        assert!(!r.user_space(), "no TSC rate: read(2)");
    }

    #[test]
    fn an_empty_group_is_an_error_not_a_panic() {
        let r = MappedGroup::open_with(rdpmc_kernel(), &[], Target::ThisThread, None);
        assert!(matches!(r, Err(Error::Malformed { .. })), "{r:?}");
    }

    fn raw_event() -> EventAttr {
        EventAttr::new("r00c0", Kind::Hardware, PERF_TYPE_RAW, 0xc0)
    }

    #[test]
    fn rdpmc_needs_the_calling_thread_and_a_counter_index() {
        let k_other = rdpmc_kernel();
        let other = open_only(&k_other, &raw_event(), Target::Task(1));
        assert!(
            matches!(other.method(), ReadMethod::Syscall { reason } if reason.contains("not the calling thread"))
        );
        let mut inherited = raw_event();
        inherited.inherit(true);
        let inh = MappedCounter::open_with(rdpmc_kernel(), &inherited, Target::ThisThread, None).unwrap();
        assert!(matches!(inh.method(), ReadMethod::Syscall { .. }));

        let k = rdpmc_kernel();
        let c = open_only(&k, &raw_event(), Target::ThisThread);
        assert_eq!(c.method(), &ReadMethod::Rdpmc);
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

    #[test]
    fn a_clock_counter_reads_from_user_space_between_syncs() {
        let k = rdpmc_kernel();
        let c = open_only(&k, &sw("task-clock", 1), Target::ThisThread);
        assert_eq!(c.method(), &ReadMethod::ReadPlusTsc);
        c.enable().unwrap();
        assert_eq!(c.read().unwrap().1, ReadPath::Resync);
        assert_eq!(c.read().unwrap().1, ReadPath::UserSpace);
        assert_eq!(k.read_calls(), 1);
        // A page update (an enable, a context switch) resyncs.
        k.page(0).bump_lock(2);
        assert_eq!(c.read().unwrap().1, ReadPath::Resync);
        // A reset zeroes the value: what was returned before no longer holds it up.
        k.steady_read(&[0, 9, 9, k.id_of(0)]);
        c.reset().unwrap();
        k.page(0).bump_lock(2);
        assert_eq!(c.read().unwrap().0.raw, 0);
    }
}
