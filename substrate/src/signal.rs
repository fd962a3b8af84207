//! Overflow notification by a real-time signal to the thread that owns the
//! event.
//!
//! [`Notifier::attach`] routes a [`Sampler`]'s wakeups to one thread:
//! `F_SETOWN_EX`/`F_OWNER_TID` (that thread only, never another thread of
//! the process), `F_SETSIG` with a real-time signal (queued, one per
//! wakeup, and carrying the descriptor in `si_fd`), then `O_ASYNC`. The
//! process-wide handler finds the registration by `si_fd`, drains the whole
//! ring and calls the user's callback once per record, on the owning thread.
//!
//! # Re-arming
//!
//! PAPI stops the event in its handler and re-arms it with
//! `PERF_EVENT_IOC_REFRESH`; issued from a hrtimer-driven event
//! (task-clock, cpu-clock) that path deadlocked kernels 6.16 and 6.17.
//! papirus never disables nor refreshes: the event samples by plain period
//! with `wakeup_events = 1` and no `event_limit`, so the kernel keeps
//! counting and every sample raises one signal. The handler only reads the
//! ring and stores `data_tail`; it makes no system call. Samples that arrive
//! while a handler runs are picked up by the same drain or the next signal,
//! and a ring that fills up produces LOST records that are counted.
//!
//! # Which signal
//!
//! The default is `SIGRTMAX - 3` ([`default_signal`]). The low real-time
//! numbers are the crowded ones: glibc hides two below `SIGRTMIN` for
//! thread cancellation and setxid, PAPI uses `SIGRTMIN + 2`, and runtimes and
//! libraries that want a private signal (Boehm GC's thread suspension,
//! POSIX timers set up with `SIGEV_SIGNAL`) count up from `SIGRTMIN`. Go
//! uses `SIGURG`, the JVM `SIGUSR2`/`SIGQUIT`. Any real-time signal can be
//! chosen with [`Notifier::attach`]; non-real-time signals are refused
//! because they do not queue and do not carry `si_fd` reliably.
//!
//! # What a callback may do
//!
//! It runs in signal context on the owning thread: it may read and write
//! memory it owns, use atomics and call async-signal-safe functions. It must
//! not allocate, take locks (a `Mutex` the interrupted code holds deadlocks),
//! print with `println!`, or detach its own notifier. Callbacks that need
//! more hand the record to a normal thread (the lowlevel crate's deferred
//! mode queues samples in a lock-free queue).
//!
//! # Safety
//!
//! The unsafe code installs the handler (`sigaction`), reads the kernel's
//! `siginfo_t`, reads `gettid`/`errno`, and dereferences registrations
//! published through atomics. A registration is freed only after it was
//! unpublished and no handler holds it (a busy count checked with SeqCst on
//! both sides); a callback runs only on the owning thread and signals of one
//! number do not nest, so it is never entered twice at once.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::error::{Error, Op, Result};
use crate::ring::{RingBuffer, RingStats};
use crate::sample::{ParseError, Record, Sampler, SamplingEvents};
use crate::sys::Fcntl;

/// The signal papirus routes overflows to unless told otherwise: `SIGRTMAX - 3`.
pub fn default_signal() -> i32 {
    libc::SIGRTMAX() - 3
}

/// The kernel thread id of the caller.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// How a record reached the callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The signal number.
    pub signal: i32,
    /// The event descriptor the signal named.
    pub fd: RawFd,
    /// The thread the handler runs on (the owner).
    pub tid: i32,
    /// The interrupted context (`ucontext_t *`) as an address, for callers
    /// that inspect registers; valid only during the callback.
    pub ucontext: usize,
}

/// The callback type: one call per ring record.
pub type Callback = Box<dyn FnMut(&Record<'_>, &Delivery) + Send + 'static>;

/// Counters a handler publishes for normal threads.
#[derive(Debug, Default)]
struct SharedStats {
    signals: AtomicU64,
    samples: AtomicU64,
    lost: AtomicU64,
    throttles: AtomicU64,
    unthrottles: AtomicU64,
    parse_errors: AtomicU64,
    corrupt_bytes: AtomicU64,
}

/// What a notifier's handler has seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotifierStats {
    /// Signals handled for this event.
    pub signals: u64,
    /// Ring statistics (samples, lost, throttles) as of the last signal.
    pub ring: RingStats,
    /// Records that failed to parse.
    pub parse_errors: u64,
}

struct Registration {
    ring: RingBuffer,
    callback: Callback,
    stats: Arc<SharedStats>,
}

