//! Per-call cost of an instrumented call: the uninstrumented call, the
//! trampoline with the empty probe (entry + exit hooks, no clock), with the
//! wallclock probe (two TSC reads), with the counters probe reading
//! task-clock (the substrate's user-space path, behind an XSAVE of the
//! extended state), and uprobe+uretprobe counting on the same body (a typical
//! -O2 entry, and one behind a 5-byte nop), all in one run.
//!
//! Times are this thread's CPU time (user + kernel, so uprobe traps count),
//! not wall time: the machines these run on are shared, and a preempted
//! sample would otherwise measure someone else's work.
//!
//! `cargo bench -p papirus-dyninst --bench probe -- --warm-up-time 1 --measurement-time 2`

use std::ffi::{CString, c_void};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::Criterion;
use object::{Object, ObjectSegment, ObjectSymbol};
use papirus_dyninst::patch::{FunctionSpec, LocalSpace, Patcher};
use papirus_probe_runtime as rt;
use perf_event_open_sys::bindings::perf_event_attr;

type Tiny = extern "C" fn(i32, i32) -> i32;
type Drive = extern "C" fn(Tiny, i64) -> i64;

struct Lib {
    path: PathBuf,
    handle: usize,
}

impl Lib {
    fn build() -> Lib {
        let dir = std::env::temp_dir().join(format!("papirus-probe-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/targets/probe_bench.c");
        let path = dir.join("libprobe_bench.so");
        let ok = Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&path)
            .arg(&src)
            .status()
            .expect("gcc runs")
            .success();
        assert!(ok, "gcc failed");
        let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: loads the library just built; it has no constructors.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) } as usize;
        assert_ne!(handle, 0);
        Lib { path, handle }
    }

    fn addr(&self, name: &str) -> usize {
        let c = CString::new(name).unwrap();
        // SAFETY: a lookup in a live handle.
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, c.as_ptr()) };
        assert!(!p.is_null(), "{name}");
        p as usize
    }

    fn tiny(&self, name: &str) -> Tiny {
        // SAFETY: every tiny* symbol is `int (int, int)`.
        unsafe { std::mem::transmute::<usize, Tiny>(self.addr(name)) }
    }

    fn drive(&self) -> Drive {
        // SAFETY: `drive` is `long (int (*)(int, int), long)`.
        unsafe { std::mem::transmute::<usize, Drive>(self.addr("drive")) }
    }

    /// (size, file offset) of a function symbol.
    fn symbol(&self, name: &str) -> (u64, u64) {
        let data = std::fs::read(&self.path).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let s = obj.dynamic_symbols().find(|s| s.name() == Ok(name)).unwrap();
        let seg =
            obj.segments().find(|g| (g.address()..g.address() + g.size()).contains(&s.address())).unwrap();
        (s.size(), s.address() - seg.address() + seg.file_range().0)
    }
}

/// A counting uprobe (or uretprobe) on this process; `None` with the kernel's reason.
fn uprobe(path: &Path, offset: u64, ret: bool) -> Result<i32, std::io::Error> {
    let ty: u32 =
        std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")?.trim().parse().unwrap();
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut attr =
        perf_event_attr { size: size_of::<perf_event_attr>() as u32, type_: ty, ..Default::default() };
    attr.config = u64::from(ret);
    attr.uprobe_path = c.as_ptr() as u64;
    attr.probe_offset = offset;
    // SAFETY: a valid attr whose path outlives the call; counting only.
    let fd = unsafe { perf_event_open_sys::perf_event_open(&mut attr, 0, -1, -1, 0) };
    if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(fd) }
}

/// This thread's CPU time.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Best-of-7 nanoseconds per call of `f` driven `n` times from C.
fn ns_per_call(drive: Drive, f: Tiny, n: i64) -> f64 {
    (0..7)
        .map(|_| {
            let t = cpu_time();
            black_box(drive(f, black_box(n)));
            (cpu_time() - t).as_secs_f64() * 1e9 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn bench(c: &mut Criterion, name: &str, drive: Drive, f: Tiny) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let t = cpu_time();
            black_box(drive(f, iters as i64));
            cpu_time() - t
        })
    });
}

