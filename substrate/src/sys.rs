//! The syscall seam: every `unsafe` call of the event layer.
//!
//! Everything above this module talks to the kernel through the [`Sys`]
//! trait. [`Kernel`] is the real implementation; unit tests pass their own
//! implementation to exercise paths this machine cannot reach (hardware
//! counters, multiplexing, rdpmc pages).
//!
//! # Safety
//!
//! The only unsafe operations here are `perf_event_open(2)`, `ioctl(2)` and
//! `read(2)` on descriptors owned by the caller. Each block states the
//! invariant it relies on.
#![allow(unsafe_code)]

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

pub use pe::bindings::perf_event_attr;
use perf_event_open_sys as pe;

/// An errno value the kernel returned, kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's current `errno`.
    pub fn last() -> Self {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The symbolic name (`ENOENT`), or `E?` for values this table lacks.
    pub fn name(self) -> &'static str {
        match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::ESRCH => "ESRCH",
            libc::EINTR => "EINTR",
            libc::EIO => "EIO",
            libc::E2BIG => "E2BIG",
            libc::EBADF => "EBADF",
            libc::EAGAIN => "EAGAIN",
            libc::ENOMEM => "ENOMEM",
            libc::EACCES => "EACCES",
            libc::EFAULT => "EFAULT",
            libc::EBUSY => "EBUSY",
            libc::EEXIST => "EEXIST",
            libc::ENODEV => "ENODEV",
            libc::EINVAL => "EINVAL",
            libc::EMFILE => "EMFILE",
            libc::ENOSPC => "ENOSPC",
            libc::ENOSYS => "ENOSYS",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            libc::EOVERFLOW => "EOVERFLOW",
            _ => "E?",
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = std::io::Error::from_raw_os_error(self.0);
        // io::Error's Display appends " (os error N)"; keep only the text.
        let text = text.to_string();
        let text = text.split(" (os error").next().unwrap_or("");
        write!(f, "{} ({})", self.name(), text)
    }
}

/// The ioctls papirus issues on perf event descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ioctl {
    /// `PERF_EVENT_IOC_ENABLE`; the flag applies it to the whole group.
    Enable {
        /// `PERF_IOC_FLAG_GROUP`
        group: bool,
    },
    /// `PERF_EVENT_IOC_DISABLE`.
    Disable {
        /// `PERF_IOC_FLAG_GROUP`
        group: bool,
    },
    /// `PERF_EVENT_IOC_RESET`.
    Reset {
        /// `PERF_IOC_FLAG_GROUP`
        group: bool,
    },
    /// `PERF_EVENT_IOC_REFRESH` with an overflow count.
    Refresh(i32),
    /// `PERF_EVENT_IOC_PERIOD` with a new sample period.
    Period(u64),
    /// `PERF_EVENT_IOC_SET_OUTPUT` redirecting samples to another event's buffer.
    SetOutput(i32),
}

/// The kernel interface papirus' event layer is written against.
///
/// Every method mirrors one system call; errors carry the raw errno so the
/// caller can classify it with the operation and event it was doing.
pub trait Sys: Send + Sync + fmt::Debug {
    /// `perf_event_open(2)`. The attr is mutable because the kernel writes
    /// the size it expects back into it on `E2BIG`.
    fn perf_event_open(
        &self,
        attr: &mut perf_event_attr,
        pid: i32,
        cpu: i32,
        group_fd: Option<BorrowedFd<'_>>,
        flags: u64,
    ) -> Result<OwnedFd, Errno>;

    /// `ioctl(2)` on a perf event descriptor.
    fn ioctl(&self, fd: BorrowedFd<'_>, op: Ioctl) -> Result<(), Errno>;

    /// `PERF_EVENT_IOC_ID`: the kernel's id of the event, as `PERF_FORMAT_ID` reports it.
    fn event_id(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno>;

    /// `read(2)` into `buf`, returning the number of bytes read.
    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno>;

    /// `mmap(2)` of the first `len` bytes of a perf event descriptor, shared
    /// and read-only (the metadata page first). Tests return
    /// [`Mapping::from_image`](crate::mmap::Mapping::from_image) to hand in
    /// synthetic pages.
    fn mmap(&self, fd: BorrowedFd<'_>, len: usize) -> Result<crate::mmap::Mapping, Errno>;
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct Kernel;

/// The shared handle to the real kernel that events use unless told otherwise.
pub fn kernel() -> Arc<dyn Sys> {
    static KERNEL: std::sync::OnceLock<Arc<dyn Sys>> = std::sync::OnceLock::new();
    KERNEL.get_or_init(|| Arc::new(Kernel)).clone()
}

fn check(ret: libc::c_int) -> Result<libc::c_int, Errno> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

impl Sys for Kernel {
    fn perf_event_open(
        &self,
        attr: &mut perf_event_attr,
        pid: i32,
        cpu: i32,
        group_fd: Option<BorrowedFd<'_>>,
        flags: u64,
    ) -> Result<OwnedFd, Errno> {
        let group = group_fd.map_or(-1, |fd| fd.as_raw_fd());
        // SAFETY: `attr` is a valid, initialised perf_event_attr for the
        // duration of the call; any pointer it carries (a uprobe path in
        // config1) is kept alive by the caller's description.
        let ret = unsafe { pe::perf_event_open(attr, pid, cpu, group, flags as libc::c_ulong) };
        let fd = check(ret)?;
        // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn ioctl(&self, fd: BorrowedFd<'_>, op: Ioctl) -> Result<(), Errno> {
        let raw = fd.as_raw_fd();
        let flag = |group: bool| if group { pe::bindings::PERF_IOC_FLAG_GROUP } else { 0 };
        // SAFETY: `raw` is a live perf event descriptor borrowed for the call;
        // each ioctl takes its argument by value, no pointers are passed.
        let ret = unsafe {
            match op {
                Ioctl::Enable { group } => pe::ioctls::ENABLE(raw, flag(group)),
                Ioctl::Disable { group } => pe::ioctls::DISABLE(raw, flag(group)),
                Ioctl::Reset { group } => pe::ioctls::RESET(raw, flag(group)),
                Ioctl::Refresh(n) => pe::ioctls::REFRESH(raw, n),
                Ioctl::Period(p) => pe::ioctls::PERIOD(raw, p),
                Ioctl::SetOutput(target) => pe::ioctls::SET_OUTPUT(raw, target),
            }
        };
        check(ret).map(drop)
    }

    fn event_id(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
        let mut id = 0u64;
        // SAFETY: `id` is a valid u64 the kernel writes into; the fd is live.
        let ret = unsafe { pe::ioctls::ID(fd.as_raw_fd(), &mut id) };
        check(ret).map(|_| id)
    }

    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the fd is live.
        let ret = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if ret < 0 { Err(Errno::last()) } else { Ok(ret as usize) }
    }

    fn mmap(&self, fd: BorrowedFd<'_>, len: usize) -> Result<crate::mmap::Mapping, Errno> {
        crate::mmap::Mapping::map_fd(fd, len)
    }
}

/// `clock_gettime(2)` of `clock` (`libc::CLOCK_*`) in nanoseconds. The
/// TSC-based clocks go through the vDSO; the CPU-time clocks are syscalls.
pub fn clock_gettime(clock: libc::clockid_t) -> Result<u64, Errno> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec the call writes into.
    let ret = unsafe { libc::clock_gettime(clock, &mut ts) };
    check(ret)?;
    Ok((ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64))
}
