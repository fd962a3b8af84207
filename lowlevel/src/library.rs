//! Library initialisation, per-thread state and timers.
//!
//! [`init`] is explicit and idempotent: the first call collects what the
//! substrate finds about the CPU, its PMUs and counters, later calls return
//! the same [`Library`]; the rest of the machine's facts, the clock's set-up
//! among them, waits for the first [`Library::hwinfo`]. Event sets are
//! created from a `Library`, so nothing can run before initialisation.
//! Tests build their own `Library` over a mock kernel with
//! [`Library::with_machine`]; such libraries share nothing with the
//! process-wide one.
//!
//! Thread state is created lazily the first time a thread asks for its id,
//! kept in a process-wide registry behind a mutex, and removed when the
//! thread exits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use papirus_substrate::arch;
use papirus_substrate::hwinfo::{self, Counters, HwInfo, Hypervisor};
use papirus_substrate::sys::{self, Sys};
use papirus_substrate::{Target, clock, vclock};
use serde::Serialize;

use crate::error::Result;
use crate::eventset::EventSet;
use crate::preset::{Cpu, PresetTable, Vendor};

/// What the event-set layer needs to know about the machine.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// The CPU the preset definitions are chosen for.
    pub cpu: Cpu,
    /// Online CPUs (valid CPU numbers are `0..cpus`).
    pub cpus: usize,
    /// Hardware counters one thread may use at once; `None` when unknown.
    /// 0 without a core PMU.
    pub hw_counters: Option<usize>,
    /// Why hardware events are unavailable, when they are.
    pub no_hardware_reason: Option<String>,
}

impl Machine {
    /// This machine, from CPUID and sysfs: what [`HwInfo`] reports about the
    /// CPU and its counters, collected without the clock, so that choosing
    /// and checking events never waits for a TSC calibration.
    fn detect() -> Machine {
        let id = arch::identity();
        let counters = Counters::collect(&id);
        let vendor = match id.vendor.as_str() {
            "AuthenticAMD" => Vendor::Amd,
            "GenuineIntel" => Vendor::Intel,
            _ => Vendor::Other,
        };
        let hw_counters = if counters.core_pmu.is_none() {
            Some(0)
        } else if counters.general_purpose > 0 {
            Some((counters.general_purpose + counters.fixed) as usize)
        } else {
            None
        };
        let no_hardware_reason = counters.core_pmu.is_none().then(|| {
            let guest = Hypervisor::of(&id).map_or(String::new(), |h| format!(" ({} guest)", h.name));
            format!("no hardware PMU exposed to this machine{guest}")
        });
        Machine {
            cpu: Cpu { vendor, family: id.family, model: id.model },
            cpus: hwinfo::online_cpus().len().max(1),
            hw_counters,
            no_hardware_reason,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) sys: Arc<dyn Sys>,
    pub(crate) machine: Machine,
    /// Collected on first use: its clock may take a TSC calibration.
    hwinfo: Option<OnceLock<HwInfo>>,
    pub(crate) presets: PresetTable,
    next_set: AtomicU64,
    /// Hardware counters held by running sets, per counted target.
    running: Mutex<HashMap<Target, Vec<(u64, usize)>>>,
}

/// An initialised papirus low-level library: the kernel interface, the
/// machine's facts and the preset definitions. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Library(pub(crate) Arc<Inner>);

/// Initialises the library once per process and returns it; later calls
/// return the same library. Reading the machine's facts takes about a
/// millisecond; the clock is not set up here (see [`Library::hwinfo`]).
pub fn init() -> Result<Library> {
    static LIB: OnceLock<Library> = OnceLock::new();
    Ok(LIB
        .get_or_init(|| {
            let _ = INITIALIZED.set(());
            Library::build(
                sys::kernel(),
                Machine::detect(),
                Some(OnceLock::new()),
                PresetTable::builtin().clone(),
            )
        })
        .clone())
}

/// Whether [`init`] has run in this process.
pub fn is_initialized() -> bool {
    INITIALIZED.get().is_some()
}

static INITIALIZED: OnceLock<()> = OnceLock::new();

impl Library {
    fn build(
        sys: Arc<dyn Sys>,
        machine: Machine,
        hwinfo: Option<OnceLock<HwInfo>>,
        presets: PresetTable,
    ) -> Library {
        Library(Arc::new(Inner {
            sys,
            machine,
            hwinfo,
            presets,
            next_set: AtomicU64::new(1),
            running: Mutex::new(HashMap::new()),
        }))
    }

    /// A library over another kernel interface and machine description
    /// (a mock kernel in tests), with the built-in preset definitions.
    pub fn with_machine(sys: Arc<dyn Sys>, machine: Machine) -> Library {
        Library::build(sys, machine, None, PresetTable::builtin().clone())
    }

    /// A new, empty event set owned by the calling thread.
    pub fn event_set(&self) -> EventSet {
        let id = self.0.next_set.fetch_add(1, Ordering::Relaxed);
        EventSet::new(self.clone(), id)
    }

    /// The machine's facts the library works with.
    pub fn machine(&self) -> &Machine {
        &self.0.machine
    }

    /// Everything the substrate finds about the machine, collected on the
    /// first call (its clock may take a TSC calibration, up to ~50 ms);
    /// `None` for a library built with [`Library::with_machine`].
    pub fn hwinfo(&self) -> Option<&HwInfo> {
        self.0.hwinfo.as_ref().map(|h| h.get_or_init(HwInfo::collect))
    }

