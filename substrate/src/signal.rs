//! Overflow notification by a real-time signal to the thread that owns the
//! event.
//!
//! [`Notifier::attach`] routes a [`Sampler`]'s wakeups to one thread
//! ([`Route::attach`] does the same for a sampling event whose descriptor
//! the caller keeps, such as a member of a counting group):
//! `F_SETOWN_EX`/`F_OWNER_TID` (that thread only, never another thread of
//! the process), `F_SETSIG` with a real-time signal (queued, one per
//! wakeup), then `O_ASYNC`. The process-wide handler drains the rings of
//! every registration the interrupted thread owns for that signal and calls
//! the user's callback once per record; surplus signals (one wakeup's
//! samples were already drained by an earlier signal) find empty rings.
//! When samples come faster than handlers run, the real-time queue
//! (`RLIMIT_SIGPENDING`) overflows and the kernel sends a plain SIGIO
//! instead: papirus handles SIGIO too (draining this thread's rings) and
//! passes other SIGIOs to the handler installed before it.
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
//! # Periods shorter than a handler
//!
//! Each sample costs a signal delivery (tens of µs in a KVM guest, see
//! README). If the sampled thread generates samples faster than it handles
//! them (a task-clock or cpu-clock period below the handler's cost, whose
//! own CPU time counts), signals pile up and the thread livelocks in its
//! handlers: nothing is lost, but it never gets back to its own code.
//! papirus does not pause the event inside the handler, as PAPI does,
//! because that needs the re-arm ioctl above; the low-level API refuses
//! clock periods under [`MIN_CLOCK_PERIOD_NS`] instead, and samplers that
//! need higher rates read their ring from a normal thread without signals.
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
//! both sides); the handler touches a registration only on its owning thread
//! and for its own signal number (checked on every signal, since a queued
//! signal can outlive its descriptor and the number be reused), and signals
//! of one number do not nest, so a ring and callback are never entered twice
//! at once.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::error::{Error, Op, Result};
use crate::ring::{RingBuffer, RingStats};
use crate::sample::{ParseError, Record, Sampler, SamplingEvents};
use crate::sys::Fcntl;

/// The shortest task-clock/cpu-clock period (ns) worth routing to a signal
/// handler: a handler costs tens of µs here, and a shorter period livelocks
/// the thread (see the module docs).
pub const MIN_CLOCK_PERIOD_NS: u64 = 100_000;

/// The signal papirus routes overflows to unless told otherwise: `SIGRTMAX - 3`.
pub fn default_signal() -> i32 {
    libc::SIGRTMAX() - 3
}

/// Gives `signal` its default action (SIG_DFL): a command-line tool that
/// ends by a signal re-raises it so, and a closed pipe ends a tool quietly
/// when SIGPIPE is back at its default.
pub fn set_default(signal: i32) -> std::io::Result<()> {
    dispose(signal, libc::SIG_DFL, 0)
}

/// Ignores `signal` (SIG_IGN); a program started later inherits that.
pub fn ignore(signal: i32) -> std::io::Result<()> {
    dispose(signal, libc::SIG_IGN, 0)
}

/// Catches `signal` with a handler that does nothing, restarting the system
/// call it interrupts: a write to a closed pipe then fails with EPIPE
/// instead of ending the process, while a program started later gets the
/// default action back (execve resets a caught signal, not an ignored one).
pub fn discard(signal: i32) -> std::io::Result<()> {
    extern "C" fn nothing(_: libc::c_int) {}
    dispose(signal, nothing as *const () as libc::sighandler_t, libc::SA_RESTART)
}

fn dispose(signal: i32, handler: libc::sighandler_t, flags: i32) -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction (empty mask) is a valid value; `handler` is
    // SIG_DFL, SIG_IGN or a handler that touches nothing, so it is
    // async-signal-safe; `act` lives for the call and the old action is not asked for.
    let ret = unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler;
        act.sa_flags = flags;
        libc::sigaction(signal, &act, ptr::null_mut())
    };
    if ret == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

pub use crate::sys::gettid;

/// How a record reached the callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The signal number.
    pub signal: i32,
    /// The descriptor of the event whose ring is being drained.
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
    draining: AtomicBool,
    fd: AtomicI32,
    owner: AtomicI32,
    signal: AtomicI32,
    busy: AtomicU32,
    reg: AtomicPtr<Registration>,
}

/// Concurrent overflow registrations in the process. x86 has 4 debug
/// registers per thread; 256 leaves room for software events on many threads.
const SLOTS: usize = 256;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    claimed: AtomicBool::new(false),
    draining: AtomicBool::new(false),
    fd: AtomicI32::new(-1),
    owner: AtomicI32::new(0),
    signal: AtomicI32::new(0),
    busy: AtomicU32::new(0),
    reg: AtomicPtr::new(ptr::null_mut()),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Signals whose handler is installed; the handler stays for the process's life.
