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

    /// `mmap(2)` of the first `len` bytes of a perf event descriptor, shared
    /// and read-only (the metadata page first). Tests return
    /// [`Mapping::from_image`](crate::mmap::Mapping::from_image) to hand in
    /// synthetic pages. The default maps nothing (`ENODEV`), so readers fall
    /// back to `read(2)`.
    fn mmap(&self, fd: BorrowedFd<'_>, len: usize) -> Result<crate::mmap::Mapping, Errno> {
        let _ = (fd, len);
        Err(Errno(libc::ENODEV))
    }

    /// `mmap(2)` of `len` bytes of a perf event descriptor from offset 0,
    /// shared and writable: a sample ring buffer, whose reader stores
    /// `data_tail`. Unsupported unless overridden (test doubles without rings).
    fn mmap_ring(&self, fd: BorrowedFd<'_>, len: usize) -> Result<NonNull<u8>, Errno> {
        let _ = (fd, len);
        Err(Errno(libc::ENOSYS))
    }

    /// `munmap(2)` of a mapping [`Sys::mmap_ring`] returned.
    ///
    /// # Safety
    ///
    /// `ptr` and `len` must come from one earlier `mmap_ring` call of this
    /// `Sys`, and nothing may use the mapping afterwards.
    unsafe fn munmap_ring(&self, ptr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        let _ = (ptr, len);
        Err(Errno(libc::ENOSYS))
    }

    /// `fcntl(2)` on a perf event descriptor, for overflow signal routing.
    /// Unsupported unless overridden.
    fn fcntl(&self, fd: BorrowedFd<'_>, op: Fcntl) -> Result<i32, Errno> {
        let _ = (fd, op);
        Err(Errno(libc::ENOSYS))
    }
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

    fn mmap(&self, fd: BorrowedFd<'_>, len: usize) -> Result<crate::mmap::Mapping, Errno> {
        crate::mmap::Mapping::map_fd(fd, len)
    }

    fn mmap_ring(&self, fd: BorrowedFd<'_>, len: usize) -> Result<NonNull<u8>, Errno> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) of a live
        // descriptor; it aliases no Rust object.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        NonNull::new(ptr.cast()).ok_or(Errno(libc::EFAULT))
    }

    unsafe fn munmap_ring(&self, ptr: NonNull<u8>, len: usize) -> Result<(), Errno> {
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

/// `clock_gettime(2)` of `clock` (`libc::CLOCK_*`) in nanoseconds. The
/// TSC-based clocks go through the vDSO; the CPU-time clocks are syscalls.
pub fn clock_gettime(clock: libc::clockid_t) -> Result<u64, Errno> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec the call writes into.
    let ret = unsafe { libc::clock_gettime(clock, &mut ts) };
    check(ret)?;
    Ok((ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64))
}

