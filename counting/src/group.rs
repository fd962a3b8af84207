//! Event groups: a leader and members scheduled onto the PMU together and
//! read atomically in one `read(2)`.
//!
//! Every member is opened with `read_format = GROUP | ID |
//! TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING`, so a read of the leader returns
//! all values with the kernel id of each. Values are matched to members by
//! that id, never by their position in the buffer.
//!
//! # Caveats
//!
//! When a group mixes PMUs, lead it with the non-software event. Measured
//! on kernel 6.18 here: with task-clock leading and `msr/tsc/` as a member,
//! the member read about 6 % low in two of three 50 ms runs (122.3 M TSC
//! ticks against 129.9 M for the same event opened alone), while with
//! `msr/tsc/` leading both members agreed with their solo values.

use std::ops::Index;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use perf_event_open_sys::bindings as b;

use crate::attr::{EventAttr, Kind};
use crate::error::{Error, Op, Result};
use crate::event::{Count, SamplingAttr, Target, open_fd};
use crate::read::{BadGroupRead, decode_group, group_words};
use crate::sys::{self, Errno, Ioctl, Sys};

const GROUP_FORMAT: u64 = (b::PERF_FORMAT_GROUP
    | b::PERF_FORMAT_ID
    | b::PERF_FORMAT_TOTAL_TIME_ENABLED
    | b::PERF_FORMAT_TOTAL_TIME_RUNNING) as u64;

/// The handle of one member of a [`Group`], returned by [`Group::add`] and
/// [`Group::leader`]; index a [`GroupCounts`] with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    index: usize,
    id: u64,
}

impl Member {
    /// The kernel id of the member's event.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The member's position in the group, the leader being 0.
    pub fn index(&self) -> usize {
        self.index
    }
}

#[derive(Debug)]
struct Slot {
    fd: OwnedFd,
    id: u64,
    name: String,
}

/// A group of events on one target, enabled, disabled, reset and read as
/// one. Descriptors close on drop.
#[derive(Debug)]
pub struct Group {
    sys: Arc<dyn Sys>,
    target: Target,
    hardware: bool,
    slots: Vec<Slot>,
    /// The members' kernel ids, in group order (what a read is decoded against).
    ids: Vec<u64>,
}

impl Group {
    /// Opens `leader` on `target` as a new group in the real kernel. The
    /// group starts disabled: add members, then [`Group::enable`].
    pub fn open(leader: &EventAttr, target: Target) -> Result<Group> {
        Group::open_with(sys::kernel(), leader, target)
    }

    /// Like [`Group::open`], through `sys`.
    pub fn open_with(sys: Arc<dyn Sys>, leader: &EventAttr, target: Target) -> Result<Group> {
        Group::open_leader(sys, leader, target, None)
    }

    /// Like [`Group::open_with`], with a leader that also samples as
    /// `sampling` says. Its count reads with the group as any member's;
    /// map its ring with [`RingBuffer::map`](crate::ring::RingBuffer::map)
    /// on [`Group::fd`] (`sampling`'s data pages and layout).
    pub fn open_sampling_with(
        sys: Arc<dyn Sys>,
        leader: &EventAttr,
        sampling: &dyn SamplingAttr,
        target: Target,
    ) -> Result<Group> {
        Group::open_leader(sys, leader, target, Some(sampling))
    }

    fn open_leader(
        sys: Arc<dyn Sys>,
        leader: &EventAttr,
        target: Target,
        sampling: Option<&dyn SamplingAttr>,
    ) -> Result<Group> {
        let (fd, id) = open_fd(&*sys, leader, target, None, GROUP_FORMAT, sampling)?;
        Ok(Group {
            sys,
            target,
            hardware: leader.kind() == Kind::Hardware,
            slots: vec![Slot { fd, id, name: leader.name().to_string() }],
            ids: vec![id],
        })
    }

    /// Opens `attr` as a member on the group's target. It counts from the
    /// next [`Group::enable`] (a member added to a running group stays
    /// disabled until then).
    pub fn add(&mut self, attr: &EventAttr) -> Result<Member> {
        self.add_member(attr, None)
    }