static INSTALLED: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// Signals that reached the handler and matched no registration (stale or foreign).
static STRAY: AtomicU64 = AtomicU64::new(0);

/// Signals that reached papirus' handler with no live registration.
pub fn stray_signals() -> u64 {
    STRAY.load(Ordering::Relaxed)
}

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut c_void) {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno_slot = unsafe { libc::__errno_location() };
    // SAFETY: as above; saved so the interrupted code sees its own errno.
    let saved_errno = unsafe { *errno_slot };
    // SAFETY: SA_SIGINFO handlers receive a valid siginfo_t.
    let code = unsafe { (*info).si_code };
    // The kernel falls back to a plain SIGIO (SI_KERNEL) when the real-time
    // signal cannot be queued (RLIMIT_SIGPENDING): then any of this thread's
    // registrations may have data.
    let overflow_fallback = signal == libc::SIGIO && code == libc::SI_KERNEL;
    let tid = gettid();
    let mut matched = false;
    for slot in &TABLE {
        // Every registration of this thread and signal is drained, not only
        // the one si_fd names: one signal may stand for several wakeups.
        let sig_ok = overflow_fallback || slot.signal.load(Ordering::Relaxed) == signal;
        if !sig_ok || slot.reg.load(Ordering::Relaxed).is_null() {
            continue;
        }
        // ATOMICS: SeqCst busy increment then SeqCst load of `reg`, against
        // detach's SeqCst null store then SeqCst busy load: either we see
        // null, or detach sees us busy and waits.
        slot.busy.fetch_add(1, Ordering::SeqCst);
        let reg = slot.reg.load(Ordering::SeqCst);
        // Only the owner thread may touch the ring (a queued signal can
        // outlive its descriptor), and never while a drain of the same slot
        // is interrupted further up this thread's stack.
        if !reg.is_null()
            && slot.owner.load(Ordering::Relaxed) == tid
            && slot.draining.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            matched = true;
            let fd = slot.fd.load(Ordering::Relaxed);
            let delivery = Delivery { signal, fd, tid, ucontext: ucontext as usize };
            // SAFETY: `reg` is published and cannot be freed while busy > 0;
            // the `draining` flag, taken only by the owner thread, makes this
            // the only reference.
            let reg = unsafe { &mut *reg };
            drain(reg, &delivery);
            slot.draining.store(false, Ordering::Release);
        }
        slot.busy.fetch_sub(1, Ordering::SeqCst);
    }
    if !matched {
        STRAY.fetch_add(1, Ordering::Relaxed);
    }
    if signal == libc::SIGIO && !overflow_fallback {
        chain_sigio(signal, info, ucontext);
    }
    // SAFETY: restoring this thread's errno slot.
    unsafe { *errno_slot = saved_errno };
}

/// The SIGIO disposition papirus replaced: (handler address, flags).
static PREVIOUS_SIGIO: std::sync::OnceLock<(usize, i32)> = std::sync::OnceLock::new();

/// Passes a SIGIO that was not ours to the handler installed before papirus.
fn chain_sigio(signal: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut c_void) {
    let Some(&(handler, flags)) = PREVIOUS_SIGIO.get() else { return };
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous disposition was installed with SA_SIGINFO, so
        // its address is a three-argument handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(handler) };
        f(signal, info, ucontext);
    } else {
        // SAFETY: without SA_SIGINFO the address is a one-argument handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(signal);
    }
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
    // SIGIO too: the kernel sends it instead when the real-time queue is
    // full, and its default action would kill the process.
    for sig in [libc::SIGIO, signal] {
        if installed.contains(&sig) {
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid starting value; we fill the
        // handler, flags and mask before passing it to the kernel.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // Our handlers never interrupt each other: block SIGIO and every
        // real-time signal while one runs.
        // SAFETY: act.sa_mask is a valid sigset_t owned by this frame.
        unsafe {
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaddset(&mut act.sa_mask, libc::SIGIO);
            for rt in libc::SIGRTMIN()..=libc::SIGRTMAX() {
                libc::sigaddset(&mut act.sa_mask, rt);
            }
        }
        // SAFETY: a zeroed sigaction for the kernel to fill with the old one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `act` is fully initialised and `old` is writable.
        let ret = unsafe { libc::sigaction(sig, &act, &mut old) };
        if ret != 0 {
            return Err(Error::Kernel {
                op: Op::Ioctl,
                event: format!("signal {sig}"),
                errno: crate::sys::Errno::last(),
                hint: "sigaction refused to install papirus' overflow handler".into(),
            });
        }
        if sig == libc::SIGIO && old.sa_sigaction != on_signal as *const () as usize {
            let _ = PREVIOUS_SIGIO.set((old.sa_sigaction, old.sa_flags));
        }
        installed.push(sig);
    }
    Ok(())
}

/// A sampling event whose overflows call a callback on its owning thread.
/// Dropping it disables the event, stops the routing, waits for a running
/// handler and frees the ring.
#[derive(Debug)]
pub struct Notifier {
    // Dropped first: the route is gone before the descriptor closes.
    route: Route,
    events: SamplingEvents,
}

