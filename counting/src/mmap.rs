//! Mapped perf event pages (`struct perf_event_mmap_page`) and their
//! seqlock reader: counts, `time_enabled`/`time_running` and the kernel's
//! TSC conversion without a system call.
//!
//! The reader follows the protocol documented in `linux/perf_event.h`:
//! load `lock`, load the fields (and `rdtsc`/`rdpmc` when the page allows),
//! load `lock` again and retry if it moved. [`Mapping`] owns either a real
//! `mmap(2)` of an event descriptor or a [`PageImage`] that tests write, so
//! the rdpmc and cap_user_time paths run on machines without them.
//!
//! # Safety
//!
//! A [`Mapping`] holds a pointer to at least one page that stays mapped (or
//! allocated) until the `Mapping` drops. Every access to it is an atomic load
//! or store of a naturally aligned field of `perf_event_mmap_page`, at the
//! width the kernel writes it, so concurrent kernel updates are not data
//! races in Rust's model; consistency across fields comes from the seqlock.
//! `rdpmc` is executed only when the caller vouches (via `own_thread`) that
//! the event counts the calling thread and the page allows it.
#![allow(unsafe_code)]

#[cfg(any(test, feature = "testing"))]
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
#[cfg(any(test, feature = "testing"))]
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU16, AtomicU32, AtomicU64, Ordering, fence};

use perf_event_open_sys::bindings::perf_event_mmap_page as RawPage;

use crate::arch;
use crate::sys::Errno;

/// A field of `perf_event_mmap_page`: its offset and the atomic type of its
/// width. Only the constants below exist, so every `Field` is naturally
/// aligned inside the first page (what the unsafe accessors rely on).
struct Field<A>(usize, PhantomData<A>);

const fn field<A>(off: usize) -> Field<A> {
    Field(off, PhantomData)
}

// The kernel's layout, pinned (STYLE 9): the loads below depend on it.
const LOCK: Field<AtomicU32> = field(offset_of!(RawPage, lock));
const INDEX: Field<AtomicU32> = field(offset_of!(RawPage, index));
const OFFSET: Field<AtomicI64> = field(offset_of!(RawPage, offset));
const ENABLED: Field<AtomicU64> = field(offset_of!(RawPage, time_enabled));
const RUNNING: Field<AtomicU64> = field(offset_of!(RawPage, time_running));
const CAPS: Field<AtomicU64> = field(offset_of!(RawPage, __bindgen_anon_1));
const PMC_WIDTH: Field<AtomicU16> = field(offset_of!(RawPage, pmc_width));
const TIME_SHIFT: Field<AtomicU16> = field(offset_of!(RawPage, time_shift));
const TIME_MULT: Field<AtomicU32> = field(offset_of!(RawPage, time_mult));
const TIME_OFFSET: Field<AtomicU64> = field(offset_of!(RawPage, time_offset));
const TIME_ZERO: Field<AtomicU64> = field(offset_of!(RawPage, time_zero));
const TIME_CYCLES: Field<AtomicU64> = field(offset_of!(RawPage, time_cycles));
const TIME_MASK: Field<AtomicU64> = field(offset_of!(RawPage, time_mask));
const _: () = {
    assert!(LOCK.0 == 8 && INDEX.0 == 12 && OFFSET.0 == 16);
    assert!(ENABLED.0 == 24 && RUNNING.0 == 32 && CAPS.0 == 40);
    assert!(PMC_WIDTH.0 == 48 && TIME_SHIFT.0 == 50 && TIME_MULT.0 == 52);
    assert!(TIME_OFFSET.0 == 56 && TIME_ZERO.0 == 64);
    assert!(TIME_CYCLES.0 == 80 && TIME_MASK.0 == 88);
    assert!(std::mem::size_of::<RawPage>() <= 4096);
};

/// The field `f` of the page at `base`, as the atomic the kernel writes.
///
/// # Safety
///
/// `base` points to a page-aligned page that stays mapped (or allocated)
/// for `'a` and is accessed only atomically.
#[inline(always)]
unsafe fn at<'a, A>(base: NonNull<u8>, f: Field<A>) -> &'a A {
    // SAFETY: `f` is one of the constants above: inside the first page and
    // aligned for `A` (an atomic of the field's width); the caller vouches
    // for the page's lifetime and atomic-only access. `as_ref`, not `&*`:
    // a dereference written here would carry a debug build's alignment
    // check, a call the probe runtime's hot path must not contain.
    unsafe { base.add(f.0).cast::<A>().as_ref() }
}

