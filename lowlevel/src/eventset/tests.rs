use std::fmt;
use std::sync::Arc;

use papirus_substrate::attr::consts::{PERF_TYPE_BREAKPOINT, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE};
use papirus_substrate::{Domain, Scaling};

use super::*;
use crate::derived::Derivation;
use crate::error::Code;
use crate::library::Library;
use crate::library::Machine;
use crate::preset::{Cpu, Vendor};
use crate::profil::{ProfilFlags, Region};
use papirus_substrate::sys::mock::MockSys;

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<EventSet>();
    send_sync::<Library>();
};

/// An Intel Skylake with `counters` hardware counters.
fn machine(counters: usize) -> Machine {
    Machine {
        cpu: Cpu { vendor: Vendor::Intel, family: 6, model: 0x5e },
        cpus: 2,
        hw_counters: Some(counters),
        no_hardware_reason: None,
    }
}

fn lib(counters: usize) -> (Library, Arc<MockSys>) {
    let k = MockSys::with_counters(counters);
    (Library::with_machine(k.clone(), machine(counters)), k)
}

fn code(r: Result<impl fmt::Debug>) -> Code {
    r.expect_err("expected an error").code()
}

#[test]
fn every_rule_is_its_papi_error() {
    let (lib, _k) = lib(4);
    let mut s = lib.event_set();
    assert_eq!(code(s.start()), Code::Einval, "empty set started");
    assert!(matches!(s.start(), Err(Error::EmptySet)));
    assert_eq!(code(s.stop()), Code::Enotrun, "stop a stopped set");
    assert_eq!(code(s.accum(&mut [])), Code::Enotrun, "accum a stopped set");
    assert_eq!(code(s.add_named("no-such-event")), Code::Enoevnt);
    assert_eq!(code(s.add_code(0x8000_00f0)), Code::Enoevnt, "nonexistent preset code");
    assert_eq!(code(s.add_code(0x4000_0000 | 0x3fff_fff0)), Code::Enoevnt, "native code never handed out");
    assert_eq!(code(s.add_code(0x1234)), Code::Enoevnt, "not a preset or native code");
    s.add_named("task-clock").unwrap();
    assert_eq!(code(s.add_named("task-clock")), Code::Einval, "duplicate");
    assert_eq!(code(s.remove_named("page-faults")), Code::Einval, "remove an absent event");
    assert_eq!(code(s.read_into(&mut [0, 0])), Code::Ebuf);
    assert_eq!(code(s.set_cpu(Some(2))), Code::Einval, "CPU out of range (2 CPUs)");
    assert_eq!(code(s.attach(0)), Code::Einval);
    assert_eq!(code(s.attach(i32::MAX)), Code::Esys, "no such process");
    assert_eq!(code(s.set_granularity(Granularity::System)), Code::Ecombo, "system-wide needs a CPU");
    assert_eq!(s.options().granularity, Granularity::Thread, "a refused option is not kept");

    s.start().unwrap();
    assert_eq!(code(s.start()), Code::Eisrun, "start a running set");
    assert_eq!(code(s.add_named("page-faults")), Code::Eisrun, "add while running");
    assert_eq!(code(s.remove_named("task-clock")), Code::Eisrun);
    assert_eq!(code(s.set_multiplex(true)), Code::Eisrun);
    assert_eq!(code(s.cleanup()), Code::Eisrun);
    assert_eq!(code(s.write(&[1])), Code::Enosupp);
    assert!(s.status().running && s.status().bits() == 0x2);
    s.stop().unwrap();
    assert_eq!(s.status().bits(), 0x1);
    s.remove_named("task-clock").unwrap();
    assert!(s.is_empty());
    assert_eq!(code(s.start()), Code::Einval);
}

