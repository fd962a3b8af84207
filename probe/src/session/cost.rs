//! What an instrumented call costs: a gcc-built C library of tiny functions,
//! patched in this process with the probe runtime's trampolines, beside the
//! same body uninstrumented and under uprobe+uretprobe. The runtime is the
//! shared library papirus-probe loads into targets, loaded here with
//! `dlopen` (the tool does not link the runtime's hooks). Shared by the
//! `probe` bench and `papirus-probe calibrate`'s rows, so both measure the
//! same thing.
//!
//! # Safety
//!
//! The library is built here from [`SOURCE`] and loaded with `dlopen`; its
//! symbols are turned into function pointers of the signatures [`SOURCE`]
//! defines. It has no constructors, and it stays loaded until the
//! [`Target`] is dropped, after every patch of it has been removed
//! ([`Instrumented`] borrows the target). The runtime library stays loaded
//! for the life of the process (its threads' tables and exit handlers point
//! into it); its entry points are called with the signatures its C ABI defines.
#![allow(unsafe_code)]

use std::ffi::{CString, c_void};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use papirus_probe_abi::Probe;
use papirus_substrate::elf::ElfFile;
use papirus_substrate::{Counter, Target as CountTarget, parse_event};

use crate::patch::{FunctionSpec, LocalSpace, PatchError, Patcher};

/// The C source of the target library (`probe_bench.c` beside this file).
pub const SOURCE: &str = include_str!("probe_bench.c");

/// `int f(int, int)`: every measured body.
pub type Tiny = extern "C" fn(i32, i32) -> i32;
/// `long drive(int (*)(int, int), long n)`: calls `f` n times from C.
pub type Drive = extern "C" fn(Tiny, i64) -> i64;

/// The copies of one body in the target library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `tiny`: the one patched with a trampoline.
    Patched,
    /// `tiny_ref`: never instrumented, the baseline.
    Reference,
    /// `tiny_up`: a typical gcc -O2 entry, which a uprobe single-steps.
    Typical,
    /// `tiny_nop5`: behind a 5-byte nop, the kernel's fastest uprobe case.
    Nop5,
}

impl Body {
    /// Every body, in declaration order (so `b as usize` indexes it).
    pub const ALL: [Body; 4] = [Body::Patched, Body::Reference, Body::Typical, Body::Nop5];

    /// Its symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Body::Patched => "tiny",
            Body::Reference => "tiny_ref",
            Body::Typical => "tiny_up",
            Body::Nop5 => "tiny_nop5",
        }
    }
}

/// Why the cost target cannot be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CostError {
    /// gcc could not be started.
    #[error("cannot run gcc to build {path}: {source} (install gcc: apt-get install gcc)")]
    Gcc {
        /// What it was building.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// gcc ran and failed.
    #[error("gcc failed to build {path}: {stderr}")]
    GccFailed {
        /// What it was building.
        path: PathBuf,
        /// What gcc said.
        stderr: String,
    },
    /// A file or directory of the build could not be made.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The library did not load.
    #[error("dlopen {path}: {reason}")]
    Load {
        /// The library.
        path: PathBuf,
        /// dlerror's text.
        reason: String,
    },
    /// A symbol is missing from the library or its symbol table.
    #[error("{path}: no function symbol {name}")]
    Symbol {
        /// The library.
        path: PathBuf,
        /// The symbol.
        name: &'static str,
    },
    /// The probe runtime cannot be loaded or refused a setting.
    #[error("probe runtime: {0}")]
    Runtime(String),
    /// Patching failed.
    #[error("patching tiny: {0}")]
    Patch(#[from] PatchError),
    /// The patcher refused the function.
    #[error("the patcher refused tiny: {0}")]
    Refused(String),
    /// A uprobe or uretprobe could not be opened.
    #[error("{event}: {source}")]
    Uprobe {
        /// The event.
        event: String,
        /// The kernel's reason.
        #[source]
        source: papirus_substrate::Error,
    },
}

/// Writes the C program `source` to `dir/NAME.c` and builds `dir/NAME` with
/// `gcc -O2`, `args` after the source; returns its path.
pub fn gcc(dir: &Path, name: &str, source: &str, args: &[&str]) -> Result<PathBuf, CostError> {
    let src = dir.join(format!("{name}.c"));
    let path = dir.join(name);
    std::fs::write(&src, source).map_err(|source| CostError::Io { path: src.clone(), source })?;
    let out = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&path)
        .arg(&src)
        .args(args)
        .output()
        .map_err(|source| CostError::Gcc { path: path.clone(), source })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(CostError::GccFailed { path, stderr });
    }
    Ok(path)
}