struct Slot {
    claimed: AtomicBool,
    fd: AtomicI32,
    owner: AtomicI32,
    busy: AtomicU32,
    reg: AtomicPtr<Registration>,
}

/// Concurrent overflow registrations in the process. x86 has 4 debug
/// registers per thread; 256 leaves room for software events on many threads.
const SLOTS: usize = 256;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    claimed: AtomicBool::new(false),
    fd: AtomicI32::new(-1),
    owner: AtomicI32::new(0),
    busy: AtomicU32::new(0),
    reg: AtomicPtr::new(ptr::null_mut()),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Signals whose handler is installed; the handler stays for the process's life.
static INSTALLED: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// Signals that reached the handler and matched no registration (stale or foreign).
static STRAY: AtomicU64 = AtomicU64::new(0);

/// The `SIGPOLL` view of `siginfo_t` on 64-bit Linux.
#[repr(C)]
struct SigPollInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    band: i64,
    fd: i32,
}

/// Signals that reached papirus' handler with no live registration.
pub fn stray_signals() -> u64 {
    STRAY.load(Ordering::Relaxed)
}

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut c_void) {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno_slot = unsafe { libc::__errno_location() };
    // SAFETY: as above; saved so the interrupted code sees its own errno.
    let saved_errno = unsafe { *errno_slot };
    // SAFETY: SA_SIGINFO handlers receive a valid siginfo_t; the SIGPOLL
    // layout (si_band, si_fd) is what F_SETSIG delivers.
    let fd = unsafe { (*info.cast::<SigPollInfo>()).fd };
    let mut matched = false;
    for slot in &TABLE {
        if slot.fd.load(Ordering::Acquire) != fd {
            continue;
        }
        // ATOMICS: SeqCst busy increment then SeqCst load of `reg`, against
        // detach's SeqCst null store then SeqCst busy load: either we see
        // null, or detach sees us busy and waits.
        slot.busy.fetch_add(1, Ordering::SeqCst);
        let reg = slot.reg.load(Ordering::SeqCst);
        if !reg.is_null() && slot.fd.load(Ordering::SeqCst) == fd {
            matched = true;
            let delivery =
                Delivery { signal, fd, tid: slot.owner.load(Ordering::Relaxed), ucontext: ucontext as usize };
            // SAFETY: `reg` is published and cannot be freed while busy > 0;
            // only the owning thread receives this fd's signal and a signal
            // does not interrupt its own handler, so this is the only
            // reference.
            let reg = unsafe { &mut *reg };
            drain(reg, &delivery);
        }
        slot.busy.fetch_sub(1, Ordering::SeqCst);
    }
    if !matched {
        STRAY.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: restoring this thread's errno slot.
    unsafe { *errno_slot = saved_errno };
}

fn drain(reg: &mut Registration, delivery: &Delivery) {
    let Registration { ring, callback, stats } = reg;
    stats.signals.fetch_add(1, Ordering::Relaxed);
    let mut errors = 0u64;
    ring.drain(|rec: Result<Record<'_>, ParseError>| match rec {
        Ok(r) => callback(&r, delivery),
        Err(_) => errors += 1,
    });
    let s = ring.stats();
    // ATOMICS: Relaxed is enough, these are monotonic statistics a reader
    // samples; Notifier::stats orders nothing on them.
    stats.samples.store(s.samples, Ordering::Relaxed);
    stats.lost.store(s.lost, Ordering::Relaxed);
    stats.throttles.store(s.throttles, Ordering::Relaxed);
    stats.unthrottles.store(s.unthrottles, Ordering::Relaxed);
    stats.corrupt_bytes.store(s.corrupt_bytes, Ordering::Relaxed);
    stats.parse_errors.fetch_add(errors, Ordering::Relaxed);
}

fn install(signal: i32) -> Result<()> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if installed.contains(&signal) {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid starting value; we fill the
    // handler, flags and an empty mask before passing it to the kernel.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_signal as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: act.sa_mask is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: `act` is fully initialised; the old action is not requested.
    let ret = unsafe { libc::sigaction(signal, &act, ptr::null_mut()) };
    if ret != 0 {
        return Err(Error::Kernel {
            op: Op::Ioctl,
            event: format!("signal {signal}"),
            errno: crate::sys::Errno::last(),
            hint: "sigaction refused the overflow signal".into(),
        });
    }
    installed.push(signal);
    Ok(())
}

/// A sampling event whose overflows call a callback on its owning thread.
/// Dropping it stops the routing, waits for a running handler and frees the
/// ring.
#[derive(Debug)]
pub struct Notifier {
    events: SamplingEvents,
    slot: usize,
    signal: i32,
    owner: i32,
    stats: Arc<SharedStats>,
}