impl Notifier {
    /// Routes `sampler`'s overflows to thread `owner` (a tid; see [`gettid`])
    /// as `signal` (a real-time signal; [`default_signal`] if unsure), calling
    /// `callback` for every record. The event stays disabled; enable it with
    /// [`Notifier::events`].
    pub fn attach(sampler: Sampler, signal: i32, owner: i32, callback: Callback) -> Result<Notifier> {
        let (events, ring) = sampler.into_parts();
        let route = Route::attach(events.sys(), events.fd(), events.name(), ring, signal, owner, callback)?;
        Ok(Notifier { events, route })
    }

    /// The event's descriptors: enable, disable, reset, read.
    pub fn events(&self) -> &SamplingEvents {
        &self.events
    }
    /// The signal used.
    pub fn signal(&self) -> i32 {
        self.route.signal
    }
    /// The owning thread.
    pub fn owner(&self) -> i32 {
        self.route.owner
    }

    /// What the handler has seen so far.
    pub fn stats(&self) -> NotifierStats {
        self.route.stats()
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // Errors here leave a disabled event whose signals find no
        // registration; nothing is left to undo. The route is dropped
        // after this body, while the descriptor is still open.
        let _ = self.events.disable();
        let _ = set_routing(self.events.sys(), self.events.fd(), self.events.name(), None);
    }
}

/// The routing of one sampling event's overflow signals to a thread, for
/// an event whose descriptor and ring the caller opened (a member of a
/// [`Group`](crate::group::Group) opened with
/// [`Group::add_sampling`](crate::group::Group::add_sampling), say): the
/// caller keeps the descriptor, the route owns the ring and the callback.
///
/// A route touches the descriptor only in [`Route::attach`]. Dropping it
/// unpublishes the registration, waits for a running handler and frees the
/// ring; signals that arrive afterwards (the event still enabled, or
/// already queued) find no registration and are counted by
/// [`stray_signals`]. Disable the event first when that matters, and drop
/// the route before closing the descriptor, so that a new descriptor given
/// the same number cannot be routed to this registration.
#[derive(Debug)]
pub struct Route {
    slot: usize,
    signal: i32,
    owner: i32,
    stats: Arc<SharedStats>,
}

fn set_routing(
    sys: &Arc<dyn crate::sys::Sys>,
    fd: BorrowedFd<'_>,
    name: &str,
    to: Option<(i32, i32)>,
) -> Result<()> {
    let owner = to.map_or(0, |(owner, _)| owner);
    let err = |e| Error::from_errno(Op::Ioctl, name, e, false, owner);
    let flags = sys.fcntl(fd, Fcntl::GetFlags).map_err(err)?;
    match to {
        Some((owner, signal)) => {
            sys.fcntl(fd, Fcntl::SetOwnerThread(owner)).map_err(err)?;
            sys.fcntl(fd, Fcntl::SetSig(signal)).map_err(err)?;
            sys.fcntl(fd, Fcntl::SetFlags(flags | libc::O_ASYNC | libc::O_NONBLOCK)).map_err(err)?;
        }
        None => {
            sys.fcntl(fd, Fcntl::SetFlags(flags & !libc::O_ASYNC)).map_err(err)?;
        }
    }
    Ok(())
}

impl Route {
    /// Routes the overflows of the sampling event `fd` (named `name` in
    /// errors), whose ring is `ring`, to thread `owner` as `signal` (a
    /// real-time signal), calling `callback` for every record. Enabling and
    /// disabling the event is the caller's business.
    pub fn attach(
        sys: &Arc<dyn crate::sys::Sys>,
        fd: BorrowedFd<'_>,
        name: &str,
        ring: RingBuffer,
        signal: i32,
        owner: i32,
        callback: Callback,
    ) -> Result<Route> {
        if !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal) {
            return Err(Error::Malformed {
                event: name.to_string(),
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
                event: name.to_string(),
                errno: crate::sys::Errno(libc::ENOSPC),
                hint: format!("more than {SLOTS} overflow notifiers are attached; detach some"),
            });
        };
        let s = &TABLE[slot];
        s.owner.store(owner, Ordering::Relaxed);
        s.signal.store(signal, Ordering::Relaxed);
        s.reg.store(reg, Ordering::SeqCst);
        s.fd.store(fd.as_raw_fd(), Ordering::SeqCst);
        let route = Route { slot, signal, owner, stats };
        // On failure the route drops here and frees the registration.
        set_routing(sys, fd, name, Some((owner, signal)))?;
        Ok(route)
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

impl Drop for Route {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        let reg = s.reg.swap(ptr::null_mut(), Ordering::SeqCst);
        let inside_own_handler = gettid() == self.owner && s.draining.load(Ordering::SeqCst);
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
    send_sync::<Route>();
    send::<RingBuffer>();
    send::<Sampler>();
};
