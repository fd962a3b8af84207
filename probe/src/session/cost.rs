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

use papirus_probe_abi::{CounterSetup, Probe};
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
fn gcc(dir: &Path, name: &str, source: &str, args: &[&str]) -> Result<PathBuf, CostError> {
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

/// [`gcc`] into a fresh private directory (mkdtemp, 0700) named `prefix…`,
/// removed when the returned handle drops.
pub fn gcc_scratch(
    prefix: &str,
    name: &str,
    source: &str,
    args: &[&str],
) -> Result<(tempfile::TempDir, PathBuf), CostError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| CostError::Io { path: "a new temporary directory".into(), source })?;
    let path = gcc(dir.path(), name, source, args)?;
    Ok((dir, path))
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
        let (dir, path) =
            gcc_scratch("papirus-probe-cost-", "libprobe_cost.so", SOURCE, &["-shared", "-fPIC"])?;
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
        self.instrument_with(&["task-clock"])
    }

    /// Like [`instrument`](Self::instrument), the counters probe reading
    /// `events` (fixed for the process by its first call).
    pub fn instrument_with(&self, events: &[&str]) -> Result<Instrumented<'_>, CostError> {
        let rt = Runtime::get()?;
        (rt.local_init)(16, 0);
        // Before this thread's first instrumented call, so its tables get a reader.
        let counters = Runtime::set_counters(rt, events);
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
    set_counters: extern "C" fn(*const u8, usize) -> i64,
    set_tracing: extern "C" fn(u32),
    segment: unsafe extern "C" fn(*mut u64) -> u64,
    enter: u64,
}

impl Runtime {
    /// Resolves `events` here and hands their descriptions and the TSC's
    /// rate to the runtime (which parses no names).
    fn set_counters(&self, events: &[&str]) -> Result<(), String> {
        let attrs = events
            .iter()
            .map(|e| parse_event(e).map_err(|err| format!("{e}: {err}")))
            .collect::<Result<Vec<_>, _>>()?;
        let setup = CounterSetup { events: attrs, tsc: papirus_substrate::clock::clock().tsc_rate() };
        let blob = serde_json::to_vec(&setup).map_err(|e| e.to_string())?;
        match (self.set_counters)(blob.as_ptr(), blob.len()) {
            0 => Ok(()),
            _ => Err(format!("the probe runtime refused the events {}", events.join(","))),
        }
    }

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
        let (init, probe, counters) = (
            sym("papirus_probe_local_init")?,
            sym("papirus_probe_set_probe")?,
            sym("papirus_probe_set_counters")?,
        );
        let (tracing, segment) = (sym("papirus_probe_set_tracing")?, sym("papirus_probe_local_segment")?);
        // SAFETY: the runtime's C ABI (its cabi module) defines these signatures;
        // the library is never unloaded.
        unsafe {
            Ok(Runtime {
                local_init: std::mem::transmute::<usize, extern "C" fn(u64, u32) -> i64>(init),
                set_probe: std::mem::transmute::<usize, extern "C" fn(u32)>(probe),
                set_counters: std::mem::transmute::<usize, extern "C" fn(*const u8, usize) -> i64>(counters),
                set_tracing: std::mem::transmute::<usize, extern "C" fn(u32)>(tracing),
                segment: std::mem::transmute::<usize, unsafe extern "C" fn(*mut u64) -> u64>(segment),
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

    /// Turns tracing of every closed call on or off (the in-process
    /// session's rings; drain them through [`Instrumented::segment`]).
    pub fn set_tracing(&self, on: bool) {
        (self.runtime.set_tracing)(u32::from(on));
    }

    /// The in-process session's results segment, as the tool would map it.
    pub fn segment(&self) -> &'static [std::sync::atomic::AtomicU64] {
        let mut words = 0u64;
        // SAFETY: the runtime's C ABI: writes the length, returns the live
        // mapping's address, which stays mapped for the life of the process
        // (in-process sessions are never torn down).
        let base = unsafe { (self.runtime.segment)(&mut words) };
        if base == 0 {
            return &[];
        }
        // SAFETY: `words` AtomicU64s at `base`, mapped for the life of the process (above).
        unsafe { std::slice::from_raw_parts(base as *const std::sync::atomic::AtomicU64, words as usize) }
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

/// The driver: the same body as [`SOURCE`]'s `tiny`, called through a
/// pointer `batch` times per sample; it times each sample inside the
/// process (CLOCK_MONOTONIC, so a tool's start-up and write-out are not
/// counted) and writes each sample's ns per call, then the calls made and a
/// checksum of the results, to the file named last on its command line.
fn driver_source() -> Result<String, CostError> {
    let body = SOURCE
        .lines()
        .find(|l| l.starts_with("#define TINY_BODY"))
        .ok_or_else(|| CostError::Symbol { path: "probe_bench.c".into(), name: "TINY_BODY" })?;
    Ok(format!(
        r#"#include <stdio.h>
#include <stdlib.h>
#include <time.h>
{body}
__attribute__((noinline)) int tiny(int x, int y) TINY_BODY
static int (*volatile fn)(int, int) = tiny;
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }}
int main(int argc, char **argv) {{
    if (argc != 4) return 2;
    long batch = atol(argv[1]), samples = atol(argv[2]), acc = 0;
    FILE *out = fopen(argv[3], "w");
    if (!out) return 3;
    int (*f)(int, int) = fn;
    for (long s = -1; s < samples; s++) {{ /* sample -1 warms up */
        double t0 = now();
        for (long i = 0; i < batch; i++) acc += f((int)i, (int)acc);
        double dt = now() - t0;
        if (s >= 0) fprintf(out, "%.4f\n", dt / batch);
    }}
    fprintf(out, "calls %ld checksum %ld\n", batch * (samples + 1), acc);
    return fclose(out) == 0 ? 0 : 4;
}}
"#
    ))
}

/// The driver program, built into a fresh private directory (removed on drop).
#[derive(Debug)]
pub struct Driver {
    dir: tempfile::TempDir,
    exe: PathBuf,
}

/// One run of the driver: ns per call of each sample, calls made, checksum.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverRun {
    /// Each sample's nanoseconds per call.
    pub ns: Vec<f64>,
    /// Calls made, warm-up included.
    pub calls: u64,
    /// A checksum of the results (equal under any correct instrumentation).
    pub checksum: String,
}

impl Driver {
    /// Builds the driver with `gcc -O2`.
    pub fn build() -> Result<Driver, CostError> {
        let (dir, exe) = gcc_scratch("papirus-probe-driver-", "driver", &driver_source()?, &[])?;
        Ok(Driver { dir, exe })
    }

