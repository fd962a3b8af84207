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
use nix::sys::ptrace;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, pipe2};

use super::wait::{self, Event};
use super::{OPTIONS, Process, Thread, open_mem, sys};
use crate::error::{Error, Result};

/// `AT_ENTRY` in the aux vector.
const AT_ENTRY: u64 = 9;
/// `AT_BASE`: where the program interpreter (the dynamic loader) is mapped; 0 without one.
const AT_BASE: u64 = 7;
/// `AT_RANDOM`: the address of 16 bytes the kernel fills at random for each execve.
const AT_RANDOM: u64 = 25;

/// One program image of a process: the 16 random bytes execve left at AT_RANDOM
/// (a new execve, even of the same file, gives new ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Image {
    at: u64,
    random: [u8; 16],
}

impl Image {
    /// The image process `pid` runs, looked at without holding it (as
    /// before a seize: an execve between this look and the seize shows as
    /// another image).
    pub fn of(pid: i32) -> Result<Image> {
        let at = auxv(pid, AT_RANDOM, "AT_RANDOM")?;
        let mut random = [0u8; 16];
        let remote = [nix::sys::uio::RemoteIoVec { base: at as usize, len: 16 }];
        let done = nix::sys::uio::process_vm_readv(
            Pid::from_raw(pid),
            &mut [std::io::IoSliceMut::new(&mut random)],
            &remote,
        );
        match done {
            Ok(16) => Ok(Image { at, random }),
            _ => Err(Error::Memory {
                pid,
                addr: at,
                len: 16,
                op: "read",
                errno: done.err().unwrap_or(Errno::EIO),
            }),
        }
    }

    /// Whether process `pid` runs another image now: it called execve
    /// since this one was taken (an execve in progress is waited for).
    pub fn replaced(&self, pid: i32) -> bool {
        let since = Instant::now();
        while (super::in_execve(pid) || super::exec_settling(pid, since))
            && since.elapsed() < super::DEFAULT_TIMEOUT
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Image::of(pid).is_ok_and(|now| now != *self)
    }
}

/// One entry of process `pid`'s aux vector (/proc/PID/auxv, a few hundred bytes, read whole).
fn auxv(pid: i32, key: u64, name: &str) -> Result<u64> {
    let path = super::proc_path(pid, "auxv");
    let auxv = std::fs::read(&path).map_err(|source| Error::Io { path, source })?;
    auxv.chunks_exact(16)
        .map(|c| {
            (
                u64::from_ne_bytes(c[..8].try_into().unwrap_or_default()),
                u64::from_ne_bytes(c[8..].try_into().unwrap_or_default()),
            )
        })
        .find(|&(k, _)| k == key)
        .map(|(_, v)| v)
        .ok_or_else(|| Error::NotFound { what: name.into(), pid, detail: "/proc/PID/auxv".into() })
}

const INT3: u8 = 0xcc;

