//! Loading a shared library into the target with its own `dlopen`.
//!
//! Which `dlopen`: libc's exported `dlopen` (glibc ≥ 2.34), else libdl's when the
//! target has libdl mapped, else glibc's private `__libc_dlopen_mode`.
//!
//! Which thread: `dlopen` takes the loader lock and mallocs, so it must not run
//! on a thread stopped while holding those locks. We call it on a stopped thread
//! whose rip is neither in the dynamic loader nor in one of libc's exported
//! allocator functions; when no thread qualifies, the process runs for a moment
//! and is stopped again, up to [`MAX_ROUNDS`] times. Residual risk, accepted and
//! documented: libc's internal allocator functions (`_int_malloc`, absent from a
//! stripped libc's .dynsym) are not recognised, and another stopped thread may
//! hold a lock `dlopen` needs, in which case the call times out (registers are
//! restored and the error says so). A fresh thread created in the target would
//! remove the second risk at the price of running the whole target during the
//! load; it is not done here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::mman::ProtFlags;
use papirus_substrate::elf::ElfFile;

use super::Process;
use crate::error::{Error, Result};
use crate::maps::{self, Mapping};

/// `RTLD_NOW`: resolve every symbol at load, so nothing is resolved lazily later in a probe.
const RTLD_NOW: u64 = 2;
/// glibc's `__RTLD_DLOPEN`, required by `__libc_dlopen_mode`.
const RTLD_DLOPEN_FLAG: u64 = 0x8000_0000;
/// Attempts to find a thread outside the loader and allocator.
const MAX_ROUNDS: usize = 50;
/// How long the target runs between attempts.
const PAUSE: Duration = Duration::from_millis(2);

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
    dlerror: Option<u64>,
    extra_mode: u64,
}

impl Process {
    /// Loads `library` into the target with `dlopen(path, RTLD_NOW)` and returns its handle.
    /// The path is made absolute first (the target's working directory differs).
    pub fn inject(&mut self, library: &Path) -> Result<Library> {
        let path = std::path::absolute(library)
            .map_err(|source| Error::Io { path: library.to_path_buf(), source })?;
        if !path.is_file() {
            return Err(Error::InvalidArgument { what: format!("{} is not a file", path.display()) });
        }
        let loader = self.loader()?;
        self.pick_safe_worker()?;
        let arg = self.remote_string(path.as_os_str().as_encoded_bytes())?;
        let handle = self.call(loader.dlopen, &[arg, RTLD_NOW | loader.extra_mode]);
        let unmapped = self.munmap(arg, 4096);
        let handle = handle?;
        unmapped?;
        if handle == 0 {
            let message = self.dl_error(&loader);
            return Err(Error::Dlopen { path, pid: self.pid, message });
        }
        Ok(Library { handle, path })
    }

    /// The address of `symbol` in a library loaded by [`Process::inject`] (`dlsym` in the target).
    pub fn dlsym(&mut self, library: &Library, symbol: &str) -> Result<u64> {
        let loader = self.loader()?;
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
        let mappings = self.mappings()?;
        let m = find_module(&mappings, module).ok_or_else(|| Error::NotFound {
            what: format!("module {module}"),
            pid: self.pid,
            detail: "no mapped file by that name in /proc/PID/maps".into(),
        })?;
        let (elf, bias) = open_module(m)?;
        Ok(bias.wrapping_add(elf.lookup_function(name)?.address))
    }

    fn mappings(&self) -> Result<Vec<Mapping>> {
        maps::read(self.pid).map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })
    }

    fn loader(&self) -> Result<Loader> {
        let mappings = self.mappings()?;
        let libc = find_module(&mappings, "libc.so").or_else(|| find_module(&mappings, "libc-"));
        let Some(libc) = libc else {
            return Err(Error::NotFound {
                what: "libc".into(),
                pid: self.pid,
                detail: "the target has no libc mapped (static program, or stopped before the loader ran)"
                    .into(),
            });
        };
        let (elf, bias) = open_module(libc)?;
        let at = |elf: &ElfFile, bias: u64, name: &str| {
            elf.lookup_function(name).ok().map(|s| bias.wrapping_add(s.address))
        };
        if let (Some(dlopen), Some(dlsym)) = (at(&elf, bias, "dlopen"), at(&elf, bias, "dlsym")) {
            return Ok(Loader { dlopen, dlsym, dlerror: at(&elf, bias, "dlerror"), extra_mode: 0 });
        }
        if let Some(libdl) = find_module(&mappings, "libdl.so") {
            let (dl, dl_bias) = open_module(libdl)?;
            if let (Some(dlopen), Some(dlsym)) = (at(&dl, dl_bias, "dlopen"), at(&dl, dl_bias, "dlsym")) {
                return Ok(Loader { dlopen, dlsym, dlerror: at(&dl, dl_bias, "dlerror"), extra_mode: 0 });
            }
        }
        match (at(&elf, bias, "__libc_dlopen_mode"), at(&elf, bias, "__libc_dlsym")) {
            (Some(dlopen), Some(dlsym)) => {
                Ok(Loader { dlopen, dlsym, dlerror: None, extra_mode: RTLD_DLOPEN_FLAG })
            }
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
            let danger = Danger::new(&mappings);
            for tid in self.threads() {
                if self.usable(tid).is_ok() && !danger.contains(self.regs(tid)?.rip) {
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

    /// Copies a NUL-terminated string into a fresh page of the target.
    fn remote_string(&mut self, bytes: &[u8]) -> Result<u64> {
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
fn find_module<'a>(mappings: &'a [Mapping], prefix: &str) -> Option<&'a Mapping> {
    mappings
        .iter()
        .filter(|m| m.file().is_some())
        .find(|m| m.name.rsplit('/').next().is_some_and(|b| b.starts_with(prefix)))
}

fn open_module(m: &Mapping) -> Result<(ElfFile, u64)> {
    let elf = ElfFile::open(&m.name)?;
    let bias = elf.load_bias(m.start, m.offset).ok_or_else(|| Error::NotFound {
        what: format!("the load bias of {}", m.name),
        pid: 0,
        detail: format!("no PT_LOAD segment covers file offset {:#x}", m.offset),
    })?;
    Ok((elf, bias))
}

/// Code where a stopped thread may hold the loader or allocator locks.
struct Danger {
    ranges: Vec<(u64, u64)>,
}

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
];

impl Danger {
    fn new(mappings: &[Mapping]) -> Danger {
        let mut ranges = Vec::new();
        for m in mappings.iter().filter(|m| m.perms.exec) {
            let base = m.name.rsplit('/').next().unwrap_or("");
            if base.starts_with("ld-linux") || base.starts_with("ld-2.") || base.starts_with("ld.so") {
                ranges.push((m.start, m.end));
            }
        }
        if let Some(libc) = find_module(mappings, "libc.so")
            && let Ok((elf, bias)) = open_module(libc)
        {
            for name in ALLOCATOR {
                if let Ok(s) = elf.lookup_function(name) {
                    ranges.push((bias.wrapping_add(s.address), bias.wrapping_add(s.address + s.size.max(1))));
                }
            }
        }
        Danger { ranges }
    }

    fn contains(&self, rip: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| (s..e).contains(&rip))
    }
}
