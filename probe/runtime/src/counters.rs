//! The counters probe: each thread's counter groups, laid out by the
//! counting core ([`papirus_counting::layout`]), opened when the thread
//! registers, and read at every hook by the core's
//! [`GroupReader`](papirus_counting::read::GroupReader): the task-clock from
//! its page and the TSC, a hardware counter by rdpmc, and a `read(2)` —
//! issued with a `syscall` instruction — only where the kernel requires one
//! (a software counter, a context switch to resync). Each hook adds the
//! core's estimate of the count since the thread's previous read
//! ([`Count::since`]) to the thread's totals (`cnow`), so an activation's
//! count is the sum of its intervals' estimates.
//!
//! The read path uses no vector register, calls no library and allocates
//! nothing, like the rest of the hooks (papirus' tests disassemble it). Only
//! the thread's registration (opening its events, registering its exit
//! handler) is ordinary Rust calling into libc; it runs once per thread
//! behind a save of the whole extended state ([`cold_call`]).
//!
//! # Safety
//!
//! [`cold_call`] gets the calling thread's own tables and a 64-byte aligned
//! XSAVE area (a zeroed mapping of at least CPUID.0xD's size). The
//! per-thread reader is a leaked `Box` owned by that thread only.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use papirus_counting::layout::{self, Term};
use papirus_counting::read::{GroupReader, decode_group, group_words};
use papirus_counting::{Count, EventAttr, Group, Target};
use papirus_probe_abi::CounterSetup;

use crate::state::{MAX_EVENTS, Thread, Word};
use crate::sys;

/// Events the counters probe reads on threads registered from now on.
pub(crate) static NEVENTS: AtomicUsize = AtomicUsize::new(0);
/// Their descriptions and the TSC's rate, fixed by the first set-up that names events.
pub(crate) static SETUP: OnceLock<CounterSetup> = OnceLock::new();

/// Saves the extended state, runs ordinary code for thread `t` (the
/// thread's registration: [`register_cold`]), restores the state: the
/// hooks' one door to code that may use vector registers and libc.
#[unsafe(naked)]
unsafe extern "C" fn cold_call(t: *const Thread, area: *mut u8) {
    core::arch::naked_asm!(
        // rdi = thread, rsi = XSAVE area. The trampolines call the hooks on
        // a stack of any alignment (the hooks are integer code); libc needs
        // the ABI's 16 bytes.
        "push rbx",
        "push r12",
        "push r13",
        "mov rbx, rdi",
        "mov r12, rsi",
        "mov r13, rsp",
        "and rsp, -16",
        "mov eax, -1",
        "mov edx, -1",
        "xsave64 [r12]",
        "mov rdi, rbx",
        "call {inner}",
        "mov eax, -1",
        "mov edx, -1",
        "xrstor64 [r12]",
        "mov rsp, r13",
        "pop r13",
        "pop r12",
        "pop rbx",
        "ret",
        inner = sym register_cold,
    )
}

/// The thread's registration proper: its exit handler and its counters.
extern "C" fn register_cold(t: *const Thread) {
    // SAFETY: the wrapper passes the calling thread's live tables.
    let t = unsafe { &*t };
    crate::state::register_thread_exit();
    if t.nevents.get() > 0 {
        // Opening the groups allocates and calls libc: the slot says so
        // ([`papirus_probe_abi::layout::slot::OUTSIDE`]), so the tool does
        // not end the session while this thread's PC may lie there.
        t.outside.set(1);
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        open(t);
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        t.outside.set(0);
    }
}

/// Registers the calling thread's exit handler and opens its counters
/// behind a save of the extended state (libc may use vector registers the
/// trampolines do not save). `false` when this CPU has no XSAVE (the slot is
/// then never recycled, and the thread reads no counters).
pub(crate) fn register(t: &Thread) -> bool {
    let Some(area) = xsave_area() else {
        t.nevents.set(0);
        return false;
    };
    // SAFETY: `t` is the calling thread's slot and `area` a zeroed,
    // page-aligned XSAVE area of this CPU's size; the door follows the C
    // ABI. Called by a `call` to its symbol, never through the GOT (a
    // Rust call to a naked function in another codegen unit goes through it).
    unsafe {
        core::arch::asm!("call {door}", door = sym cold_call, in("rdi") t, in("rsi") area, clobber_abi("C"));
    }
    sys::munmap(area, xsave_len());
    true
}

/// Address of the registration wrapper (for papirus' vector-state checks,
/// which stop there).
pub fn cold_call_address() -> u64 {
    cold_call as *const () as usize as u64
}

/// One group of the thread: its reader, the leader's descriptor, the
/// members' kernel ids and events, and its buffers.
#[derive(Debug)]
struct ThreadGroup {
    reader: GroupReader,
    fd: i32,
    ids: Vec<u64>,
    /// The event of each member.
    events: Vec<usize>,
    words: Vec<u64>,
    counts: Vec<Count>,
}

/// How a group's `read(2)` is issued: the runtime's own `syscall`
/// instruction ([`Syscall`]); a test passes its kernel's.
pub trait GroupRead {
    /// `read(2)` of descriptor `fd` into the bytes of `words`: the bytes
    /// read, or `-errno`.
    fn read(&self, fd: i32, words: &mut [u64]) -> i64;
}

/// `read(2)` by the runtime's `syscall` instruction: no libc.
#[derive(Clone, Copy, Debug, Default)]
pub struct Syscall;

impl GroupRead for Syscall {
    #[inline(always)]
    fn read(&self, fd: i32, words: &mut [u64]) -> i64 {
        sys::read(fd, words)
    }
}

