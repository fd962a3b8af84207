//! Loading a shared library into the target with its own `dlopen`.
//!
//! Which `dlopen`: libc's exported `dlopen` (glibc ≥ 2.34), else libdl's when the
//! target has libdl mapped, else glibc's private `__libc_dlopen_mode`.
//!
//! Which thread ([`Injection`]): `dlopen` takes the loader lock and mallocs, so it
//! must not wait for a lock that a *stopped* thread holds.
//! - [`Injection::FreshThread`] (the default when the target's libc or libpthread
//!   exports `pthread_create`): a stopped thread only runs `pthread_create` with a
//!   small start routine written into the target; then the whole process runs
//!   while the new thread calls `dlopen`, so a lock held by any other thread is
//!   released as that thread goes on. papirus polls a completion flag, stops the
//!   process again, and unmaps the routine once no thread executes it.
//! - [`Injection::StoppedThread`]: `dlopen` is called directly on a stopped
//!   thread, while the others stay stopped. The target never runs unobserved, but
//!   a lock held by another stopped thread makes the call time out (registers are
//!   restored and the error says so).
//!
//! Either way the thread that runs our call is chosen with its rip neither in the
//! dynamic loader nor in one of libc's exported allocator functions; when no
//! thread qualifies, the process runs for a moment and is stopped again, up to
//! [`MAX_ROUNDS`] times. Residual risk: libc's internal allocator functions
//! (`_int_malloc`, absent from a stripped libc's .dynsym) are not recognised.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::mman::ProtFlags;
use papirus_substrate::elf::ElfFile;

use super::Process;
use crate::error::{Error, Result};
use papirus_substrate::maps::{self, Mapping};

/// `RTLD_NOW`: resolve every symbol at load, so nothing is resolved lazily later in a probe.
const RTLD_NOW: u64 = 2;
/// `RTLD_NOLOAD`: only a reference to a library already loaded.
const RTLD_NOLOAD: u64 = 4;
/// glibc's `__RTLD_DLOPEN`, required by `__libc_dlopen_mode`.
const RTLD_DLOPEN_FLAG: u64 = 0x8000_0000;
/// Attempts to find a thread outside the loader and allocator.
const MAX_ROUNDS: usize = 50;
/// How long the target runs between attempts.
const PAUSE: Duration = Duration::from_millis(2);

/// Which thread runs `dlopen` (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// A new thread created in the target with `pthread_create`, the process running.
    FreshThread,
    /// A stopped thread, the rest of the process stopped.
    StoppedThread,
}

/// A library loaded into the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The handle `dlopen` returned in the target.
    pub handle: u64,
    /// The path given to `dlopen`.
    pub path: PathBuf,
}

/// The target's dynamic-loading entry points.
#[derive(Debug, Clone, Copy)]
struct Loader {
    dlopen: u64,
    dlsym: u64,
    dlclose: Option<u64>,
    dlerror: Option<u64>,
    extra_mode: u64,
}

impl Process {
    /// Loads `library` into the target with `dlopen(path, RTLD_NOW)` and returns its
    /// handle. A single-threaded target (such as one just started by [`super::Spawn`])
    /// is loaded from its stopped thread: no other thread can hold a lock, and it
    /// does not run meanwhile. A multi-threaded one is loaded from a fresh thread when
    /// it has `pthread_create`, else from a stopped thread. The path is made absolute
    /// first (the target's working directory differs).
    pub fn inject(&mut self, library: &Path) -> Result<Library> {
        let alive = self.threads.values().filter(|t| t.exit.is_none()).count();
        let how = if alive > 1 && self.threading()?.is_some() {
            Injection::FreshThread
        } else {
            Injection::StoppedThread
        };
        self.inject_with(library, how)
    }

    /// Like [`Process::inject`], choosing the thread that runs `dlopen`.
    pub fn inject_with(&mut self, library: &Path, how: Injection) -> Result<Library> {
        let path = std::path::absolute(library)
            .map_err(|source| Error::Io { path: library.to_path_buf(), source })?;
        if !path.is_file() {
            return Err(Error::InvalidArgument { what: format!("{} is not a file", path.display()) });
        }
        // Loaded from a copy the target's user can read when the original may
        // not be (a tool under /root attaching to another user's process).
        let staged = stage_for(self.pid, &path)?;
        let (path, original) = match &staged {
            Some((_, copy)) => (copy.clone(), path),
            None => (path.clone(), path),
        };
        let loaded = self.dlopen_path(path, how);
        drop(staged);
        loaded.map(|l| Library { handle: l.handle, path: original })
    }

