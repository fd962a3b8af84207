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

    /// `read(2)` into the bytes of `words` (counter values are native-endian
    /// u64s), returning the number of bytes read.
    fn read_words(&self, fd: BorrowedFd<'_>, words: &mut [u64]) -> Result<usize, Errno> {
        let len = std::mem::size_of_val(words);
        // SAFETY: the bytes of a `[u64]` are valid `u8`s, and every bit
        // pattern the read leaves in them is a valid u64; the byte view lives
        // only for the call, while `words` is borrowed mutably.
        let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) };
        self.read(fd, bytes)
    }

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

/// The kernel thread id of the caller.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
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

/// A model of the kernel's perf interface for papirus' tests: events with
/// values the test sets per `(type, config)`, enabled and running times per
/// group, a PMU with a limited number of hardware counters, mmap pages the
/// test writes, sample rings in heap memory; reads may also be scripted
/// buffer by buffer, and failures injected per call. Descriptors are the
/// write ends of pipes, so a test sees them close.
#[cfg(any(test, feature = "testing"))]
pub mod mock {
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::collections::{HashMap, VecDeque};
    use std::io::PipeReader;
    use std::mem::offset_of;
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
    use std::ptr::NonNull;
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::pe::bindings::{self as b, perf_event_mmap_page};
    use super::{Errno, Ioctl, Sys, perf_event_attr};
    use crate::mmap::{Mapping, PageImage, page_size};

