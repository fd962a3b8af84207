//! Starting a program stopped at its ELF entry point.
//!
//! fork; the child waits on a pipe until the parent has seized it, then execs;
//! the exec event stops it in the fresh image; a temporary int3 at the entry
//! (AT_ENTRY: e_entry plus the load bias) lets the dynamic loader map and
//! initialise the libraries, and stops the program before `_start`, so before
//! `main` and before the main program's own constructors (run by `_start`'s
//! `__libc_start_main`). The int3 is then removed and rip set back to the entry.

use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::ptrace::{self, Options};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, pipe2};

use super::wait::{self, Event};
use super::{OPTIONS, Process, Thread, open_mem, sys};
use crate::error::{Error, Result};

/// `AT_ENTRY` in the aux vector.
const AT_ENTRY: u64 = 9;
const INT3: u8 = 0xcc;

/// How to start a program under papirus' control (builder; `spawn` may be called repeatedly).
#[derive(Debug)]
pub struct Spawn {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    clear_env: bool,
    preload: Vec<PathBuf>,
    stdio: [Option<OwnedFd>; 3],
}

impl Spawn {
    /// A program (a path, or a name looked up in PATH), with no arguments, our
    /// environment, and our stdin/stdout/stderr.
    pub fn new(program: impl AsRef<Path>) -> Spawn {
        Spawn {
            program: program.as_ref().to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            clear_env: false,
            preload: Vec::new(),
            stdio: [None, None, None],
        }
    }