// Capability bits of `capabilities` (cap_bit0 is bit 0, deprecated).
const CAP_BIT0_IS_DEPRECATED: u64 = 1 << 1;
const CAP_USER_RDPMC: u64 = 1 << 2;
const CAP_USER_TIME: u64 = 1 << 3;
const CAP_USER_TIME_ZERO: u64 = 1 << 4;
const CAP_USER_TIME_SHORT: u64 = 1 << 5;

/// How often the seqlock reader retries before giving up. A kernel update
/// takes nanoseconds; only a page that stays odd or keeps moving reaches this.
pub const MAX_SEQLOCK_RETRIES: u32 = 1000;

/// What a page says it offers, decoded from `capabilities`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Caps {
    /// `rdpmc` may read the counter (`index - 1`) from user space.
    pub user_rdpmc: bool,
    /// `time_mult`/`time_shift`/`time_offset` convert TSC deltas to perf time.
    pub user_time: bool,
    /// `time_zero` converts absolute TSC values to perf timestamps.
    pub user_time_zero: bool,
    /// `time_cycles`/`time_mask` correct for a TSC narrower than 64 bits.
    pub user_time_short: bool,
}

impl Caps {
    /// Decodes the `capabilities` word. Pages too old to set
    /// `cap_bit0_is_deprecated` are read as offering nothing, as the header
    /// tells readers to do.
    #[inline]
    pub fn from_bits(bits: u64) -> Self {
        if bits & CAP_BIT0_IS_DEPRECATED == 0 {
            return Caps::default();
        }
        Caps {
            user_rdpmc: bits & CAP_USER_RDPMC != 0,
            user_time: bits & CAP_USER_TIME != 0,
            user_time_zero: bits & CAP_USER_TIME_ZERO != 0,
            user_time_short: bits & CAP_USER_TIME_SHORT != 0,
        }
    }

    /// The `capabilities` word for these bits (with `cap_bit0_is_deprecated`).
    pub fn to_bits(self) -> u64 {
        CAP_BIT0_IS_DEPRECATED
            | if self.user_rdpmc { CAP_USER_RDPMC } else { 0 }
            | if self.user_time { CAP_USER_TIME } else { 0 }
            | if self.user_time_zero { CAP_USER_TIME_ZERO } else { 0 }
            | if self.user_time_short { CAP_USER_TIME_SHORT } else { 0 }
    }
}

/// The kernel's TSC-to-perf-time conversion as a page publishes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TimeConv {
    /// `time_shift`
    pub shift: u16,
    /// `time_mult`
    pub mult: u32,
    /// `time_offset`: added to a converted TSC value, gives the time since
    /// the page's `time_enabled`/`time_running` were written.
    pub offset: u64,
    /// `time_zero`: added to a converted TSC value, gives a perf timestamp.
    pub zero: u64,
    /// `time_cycles` (cap_user_time_short): the TSC value the short counter is relative to.
    pub cycles: u64,
    /// `time_mask` (cap_user_time_short): the width of the short counter.
    pub mask: u64,
    /// Whether `cycles`/`mask` apply.
    pub short: bool,
}

/// `(cyc * mult) >> shift` without overflow: the kernel's `quot * mult +
/// ((rem * mult) >> shift)` computed exactly in 128 bits. A shift the kernel
/// would never publish (≥ 128) saturates to 127 rather than panicking.
#[inline(always)]
pub fn mul_shift(cyc: u64, mult: u64, shift: u32) -> u64 {
    ((u128::from(cyc) * u128::from(mult)) >> shift.min(127)) as u64
}

impl TimeConv {
    /// The TSC value with the cap_user_time_short wrap correction applied.
    #[inline(always)]
    pub fn extend(&self, cyc: u64) -> u64 {
        if self.short { self.cycles.wrapping_add(cyc.wrapping_sub(self.cycles) & self.mask) } else { cyc }
    }

    /// Nanoseconds since the page's times were written, at TSC value `cyc`.
    #[inline(always)]
    pub fn delta_ns(&self, cyc: u64) -> u64 {
        self.offset.wrapping_add(mul_shift(self.extend(cyc), u64::from(self.mult), u32::from(self.shift)))
    }