/// How to start a program under papirus' control (builder; `spawn` may be called repeatedly).
#[derive(Debug)]
pub struct Spawn {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
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
        let interp = check_elf(&path)?;
        if !self.preload.is_empty() && interp.is_none() {
            return Err(Error::Unsupported {
                path,
                reason: "it is statically linked (no PT_INTERP): the dynamic loader never runs, so \
                         LD_PRELOAD cannot load the probe runtime into it; build it dynamically linked"
                    .into(),
            });
        }
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
        if let Err(errno) = ptrace::seize(Pid::from_raw(pid), OPTIONS) {
            kill_child();
            return Err(Error::Ptrace { op: "PTRACE_SEIZE", tid: pid, errno });
        }
        let _ = nix::unistd::write(&go_w, &[1]);
        drop(go_w);
        // EOF: execve closed the close-on-exec pipe; 4 bytes: its errno. Read no
        // more than 4: after a failed execve the child stops at its exit event with
        // the pipe still open, so waiting for EOF would wait forever.
        if let Some(errno) = exec_errno(std::fs::File::from(err_r)) {
            kill_child();
            return Err(match errno {
                Errno::ENOENT => match interp {
                    Some(i) if !i.is_empty() => Error::Unsupported {
                        path,
                        reason: format!("execve failed with ENOENT: its interpreter {i} does not exist"),
                    },
                    _ => Error::MissingProgram { path },
                },
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
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
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

/// The errno a failed execve wrote into the error pipe; `None` at EOF (execve succeeded).
fn exec_errno(mut pipe: std::fs::File) -> Option<Errno> {
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < b.len() {
        match pipe.read(&mut b[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(Errno::from_raw(i32::from_ne_bytes(b)))
}

/// `EM_X86_64`.
const EM_X86_64: u16 = 62;
/// `PT_INTERP`.
const PT_INTERP: u32 = 3;
/// Bound on the program headers read (the kernel's own limit is 64 KiB).
const MAX_PHDRS: usize = 65536 / 56;
/// Bound on the interpreter path read.
const MAX_INTERP: u64 = 4096;

/// Refuses scripts, data files and ELF files of another machine before forking,
/// with what they are; returns the program interpreter (PT_INTERP), `None` for a
/// static program. An unreadable file is left to execve to judge.
fn check_elf(path: &Path) -> Result<Option<String>> {
    use std::io::{Seek, SeekFrom};
    let not_elf = |detail: String| Error::NotElf { path: path.to_path_buf(), detail };
    if path.is_dir() {
        return Err(not_elf("a directory".into()));
    }
    // O_NONBLOCK: a FIFO named as the program must not hang the open.
    let opened = std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().read(true),
        libc::O_NONBLOCK | libc::O_NOCTTY,
    )
    .open(path);
    let mut f = match opened {
        Ok(f) => f,
        // Unreadable but maybe executable: let execve decide.
        Err(_) => return Ok(Some(String::new())),
    };
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    match &head[..n.min(4)] {
        b"\x7fELF" => {}
        [] => return Err(not_elf("an empty file".into())),
        [b'#', b'!', ..] => return Err(not_elf("a script (#!): start its interpreter instead".into())),
        other => return Err(not_elf(format!("it starts with bytes {other:02x?}, not 7f 45 4c 46"))),
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]);
    let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().unwrap_or_default());
    if n < 64 || head[4] != 2 || head[5] != 1 {
        return Err(not_elf("not a 64-bit little-endian ELF file: papirus runs x86-64 programs".into()));
    }
    let machine = u16_at(18);
    if machine != EM_X86_64 {
        return Err(not_elf(format!("built for ELF machine {machine}, not x86-64 ({EM_X86_64})")));
    }
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54) as usize, u16_at(56) as usize);
    if phentsize < 56 || phnum > MAX_PHDRS {
        return Err(not_elf(format!("malformed program headers ({phnum} of {phentsize} bytes)")));
    }
    let mut phdrs = vec![0u8; phentsize * phnum];
    if f.seek(SeekFrom::Start(phoff)).is_err() || f.read_exact(&mut phdrs).is_err() {
        return Err(not_elf("program headers past the end of the file".into()));
    }
    for ph in phdrs.chunks_exact(phentsize) {
        if u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) != PT_INTERP {
            continue;
        }
        let off = u64::from_le_bytes(ph[8..16].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(ph[32..40].try_into().unwrap_or_default()).min(MAX_INTERP);
        let mut name = vec![0u8; len as usize];
        if f.seek(SeekFrom::Start(off)).is_err() || f.read_exact(&mut name).is_err() {
            return Err(not_elf("PT_INTERP past the end of the file".into()));
        }
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        return Ok(Some(String::from_utf8_lossy(&name[..end]).into_owned()));
    }
    Ok(None)
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
        self.auxv(AT_ENTRY, "AT_ENTRY")
    }

    /// The program image the process runs now; compare it with
    /// [`Process::check_image`] after papirus was detached for a while.
    pub fn image(&self) -> Result<Image> {
        Image::of(self.pid)
    }

    /// Whether the process runs a dynamically linked program whose loader
    /// has not mapped libc yet: its leader is inside the interpreter
    /// (`AT_BASE`) and no libc is mapped, as only just after an execve.
    pub fn loader_pending(&self) -> Result<bool> {
        let base = self.auxv(AT_BASE, "AT_BASE")?;
        if base == 0 {
            return Ok(false);
        }
        let maps = papirus_substrate::maps::read(self.pid)
            .map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })?;
        if super::inject::libc_mapping(&maps).is_some() {
            return Ok(false);
        }
        let Some(interp) = maps.iter().find(|m| m.start == base) else { return Ok(false) };
        let rip = self.regs(self.pid)?.rip;
        Ok(maps
            .iter()
            .any(|m| m.inode == interp.inode && m.dev == interp.dev && (m.start..m.end).contains(&rip)))
    }

    /// Fails with [`Error::Exec`] when the process no longer runs `image`: it
    /// called execve since, and nothing of the old image may be written into it.
    pub fn check_image(&self, image: &Image) -> Result<()> {
        match self.image() {
            Ok(now) if now == *image => Ok(()),
            Ok(_) | Err(Error::Memory { .. }) => {
                Err(Error::Exec { pid: self.pid, during: "the time papirus was detached" })
            }
            Err(e) => Err(e),
        }
    }

    /// One entry of the aux vector.
    fn auxv(&self, key: u64, name: &str) -> Result<u64> {
        auxv(self.pid, key, name)
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
                Some(Event::Stopped | Event::Syscall | Event::Exec) => {}
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