/// A thread's counters: its groups, and each event's previous reading
/// (raw, enabled, running).
#[derive(Debug)]
pub struct Reader<R: GroupRead = Syscall> {
    groups: Vec<ThreadGroup>,
    last: [[AtomicU64; 3]; MAX_EVENTS],
    kernel: R,
    /// The descriptors, closed when the thread retires.
    _open: Vec<Group>,
}

/// One group's `read(2)`, decoded by the counting core.
#[inline(always)]
fn read_group(
    kernel: &impl GroupRead,
    fd: i32,
    ids: &[u64],
    words: &mut [u64],
    out: &mut [Count],
) -> Result<(), ()> {
    let n = kernel.read(fd, words);
    let got = words.get(..(n.max(0) as usize) / 8).ok_or(())?;
    if got.is_empty() {
        return Err(());
    }
    decode_group(got, ids, out).map_err(drop)
}

impl Reader {
    /// Opens `setup`'s events on the calling thread as the counting core
    /// lays them out, maps their pages and enables them.
    pub fn open(setup: &CounterSetup) -> Result<Reader, papirus_counting::Error> {
        Reader::open_with(papirus_counting::sys::kernel(), Syscall, setup)
    }
}

impl<R: GroupRead> Reader<R> {
    /// Like [`Reader::open`], through `sys`, its groups read by `kernel`.
    pub fn open_with(
        sys: std::sync::Arc<dyn papirus_counting::sys::Sys>,
        kernel: R,
        setup: &CounterSetup,
    ) -> Result<Reader<R>, papirus_counting::Error> {
        let events: Vec<&[EventAttr]> =
            setup.events.iter().take(MAX_EVENTS).map(std::slice::from_ref).collect();
        let mut groups = Vec::new();
        let mut open = Vec::new();
        for planned in layout::plan(&events, false) {
            let attrs: Vec<EventAttr> = planned.iter().map(|t| events[t.event][t.term].clone()).collect();
            let (leader, rest) = attrs.split_first().ok_or(papirus_counting::Error::Malformed {
                event: String::new(),
                reason: "an empty group".into(),
            })?;
            let mut g = Group::open_with(sys.clone(), leader, Target::ThisThread)?;
            for a in rest {
                g.add(a)?;
            }
            let reader = GroupReader::map(&*sys, &g, &attrs, setup.tsc);
            g.enable()?;
            groups.push(ThreadGroup {
                reader,
                fd: g.as_fd().as_raw_fd(),
                ids: g.members().map(|m| m.id()).collect(),
                events: planned.iter().map(|&Term { event, .. }| event).collect(),
                words: vec![0; group_words(attrs.len())],
                counts: vec![Count::ZERO; attrs.len()],
            });
            open.push(g);
        }
        let mut r = Reader { groups, last: Default::default(), kernel, _open: open };
        // The first reading is the base the first interval counts from.
        let discard: [AtomicU64; MAX_EVENTS] = Default::default();
        r.read(sys::rdtsc(), &discard);
        Ok(r)
    }

    /// Reads every group, with `now` the TSC just read, and adds each
    /// event's count since the previous read to `totals`. A group that
    /// cannot be read keeps its previous reading.
    #[inline(always)]
    pub fn read(&mut self, now: u64, totals: &[AtomicU64]) {
        let kernel = &self.kernel;
        for g in self.groups.iter_mut() {
            let ThreadGroup { reader, fd, ids, events, words, counts } = g;
            let fd = *fd;
            if reader.read(true, now, counts, |out| read_group(kernel, fd, ids, words, out)).is_err() {
                continue;
            }
            for (c, &e) in counts.iter().zip(events.iter()) {
                if let (Some([raw, enabled, running]), Some(total)) = (self.last.get(e), totals.get(e)) {
                    let c = c.load();
                    let last =
                        Count { raw: raw.get(), time_enabled: enabled.get(), time_running: running.get() };
                    total.add(c.since(&last).value);
                    raw.set(c.raw);
                    enabled.set(c.time_enabled);
                    running.set(c.time_running);
                }
            }
        }
    }
}

/// Opens the calling thread's reader (registration, behind [`cold_call`]).
fn open(t: &Thread) {
    let opened = match SETUP.get() {
        Some(setup) => Reader::open(setup),
        None => Err(papirus_counting::Error::Malformed {
            event: String::new(),
            reason: "no events were set up".into(),
        }),
    };
    match opened {
        Ok(r) => t.counters.set(Box::into_raw(Box::new(r)) as u64),
        Err(e) => {
            t.counters_errno.set(e.errno().map_or(u64::MAX, |n| n.0 as u64));
            t.nevents.set(0);
        }
    }
}

/// Adds the counts since the thread's previous read to `t.cnow`; `now` is
/// the TSC the hook just read. Out of line: inlined, its registers would
/// make every hook save callee-saved registers and spill, counters or not.
// extern "C", like the other out-of-line helpers, so hooks call it directly, not through the GOT.
#[inline(never)]
pub(crate) extern "C" fn read(t: &Thread, now: u64) {
    let p = t.counters.get() as *mut Reader;
    // SAFETY: the reader belongs to this thread alone (module docs); null
    // until registration opened it.
    let Some(r) = (unsafe { p.as_mut() }) else { return };
    r.read(now, &t.cnow);
}

/// Frees a retiring thread's reader (on its own thread), closing its events.
pub(crate) fn release(t: &Thread) {
    let p = t.counters.get() as *mut Reader;
    t.counters.set(0);
    t.nevents.set(0);
    if !p.is_null() {
        // SAFETY: the pointer came from Box::into_raw on this thread and is cleared above.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// A zeroed, page-aligned XSAVE area for this CPU, or `None` when the OS has
/// not enabled XSAVE.
fn xsave_area() -> Option<*mut u8> {
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