    fn dlopen_path(&mut self, path: PathBuf, how: Injection) -> Result<Library> {
        let loader = self.loader()?;
        self.pick_safe_worker()?;
        if how == Injection::FreshThread {
            let threading = self.threading()?.ok_or_else(|| Error::NotFound {
                what: "pthread_create".into(),
                pid: self.pid,
                detail: "neither libc nor a mapped libpthread exports it: use Injection::StoppedThread"
                    .into(),
            })?;
            return self.inject_fresh(path, &loader, threading);
        }
        self.dlopen_stopped(&loader, path, RTLD_NOW)
    }

    /// A reference of papirus' own to the library the target already has
    /// loaded from the file mapped at `m` (`dlopen` with `RTLD_NOLOAD` of
    /// the path it was loaded by, which the loader matches by name even when
    /// the file is gone): [`Process::unload`] gives it back.
    pub fn reference(&mut self, m: &Mapping) -> Result<Library> {
        let loader = self.loader()?;
        self.pick_safe_worker()?;
        let path = PathBuf::from(m.name.strip_suffix(" (deleted)").unwrap_or(&m.name));
        self.dlopen_stopped(&loader, path, RTLD_NOW | RTLD_NOLOAD)
    }

    /// `dlopen(path, mode)` called on the stopped worker; the path's copy in
    /// the target is unmapped whatever the outcome.
    fn dlopen_stopped(&mut self, loader: &Loader, path: PathBuf, mode: u64) -> Result<Library> {
        let arg = self.remote_string(path.as_os_str().as_encoded_bytes())?;
        let handle = self.call(loader.dlopen, &[arg, mode | loader.extra_mode]);
        let unmapped = self.munmap(arg, 4096);
        let handle = handle?;
        unmapped?;
        if handle == 0 {
            let message = self.dl_error(loader);
            return Err(Error::Dlopen { path, pid: self.pid, message });
        }
        Ok(Library { handle, path })
    }

    /// Gives back papirus' reference to `library` (`dlclose` in the target):
    /// the loader unloads it when that was the last one and nothing pins it.
    pub fn unload(&mut self, library: &Library) -> Result<()> {
        let loader = self.loader()?;
        let dlclose = loader.dlclose.ok_or_else(|| Error::NotFound {
            what: "dlclose".into(),
            pid: self.pid,
            detail: "neither libc nor a mapped libdl exports it".into(),
        })?;
        self.pick_safe_worker()?;
        if self.call(dlclose, &[library.handle])? != 0 {
            let message = self.dl_error(&loader);
            return Err(Error::Dlopen { path: library.path.clone(), pid: self.pid, message });
        }
        Ok(())
    }

    /// The address of `symbol` in a library loaded by [`Process::inject`] (`dlsym` in the target).
    pub fn dlsym(&mut self, library: &Library, symbol: &str) -> Result<u64> {
        let loader = self.loader()?;
        // dlsym takes the loader lock too.
        self.pick_safe_worker()?;
        let arg = self.remote_string(symbol.as_bytes())?;
        let addr = self.call(loader.dlsym, &[library.handle, arg]);
        let unmapped = self.munmap(arg, 4096);
        let addr = addr?;
        unmapped?;
        if addr == 0 {
            return Err(Error::NotFound {
                what: format!("symbol {symbol}"),
                pid: self.pid,
                detail: format!("dlsym in {}: {}", library.path.display(), self.dl_error(&loader)),
            });
        }
        Ok(addr)
    }

    /// A function's run-time address in the first mapped module whose file name
    /// starts with `module` (e.g. `libc.so`), through the module's ELF symbols.
    pub fn module_function(&self, module: &str, name: &str) -> Result<u64> {
        Ok(self.module_functions(module, &[name])?[0])
    }