    /// The perf timestamp (the kernel's `perf_clock()`, ns) at TSC value `cyc`.
    #[inline(always)]
    pub fn timestamp_ns(&self, cyc: u64) -> u64 {
        self.zero.wrapping_add(mul_shift(cyc, u64::from(self.mult), u32::from(self.shift)))
    }
}

/// Sign-extends a `width`-bit counter value (the page's `pmc_width`). A width
/// of 0 or above 64 leaves the value as is.
#[inline(always)]
pub fn sign_extend(raw: u64, width: u16) -> i64 {
    if width == 0 || width >= 64 {
        return raw as i64;
    }
    let sh = 64 - u32::from(width);
    ((raw << sh) as i64) >> sh
}

/// Where the page reader gets its TSC and PMC values: the CPU itself, or a
/// test double that also plays the kernel (bumping `lock` mid-read).
pub trait Cpu {
    /// The TSC.
    fn rdtsc(&self) -> u64;
    /// Counter `counter` (`index - 1`).
    ///
    /// # Safety
    ///
    /// As [`arch::rdpmc`]: only for the calling thread's own event whose page
    /// says `cap_user_rdpmc` and `index = counter + 1`.
    unsafe fn rdpmc(&self, counter: u32) -> u64;
}

/// The CPU papirus runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeCpu;

impl Cpu for NativeCpu {
    #[inline(always)]
    fn rdtsc(&self) -> u64 {
        arch::rdtsc()
    }
    #[inline(always)]
    unsafe fn rdpmc(&self, counter: u32) -> u64 {
        // SAFETY: forwarded contract of `Cpu::rdpmc`.
        unsafe { arch::rdpmc(counter) }
    }
}

/// One consistent reading of a page, with the times extrapolated to now
/// where the page allows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRead {
    /// The `lock` sequence the values belong to.
    pub seq: u32,
    /// `index`: the hardware counter + 1, or 0 when none can be read.
    pub index: u32,
    /// `offset` plus the sign-extended `rdpmc` value when `pmc` is set.
    pub count: i64,
    /// Whether `rdpmc` was executed, i.e. `count` is the live count.
    pub pmc: bool,
    /// `time_enabled`, plus the time since the update when `extrapolated`.
    pub enabled: u64,
    /// `time_running`, extrapolated only when the event is on a counter (`index != 0`).
    pub running: u64,
    /// Nanoseconds since the kernel wrote the page, when cap_user_time gives it.
    pub since_update: Option<u64>,
    /// What the page offered.
    pub caps: Caps,
    /// The conversion read in the same critical section (all 0 without cap_user_time).
    pub conv: TimeConv,
    /// How many times the seqlock made the reader start over.
    pub retries: u32,
}

enum Backing {
    /// A live `mmap(2)` of `len` bytes, unmapped on drop.
    Kernel { len: usize },
    /// A test image, kept alive by this handle.
    #[cfg(any(test, feature = "testing"))]
    Image { _image: Arc<PageImage> },
}

/// An event's mapped metadata page.
pub struct Mapping {
    base: NonNull<u8>,
    backing: Backing,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics;
// nothing in it is tied to the thread that created it.
unsafe impl Send for Mapping {}
// SAFETY: as above; all reads are atomic loads.
unsafe impl Sync for Mapping {}

// Both are shared with other threads (a group's pages, a test's writer).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Mapping>();
    #[cfg(any(test, feature = "testing"))]
    send_sync::<PageImage>();
};

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.backing {
            Backing::Kernel { len } => format!("mmap({len})"),
            #[cfg(any(test, feature = "testing"))]
            Backing::Image { .. } => "image".to_string(),
        };
        f.debug_struct("Mapping").field("base", &self.base).field("backing", &kind).finish()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: `base`/`len` are exactly what mmap returned, and no
            // reference into the mapping outlives `self`. munmap only fails
            // for bad arguments, which these are not; nothing to report.
            Backing::Kernel { len } => unsafe {
                libc::munmap(self.base.as_ptr().cast(), len);
            },
            #[cfg(any(test, feature = "testing"))]
            Backing::Image { .. } => {}
        }
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