    /// Adds an argument (after `argv[0]`, which is the program as given).
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, args: I) -> &mut Self {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Sets an environment variable (overriding ours).
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.env.push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Starts from an empty environment instead of ours.
    pub fn env_clear(&mut self) -> &mut Self {
        self.clear_env = true;
        self
    }

    /// Preloads a shared library (LD_PRELOAD, ahead of any LD_PRELOAD already set).
    pub fn preload(&mut self, library: impl AsRef<Path>) -> &mut Self {
        self.preload.push(library.as_ref().to_path_buf());
        self
    }

    /// The program's stdin.
    pub fn stdin(&mut self, fd: impl Into<OwnedFd>) -> &mut Self {
        self.stdio[0] = Some(fd.into());
        self
    }

    /// The program's stdout.
    pub fn stdout(&mut self, fd: impl Into<OwnedFd>) -> &mut Self {
        self.stdio[1] = Some(fd.into());
        self
    }

    /// The program's stderr.
    pub fn stderr(&mut self, fd: impl Into<OwnedFd>) -> &mut Self {
        self.stdio[2] = Some(fd.into());
        self
    }

    /// Starts the program and returns it stopped at its entry point, one thread
    /// (plus any a preloaded library's constructor started), all stopped.
    pub fn spawn(&self) -> Result<Process> {
        let path = resolve(&self.program)?;
        check_elf(&path)?;
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|_| Error::InvalidArgument {
                what: "a NUL byte in an argument or the environment".into(),
            })
        };
        let c_path = cstr(path.as_os_str().as_bytes())?;
        let mut argv_c = vec![cstr(self.program.as_os_str().as_bytes())?];
        for a in &self.args {
            argv_c.push(cstr(a.as_bytes())?);
        }
        let mut envp_c = Vec::new();
        for (k, v) in self.environment() {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp_c.push(cstr(&kv)?);
        }
        let argv: Vec<*const libc::c_char> =
            argv_c.iter().map(|c| c.as_ptr()).chain([std::ptr::null()]).collect();
        let envp: Vec<*const libc::c_char> =
            envp_c.iter().map(|c| c.as_ptr()).chain([std::ptr::null()]).collect();
        let spawn_err = |op, errno| Error::Spawn { path: path.clone(), op, errno };
        let (go_r, go_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err("pipe2", e))?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err("pipe2", e))?;
        let stdio: Vec<(i32, i32)> = self
            .stdio
            .iter()
            .enumerate()
            .filter_map(|(i, fd)| Some((fd.as_ref()?.as_raw_fd(), i as i32)))
            .collect();
        let plan = sys::ChildPlan {
            path: &c_path,
            argv: &argv,
            envp: &envp,
            stdio: &stdio,
            go: go_r.as_raw_fd(),
            close: &[go_w.as_raw_fd(), err_r.as_raw_fd()],
            err: err_w.as_raw_fd(),
        };
        let pid = sys::fork_exec(&plan).map_err(|e| spawn_err("fork", e))?;
        drop((go_r, err_w));
        let kill_child = || {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            // A child stopped at its exit event ignores SIGKILL until released.
            let _ = sys::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
            let _ = wait::poll(pid, libc::__WALL, Instant::now() + super::DEFAULT_TIMEOUT);
        };
        if let Err(errno) = ptrace::seize(Pid::from_raw(pid), OPTIONS | Options::PTRACE_O_TRACEEXEC) {
            kill_child();
            return Err(Error::Ptrace { op: "PTRACE_SEIZE", tid: pid, errno });
        }
        let _ = nix::unistd::write(&go_w, &[1]);
        drop(go_w);
        // EOF: execve closed the close-on-exec pipe; 4 bytes: its errno.
        let mut errno_bytes = Vec::new();
        let _ = std::fs::File::from(err_r).read_to_end(&mut errno_bytes);
        if let Ok(b) = <[u8; 4]>::try_from(errno_bytes.as_slice()) {
            kill_child();
            return Err(match Errno::from_raw(i32::from_ne_bytes(b)) {
                Errno::ENOENT => Error::MissingProgram { path },
                Errno::ENOEXEC => {
                    Error::NotElf { path, detail: "the kernel cannot execute it (ENOEXEC)".into() }
                }
                errno => spawn_err("execve", errno),
            });
        }
        let mut p = match wait_exec(pid).and_then(|()| open_mem(pid)) {
            Ok(mem) => Process::held(pid, mem, true),
            Err(e) => {
                kill_child();
                return Err(e);
            }
        };
        p.threads.insert(pid, Thread::default());
        match p.run_to_entry() {
            Ok(()) => Ok(p),
            Err(e) => {
                p.threads.clear();
                kill_child();
                Err(e)
            }
        }
    }

    fn environment(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> =
            if self.clear_env { Vec::new() } else { std::env::vars_os().collect() };
        for (k, v) in &self.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        if !self.preload.is_empty() {
            let mut value = OsString::new();
            for (i, p) in self.preload.iter().enumerate() {
                if i > 0 {
                    value.push(":");
                }
                value.push(p.as_os_str());
            }
            if let Some((_, old)) = env.iter().find(|(k, _)| k == "LD_PRELOAD") {
                value.push(":");
                value.push(old);
            }
            env.retain(|(k, _)| k != "LD_PRELOAD");
            env.push(("LD_PRELOAD".into(), value));
        }
        env
    }
}

/// A name without a slash is looked up in PATH, as execvp does.
fn resolve(program: &Path) -> Result<PathBuf> {
    let missing = || Error::MissingProgram { path: program.to_path_buf() };
    if program.as_os_str().as_bytes().contains(&b'/') {
        return if program.exists() { Ok(program.to_path_buf()) } else { Err(missing()) };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file()).ok_or_else(missing)
}

/// Refuses scripts and data files before forking, with what they are.
fn check_elf(path: &Path) -> Result<()> {
    let not_elf = |detail: String| Error::NotElf { path: path.to_path_buf(), detail };
    if path.is_dir() {
        return Err(not_elf("a directory".into()));
    }
    let mut magic = [0u8; 4];
    // O_NONBLOCK: a FIFO named as the program must not hang the open.
    let opened = std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().read(true),
        libc::O_NONBLOCK | libc::O_NOCTTY,
    )
    .open(path);
    let n = match opened {
        Ok(mut f) => f.read(&mut magic).unwrap_or(0),
        // Unreadable but maybe executable: let execve decide.
        Err(_) => return Ok(()),
    };
    match &magic[..n] {
        b"\x7fELF" => Ok(()),
        [] => Err(not_elf("an empty file".into())),
        [b'#', b'!', ..] => Err(not_elf("a script (#!): start its interpreter instead".into())),
        other => Err(not_elf(format!("it starts with bytes {other:02x?}, not 7f 45 4c 46"))),
    }
}