    /// Like [`module_function`](Self::module_function) for several names of
    /// one module, which is read and parsed once.
    pub fn module_functions<const N: usize>(&self, module: &str, names: &[&str; N]) -> Result<[u64; N]> {
        let mappings = self.mappings()?;
        let m = find_module(&mappings, module).ok_or_else(|| Error::NotFound {
            what: format!("module {module}"),
            pid: self.pid,
            detail: "no mapped file by that name in /proc/PID/maps".into(),
        })?;
        let (elf, bias) = open_module(self.pid, m)?;
        let mut out = [0; N];
        for (o, name) in out.iter_mut().zip(names) {
            *o = bias.wrapping_add(elf.lookup_function(name)?.address);
        }
        Ok(out)
    }

    fn mappings(&self) -> Result<Vec<Mapping>> {
        maps::read(self.pid).map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })
    }

    fn loader(&self) -> Result<Loader> {
        let mappings = self.mappings()?;
        let Some(libc) = libc_mapping(&mappings) else {
            return Err(Error::NotFound {
                what: "libc".into(),
                pid: self.pid,
                detail: "the target has no libc mapped (static program, or stopped before the loader ran)"
                    .into(),
            });
        };
        let (elf, bias) = open_module(self.pid, libc)?;
        let at = |elf: &ElfFile, bias: u64, name: &str| {
            elf.lookup_function(name).ok().map(|s| bias.wrapping_add(s.address))
        };
        if let (Some(dlopen), Some(dlsym)) = (at(&elf, bias, "dlopen"), at(&elf, bias, "dlsym")) {
            let (dlclose, dlerror) = (at(&elf, bias, "dlclose"), at(&elf, bias, "dlerror"));
            return Ok(Loader { dlopen, dlsym, dlclose, dlerror, extra_mode: 0 });
        }
        if let Some(libdl) = find_module(&mappings, "libdl.so") {
            let (dl, dl_bias) = open_module(self.pid, libdl)?;
            if let (Some(dlopen), Some(dlsym)) = (at(&dl, dl_bias, "dlopen"), at(&dl, dl_bias, "dlsym")) {
                let (dlclose, dlerror) = (at(&dl, dl_bias, "dlclose"), at(&dl, dl_bias, "dlerror"));
                return Ok(Loader { dlopen, dlsym, dlclose, dlerror, extra_mode: 0 });
            }
        }
        match (at(&elf, bias, "__libc_dlopen_mode"), at(&elf, bias, "__libc_dlsym")) {
            (Some(dlopen), Some(dlsym)) => Ok(Loader {
                dlopen,
                dlsym,
                dlclose: at(&elf, bias, "__libc_dlclose"),
                dlerror: None,
                extra_mode: RTLD_DLOPEN_FLAG,
            }),
            _ => Err(Error::NotFound {
                what: "dlopen".into(),
                pid: self.pid,
                detail: format!(
                    "neither {} nor a mapped libdl exports dlopen/dlsym or __libc_dlopen_mode",
                    libc.name
                ),
            }),
        }
    }

    /// Makes the worker a thread not stopped inside the loader or the allocator.
    fn pick_safe_worker(&mut self) -> Result<()> {
        for _ in 0..MAX_ROUNDS {
            let mappings = self.mappings()?;
            let danger = Danger::new(self.pid, &mappings);
            // Threads asleep through the restart block last (see `call`).
            let mut tids = self.threads();
            tids.sort_by_key(|&t| self.in_restart_block(t).unwrap_or(true));
            for tid in tids {
                if self.usable(tid).is_ok() && !danger.may_hold_lock(&self.regs(tid)?) {
                    self.worker = tid;
                    return Ok(());
                }
            }
            self.run_for(PAUSE)?;
        }
        Err(Error::Timeout {
            what: "leave the dynamic loader and malloc (needed before dlopen)",
            tid: self.pid,
            timeout_ms: (PAUSE * MAX_ROUNDS as u32).as_millis() as u64,
        })
    }

    /// Lets the process run in short steps until no held thread other than
    /// `worker` is stopped where it may hold a lock any remote function could
    /// need: in the dynamic loader, in one of libc's allocator functions, in
    /// `fork` (which holds malloc's locks across its clone), or in a memory
    /// system call made by libc (its allocator and its thread-stack cache map
    /// and unmap with their locks taken). A remote call would
    /// wait for that lock until its timeout, and an abandoned call can leave
    /// locks of its own taken. Gives up after [`MAX_ROUNDS`]; the call's own
    /// timeout still bounds what follows.
    pub(super) fn quiesce(&mut self, worker: i32) -> Result<()> {
        if self.lock_code.is_none() {
            let mappings = self.mappings()?;
            self.lock_code = Some(Danger::new(self.pid, &mappings));
        }
        for _ in 0..MAX_ROUNDS {
            let Some(danger) = self.lock_code.as_ref() else { return Ok(()) };
            let busy = self.threads().into_iter().any(|t| {
                t != worker && self.usable(t).is_ok() && self.regs(t).is_ok_and(|r| danger.may_hold_lock(&r))
            });
            if !busy {
                return Ok(());
            }
            self.run_for(PAUSE)?;
        }
        Ok(())
    }

    /// Copies a NUL-terminated string into a fresh page of the target.
    pub(super) fn remote_string(&mut self, bytes: &[u8]) -> Result<u64> {
        if bytes.len() >= 4096 || bytes.contains(&0) {
            return Err(Error::InvalidArgument {
                what: "a path or symbol name longer than 4095 bytes or containing NUL".into(),
            });
        }
        let page = self.mmap_anywhere(4096, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        let mut z = bytes.to_vec();
        z.push(0);
        if let Err(e) = self.write_memory(page, &z) {
            let _ = self.munmap(page, 4096);
            return Err(e);
        }
        Ok(page)
    }

    fn dl_error(&mut self, loader: &Loader) -> String {
        let Some(f) = loader.dlerror else { return "no dlerror in this libc".into() };
        match self.call(f, &[]) {
            Ok(0) => "dlerror() gave no message".into(),
            Ok(p) => self.read_cstr(p, 4096).unwrap_or_else(|e| format!("dlerror() text unreadable: {e}")),
            Err(e) => format!("dlerror() failed: {e}"),
        }
    }
}

