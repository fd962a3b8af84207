//! Hardware breakpoints: exact execution counts, and the fifth breakpoint
//! of a thread failing cleanly.

use std::hint::black_box;

use papirus_substrate::attr::consts::{PERF_TYPE_BREAKPOINT, PERF_TYPE_HARDWARE};
use papirus_substrate::{Counter, Error, EventAttr, Kind, Target};

use crate::util::{fd_count, serial};

/// `HW_BREAKPOINT_X`
const BP_X: u32 = 4;

fn exec_breakpoint(addr: usize) -> EventAttr {
    let mut attr = EventAttr::new(format!("mem:{addr:#x}:x"), Kind::Breakpoint, PERF_TYPE_BREAKPOINT, 0);
    // bp_addr, and bp_len = sizeof(long) as the kernel requires for execute breakpoints.
    attr.bp_type(BP_X).config1(addr as u64).config2(std::mem::size_of::<libc::c_long>() as u64);
    attr
}

#[inline(never)]
fn probed(x: u64) -> u64 {
    black_box(x).wrapping_mul(3)
}

#[inline(never)]
fn spare_a(x: u64) -> u64 {
    black_box(x) ^ 1
}
#[inline(never)]
fn spare_b(x: u64) -> u64 {
    black_box(x) ^ 2
}
#[inline(never)]
fn spare_c(x: u64) -> u64 {
    black_box(x) ^ 3
}
#[inline(never)]
fn spare_d(x: u64) -> u64 {
    black_box(x) ^ 4
}

const CALLS: u64 = 100_000;

/// Acceptance 5: an execute breakpoint on a non-inlined function called
/// 100,000 times counts exactly 100,000.
#[test]
fn breakpoint_counts_every_call() {
    let _s = serial();
    let f: fn(u64) -> u64 = probed;
    let counter = exec_breakpoint(f as usize).open(Target::ThisThread).expect("breakpoint opens");
    counter.enable().unwrap();
    let mut acc = 0u64;
    for i in 0..CALLS {
        acc = acc.wrapping_add(probed(black_box(i)));
    }
    counter.disable().unwrap();
    black_box(acc);
    let v = counter.read().unwrap().raw;
    println!("breakpoint on probed() at {:#x}: {v} hits for {CALLS} calls", f as usize);
    assert_eq!(v, CALLS);
}

/// Acceptance 9: a fifth breakpoint on one thread fails with
/// NoCounterSlot, and 1,000 failing opens leak no descriptor.
#[test]
fn fifth_breakpoint_has_no_slot_and_failures_leak_nothing() {
    let _s = serial();
    let spares: [fn(u64) -> u64; 4] = [spare_a, spare_b, spare_c, spare_d];
    let held: Vec<Counter> = spares
        .iter()
        .map(|f| exec_breakpoint(*f as usize).open(Target::ThisThread).expect("one of four breakpoints"))
        .collect();
    let fifth = exec_breakpoint(probed as fn(u64) -> u64 as usize);
    let err = fifth.open(Target::ThisThread).expect_err("a fifth breakpoint must not fit");
    println!("fifth breakpoint: {err}");
    assert!(matches!(err, Error::NoCounterSlot { .. }), "{err:?}");

    let cycles = EventAttr::new("cycles", Kind::Hardware, PERF_TYPE_HARDWARE, 0);
    let hardware_opens = cycles.open(Target::ThisThread).is_ok();
    let before = fd_count();
    for i in 0..1_000 {
        // Alternate two refusal paths: ENOSPC, and the missing PMU (unless
        // this machine has one, then a fifth breakpoint every time).
        let r = if i % 2 == 0 || hardware_opens {
            fifth.open(Target::ThisThread)
        } else {
            cycles.open(Target::ThisThread)
        };
        assert!(r.is_err(), "open {i} unexpectedly succeeded");
    }
    assert_eq!(fd_count(), before, "failing opens leaked descriptors");
    drop(held);
    // The slots are free again once the four are closed.
    assert!(fifth.open(Target::ThisThread).is_ok(), "closing breakpoints must free their slots");
}
