//! Process control: start a program stopped at its entry point or attach to a
//! running one, hold every thread stopped, read and write its memory and
//! registers, run system calls and functions inside it, load a library into it,
//! and leave it as it was.
//!
//! A [`Process`] is the whole target held stopped: every thread is in a ptrace
//! stop whenever no method is running. [`Process::syscall`] and
//! [`Process::call`] resume only the worker thread; [`Process::run_for`] and
//! fresh-thread injection ([`Injection::FreshThread`]) let the whole process run
//! (signals delivered, new threads followed) and stop it all again before
//! returning. Dropping it detaches, delivering signals that arrived meanwhile.
//!
//! Costs on the 2-vCPU VM (criterion, `benches/process.rs`): attach + stop + detach
//! of a 5-thread process with 4 threads spinning is 3–13 ms under a load of 9–14,
//! the same as the raw ptrace requests with blocking waits (5–8 ms) in the same
//! runs: the time is the scheduler bringing each spinning thread to its stop. One
//! spinning thread alone takes 40–80 µs.
//!
//! ptrace binds a tracee to the tracer *thread*, so a `Process` is neither
//! `Send` nor `Sync`: create, use and drop it on one thread.
//!
//! Every wait is bounded ([`Process::set_timeout`]); a target that exits or is
//! killed gives [`Error::TargetExited`], never a hang.
//!
//! # Invariants
//!
//! - **Only resumable states run our code.** Remote code runs on a thread in an
//!   interrupt or signal-delivery stop in user space, never at a ptrace event
//!   stop: a thread reporting a clone event is inside `clone3` (rax = -ENOSYS),
//!   so it is continued and stopped again first.
//! - **Every syscall the target was in completes or restarts as without us.**
//!   Registers, vector state and signal mask are restored exactly; a thread
//!   asleep through the kernel's restart block (nanosleep, futex or poll with a
//!   timeout) never runs a function that could sleep (another thread, or a
//!   thread created for the call, runs it), so no sleep ends early with EINTR.
//! - **papirus may die at any moment.** Nothing is ever single-stepped and no
//!   trap or fault of ours ends remote code: it restores its thread by itself
//!   (`restoring`), so a thread papirus leaves anywhere on the way finishes
//!   the code and goes on as it was; after remote code every thread is back
//!   in a plain interrupt stop with no signal of ours pending;
//!   `PTRACE_O_EXITKILL` is never set.
//! - **Signals are never lost.** A signal arriving while a thread is held is
//!   kept and delivered when the thread resumes (or re-queued when the thread
//!   no longer sits in its delivery stop).
//! - **A changed image is never written.** An execve during a stop is
//!   [`Error::Exec`], and so is one that overtakes the attach itself (its
//!   seize refused for a moment, every held thread killed by it);
//!   [`Image::of`] / [`Process::check_image`] tell whether one happened
//!   before papirus held the process or while it was detached.
//! - **Seccomp cannot kill the target for our syscalls.** The filter is
//!   suspended while papirus holds the process, or the attach is refused before
//!   anything is touched ([`Error::Seccomp`]).
//! - **Every PC a thread resumes at is known** ([`Process::resume_pcs`]): its
//!   rip, its syscall's restart point and the saved rip of each signal frame.

mod frames;
mod inject;
mod memory;
mod regs;
mod remote;
mod restoring;
mod spawn;
mod sys;
mod wait;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::ptrace::{self, Options};
use nix::unistd::Pid;

use crate::error::{Error, PermissionReason, Result};

pub use inject::{Injection, Library};
pub use regs::{Regs, XState};
pub use spawn::{Image, Spawn};
use wait::Event;

/// How a process or thread ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// `exit(code)`.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
    /// Gone, and the kernel no longer says how.
    Unknown,
}

impl Exit {
    /// Decodes a wait status (as from `waitpid` or `PTRACE_GETEVENTMSG` at an exit event).
    pub fn from_wait_status(status: i32) -> Exit {
        if libc::WIFEXITED(status) {
            Exit::Code(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Unknown
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "killed by {}", signal_name(*s)),
            Exit::Unknown => write!(f, "exit status unknown"),
        }
    }
}

/// `SIGSEGV`, `SIGRTMIN+2`, … for a signal number.
pub fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) if (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&sig) => {
            format!("SIGRTMIN+{}", sig - libc::SIGRTMIN())
        }
        Err(_) => format!("signal {sig}"),
    }
}

