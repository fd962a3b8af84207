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
use std::ptr::NonNull;
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

    /// `mmap(2)` of `len` bytes of a perf event descriptor from offset 0,
    /// shared; writable when the caller must store `data_tail` (ring buffers).
    fn mmap(&self, fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<NonNull<u8>, Errno>;

    /// `munmap(2)` of a mapping [`Sys::mmap`] returned.
    ///
    /// # Safety
    ///
    /// `ptr` and `len` must come from one earlier `mmap` call of this `Sys`,
    /// and nothing may use the mapping afterwards.
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> Result<(), Errno>;

    /// `fcntl(2)` on a perf event descriptor, for overflow signal routing.
    fn fcntl(&self, fd: BorrowedFd<'_>, op: Fcntl) -> Result<i32, Errno>;
}

// Linux fcntl values the libc crate does not export for glibc targets
// (<asm-generic/fcntl.h>, <bits/fcntl-linux.h>).
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct FOwnerEx {
    type_: libc::c_int,
    pid: libc::pid_t,
}

/// The `fcntl(2)` commands the overflow path issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fcntl {
    /// `F_SETOWN_EX` with `F_OWNER_TID`: signals go to this thread only.
    SetOwnerThread(i32),
    /// `F_SETSIG`: the signal sent on overflow (0 restores plain SIGIO).
    SetSig(i32),
    /// `F_GETFL`.
    GetFlags,
    /// `F_SETFL` (`O_ASYNC`, `O_NONBLOCK`).
    SetFlags(i32),
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

    fn mmap(&self, fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<NonNull<u8>, Errno> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) of a live
        // descriptor; it aliases no Rust object.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        NonNull::new(ptr.cast()).ok_or(Errno(libc::EFAULT))
    }

    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        // SAFETY: the caller guarantees `ptr`/`len` are one live mapping of ours
        // that nothing uses any more.
        let ret = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        check(ret).map(drop)
    }

    fn fcntl(&self, fd: BorrowedFd<'_>, op: Fcntl) -> Result<i32, Errno> {
        let raw = fd.as_raw_fd();
        // SAFETY: `raw` is a live descriptor; F_SETOWN_EX reads a valid
        // f_owner_ex that lives on this stack frame for the call; the other
        // commands take integers.
        let ret = unsafe {
            match op {
                Fcntl::SetOwnerThread(tid) => {
                    let owner = FOwnerEx { type_: F_OWNER_TID, pid: tid };
                    libc::fcntl(raw, F_SETOWN_EX, &owner as *const FOwnerEx)
                }
                Fcntl::SetSig(sig) => libc::fcntl(raw, F_SETSIG, sig),
                Fcntl::GetFlags => libc::fcntl(raw, libc::F_GETFL),
                Fcntl::SetFlags(flags) => libc::fcntl(raw, libc::F_SETFL, flags),
            }
        };
        check(ret)
    }
}