    /// The preset definitions in use.
    pub fn presets(&self) -> &PresetTable {
        &self.0.presets
    }

    pub(crate) fn sys(&self) -> Arc<dyn Sys> {
        self.0.sys.clone()
    }

    fn running(&self) -> MutexGuard<'_, HashMap<Target, Vec<(u64, usize)>>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (each update is one push or retain), so a poisoned lock is usable.
        self.0.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `hw` hardware counters on `target` for set `set`, failing
    /// with the number already in use when they do not fit.
    pub(crate) fn claim(&self, target: Target, set: u64, hw: usize) -> std::result::Result<(), usize> {
        let mut map = self.running();
        let list = map.entry(target).or_default();
        let used: usize = list.iter().map(|&(_, n)| n).sum();
        if let Some(limit) = self.0.machine.hw_counters
            && hw > 0
            && used + hw > limit
        {
            return Err(used);
        }
        list.push((set, hw));
        Ok(())
    }

    /// Releases what set `set` claimed on `target`.
    pub(crate) fn release(&self, target: Target, set: u64) {
        let mut map = self.running();
        if let Some(list) = map.get_mut(&target) {
            list.retain(|&(s, _)| s != set);
            if list.is_empty() {
                map.remove(&target);
            }
        }
    }
}

/// A kernel thread id (what `gettid(2)` returns).
pub type Tid = i32;

struct ThreadState {
    tid: Tid,
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        threads().remove(&self.tid);
    }
}

fn threads() -> MutexGuard<'static, HashMap<Tid, String>> {
    static THREADS: OnceLock<Mutex<HashMap<Tid, String>>> = OnceLock::new();
    THREADS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static THREAD: ThreadState = {
        let tid = read_tid();
        let name = std::thread::current().name().unwrap_or("").to_string();
        threads().insert(tid, name);
        ThreadState { tid }
    };
}

/// The calling thread's kernel id (read once per thread).
fn read_tid() -> Tid {
    papirus_substrate::signal::gettid() as Tid
}

/// The calling thread's kernel id, registering the thread on first use.
pub fn thread_id() -> Tid {
    THREAD.with(|t| t.tid)
}

/// The threads that have asked for their id and are still alive, with their
/// names (PAPI's `PAPI_list_threads`), sorted by id.
pub fn list_threads() -> Vec<(Tid, String)> {
    let mut v: Vec<_> = threads().iter().map(|(&t, n)| (t, n.clone())).collect();
    v.sort();
    v
}

/// Real time in TSC ticks (`PAPI_get_real_cyc`): rdtsc, no syscall.
pub fn real_cyc() -> u64 {
    clock::clock().raw()
}

/// Real time in nanoseconds, from the TSC with the kernel's conversion.
pub fn real_nsec() -> u64 {
    clock::clock().now()
}

/// Real time in microseconds.
pub fn real_usec() -> u64 {
    clock::clock().now_us()
}

/// The calling thread's CPU time in nanoseconds (`PAPI_get_virt_nsec`).
pub fn virt_nsec() -> u64 {
    vclock::thread_cpu_ns()
}

/// The calling thread's CPU time in microseconds.
pub fn virt_usec() -> u64 {
    virt_nsec() / 1000
}

/// The calling thread's CPU time in TSC ticks (`PAPI_get_virt_cyc`): CPU
/// nanoseconds times the measured TSC rate, 0 when the rate is unknown.
pub fn virt_cyc() -> u64 {
    let hz = clock::clock().tsc_hz().unwrap_or(0.0);
    (virt_nsec() as f64 * hz / 1e9) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_is_idempotent_and_reports_the_machine() {
        let a = init().unwrap();
        let b = init().unwrap();
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert!(is_initialized());
        let m = a.machine();
        assert!(m.cpus >= 1);
        // Detected without the clock, the machine agrees with the full collection.
        let hw = a.hwinfo().unwrap();
        assert_eq!((m.cpu.family, m.cpu.model, m.cpus), (hw.family, hw.model, hw.cpus));
        assert!(std::ptr::eq(hw, a.hwinfo().unwrap()), "collected once");
        if hw.counters.core_pmu.is_none() {
            assert_eq!(m.hw_counters, Some(0));
            assert!(m.no_hardware_reason.as_deref().unwrap().starts_with("no hardware PMU exposed"));
        }
    }

    #[test]
    fn thread_ids_are_distinct_and_registered_until_exit() {
        let me = thread_id();
        assert_eq!(me, thread_id());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("papirus-t".into())
            .spawn(move || {
                tx.send(thread_id()).unwrap();
                done_rx.recv().unwrap();
            })
            .unwrap();
        let other = rx.recv().unwrap();
        assert_ne!(other, me);
        assert!(list_threads().contains(&(other, "papirus-t".to_string())));
        done_tx.send(()).unwrap();
        h.join().unwrap();
        assert!(!list_threads().iter().any(|(t, _)| *t == other), "removed at thread exit");
    }

    #[test]
    fn timers_advance() {
        let (c0, n0) = (real_cyc(), real_nsec());
        let v0 = virt_nsec();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(real_cyc() > c0 && real_nsec() > n0 && virt_nsec() > v0);
    }
}