    /// Like [`Group::add`], with a member that also samples (see
    /// [`Group::open_sampling_with`]).
    pub fn add_sampling(&mut self, attr: &EventAttr, sampling: &dyn SamplingAttr) -> Result<Member> {
        self.add_member(attr, Some(sampling))
    }

    fn add_member(&mut self, attr: &EventAttr, sampling: Option<&dyn SamplingAttr>) -> Result<Member> {
        let leader = self.slots[0].fd.as_fd();
        let (fd, id) = open_fd(&*self.sys, attr, self.target, Some(leader), GROUP_FORMAT, sampling)?;
        self.hardware |= attr.kind() == Kind::Hardware;
        self.slots.push(Slot { fd, id, name: attr.name().to_string() });
        self.ids.push(id);
        Ok(Member { index: self.slots.len() - 1, id })
    }

    /// The leader's handle.
    pub fn leader(&self) -> Member {
        Member { index: 0, id: self.slots[0].id }
    }

    /// Every member's handle, the leader first.
    pub fn members(&self) -> impl Iterator<Item = Member> + '_ {
        self.slots.iter().enumerate().map(|(index, s)| Member { index, id: s.id })
    }

    /// The number of events, leader included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always false: a group has at least its leader.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The name of a member, if it belongs to this group.
    pub fn name(&self, member: &Member) -> Option<&str> {
        self.slot(member).map(|s| s.name.as_str())
    }

    /// A member's descriptor, e.g. to mmap its user page.
    pub fn fd(&self, member: &Member) -> Option<BorrowedFd<'_>> {
        self.slot(member).map(|s| s.fd.as_fd())
    }

    /// What the group counts on.
    pub fn target(&self) -> Target {
        self.target
    }

    fn slot(&self, m: &Member) -> Option<&Slot> {
        self.slots.get(m.index).filter(|s| s.id == m.id)
    }

    fn fail(&self, op: Op, errno: Errno) -> Error {
        Error::from_errno(op, &self.slots[0].name, errno, self.hardware, self.target.pid_cpu().0)
    }

    fn ioctl(&self, op: Op, ioctl: Ioctl) -> Result<()> {
        self.sys.ioctl(self.slots[0].fd.as_fd(), ioctl).map_err(|e| self.fail(op, e))
    }

    /// Starts every member. Only the leader is switched: members are opened
    /// enabled and count exactly while it does. Switching members with
    /// `PERF_IOC_FLAG_GROUP` instead leaves them counting nothing behind a
    /// task-clock leader until the thread is next scheduled in (measured on
    /// 6.18, see the `group_members_count_behind_any_leader` kernel test).
    pub fn enable(&self) -> Result<()> {
        self.ioctl(Op::Enable, Ioctl::Enable { group: false })
    }

    /// Stops every member (the leader, as for [`Group::enable`]); values are kept.
    pub fn disable(&self) -> Result<()> {
        self.ioctl(Op::Disable, Ioctl::Disable { group: false })
    }

    /// Zeroes every member's value.
    pub fn reset(&self) -> Result<()> {
        self.ioctl(Op::Reset, Ioctl::Reset { group: true })
    }

    /// Reads all members atomically in one `read(2)`.
    pub fn read(&self) -> Result<GroupCounts> {
        let mut counts = GroupCounts::default();
        self.read_into(&mut counts)?;
        Ok(counts)
    }

    /// Like [`Group::read`], reusing `counts`' buffers (no allocation once
    /// they have the group's size).
    pub fn read_into(&self, counts: &mut GroupCounts) -> Result<()> {
        let n = self.slots.len();
        counts.ids.clone_from(&self.ids);
        counts.counts.resize(n, Count::ZERO);
        counts.words.resize(group_words(n), 0);
        self.read_words(&mut counts.words, &mut counts.counts)?;
        let first = counts.counts.first().copied().unwrap_or_default();
        (counts.time_enabled, counts.time_running) = (first.time_enabled, first.time_running);
        Ok(())
    }

    /// One `read(2)` of every member into `out`, in group order: the
    /// system call of a [`GroupReader`](crate::read::GroupReader) over this
    /// group. Allocates nothing for groups of up to 16 members.
    pub fn read_counts(&self, out: &mut [Count]) -> Result<()> {
        const SMALL: usize = 16;
        let n = self.slots.len();
        let mut small = [0u64; group_words(SMALL)];
        let mut big = Vec::new();
        let words = if n <= SMALL {
            &mut small[..group_words(n)]
        } else {
            big.resize(group_words(n), 0);
            &mut big[..]
        };
        self.read_words(words, out)
    }

    /// Reads the group into `words` (its exact size) and decodes it into
    /// `out` (one per member).
    fn read_words(&self, words: &mut [u64], out: &mut [Count]) -> Result<()> {
        let leader = &self.slots[0];
        let got = self.sys.read_words(leader.fd.as_fd(), words).map_err(|e| self.fail(Op::Read, e))?;
        if got == 0 {
            return Err(Error::InErrorState { event: leader.name.clone() });
        }
        let ids = &self.ids;
        let words = &words[..(got / 8).min(words.len())];
        let event = &leader.name;
        decode_group(words, ids, out).map_err(|bad| match bad {
            BadGroupRead::Short { need, .. } => {
                Error::ShortRead { op: Op::Read, event: event.clone(), got, expected: need * 8 }
            }
            BadGroupRead::Members { nr } => {
                kernel_data(event, format!("{nr} values for a group of {} events", ids.len()))
            }
            BadGroupRead::Foreign { index, id } => {
                kernel_data(event, format!("value {index} is for event id {id}, which is not in the group"))
            }
            BadGroupRead::Twice { id } => kernel_data(event, format!("event id {id} appears twice")),
        })
    }
}

