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
//! - **papirus may die at any moment.** Remote code restores its thread by
//!   itself through `rt_sigreturn` (`restoring`); after remote code every thread
//!   is back in a plain interrupt stop, with no trap flag and no signal of ours
//!   pending; `PTRACE_O_EXITKILL` is never set.
//! - **Signals are never lost.** A signal arriving while a thread is held is
//!   kept and delivered when the thread resumes (or re-queued when the thread
//!   no longer sits in its delivery stop).
//! - **A changed image is never written.** An execve during a stop is
//!   [`Error::Exec`]; [`Process::image`] / [`Process::check_image`] tell whether
//!   one happened while papirus was detached.
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
    syscall_insn: Option<u64>,
    /// Code ranges where a stopped thread may hold a lock remote calls need
    /// (loader, allocator, fork), computed at the first remote call.
    lock_code: Option<Vec<(u64, u64)>>,
    /// The page of the self-restoring stub (`restoring`), once mapped.
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
        for _ in 0..EXEC_SETTLE_ROUNDS {
            let exiting = read_proc(pid, "stat")
                .is_ok_and(|st| st.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with(['Z', 'X'])));
            if seized != Err(Errno::EPERM) || !exiting {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
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
        // Every thread on its way out: the process is ending (exit_group or a fatal signal).
        if p.threads.values().all(|t| t.exit.is_some()) {
            let status = p.threads.get(&pid).and_then(|t| t.exit).unwrap_or(Exit::Unknown);
            return Err(p.exited("attach", status));
        }
        Ok(p)
    }

    fn held(pid: i32, mem: File, child: bool) -> Process {
        Process {
            pid,
            threads: BTreeMap::new(),
            mem,
            child,
            worker: pid,
            options: OPTIONS,
            syscall_insn: None,
            lock_code: None,
            stub: None,
            timeout: DEFAULT_TIMEOUT,
            _not_send: PhantomData,
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Thread ids of every stopped thread, the leader first when it is alive.
    pub fn threads(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.threads.keys().copied().collect();
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
                            return Err(self.exited("a run of the whole process", status));
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
        self.stop_all()
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
        let tids: BTreeSet<i32> = self.threads.keys().copied().collect();
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
    fn wait_stopped(&mut self, mut tids: BTreeSet<i32>, what: &'static str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_micros(5);
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
            Event::Exiting(Exit::Signal(libc::SIGKILL)) => {
                self.thread(tid).exit = Some(Exit::Signal(libc::SIGKILL));
                if sys::ptrace(libc::PTRACE_CONT, tid, 0, 0).is_ok() {
                    tids.insert(tid);
                }
            }
            Event::Exiting(status) => self.thread(tid).exit = Some(status),
            Event::Exec => return Err(self.exec_error(what)),
            Event::Gone(status) => {
                self.threads.remove(&tid);
                if tid == self.pid {
                    return Err(Error::TargetExited { pid: self.pid, status, during: what });
                }
            }
        }
        Ok(())
    }

    fn thread(&mut self, tid: i32) -> &mut Thread {
        self.threads.entry(tid).or_default()
    }

    /// Seizes and interrupts every thread in /proc/PID/task not yet ours; returns them.
    fn seize_new_tasks(&mut self) -> Result<BTreeSet<i32>> {
        let mut fresh = BTreeSet::new();
        for tid in task_ids(self.pid)? {
            if self.threads.contains_key(&tid) {
                continue;
            }
            match ptrace::seize(Pid::from_raw(tid), self.options) {
                Ok(()) => {}
                // Exited between the listing and the seize.
                Err(Errno::ESRCH) => continue,
                // Auto-attached through a clone event we have not read yet, or a zombie thread.
                Err(Errno::EPERM) => match status_field(tid, "TracerPid") {
                    Some(t) if t == std::process::id().to_string() => {}
                    _ => continue,
                },
                Err(errno) => return Err(Error::Ptrace { op: "PTRACE_SEIZE", tid, errno }),
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
    fn reap(&mut self, tid: i32) {
        let _ = sys::waitpid(tid, libc::__WALL | libc::WNOHANG);
        self.threads.remove(&tid);
    }

    /// Checks that `tid` is one of our stopped threads and can run code.
    fn usable(&self, tid: i32) -> Result<()> {
        match self.threads.get(&tid) {
            Some(t) if t.exit.is_none() => Ok(()),
            Some(_) => {
                Err(Error::InvalidArgument { what: format!("thread {tid} is exiting and cannot run code") })
            }
            None => Err(Error::InvalidArgument {
                what: format!("{tid} is not a thread of pid {} held by papirus", self.pid),
            }),
        }
    }

    /// The process called execve: every address papirus knew (its stub page,
    /// the syscall instruction, lock code) belongs to the old image, so forget
    /// them; nothing is ever run or written there again.
    fn exec_error(&mut self, during: &'static str) -> Error {
        self.stub = None;
        self.syscall_insn = None;
        self.lock_code = None;
        Error::Exec { pid: self.pid, during }
    }

    fn exited(&self, during: &'static str, status: Exit) -> Error {
        Error::TargetExited { pid: self.pid, status, during }
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
        libc::PTRACE_SINGLESTEP => "PTRACE_SINGLESTEP",
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

/// Refuses pids that cannot be traced before touching them.
/// Rounds of 5 ms a zombie leader is given to turn out to be in execve.
const EXEC_SETTLE_ROUNDS: usize = 20;

fn precheck(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(Error::NoSuchProcess { pid });
    }
    if pid as u32 == std::process::id() {
        return Err(Error::SelfTrace { pid });
    }
    // A leader in execve passes through the zombie state for a moment: a
    // real zombie stays one.
    let mut stat = read_proc(pid, "stat")?;
    for _ in 0..EXEC_SETTLE_ROUNDS {
        if !stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with(['Z', 'X'])) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        stat = read_proc(pid, "stat")?;
    }
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
