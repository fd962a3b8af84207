//! The counters probe: per-thread counter groups read at every entry and
//! exit through papirus-substrate's user-space read path (mmap pages, rdpmc,
//! the TSC-extrapolated task clock; `read(2)` where no exact user-space path
//! exists, e.g. page faults).
//!
//! That code is ordinary Rust and may use vector registers and libc, which
//! the trampolines do not save. So it runs behind an assembly wrapper that
//! saves and restores the whole extended state (XSAVE, every component XCR0
//! enables) in a per-thread area around it. The wallclock and empty probes
//! never reach this code.
//!
//! # Safety
//!
//! The wrapper gets the calling thread's own tables and their 64-byte
//! aligned XSAVE area (a zeroed mapping of at least CPUID.0xD's size). The
//! per-thread reader state is a leaked `Box` owned by that thread only.
#![allow(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::AtomicUsize;

use papirus_substrate::{EventAttr, Target, fastread::MappedGroup};

use crate::state::{MAX_EVENTS, Thread, Word};
use crate::sys;

/// Events the counters probe reads on threads registered from now on.
pub(crate) static NEVENTS: AtomicUsize = AtomicUsize::new(0);
/// Their names and attributes, fixed by the first set-up that names events.
pub(crate) static EVENTS: OnceLock<(Vec<String>, Vec<EventAttr>)> = OnceLock::new();

/// Saves the extended state, runs ordinary code for thread `t` (`what`:
/// [`READ`] the counters into `t.cnow`, or [`REGISTER`] the thread's exit
/// handler, which calls into libc), restores the state. The hooks' one door
/// to code that may use vector registers. A naked function, so the hooks
/// call it directly (an exported or `global_asm!` symbol would be called
/// through the GOT).
#[unsafe(naked)]
unsafe extern "C" fn counters_read(t: *const Thread, area: *mut u8, what: u64) {
    core::arch::naked_asm!(
        // rdi = thread, rsi = XSAVE area, rdx = what
        "push rbx",
        "push r12",
        "push r13",
        "mov rbx, rdi",
        "mov r12, rsi",
        "mov r13, rdx",
        "mov eax, -1",
        "mov edx, -1",
        "xsave64 [r12]",
        "mov rdi, rbx",
        "mov rsi, r13",
        "call {inner}",
        "mov eax, -1",
        "mov edx, -1",
        "xrstor64 [r12]",
        "pop r13",
        "pop r12",
        "pop rbx",
        "ret",
        inner = sym cold_inner,
    )
}

/// [`counters_read`]: read the counters.
const READ: u64 = 0;
/// [`counters_read`]: register the thread's exit handler.
const REGISTER: u64 = 1;

extern "C" fn cold_inner(t: *const Thread, what: u64) {
    match what {
        READ => {
            // SAFETY: the wrapper passes the calling thread's live tables.
            let outside = unsafe { &(*t).outside };
            // The first read opens the group and allocates; reads without a
            // user-space path call read(2): in libc, then back to the slot.
            outside.set(1);
            core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
            read_inner(t);
            core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
            outside.set(0);
        }
        _ => crate::state::register_thread_exit(),
    }
}

/// Registers the calling thread's exit handler behind a save of the
/// extended state (libc may use vector registers the trampolines do not
/// save). `false` when this CPU has no XSAVE (the slot is then never recycled).
pub(crate) fn register_exit(t: &Thread) -> bool {
    let own = t.xsave.get() as *mut u8;
    let area = if own.is_null() { xsave_area() } else { Some(own) };
    let Some(area) = area else { return false };
    // SAFETY: `t` is the calling thread's slot and `area` a zeroed,
    // page-aligned XSAVE area of this CPU's size.
    unsafe { counters_read(t, area, REGISTER) };
    if own.is_null() {
        sys::munmap(area, xsave_len());
    }
    true
}

/// Address of the reader (for papirus' vector-state checks, which stop there).
pub fn reader() -> u64 {
    counters_read as *const () as usize as u64
}

/// Fills `t.cnow` with this thread's counter values.
#[inline(always)]
pub(crate) fn read(t: &Thread) {
    // SAFETY: `t` is the calling thread's tables and `xsave` its area (module docs).
    unsafe { counters_read(t, t.xsave.get() as *mut u8, READ) }
}

struct Reader {
    group: Option<MappedGroup>,
    scratch: Vec<papirus_substrate::Count>,
}

/// Frees a retiring thread's reader and XSAVE area (on its own thread).
pub(crate) fn release(t: &Thread) {
    let p = t.counters.get() as *mut Reader;
    t.counters.set(0);
    if !p.is_null() {
        // SAFETY: the pointer came from Box::into_raw on this thread and is cleared above.
        drop(unsafe { Box::from_raw(p) });
    }
    let area = t.xsave.get() as *mut u8;
    t.xsave.set(0);
    t.nevents.set(0);
    if !area.is_null() {
        sys::munmap(area, xsave_len());
    }
}

extern "C" fn read_inner(t: *const Thread) {
    // SAFETY: the wrapper passes the calling thread's live tables.
    let t = unsafe { &*t };
    let mut p = t.counters.get() as *mut Reader;
    if p.is_null() {
        let opened = match EVENTS.get() {
            Some((_, attrs)) => {
                MappedGroup::open(attrs, Target::ThisThread).and_then(|g| g.enable().map(|()| g))
            }
            None => Err(papirus_substrate::Error::Malformed {
                event: String::new(),
                reason: "no events were set up".into(),
            }),
        };
        let group = match opened {
            Ok(g) => Some(g),
            Err(e) => {
                t.counters_errno.set(e.errno().map_or(u64::MAX, |n| n.0 as u64));
                None
            }
        };
        p = Box::into_raw(Box::new(Reader { group, scratch: Vec::with_capacity(MAX_EVENTS) }));
        t.counters.set(p as u64);
    }
    // SAFETY: the reader state belongs to this thread alone.
    let r = unsafe { &mut *p };
    let Some(g) = &r.group else { return };
    if g.read_into(&mut r.scratch).is_ok() {
        for (w, c) in t.cnow.iter().zip(&r.scratch).take(t.nevents.get() as usize) {
            w.set(c.estimate().unwrap_or(0));
        }
    }
}

/// A zeroed, page-aligned XSAVE area for this CPU, or `None` when the OS has
/// not enabled XSAVE.
pub(crate) fn xsave_area() -> Option<*mut u8> {
    let leaf1 = core::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 27) == 0 {
        return None;
    }
    sys::mmap_zeroed(xsave_len())
}

/// Bytes of an XSAVE area for this CPU, whole pages.
fn xsave_len() -> usize {
    // Leaf 0xD exists when OSXSAVE is set (checked before any area exists).
    let size = core::arch::x86_64::__cpuid_count(0xd, 0).ebx as usize;
    size.max(4096).next_multiple_of(4096)
}