fn kernel_data(event: &str, reason: String) -> Error {
    Error::KernelData { op: Op::Read, event: event.to_string(), reason }
}

impl AsFd for Group {
    /// The leader's descriptor.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.slots[0].fd.as_fd()
    }
}

/// The values of one group read, indexed by [`Member`]:
/// `counts[&member]` (panics for a member of another group; use
/// [`GroupCounts::get`] to avoid that).
#[derive(Clone, Debug, Default)]
pub struct GroupCounts {
    time_enabled: u64,
    time_running: u64,
    /// Member ids in group order, and their counts in the same order.
    ids: Vec<u64>,
    counts: Vec<Count>,
    words: Vec<u64>,
}

impl GroupCounts {
    /// The value of `member`, or `None` if it is not in this read.
    pub fn get(&self, member: &Member) -> Option<&Count> {
        let at = if self.ids.get(member.index) == Some(&member.id) {
            member.index
        } else {
            self.ids.iter().position(|&id| id == member.id)?
        };
        self.counts.get(at)
    }

    /// Nanoseconds the group was enabled (shared by all members).
    pub fn time_enabled(&self) -> u64 {
        self.time_enabled
    }

    /// Nanoseconds the group was on the PMU (shared by all members).
    pub fn time_running(&self) -> u64 {
        self.time_running
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was read yet.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Every member with its value, in group order.
    pub fn iter(&self) -> impl Iterator<Item = (Member, &Count)> {
        self.ids.iter().zip(&self.counts).enumerate().map(|(index, (&id, c))| (Member { index, id }, c))
    }
}

impl Index<&Member> for GroupCounts {
    type Output = Count;

