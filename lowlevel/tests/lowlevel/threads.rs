//! Threads: each counts its own work; shared state stays consistent.

use papirus_lowlevel::{init, native, thread_id, virt_nsec};

use crate::util::{minflt, serial, spin_ms, touch_pages};

/// One measurement on the calling thread: (task-clock, page-faults,
/// context-switches), CPU ns measured by CLOCK_THREAD_CPUTIME_ID, minor
/// faults by the kernel's rusage accounting.
fn measure(pages: usize, ms: u64) -> ([i64; 3], i64, i64) {
    let lib = init().unwrap();
    let mut set = lib.event_set();
    set.add_all(["task-clock", "page-faults", "context-switches"]).unwrap();
    assert_eq!(set.owner(), thread_id());
    let f0 = minflt();
    set.start().unwrap();
    let v0 = virt_nsec();
    touch_pages(pages);
    spin_ms(ms);
    let v1 = virt_nsec();
    let v = set.stop().unwrap();
    let f1 = minflt();
    ([v[0], v[1], v[2]], (v1 - v0) as i64, f1 - f0)
}

#[test]
fn four_threads_count_their_own_work() {
    let _g = serial();
    let handles: Vec<_> = (0..4usize)
        .map(|i| {
            std::thread::spawn(move || {
                let pages = 8_500 + 1_000 * i;
                let ms = 40 + 20 * i as u64;
                // The VM steals time in bursts: take the best of three runs.
                let mut best = None;
                for _ in 0..3 {
                    let (v, cpu, flt) = measure(pages, ms);
                    let err = (v[0] - cpu).abs() as f64 / cpu as f64;
                    if best.as_ref().is_none_or(|(_, _, _, e)| err < *e) {
                        best = Some((v, cpu, flt, err));
                    }
                    if err < 0.05 {
                        break;
                    }
                }
                let (v, cpu, flt, err) = best.unwrap();
                (i, pages, v, cpu, flt, err)
            })
        })
        .collect();
    for h in handles {
        let (i, pages, v, cpu, flt, err) = h.join().unwrap();
        eprintln!(
            "thread {i}: task-clock {} ns vs thread CPU {cpu} ns ({:.2}%), page-faults {} (rusage minflt {flt}) for {pages} pages, cs {}",
            v[0],
            err * 100.0,
            v[1],
            v[2]
        );
        assert!(err < 0.05, "thread {i}: task-clock {} vs CLOCK_THREAD_CPUTIME_ID {cpu}", v[0]);
        assert!(v[0] >= (40 + 20 * i as i64) * 1_000_000 * 95 / 100, "thread {i} spun at least its own time");
        // The kernel's own fault accounting of the thread over a slightly wider window.
        assert!(v[1] <= flt && flt - v[1] <= 20, "thread {i}: {} faults, rusage says {flt}", v[1]);
        let lo = pages as i64 * 9 / 10;
        assert!(
            v[1] >= lo && v[1] <= pages as i64 * 11 / 10 + 200,
            "thread {i}: {} faults for {pages} pages",
            v[1]
        );
        assert!(v[2] >= 0);
    }
}

#[test]
fn concurrent_code_lookups_agree() {
    let _g = serial();
    // Every thread asks for the same names at once: one code per name.
    let names: Vec<String> = (0..50).map(|i| format!("syscalls:sys_enter_{i}_not_an_event")).collect();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let names = names.clone();
            std::thread::spawn(move || names.iter().map(|n| native::code_of(n)).collect::<Vec<_>>())
        })
        .collect();
    let results: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
    for (n, c) in names.iter().zip(&results[0]) {
        assert_eq!(native::name_of(*c).as_deref(), Some(n.as_str()));
    }
    let mut uniq = results[0].clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), names.len());
}