impl Mapping {
    /// `mmap(2)` of the first `len` bytes of perf event descriptor `fd`,
    /// read-only and shared: the metadata page (and, for `len` > one page, the
    /// ring buffer). `len` is rounded up to whole pages.
    pub fn map_fd(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, Errno> {
        let ps = page_size();
        let len = len.max(1).div_ceil(ps) * ps;
        // SAFETY: a fresh shared read-only mapping chosen by the kernel; it
        // aliases no Rust object, and the fd is live for the call.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or(Errno(libc::EFAULT))?;
        Ok(Mapping { base, backing: Backing::Kernel { len } })
    }

    /// A mapping of a test image (what a test's `Sys::mmap` returns).
    #[cfg(any(test, feature = "testing"))]
    pub fn from_image(image: Arc<PageImage>) -> Mapping {
        let base = NonNull::from(&image.words).cast::<u8>();
        Mapping { base, backing: Backing::Image { _image: image } }
    }

    #[inline(always)]
    fn at<A>(&self, f: Field<A>) -> &A {
        // SAFETY: the page lives as long as `self`; see the module's Safety section.
        unsafe { at(self.base, f) }
    }

    /// The page's `lock` sequence. It moves by 2 at every kernel update:
    /// for a per-thread event, at every context switch of the thread and on
    /// enable/disable/reset ioctls, but not on `read(2)`.
    // ATOMICS: Acquire, so that loads after it in program order (another
    // lock load in a seqlock check) are not satisfied before it.
    #[inline(always)]
    pub fn lock(&self) -> u32 {
        self.at(LOCK).load(Ordering::Acquire)
    }

    /// The capabilities the page currently claims (outside the seqlock:
    /// use for decisions that a later [`read`](Self::read) confirms).
    pub fn caps(&self) -> Caps {
        Caps::from_bits(self.at(CAPS).load(Ordering::Relaxed))
    }

    /// Reads the page consistently following `linux/perf_event.h`. `rdpmc`
    /// runs only when `own_thread` (the event counts the calling thread, on
    /// any CPU, not inherited) and the page says `cap_user_rdpmc` with a
    /// non-zero `index`. Returns `None` after [`MAX_SEQLOCK_RETRIES`].
    #[inline]
    pub fn read<C: Cpu>(&self, cpu: &C, own_thread: bool) -> Option<PageRead> {
        for retries in 0..MAX_SEQLOCK_RETRIES {
            // ATOMICS: the kernel bumps `lock`, issues a write barrier,
            // writes the fields, a barrier, bumps `lock` again. The Acquire
            // load of `lock` orders the Relaxed field loads after it; the
            // Acquire fence before the second `lock` load orders the field
            // loads before it (the standard seqlock reader). An odd `lock`
            // means an update is in progress, seen only by a reader on
            // another CPU.
            let seq = self.lock();
            if seq & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let mut enabled = self.at(ENABLED).load(Ordering::Relaxed);
            let mut running = self.at(RUNNING).load(Ordering::Relaxed);
            let caps = Caps::from_bits(self.at(CAPS).load(Ordering::Relaxed));
            let mut conv = TimeConv::default();
            let mut cyc = 0;
            if caps.user_time {
                cyc = cpu.rdtsc();
                conv.shift = self.at(TIME_SHIFT).load(Ordering::Relaxed);
                conv.mult = self.at(TIME_MULT).load(Ordering::Relaxed);
                conv.offset = self.at(TIME_OFFSET).load(Ordering::Relaxed);
                if caps.user_time_zero {
                    conv.zero = self.at(TIME_ZERO).load(Ordering::Relaxed);
                }
                if caps.user_time_short {
                    conv.short = true;
                    conv.cycles = self.at(TIME_CYCLES).load(Ordering::Relaxed);
                    conv.mask = self.at(TIME_MASK).load(Ordering::Relaxed);
                }
            }
            let index = self.at(INDEX).load(Ordering::Relaxed);
            let mut count = self.at(OFFSET).load(Ordering::Relaxed);
            let pmc = own_thread && caps.user_rdpmc && index != 0;
            if pmc {
                let width = self.at(PMC_WIDTH).load(Ordering::Relaxed);
                // SAFETY: the event counts the calling thread (`own_thread`),
                // and inside this critical section the page says rdpmc is
                // enabled with counter `index - 1`; if the kernel moved the
                // event meanwhile, the lock check below discards the value.
                let raw = unsafe { cpu.rdpmc(index - 1) };
                count = count.wrapping_add(sign_extend(raw, width));
            }
            fence(Ordering::Acquire);
            if self.at(LOCK).load(Ordering::Relaxed) != seq {
                continue;
            }
            let since_update = caps.user_time.then(|| conv.delta_ns(cyc));
            if let Some(d) = since_update {
                enabled = enabled.wrapping_add(d);
                if index != 0 {
                    running = running.wrapping_add(d);
                }
            }
            return Some(PageRead {
                seq,
                index,
                count,
                pmc,
                enabled,
                running,
                since_update,
                caps,
                conv,
                retries,
            });
        }
        None
    }
}

/// A page-aligned, writable image of a `perf_event_mmap_page`, for tests of
/// the reader (here and in the layers above) through the syscall seam: a
/// test's `Sys::mmap` returns `Mapping::from_image`, and the test plays the
/// kernel with the setters. Stores are atomic, so a test may write from
/// another thread while a reader runs.
#[cfg(any(test, feature = "testing"))]
#[repr(C, align(4096))]
pub struct PageImage {
    words: UnsafeCell<[u64; 512]>,
}

// SAFETY: every access to `words` is an atomic load or store (see `Mapping`).
#[cfg(any(test, feature = "testing"))]
unsafe impl Sync for PageImage {}

#[cfg(any(test, feature = "testing"))]
impl std::fmt::Debug for PageImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageImage").finish_non_exhaustive()
    }
}