impl Notifier {
    /// Routes `sampler`'s overflows to thread `owner` (a tid; see [`gettid`])
    /// as `signal` (a real-time signal; [`default_signal`] if unsure), calling
    /// `callback` for every record. The event stays disabled; enable it with
    /// [`Notifier::events`].
    pub fn attach(sampler: Sampler, signal: i32, owner: i32, callback: Callback) -> Result<Notifier> {
        let (events, ring) = sampler.into_parts();
        let name = events.name().to_string();
        if !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal) {
            return Err(Error::Malformed {
                event: name,
                reason: format!(
                    "signal {signal} is not a real-time signal ({}..={}): overflow notification needs a queued signal carrying si_fd",
                    libc::SIGRTMIN(),
                    libc::SIGRTMAX()
                ),
            });
        }
        install(signal)?;
        let stats = Arc::new(SharedStats::default());
        let reg = Box::into_raw(Box::new(Registration { ring, callback, stats: stats.clone() }));
        let Some(slot) = TABLE.iter().position(|s| {
            s.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        }) else {
            // SAFETY: `reg` was never published; we own it.
            drop(unsafe { Box::from_raw(reg) });
            return Err(Error::Kernel {
                op: Op::Ioctl,
                event: name,
                errno: crate::sys::Errno(libc::ENOSPC),
                hint: format!("more than {SLOTS} overflow notifiers are attached; detach some"),
            });
        };
        let s = &TABLE[slot];
        s.owner.store(owner, Ordering::Relaxed);
        s.reg.store(reg, Ordering::SeqCst);
        s.fd.store(events.fd().as_raw_fd(), Ordering::SeqCst);
        let notifier = Notifier { events, slot, signal, owner, stats };
        notifier.route(true)?;
        Ok(notifier)
    }

    fn route(&self, on: bool) -> Result<()> {
        let sys = self.events.sys();
        let fd = self.events.fd();
        let err = |e| Error::from_errno(Op::Ioctl, self.events.name(), e, false, self.owner);
        let flags = sys.fcntl(fd, Fcntl::GetFlags).map_err(err)?;
        if on {
            sys.fcntl(fd, Fcntl::SetOwnerThread(self.owner)).map_err(err)?;
            sys.fcntl(fd, Fcntl::SetSig(self.signal)).map_err(err)?;
            sys.fcntl(fd, Fcntl::SetFlags(flags | libc::O_ASYNC | libc::O_NONBLOCK)).map_err(err)?;
        } else {
            sys.fcntl(fd, Fcntl::SetFlags(flags & !libc::O_ASYNC)).map_err(err)?;
        }
        Ok(())
    }

    /// The event's descriptors: enable, disable, reset, read.
    pub fn events(&self) -> &SamplingEvents {
        &self.events
    }
    /// The signal used.
    pub fn signal(&self) -> i32 {
        self.signal
    }
    /// The owning thread.
    pub fn owner(&self) -> i32 {
        self.owner
    }

    /// What the handler has seen so far.
    pub fn stats(&self) -> NotifierStats {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NotifierStats {
            signals: l(&s.signals),
            ring: RingStats {
                samples: l(&s.samples),
                lost: l(&s.lost),
                throttles: l(&s.throttles),
                unthrottles: l(&s.unthrottles),
                corrupt_bytes: l(&s.corrupt_bytes),
                ..RingStats::default()
            },
            parse_errors: l(&s.parse_errors),
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // Errors here leave a disabled event whose signals find no
        // registration; nothing is left to undo.
        let _ = self.events.disable();
        let _ = self.route(false);
        let s = &TABLE[self.slot];
        let reg = s.reg.swap(ptr::null_mut(), Ordering::SeqCst);
        let inside_own_handler = gettid() == self.owner && s.busy.load(Ordering::SeqCst) > 0;
        if inside_own_handler {
            // Dropped from its own callback: freeing would pull the ring from
            // under the running drain. Leak the registration instead.
            s.fd.store(-1, Ordering::SeqCst);
            return;
        }
        while s.busy.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        s.fd.store(-1, Ordering::SeqCst);
        if !reg.is_null() {
            // SAFETY: unpublished above and no handler is using it (busy == 0
            // after the null store), so we hold the only pointer.
            drop(unsafe { Box::from_raw(reg) });
        }
        s.claimed.store(false, Ordering::Release);
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Notifier>();
    send::<RingBuffer>();
    send::<Sampler>();
};