/// Leaves a tracee seized with `PTRACE_SEIZE` in its group stop
/// (`PTRACE_LISTEN`, which nix does not wrap), stopped until a SIGCONT.
pub fn listen(tid: i32) -> Result<()> {
    sys::ptrace(libc::PTRACE_LISTEN, tid, 0, 0).map(drop).map_err(|errno| Error::Ptrace {
        op: "PTRACE_LISTEN",
        tid,
        errno,
    })
}

/// One traced thread, always in a ptrace stop while the `Process` is held.
#[derive(Debug, Default)]
struct Thread {
    /// Signals that arrived while we held the thread; delivered when it resumes.
    pending: Vec<i32>,
    /// The thread sits in the signal-delivery stop of the last of `pending`: only
    /// from there does resuming with a signal deliver it (from any other stop the
    /// kernel ignores it, so those are re-queued instead).
    in_delivery: bool,
    /// Stopped at its exit event (with the status it exits with): it can no longer run code.
    exit: Option<Exit>,
}

/// Options for every seized thread: follow new threads, see exits and execve.
///
/// Never `PTRACE_O_EXITKILL`: if papirus dies, the target must live on.
const OPTIONS: Options = Options::PTRACE_O_TRACECLONE
    .union(Options::PTRACE_O_TRACEEXIT)
    .union(Options::PTRACE_O_TRACEEXEC)
    .union(Options::PTRACE_O_TRACESYSGOOD);

/// Default bound on every wait for a stop.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a wait for some threads looks at the others ([`Process::sweep`]).
const SWEEP_EVERY: Duration = Duration::from_millis(1);
/// How long a PTRACE_SEIZE may wait before papirus looks at the held threads.
const SEIZE_PATIENCE: Duration = Duration::from_millis(20);

/// A process whose threads are all stopped under our control. Dropping it detaches.
#[derive(Debug)]
pub struct Process {
    pid: i32,
    threads: BTreeMap<i32, Thread>,
    mem: File,
    child: bool,
    worker: i32,
    /// The ptrace options of every thread (OPTIONS, plus seccomp suspension
    /// when the target runs under a filter).
    options: Options,
    /// Where a stopped thread may hold a lock remote calls need (loader,
    /// allocator, fork, libc's memory system calls), computed at the first
    /// remote call.
    lock_code: Option<inject::Danger>,
    /// The restore block in code slack (`restoring`), once written.
    slack: Option<restoring::Slack>,
    /// The stub region of remote functions (`restoring`), once mapped.
    stub: Option<u64>,
    timeout: Duration,
    /// ptrace requests must come from the thread that attached.
    _not_send: PhantomData<*const ()>,
}

/// A process we detached from. When we started it, it is our child and can be waited for.
#[derive(Debug)]
pub struct Detached {
    pid: i32,
    child: bool,
}

impl Detached {
    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits up to `timeout` for a process we started to end, and reaps it.
    pub fn wait(&self, timeout: Duration) -> Result<Exit> {
        if !self.child {
            return Err(Error::InvalidArgument {
                what: format!(
                    "pid {} was attached to, not started by papirus: it is not our child",
                    self.pid
                ),
            });
        }
        match wait::poll(self.pid, 0, Instant::now() + timeout)? {
            Some(status) => Ok(Exit::from_wait_status(status)),
            None => {
                Err(Error::Timeout { what: "exit", tid: self.pid, timeout_ms: timeout.as_millis() as u64 })
            }
        }
    }
}