#[cfg(any(test, feature = "testing"))]
impl Default for PageImage {
    fn default() -> Self {
        PageImage { words: UnsafeCell::new([0; 512]) }
    }
}

#[cfg(any(test, feature = "testing"))]
impl PageImage {
    /// A zeroed page with `cap_bit0_is_deprecated` set, as a kernel with no
    /// user-space capabilities presents it.
    pub fn new() -> Arc<PageImage> {
        let p = Arc::new(PageImage::default());
        p.set_caps(Caps::default());
        p
    }

    /// A page with `cap_user_time` whose conversion (1 ns per tick) puts
    /// the kernel's last update at the current TSC, and these times; the
    /// test bumps the lock when it has set the rest.
    pub fn user_time_now(enabled: u64, running: u64) -> Arc<PageImage> {
        let p = PageImage::new();
        p.set_caps(Caps { user_time: true, ..Caps::default() });
        let now = arch::rdtsc();
        p.set_time_conv(TimeConv {
            shift: 0,
            mult: 1,
            offset: 0u64.wrapping_sub(now),
            ..TimeConv::default()
        });
        p.set_times(enabled, running);
        p
    }

    // ATOMICS (all setters): Release, so a reader that sees a later `lock`
    // (Acquire) sees these fields; the seqlock, not the ordering, makes a
    // multi-field update appear atomic.
    fn at<A>(&self, f: Field<A>) -> &A {
        // SAFETY: the image is one page-aligned page owned by `self`, whose
        // words are accessed only atomically.
        unsafe { at(NonNull::from(&self.words).cast(), f) }
    }

    /// Adds `n` to `lock` (2 for a complete update; 1 to leave it odd,
    /// as while the kernel is writing).
    pub fn bump_lock(&self, n: u32) {
        self.at(LOCK).fetch_add(n, Ordering::AcqRel);
    }
    /// Sets `capabilities`.
    pub fn set_caps(&self, caps: Caps) {
        self.at(CAPS).store(caps.to_bits(), Ordering::Release);
    }
    /// Sets `index` (counter + 1, 0 for none).
    pub fn set_index(&self, index: u32) {
        self.at(INDEX).store(index, Ordering::Release);
    }
    /// Sets `offset`.
    pub fn set_offset(&self, offset: i64) {
        self.at(OFFSET).store(offset, Ordering::Release);
    }
    /// Sets `time_enabled` and `time_running`.
    pub fn set_times(&self, enabled: u64, running: u64) {
        self.at(ENABLED).store(enabled, Ordering::Release);
        self.at(RUNNING).store(running, Ordering::Release);
    }
    /// Sets `pmc_width`.
    pub fn set_pmc_width(&self, width: u16) {
        self.at(PMC_WIDTH).store(width, Ordering::Release);
    }
    /// Sets the time conversion fields (`time_shift`, `time_mult`,
    /// `time_offset`, `time_zero`, `time_cycles`, `time_mask`).
    pub fn set_time_conv(&self, c: TimeConv) {
        self.at(TIME_SHIFT).store(c.shift, Ordering::Release);
        self.at(TIME_MULT).store(c.mult, Ordering::Release);
        self.at(TIME_OFFSET).store(c.offset, Ordering::Release);
        self.at(TIME_ZERO).store(c.zero, Ordering::Release);
        self.at(TIME_CYCLES).store(c.cycles, Ordering::Release);
        self.at(TIME_MASK).store(c.mask, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A CPU whose TSC and PMC the test sets, and which can play a kernel
    /// writer the first time the reader executes rdtsc or rdpmc.
    struct FakeCpu<'a> {
        tsc: u64,
        pmc: u64,
        pmc_asked: Cell<Option<u32>>,
        /// Runs once, inside the reader's critical section.
        writer: Cell<Option<Box<dyn FnOnce() + 'a>>>,
    }

    impl<'a> FakeCpu<'a> {
        fn new(tsc: u64, pmc: u64) -> Self {
            FakeCpu { tsc, pmc, pmc_asked: Cell::new(None), writer: Cell::new(None) }
        }
        fn with_writer(mut self, w: impl FnOnce() + 'a) -> Self {
            self.writer = Cell::new(Some(Box::new(w)));
            self
        }
        fn fire(&self) {
            if let Some(w) = self.writer.take() {
                w();
            }
        }
    }

    impl Cpu for FakeCpu<'_> {
        fn rdtsc(&self) -> u64 {
            self.fire();
            self.tsc
        }
        unsafe fn rdpmc(&self, counter: u32) -> u64 {
            self.fire();
            self.pmc_asked.set(Some(counter));
            self.pmc
        }
    }

