//! In-process trampolines: C and C++ libraries built by the test with gcc/g++
//! -O2, loaded into this process, every function of them patched at once with
//! the probe runtime's hooks, then driven through their own entry points.
//! Each test checks its own thread's figures as differences around the calls
//! it makes, so tests may run in parallel.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, c_void};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use iced_x86::{Decoder, DecoderOptions, FlowControl, InstructionInfoFactory};
use object::{Object, ObjectSymbol, SymbolKind};
use papirus_probe::patch::{CATCH_BEGIN, FunctionSpec, LocalSpace, Patcher, Refusal, Refused, UNWIND_BEGIN};
use papirus_probe_runtime as rt;
use papirus_substrate::{Counter, Target as CountTarget, parse_event};
use papirus_testkit::{Cc, scratch, target};

/// The shared target library `src`, built as `dir/out`.
fn build(dir: &Path, src: &str, out: &str, extra: &[&str]) -> PathBuf {
    Cc::new(target(src)).shared().args(extra).build(dir, out)
}

/// Loads a library locally: several copies of the same target are loaded, and
/// each must call its own functions, not the first copy's.
fn dlopen(path: &Path) -> usize {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: loads a library this test built; its constructors are trivial.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h as usize
}

fn dlsym(handle: usize, name: &str) -> Option<usize> {
    let c = CString::new(name).unwrap();
    // SAFETY: a symbol lookup in a live handle (or RTLD_DEFAULT).
    let p = unsafe { libc::dlsym(handle as *mut c_void, c.as_ptr()) };
    (!p.is_null()).then_some(p as usize)
}

/// The file a loaded symbol comes from.
fn file_of(addr: usize) -> PathBuf {
    // SAFETY: dladdr fills a plain struct; an all-zero one is a valid start.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: addr is a symbol address from dlsym; info outlives the call.
    assert_ne!(unsafe { libc::dladdr(addr as *const c_void, &mut info) }, 0);
    // SAFETY: dladdr sets dli_fname to a NUL-terminated path owned by the loader.
    PathBuf::from(unsafe { CStr::from_ptr(info.dli_fname) }.to_str().unwrap())
}