impl Process {
    /// Attaches to a running process: seizes and stops every thread.
    ///
    /// A target under seccomp (`Seccomp:` 1 or 2 in /proc/PID/status) could be
    /// killed by the remote system calls papirus runs in it (mmap, mprotect), so
    /// its filter is suspended for our threads while papirus holds them
    /// (`PTRACE_O_SUSPEND_SECCOMP`, which needs CAP_SYS_ADMIN); the kernel lifts
    /// the suspension at detach. Without the capability the attach is refused
    /// with [`Error::Seccomp`] before the target is touched. While the process
    /// runs attached (fresh-thread injection, [`Process::run_for`]) its own code
    /// runs unfiltered too.
    pub fn attach(pid: i32) -> Result<Process> {
        precheck(pid)?;
        let seccomp = status_field(pid, "Seccomp").and_then(|m| m.parse::<u8>().ok()).unwrap_or(0);
        let options = if seccomp == 0 {
            OPTIONS
        } else {
            OPTIONS | Options::from_bits_retain(libc::PTRACE_O_SUSPEND_SECCOMP)
        };
        // The kernel refuses to seize an exiting leader: in an execve called by
        // another thread, the leader exits and that thread takes its pid. Give
        // it the same moment as `precheck` does.
        let mut seized = ptrace::seize(Pid::from_raw(pid), options);
        let since = Instant::now();
        while seized == Err(Errno::EPERM) && exec_settling(pid, since) {
            std::thread::sleep(Duration::from_millis(5));
            seized = ptrace::seize(Pid::from_raw(pid), options);
        }
        // The execve may have ended between the refusal and the look at the
        // leader: its new image can be seized now (a real refusal stays one).
        if seized == Err(Errno::EPERM) {
            seized = ptrace::seize(Pid::from_raw(pid), options);
        }
        if let Err(errno) = seized {
            return Err(match errno {
                Errno::EPERM | Errno::EINVAL if seccomp != 0 && !may_suspend_seccomp() => Error::Seccomp {
                    pid,
                    mode: seccomp,
                    detail: format!("PTRACE_O_SUSPEND_SECCOMP: {errno}"),
                },
                errno => seize_error(pid, errno),
            });
        }
        let mem = match open_mem(pid) {
            Ok(f) => f,
            Err(e) => {
                let _ = sys::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
                return Err(e);
            }
        };
        let mut p = Process::held(pid, mem, false);
        p.options = options;
        p.threads.insert(pid, Thread::default());
        p.interrupt(pid)?;
        // Seize the other threads before waiting, so all stops happen in parallel.
        let mut fresh = p.seize_new_tasks()?;
        fresh.insert(pid);
        loop {
            p.wait_stopped(fresh, "stop")?;
            fresh = p.seize_new_tasks()?;
            if fresh.is_empty() {
                break;
            }
        }
        match p.ending("attach") {
            Some(_) => Err(p.leader_fate("attach")),
            None => Ok(p),
        }
    }

