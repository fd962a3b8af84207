//! Attach, inheritance, system-wide counting, breakpoint slots and
//! descriptor hygiene against the real kernel.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use papirus_lowlevel::{Code, Granularity, init};

use crate::util::{fd_count, min_faults, serial, work};

#[test]
fn a_set_attached_by_pid_counts_the_child() {
    let _g = serial();
    let pages = 3_000;
    let work = work();
    let mut child = Command::new(&work)
        .args([&pages.to_string(), "30", "0", "wait"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let lib = init().unwrap();
    let mut set = lib.event_set();
    set.add_all(["task-clock", "page-faults"]).unwrap();
    set.attach(child.id() as i32).unwrap();
    assert!(set.status().attached);
    set.start().unwrap();
    // Release the child only now, so all its work is counted.
    child.stdin.take().unwrap().write_all(b"g").unwrap();
    assert!(child.wait().unwrap().success());
    let v = set.stop().unwrap();
    eprintln!("attached child: task-clock {} ns, page-faults {} for {pages} pages", v[0], v[1]);
    assert!(v[1] >= pages as i64 && v[1] < pages as i64 * 2, "{v:?}");
    assert!(v[0] >= 25_000_000, "the child spun 30 ms of CPU: {v:?}");
    set.detach().unwrap();
    assert!(!set.status().attached);
}

#[test]
fn process_granularity_counts_a_forked_child_through_inheritance() {
    let _g = serial();
    let pages = 4_000;
    let work = work();
    let lib = init().unwrap();
    let mut inherit = lib.event_set();
    inherit.add_all(["page-faults", "task-clock"]).unwrap();
    inherit.set_granularity(Granularity::Process).unwrap();
    let mut own = lib.event_set();
    own.add_named("page-faults").unwrap();
    inherit.start().unwrap();
    own.start().unwrap();
    let st = Command::new(&work).args([&pages.to_string(), "10"]).status().unwrap();
    assert!(st.success());
    let mine = own.stop().unwrap();
    let all = inherit.stop().unwrap();
    eprintln!("process granularity: {} faults with the child, {} without", all[0], mine[0]);
    assert!(all[0] >= min_faults(pages) as i64, "{all:?}");
    assert!(mine[0] < pages as i64 / 2, "a thread-granularity set does not see the child: {mine:?}");
    assert!(all[1] >= 8_000_000, "the child's 10 ms of CPU is included: {all:?}");
}

#[test]
fn system_wide_on_one_cpu() {
    let _g = serial();
    let lib = init().unwrap();
    let mut set = lib.event_set();
    set.add_named("cpu-clock").unwrap();
    set.set_cpu(Some(0)).unwrap();
    if let Err(e) = set.set_granularity(Granularity::System) {
        eprintln!("system-wide counting refused here: {e}");
        assert_eq!(e.code(), Code::Eperm);
        return;
    }
    assert!(set.status().cpu_attached);
    set.start().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let v = set.stop().unwrap();
    eprintln!("cpu-clock of CPU 0 over 20 ms: {} ns", v[0]);
    assert!(v[0] > 15_000_000, "a CPU's clock runs whether busy or idle: {v:?}");
}

static WATCHED: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

fn bp(i: usize) -> String {
    format!("mem:{:#x}/8:w", &WATCHED[i] as *const AtomicU64 as usize)
}

#[test]
fn breakpoints_count_exactly_and_conflict_beyond_four_slots() {
    let _g = serial();
    let lib = init().unwrap();
    let mut a = lib.event_set();
    for i in 0..3 {
        a.add_named(&bp(i)).unwrap();
    }
    let mut b = lib.event_set();
    b.add_named(&bp(3)).unwrap();
    let e = b.add_named(&bp(4)).unwrap_err();
    eprintln!("fifth breakpoint: {e}");
    assert_eq!(e.code(), Code::Ecnflct);
    assert_eq!(b.len(), 1, "the failed add leaves the set as it was");
    a.start().unwrap();
    for n in 0..1000u64 {
        WATCHED[1].store(n, Ordering::Relaxed);
    }
    let v = a.stop().unwrap();
    assert_eq!(v, vec![0, 1000, 0], "a data breakpoint counts every write exactly");
    drop(a);
    b.add_named(&bp(4)).unwrap();
}

#[test]
fn a_thousand_sets_leave_no_descriptor_behind() {
    let _g = serial();
    let lib = init().unwrap();
    let before = fd_count();
    for i in 0..1000 {
        let mut s = lib.event_set();
        s.add_all(["task-clock", "page-faults", "context-switches"]).unwrap();
        assert_eq!(s.descriptors(), 3);
        if i % 2 == 0 {
            s.start().unwrap();
            s.destroy().unwrap();
        } else {
            s.start().unwrap();
            drop(s); // dropped while running
        }
    }
    assert_eq!(fd_count(), before);
}
