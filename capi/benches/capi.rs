//! papirus' C ABI against Debian's PAPI 7.0, side by side in one run:
//! `PAPI_read` of {perf::TASK-CLOCK}, `PAPI_get_real_nsec`,
//! `PAPI_get_virt_nsec`, and `PAPI_start` + `PAPI_stop`.
//!
//! papirus' entry points are called as the C ABI exports them (the
//! `extern "C"` functions of this crate); Debian's libpapi.so.7.0 is loaded
//! with `dlmopen` into a namespace of its own, since both export the same
//! names. After criterion's runs, a table gives each ratio from medians of
//! batches timed in the same run. Without Debian's libpapi (apt-get install
//! libpapi-dev) only papirus' rows run.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use papi::exports as p;

/// Debian's entry points.
struct Papi {
    library_init: unsafe extern "C" fn(c_int) -> c_int,
    create_eventset: unsafe extern "C" fn(*mut c_int) -> c_int,
    add_named_event: unsafe extern "C" fn(c_int, *const c_char) -> c_int,
    start: unsafe extern "C" fn(c_int) -> c_int,
    stop: unsafe extern "C" fn(c_int, *mut i64) -> c_int,
    read: unsafe extern "C" fn(c_int, *mut i64) -> c_int,
    real_nsec: unsafe extern "C" fn() -> i64,
    virt_nsec: unsafe extern "C" fn() -> i64,
}

fn load_debian() -> Option<Papi> {
    let path = CString::new("/usr/lib/x86_64-linux-gnu/libpapi.so.7.0").ok()?;
    // SAFETY: loads a shared library by absolute path into a new link-map
    // namespace, so its symbols cannot bind to papirus' of the same names.
    let h = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    /// A function pointer of type `F` at address `p`.
    ///
    /// # Safety
    /// `p` is a function of type `F`.
    unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
        // SAFETY: forwarded; `F` is a function pointer, the size of `p`.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }
    let sym = |name: &str| -> Option<*mut c_void> {
        let n = CString::new(name).ok()?;
        // SAFETY: `h` is a live handle from dlmopen; `n` is NUL-terminated.
        let s = unsafe { libc::dlsym(h, n.as_ptr()) };
        (!s.is_null()).then_some(s)
    };
    // SAFETY: each symbol is PAPI 7.0's function of the signature papi.h
    // declares for that name (Debian's libpapi, checked by the ABI tests).
    unsafe {
        Some(Papi {
            library_init: as_fn(sym("PAPI_library_init")?),
            create_eventset: as_fn(sym("PAPI_create_eventset")?),
            add_named_event: as_fn(sym("PAPI_add_named_event")?),
            start: as_fn(sym("PAPI_start")?),
            stop: as_fn(sym("PAPI_stop")?),
            read: as_fn(sym("PAPI_read")?),
            real_nsec: as_fn(sym("PAPI_get_real_nsec")?),
            virt_nsec: as_fn(sym("PAPI_get_virt_nsec")?),
        })
    }
}

/// The four operations of one library.
struct Ops {
    name: &'static str,
    read: Box<dyn Fn() -> i64>,
    real: Box<dyn Fn() -> i64>,
    virt: Box<dyn Fn() -> i64>,
    start_stop: Box<dyn Fn() -> i64>,
    /// Stops (false) or restarts (true) the read set: PAPI runs one set per
    /// component and thread, so start + stop is timed with it stopped.
    read_running: Box<dyn Fn(bool)>,
}

impl Ops {
    /// Operation `pick` (0 read, 1 real, 2 virt, 3 start + stop).
    fn op(&self, pick: usize) -> &dyn Fn() -> i64 {
        match pick {
            0 => &*self.read,
            1 => &*self.real,
            2 => &*self.virt,
            _ => &*self.start_stop,
        }
    }
}

const TASK_CLOCK: &str = "perf::TASK-CLOCK";