    /// Every held thread is on its way out: the process is ending, or a
    /// thread papirus does not hold is in an execve, which kills the others
    /// (with exit code 0, as `exit(0)` would). Waits for the leader to say
    /// which: its end, or its place taken by the new image ([`Error::Exec`]).
    fn leader_fate(&mut self, what: &'static str) -> Error {
        let deadline = Instant::now() + self.timeout;
        while Instant::now() < deadline {
            let event = match sys::waitpid(self.pid, libc::__WALL | libc::WNOHANG) {
                Ok(Some(status)) => wait::classify(self.pid, status),
                Err(Errno::ECHILD) => Event::Gone(Exit::Unknown),
                Ok(None) | Err(_) => {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
            };
            match event {
                Event::Gone(status) => {
                    self.threads.remove(&self.pid);
                    return self.leader_gone(status, what);
                }
                Event::Exec => return self.exec_error(what),
                _ => {
                    let _ = sys::ptrace(libc::PTRACE_CONT, self.pid, 0, 0);
                }
            }
        }
        self.ending(what).unwrap_or_else(|| self.exited(what, Exit::Unknown))
    }

    fn held(pid: i32, mem: File, child: bool) -> Process {
        Process {
            pid,
            threads: BTreeMap::new(),
            mem,
            child,
            worker: pid,
            options: OPTIONS,
            lock_code: None,
            slack: None,
            stub: None,
            timeout: DEFAULT_TIMEOUT,
            _not_send: PhantomData,
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Thread ids of every stopped thread, the leader first when it is alive
    /// (threads on their way out, which never run user code again, are not
    /// among them).
    pub fn threads(&self) -> Vec<i32> {
        let mut v: Vec<i32> =
            self.threads.iter().filter(|(_, t)| t.exit.is_none()).map(|(&k, _)| k).collect();
        v.sort_by_key(|&t| (t != self.pid, t));
        v
    }

    /// Whether papirus started this process (it is our child).
    pub fn is_child(&self) -> bool {
        self.child
    }

    /// Bounds every later wait for a stop, a remote system call or a remote call.
    pub fn set_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.timeout = timeout;
        self
    }

    /// The thread used to run system calls and functions (the leader by default).
    pub fn worker(&self) -> i32 {
        self.worker
    }

    /// Chooses the thread that runs system calls and functions.
    pub fn set_worker(&mut self, tid: i32) -> Result<&mut Self> {
        self.usable(tid)?;
        self.worker = tid;
        Ok(self)
    }

    /// Resumes every thread and releases the process.
    pub fn detach(mut self) -> Result<Detached> {
        let r = self.release();
        let d = Detached { pid: self.pid, child: self.child };
        // release() emptied the thread table, so Drop has nothing left to do.
        drop(self);
        r.map(|()| d)
    }

    /// Resumes every thread, detaching all but the leader, which stays traced
    /// with only `options` for the caller to follow (its `execve`, its end)
    /// without the window a detach and a new seize would leave.
    pub fn resume_following(mut self, options: Options) -> Result<i32> {
        let pid = self.pid;
        let others: Vec<i32> = self.threads.keys().copied().filter(|&t| t != pid).collect();
        for tid in others {
            self.resume(tid, libc::PTRACE_DETACH)?;
            self.threads.remove(&tid);
        }
        ptrace::setoptions(Pid::from_raw(pid), options).map_err(|errno| Error::Ptrace {
            op: "PTRACE_SETOPTIONS",
            tid: pid,
            errno,
        })?;
        self.resume(pid, libc::PTRACE_CONT)?;
        self.threads.clear();
        Ok(pid)
    }

    /// Resumes every thread for `pause`, then stops them all again (and any new
    /// thread). Stops meanwhile are served as they come (signals delivered), so
    /// the threads really run: a thread whose signal arrives during the pause
    /// runs its handler and returns from it instead of waiting in the delivery stop.
    pub fn run_for(&mut self, pause: Duration) -> Result<()> {
        let end = Instant::now() + pause;
        self.run_until(|_| Instant::now() >= end)
    }

    /// Lets the whole process run until `done` holds (polled every ≤ 200 µs) or the
    /// timeout passes, then stops it again. Meanwhile every stop is served at once:
    /// signals are delivered, new threads followed, exiting threads let go.
    fn run_until(&mut self, mut done: impl FnMut(&Self) -> bool) -> Result<()> {
        self.resume_all()?;
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_micros(20);
        while !done(self) {
            if Instant::now() >= deadline {
                self.stop_all()?;
                return Err(Error::Timeout {
                    what: "finish the injected code",
                    tid: self.pid,
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            let tids: Vec<i32> = self.threads.keys().copied().collect();
            for tid in tids {
                let status = match sys::waitpid(tid, libc::__WALL | libc::WNOHANG) {
                    Ok(Some(status)) => status,
                    Ok(None) => continue,
                    Err(Errno::ECHILD) => {
                        self.threads.remove(&tid);
                        continue;
                    }
                    Err(errno) => return Err(Error::Ptrace { op: "waitpid", tid, errno }),
                };
                let sig = match wait::classify(tid, status) {
                    Event::Signal(sig) => sig,
                    Event::Stopped | Event::Syscall => 0,
                    Event::Clone(new) => {
                        self.threads.entry(new).or_default();
                        0
                    }
                    Event::Exiting(status) => {
                        self.thread(tid).exit = Some(status);
                        0
                    }
                    Event::Gone(status) => {
                        self.threads.remove(&tid);
                        if tid == self.pid {
                            return Err(self.leader_gone(status, "a run of the whole process"));
                        }
                        continue;
                    }
                    Event::Exec => {
                        return Err(self.exec_error("a run of the whole process"));
                    }
                };
                if let Err(errno) = sys::ptrace(libc::PTRACE_CONT, tid, 0, sig as u64)
                    && errno != Errno::ESRCH
                {
                    return Err(Error::Ptrace { op: "PTRACE_CONT", tid, errno });
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
        self.stop_all()?;
        // The worker may have ended meanwhile: the leader, or another, takes over.
        if self.usable(self.worker).is_err()
            && let Some(tid) = self.threads().into_iter().find(|&t| self.usable(t).is_ok())
        {
            self.worker = tid;
        }
        Ok(())
    }

    fn resume_all(&mut self) -> Result<()> {
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in tids {
            self.resume(tid, libc::PTRACE_CONT)?;
        }
        Ok(())
    }

    /// Resumes one thread with its first held signal (re-queuing the others).
    fn resume(&mut self, tid: i32, req: libc::c_uint) -> Result<()> {
        let (mut pending, in_delivery) = self
            .threads
            .get_mut(&tid)
            .map(|t| (std::mem::take(&mut t.pending), std::mem::take(&mut t.in_delivery)))
            .unwrap_or_default();
        let first = if in_delivery { pending.pop().unwrap_or(0) } else { 0 };
        for &sig in &pending {
            let _ = sys::tgkill(self.pid, tid, sig);
        }
        match sys::ptrace(req, tid, 0, first as u64) {
            Ok(_) => Ok(()),
            Err(Errno::ESRCH) if req == libc::PTRACE_DETACH && task_alive(self.pid, tid) => {
                self.detach_running(tid, first);
                Ok(())
            }
            Err(Errno::ESRCH) => {
                self.reap(tid);
                Ok(())
            }
            Err(errno) => Err(Error::Ptrace { op: req_name(req), tid, errno }),
        }
    }

    /// Detaches a thread that is seized but not in a stop (an error cut a wait
    /// short): stop it first, since PTRACE_DETACH needs a stopped tracee.
    fn detach_running(&mut self, tid: i32, held: i32) {
        let _ = self.interrupt(tid);
        let sig = match wait::event(tid, Instant::now() + Duration::from_secs(1)) {
            Ok(Some(Event::Signal(sig))) => {
                if held != 0 {
                    let _ = sys::tgkill(self.pid, tid, held);
                }
                sig
            }
            Ok(Some(Event::Gone(_))) | Ok(None) | Err(_) => return self.reap(tid),
            Ok(Some(_)) => held,
        };
        let _ = sys::ptrace(libc::PTRACE_DETACH, tid, 0, sig as u64);
    }

    fn stop_all(&mut self) -> Result<()> {
        let tids: BTreeSet<i32> = self.threads().into_iter().collect();
        for &tid in &tids {
            self.interrupt(tid)?;
        }
        let mut fresh = tids;
        loop {
            self.wait_stopped(fresh, "stop")?;
            fresh = self.seize_new_tasks()?;
            if fresh.is_empty() {
                return Ok(());
            }
        }
    }

    /// Resumes a thread from an event or signal stop without a signal and asks it
    /// to stop again at once; the caller waits for that stop. A thread in a
    /// signal-delivery stop then reports the interrupt before reaching user
    /// space, registers unchanged.
    fn cont_and_interrupt(&mut self, tid: i32) -> Result<()> {
        self.interrupt(tid)?;
        self.thread(tid).in_delivery = false;
        match sys::ptrace(libc::PTRACE_CONT, tid, 0, 0) {
            Ok(_) | Err(Errno::ESRCH) => Ok(()),
            Err(errno) => Err(Error::Ptrace { op: "PTRACE_CONT", tid, errno }),
        }
    }

    fn interrupt(&mut self, tid: i32) -> Result<()> {
        match ptrace::interrupt(Pid::from_raw(tid)) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(errno) => Err(Error::Ptrace { op: "PTRACE_INTERRUPT", tid, errno }),
        }
    }

    /// Waits until every thread of `tids` reports a stop, following clones and exits.
    ///
    /// The threads are polled round-robin, not one after the other: a thread
    /// killed by SIGKILL (an execve in another thread kills every other thread
    /// so, as does the end of the process) is let go from its exit stop at
    /// once, since the execve or the exit waits for it, and is then waited for
    /// until it is gone or (the leader) reports the execve.
    ///
    /// Every millisecond of waiting, the threads already held are looked at
    /// too ([`Process::sweep`]): one that an execve killed stays a zombie
    /// until papirus reaps it, and the execve (and so the thread it is in,
    /// which never stops meanwhile) waits for that; the leader then reports
    /// the execve, which ends the wait as [`Error::Exec`] at once instead of
    /// a timeout.
    fn wait_stopped(&mut self, mut tids: BTreeSet<i32>, what: &'static str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_micros(5);
        let mut swept = Instant::now();
        while let Some(&first) = tids.first() {
            let mut reported = Vec::new();
            for &tid in &tids {
                match sys::waitpid(tid, libc::__WALL | libc::WNOHANG) {
                    Ok(Some(status)) => reported.push((tid, wait::classify(tid, status))),
                    Ok(None) | Err(Errno::EINTR) => {}
                    // Not (or no longer) waitable: gone and reaped elsewhere.
                    Err(Errno::ECHILD) => reported.push((tid, Event::Gone(Exit::Unknown))),
                    Err(errno) => return Err(Error::Ptrace { op: "waitpid", tid, errno }),
                }
            }
            if reported.is_empty() {
                if swept.elapsed() >= SWEEP_EVERY {
                    self.sweep(&mut tids, what)?;
                    swept = Instant::now();
                }
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        what,
                        tid: first,
                        timeout_ms: self.timeout.as_millis() as u64,
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_micros(200));
                continue;
            }
            pause = Duration::from_micros(5);
            for (tid, event) in reported {
                tids.remove(&tid);
                self.on_stop(tid, event, &mut tids, what)?;
            }
        }
        Ok(())
    }

    /// Polls the held threads not in `waiting` for what they may still
    /// report while stopped: their death (reaped here, which an execve in
    /// progress waits for) and, for the leader, a completed execve
    /// ([`Error::Exec`]). Anything they report joins `waiting`'s handling.
    fn sweep(&mut self, waiting: &mut BTreeSet<i32>, what: &'static str) -> Result<()> {
        let held: Vec<i32> = self.threads.keys().copied().filter(|t| !waiting.contains(t)).collect();
        for tid in held {
            let event = match sys::waitpid(tid, libc::__WALL | libc::WNOHANG) {
                Ok(Some(status)) => wait::classify(tid, status),
                Err(Errno::ECHILD) => Event::Gone(Exit::Unknown),
                Ok(None) | Err(_) => continue,
            };
            self.on_stop(tid, event, waiting, what)?;
        }
        Ok(())
    }

    /// Records one stop reported while waiting for `tids` (see [`Process::wait_stopped`]).
    fn on_stop(
        &mut self,
        tid: i32,
        event: Event,
        tids: &mut BTreeSet<i32>,
        what: &'static str,
    ) -> Result<()> {
        match event {
            Event::Stopped | Event::Syscall => self.thread(tid).in_delivery = false,
            Event::Signal(sig) => {
                let t = self.thread(tid);
                t.pending.push(sig);
                t.in_delivery = true;
            }
            Event::Clone(new) => {
                self.threads.entry(new).or_default();
                tids.insert(new);
                // The parent is stopped inside clone(3), before the syscall
                // returns: its registers (rax = -ENOSYS) are not a state to
                // run code on or restore. Let the syscall finish, stop it again.
                self.cont_and_interrupt(tid)?;
                tids.insert(tid);
            }
            // Let it go on: an execve or the end of the process waits for
            // every other thread to be gone (an execve reports them as
            // exiting with code 0), and holding one here would stall it. A
            // thread is waited for until it is gone; the leader's end comes
            // with the process' (or, in an execve, never: it reappears with
            // the execve), which the wait notices by its sweep.
            Event::Exiting(status) => {
                self.thread(tid).exit = Some(status);
                if sys::ptrace(libc::PTRACE_CONT, tid, 0, 0).is_ok() && tid != self.pid {
                    tids.insert(tid);
                }
            }
            Event::Exec => return Err(self.exec_error(what)),
            Event::Gone(status) => {
                self.threads.remove(&tid);
                if tid == self.pid {
                    return Err(self.leader_gone(status, what));
                }
            }
        }
        Ok(())
    }

    /// The error for a leader papirus can no longer wait for: the process
    /// ended, or (the pid still running, now untraced) a thread papirus did
    /// not hold yet replaced its image with execve.
    fn leader_gone(&mut self, status: Exit, what: &'static str) -> Error {
        if status == Exit::Unknown && task_alive(self.pid, self.pid) {
            self.exec_error(what)
        } else {
            Error::TargetExited { pid: self.pid, status, during: what }
        }
    }

    fn thread(&mut self, tid: i32) -> &mut Thread {
        self.threads.entry(tid).or_default()
    }

    /// Seizes and interrupts every thread in /proc/PID/task not yet ours; returns them.
    ///
    /// PTRACE_SEIZE waits for the lock an execve holds from its start to its
    /// end, and the execve waits for papirus to let go of the threads it
    /// kills (their exit stops, their zombies): a seize that waited then
    /// would wait for ever. So a thread papirus already traces
    /// (auto-attached through a clone event not read yet) is taken without
    /// a seize, and a seize that waits is cut short
    /// ([`sys::seize_bounded`]): papirus then lets the held threads go on
    /// dying, which ends with [`Error::Exec`] once the execve is through.
    fn seize_new_tasks(&mut self) -> Result<BTreeSet<i32>> {
        let mut fresh = BTreeSet::new();
        let me = std::process::id().to_string();
        let deadline = Instant::now() + self.timeout;
        for tid in task_ids(self.pid)? {
            if self.threads.contains_key(&tid) {
                continue;
            }
            if status_field(tid, "TracerPid").is_none_or(|t| t != me) {
                let seized = loop {
                    match sys::seize_bounded(tid, self.options.bits(), SEIZE_PATIENCE) {
                        Err(Errno::EINTR) if Instant::now() < deadline => {
                            self.sweep(&mut BTreeSet::new(), "a stop of every thread")?
                        }
                        r => break r,
                    }
                };
                match seized {
                    Ok(()) => {}
                    // Exited between the listing and the seize.
                    Err(Errno::ESRCH) => continue,
                    // Auto-attached meanwhile, or a zombie thread.
                    Err(Errno::EPERM) => match status_field(tid, "TracerPid") {
                        Some(t) if t == me => {}
                        _ => continue,
                    },
                    Err(errno) => return Err(Error::Ptrace { op: "PTRACE_SEIZE", tid, errno }),
                }
            }
            self.threads.insert(tid, Thread::default());
            self.interrupt(tid)?;
            fresh.insert(tid);
        }
        Ok(fresh)
    }

    /// Detaches every thread, delivering held signals; empties the thread table.
    fn release(&mut self) -> Result<()> {
        self.drop_stub();
        self.drop_slack();
        let mut first_err = None;
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in tids {
            if let Err(e) = self.resume(tid, libc::PTRACE_DETACH) {
                first_err.get_or_insert(e);
            }
        }
        self.threads.clear();
        first_err.map_or(Ok(()), Err)
    }

    /// Forgets a thread that vanished, reaping it if it left a traced zombie.
    /// A thread that is not in a stop although papirus held it was woken by
    /// a SIGKILL (the process' end, or another thread's execve): it stays
    /// known as exiting until it reports its end, since whatever killed it
    /// waits for papirus to let it go.
    fn reap(&mut self, tid: i32) {
        match sys::waitpid(tid, libc::__WALL | libc::WNOHANG) {
            Ok(None) if task_alive(self.pid, tid) || status_field(tid, "State").is_some() => {
                self.thread(tid).exit = Some(Exit::Signal(libc::SIGKILL));
            }
            Ok(Some(status)) if matches!(wait::classify(tid, status), Event::Exiting(_)) => {
                self.thread(tid).exit = Some(Exit::Signal(libc::SIGKILL));
                let _ = sys::ptrace(libc::PTRACE_CONT, tid, 0, 0);
            }
            _ => {
                self.threads.remove(&tid);
            }
        }
    }

    /// Checks that `tid` is one of our stopped threads and can run code.
    fn usable(&self, tid: i32) -> Result<()> {
        match self.threads.get(&tid) {
            Some(t) if t.exit.is_none() => Ok(()),
            Some(_) => Err(self.ending("running code").unwrap_or_else(|| Error::InvalidArgument {
                what: format!("thread {tid} is exiting and cannot run code"),
            })),
            None => Err(Error::InvalidArgument {
                what: format!("{tid} is not a thread of pid {} held by papirus", self.pid),
            }),
        }
    }

    /// The process called execve: every address papirus knew (its stub region,
    /// its restore block, lock code) belongs to the old image, so forget
    /// them; nothing is ever run or written there again.
    fn exec_error(&mut self, during: &'static str) -> Error {
        self.stub = None;
        self.slack = None;
        self.lock_code = None;
        Error::Exec { pid: self.pid, during }
    }

    /// The process' end when every held thread is on its way out
    /// (exit_group or a fatal signal).
    fn ending(&self, during: &'static str) -> Option<Error> {
        if !self.threads.values().all(|t| t.exit.is_some()) {
            return None;
        }
        let status = self.threads.get(&self.pid).and_then(|t| t.exit).unwrap_or(Exit::Unknown);
        Some(self.exited(during, status))
    }

    fn exited(&self, during: &'static str, status: Exit) -> Error {
        Error::TargetExited { pid: self.pid, status, during }
    }
}

#[cfg(test)]
impl Process {
    /// Lets every thread go as papirus' death would: nothing put back,
    /// nothing unmapped, no thread stopped again first.
    fn vanish(mut self) {
        self.slack = None;
        self.stub = None;
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            let _ = sys::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
        }
        self.threads.clear();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

fn req_name(req: libc::c_uint) -> &'static str {
    match req {
        libc::PTRACE_CONT => "PTRACE_CONT",
        libc::PTRACE_DETACH => "PTRACE_DETACH",
        _ => "ptrace",
    }
}

fn proc_path(pid: i32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

fn read_proc(pid: i32, file: &str) -> Result<String> {
    let path = proc_path(pid, file);
    std::fs::read_to_string(&path).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NoSuchProcess { pid },
        _ => Error::Io { path, source },
    })
}

/// A `Name:\tvalue` field of /proc/PID/status.
fn status_field(pid: i32, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(proc_path(pid, "status")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_string()))
}

/// The thread ids listed in /proc/PID/task.
fn task_ids(pid: i32) -> Result<Vec<i32>> {
    let path = proc_path(pid, "task");
    let dir = std::fs::read_dir(&path).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NoSuchProcess { pid },
        _ => Error::Io { path: path.clone(), source },
    })?;
    Ok(dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

/// Whether thread `tid` of `pid` still exists and has not exited.
fn task_alive(pid: i32, tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z" && st != "X"))
        })
        .unwrap_or(false)
}

/// The kernel's PF_KTHREAD flag in /proc/PID/stat.
const PF_KTHREAD: u64 = 0x0020_0000;

/// How long a zombie leader is given to turn out to be in an execve
/// another thread makes, and the longest that execve is waited for.
const EXEC_SETTLE: Duration = Duration::from_millis(100);

/// Whether process `pid`'s leader is a zombie that may still come back from
/// an execve of another thread: for [`EXEC_SETTLE`] after `since`, and while
/// some thread of it is inside execve (up to [`DEFAULT_TIMEOUT`]: papirus
/// does not hold it, so nothing of ours keeps it waiting).
fn exec_settling(pid: i32, since: Instant) -> bool {
    let zombie = read_proc(pid, "stat")
        .is_ok_and(|st| st.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with(['Z', 'X'])));
    let waited = since.elapsed();
    zombie && (waited < EXEC_SETTLE || (waited < DEFAULT_TIMEOUT && in_execve(pid)))
}

/// Whether some thread of `pid` is inside execve or execveat.
fn in_execve(pid: i32) -> bool {
    task_ids(pid).unwrap_or_default().into_iter().any(|tid| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
            .is_ok_and(|s| s.starts_with("59 ") || s.starts_with("322 "))
    })
}

