//! Event sets, regions and the probe runtime's reader count through the one
//! counting core: fed the same sequence of kernel states (counter values,
//! enabled and running times, mmap pages whose lock moves at each context
//! switch), they report the same count for every interval — scaled when the
//! interval was multiplexed, 0 when an event never ran in it.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use papirus_highlevel::region::ThreadCounters;
use papirus_lowlevel::derived::Derivation;
use papirus_lowlevel::library::Machine;
use papirus_lowlevel::preset::{Cpu, Vendor};
use papirus_lowlevel::{EventSet, Library};
use papirus_probe_runtime::CounterSetup;
use papirus_probe_runtime::counters::{GroupRead, Reader};
use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::mmap::PageImage;
use papirus_substrate::read::ReadMethod;
use papirus_substrate::sys::Sys;
use papirus_substrate::sys::mock::MockSys;
use papirus_substrate::{EventAttr, clock, parse_event};

/// The runtime's group reads, through the model kernel instead of a `syscall`.
struct Model(Arc<MockSys>);

impl GroupRead for Model {
    fn read(&self, fd: i32, words: &mut [u64]) -> i64 {
        // SAFETY: `fd` is a descriptor the reader opened through this same
        // kernel and keeps open while it reads.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        self.0.read_words(fd, words).map_or(-1, |n| n as i64)
    }
}

const TASK_CLOCK: u64 = 1;
const PAGE_FAULTS: u64 = 2;

/// One state of the kernel: task-clock ns, page faults, and every group's
/// enabled and running ns.
struct State {
    task_clock: u64,
    faults: u64,
    enabled: u64,
    running: u64,
}

#[test]
fn event_sets_regions_and_the_probe_runtime_count_alike() {
    let Some(rate) = clock::clock().tsc_rate() else {
        papirus_testkit::skip(
            "real time is not read from the TSC here, so task-clock is read by read(2) alone",
        );
        return;
    };
    let k = MockSys::new();
    // Every event gets a page of its own; the test plays the kernel on them.
    k.map_pages(|| {
        let p = PageImage::new();
        p.bump_lock(2);
        p
    });
    let names = ["task-clock", "page-faults"];
    let attrs: Vec<EventAttr> = names.iter().map(|n| parse_event(n).unwrap()).collect();

    let machine = Machine {
        cpu: Cpu { vendor: Vendor::Intel, family: 6, model: 0x5e },
        cpus: 2,
        hw_counters: Some(4),
        no_hardware_reason: None,
    };
    let lib = Library::with_machine(k.clone(), machine);
    let mut set: EventSet = lib.event_set();
    set.add_all(names).unwrap();
    let plans: Vec<(Vec<EventAttr>, Derivation)> =
        attrs.iter().map(|a| (vec![a.clone()], Derivation::NotDerived)).collect();
    let mut regions = ThreadCounters::open_with(k.clone(), Some(rate), &plans).unwrap();
    let setup = CounterSetup { events: attrs, tsc: Some(rate) };
    let mut runtime = Reader::open_with(k.clone(), Model(k.clone()), &setup).unwrap();

    // task-clock takes its user-space method in each of them.
    assert!(matches!(set.read_methods()[0][..], [ReadMethod::ReadPlusTsc]), "{:?}", set.read_methods());

    set.start().unwrap();
    let mut then = regions.reading();
    regions.read(&mut then, true).unwrap();
    let totals: [AtomicU64; 4] = Default::default();

    let states = [
        // Both ran the whole interval.
        State { task_clock: 4_000_000, faults: 40, enabled: 4_000_000, running: 4_000_000 },
        // Multiplexed: counted half of the interval's 4 ms, so doubled.
        State { task_clock: 6_000_000, faults: 45, enabled: 8_000_000, running: 6_000_000 },
        // Never ran in the interval: nothing can be estimated.
        State { task_clock: 6_000_000, faults: 45, enabled: 9_000_000, running: 6_000_000 },
        // Ran again, exactly.
        State { task_clock: 7_000_000, faults: 50, enabled: 10_000_000, running: 7_000_000 },
    ];
    let expected = [[4_000_000, 40], [4_000_000, 10], [0, 0], [1_000_000, 5]];
    for (state, want) in states.iter().zip(expected) {
        k.set_value(PERF_TYPE_SOFTWARE, TASK_CLOCK, state.task_clock);
        k.set_value(PERF_TYPE_SOFTWARE, PAGE_FAULTS, state.faults);
        k.set_times(state.enabled, state.running);
        // A context switch: every page's lock moves, so task-clock's base
        // is read again rather than extrapolated with the TSC.
        for n in 0..k.opened().len() {
            k.page(n).bump_lock(2);
        }

        let mut by_set = [0i64; 2];
        set.accum(&mut by_set).unwrap();

        let mut now = regions.reading();
        regions.read(&mut now, false).unwrap();
        let mut by_regions = [0i64; 4];
        regions.deltas(&then, &now, &mut by_regions);
        then = now;

        let before: Vec<u64> = totals.iter().map(|t| t.load(Ordering::Relaxed)).collect();
        runtime.read(papirus_substrate::arch::rdtsc(), &totals);
        let by_runtime: Vec<i64> =
            totals.iter().zip(&before).take(2).map(|(t, b)| (t.load(Ordering::Relaxed) - b) as i64).collect();

        assert_eq!(by_set, want, "event set");
        assert_eq!(by_regions[2..], want, "regions");
        assert_eq!(by_runtime, want, "probe runtime");
    }
    set.stop().unwrap();
}