/// Mounts a tracefs instance at `at` (mount(2); needs CAP_SYS_ADMIN).
pub fn mount_tracefs(at: &std::path::Path) -> std::io::Result<()> {
    let target = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call;
    // tracefs takes no data argument (null).
    let r =
        unsafe { libc::mount(c"nodev".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null()) };
    if r == -1 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Restores the default action of SIGPIPE, which Rust's runtime ignores, so
/// a command-line tool whose output goes to a closed pipe (`| head`) ends
/// quietly as C tools do instead of failing on every write.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE takes no pointers and is done
    // once at the start of main, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// A scripted kernel for unit tests: opens hand out the write end of a
/// pipe (so a test can see the descriptor close), reads return queued
/// buffers, maps return test pages and heap rings, and failures are
/// injected per call.
#[cfg(test)]
pub(crate) mod mock {
    use std::collections::VecDeque;
    use std::io::PipeReader;
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
    use std::sync::{Arc, Mutex, MutexGuard};

    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::mem::offset_of;
    use std::ptr::NonNull;

    use super::pe::bindings::perf_event_mmap_page;
    use super::{Errno, Ioctl, Sys, perf_event_attr};
    use crate::mmap::{Mapping, PageImage, page_size};

    /// What one `perf_event_open` call asked for.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub(crate) struct Opened {
        pub type_: u32,
        pub config: u64,
        pub read_format: u64,
        pub pid: i32,
        pub cpu: i32,
        /// The id of the group leader's descriptor, if in a group.
        pub group: Option<u64>,
        pub flags: u64,
        pub disabled: bool,
        pub exclude_user: bool,
        pub exclude_kernel: bool,
        pub exclude_hv: bool,
        pub inherit: bool,
        /// `sample_period` (0 for a counting event).
        pub sample_period: u64,
        pub sample_type: u64,
    }

    /// One successful open.
    #[derive(Debug)]
    struct Fd {
        raw: i32,
        id: u64,
        /// The read end of the pipe, until a test takes it.
        reader: Option<PipeReader>,
        /// A second read end, to see the descriptor close.
        probe: PipeReader,
        /// The page `mmap` hands out for this descriptor.
        page: Option<Arc<PageImage>>,
    }

    /// Makes the page of each opened event.
    struct Pages(Box<dyn Fn() -> Arc<PageImage> + Send>);

    impl std::fmt::Debug for Pages {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Pages")
        }
    }

    #[derive(Debug, Default)]
    struct State {
        open_errors: VecDeque<(Errno, Option<u32>)>,
        id_errors: VecDeque<Errno>,
        ioctl_errors: VecDeque<Errno>,
        reads: VecDeque<Vec<u8>>,
        /// What reads return once `reads` is empty (else EAGAIN).
        steady_read: Option<Vec<u8>>,
        read_calls: usize,
        pages: Option<Pages>,
        /// (address, length) of each live ring `mmap_ring` handed out.
        rings: Vec<(usize, usize)>,
        rings_unmapped: usize,
        opened: Vec<Opened>,
        fds: Vec<Fd>,
        ioctls: Vec<Ioctl>,
    }

    /// The scripted kernel.
    #[derive(Debug, Default)]
    pub(crate) struct MockSys(Mutex<State>);

    impl MockSys {
        pub(crate) fn new() -> Arc<MockSys> {
            Arc::new(MockSys::default())
        }
        fn state(&self) -> MutexGuard<'_, State> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        /// The next open fails with `errno`.
        pub(crate) fn fail_open(&self, errno: Errno) {
            self.state().open_errors.push_back((errno, None));
        }
        /// The next open fails with E2BIG, writing `size` into the attr.
        pub(crate) fn fail_open_e2big(&self, size: u32) {
            self.state().open_errors.push_back((Errno(libc::E2BIG), Some(size)));
        }
        /// The next `PERF_EVENT_IOC_ID` fails.
        pub(crate) fn fail_event_id(&self, errno: Errno) {
            self.state().id_errors.push_back(errno);
        }
        /// The next other ioctl fails.
        pub(crate) fn fail_ioctl(&self, errno: Errno) {
            self.state().ioctl_errors.push_back(errno);
        }
        /// Queues a read result made of u64 words.
        pub(crate) fn push_read(&self, words: &[u64]) {
            self.push_bytes(words.iter().flat_map(|w| w.to_ne_bytes()).collect());
        }
        /// Queues a read result of raw bytes.
        pub(crate) fn push_bytes(&self, bytes: Vec<u8>) {
            self.state().reads.push_back(bytes);
        }
        /// Every read after the queued ones returns these u64 words.
        pub(crate) fn steady_read(&self, words: &[u64]) {
            self.state().steady_read = Some(words.iter().flat_map(|w| w.to_ne_bytes()).collect());
        }
        /// read(2) calls so far.
        pub(crate) fn read_calls(&self) -> usize {
            self.state().read_calls
        }
        /// Each later open gets a page from `make`, which `mmap` hands out
        /// (without, `mmap` fails with ENODEV as the trait's default).
        pub(crate) fn map_pages(&self, make: impl Fn() -> Arc<PageImage> + Send + 'static) {
            self.state().pages = Some(Pages(Box::new(make)));
        }
        /// A kernel whose every open maps this one page.
        pub(crate) fn with_page(image: &Arc<PageImage>) -> Arc<MockSys> {
            let k = MockSys::new();
            let image = image.clone();
            k.map_pages(move || image.clone());
            k
        }
        /// (address, length) of the newest live ring; the test writes into
        /// it as the kernel would.
        pub(crate) fn last_ring(&self) -> (*mut u8, usize) {
            let (addr, len) = *self.state().rings.last().expect("no ring mapped");
            (addr as *mut u8, len)
        }
        /// Rings mapped and not yet unmapped.
        pub(crate) fn live_rings(&self) -> usize {
            self.state().rings.len()
        }
        /// Rings unmapped so far.
        pub(crate) fn rings_unmapped(&self) -> usize {
            self.state().rings_unmapped
        }
        /// The page of the `n`-th successful open.
        pub(crate) fn page(&self, n: usize) -> Arc<PageImage> {
            self.state().fds[n].page.clone().expect("no page for this open")
        }
        pub(crate) fn opened(&self) -> Vec<Opened> {
            self.state().opened.clone()
        }
        pub(crate) fn ioctls(&self) -> Vec<Ioctl> {
            self.state().ioctls.clone()
        }
        /// The kernel id given to the `n`-th successful open.
        pub(crate) fn id_of(&self, n: usize) -> u64 {
            self.state().fds[n].id
        }
        /// The read end of the pipe behind the `n`-th successful open.
        pub(crate) fn take_reader(&self, n: usize) -> PipeReader {
            let mut st = self.state();
            st.fds[n].reader.take().expect("reader already taken")
        }
        /// How many descriptors handed out are still open (their pipe has a writer).
        pub(crate) fn live_fds(&self) -> usize {
            self.state().fds.iter().filter(|f| !hung_up(f.probe.as_fd())).count()
        }
    }

    /// Whether every write end of the pipe behind `fd` is closed.
    fn hung_up(fd: BorrowedFd<'_>) -> bool {
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `p` is one valid pollfd for a live descriptor; timeout 0.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 1 && p.revents & libc::POLLHUP != 0
    }

    impl Sys for MockSys {
        fn perf_event_open(
            &self,
            attr: &mut perf_event_attr,
            pid: i32,
            cpu: i32,
            group_fd: Option<BorrowedFd<'_>>,
            flags: u64,
        ) -> Result<OwnedFd, Errno> {
            let mut st = self.state();
            let group = group_fd.map(|g| {
                let raw = g.as_raw_fd();
                st.fds.iter().rev().find(|f| f.raw == raw).map_or(u64::MAX, |f| f.id)
            });
            st.opened.push(Opened {
                type_: attr.type_,
                config: attr.config,
                read_format: attr.read_format,
                pid,
                cpu,
                group,
                flags,
                disabled: attr.disabled() != 0,
                exclude_user: attr.exclude_user() != 0,
                exclude_kernel: attr.exclude_kernel() != 0,
                exclude_hv: attr.exclude_hv() != 0,
                inherit: attr.inherit() != 0,
                // SAFETY: both union members are a u64; freq is 0 in these tests.
                sample_period: unsafe { attr.__bindgen_anon_1.sample_period },
                sample_type: attr.sample_type,
            });
            if let Some((errno, size)) = st.open_errors.pop_front() {
                if let Some(size) = size {
                    attr.size = size;
                }
                return Err(errno);
            }
            let (reader, writer) = std::io::pipe().map_err(|_| Errno(libc::EMFILE))?;
            let probe = reader.try_clone().map_err(|_| Errno(libc::EMFILE))?;
            let fd = OwnedFd::from(writer);
            // Ids neither start at 0 nor follow the open order's position.
            let id = 1000 + 37 * (st.fds.len() as u64 % 3) + 100 * st.fds.len() as u64;
            let page = st.pages.as_ref().map(|p| (p.0)());
            st.fds.push(Fd { raw: fd.as_raw_fd(), id, reader: Some(reader), probe, page });
            Ok(fd)
        }

        fn ioctl(&self, _fd: BorrowedFd<'_>, op: Ioctl) -> Result<(), Errno> {
            let mut st = self.state();
            st.ioctls.push(op);
            st.ioctl_errors.pop_front().map_or(Ok(()), Err)
        }

        fn event_id(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
            let mut st = self.state();
            if let Some(e) = st.id_errors.pop_front() {
                return Err(e);
            }
            let raw = fd.as_raw_fd();
            st.fds.iter().rev().find(|f| f.raw == raw).map(|f| f.id).ok_or(Errno(libc::EBADF))
        }

        fn read(&self, _fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
            let mut st = self.state();
            st.read_calls += 1;
            let data = st.reads.pop_front().or_else(|| st.steady_read.clone()).ok_or(Errno(libc::EAGAIN))?;
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            Ok(n)
        }

        fn mmap(&self, fd: BorrowedFd<'_>, _len: usize) -> Result<Mapping, Errno> {
            let st = self.state();
            let raw = fd.as_raw_fd();
            let open = st.fds.iter().rev().find(|f| f.raw == raw).ok_or(Errno(libc::EBADF))?;
            open.page.clone().map(Mapping::from_image).ok_or(Errno(libc::ENODEV))
        }

        /// Heap memory stands in for the ring, its control page filled as
        /// the kernel fills it.
        fn mmap_ring(&self, _fd: BorrowedFd<'_>, len: usize) -> Result<NonNull<u8>, Errno> {
            let page = page_size();
            let layout = Layout::from_size_align(len, page).map_err(|_| Errno(libc::EINVAL))?;
            if len <= page {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: a layout of non-zero size (len > page).
            let p = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Errno(libc::ENOMEM))?;
            // SAFETY: both words lie in the control page of the fresh allocation, 8-aligned.
            unsafe {
                p.as_ptr()
                    .add(offset_of!(perf_event_mmap_page, data_offset))
                    .cast::<u64>()
                    .write(page as u64);
                p.as_ptr()
                    .add(offset_of!(perf_event_mmap_page, data_size))
                    .cast::<u64>()
                    .write((len - page) as u64);
            }
            self.state().rings.push((p.as_ptr() as usize, len));
            Ok(p)
        }

        unsafe fn munmap_ring(&self, ptr: NonNull<u8>, len: usize) -> Result<(), Errno> {
            let mut st = self.state();
            let i = st
                .rings
                .iter()
                .position(|&m| m == (ptr.as_ptr() as usize, len))
                .ok_or(Errno(libc::EINVAL))?;
            st.rings.remove(i);
            // SAFETY: allocated in `mmap_ring` with this size and alignment.
            unsafe {
                dealloc(
                    ptr.as_ptr(),
                    Layout::from_size_align(len, page_size()).map_err(|_| Errno(libc::EINVAL))?,
                )
            };
            st.rings_unmapped += 1;
            Ok(())
        }
    }
}
