//! Open perf events: what an event counts on ([`Target`]) and one open
//! event ([`Counter`]), read as a [`Count`].
//!
//! Every descriptor is an [`OwnedFd`] closed on drop, so an error anywhere
//! after `perf_event_open(2)` leaks nothing. All kernel calls go through the
//! [`Sys`] seam; [`EventAttr::open`] uses the real kernel,
//! [`EventAttr::open_with`] any other implementation.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use perf_event_open_sys::bindings as b;

use crate::attr::{EventAttr, Kind};
pub use crate::count::Count;
use crate::error::{Error, Op, Result};
use crate::sys::{self, Errno, Ioctl, Sys};

/// What an event counts on: a task, a CPU, or a task while on one CPU.
///
/// Task targets count the task wherever it runs; with
/// [`EventAttr::inherit`] they also count threads and processes the task
/// creates after the event is opened (their counts are added to this event
/// when they exit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Target {
    /// The calling thread (`pid = 0, cpu = -1`).
    #[default]
    ThisThread,
    /// A thread or process by id (`pid = N, cpu = -1`); a process id names
    /// its main thread.
    Task(i32),
    /// Everything that runs on one CPU (`pid = -1, cpu = N`), system-wide:
    /// needs CAP_PERFMON or `perf_event_paranoid` ≤ 0.
    Cpu(u32),
    /// A thread only while it runs on one CPU (`pid = N, cpu = M`); pid 0 is
    /// the calling thread.
    TaskOnCpu {
        /// The thread or process id, 0 for the calling thread.
        pid: i32,
        /// The CPU number.
        cpu: u32,
    },
}

impl Target {
    /// The `(pid, cpu)` pair `perf_event_open(2)` takes for this target.
    pub fn pid_cpu(self) -> (i32, i32) {
        // A CPU number beyond i32 cannot exist; pass one the kernel rejects.
        let cpu = |c: u32| i32::try_from(c).unwrap_or(i32::MAX);
        match self {
            Target::ThisThread => (0, -1),
            Target::Task(pid) => (pid, -1),
            Target::Cpu(c) => (-1, cpu(c)),
            Target::TaskOnCpu { pid, cpu: c } => (pid, cpu(c)),
        }
    }
}

/// Reads the `i`-th native-endian u64 of a kernel read buffer (the caller
/// checked the length).
pub(crate) fn word(buf: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&buf[i * 8..i * 8 + 8]);
    u64::from_ne_bytes(w)
}

/// The read format of a single counter: value, enabled, running, id.
const COUNTER_FORMAT: u64 =
    (b::PERF_FORMAT_TOTAL_TIME_ENABLED | b::PERF_FORMAT_TOTAL_TIME_RUNNING | b::PERF_FORMAT_ID) as u64;
const COUNTER_BYTES: usize = 32;

/// What a sampling event adds to its attr when it is opened: the sampling
/// layer above (papirus-substrate's `sample::Sampling`) implements it.
pub trait SamplingAttr: std::fmt::Debug {
    /// Refuses a configuration the kernel would reject or papirus cannot
    /// parse, naming `event`.
    fn validate(&self, event: &str) -> Result<()>;
    /// Writes the sampling fields into `attr`.
    fn apply(&self, attr: &mut sys::perf_event_attr);
}

/// Opens `attr` on `target` with `read_format`, in `group` if given,
/// sampling as `sampling` says if given, and asks the kernel for the
/// event's id. Every failure is classified.
pub(crate) fn open_fd(
    sys: &dyn Sys,
    attr: &EventAttr,
    target: Target,
    group: Option<BorrowedFd<'_>>,
    read_format: u64,
    sampling: Option<&dyn SamplingAttr>,
) -> Result<(OwnedFd, u64)> {
    let mut raw = attr.to_raw();
    if let Some(s) = sampling {
        s.validate(attr.name())?;
        s.apply(&mut raw);
    }
    // After the sampling fields: read(2) of the event keeps the caller's format.
    raw.read_format = read_format;
    // Members count while their leader does; see `Group::enable`.
    if group.is_some() {
        raw.set_disabled(0);
    }
    let (pid, cpu) = target.pid_cpu();
    let fd = sys
        .perf_event_open(&mut raw, pid, cpu, group, u64::from(b::PERF_FLAG_FD_CLOEXEC))
        .map_err(|e| open_error(attr, e, pid, raw.size))?;
    let hardware = attr.kind() == Kind::Hardware;
    let id =
        sys.event_id(fd.as_fd()).map_err(|e| Error::from_errno(Op::Ioctl, attr.name(), e, hardware, pid))?;
    Ok((fd, id))
}