#[test]
fn values_are_deltas_since_start_reset_and_accum() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    s.add_all(["task-clock", "page-faults"]).unwrap();
    // A fresh set starts from zero without reading.
    s.start().unwrap();
    k.set_value(PERF_TYPE_SOFTWARE, 1, 100);
    k.set_value(PERF_TYPE_SOFTWARE, 2, 7);
    assert_eq!(s.stop().unwrap(), vec![100, 7]);
    // A restart rebases on the values read at stop, again without reading.
    let reads = k.read_calls();
    s.start().unwrap();
    assert_eq!(k.read_calls(), reads, "start after stop issues no read");
    k.set_value(PERF_TYPE_SOFTWARE, 1, 150);
    k.set_value(PERF_TYPE_SOFTWARE, 2, 9);
    assert_eq!(s.read().unwrap(), vec![50, 2]);
    let mut acc = vec![10, 10];
    s.accum(&mut acc).unwrap();
    assert_eq!(acc, vec![60, 12]);
    k.set_value(PERF_TYPE_SOFTWARE, 1, 170);
    assert_eq!(s.read().unwrap(), vec![20, 0], "accum reset the counters");
    s.reset().unwrap();
    k.set_value(PERF_TYPE_SOFTWARE, 1, 200);
    assert_eq!(s.stop().unwrap(), vec![30, 0]);
    assert_eq!(s.read().unwrap(), vec![30, 0], "a stopped set reads its final values");
    // Two pinned groups: task-clock, read from user space, apart from
    // page-faults, read by read(2).
    let ev = k.open_events();
    assert_eq!(ev.len(), 2);
    assert!(ev.iter().all(|e| e.group.is_none() && e.pinned));
    assert_eq!((ev[0].config, ev[1].config), (1, 2));
}

fn hw(k: &MockSys, umask_event: u64, v: u64) {
    k.set_value(PERF_TYPE_RAW, umask_event, v);
}

#[test]
fn derived_presets_are_computed_from_one_group() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    // Skylake PAPI_BR_TKN = BR_INST_RETIRED.CONDITIONAL - NOT_TAKEN; PAPI_FP_OPS is a postfix.
    s.add_named("PAPI_BR_TKN").unwrap();
    let info = &s.events()[0];
    assert!(info.preset && info.derivation == Derivation::Sub);
    assert_eq!(info.terms, vec!["cpu/event=0xc4,umask=0x01/", "cpu/event=0xc4,umask=0x10/"]);
    s.start().unwrap();
    hw(&k, 0x01c4, 1000);
    hw(&k, 0x10c4, 300);
    assert_eq!(s.read().unwrap(), vec![700]);
    s.stop().unwrap();
    s.cleanup().unwrap();
    s.add_named("PAPI_FP_OPS").unwrap();
    s.start().unwrap();
    hw(&k, 0x03c7, 5);
    hw(&k, 0x04c7, 7);
    hw(&k, 0x18c7, 11);
    hw(&k, 0x20c7, 13);
    assert_eq!(s.stop().unwrap(), vec![5 + 7 * 2 + 11 * 4 + 13 * 8]);
    assert_eq!(s.groups(), 1);
    assert_eq!(s.descriptors(), 4);
}

#[test]
fn multiplexed_values_are_scaled_and_derived_terms_share_a_group() {
    let (lib, k) = lib(2);
    let mut s = lib.event_set();
    s.set_multiplex(true).unwrap();
    s.add_all(["PAPI_BR_TKN", "PAPI_TOT_CYC", "PAPI_TOT_INS"]).unwrap();
    assert_eq!(s.groups(), 3, "one group per event");
    assert!(s.status().multiplexing && s.status().bits() & 0x40 != 0);
    assert!(k.open_events().iter().all(|e| !e.pinned), "multiplexed groups are not pinned");
    s.start().unwrap();
    hw(&k, 0x01c4, 1000);
    hw(&k, 0x10c4, 300);
    hw(&k, 0x3c, 2_000);
    hw(&k, 0xc0, 900);
    // The kernel ran the branch group half, cycles a quarter, instructions never.
    k.set_times_nth_group(0, 2_000, 1_000);
    k.set_times_nth_group(1, 2_000, 500);
    k.set_times_nth_group(2, 2_000, 0);
    let d = s.read_detailed().unwrap();
    assert_eq!(d[0].raw, 700);
    assert_eq!(d[0].value, 1400, "the difference is scaled once, never negative");
    assert_eq!(d[0].scaling(), Scaling::Scaled { factor: 2.0 });
    assert_eq!((d[1].value, d[1].raw), (8_000, 2_000));
    assert_eq!((d[1].time_enabled, d[1].time_running), (2_000, 500));
    assert_eq!(d[2].value, 0);
    assert_eq!(d[2].scaling(), Scaling::NeverRan);
    s.stop().unwrap();
}

#[test]
fn a_set_that_does_not_fit_the_counters_fails_to_add() {
    let (lib, _k) = lib(4);
    let mut s = lib.event_set();
    for c in ["r01c4", "r02c4", "r04c4", "r08c4"] {
        s.add_named(c).unwrap();
    }
    let e = s.add_named("r10c4").unwrap_err();
    assert_eq!(e.code(), Code::Ecnflct);
    assert!(e.to_string().contains("multiplexing"), "{e}");
    assert_eq!(s.len(), 4, "the failed add leaves the set as it was");
    assert_eq!(s.descriptors(), 4);
    // Software events do not use hardware counters.
    s.add_named("task-clock").unwrap();
    s.set_multiplex(true).unwrap();
    s.add_named("r10c4").unwrap();
    assert_eq!(s.groups(), 6);
}