/// Waits for the exec event of a freshly seized child, passing on any signal.
fn wait_exec(pid: i32) -> Result<()> {
    let deadline = Instant::now() + super::DEFAULT_TIMEOUT;
    loop {
        match wait::event(pid, deadline)? {
            Some(Event::Exec) => return Ok(()),
            Some(Event::Gone(status)) | Some(Event::Exiting(status)) => {
                return Err(Error::TargetExited { pid, status, during: "execve" });
            }
            Some(Event::Signal(sig)) => pass(pid, sig)?,
            Some(_) => pass(pid, 0)?,
            None => {
                return Err(Error::Timeout {
                    what: "complete execve",
                    tid: pid,
                    timeout_ms: super::DEFAULT_TIMEOUT.as_millis() as u64,
                });
            }
        }
    }
}

fn pass(tid: i32, sig: i32) -> Result<()> {
    sys::ptrace(libc::PTRACE_CONT, tid, 0, sig as u64).map(drop).map_err(|errno| Error::Ptrace {
        op: "PTRACE_CONT",
        tid,
        errno,
    })
}

impl Process {
    /// The entry point of the main program (AT_ENTRY: e_entry plus the load bias).
    pub fn entry_point(&self) -> Result<u64> {
        let path = super::proc_path(self.pid, "auxv");
        let auxv = std::fs::read(&path).map_err(|source| Error::Io { path, source })?;
        auxv.chunks_exact(16)
            .map(|c| {
                (
                    u64::from_ne_bytes(c[..8].try_into().unwrap_or_default()),
                    u64::from_ne_bytes(c[8..].try_into().unwrap_or_default()),
                )
            })
            .find(|&(k, _)| k == AT_ENTRY)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::NotFound {
                what: "AT_ENTRY".into(),
                pid: self.pid,
                detail: "/proc/PID/auxv".into(),
            })
    }

    /// From the exec stop, runs the loader up to a temporary int3 at the entry point.
    fn run_to_entry(&mut self) -> Result<()> {
        let pid = self.pid;
        let entry = self.entry_point()?;
        let mut orig = [0u8];
        self.read_memory(entry, &mut orig)?;
        self.write_memory(entry, &[INT3])?;
        let reached = self.cont_to_trap(entry + 1);
        let restored = self.write_memory(entry, &orig);
        let mut regs = reached?;
        restored?;
        regs.rip = entry;
        self.set_regs(pid, &regs)
    }

    /// Continues the leader until SIGTRAP with rip == `at`, passing on other signals.
    fn cont_to_trap(&mut self, at: u64) -> Result<super::Regs> {
        let pid = self.pid;
        let deadline = Instant::now() + self.timeout;
        let mut sig = 0;
        loop {
            pass(pid, sig)?;
            sig = 0;
            match wait::event(pid, deadline)? {
                Some(Event::Signal(libc::SIGTRAP)) => {
                    let r = self.regs(pid)?;
                    if r.rip == at {
                        return Ok(r);
                    }
                    sig = libc::SIGTRAP;
                }
                Some(Event::Signal(s)) => sig = s,
                Some(Event::Stopped) | Some(Event::Exec) => {}
                Some(Event::Clone(new)) => {
                    self.threads.entry(new).or_default();
                    self.wait_stopped([new].into(), "stop")?;
                }
                Some(Event::Gone(status)) | Some(Event::Exiting(status)) => {
                    return Err(self.exited("start-up, before the entry point", status));
                }
                None => {
                    return Err(Error::Timeout {
                        what: "reach its entry point",
                        tid: pid,
                        timeout_ms: self.timeout.as_millis() as u64,
                    });
                }
            }
        }
    }
}