/// Classifies a refused open. `size` is the attr size after the call: on
/// E2BIG the kernel wrote the size it expects there.
fn open_error(attr: &EventAttr, errno: Errno, pid: i32, size: u32) -> Error {
    let event = attr.name().to_string();
    match errno.0 {
        libc::E2BIG => Error::AttrSize { op: Op::Open, event, errno, expected: size },
        libc::EINVAL if attr.domain_value() != crate::Domain::ALL => Error::Kernel {
            op: Op::Open,
            event,
            errno,
            hint: "the attr is not valid here; if this PMU cannot exclude kernel or hypervisor mode \
                   (msr, power, uncore PMUs cannot), open it with all domains"
                .to_string(),
        },
        _ => Error::from_errno(Op::Open, &event, errno, attr.kind() == Kind::Hardware, pid),
    }
}

/// One open perf event on one target. The descriptor closes on drop.
#[derive(Debug)]
pub struct Counter {
    fd: OwnedFd,
    sys: Arc<dyn Sys>,
    name: String,
    id: u64,
    hardware: bool,
    target: Target,
}

impl EventAttr {
    /// Opens this event on `target` in the real kernel. The event starts
    /// disabled: call [`Counter::enable`].
    pub fn open(&self, target: Target) -> Result<Counter> {
        self.open_with(sys::kernel(), target)
    }

    /// Opens this event on `target` through `sys` (a test double, or
    /// [`sys::kernel`]).
    pub fn open_with(&self, sys: Arc<dyn Sys>, target: Target) -> Result<Counter> {
        let (fd, id) = open_fd(&*sys, self, target, None, COUNTER_FORMAT, None)?;
        Ok(Counter {
            fd,
            sys,
            name: self.name().to_string(),
            id,
            hardware: self.kind() == Kind::Hardware,
            target,
        })
    }
}

impl Counter {
    fn fail(&self, op: Op, errno: Errno) -> Error {
        Error::from_errno(op, &self.name, errno, self.hardware, self.target.pid_cpu().0)
    }

    fn ioctl(&self, op: Op, ioctl: Ioctl) -> Result<()> {
        self.sys.ioctl(self.fd.as_fd(), ioctl).map_err(|e| self.fail(op, e))
    }

    /// Starts counting (`PERF_EVENT_IOC_ENABLE`).
    pub fn enable(&self) -> Result<()> {
        self.ioctl(Op::Enable, Ioctl::Enable { group: false })
    }

    /// Stops counting (`PERF_EVENT_IOC_DISABLE`); the value is kept.
    pub fn disable(&self) -> Result<()> {
        self.ioctl(Op::Disable, Ioctl::Disable { group: false })
    }

    /// Sets the value to zero (`PERF_EVENT_IOC_RESET`); the enabled and
    /// running times keep accumulating.
    pub fn reset(&self) -> Result<()> {
        self.ioctl(Op::Reset, Ioctl::Reset { group: false })
    }

    /// Reads the value with its enabled and running times, one `read(2)`.
    pub fn read(&self) -> Result<Count> {
        let mut buf = [0u8; COUNTER_BYTES];
        let got = self.sys.read(self.fd.as_fd(), &mut buf).map_err(|e| self.fail(Op::Read, e))?;
        if got == 0 {
            return Err(Error::InErrorState { event: self.name.clone() });
        }
        if got < COUNTER_BYTES {
            return Err(Error::ShortRead {
                op: Op::Read,
                event: self.name.clone(),
                got,
                expected: COUNTER_BYTES,
            });
        }
        let id = word(&buf, 3);
        if id != self.id {
            return Err(Error::KernelData {
                op: Op::Read,
                event: self.name.clone(),
                reason: format!("the value is for event id {id}, this event is {}", self.id),
            });
        }
        Ok(Count { raw: word(&buf, 0), time_enabled: word(&buf, 1), time_running: word(&buf, 2) })
    }

    /// The kernel's id of this event (`PERF_EVENT_IOC_ID`), as group reads
    /// and samples report it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The event's name, as used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the event counts on.
    pub fn target(&self) -> Target {
        self.target
    }
}

// Events are opened on one thread and read on another.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Counter>();
    send_sync::<crate::group::Group>();
    send_sync::<crate::group::GroupCounts>();
};

impl AsFd for Counter {
    /// The event's descriptor, e.g. to mmap its user page.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::attr::consts::{PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE};
    use crate::sys::mock::MockSys;