/// The first mapping of the file whose name starts with `prefix`.
/// The first mapping of libc, if the process has one.
pub(super) fn libc_mapping(mappings: &[Mapping]) -> Option<&Mapping> {
    find_module(mappings, "libc.so").or_else(|| find_module(mappings, "libc-"))
}

fn find_module<'a>(mappings: &'a [Mapping], prefix: &str) -> Option<&'a Mapping> {
    mappings
        .iter()
        .filter(|m| m.file().is_some())
        .find(|m| m.name.rsplit('/').next().is_some_and(|b| b.starts_with(prefix)))
}

/// The module `m` maps, read as the process sees it (never by its name in
/// our own view: another mount namespace may hold another file there).
fn open_module(pid: i32, m: &Mapping) -> Result<(ElfFile, u64)> {
    // A file without the ELF magic fails to parse, with that reason.
    let data = papirus_substrate::input::read_module(pid, m, papirus_substrate::input::MODULE_LIMIT)?
        .unwrap_or_default();
    let elf = ElfFile::parse(&m.name, data)?;
    let bias = elf.load_bias(m.start, m.offset).ok_or_else(|| Error::NotFound {
        what: format!("the load bias of {}", m.name),
        pid: 0,
        detail: format!("no PT_LOAD segment covers file offset {:#x}", m.offset),
    })?;
    Ok((elf, bias))
}

/// Where a stopped thread may hold the loader's, the allocator's or the
/// thread-stack cache's locks.
#[derive(Debug)]
pub(super) struct Danger {
    ranges: Vec<(u64, u64)>,
    /// libc's code: a thread in a memory system call from there may be
    /// inside the allocator's or the stack cache's internals (not exported,
    /// so not in `ranges`), which map and unmap with their lock taken.
    libc: Vec<(u64, u64)>,
}

/// mmap, mprotect, munmap, brk, mremap, madvise.
const MEMORY_SYSCALLS: [u64; 6] = [9, 10, 11, 12, 25, 28];

/// libc's exported allocator entry points.
const ALLOCATOR: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "malloc_trim",
    "malloc_usable_size",
    "malloc_info",
    "malloc_stats",
    "mallinfo",
    "mallinfo2",
    "cfree",
    // fork holds every arena lock from before its clone until after it.
    "fork",
    "_Fork",
    "__libc_fork",
];