    fn rdpmc_page(index: u32, width: u16, offset: i64) -> Arc<PageImage> {
        let p = PageImage::new();
        p.set_caps(Caps { user_rdpmc: true, ..Caps::default() });
        p.set_index(index);
        p.set_pmc_width(width);
        p.set_offset(offset);
        p.bump_lock(2);
        p
    }

    #[test]
    fn rdpmc_value_is_sign_extended_to_pmc_width_and_added_to_offset() {
        // A 48-bit counter started at -1000 (the kernel programs -period):
        // raw bits 0xFFFF_FFFF_FC18 are -1000, plus an offset of 5000.
        let img = rdpmc_page(3, 48, 5000);
        let m = Mapping::from_image(img);
        let cpu = FakeCpu::new(0, 0xFFFF_FFFF_FC18);
        let r = m.read(&cpu, true).expect("stable page");
        assert!(r.pmc);
        assert_eq!(cpu.pmc_asked.get(), Some(2), "rdpmc takes index - 1");
        assert_eq!(r.count, 4000);
        // A positive value keeps its magnitude; bits above the width are dropped.
        let cpu = FakeCpu::new(0, 0xABCD_0000_0000_1234);
        assert_eq!(m.read(&cpu, true).unwrap().count, 5000 + 0x1234);
        assert_eq!(sign_extend(0x8000_0000_0000, 48), -(1 << 47));
        assert_eq!(sign_extend(u64::MAX, 0), -1);
        assert_eq!(sign_extend(0x7F, 8), 127);
        assert_eq!(sign_extend(0x80, 8), -128);
    }

    #[test]
    fn no_rdpmc_for_other_threads_or_without_capability_or_index() {
        let img = rdpmc_page(1, 48, 77);
        let m = Mapping::from_image(img.clone());
        let cpu = FakeCpu::new(0, 1);
        let r = m.read(&cpu, false).unwrap();
        assert!(!r.pmc && cpu.pmc_asked.get().is_none());
        assert_eq!(r.count, 77, "the stale offset only");
        img.set_index(0);
        let r = m.read(&cpu, true).unwrap();
        assert!(!r.pmc && cpu.pmc_asked.get().is_none());
        img.set_index(1);
        img.set_caps(Caps::default());
        assert!(!m.read(&cpu, true).unwrap().pmc);
        // A page without cap_bit0_is_deprecated offers nothing.
        assert_eq!(Caps::from_bits(CAP_USER_RDPMC | CAP_USER_TIME), Caps::default());
    }

    #[test]
    fn seqlock_retries_when_the_kernel_updates_mid_read() {
        let img = rdpmc_page(1, 48, 100);
        let m = Mapping::from_image(img.clone());
        // The "kernel" reschedules the event while the reader is between
        // its two lock loads: new offset, lock moved by 2.
        let cpu = FakeCpu::new(0, 10).with_writer(|| {
            img.bump_lock(1);
            img.set_offset(900);
            img.bump_lock(1);
        });
        let r = m.read(&cpu, true).unwrap();
        assert_eq!(r.retries, 1);
        assert_eq!(r.count, 910, "the value after the update, never a mix");
        assert_eq!(r.seq, 4);
    }