    fn task_clock() -> EventAttr {
        EventAttr::new("task-clock", Kind::Software, PERF_TYPE_SOFTWARE, 1)
    }

    fn count(raw: u64, time_enabled: u64, time_running: u64) -> Count {
        Count { raw, time_enabled, time_running }
    }

    #[test]
    fn default_domains_follow_what_each_pmu_can_count() {
        use crate::Domain;
        assert_eq!(Domain::default_for(Kind::Software, "software", 1), Domain::USER, "task-clock");
        assert_eq!(Domain::default_for(Kind::Software, "software", 2), Domain::USER, "page-faults");
        assert_eq!(Domain::default_for(Kind::Software, "software", 3), Domain::ALL, "context-switches");
        assert_eq!(Domain::default_for(Kind::Software, "software", 4), Domain::ALL, "cpu-migrations");
        assert_eq!(Domain::default_for(Kind::Hardware, "cpu", 0), Domain::USER);
        assert_eq!(Domain::default_for(Kind::Breakpoint, "breakpoint", 0), Domain::USER);
        assert_eq!(Domain::default_for(Kind::Dynamic, "uprobe", 0), Domain::USER);
        assert_eq!(Domain::default_for(Kind::Tracepoint, "tracepoint", 840), Domain::ALL);
        for pmu in ["msr", "power", "cstate_core", "uncore_imc_0", "amd_df", "amd_l3"] {
            assert_eq!(Domain::default_for(Kind::Dynamic, pmu, 0), Domain::ALL, "{pmu}");
        }
        let mut tsc = EventAttr::new("msr/tsc/", Kind::Dynamic, 9, 0);
        assert_eq!(tsc.domain_value(), Domain::USER, "new() keeps user only");
        tsc.default_domain("msr");
        let raw = tsc.to_raw();
        assert_eq!((raw.exclude_user(), raw.exclude_kernel(), raw.exclude_hv()), (0, 0, 0));
    }

    #[test]
    fn targets_map_to_pid_and_cpu() {
        assert_eq!(Target::ThisThread.pid_cpu(), (0, -1));
        assert_eq!(Target::Task(42).pid_cpu(), (42, -1));
        assert_eq!(Target::Cpu(1).pid_cpu(), (-1, 1));
        assert_eq!(Target::TaskOnCpu { pid: 7, cpu: 0 }.pid_cpu(), (7, 0));
        assert_eq!(Target::Cpu(u32::MAX).pid_cpu(), (-1, i32::MAX));
    }

    #[test]
    fn open_passes_target_format_and_cloexec() {
        let mock = MockSys::new();
        let c = task_clock().open_with(mock.clone(), Target::TaskOnCpu { pid: 9, cpu: 1 }).unwrap();
        let opened = mock.opened();
        assert_eq!(opened.len(), 1);
        let o = &opened[0];
        assert_eq!((o.type_, o.config, o.pid, o.cpu, o.group), (PERF_TYPE_SOFTWARE, 1, 9, 1, None));
        assert_eq!(o.read_format, COUNTER_FORMAT);
        assert_eq!(o.flags, u64::from(b::PERF_FLAG_FD_CLOEXEC));
        assert!(o.disabled && o.exclude_kernel && o.exclude_hv && !o.exclude_user);
        assert_eq!(c.id(), mock.id_of(0));
    }

    #[test]
    fn read_decodes_value_times_and_checks_id() {
        let mock = MockSys::new();
        let c = task_clock().open_with(mock.clone(), Target::ThisThread).unwrap();
        mock.push_read(&[5, 10, 8, c.id()]);
        let v = c.read().unwrap();
        assert_eq!(v, count(5, 10, 8));
        assert_eq!(v.since(&Count::ZERO).value, 6);

        mock.push_read(&[5, 10, 8, c.id() + 1]);
        assert!(matches!(c.read(), Err(Error::KernelData { .. })), "a foreign id is kernel data we reject");

        mock.push_bytes(vec![0; 20]);
        match c.read() {
            Err(Error::ShortRead { got: 20, expected: 32, .. }) => {}
            other => panic!("expected a short read, got {other:?}"),
        }
        mock.push_bytes(Vec::new());
        assert!(matches!(c.read(), Err(Error::InErrorState { .. })));
    }

