//! Errors of the dynamic-instrumentation layer.

use std::fmt;
use std::path::PathBuf;

use nix::errno::Errno;

use crate::process::Exit;

/// Errors of papirus-probe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A substrate failure (ELF, perf).
    #[error(transparent)]
    Substrate(#[from] papirus_substrate::Error),
    /// Patching a process's code failed.
    #[error(transparent)]
    Patch(#[from] crate::patch::PatchError),
    /// A program, process or module that cannot be listed.
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    /// A file refused or unreadable (not regular, too large, not the mapped one).
    #[error(transparent)]
    Input(#[from] papirus_substrate::input::InputError),

    /// No process (or thread) with this id exists.
    #[error("no process with pid {pid}: check the pid (ps -p {pid})")]
    NoSuchProcess {
        /// The pid asked for.
        pid: i32,
    },

    /// The kernel refused to let us trace the process.
    #[error("may not trace pid {pid}: {reason}")]
    PermissionDenied {
        /// The pid asked for.
        pid: i32,
        /// Why, as far as we can tell.
        reason: PermissionReason,
    },

    /// The target exited or was killed while we controlled it.
    #[error("pid {pid} ended while papirus controlled it ({status}) during {during}")]
    TargetExited {
        /// The process.
        pid: i32,
        /// Its exit code or fatal signal.
        status: Exit,
        /// What papirus was doing.
        during: &'static str,
    },

    /// The process is a zombie: it has exited and waits for its parent to reap it.
    #[error("pid {pid} is a zombie (exited, not yet reaped by its parent): nothing left to trace")]
    Zombie {
        /// The pid asked for.
        pid: i32,
    },

    /// The pid names a kernel thread, which has no user space to trace.
    #[error("pid {pid} is a kernel thread ({name}): it has no user-space code to trace")]
    KernelThread {
        /// The pid asked for.
        pid: i32,
        /// Its comm name.
        name: String,
    },

    /// Attaching to papirus' own process.
    #[error("pid {pid} is papirus' own process: a process cannot trace itself")]
    SelfTrace {
        /// The pid asked for.
        pid: i32,
    },

    /// The program to start is not an ELF executable.
    #[error("{} is not an ELF executable ({detail}): give a compiled program, not a script or data file", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },

    /// The program to start does not exist.
    #[error("program {} not found: check the path (or PATH)", path.display())]
    MissingProgram {
        /// The path or name given.
        path: PathBuf,
    },

    /// The program can start but papirus cannot instrument it as asked.
    #[error("refusing to start {}: {reason}", path.display())]
    Unsupported {
        /// The program.
        path: PathBuf,
        /// Why, and what to do instead.
        reason: String,
    },

    /// The target replaced its program image (execve) while papirus worked on it:
    /// nothing was or will be written into the new image.
    #[error(
        "pid {pid} called execve during {during}: its old code is gone, so papirus wrote nothing into the new program and stopped; attach again to instrument the new program"
    )]
    Exec {
        /// The process.
        pid: i32,
        /// What papirus was doing.
        during: &'static str,
    },

    /// The target runs under a seccomp filter and papirus cannot suspend it.
    #[error(
        "pid {pid} runs under a seccomp filter (Seccomp: {mode} in /proc/{pid}/status) and papirus lacks CAP_SYS_ADMIN to suspend it while it works ({detail}); the remote mprotect/mmap could kill the target, so nothing was touched: run papirus-probe with CAP_SYS_ADMIN"
    )]
    Seccomp {
        /// The process.
        pid: i32,
        /// The mode: 1 strict, 2 filter.
        mode: u8,
        /// What the kernel said.
        detail: String,
    },

    /// Starting the program failed.
    #[error("cannot start {}: {op} failed: {errno}", path.display())]
    Spawn {
        /// The program.
        path: PathBuf,
        /// The failing step (fork, execve, pipe).
        op: &'static str,
        /// The errno.
        errno: Errno,
    },

    /// A ptrace request (or wait for a ptrace stop) failed.
    #[error("ptrace {op} on tid {tid} failed: {errno}")]
    Ptrace {
        /// The request.
        op: &'static str,
        /// The thread.
        tid: i32,
        /// The errno.
        errno: Errno,
    },

    /// A thread did not stop (or a remote call did not return) in time.
    #[error("tid {tid} did not {what} within {timeout_ms} ms")]
    Timeout {
        /// What we waited for.
        what: &'static str,
        /// The thread.
        tid: i32,
        /// How long we waited.
        timeout_ms: u64,
    },

    /// Reading or writing the target's memory failed.
    #[error("cannot {op} {len} bytes at {addr:#x} in pid {pid}: {errno}")]
    Memory {
        /// `read` or `write`.
        op: &'static str,
        /// The process.
        pid: i32,
        /// First address.
        addr: u64,
        /// Length asked for.
        len: usize,
        /// The errno.
        errno: Errno,
    },

    /// A system call run inside the target returned an error.
    #[error("remote {name} in pid {pid} failed: {errno}")]
    RemoteSyscall {
        /// The system call.
        name: &'static str,
        /// The process.
        pid: i32,
        /// Its errno.
        errno: Errno,
    },

    /// Code run inside the target faulted instead of returning.
    #[error("remote call to {func:#x} in tid {tid} stopped by {} at rip {rip:#x} (fault address {addr:#x}); registers restored", crate::process::signal_name(*signal))]
    RemoteFault {
        /// The function called.
        func: u64,
        /// The thread.
        tid: i32,
        /// The signal number.
        signal: i32,
        /// Where the thread stopped.
        rip: u64,
        /// The faulting address from siginfo.
        addr: u64,
    },

    /// No free range within ±2 GiB of the given code.
    #[error("no free {len}-byte range within ±2 GiB of {near:#x} in pid {pid}")]
    NoNearMemory {
        /// The process.
        pid: i32,
        /// The code the memory must reach.
        near: u64,
        /// Bytes asked for.
        len: u64,
    },

    /// A module or symbol needed in the target is absent.
    #[error("{what} not found in pid {pid}: {detail}")]
    NotFound {
        /// What was looked for.
        what: String,
        /// The process.
        pid: i32,
        /// Where we looked.
        detail: String,
    },

    /// `dlopen` in the target returned NULL.
    #[error("dlopen({}) in pid {pid} failed: {message}", path.display())]
    Dlopen {
        /// The library.
        path: PathBuf,
        /// The process.
        pid: i32,
        /// dlerror()'s text.
        message: String,
    },

    /// An argument papirus cannot act on.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What is wrong.
        what: String,
    },

    /// A file under /proc (or another file) could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why the kernel refused `PTRACE_SEIZE`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PermissionReason {
    /// Yama's kernel.yama.ptrace_scope forbids it (1: descendants only, 2: admin only, 3: never).
    PtraceScope(u8),
    /// The process belongs to another user and we lack CAP_SYS_PTRACE.
    NotOurs {
        /// The target's real uid.
        owner: u32,
        /// Our effective uid.
        us: u32,
    },
    /// Another tracer (a debugger, strace) is attached already.
    AlreadyTraced {
        /// The tracer's pid.
        tracer: i32,
    },
    /// EPERM with none of the above: a non-dumpable process, another user namespace, an LSM.
    Other,
}

impl fmt::Display for PermissionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PtraceScope(n) => write!(
                f,
                "kernel.yama.ptrace_scope={n} forbids it (run as root, start the program under papirus, or lower the sysctl)"
            ),
            Self::NotOurs { owner, us } => write!(
                f,
                "it belongs to uid {owner} and we run as uid {us} without CAP_SYS_PTRACE (run as that user or as root)"
            ),
            Self::AlreadyTraced { tracer } => {
                write!(f, "it is already traced by pid {tracer} (a debugger or strace): detach that first")
            }
            Self::Other => write!(
                f,
                "EPERM (non-dumpable process, another user namespace or a security module): run as root"
            ),
        }
    }
}

/// The result type of papirus-probe.
pub type Result<T, E = Error> = std::result::Result<T, E>;