    /// # Panics
    ///
    /// If `member` belongs to another group.
    fn index(&self, member: &Member) -> &Count {
        match self.get(member) {
            Some(c) => c,
            None => panic!("event id {} is not a member of the group this was read from", member.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::consts::PERF_TYPE_SOFTWARE;
    use crate::count::Scaling;
    use crate::sys::mock::MockSys;

    fn sw(name: &str, config: u64) -> EventAttr {
        EventAttr::new(name, Kind::Software, PERF_TYPE_SOFTWARE, config)
    }

    fn three(mock: &Arc<MockSys>) -> (Group, Member, Member, Member) {
        let mut g = Group::open_with(mock.clone(), &sw("task-clock", 1), Target::ThisThread).unwrap();
        let pf = g.add(&sw("page-faults", 2)).unwrap();
        let cs = g.add(&sw("context-switches", 3)).unwrap();
        let leader = g.leader();
        (g, leader, pf, cs)
    }

    /// A group read of `members` in their order: times, then value and id of each.
    fn read_of(members: [&Member; 3], enabled: u64, running: u64, values: [u64; 3]) -> [u64; 9] {
        let [a, b, c] = members;
        [3, enabled, running, values[0], a.id(), values[1], b.id(), values[2], c.id()]
    }

    #[test]
    fn members_join_the_leader_with_group_format() {
        let mock = MockSys::new();
        let (g, leader, pf, cs) = three(&mock);
        let opened = mock.opened();
        assert_eq!(opened.len(), 3);
        assert_eq!(opened[0].group, None);
        assert_eq!(opened[1].group, Some(leader.id()));
        assert_eq!(opened[2].group, Some(leader.id()));
        assert!(opened.iter().all(|o| o.read_format == GROUP_FORMAT && o.pid == 0 && o.cpu == -1));
        assert_eq!(g.members().collect::<Vec<_>>(), vec![leader, pf, cs]);
        assert_eq!(g.name(&cs), Some("context-switches"));
        g.enable().unwrap();
        g.disable().unwrap();
        g.reset().unwrap();
        assert_eq!(
            mock.ioctls(),
            vec![
                Ioctl::Enable { group: false },
                Ioctl::Disable { group: false },
                Ioctl::Reset { group: true }
            ]
        );
    }

    /// Samples every `0` events with `1` as sample_type; period 0 is refused.
    #[derive(Debug)]
    struct Period(u64, u64);

    impl SamplingAttr for Period {
        fn validate(&self, event: &str) -> Result<()> {
            if self.0 == 0 {
                return Err(Error::Malformed { event: event.into(), reason: "period 0".into() });
            }
            Ok(())
        }
        fn apply(&self, a: &mut crate::sys::perf_event_attr) {
            a.__bindgen_anon_1.sample_period = self.0;
            a.sample_type = self.1;
        }
    }

    #[test]
    fn sampling_leader_and_member_keep_the_group_read_format() {
        let mock = MockSys::new();
        let mut g = Group::open_sampling_with(
            mock.clone(),
            &sw("page-faults", 2),
            &Period(100, 5),
            Target::ThisThread,
        )
        .unwrap();
        g.add(&sw("task-clock", 1)).unwrap();
        g.add_sampling(&sw("context-switches", 3), &Period(7, 0)).unwrap();
        let o = mock.opened();
        assert!(o.iter().all(|o| o.read_format == GROUP_FORMAT), "one group read covers samplers too");
        assert_eq!(o.iter().map(|o| o.sample_period).collect::<Vec<_>>(), vec![100, 0, 7]);
        assert_eq!(o[0].sample_type, 5);
        assert_eq!(o[1].sample_type, 0);
        assert!(Group::open_sampling_with(mock, &sw("x", 2), &Period(0, 0), Target::ThisThread).is_err());
    }

    #[test]
    fn values_are_matched_to_members_by_id_not_position() {
        let mock = MockSys::new();
        let (g, leader, pf, cs) = three(&mock);
        // The kernel's order is not the order of opening here.
        mock.push_read(&[3, 900, 300, 7, cs.id(), 5_000_000, leader.id(), 2_000, pf.id()]);
        let c = g.read().unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[&leader].raw, 5_000_000);
        assert_eq!(c[&pf].raw, 2_000);
        assert_eq!(c[&cs].raw, 7);
        assert_eq!((c.time_enabled(), c.time_running()), (900, 300));
        let e = c[&pf].since(&Count::ZERO);
        assert_eq!((e.scaling(), e.value), (Scaling::Scaled { factor: 3.0 }, 6_000));
        let listed: Vec<_> = c.iter().map(|(m, v)| (m, v.raw)).collect();
        assert_eq!(listed, vec![(leader, 5_000_000), (pf, 2_000), (cs, 7)]);
    }

    #[test]
    fn never_scheduled_and_overrun_groups() {
        let mock = MockSys::new();
        let (g, leader, pf, cs) = three(&mock);
        mock.push_read(&read_of([&leader, &pf, &cs], 1_000, 0, [0; 3]));
        let c = g.read().unwrap();
        let e = c[&pf].since(&Count::ZERO);
        assert_eq!((e.scaling(), e.value, e.counted()), (Scaling::NeverRan, 0, None));
        mock.push_read(&read_of([&leader, &pf, &cs], 1_000, 1_001, [4, 5, 6]));
        let c = g.read().unwrap();
        let e = c[&cs].since(&Count::ZERO);
        assert_eq!((e.scaling(), e.value), (Scaling::RunningExceedsEnabled, 6));
    }

    #[test]
    fn malformed_buffers_are_errors_not_panics() {
        let mock = MockSys::new();
        let (g, leader, pf, cs) = three(&mock);
        let full = read_of([&leader, &pf, &cs], 10, 10, [1, 2, 3]);
        let bytes: Vec<u8> = full.iter().flat_map(|w: &u64| w.to_ne_bytes()).collect();

        for cut in [0usize, 7, 16, 24, 40, 71] {
            mock.push_bytes(bytes[..cut].to_vec());
            match g.read() {
                Err(Error::InErrorState { .. }) if cut == 0 => {}
                Err(Error::ShortRead { got, expected: 72, .. }) if got == cut => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        let cases: [(&[u64], &str); 3] = [
            (&[2, 10, 10, 1, leader.id(), 2, pf.id()], "2 values"),
            (&[3, 10, 10, 1, leader.id(), 2, 424_242, 3, cs.id()], "424242"),
            (&[3, 10, 10, 1, leader.id(), 2, leader.id(), 3, cs.id()], "twice"),
        ];
        for (words, says) in cases {
            mock.push_read(words);
            match g.read() {
                Err(e @ Error::KernelData { .. }) => assert!(e.to_string().contains(says), "{e}"),
                other => panic!("{words:?}: {other:?}"),
            }
        }
        // An absurd member count must not overflow the size arithmetic.
        mock.push_read(&[u64::MAX, 0, 0]);
        assert!(matches!(g.read(), Err(Error::KernelData { .. })));
    }

    #[test]
    fn foreign_members_are_not_found() {
        let mock = MockSys::new();
        let (g, leader, pf, cs) = three(&mock);
        let (other, ..) = three(&mock);
        mock.push_read(&read_of([&leader, &pf, &cs], 1, 1, [1, 2, 3]));
        let c = g.read().unwrap();
        assert!(c.get(&other.leader()).is_none());
        assert!(g.fd(&other.leader()).is_none());
    }

    #[test]
    fn read_into_reuses_its_buffers() {
        let mock = MockSys::new();
        let (g, leader, pf, cs) = three(&mock);
        let mut c = GroupCounts::default();
        for round in 1..=3u64 {
            mock.push_read(&read_of([&leader, &pf, &cs], round, round, [round, 2 * round, 3 * round]));
            g.read_into(&mut c).unwrap();
            assert_eq!((c[&leader].raw, c[&pf].raw, c[&cs].raw), (round, 2 * round, 3 * round));
        }
    }

    #[test]
    fn a_failing_member_leaves_the_group_intact_and_closes_nothing_else() {
        let mock = MockSys::new();
        let mut g = Group::open_with(mock.clone(), &sw("task-clock", 1), Target::ThisThread).unwrap();
        mock.fail_open(Errno(libc::ENOSPC));
        assert!(matches!(g.add(&sw("page-faults", 2)), Err(Error::NoCounterSlot { .. })));
        assert_eq!(g.len(), 1);
        assert_eq!(mock.live_fds(), 1);
        drop(g);
        assert_eq!(mock.live_fds(), 0);
    }
}