/// Refuses pids that cannot be traced before touching them.
fn precheck(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(Error::NoSuchProcess { pid });
    }
    if pid as u32 == std::process::id() {
        return Err(Error::SelfTrace { pid });
    }
    // A leader in execve passes through the zombie state for a moment: a
    // real zombie stays one.
    let since = Instant::now();
    while exec_settling(pid, since) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stat = read_proc(pid, "stat")?;
    // "pid (comm) S ppid ...": comm may contain spaces and parentheses.
    let (head, rest) = stat.rsplit_once(")").ok_or(Error::NoSuchProcess { pid })?;
    let name = head.split_once('(').map_or("", |(_, n)| n).to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().copied().unwrap_or("?");
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if flags & PF_KTHREAD != 0 {
        return Err(Error::KernelThread { pid, name });
    }
    if (state == "Z" || state == "X") && task_ids(pid)?.len() <= 1 {
        return Err(Error::Zombie { pid });
    }
    if let Some(tgid) = status_field(pid, "Tgid").and_then(|t| t.parse::<i32>().ok())
        && tgid != pid
    {
        return Err(Error::InvalidArgument {
            what: format!(
                "{pid} is a thread of process {tgid}: attach to {tgid}, which stops all its threads"
            ),
        });
    }
    Ok(())
}