    /// The program.
    pub fn path(&self) -> &Path {
        &self.exe
    }

    /// Its arguments for `batch` calls per sample and `samples` samples, and
    /// the file it writes (read it with [`Driver::read`]).
    pub fn args(&self, batch: u64, samples: u64, run: &str) -> (Vec<std::ffi::OsString>, PathBuf) {
        let out = self.dir.path().join(format!("{run}.out"));
        (vec![batch.to_string().into(), samples.to_string().into(), out.clone().into_os_string()], out)
    }

    /// What a run wrote to `out`.
    pub fn read(out: &Path) -> Result<DriverRun, String> {
        let text = std::fs::read_to_string(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let mut r = DriverRun { ns: Vec::new(), calls: 0, checksum: String::new() };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("calls ") {
                let mut w = rest.split_whitespace();
                r.calls = w.next().and_then(|c| c.parse().ok()).unwrap_or(0);
                r.checksum = w.nth(1).unwrap_or("").to_string();
            } else if let Ok(ns) = line.trim().parse::<f64>() {
                r.ns.push(ns);
            }
        }
        if r.ns.is_empty() || r.calls == 0 {
            return Err(format!("the driver wrote no samples: {}", text.trim()));
        }
        Ok(r)
    }

    /// Runs the driver under `cmd` (the driver and its arguments appended;
    /// `Command::new(driver.path())` for none) and reads what it wrote.
    pub fn run_under(
        &self,
        mut cmd: Command,
        batch: u64,
        samples: u64,
        run: &str,
    ) -> Result<DriverRun, String> {
        let (args, out) = self.args(batch, samples, run);
        if cmd.get_program() != self.exe.as_os_str() {
            cmd.arg(&self.exe);
        }
        let o = cmd.args(&args).output().map_err(|e| format!("cannot run {run}: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "{run} failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Driver::read(&out)
    }
}

/// Where uftrace is on PATH, if it is installed.
pub fn uftrace() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("uftrace")).find(|p| p.is_file())
}

/// The calls of `tiny` in `uftrace report`'s table (`total self calls name`).
pub fn uftrace_reported_calls(report: &str) -> Option<u64> {
    report.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.last() == Some(&"tiny")).then(|| w.get(w.len().checked_sub(2)?)?.parse().ok())?
    })
}

/// The driver under `uftrace record -P tiny --no-libcall` into `data`,
/// checked: the same checksum as `plain`, every call recorded.
pub fn uftraced(
    driver: &Driver,
    uftrace: &Path,
    plain: &DriverRun,
    batch: u64,
    samples: u64,
) -> Result<DriverRun, String> {
    let data = driver.dir.path().join("uftrace.data");
    let mut cmd = Command::new(uftrace);
    cmd.args(["record", "-P", "^tiny$", "--no-libcall", "--no-event", "-d"]).arg(&data);
    let traced = driver.run_under(cmd, batch, samples, "uftrace record -P tiny")?;
    if traced.checksum != plain.checksum {
        return Err(format!(
            "under uftrace the driver's results differ (checksum {} vs {})",
            traced.checksum, plain.checksum
        ));
    }
    let out = Command::new(uftrace)
        .args(["report", "--no-pager", "-d"])
        .arg(&data)
        .output()
        .map_err(|e| format!("uftrace report: {e}"))?;
    let recorded = uftrace_reported_calls(&String::from_utf8_lossy(&out.stdout)).unwrap_or(0);
    if recorded != traced.calls {
        return Err(format!(
            "uftrace -P tiny recorded {recorded} of {} calls: it did not patch tiny here",
            traced.calls
        ));
    }
    Ok(traced)
}