    #[test]
    fn ioctls_go_to_the_event_without_group_flag() {
        let mock = MockSys::new();
        let c = task_clock().open_with(mock.clone(), Target::ThisThread).unwrap();
        c.enable().unwrap();
        c.disable().unwrap();
        c.reset().unwrap();
        assert_eq!(
            mock.ioctls(),
            vec![
                Ioctl::Enable { group: false },
                Ioctl::Disable { group: false },
                Ioctl::Reset { group: false }
            ]
        );
        mock.fail_ioctl(Errno(libc::EBADF));
        let e = c.enable().unwrap_err();
        assert!(matches!(e, Error::Kernel { op: Op::Enable, .. }), "{e:?}");
    }

    fn open_error(attr: &EventAttr, errno: i32, target: Target) -> Error {
        let mock = MockSys::new();
        mock.fail_open(Errno(errno));
        let e = attr.open_with(mock.clone(), target).unwrap_err();
        assert_eq!(mock.live_fds(), 0, "a failed open leaves no descriptor");
        e
    }

    #[test]
    fn enoent_on_a_hardware_event_names_the_missing_pmu() {
        let cycles = EventAttr::new("cycles", Kind::Hardware, PERF_TYPE_HARDWARE, 0);
        let e = open_error(&cycles, libc::ENOENT, Target::ThisThread);
        assert!(matches!(e, Error::Unsupported { hardware: true, op: Op::Open, .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("`cycles`") && msg.contains("no hardware PMU is exposed"), "{msg}");
        assert!(msg.contains("ENOENT"), "{msg}");
        // A software event that is missing is not blamed on the PMU.
        let e = open_error(&task_clock(), libc::EOPNOTSUPP, Target::ThisThread);
        assert!(matches!(e, Error::Unsupported { hardware: false, .. }));
        assert!(!e.to_string().contains("hardware PMU"));
    }

    #[test]
    fn eacces_is_a_permission_error_with_advice() {
        let e = open_error(&task_clock(), libc::EACCES, Target::Cpu(0));
        assert!(matches!(e, Error::Permission { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("perf_event_paranoid") && msg.contains("CAP_PERFMON"), "{msg}");
        assert_eq!(e.errno(), Some(Errno(libc::EACCES)));
    }

    #[test]
    fn enospc_is_no_counter_slot() {
        let bp = EventAttr::new("mem:0x1000:x", Kind::Breakpoint, 5, 0);
        let e = open_error(&bp, libc::ENOSPC, Target::ThisThread);
        assert!(matches!(e, Error::NoCounterSlot { .. }), "{e:?}");
        assert!(e.to_string().contains("debug registers"));
    }

    #[test]
    fn e2big_reports_the_size_the_kernel_wrote_back() {
        let mock = MockSys::new();
        mock.fail_open_e2big(112);
        let e = task_clock().open_with(mock.clone(), Target::ThisThread).unwrap_err();
        match e {
            Error::AttrSize { expected: 112, .. } => {}
            other => panic!("expected AttrSize 112, got {other:?}"),
        }
    }

    #[test]
    fn esrch_names_the_process() {
        let e = open_error(&task_clock(), libc::ESRCH, Target::Task(4_000_000));
        assert!(matches!(e, Error::NoSuchProcess { pid: 4_000_000, .. }), "{e:?}");
        assert!(e.to_string().contains("4000000"));
    }

    #[test]
    fn einval_with_excluded_domains_suggests_all_domains() {
        let mut tsc = EventAttr::new("msr/tsc/", Kind::Dynamic, 9, 0);
        let e = open_error(&tsc, libc::EINVAL, Target::ThisThread);
        assert!(e.to_string().contains("all domains"), "{e}");
        tsc.domain(crate::Domain::ALL);
        let e = open_error(&tsc, libc::EINVAL, Target::ThisThread);
        assert!(matches!(e, Error::Kernel { ref hint, .. } if hint.is_empty()), "{e:?}");
    }

    #[test]
    fn failing_event_id_closes_the_new_descriptor() {
        let mock = MockSys::new();
        mock.fail_event_id(Errno(libc::EINVAL));
        assert!(task_clock().open_with(mock.clone(), Target::ThisThread).is_err());
        assert_eq!(mock.live_fds(), 0);
    }

    #[test]
    fn drop_closes_the_descriptor() {
        let mock = MockSys::new();
        let c = task_clock().open_with(mock.clone(), Target::ThisThread).unwrap();
        assert_eq!(mock.live_fds(), 1);
        let mut reader = mock.take_reader(0);
        drop(c);
        // The mock handed out a pipe's write end: EOF proves it was closed.
        let mut buf = [0u8; 1];
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        assert_eq!(mock.live_fds(), 0);
    }
}
