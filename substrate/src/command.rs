//! A command started stopped right after its `exec`, so a tool can open
//! events on it (inherited by every thread it makes) before it runs a
//! single instruction of its own, with its binary already mapped: symbols
//! such as `mem:SYMBOL:x` resolve at their run-time addresses.
//!
//! The child asks to be traced (`PTRACE_TRACEME`) and stops with the
//! SIGTRAP of its exec; [`StoppedCommand::resume`] detaches without that
//! signal. A command never resumed is killed and reaped on drop.
//!
//! # Safety
//!
//! The `pre_exec` closure runs in the forked child, where only
//! async-signal-safe calls are allowed: it makes two raw syscalls and
//! allocates nothing. `ptrace`, `kill`, `waitpid` and `wait4` take plain
//! integers and out-pointers valid for the call.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// Why a command could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot run `{program}`: {source}{hint}")]
pub struct SpawnError {
    /// The program as given.
    pub program: String,
    /// What exec or the stop reported.
    #[source]
    pub source: std::io::Error,
    /// What the user can do about it, when known.
    pub hint: String,
}

/// How a command ended, as a shell reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(u8),
    /// Signal N ended it.
    Signal(i32),
}

impl Exit {
    /// The shell's number: the status, or 128 + the signal.
    pub fn code(self) -> u8 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => (128 + s).clamp(0, 255) as u8,
        }
    }

    fn from_wait_status(status: i32) -> Option<Exit> {
        if libc::WIFEXITED(status) {
            Some(Exit::Code(libc::WEXITSTATUS(status) as u8))
        } else if libc::WIFSIGNALED(status) {
            Some(Exit::Signal(libc::WTERMSIG(status)))
        } else {
            None
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit status {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// A child stopped after its `exec`, killed and reaped on drop unless resumed.
#[derive(Debug)]
pub struct StoppedCommand {
    pid: i32,
    resumed: bool,
    reaped: bool,
}

impl StoppedCommand {
    /// Starts `argv` (program first, looked up in `PATH`) stopped right
    /// after its `exec`. SIGINT is reset to its default in the child, so a
    /// tool that ignores ^C while it runs still lets ^C end the command.
    pub fn spawn(argv: &[OsString]) -> Result<StoppedCommand, SpawnError> {
        let program = argv.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let fail =
            |source: std::io::Error, hint: String| SpawnError { program: program.clone(), source, hint };
        let Some(first) = argv.first() else {
            return Err(fail(
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
                " (no command given)".into(),
            ));
        };
        let mut cmd = Command::new(first);
        cmd.args(&argv[1..]);
        // SAFETY: see the module's Safety section: two raw syscalls, no allocation.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // spawn returns once exec succeeded (or with exec's own error).
        let child = cmd.spawn().map_err(|e| {
            // Yama's ptrace_scope 2 and 3 refuse PTRACE_TRACEME to a user without CAP_SYS_PTRACE.
            let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
            let hint = match scope.trim() {
                "2" | "3" if e.raw_os_error() == Some(libc::EPERM) => format!(
                    " (kernel.yama.ptrace_scope is {}: the command is stopped at its exec with ptrace; \
                     run with CAP_SYS_PTRACE, or measure a running process with -p)",
                    scope.trim()
                ),
                _ => String::new(),
            };
            fail(e, hint)
        })?;
        let mut stopped = StoppedCommand { pid: child.id() as i32, resumed: false, reaped: false };
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer for the call.
        let r = unsafe { libc::waitpid(stopped.pid, &mut status, 0) };
        if r != stopped.pid || !libc::WIFSTOPPED(status) {
            stopped.reaped = r == stopped.pid;
            return Err(fail(
                std::io::Error::other(format!("it did not stop at its exec (wait status {status:#x})")),
                String::new(),
            ));
        }
        Ok(stopped)
    }

    /// The command's process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Lets the command run, without the SIGTRAP of its exec.
    pub fn resume(&mut self) -> std::io::Result<()> {
        // SAFETY: PTRACE_DETACH of our stopped tracee; addr and data are 0.
        if unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid, 0, 0) } == -1 {
            return Err(std::io::Error::last_os_error());
        }
        self.resumed = true;
        Ok(())
    }

    /// Whether the resumed command has ended, without waiting: its exit,
    /// reaped, or `None` while it runs.
    pub fn try_wait(&mut self) -> std::io::Result<Option<Exit>> {
        self.wait_with(libc::WNOHANG)
    }

    /// Waits for the resumed command to end and reaps it.
    pub fn wait(&mut self) -> std::io::Result<Exit> {
        loop {
            if let Some(e) = self.wait_with(0)? {
                return Ok(e);
            }
        }
    }

    /// Waits for the resumed command to end and reaps it (`wait4`): how it
    /// ended, and the user and system CPU time it and the children it
    /// waited for used.
    pub fn wait_usage(&mut self) -> std::io::Result<(Exit, Duration, Duration)> {
        if self.reaped {
            return Err(std::io::Error::other("the command was already reaped"));
        }
        loop {
            let mut status = 0;
            // SAFETY: an all-zero rusage is a valid value of that plain C struct.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `status` and `ru` are valid out-pointers; `pid` is our own unreaped child.
            let r = unsafe { libc::wait4(self.pid, &mut status, 0, &mut ru) };
            if r == -1 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let Some(exit) = Exit::from_wait_status(status) else { continue };
            self.reaped = true;
            let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
            return Ok((exit, time(ru.ru_utime), time(ru.ru_stime)));
        }
    }

    fn wait_with(&mut self, flags: i32) -> std::io::Result<Option<Exit>> {
        if self.reaped {
            return Err(std::io::Error::other("the command was already reaped"));
        }
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is our own unreaped child.
        let r = unsafe { libc::waitpid(self.pid, &mut status, flags) };
        if r == -1 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted { Ok(None) } else { Err(e) };
        }
        if r == 0 {
            return Ok(None);
        }
        let exit = Exit::from_wait_status(status);
        self.reaped = exit.is_some();
        Ok(exit)
    }
}

impl Drop for StoppedCommand {
    fn drop(&mut self) {
        if !self.resumed && !self.reaped {
            // SAFETY: `pid` is our own unreaped child, so no other process is
            // hit; the status pointer may be null.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_only_when_resumed_and_reports_its_status() {
        let argv: Vec<OsString> = ["sh", "-c", "exit 7"].iter().map(OsString::from).collect();
        let mut c = StoppedCommand::spawn(&argv).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.pid())).unwrap();
        let state = stat.rsplit(')').next().unwrap().split_whitespace().next().unwrap();
        assert_eq!(state, "t", "stopped by ptrace at its exec: {stat}");
        c.resume().unwrap();
        assert_eq!(c.wait().unwrap(), Exit::Code(7));
        let argv: Vec<OsString> = ["sh", "-c", "kill -TERM $$"].iter().map(OsString::from).collect();
        let mut c = StoppedCommand::spawn(&argv).unwrap();
        c.resume().unwrap();
        let e = c.wait().unwrap();
        assert_eq!((e, e.code()), (Exit::Signal(libc::SIGTERM), 143));
    }

    #[test]
    fn a_command_never_resumed_is_killed() {
        let argv: Vec<OsString> = ["sleep", "100"].iter().map(OsString::from).collect();
        let pid = StoppedCommand::spawn(&argv).unwrap().pid();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "reaped on drop");
        let e = StoppedCommand::spawn(&[OsString::from("/nonexistent/papirus")]).unwrap_err();
        assert_eq!(e.source.kind(), std::io::ErrorKind::NotFound, "{e}");
    }
}