#[test]
fn a_group_the_kernel_cannot_schedule_fails_to_add() {
    // The machine claims 4 counters, the PMU has 2 free: PAPI's add-time check catches it.
    let k = MockSys::with_counters(2);
    let lib = Library::with_machine(k.clone(), machine(4));
    let mut s = lib.event_set();
    s.add_all(["r01c4", "r02c4"]).unwrap();
    let e = s.add_named("r04c4").unwrap_err();
    assert_eq!(e.code(), Code::Ecnflct, "{e}");
    assert!(e.to_string().contains("could not put"), "{e}");
    assert_eq!(s.len(), 2);
}

#[test]
fn running_sets_conflict_only_over_hardware_counters() {
    let (lib, _k) = lib(3);
    let mut a = lib.event_set();
    a.add_all(["r01c4", "r02c4"]).unwrap();
    let mut b = lib.event_set();
    b.add_all(["r04c4", "r08c4"]).unwrap();
    a.start().unwrap();
    let e = b.start().unwrap_err();
    assert_eq!(e.code(), Code::Ecnflct, "{e}");
    assert!(e.to_string().contains("hold 2 of the 3"), "{e}");
    a.stop().unwrap();
    b.start().unwrap();
    // Two software sets run at once on one thread.
    let mut c = lib.event_set();
    c.add_named("task-clock").unwrap();
    let mut d = lib.event_set();
    d.add_named("task-clock").unwrap();
    c.start().unwrap();
    d.start().unwrap();
    drop(b); // releases its counters while running
    a.start().unwrap();
}

#[test]
fn options_reach_the_kernel() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    s.add_all(["task-clock", "page-faults"]).unwrap();
    s.set_granularity(Granularity::Process).unwrap();
    assert!(k.open_events().iter().all(|e| e.inherit && e.pid == 0 && e.cpu == -1));
    s.set_cpu(Some(1)).unwrap();
    assert!(k.open_events().iter().all(|e| e.cpu == 1));
    let me = std::process::id() as i32;
    s.attach(me).unwrap();
    assert!(s.status().attached && s.status().bits() & 0x80 != 0);
    assert!(k.open_events().iter().all(|e| e.pid == me && e.cpu == 1));
    assert_eq!(code(s.set_granularity(Granularity::System)), Code::Ecombo);
    s.detach().unwrap();
    s.set_granularity(Granularity::System).unwrap();
    assert!(s.status().cpu_attached && s.status().bits() & 0x100 != 0);
    assert!(k.open_events().iter().all(|e| e.pid == -1 && e.cpu == 1));
    s.set_domain(Some(Domain::ALL)).unwrap();
    assert_eq!(s.options().domain, Some(Domain::ALL));
}

#[test]
fn kernel_refusals_keep_the_set_usable() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    s.add_named("task-clock").unwrap();
    k.fail_open_config(2, libc::EACCES);
    let e = s.add_named("page-faults").unwrap_err();
    assert_eq!(e.code(), Code::Eperm, "{e}");
    k.fail_open_config(0x4242, libc::ENOSPC);
    assert_eq!(s.add_named("r4242").unwrap_err().code(), Code::Ecnflct);
    assert_eq!(s.len(), 1);
    s.start().unwrap();
    assert_eq!(s.stop().unwrap().len(), 1);
}

#[test]
fn a_refused_default_kernel_domain_falls_back_to_user_space() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    // context-switches defaults to every domain; refuse it as paranoid 2 does.
    k.fail_open_config(3, libc::EACCES);
    let e = s.add_named("context-switches:uk").unwrap_err();
    assert_eq!(e.code(), Code::Eperm, "an explicit domain is not changed: {e}");
    k.fail_open_config(3, 0);
    k.refuse_kernel_domain(true);
    s.add_named("context-switches").unwrap();
    assert!(s.events()[0].note.as_deref().unwrap().starts_with("user space only"));
    assert!(k.open_events().iter().all(|e| e.exclude_kernel));
}