/// Every defined function symbol of a loaded library: (name, runtime address,
/// size), one per address, exported names first (aliases such as
/// `fib.localalias` are dropped).
fn functions(path: &Path, handle: usize) -> Vec<(String, u64, u64)> {
    let data = std::fs::read(path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    let mut bias = None;
    for s in obj.dynamic_symbols().chain(obj.symbols()) {
        if s.kind() != SymbolKind::Text || s.size() == 0 || s.is_undefined() {
            continue;
        }
        let name = s.name().unwrap().to_string();
        if bias.is_none() && s.is_global() {
            bias = dlsym(handle, &name).map(|a| a as u64 - s.address());
        }
        if !out.iter().any(|(n, a, _)| *n == name || *a == s.address()) {
            out.push((name, s.address(), s.size()));
        }
    }
    let bias = bias.expect("an exported function");
    out.into_iter().map(|(n, a, s)| (n, a + bias, s)).collect()
}

struct Fixture {
    target: usize,
    exc: usize,
    avx: Option<usize>,
    ids: HashMap<String, u32>,
    patched: Vec<String>,
    refused: Vec<Refused>,
    expected: Expected,
    _patcher: Mutex<Patcher<LocalSpace>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
struct Big {
    a: i64,
    b: i64,
    c: i64,
    d: f64,
    e: f64,
}

struct Expected {
    /// Kernel uprobe counts of g (during f()), fib (during fib(20)) and three
    /// (three calls), taken before patching; `None` with the kernel's reason printed.
    uprobe: Option<[u64; 3]>,
    f: i64,
    fib: i32,
    three: [i32; 3],
    tail: i32,
    leaf5: i32,
    many: Big,
    vfma: Option<[f32; 8]>,
}

type ManyFn =
    extern "C" fn(i64, i64, i64, i64, i64, i64, f64, f64, f64, f64, f64, f64, f64, f64, i64, f64) -> Big;
type VfmaFn = extern "C" fn(*const f32, *const f32, *const f32, *mut f32);

macro_rules! func {
    ($handle:expr, $name:expr, $ty:ty) => {{
        let addr = dlsym($handle, $name).expect($name);
        // SAFETY: the C definition of this symbol has exactly this signature.
        unsafe { std::mem::transmute::<usize, $ty>(addr) }
    }};
}

fn call_many(h: usize) -> Big {
    let many = func!(h, "many", ManyFn);
    many(1, 2, 3, 4, 5, 6, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 77, 9.0)
}

fn call_vfma(h: usize) -> [f32; 8] {
    let v = func!(h, "call_vfma", VfmaFn);
    let a: [f32; 8] = std::array::from_fn(|i| i as f32 + 0.5);
    let b: [f32; 8] = std::array::from_fn(|i| 2.0 - i as f32);
    let c: [f32; 8] = std::array::from_fn(|i| (i * i) as f32);
    let mut out = [0f32; 8];
    v(a.as_ptr(), b.as_ptr(), c.as_ptr(), out.as_mut_ptr());
    out
}

/// A counting uprobe on `symbol` of the library at `path`, on this thread.
fn uprobe(path: &Path, symbol: &str) -> Result<Counter, papirus_substrate::Error> {
    let c = parse_event(&format!("uprobe:{}:{symbol}", path.display()))?.open(CountTarget::ThisThread)?;
    c.enable()?;
    Ok(c)
}

/// Uprobe counts of g during f(), fib during fib(20), three over three calls.
fn uprobe_counts(path: &Path, target: usize) -> Result<[u64; 3], papirus_substrate::Error> {
    let (g, fib, three) = (uprobe(path, "g")?, uprobe(path, "fib")?, uprobe(path, "three")?);
    func!(target, "f", extern "C" fn() -> i64)();
    func!(target, "fib", extern "C" fn(i32) -> i32)(20);
    for x in [-3, 0, 5] {
        func!(target, "three", extern "C" fn(i32) -> i32)(x);
    }
    Ok([g.read()?.raw, fib.read()?.raw, three.read()?.raw])
}

fn run_expected(target: usize, avx: Option<usize>, path: &Path) -> Expected {
    Expected {
        uprobe: uprobe_counts(path, target).inspect_err(|e| eprintln!("uprobe counts not taken: {e}")).ok(),
        f: func!(target, "f", extern "C" fn() -> i64)(),
        fib: func!(target, "fib", extern "C" fn(i32) -> i32)(20),
        three: [-3, 0, 5].map(|x| func!(target, "three", extern "C" fn(i32) -> i32)(x)),
        tail: func!(target, "tail_caller", extern "C" fn(i32) -> i32)(41),
        leaf5: func!(target, "leaf5", extern "C" fn(i32) -> i32)(13),
        many: call_many(target),
        vfma: avx.map(call_vfma),
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // The libraries stay loaded; their files go with `dir` once read.
        let dir = scratch();
        let target_path = build(dir.path(), "probe_target.c", "libprobe_target.so", &["-pthread"]);
        let exc_path = build(dir.path(), "probe_exc.cpp", "libprobe_exc.so", &[]);
        let avx_path = std::arch::is_x86_feature_detected!("avx2")
            .then(|| build(dir.path(), "probe_avx.c", "libprobe_avx.so", &["-mavx2"]));
        if avx_path.is_none() {
            eprintln!("this CPU has no AVX2: the __m256 case is not run");
        }
        let target = dlopen(&target_path);
        let exc = dlopen(&exc_path);
        let avx = avx_path.as_deref().map(dlopen);
        let expected = run_expected(target, avx, &target_path);

        let hooks = rt::hooks();
        let mut funcs: Vec<(String, u64, u64)> = functions(&target_path, target);
        funcs.extend(functions(&exc_path, exc));
        if let (Some(p), Some(h)) = (&avx_path, avx) {
            funcs.extend(functions(p, h));
        }
        let names: Vec<String> = funcs.iter().map(|f| f.0.clone()).collect();
        rt::init(4096, rt::Probe::Wallclock);
        let ids = rt::register_functions(&names).unwrap();
        let mut specs: Vec<FunctionSpec> = funcs
            .iter()
            .zip(ids)
            .map(|((name, addr, size), id)| FunctionSpec {
                name: name.clone(),
                addr: *addr,
                size: *size,
                hook: hooks.enter,
                arg: id,
                limit: 0,
            })
            .collect();
        // The unwinder and the C++ runtime, so exceptions see real return addresses.
        let mut unwinders = Vec::new();
        for name in UNWIND_BEGIN.iter().copied().chain([CATCH_BEGIN]) {
            // The C++ library's scope holds libstdc++ and libgcc_s.
            let addr = dlsym(exc, name).expect(name);
            let path = file_of(addr);
            let h = dlopen(&path);
            let (_, a, size) =
                functions(&path, h).into_iter().find(|(n, _, _)| n == name).expect("sized symbol");
            let hook = if name == CATCH_BEGIN { hooks.catch } else { hooks.unwind_begin };
            unwinders.push(FunctionSpec { name: name.to_string(), addr: a, size, hook, arg: 0, limit: 0 });
        }
        specs.extend(unwinders);
        let mut patcher = Patcher::new(LocalSpace::new().unwrap());
        let outcome = patcher.instrument(&specs).unwrap();
        for r in &outcome.refused {
            eprintln!("refused {} at {:#x}: {}", r.name, r.addr, r.reason);
        }
        Fixture {
            target,
            exc,
            avx,
            ids: names.iter().enumerate().map(|(i, n)| (n.clone(), i as u32)).collect(),
            patched: outcome.installed.iter().map(|i| i.name.clone()).collect(),
            refused: outcome.refused,
            expected,
            _patcher: Mutex::new(patcher),
        }
    })
}

/// This thread's totals per function id.
fn mine() -> HashMap<u32, rt::FunctionReport> {
    let tid = nix::unistd::gettid().as_raw() as u32;
    let r = rt::snapshot();
    r.threads
        .iter()
        .filter(|t| t.tid == tid)
        .flat_map(|t| t.functions.iter())
        .map(|f| (f.id, f.clone()))
        .collect()
}

/// This thread's caller → callee table: (caller, callee) -> (calls, incl).
fn my_edges() -> HashMap<(u32, u32), (u64, u64)> {
    let tid = nix::unistd::gettid().as_raw() as u32;
    let r = rt::snapshot();
    r.threads
        .iter()
        .filter(|t| t.tid == tid)
        .flat_map(|t| t.callees.iter())
        .map(|e| ((e.caller, e.callee), (e.calls, e.incl_ticks)))
        .collect()
}

/// Runs `body` and returns each named function's (calls, exits, unwound) made meanwhile on this thread.
fn delta<R>(names: &[&str], body: impl FnOnce() -> R) -> (R, HashMap<String, [u64; 3]>) {
    let fx = fixture();
    let before = mine();
    let r = body();
    let after = mine();
    let d = names
        .iter()
        .map(|n| {
            let id = fx.ids[*n];
            let b = before.get(&id).cloned().unwrap_or_default();
            let a = after.get(&id).cloned().unwrap_or_default();
            (
                n.to_string(),
                [
                    a.figures.calls - b.figures.calls,
                    a.figures.exits - b.figures.exits,
                    a.figures.unwound - b.figures.unwound,
                ],
            )
        })
        .collect();
    (r, d)
}

#[test]
fn the_acceptance_functions_are_patched() {
    let fx = fixture();
    for name in [
        "f",
        "g",
        "fib",
        "three",
        "tail_caller",
        "tail_callee",
        "leaf5",
        "many",
        "lj1",
        "lj2",
        "lj3",
        "run_longjmp",
        "sig_fn",
        "with_signal",
        "ex1",
        "ex2",
        "ex3",
        "run_exc",
    ]
    .into_iter()
    .chain(fx.avx.map(|_| "vfma"))
    .chain(UNWIND_BEGIN)
    .chain([CATCH_BEGIN])
    {
        assert!(fx.patched.iter().any(|p| p == name), "{name} not patched; refused: {:?}", fx.refused);
    }
}

#[test]
fn refusals_are_only_for_listed_reasons() {
    let fx = fixture();
    assert!(!fx.patched.is_empty());
    for r in &fx.refused {
        match &r.reason {
            Refusal::NotAnEntry => assert!(r.name.contains(".cold"), "{r:?}"),
            Refusal::TooShort { .. }
            | Refusal::EndsEarly { .. }
            | Refusal::BranchIntoPatch { .. }
            | Refusal::PltStub
            | Refusal::AlreadyPatched => {}
            other => panic!("{}: unexpected refusal {other}", r.name),
        }
    }
    // The compiler's cold parts are the refusals we know to expect.
    assert!(fx.refused.iter().any(|r| r.name == "ex3.cold" && r.reason == Refusal::NotAnEntry));
}

#[test]
fn calls_are_exact_and_values_intact() {
    let fx = fixture();
    let h = fx.target;
    let names = ["f", "g", "fib", "three", "tail_caller", "tail_callee", "leaf5", "many"];
    let (vals, d) = delta(&names, || {
        (
            func!(h, "f", extern "C" fn() -> i64)(),
            func!(h, "fib", extern "C" fn(i32) -> i32)(20),
            [-3, 0, 5].map(|x| func!(h, "three", extern "C" fn(i32) -> i32)(x)),
            func!(h, "tail_caller", extern "C" fn(i32) -> i32)(41),
            func!(h, "leaf5", extern "C" fn(i32) -> i32)(13),
            call_many(h),
        )
    });
    let e = &fx.expected;
    assert_eq!(vals, (e.f, e.fib, e.three, e.tail, e.leaf5, e.many));
    assert_eq!(e.many, Big { a: 91, b: 77, c: 5, d: 186.0, e: 4.5 });
    assert_eq!(d["f"], [1, 1, 0]);
    assert_eq!(d["g"], [1000, 1000, 0]);
    // fib(20) enters fib 2·fib(21) − 1 times.
    assert_eq!(d["fib"], [21891, 21891, 0]);
    assert_eq!(d["three"], [3, 3, 0]);
    if let Some(up) = e.uprobe {
        assert_eq!(
            up,
            [d["g"][0], d["fib"][0], d["three"][0]],
            "the kernel's uprobes counted the same calls"
        );
    }
    assert_eq!(d["tail_caller"], [1, 1, 0]);
    assert_eq!(d["tail_callee"], [1, 1, 0]);
    assert_eq!(d["leaf5"], [1, 1, 0]);
    assert_eq!(d["many"], [1, 1, 0]);

    let me = mine();
    let (f, g) = (&me[&fx.ids["f"]], &me[&fx.ids["g"]]);
    assert!(f.figures.incl_ticks >= f.figures.excl_ticks && f.figures.incl_ticks > 0);
    assert!(g.figures.min_ticks <= g.figures.max_ticks && g.figures.max_ticks > 0);
    let edges = my_edges();
    let (calls, incl) = edges[&(fx.ids["f"], fx.ids["g"])];
    assert_eq!(calls % 1000, 0);
    assert!(f.figures.incl_ticks >= incl, "f's inclusive time covers its callees'");
    assert!(edges.contains_key(&(fx.ids["tail_caller"], fx.ids["tail_callee"])));
    assert!(edges.contains_key(&(fx.ids["fib"], fx.ids["fib"])));
    let fib = &me[&fx.ids["fib"]];
    assert!(
        fib.figures.incl_ticks >= fib.figures.max_ticks,
        "recursion counts the outermost activation once"
    );
}

#[test]
fn vector_arguments_and_returns_survive() {
    let fx = fixture();
    let Some(h) = fx.avx else {
        papirus_testkit::skip("this CPU has no AVX2");
        return;
    };
    let (out, d) = delta(&["vfma"], || call_vfma(h));
    assert_eq!(Some(out), fx.expected.vfma);
    assert_eq!(d["vfma"], [1, 1, 0]);
}

#[test]
fn threads_keep_their_own_tables() {
    let fx = fixture();
    let run = func!(fx.target, "run_threads", extern "C" fn(i32, *mut i64, *mut i64) -> i32);
    let (mut results, mut tids) = ([0i64; 4], [0i64; 4]);
    assert_eq!(run(4, results.as_mut_ptr(), tids.as_mut_ptr()), 0);
    assert_eq!(results, [fx.expected.f; 4]);
    let report = rt::snapshot();
    for tid in tids {
        let t = report.threads.iter().find(|t| i64::from(t.tid) == tid).expect("exited thread kept");
        let get = |n: &str| t.functions.iter().find(|f| f.id == fx.ids[n]).cloned().unwrap_or_default();
        assert_eq!((get("f").figures.calls, get("f").figures.exits), (1, 1));
        assert_eq!((get("g").figures.calls, get("g").figures.exits), (1000, 1000));
        assert_eq!(t.open, 0);
    }
}

#[test]
fn longjmp_closes_the_frames_it_skips() {
    let fx = fixture();
    let run = func!(fx.target, "run_longjmp", extern "C" fn(i32) -> i32);
    let names = ["run_longjmp", "lj1", "lj2", "lj3"];
    let (r, d) = delta(&names, || run(5));
    assert_eq!(r, 5);
    assert_eq!(d["run_longjmp"], [1, 1, 0]);
    for n in ["lj1", "lj2", "lj3"] {
        assert_eq!(d[n], [1, 0, 1], "{n}: entered once, closed as unwound");
    }
    let (r, d) = delta(&names, || run(0));
    assert_eq!(r, 0);
    for n in names {
        assert_eq!(d[n], [1, 1, 0], "{n}");
    }
}

#[test]
fn cxx_exception_reaches_its_catch() {
    let fx = fixture();
    let run = func!(fx.exc, "run_exc", extern "C" fn(i32) -> i32);
    let destroyed = func!(fx.exc, "exc_destroyed", extern "C" fn() -> i64);
    let names = ["run_exc", "ex1", "ex2", "ex3"];
    let before = destroyed();
    let (r, d) = delta(&names, || run(7));
    assert_eq!(r, 7, "caught with its value");
    assert_eq!(destroyed() - before, 1, "the destructor on the way ran");
    assert_eq!(d["run_exc"], [1, 1, 0]);
    for n in ["ex1", "ex2", "ex3"] {
        assert_eq!(d[n], [1, 0, 1], "{n}: entered once, closed as unwound");
    }
    let (r, d) = delta(&names, || (0..3).map(|_| run(0)).sum::<i32>());
    assert_eq!(r, 0);
    for n in names {
        assert_eq!(d[n], [3, 3, 0], "{n}");
    }
    // And throwing again after that still works, with the returns hijacked again.
    let (r, d) = delta(&names, || run(3) + run(0) + run(4));
    assert_eq!(r, 7);
    assert_eq!(d["ex3"], [3, 1, 2]);
    assert_eq!(d["run_exc"], [3, 3, 0]);
}

#[test]
fn signal_handler_calls_are_counted() {
    let fx = fixture();
    let with_signal = func!(fx.target, "with_signal", extern "C" fn() -> i32);
    let (r, d) = delta(&["with_signal", "sig_fn"], || with_signal());
    assert_eq!(r, libc::SIGUSR1);
    assert_eq!(d["with_signal"], [1, 1, 0]);
    assert_eq!(d["sig_fn"], [1, 1, 0]);
}

#[test]
fn removal_restores_the_original_bytes() {
    let dir = scratch();
    let path = build(dir.path(), "probe_target.c", "libprobe_removal.so", &["-pthread"]);
    let h = dlopen(&path);
    let funcs = functions(&path, h);
    let mem = File::open("/proc/self/mem").unwrap();
    let read = |addr: u64, size: u64| {
        let mut b = vec![0; size as usize];
        mem.read_exact_at(&mut b, addr).unwrap();
        b
    };
    let specs: Vec<FunctionSpec> = ["leaf5", "fib"]
        .iter()
        .map(|name| {
            let (_, addr, size) = funcs.iter().find(|(n, _, _)| n == name).unwrap();
            FunctionSpec {
                name: name.to_string(),
                addr: *addr,
                size: *size,
                hook: rt::hooks().enter,
                arg: u32::MAX,
                limit: 0,
            }
        })
        .collect();
    let original: Vec<Vec<u8>> = specs.iter().map(|s| read(s.addr, s.size)).collect();
    let leaf5 = func!(h, "leaf5", extern "C" fn(i32) -> i32);
    let fib = func!(h, "fib", extern "C" fn(i32) -> i32);
    let mut p = Patcher::new(LocalSpace::new().unwrap());
    let out = p.instrument(&specs).unwrap();
    assert_eq!(out.installed.len(), 2);
    for (s, o) in specs.iter().zip(&original) {
        assert_ne!(&read(s.addr, s.size), o);
    }
    assert_eq!((leaf5(13), fib(10)), (40, 55));
    let again = p.instrument(&specs[..1]).unwrap();
    assert_eq!(again.refused[0].reason, Refusal::AlreadyPatched);
    p.remove_all().unwrap();
    for (s, o) in specs.iter().zip(&original) {
        assert_eq!(&read(s.addr, s.size), o);
    }
    assert_eq!((leaf5(13), fib(10)), (40, 55));
    drop(p);
    assert_eq!(&read(specs[0].addr, specs[0].size), &original[0]);
}

/// Walks the code reachable from `roots` (following direct calls and
/// branches) and fails on any vector, x87, MMX or mask register, or any
/// indirect branch or call (a call into libc goes through one) other than the
/// exit stub's jump through its popped return slot. `xsaver` is the
/// runtime's door to its cold path (a thread's registration): the walk
/// checks that it saves the extended state (xsave64 before its call,
/// xrstor64 after) and does not descend into what it calls. Returns the
/// instructions checked.
fn check_vector_free(
    roots: &[u64],
    xsaver: u64,
    read: &mut dyn FnMut(u64, &mut [u8]),
) -> Vec<iced_x86::Mnemonic> {
    let mut todo = roots.to_vec();
    let mut seen = HashSet::new();
    // The door: push ×3, two movs, mask in edx:eax, xsave64, a mov, call, mask, xrstor64.
    let mut ip = xsaver;
    let mut order = Vec::new();
    for _ in 0..16 {
        let mut bytes = [0u8; 16];
        read(ip, &mut bytes);
        let i = Decoder::with_ip(64, &bytes, ip, DecoderOptions::NONE).decode();
        order.push(i.mnemonic());
        ip = i.next_ip();
    }
    use iced_x86::Mnemonic::{Call, Xrstor64, Xsave64};
    let pos = |m| order.iter().position(|&x| x == m).unwrap_or(usize::MAX);
    assert!(
        pos(Xsave64) < pos(Call) && pos(Call) < pos(Xrstor64),
        "the cold path's door saves state: {order:?}"
    );
    seen.insert(xsaver);
    let mut walked = Vec::new();
    let mut info = InstructionInfoFactory::new();
    while let Some(ip) = todo.pop() {
        if !seen.insert(ip) {
            continue;
        }
        let mut bytes = [0u8; 16];
        read(ip, &mut bytes);
        let i = Decoder::with_ip(64, &bytes, ip, DecoderOptions::NONE).decode();
        assert!(!i.is_invalid(), "undecodable at {ip:#x}");
        walked.push(i.mnemonic());
        for r in info.info(&i).used_registers() {
            let reg = r.register();
            assert!(
                !(reg.is_xmm() || reg.is_ymm() || reg.is_zmm() || reg.is_mm() || reg.is_st() || reg.is_k()),
                "{i} at {ip:#x} uses {reg:?}"
            );
        }
        match i.flow_control() {
            FlowControl::Next => todo.push(i.next_ip()),
            FlowControl::ConditionalBranch => {
                todo.push(i.next_ip());
                todo.push(i.near_branch_target());
            }
            FlowControl::UnconditionalBranch => todo.push(i.near_branch_target()),
            FlowControl::Call if i.code() == iced_x86::Code::Call_rel32_64 => {
                todo.push(i.next_ip());
                todo.push(i.near_branch_target());
            }
            _ if i.code() == iced_x86::Code::Syscall => todo.push(i.next_ip()),
            // int3 only pads after calls that never return (the runtime's `die`).
            FlowControl::Return | FlowControl::Exception | FlowControl::Interrupt => {}
            // The exit stub returns by jumping through the popped return slot.
            FlowControl::IndirectBranch
                if i.code() == iced_x86::Code::Jmp_rm64
                    && i.memory_base() == iced_x86::Register::RSP
                    && i.memory_index() == iced_x86::Register::None
                    && i.memory_displacement64() as i64 == -8 => {}
            _ => panic!("{i} at {ip:#x}: indirect control flow or a call outside the runtime"),
        }
    }
    walked
}

/// The walk covered the counters probe's reads: the rdpmc of a hardware
/// counter's page and the `syscall` of a `read(2)` are both in it.
fn check_counters_walked(walked: &[iced_x86::Mnemonic], what: &str) {
    use iced_x86::Mnemonic::{Rdpmc, Rdtsc, Syscall};
    for m in [Rdtsc, Rdpmc, Syscall] {
        assert!(walked.contains(&m), "no {m:?} among the {} instructions walked in {what}", walked.len());
    }
}

/// The hooks' code, and everything it calls — the wallclock and the counters
/// probes' hot paths: timestamps, the counting core's group reads (page
/// seqlocks, rdpmc, the TSC extrapolation, a `read(2)` by `syscall`) and its
/// estimator — touches no vector, x87 or MMX register and calls nothing
/// outside the runtime: the trampolines rely on it when they save only
/// general registers and flags. Checked in this process (the runtime linked
/// as an rlib) …
#[test]
fn hooks_use_no_vector_registers_or_libc() {
    let hooks = rt::hooks();
    let mem = File::open("/proc/self/mem").unwrap();
    let roots = [hooks.enter, hooks.unwind_begin, hooks.catch, hooks.exit_stub];
    let walked = check_vector_free(&roots, hooks.cold_call, &mut |a, b| mem.read_exact_at(b, a).unwrap());
    assert!(walked.len() > 100, "walked {} instructions", walked.len());
    check_counters_walked(&walked, "this process");
}

/// … and in the shared library papirus-probe loads into targets.
#[test]
fn the_runtime_library_uses_no_vector_registers_or_libc() {
    let path = papirus_probe::session::find_runtime().expect("the runtime is built with papirus-probe");
    let data = std::fs::read(&path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let sym = |n: &str| {
        obj.symbols()
            .find(|s| s.name() == Ok(n))
            .unwrap_or_else(|| panic!("{n} in {}", path.display()))
            .address()
    };
    let roots = [
        "papirus_probe_enter",
        "papirus_probe_unwind_begin",
        "papirus_probe_catch",
        "papirus_probe_exit_stub",
    ]
    .map(sym);
    let door = obj
        .symbols()
        .find(|s| s.name().is_ok_and(|n| n.contains("counters9cold_call")))
        .expect("the cold path's door")
        .address();
    let walked = check_vector_free(&roots, door, &mut |addr, buf| {
        use object::ObjectSegment;
        let seg = obj.segments().find(|s| (s.address()..s.address() + s.size()).contains(&addr)).unwrap();
        let off = (addr - seg.address() + seg.file_range().0) as usize;
        let end = (off + buf.len()).min(data.len());
        buf[..end - off].copy_from_slice(&data[off..end]);
    });
    assert!(walked.len() > 100, "walked {} instructions in {}", walked.len(), path.display());
    check_counters_walked(&walked, &path.display().to_string());
}

#[test]
fn a_thread_inside_the_displaced_bytes_blocks_the_patch() {
    let dir = scratch();
    let path = build(dir.path(), "probe_target.c", "libprobe_pcs.so", &["-pthread"]);
    let h = dlopen(&path);
    let (_, addr, size) = functions(&path, h).into_iter().find(|(n, _, _)| n == "many").unwrap();
    let spec =
        FunctionSpec { name: "many".into(), addr, size, hook: rt::hooks().enter, arg: u32::MAX, limit: 0 };
    let mut p = Patcher::new(LocalSpace::new().unwrap());
    p.set_thread_pcs(vec![addr + 1]);
    let out = p.instrument(std::slice::from_ref(&spec)).unwrap();
    assert_eq!(out.refused[0].reason, Refusal::ThreadInside);
    p.set_thread_pcs(vec![addr]);
    assert_eq!(p.instrument(&[spec]).unwrap().installed.len(), 1, "a thread at the very start is fine");
}