fn papirus_ops() -> Ops {
    let name = CString::new(TASK_CLOCK).unwrap();
    let (mut read_set, mut ss_set) = (-1, -1);
    // SAFETY: the arguments are what papi.h specifies: a version, pointers
    // to ints holding PAPI_NULL, NUL-terminated names, arrays of one value.
    unsafe {
        assert_eq!(p::PAPI_library_init(0x0700_0000), 0x0700_0000);
        assert_eq!(p::PAPI_create_eventset(&mut read_set), 0);
        assert_eq!(p::PAPI_add_named_event(read_set, name.as_ptr()), 0);
        assert_eq!(p::PAPI_start(read_set), 0);
        assert_eq!(p::PAPI_create_eventset(&mut ss_set), 0);
        assert_eq!(p::PAPI_add_named_event(ss_set, name.as_ptr()), 0);
    }
    Ops {
        name: "papirus",
        read: Box::new(move || {
            let mut v = [0i64; 1];
            // SAFETY: one value for a set of one event.
            unsafe { p::PAPI_read(read_set, v.as_mut_ptr()) };
            v[0]
        }),
        real: Box::new(|| p::PAPI_get_real_nsec()),
        virt: Box::new(|| p::PAPI_get_virt_nsec()),
        start_stop: Box::new(move || {
            let mut v = [0i64; 1];
            p::PAPI_start(ss_set);
            // SAFETY: one value for a set of one event.
            unsafe { p::PAPI_stop(ss_set, v.as_mut_ptr()) };
            v[0]
        }),
        read_running: Box::new(move |on| {
            if on {
                p::PAPI_start(read_set);
            } else {
                // SAFETY: NULL values are allowed.
                unsafe { p::PAPI_stop(read_set, std::ptr::null_mut()) };
            }
        }),
    }
}

fn debian_ops(d: Papi) -> Option<Ops> {
    let name = CString::new(TASK_CLOCK).unwrap();
    let (mut read_set, mut ss_set) = (-1, -1);
    // SAFETY: as for papirus: papi.h's arguments.
    unsafe {
        if (d.library_init)(0x0700_0000) != 0x0700_0000
            || (d.create_eventset)(&mut read_set) != 0
            || (d.add_named_event)(read_set, name.as_ptr()) != 0
            || (d.start)(read_set) != 0
            || (d.create_eventset)(&mut ss_set) != 0
            || (d.add_named_event)(ss_set, name.as_ptr()) != 0
        {
            return None;
        }
    }
    let Papi { read, stop, start, real_nsec, virt_nsec, .. } = d;
    Ops {
        name: "Debian PAPI 7.0",
        read: Box::new(move || {
            let mut v = [0i64; 1];
            // SAFETY: one value for a set of one event.
            unsafe { read(read_set, v.as_mut_ptr()) };
            v[0]
        }),
        // SAFETY: takes no argument.
        real: Box::new(move || unsafe { real_nsec() }),
        // SAFETY: takes no argument.
        virt: Box::new(move || unsafe { virt_nsec() }),
        start_stop: Box::new(move || {
            let mut v = [0i64; 1];
            // SAFETY: a set handle, and one value for a set of one event.
            unsafe {
                start(ss_set);
                stop(ss_set, v.as_mut_ptr());
            }
            v[0]
        }),
        read_running: Box::new(move |on| {
            // SAFETY: a set handle; NULL values are allowed.
            unsafe {
                if on {
                    start(read_set);
                } else {
                    stop(read_set, std::ptr::null_mut());
                }
            }
        }),
    }
    .into()
}

/// Median ns per call over batches of `n` calls.
fn median_ns(f: &dyn Fn() -> i64, n: u32) -> f64 {
    let v: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                black_box(f());
            }
            t.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .collect();
    papirus_substrate::stats::median(&v)
}

fn main() {
    let mut libs = vec![papirus_ops()];
    match load_debian().and_then(debian_ops) {
        Some(d) => libs.push(d),
        None => eprintln!("Debian's libpapi.so.7.0 is not loadable here: papirus' rows only"),
    }
    let mut c = Criterion::default().configure_from_args();
    for (what, pick) in [
        ("PAPI_read {perf::TASK-CLOCK}", 0usize),
        ("PAPI_get_real_nsec", 1),
        ("PAPI_get_virt_nsec", 2),
        ("PAPI_start + PAPI_stop", 3),
    ] {
        let mut g = c.benchmark_group(what);
        for l in &libs {
            let f = l.op(pick);
            (l.read_running)(pick != 3);
            g.bench_function(l.name, |b| b.iter(f));
            (l.read_running)(true);
        }
        g.finish();
    }
    c.final_summary();
    if libs.len() < 2 {
        return;
    }
    println!(
        "\n{:<30} {:>12} {:>14} {:>10}",
        "operation (median ns/call)", "papirus", "Debian PAPI", "ratio"
    );
    for (what, pick, n) in [
        ("PAPI_read {perf::TASK-CLOCK}", 0usize, 20_000),
        ("PAPI_get_real_nsec", 1, 200_000),
        ("PAPI_get_virt_nsec", 2, 200_000),
        ("PAPI_start + PAPI_stop", 3, 2_000),
    ] {
        let t: Vec<f64> = libs
            .iter()
            .map(|l| {
                let f = l.op(pick);
                (l.read_running)(pick != 3);
                let t = median_ns(f, n);
                (l.read_running)(true);
                t
            })
            .collect();
        println!("{what:<30} {:>12.1} {:>14.1} {:>9.1}x", t[0], t[1], t[1] / t[0]);
    }
}