impl Danger {
    fn new(pid: i32, mappings: &[Mapping]) -> Danger {
        let mut ranges = Vec::new();
        for m in mappings.iter().filter(|m| m.perms.exec) {
            let base = m.name.rsplit('/').next().unwrap_or("");
            if base.starts_with("ld-linux") || base.starts_with("ld-2.") || base.starts_with("ld.so") {
                ranges.push((m.start, m.end));
            }
        }
        let module = find_module(mappings, "libc.so");
        let libc = module.map_or_else(Vec::new, |l| {
            mappings.iter().filter(|m| m.perms.exec && m.name == l.name).map(|m| (m.start, m.end)).collect()
        });
        if let Some(l) = module
            && let Ok((elf, bias)) = open_module(pid, l)
        {
            for name in ALLOCATOR {
                if let Ok(s) = elf.lookup_function(name) {
                    ranges.push((bias.wrapping_add(s.address), bias.wrapping_add(s.address + s.size.max(1))));
                }
            }
        }
        Danger { ranges, libc }
    }

    /// Whether a thread stopped with registers `r` may hold such a lock.
    fn may_hold_lock(&self, r: &super::Regs) -> bool {
        let within = |v: &[(u64, u64)]| v.iter().any(|&(s, e)| (s..e).contains(&r.rip));
        within(&self.ranges) || (MEMORY_SYSCALLS.contains(&r.orig_rax) && within(&self.libc))
    }
}

/// A copy of `library` that process `pid` can read, in a fresh directory
/// (random name, owned by papirus' user, readable but not writable by
/// others), when `pid` runs as another user; `None` when it runs as ours.
/// The directory goes when the value drops: the loaded mapping keeps the file.
fn stage_for(pid: i32, library: &Path) -> Result<Option<(tempfile::TempDir, PathBuf)>> {
    use std::os::unix::fs::PermissionsExt;
    let euid =
        |p: i32| super::status_field(p, "Uid").and_then(|u| u.split_whitespace().nth(1)?.parse::<u32>().ok());
    let ours = euid(std::process::id() as i32);
    if ours.is_none() || euid(pid) == ours {
        return Ok(None);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let dir = tempfile::Builder::new().prefix("papirus-probe-runtime-").tempdir().map_err(io(library))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(io(dir.path()))?;
    let copy = dir.path().join(library.file_name().unwrap_or(library.as_os_str()));
    std::fs::copy(library, &copy).map_err(io(&copy))?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).map_err(io(&copy))?;
    Ok(Some((dir, copy)))
}

/// `pthread_create` and `pthread_detach` in the target.
#[derive(Debug, Clone, Copy)]
struct Threading {
    create: u64,
    detach: u64,
}

/// Layout of the data pages shared with the start routine.
mod slot {
    pub const DLOPEN: u64 = 0;
    pub const DLERROR: u64 = 8;
    pub const MODE: u64 = 16;
    pub const HANDLE: u64 = 24;
    pub const DONE: u64 = 40;
    pub const THREAD: u64 = 64;
    pub const MESSAGE: u64 = 256;
    pub const MESSAGE_MAX: u32 = 4096 - 256 - 1;
    pub const PATH: u64 = 4096;
    pub const DATA_LEN: u64 = 8192;
}

/// Layout of the data page of [`CALL_ROUTINE`]: the function, six arguments, the
/// result, the done flag, the pthread_t.
mod call_slot {
    pub const RESULT: u64 = 56;
    pub const DONE: u64 = 64;
    pub const THREAD: u64 = 72;
    pub const LEN: usize = 80;
}

/// `void *start(void *data)`: `result = func(args…)`, then the done flag; returns NULL.
const CALL_ROUTINE: [u8; 48] = [
    0x53, // push rbx (rsp 16-aligned for the call)
    0x48, 0x89, 0xfb, // mov rbx, rdi
    0x48, 0x8b, 0x7b, 0x08, // mov rdi, [rbx + 8]
    0x48, 0x8b, 0x73, 0x10, // mov rsi, [rbx + 16]
    0x48, 0x8b, 0x53, 0x18, // mov rdx, [rbx + 24]
    0x48, 0x8b, 0x4b, 0x20, // mov rcx, [rbx + 32]
    0x4c, 0x8b, 0x43, 0x28, // mov r8, [rbx + 40]
    0x4c, 0x8b, 0x4b, 0x30, // mov r9, [rbx + 48]
    0x31, 0xc0, // xor eax, eax (no vector arguments)
    0xff, 0x13, // call [rbx]
    0x48, 0x89, 0x43, 0x38, // mov [rbx + RESULT], rax
    0x48, 0xc7, 0x43, 0x40, 0x01, 0x00, 0x00, 0x00, // mov qword [rbx + DONE], 1
    0x31, 0xc0, // xor eax, eax
    0x5b, // pop rbx
    0xc3, // ret
];