#[test]
fn overflow_rules_checked_before_any_descriptor_changes() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    let h: crate::overflow::OverflowHandler = Arc::new(|_| {});
    let br = s.add_named("PAPI_BR_TKN").unwrap();
    s.add_named("page-faults").unwrap();
    let e = s.overflow(br, 1000, 0, h.clone()).unwrap_err();
    assert_eq!(e.code(), Code::Einval, "{e}");
    assert!(e.to_string().contains("derived from 2 native events"), "{e}");
    let e = s.overflow(0x8000_0000u32, 1000, 0, h.clone()).unwrap_err();
    assert_eq!(e.code(), Code::Enoevnt, "PAPI_L1_DCM is not in the set: {e}");
    assert!(e.to_string().contains("PAPI_BR_TKN, page-faults"), "{e}");
    assert_eq!(code(s.overflow("task-clock", 1000, 0, h.clone())), Code::Enoevnt);
    assert_eq!(code(s.overflow(2usize, 1000, 0, h.clone())), Code::Enoevnt);
    assert_eq!(s.index_of("PAGE-FAULTS").unwrap(), 1, "names match as added, any case");
    let before = (k.live_fds(), k.open_events().len());
    // The mock kernel maps no rings: the failed change keeps the old layout.
    let e = s.overflow("page-faults", 100, 0, h.clone()).unwrap_err();
    assert_eq!(e.code(), Code::Esys, "{e}");
    assert_eq!((k.live_fds(), k.open_events().len()), before);
    assert_eq!(s.status().bits(), 0x1);
    assert_eq!(s.overflow_threshold("page-faults").unwrap(), 0);
    assert!(s.overflow_stats("page-faults").is_none());
    s.start().unwrap();
    assert_eq!(code(s.overflow("page-faults", 100, 0, h.clone())), Code::Eisrun);
    assert_eq!(
        code(s.profil(1usize, Region::covering(0..64, 4).unwrap(), 100, ProfilFlags::POSIX)),
        Code::Eisrun
    );
    s.stop().unwrap();
    let r = Region::covering(0..64, 4).unwrap();
    assert_eq!(code(s.profil(1usize, r, 100, ProfilFlags::FORCE_SW)), Code::Enosupp);
    assert_eq!(code(s.sprofil(1usize, vec![], 100, ProfilFlags::POSIX)), Code::Einval, "no region");
    assert!(s.profil(1usize, r, 0, ProfilFlags::POSIX).unwrap().is_none(), "threshold 0: off");
}

#[test]
fn breakpoints_get_a_group_of_their_own() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    s.add_all(["page-faults", "mem:0x1000:x", "task-clock", "mem:0x2000:w"]).unwrap();
    assert_eq!((s.groups(), s.descriptors()), (3, 4));
    let ev = k.open_events();
    let (b1, b2) = (&ev[0], &ev[1]);
    assert!(b1.type_ == PERF_TYPE_BREAKPOINT && b1.group.is_none() && b1.pinned);
    assert!(b2.type_ == PERF_TYPE_BREAKPOINT && b2.group == Some(b1.id));
    // Then the clock's group and the software counter's.
    assert!(ev[2].type_ == PERF_TYPE_SOFTWARE && ev[2].config == 1 && ev[2].group.is_none());
    assert!(ev[3].type_ == PERF_TYPE_SOFTWARE && ev[3].config == 2 && ev[3].group.is_none());
    s.start().unwrap();
    k.set_value(PERF_TYPE_SOFTWARE, 2, 5);
    k.set_value(PERF_TYPE_BREAKPOINT, 0, 9);
    assert_eq!(s.stop().unwrap(), vec![5, 9, 0, 9], "values come back in the order added");
    s.set_multiplex(true).unwrap();
    assert_eq!(s.groups(), 4, "multiplexing keeps one group per event");
}

#[test]
fn status_bits_follow_papi() {
    let all = Status {
        running: true,
        attached: true,
        cpu_attached: true,
        multiplexing: true,
        overflowing: true,
        profiling: true,
    };
    assert_eq!(all.bits(), 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100);
    let stopped = Status { running: false, overflowing: true, ..all };
    assert_eq!(stopped.bits() & 0x3, 0x1);
}

#[test]
fn dropping_a_running_set_disables_and_closes_everything() {
    let (lib, k) = lib(4);
    let mut s = lib.event_set();
    s.add_all(["task-clock", "page-faults", "PAPI_BR_TKN"]).unwrap();
    assert_eq!(k.live_fds(), 4);
    s.start().unwrap();
    let before = k.ioctls().len();
    drop(s);
    // One disable per group: PAPI_BR_TKN's counters, task-clock, page-faults.
    assert_eq!(k.ioctls()[before..], [papirus_substrate::sys::Ioctl::Disable { group: false }; 3]);
    assert_eq!(k.live_fds(), 0);
    let mut s = lib.event_set();
    s.add_named("task-clock").unwrap();
    s.destroy().unwrap();
    assert_eq!(k.live_fds(), 0);
}