/// The target library, built into a fresh temporary directory and loaded.
#[derive(Debug)]
pub struct Target {
    path: PathBuf,
    handle: usize,
    /// Addresses of the [`Body`]s, in [`Body::ALL`] order.
    bodies: [usize; 4],
    drive: usize,
    /// A fresh private directory (mkdtemp, 0700), removed after the library is closed.
    _dir: tempfile::TempDir,
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

impl Target {
    /// Builds [`SOURCE`] with `gcc -O2 -shared -fPIC` and loads it.
    pub fn build() -> Result<Target, CostError> {
        let dir = tempfile::Builder::new()
            .prefix("papirus-probe-cost-")
            .tempdir()
            .map_err(|source| CostError::Io { path: "a new temporary directory".into(), source })?;
        let path = gcc(dir.path(), "libprobe_cost.so", SOURCE, &["-shared", "-fPIC"])?;
        let mut t = Target { path, handle: 0, bodies: [0; 4], drive: 0, _dir: dir };
        let c = CString::new(t.path.as_os_str().as_encoded_bytes())
            .map_err(|e| CostError::Load { path: t.path.clone(), reason: e.to_string() })?;
        // SAFETY: loads the library just built from SOURCE, which has no constructors.
        t.handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) } as usize;
        if t.handle == 0 {
            return Err(CostError::Load { path: t.path.clone(), reason: dlerror() });
        }
        for (i, b) in Body::ALL.into_iter().enumerate() {
            t.bodies[i] = t.addr(b.symbol())?;
        }
        t.drive = t.addr("drive")?;
        Ok(t)
    }

    /// The library file (for uprobes on it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn addr(&self, name: &'static str) -> Result<usize, CostError> {
        let c = CString::new(name).map_err(|_| CostError::Symbol { path: self.path.clone(), name })?;
        // SAFETY: a lookup in the live handle `build` opened.
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, c.as_ptr()) };
        if p.is_null() { Err(CostError::Symbol { path: self.path.clone(), name }) } else { Ok(p as usize) }
    }

    /// The body `b` as a function pointer.
    pub fn tiny(&self, b: Body) -> Tiny {
        let a = self.bodies[b as usize];
        // SAFETY: a non-null dlsym result of a body, all `int (int, int)` in SOURCE;
        // the library stays loaded with `self`.
        unsafe { std::mem::transmute::<usize, Tiny>(a) }
    }

    /// `drive`, which calls a body `n` times from C.
    pub fn drive(&self) -> Drive {
        // SAFETY: the non-null dlsym result of `drive`, `long (int (*)(int, int), long)` in
        // SOURCE; the library stays loaded with `self`.
        unsafe { std::mem::transmute::<usize, Drive>(self.drive) }
    }

    /// The size of `b`'s body, from the library's symbol table.
    fn size(&self, b: Body) -> Result<u64, CostError> {
        let missing = || CostError::Symbol { path: self.path.clone(), name: b.symbol() };
        let elf = ElfFile::open(&self.path).map_err(|_| missing())?;
        elf.functions().find(|s| s.name == b.symbol() && s.size > 0).map(|s| s.size).ok_or_else(missing)
    }

    /// Patches [`Body::Patched`] with a trampoline to the probe runtime's
    /// hooks (empty probe to start with; see [`Instrumented::set_probe`]).
    /// The counters probe reads task-clock; `counters` of the result says
    /// whether it can.
    ///
    /// The runtime is process-wide: call this on the thread that will make
    /// the calls, before it calls any instrumented function.
    pub fn instrument(&self) -> Result<Instrumented<'_>, CostError> {
        let rt = Runtime::get()?;
        (rt.local_init)(16, 0);
        // Before this thread's first instrumented call, so its tables get a reader.
        let events = "task-clock";
        let counters = match (rt.set_events)(events.as_ptr(), events.len()) {
            0 => Ok(()),
            _ => Err(format!("the probe runtime refused the event {events}")),
        };
        let spec = FunctionSpec {
            name: Body::Patched.symbol().into(),
            addr: self.bodies[Body::Patched as usize] as u64,
            size: self.size(Body::Patched)?,
            hook: rt.enter,
            arg: 0,
            limit: 0,
        };
        let mut patcher = Patcher::new(LocalSpace::new()?);
        let out = patcher.instrument(&[spec])?;
        if let Some(r) = out.refused.first() {
            return Err(CostError::Refused(r.reason.to_string()));
        }
        let drive = self.drive();
        let (f, r) = (self.tiny(Body::Patched), self.tiny(Body::Reference));
        if drive(f, 1000) != drive(r, 1000) {
            let _ = patcher.remove_all();
            return Err(CostError::Refused("the patched function returns other results".into()));
        }
        Ok(Instrumented { patcher, counters, runtime: rt, _target: self })
    }

    /// Counting uprobe and uretprobe on `b`, for as long as the result lives.
    pub fn uprobe_uretprobe(&self, b: Body) -> Result<Uprobes, CostError> {
        let open = |kind: &str| {
            let event = format!("{kind}:{}:{}", self.path.display(), b.symbol());
            let c = parse_event(&event)
                .and_then(|a| a.open(CountTarget::ThisThread))
                .and_then(|c| c.enable().map(|()| c));
            c.map_err(|source| CostError::Uprobe { event, source })
        };
        Ok(Uprobes { entry: open("uprobe")?, exit: open("uretprobe")? })
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.handle != 0 {
            // SAFETY: no patch of the library is left (Instrumented borrows the
            // target), and no pointer into it is used after this.
            unsafe { libc::dlclose(self.handle as *mut c_void) };
        }
    }
}