/// The start routine, `void *start(void *data)` with data = the slot pages:
/// `handle = dlopen(path, mode)`; on failure copy `dlerror()`'s text into the
/// pages (the string lives in the thread's own buffer, freed when it exits);
/// then set the done flag and return NULL, ending the thread.
fn start_routine() -> Vec<u8> {
    let mut c = Vec::new();
    let mut patch = Vec::new(); // (offset of a rel8 byte, label)
    let rel8 = |c: &mut Vec<u8>, patch: &mut Vec<(usize, &'static str)>, op: u8, label: &'static str| {
        c.extend_from_slice(&[op, 0]);
        patch.push((c.len() - 1, label));
    };
    let le32 = |v: u32| v.to_le_bytes();
    c.push(0x53); // push rbx (rsp 16-aligned for the calls below)
    c.extend_from_slice(&[0x48, 0x89, 0xfb]); // mov rbx, rdi
    c.extend_from_slice(&[0x48, 0x8d, 0xbb]); // lea rdi, [rbx + PATH]
    c.extend_from_slice(&le32(slot::PATH as u32));
    c.extend_from_slice(&[0x48, 0x8b, 0x73, slot::MODE as u8]); // mov rsi, [rbx + MODE]
    c.extend_from_slice(&[0xff, 0x53, slot::DLOPEN as u8]); // call [rbx + DLOPEN]
    c.extend_from_slice(&[0x48, 0x89, 0x43, slot::HANDLE as u8]); // mov [rbx + HANDLE], rax
    c.extend_from_slice(&[0x48, 0x85, 0xc0]); // test rax, rax
    rel8(&mut c, &mut patch, 0x75, "done"); // jnz done
    c.extend_from_slice(&[0x48, 0x8b, 0x43, slot::DLERROR as u8]); // mov rax, [rbx + DLERROR]
    c.extend_from_slice(&[0x48, 0x85, 0xc0]); // test rax, rax
    rel8(&mut c, &mut patch, 0x74, "done"); // jz done
    c.extend_from_slice(&[0xff, 0xd0]); // call rax
    c.extend_from_slice(&[0x48, 0x85, 0xc0]); // test rax, rax
    rel8(&mut c, &mut patch, 0x74, "done"); // jz done
    c.extend_from_slice(&[0x48, 0x89, 0xc6]); // mov rsi, rax
    c.extend_from_slice(&[0x48, 0x8d, 0xbb]); // lea rdi, [rbx + MESSAGE]
    c.extend_from_slice(&le32(slot::MESSAGE as u32));
    c.push(0xb9); // mov ecx, MESSAGE_MAX
    c.extend_from_slice(&le32(slot::MESSAGE_MAX));
    let copy = c.len();
    c.extend_from_slice(&[0x8a, 0x06]); // mov al, [rsi]
    c.extend_from_slice(&[0x88, 0x07]); // mov [rdi], al
    c.extend_from_slice(&[0x84, 0xc0]); // test al, al
    rel8(&mut c, &mut patch, 0x74, "done"); // jz done
    c.extend_from_slice(&[0x48, 0xff, 0xc6]); // inc rsi
    c.extend_from_slice(&[0x48, 0xff, 0xc7]); // inc rdi
    c.extend_from_slice(&[0xff, 0xc9]); // dec ecx
    rel8(&mut c, &mut patch, 0x75, "copy"); // jnz copy
    let done = c.len();
    c.extend_from_slice(&[0x48, 0xc7, 0x43, slot::DONE as u8, 1, 0, 0, 0]); // mov qword [rbx + DONE], 1
    c.extend_from_slice(&[0x31, 0xc0]); // xor eax, eax
    c.push(0x5b); // pop rbx
    c.push(0xc3); // ret
    for (at, label) in patch {
        let target = if label == "done" { done } else { copy };
        c[at] = (target as i64 - (at as i64 + 1)) as i8 as u8;
    }
    c
}

impl Process {
    fn threading(&self) -> Result<Option<Threading>> {
        let mappings = self.mappings()?;
        for module in ["libc.so", "libpthread.so"] {
            let Some(m) = find_module(&mappings, module) else { continue };
            let (elf, bias) = open_module(self.pid, m)?;
            let at = |name: &str| elf.lookup_function(name).ok().map(|s| bias.wrapping_add(s.address));
            if let (Some(create), Some(detach)) = (at("pthread_create"), at("pthread_detach")) {
                return Ok(Some(Threading { create, detach }));
            }
        }
        Ok(None)
    }

    /// `func(args)` on a new thread while the process runs (see [`Process::call`]);
    /// `None` when the target has no `pthread_create`.
    pub(super) fn call_fresh(&mut self, func: u64, args: &[u64]) -> Result<Option<u64>> {
        let Some(t) = self.threading()? else { return Ok(None) };
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let data = self.mmap_anywhere(4096, rw)?;
        let code = match self.mmap_anywhere(4096, rw) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.munmap(data, 4096);
                return Err(e);
            }
        };
        let out = self.fresh_thread_call(data, code, func, args, t);
        // A thread still inside the routine (a timeout) would crash on unmapped code: leave the pages then.
        if !matches!(out, Err(Error::Timeout { .. })) {
            let a = self.munmap(code, 4096);
            let b = self.munmap(data, 4096);
            if out.is_ok() {
                a?;
                b?;
            }
        }
        out.map(Some)
    }

    /// Runs routine `code` on a thread created in the target with `data` as its
    /// argument (pthread handle at `data + thread_at`), detached, and lets the
    /// process run until the routine has set the word at `data + done_at` and
    /// the thread has exited: then no thread can be executing the routine, and
    /// its pages can go.
    fn run_fresh_thread(
        &mut self,
        t: Threading,
        code: u64,
        data: u64,
        thread_at: u64,
        done_at: u64,
    ) -> Result<()> {
        // pthread_create takes the stack cache's lock (and malloc's). The
        // process runs meanwhile, so threads it creates are counted before.
        self.quiesce(self.worker)?;
        let before = self.threads();
        let r = self.call_here(t.create, &[data + thread_at, 0, code, data])?;
        if r != 0 {
            return Err(Error::RemoteSyscall {
                name: "pthread_create",
                pid: self.pid,
                errno: nix::errno::Errno::from_raw(r as i32),
            });
        }
        // Followed through its clone event, the new thread is already one of ours.
        let fresh: Vec<i32> = self.threads().into_iter().filter(|t| !before.contains(t)).collect();
        let thread = self.read_u64(data + thread_at)?;
        self.call_here(t.detach, &[thread])?;
        self.run_until(|p| {
            p.read_u64(data + done_at).is_ok_and(|d| d != 0)
                && fresh.iter().all(|t| !p.threads.contains_key(t))
        })
    }

    fn fresh_thread_call(
        &mut self,
        data: u64,
        code: u64,
        func: u64,
        args: &[u64],
        t: Threading,
    ) -> Result<u64> {
        let mut head = vec![0u8; call_slot::LEN];
        head[..8].copy_from_slice(&func.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            head[8 + 8 * i..16 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        self.write_memory(data, &head)?;
        self.write_memory(code, &CALL_ROUTINE)?;
        self.mprotect(code, 4096, ProtFlags::PROT_READ | ProtFlags::PROT_EXEC)?;
        self.run_fresh_thread(t, code, data, call_slot::THREAD, call_slot::DONE)?;
        self.read_u64(data + call_slot::RESULT)
    }

    /// `dlopen` from a new thread while the process runs; see the module documentation.
    fn inject_fresh(&mut self, path: PathBuf, loader: &Loader, threading: Threading) -> Result<Library> {
        let bytes = path.as_os_str().as_encoded_bytes();
        if bytes.len() >= 4096 || bytes.contains(&0) {
            return Err(Error::InvalidArgument {
                what: "a library path longer than 4095 bytes or containing NUL".into(),
            });
        }
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let data = self.mmap_anywhere(slot::DATA_LEN, rw)?;
        let code = match self.mmap_anywhere(4096, rw) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.munmap(data, slot::DATA_LEN);
                return Err(e);
            }
        };
        let out = self.fresh_thread_dlopen(data, code, bytes, loader, threading);
        // A thread still inside the routine (a timeout) would crash on unmapped code: leave the pages then.
        if !matches!(out, Err(Error::Timeout { .. })) {
            let a = self.munmap(code, 4096);
            let b = self.munmap(data, slot::DATA_LEN);
            if out.is_ok() {
                a?;
                b?;
            }
        }
        match out? {
            Ok(handle) => Ok(Library { handle, path }),
            Err(message) => Err(Error::Dlopen { path, pid: self.pid, message }),
        }
    }

    /// The handle, or dlerror()'s text.
    fn fresh_thread_dlopen(
        &mut self,
        data: u64,
        code: u64,
        path: &[u8],
        loader: &Loader,
        t: Threading,
    ) -> Result<Result<u64, String>> {
        let mut head = vec![0u8; 256];
        for (at, v) in [
            (slot::DLOPEN, loader.dlopen),
            (slot::DLERROR, loader.dlerror.unwrap_or(0)),
            (slot::MODE, RTLD_NOW | loader.extra_mode),
        ] {
            head[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.write_memory(data, &head)?;
        let mut z = path.to_vec();
        z.push(0);
        self.write_memory(data + slot::PATH, &z)?;
        self.write_memory(code, &start_routine())?;
        self.mprotect(code, 4096, ProtFlags::PROT_READ | ProtFlags::PROT_EXEC)?;
        self.run_fresh_thread(t, code, data, slot::THREAD, slot::DONE)?;
        match self.read_u64(data + slot::HANDLE)? {
            0 => match self.read_cstr(data + slot::MESSAGE, slot::MESSAGE_MAX as usize)? {
                m if m.is_empty() => Ok(Err("dlopen returned NULL".into())),
                m => Ok(Err(m)),
            },
            handle => Ok(Ok(handle)),
        }
    }
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    use super::*;

    /// `code` in Intel syntax, one instruction a line; every byte must decode.
    fn disassemble(code: &[u8]) -> Vec<String> {
        let mut f = IntelFormatter::new();
        Decoder::with_ip(64, code, 0, DecoderOptions::NONE)
            .into_iter()
            .map(|ins| {
                assert!(!ins.is_invalid());
                let mut s = String::new();
                f.format(&ins, &mut s);
                s
            })
            .collect()
    }

    #[test]
    fn call_routine_decodes_as_written() {
        let text = disassemble(&CALL_ROUTINE);
        let expect = [
            "push rbx",
            "mov rbx,rdi",
            "mov rdi,[rbx+8]",
            "mov rsi,[rbx+10h]",
            "mov rdx,[rbx+18h]",
            "mov rcx,[rbx+20h]",
            "mov r8,[rbx+28h]",
            "mov r9,[rbx+30h]",
            "xor eax,eax",
            "call qword ptr [rbx]",
            "mov [rbx+38h],rax",
            "mov qword ptr [rbx+40h],1",
            "xor eax,eax",
            "pop rbx",
            "ret",
        ];
        assert_eq!(text, expect);
        assert_eq!((call_slot::RESULT, call_slot::DONE), (0x38, 0x40));
    }

    #[test]
    fn start_routine_decodes_as_written() {
        let text = disassemble(&start_routine());
        // Branch targets: 0x3a is `mov al,[rsi]` (copy), 0x4c the done-flag store.
        let expect = [
            "push rbx",
            "mov rbx,rdi",
            "lea rdi,[rbx+1000h]",
            "mov rsi,[rbx+10h]",
            "call qword ptr [rbx]",
            "mov [rbx+18h],rax",
            "test rax,rax",
            "jne short 000000000000004Ch",
            "mov rax,[rbx+8]",
            "test rax,rax",
            "je short 000000000000004Ch",
            "call rax",
            "test rax,rax",
            "je short 000000000000004Ch",
            "mov rsi,rax",
            "lea rdi,[rbx+100h]",
            "mov ecx,0EFFh",
            "mov al,[rsi]",
            "mov [rdi],al",
            "test al,al",
            "je short 000000000000004Ch",
            "inc rsi",
            "inc rdi",
            "dec ecx",
            "jne short 000000000000003Ah",
            "mov qword ptr [rbx+28h],1",
            "xor eax,eax",
            "pop rbx",
            "ret",
        ];
        assert_eq!(text, expect);
    }
}