fn seize_error(pid: i32, errno: Errno) -> Error {
    match errno {
        Errno::ESRCH => Error::NoSuchProcess { pid },
        Errno::EPERM => Error::PermissionDenied { pid, reason: permission_reason(pid) },
        errno => Error::Ptrace { op: "PTRACE_SEIZE", tid: pid, errno },
    }
}

/// CAP_SYS_PTRACE's bit in CapEff.
const CAP_SYS_PTRACE: u32 = 19;
/// CAP_SYS_ADMIN's bit in CapEff.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether the kernel lets papirus set PTRACE_O_SUSPEND_SECCOMP: CAP_SYS_ADMIN,
/// and papirus itself not under seccomp.
fn may_suspend_seccomp() -> bool {
    let me = std::process::id() as i32;
    let has_cap = status_field(me, "CapEff")
        .and_then(|c| u64::from_str_radix(&c, 16).ok())
        .is_some_and(|c| c & (1 << CAP_SYS_ADMIN) != 0);
    has_cap && status_field(me, "Seccomp").as_deref().is_none_or(|m| m == "0")
}

fn permission_reason(pid: i32) -> PermissionReason {
    if let Some(tracer) = status_field(pid, "TracerPid").and_then(|t| t.parse::<i32>().ok())
        && tracer != 0
    {
        return PermissionReason::AlreadyTraced { tracer };
    }
    let me = std::process::id() as i32;
    let has_cap = status_field(me, "CapEff")
        .and_then(|c| u64::from_str_radix(&c, 16).ok())
        .is_some_and(|c| c & (1 << CAP_SYS_PTRACE) != 0);
    let owner = status_field(pid, "Uid").and_then(|u| u.split_whitespace().next()?.parse::<u32>().ok());
    let us = status_field(me, "Uid").and_then(|u| u.split_whitespace().nth(1)?.parse::<u32>().ok());
    if let (Some(owner), Some(us)) = (owner, us)
        && owner != us
        && !has_cap
    {
        return PermissionReason::NotOurs { owner, us };
    }
    if let Ok(scope) = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        && let Ok(n) = scope.trim().parse::<u8>()
        && (n >= 2 || (n == 1 && !has_cap))
    {
        return PermissionReason::PtraceScope(n);
    }
    PermissionReason::Other
}

fn open_mem(pid: i32) -> Result<File> {
    let path = proc_path(pid, "mem");
    std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|source| {
        match source.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NoSuchProcess { pid },
            _ => Error::Io { path, source },
        }
    })
}