    /// What one successful `perf_event_open` asked for.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct OpenCall {
        /// The kernel id given to the event.
        pub id: u64,
        /// `type`
        pub type_: u32,
        /// `config`
        pub config: u64,
        /// `read_format`
        pub read_format: u64,
        /// The target pid.
        pub pid: i32,
        /// The target CPU.
        pub cpu: i32,
        /// The id of the group leader, if in a group.
        pub group: Option<u64>,
        /// The open flags.
        pub flags: u64,
        /// `disabled`
        pub disabled: bool,
        /// `exclude_user`
        pub exclude_user: bool,
        /// `exclude_kernel`
        pub exclude_kernel: bool,
        /// `exclude_hv`
        pub exclude_hv: bool,
        /// `inherit`
        pub inherit: bool,
        /// `pinned`
        pub pinned: bool,
        /// `sample_period` (0 for a counting event).
        pub sample_period: u64,
        /// `sample_type`
        pub sample_type: u64,
    }

    /// One successful open.
    #[derive(Debug)]
    struct Fd {
        raw: i32,
        call: OpenCall,
        /// The read end of the pipe, until a test takes it.
        reader: Option<PipeReader>,
        /// A second read end, to see the descriptor close.
        probe: PipeReader,
        /// The page `mmap` hands out for this descriptor.
        page: Option<Arc<PageImage>>,
    }

    impl Fd {
        fn live(&self) -> bool {
            !hung_up(self.probe.as_fd())
        }
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
        /// Opens of events with this config fail with this errno.
        fail_config: Option<(u64, Errno)>,
        /// Opens that count the kernel fail with EACCES (paranoid 2).
        refuse_kernel: bool,
        id_errors: VecDeque<Errno>,
        ioctl_errors: VecDeque<Errno>,
        reads: VecDeque<Vec<u8>>,
        /// What reads return once `reads` is empty (else the model's values).
        steady_read: Option<Vec<u8>>,
        read_calls: usize,
        /// Hardware counters of the PMU (`None`: unlimited).
        counters: Option<usize>,
        values: HashMap<(u32, u64), u64>,
        /// (enabled, running) per group leader id.
        times: HashMap<u64, (u64, u64)>,
        pages: Option<Pages>,
        /// (address, length) of each live ring `mmap_ring` handed out.
        rings: Vec<(usize, usize)>,
        rings_unmapped: usize,
        fds: Vec<Fd>,
        ioctls: Vec<Ioctl>,
    }

    impl State {
        fn fd(&self, fd: BorrowedFd<'_>) -> Result<&Fd, Errno> {
            let raw = fd.as_raw_fd();
            self.fds.iter().rev().find(|f| f.raw == raw && f.live()).ok_or(Errno(libc::EBADF))
        }

        /// The model's answer to a read of event `id`: its value with its
        /// group's times, or the whole group for a group read of its leader.
        fn model_read(&self, call: &OpenCall) -> Vec<u64> {
            let leader = call.group.unwrap_or(call.id);
            let members: Vec<&OpenCall> = self
                .fds
                .iter()
                .filter(|f| f.live() && (f.call.id == leader || f.call.group == Some(leader)))
                .map(|f| &f.call)
                .collect();
            let hardware = members.iter().filter(|c| is_hardware(c.type_)).count();
            let (enabled, mut running) = self.times.get(&leader).copied().unwrap_or((0, 0));
            if self.counters.is_some_and(|n| hardware > n) {
                if members.first().is_some_and(|l| l.pinned) {
                    // A pinned group that cannot be scheduled is in error state: EOF.
                    return vec![];
                }
                running = 0;
            }
            let value = |c: &OpenCall| self.values.get(&(c.type_, c.config)).copied().unwrap_or(0);
            if call.read_format & u64::from(b::PERF_FORMAT_GROUP) != 0 {
                let mut w = vec![members.len() as u64, enabled, running];
                for m in &members {
                    w.extend([value(m), m.id]);
                }
                w
            } else {
                vec![value(call), enabled, running, call.id]
            }
        }
    }

    fn is_hardware(type_: u32) -> bool {
        type_ == b::PERF_TYPE_HARDWARE || type_ == b::PERF_TYPE_HW_CACHE || type_ == b::PERF_TYPE_RAW
    }

    /// The model kernel.
    #[derive(Debug, Default)]
    pub struct MockSys(Mutex<State>);

    impl MockSys {
        /// A kernel with nothing scripted: opens succeed, values and times
        /// are 0, and the PMU has as many counters as asked for.
        pub fn new() -> Arc<MockSys> {
            Arc::new(MockSys::default())
        }
        /// A kernel whose PMU has `counters` hardware counters.
        pub fn with_counters(counters: usize) -> Arc<MockSys> {
            let k = MockSys::new();
            k.state().counters = Some(counters);
            k
        }
        fn state(&self) -> MutexGuard<'_, State> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        /// The next open fails with `errno`.
        pub fn fail_open(&self, errno: Errno) {
            self.state().open_errors.push_back((errno, None));
        }
        /// The next open fails with E2BIG, writing `size` into the attr.
        pub fn fail_open_e2big(&self, size: u32) {
            self.state().open_errors.push_back((Errno(libc::E2BIG), Some(size)));
        }
        /// Opens of events with `config` fail with `errno` (0: no longer).
        pub fn fail_open_config(&self, config: u64, errno: i32) {
            self.state().fail_config = (errno != 0).then_some((config, Errno(errno)));
        }
        /// Opens that count the kernel fail with EACCES, as at
        /// `perf_event_paranoid` 2 without CAP_PERFMON.
        pub fn refuse_kernel_domain(&self, on: bool) {
            self.state().refuse_kernel = on;
        }
        /// The next `PERF_EVENT_IOC_ID` fails.
        pub fn fail_event_id(&self, errno: Errno) {
            self.state().id_errors.push_back(errno);
        }
        /// The next other ioctl fails.
        pub fn fail_ioctl(&self, errno: Errno) {
            self.state().ioctl_errors.push_back(errno);
        }
        /// Every event whose `(type, config)` matches reads `v` from now on.
        pub fn set_value(&self, type_: u32, config: u64, v: u64) {
            self.state().values.insert((type_, config), v);
        }
        /// The group led by the `nth` live leader (in order of opening)
        /// reports these times.
        pub fn set_times_nth_group(&self, nth: usize, enabled: u64, running: u64) {
            let mut st = self.state();
            let id = st.fds.iter().filter(|f| f.live() && f.call.group.is_none()).nth(nth).map(|f| f.call.id);
            let id = id.expect("no such group");
            st.times.insert(id, (enabled, running));
        }
        /// Every group reports these times.
        pub fn set_times(&self, enabled: u64, running: u64) {
            let mut st = self.state();
            let leaders: Vec<u64> =
                st.fds.iter().filter(|f| f.call.group.is_none()).map(|f| f.call.id).collect();
            for id in leaders {
                st.times.insert(id, (enabled, running));
            }
        }
        /// Queues a read result made of u64 words (before the model's).
        pub fn push_read(&self, words: &[u64]) {
            self.push_bytes(words.iter().flat_map(|w| w.to_ne_bytes()).collect());
        }
        /// Queues a read result of raw bytes.
        pub fn push_bytes(&self, bytes: Vec<u8>) {
            self.state().reads.push_back(bytes);
        }
        /// Every read after the queued ones returns these u64 words.
        pub fn steady_read(&self, words: &[u64]) {
            self.state().steady_read = Some(words.iter().flat_map(|w| w.to_ne_bytes()).collect());
        }
        /// read(2) calls so far.
        pub fn read_calls(&self) -> usize {
            self.state().read_calls
        }
        /// Each later open gets a page from `make`, which `mmap` hands out
        /// (without, `mmap` fails with ENODEV as the trait's default).
        pub fn map_pages(&self, make: impl Fn() -> Arc<PageImage> + Send + 'static) {
            self.state().pages = Some(Pages(Box::new(make)));
        }
        /// A kernel whose every open maps this one page.
        pub fn with_page(image: &Arc<PageImage>) -> Arc<MockSys> {
            let k = MockSys::new();
            let image = image.clone();
            k.map_pages(move || image.clone());
            k
        }
        /// (address, length) of the newest live ring; the test writes into
        /// it as the kernel would.
        pub fn last_ring(&self) -> (*mut u8, usize) {
            let (addr, len) = *self.state().rings.last().expect("no ring mapped");
            (addr as *mut u8, len)
        }
        /// Rings mapped and not yet unmapped.
        pub fn live_rings(&self) -> usize {
            self.state().rings.len()
        }
        /// Rings unmapped so far.
        pub fn rings_unmapped(&self) -> usize {
            self.state().rings_unmapped
        }
        /// The page of the `n`-th successful open.
        pub fn page(&self, n: usize) -> Arc<PageImage> {
            self.state().fds[n].page.clone().expect("no page for this open")
        }
        /// Every successful open so far, closed ones included.
        pub fn opened(&self) -> Vec<OpenCall> {
            self.state().fds.iter().map(|f| f.call.clone()).collect()
        }
        /// The events open now.
        pub fn open_events(&self) -> Vec<OpenCall> {
            self.state().fds.iter().filter(|f| f.live()).map(|f| f.call.clone()).collect()
        }
        /// Every ioctl so far (IOC_ID aside).
        pub fn ioctls(&self) -> Vec<Ioctl> {
            self.state().ioctls.clone()
        }
        /// The kernel id given to the `n`-th successful open.
        pub fn id_of(&self, n: usize) -> u64 {
            self.state().fds[n].call.id
        }
        /// The read end of the pipe behind the `n`-th successful open.
        pub fn take_reader(&self, n: usize) -> PipeReader {
            let mut st = self.state();
            st.fds[n].reader.take().expect("reader already taken")
        }
        /// How many descriptors handed out are still open.
        pub fn live_fds(&self) -> usize {
            self.state().fds.iter().filter(|f| f.live()).count()
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
            if let Some((errno, size)) = st.open_errors.pop_front() {
                if let Some(size) = size {
                    attr.size = size;
                }
                return Err(errno);
            }
            if let Some((config, errno)) = st.fail_config
                && config == attr.config
            {
                return Err(errno);
            }
            if st.refuse_kernel && attr.exclude_kernel() == 0 {
                return Err(Errno(libc::EACCES));
            }
            let group = match group_fd {
                Some(g) => Some(st.fd(g)?.call.id),
                None => None,
            };
            let (reader, writer) = std::io::pipe().map_err(|_| Errno(libc::EMFILE))?;
            let probe = reader.try_clone().map_err(|_| Errno(libc::EMFILE))?;
            let fd = OwnedFd::from(writer);
            // Ids neither start at 0 nor follow the open order's position.
            let n = st.fds.len() as u64;
            let id = 1000 + 37 * (n % 3) + 100 * n;
            let call = OpenCall {
                id,
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
                pinned: attr.pinned() != 0,
                // SAFETY: both union members are a u64; either reads the same word.
                sample_period: unsafe { attr.__bindgen_anon_1.sample_period },
                sample_type: attr.sample_type,
            };
            let page = st.pages.as_ref().map(|p| (p.0)());
            st.fds.push(Fd { raw: fd.as_raw_fd(), call, reader: Some(reader), probe, page });
            Ok(fd)
        }

        fn ioctl(&self, fd: BorrowedFd<'_>, op: Ioctl) -> Result<(), Errno> {
            let mut st = self.state();
            st.fd(fd)?;
            st.ioctls.push(op);
            st.ioctl_errors.pop_front().map_or(Ok(()), Err)
        }

        fn event_id(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
            let mut st = self.state();
            if let Some(e) = st.id_errors.pop_front() {
                return Err(e);
            }
            st.fd(fd).map(|f| f.call.id)
        }

        fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
            let mut st = self.state();
            st.read_calls += 1;
            let data = match st.reads.pop_front().or_else(|| st.steady_read.clone()) {
                Some(d) => d,
                None => {
                    let call = st.fd(fd)?.call.clone();
                    st.model_read(&call).iter().flat_map(|w| w.to_ne_bytes()).collect()
                }
            };
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            Ok(n)
        }

        fn mmap(&self, fd: BorrowedFd<'_>, _len: usize) -> Result<Mapping, Errno> {
            let st = self.state();
            st.fd(fd)?.page.clone().map(Mapping::from_image).ok_or(Errno(libc::ENODEV))
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