    #[test]
    fn seqlock_gives_up_on_a_page_stuck_mid_update() {
        let img = PageImage::new();
        img.bump_lock(1);
        let m = Mapping::from_image(img);
        assert_eq!(m.read(&NativeCpu, false), None);
    }

    #[test]
    fn cap_user_time_extrapolates_enabled_and_running_with_mult_shift_offset() {
        let img = PageImage::new();
        img.set_caps(Caps { user_time: true, user_time_zero: true, ..Caps::default() });
        // 2.5 GHz TSC: 0.4 ns per cycle = mult / 2^shift with shift 10, mult 410 (≈0.4004).
        let conv =
            TimeConv { shift: 10, mult: 410, offset: (-1000i64) as u64, zero: 7_000, ..TimeConv::default() };
        img.set_time_conv(conv);
        img.set_times(50_000, 40_000);
        img.set_index(0);
        img.bump_lock(2);
        let m = Mapping::from_image(img.clone());
        let cyc = 1_000_000u64;
        let r = m.read(&FakeCpu::new(cyc, 0), true).unwrap();
        let scaled = (cyc >> 10) * 410 + (((cyc & 1023) * 410) >> 10);
        assert_eq!(scaled, 400_390);
        assert_eq!(r.since_update, Some(scaled - 1000));
        assert_eq!(r.enabled, 50_000 + scaled - 1000);
        assert_eq!(r.running, 40_000, "index 0: not running on a counter, not extrapolated");
        assert_eq!(r.conv.timestamp_ns(cyc), 7_000 + scaled);
        // With a counter, running moves too.
        img.set_index(2);
        img.bump_lock(2);
        let r = m.read(&FakeCpu::new(cyc, 0), false).unwrap();
        assert_eq!(r.running, 40_000 + scaled - 1000);
        // The 128-bit product equals the kernel's quot/rem split for large values.
        let (c, mu, sh) = (u64::MAX / 3, 0xFFFF_FFFFu64, 31u32);
        let split = (c >> sh).wrapping_mul(mu).wrapping_add(((c & ((1 << sh) - 1)) * mu) >> sh);
        assert_eq!(mul_shift(c, mu, sh), split);
        assert_eq!(mul_shift(5, 3, 200), 0, "absurd shift saturates, no panic");
    }

    #[test]
    fn cap_user_time_short_wraps_the_cycle_count() {
        let img = PageImage::new();
        img.set_caps(Caps { user_time: true, user_time_short: true, ..Caps::default() });
        // A 32-bit counter that wrapped since time_cycles: raw 0x10 is
        // 0x1_0000_0010 when time_cycles is 0xFFFF_FF00.
        let conv = TimeConv {
            shift: 0,
            mult: 1,
            offset: 0,
            cycles: 0xFFFF_FF00,
            mask: 0xFFFF_FFFF,
            ..TimeConv::default()
        };
        img.set_time_conv(conv);
        img.bump_lock(2);
        let m = Mapping::from_image(img);
        let r = m.read(&FakeCpu::new(0x10, 0), false).unwrap();
        assert!(r.conv.short);
        assert_eq!(r.conv.extend(0x10), 0x1_0000_0010);
        assert_eq!(r.since_update, Some(0x1_0000_0010));
    }

    #[test]
    fn real_task_clock_page_maps_and_reads() {
        use crate::attr::{EventAttr, Kind, consts::PERF_TYPE_SOFTWARE};
        use crate::sys::{Kernel, Sys};
        let mut attr = EventAttr::new("task-clock", Kind::Software, PERF_TYPE_SOFTWARE, 1).to_raw();
        // Enabled, so the page describes a running event.
        attr.set_disabled(0);
        let fd = match Kernel.perf_event_open(&mut attr, 0, -1, None, 0) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("perf_event_open(task-clock) refused here: {e}; skipping");
                return;
            }
        };
        use std::os::fd::AsFd;
        let m = Kernel.mmap(fd.as_fd(), page_size()).expect("mmap of a perf fd");
        let r = m.read(&NativeCpu, true).expect("stable page");
        assert_eq!(r.seq % 2, 0);
        assert_eq!(r.index, 0, "software events are never on a hardware counter");
        assert!(!r.pmc);
    }
}