/// The probe runtime library loaded into this process, and its entry points.
#[derive(Debug)]
struct Runtime {
    local_init: extern "C" fn(u64, u32) -> i64,
    set_probe: extern "C" fn(u32),
    set_events: extern "C" fn(*const u8, usize) -> i64,
    enter: u64,
}

impl Runtime {
    /// Loads the runtime once per process (it stays loaded).
    fn get() -> Result<&'static Runtime, CostError> {
        static RT: std::sync::OnceLock<Result<Runtime, String>> = std::sync::OnceLock::new();
        RT.get_or_init(Runtime::load).as_ref().map_err(|e| CostError::Runtime(e.clone()))
    }

    fn load() -> Result<Runtime, String> {
        let path = super::find_runtime().map_err(|e| e.to_string())?;
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: loads papirus' own runtime, which runs nothing when loaded.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(format!("{}: {}", path.display(), dlerror()));
        }
        let sym = |name: &str| -> Result<usize, String> {
            let n = CString::new(name).map_err(|e| e.to_string())?;
            // SAFETY: a lookup in the live handle just opened.
            let p = unsafe { libc::dlsym(h, n.as_ptr()) };
            if p.is_null() { Err(format!("{}: no symbol {name}", path.display())) } else { Ok(p as usize) }
        };
        let (init, probe, events) = (
            sym("papirus_probe_local_init")?,
            sym("papirus_probe_set_probe")?,
            sym("papirus_probe_set_events")?,
        );
        // SAFETY: the runtime's C ABI (its cabi module) defines these signatures;
        // the library is never unloaded.
        unsafe {
            Ok(Runtime {
                local_init: std::mem::transmute::<usize, extern "C" fn(u64, u32) -> i64>(init),
                set_probe: std::mem::transmute::<usize, extern "C" fn(u32)>(probe),
                set_events: std::mem::transmute::<usize, extern "C" fn(*const u8, usize) -> i64>(events),
                enter: sym("papirus_probe_enter")? as u64,
            })
        }
    }
}

/// [`Body::Patched`] with its trampoline; removed on drop.
#[derive(Debug)]
pub struct Instrumented<'a> {
    patcher: Patcher<LocalSpace>,
    counters: Result<(), String>,
    runtime: &'static Runtime,
    _target: &'a Target,
}

impl Instrumented<'_> {
    /// Switches the runtime's probe for calls from now on.
    pub fn set_probe(&self, probe: Probe) {
        (self.runtime.set_probe)(match probe {
            Probe::Empty => 0,
            Probe::Wallclock => 1,
            Probe::Counters => 2,
        });
    }

    /// Whether the counters probe can read task-clock here, or why not.
    pub fn counters(&self) -> Result<(), &str> {
        self.counters.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// Restores the original bytes.
    pub fn remove(mut self) -> Result<(), CostError> {
        Ok(self.patcher.remove_all()?)
    }
}

impl Drop for Instrumented<'_> {
    fn drop(&mut self) {
        let _ = self.patcher.remove_all();
    }
}

/// An open uprobe+uretprobe pair; closed on drop.
#[derive(Debug)]
pub struct Uprobes {
    entry: Counter,
    exit: Counter,
}

impl Uprobes {
    /// Hits so far of the uprobe and of the uretprobe.
    pub fn hits(&self) -> Result<(u64, u64), papirus_substrate::Error> {
        Ok((self.entry.read()?.raw, self.exit.read()?.raw))
    }
}

/// This thread's CPU time (user + kernel, so uprobe traps count).
pub fn cpu_time() -> Duration {
    Duration::from_nanos(papirus_substrate::sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0))
}

/// Best-of-`reps` nanoseconds of this thread's CPU time per call of `f`,
/// driven `n` times from C.
pub fn ns_per_call(drive: Drive, f: Tiny, n: i64, reps: u32) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            let t = cpu_time();
            black_box(drive(f, black_box(n)));
            (cpu_time() - t).as_secs_f64() * 1e9 / n.max(1) as f64
        })
        .fold(f64::INFINITY, f64::min)
}