fn main() {
    let mut c = Criterion::default().configure_from_args().warm_up_time(Duration::from_secs(1));
    let lib = Lib::build();
    let drive = lib.drive();
    let (tiny, tiny_ref) = (lib.tiny("tiny"), lib.tiny("tiny_ref"));
    assert_eq!(drive(tiny, 1000), drive(tiny_ref, 1000));

    bench(&mut c, "call/uninstrumented", drive, tiny_ref);

    rt::init(16, rt::Probe::Empty);
    // Before this thread's first instrumented call, so its tables get a reader.
    let counters = match rt::set_events(&["task-clock"]) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("counters probe not measured: {e}");
            false
        }
    };
    let id = rt::register_functions(&["tiny"]).unwrap().start;
    let (size, _) = lib.symbol("tiny");
    let mut patcher = Patcher::new(LocalSpace::new().unwrap());
    let spec = FunctionSpec {
        name: "tiny".into(),
        addr: lib.addr("tiny") as u64,
        size,
        hook: rt::hooks().enter,
        arg: id,
    };
    let out = patcher.instrument(&[spec]).unwrap();
    assert_eq!(out.installed.len(), 1, "{:?}", out.refused);
    assert_eq!(drive(tiny, 1000), drive(tiny_ref, 1000));
    bench(&mut c, "call/trampoline+empty", drive, tiny);
    rt::set_probe(rt::Probe::Wallclock);
    bench(&mut c, "call/trampoline+wallclock", drive, tiny);
    if counters {
        rt::set_probe(rt::Probe::Counters);
        bench(&mut c, "call/trampoline+counters(task-clock)", drive, tiny);
    }

    let mut up_fds = Vec::new();
    let mut uprobes = Vec::new();
    for name in ["tiny_up", "tiny_nop5"] {
        let (_, off) = lib.symbol(name);
        match (uprobe(&lib.path, off, false), uprobe(&lib.path, off, true)) {
            (Ok(a), Ok(b)) => {
                up_fds.extend([a, b]);
                bench(&mut c, &format!("call/uprobe+uretprobe/{name}"), drive, lib.tiny(name));
                uprobes.push((name, lib.tiny(name)));
            }
            (Err(e), _) | (_, Err(e)) => eprintln!("uprobe on {name}: {e} (not measured)"),
        }
    }

    // A summary from one more pass, so every ratio comes from this run.
    rt::set_probe(rt::Probe::Empty);
    let n = 1_000_000;
    let base = ns_per_call(drive, tiny_ref, n);
    let empty = ns_per_call(drive, tiny, n);
    rt::set_probe(rt::Probe::Wallclock);
    let wall = ns_per_call(drive, tiny, n);
    rt::set_probe(rt::Probe::Counters);
    let cnt = counters.then(|| ns_per_call(drive, tiny, n / 10));
    rt::set_probe(rt::Probe::Wallclock);
    println!("\nper call, thread CPU time (best of 7 × {n} calls):");
    println!("  uninstrumented             {base:8.2} ns");
    println!(
        "  trampoline, empty probe    {empty:8.2} ns  (+{:.2} ns, {:.1}× the call)",
        empty - base,
        empty / base
    );
    println!(
        "  trampoline, wallclock      {wall:8.2} ns  (+{:.2} ns, {:.1}× the call)",
        wall - base,
        wall / base
    );
    if let Some(cnt) = cnt {
        println!(
            "  trampoline, counters       {cnt:8.2} ns  (+{:.2} ns, {:.1}× the call; task-clock)",
            cnt - base,
            cnt / base
        );
    }
    for (name, f) in uprobes {
        let up = ns_per_call(drive, f, 20_000);
        println!(
            "  uprobe+uretprobe {name:<10}{up:8.0} ns  ({:.0}× the wallclock probe per call, {:.0}× its added cost)",
            up / wall,
            (up - base) / (wall - base)
        );
    }
    for fd in up_fds {
        // SAFETY: closes the perf fds opened above.
        unsafe { libc::close(fd) };
    }
    patcher.remove_all().unwrap();
    c.final_summary();
}
