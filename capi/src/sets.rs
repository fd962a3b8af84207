//! Event sets behind PAPI's integer handles: the handle table and PAPI's
//! rules on top of [`papirus_lowlevel::EventSet`] (component binding,
//! destroy only when empty, accum and reads on stopped sets, profil
//! buffers in the caller's memory).
//!
//! Handles are small integers from 0, reused lowest first, as PAPI's. Each
//! handle has its own lock, so a thread reading its set never waits for
//! another thread's set.

use std::collections::BTreeSet;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use papirus_lowlevel::overflow::OverflowInfo;
use papirus_lowlevel::profil::{ProfilFlags, Profile, Region};
use papirus_lowlevel::{EventSet, Granularity};
use papirus_substrate::Domain;

use crate::raw::{Array, OverflowFn, ProfilBuffer, call_overflow};
use crate::{Code, events, state};

/// Event sets a process may hold at once.
pub const MAX_SETS: usize = 1 << 14;

/// One PAPI event set.
#[derive(Debug)]
pub struct Slot {
    /// The low-level set.
    pub set: EventSet,
    /// The component it is bound to (by its first add or by assignment).
    pub component: Option<usize>,
    profiles: Vec<ProfilSink>,
}

/// A profil histogram and the caller's buffers it is copied into.
#[derive(Debug)]
struct ProfilSink {
    code: u32,
    profile: Arc<Profile>,
    buffers: Vec<ProfilBuffer>,
    /// Bucket values already added to the buffers.
    copied: Vec<Vec<u64>>,
}

impl ProfilSink {
    /// Adds what the histogram gained since the last copy to the buffers.
    fn flush(&mut self) {
        for (i, buf) in self.buffers.iter().enumerate() {
            let Some(now) = self.profile.buckets(i) else { continue };
            let seen = &mut self.copied[i];
            for (k, (&n, s)) in now.iter().zip(seen.iter_mut()).enumerate() {
                buf.add(k, n.saturating_sub(*s));
                *s = n;
            }
        }
    }
}

type Cell = Mutex<Option<Slot>>;

static SLOTS: [OnceLock<Box<Cell>>; MAX_SETS] = [const { OnceLock::new() }; MAX_SETS];

/// Free handles below `next`, and the next never used.
struct Alloc {
    free: BTreeSet<usize>,
    next: usize,
}

fn alloc() -> MutexGuard<'static, Alloc> {
    static ALLOC: Mutex<Alloc> = Mutex::new(Alloc { free: BTreeSet::new(), next: 0 });
    ALLOC.lock().unwrap_or_else(|p| p.into_inner())
}

fn cell(es: c_int) -> Option<&'static Cell> {
    SLOTS.get(usize::try_from(es).ok()?)?.get().map(|b| &**b)
}

fn lock(c: &'static Cell) -> MutexGuard<'static, Option<Slot>> {
    // A panic inside a set's operation leaves the set as the low-level
    // layer left it (each change is applied whole or undone): usable.
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on set `es`; ENOEVST when there is none.
pub fn with<T>(es: c_int, f: impl FnOnce(&mut Slot) -> Result<T, Code>) -> Result<T, Code> {
    let c = cell(es).ok_or(Code::Enoevst)?;
    let mut g = lock(c);
    f(g.as_mut().ok_or(Code::Enoevst)?)
}

fn ll(e: papirus_lowlevel::Error) -> Code {
    e.code()
}

/// `PAPI_create_eventset`: the new handle.
pub fn create() -> Result<c_int, Code> {
    let lib = state::lib()?;
    state::register_current();
    let (domain, granularity) = state::defaults();
    let mut set = lib.event_set();
    if domain != 1 {
        set.set_domain(Some(to_domain(domain)?)).map_err(ll)?;
    }
    if granularity == 2 {
        set.set_granularity(Granularity::Process).map_err(ll)?;
    }
    let slot = Slot { set, component: None, profiles: vec![] };
    let mut a = alloc();
    let h = match a.free.pop_first() {
        Some(h) => h,
        None if a.next < MAX_SETS => {
            a.next += 1;
            a.next - 1
        }
        None => return Err(Code::Enomem),
    };
    let c = SLOTS[h].get_or_init(|| Box::new(Mutex::new(None)));
    *lock(c) = Some(slot);
    Ok(h as c_int)
}

/// `PAPI_destroy_eventset`: the set must be stopped and empty.
pub fn destroy(es: c_int) -> Result<(), Code> {
    let c = cell(es).ok_or(Code::Enoevst)?;
    let mut g = lock(c);
    let slot = g.as_ref().ok_or(Code::Enoevst)?;
    if slot.set.status().running {
        return Err(Code::Eisrun);
    }
    if !slot.set.is_empty() {
        return Err(Code::Einval);
    }
    *g = None;
    drop(g);
    alloc().free.insert(es as usize);
    Ok(())
}

fn release(h: usize, forget: bool) {
    let Some(c) = SLOTS[h].get() else { return };
    if let Some(slot) = lock(c).take() {
        if forget {
            std::mem::forget(slot);
        }
        alloc().free.insert(h);
    }
}

fn used() -> usize {
    alloc().next
}

/// Frees every set (`PAPI_shutdown`): stopped and closed.
pub fn destroy_all() {
    (0..used()).for_each(|h| release(h, false));
}

/// Frees the sets the exiting thread created (`PAPI_unregister_thread`).
pub fn destroy_owned_by(tid: papirus_lowlevel::Tid) {
    for (h, c) in SLOTS.iter().enumerate().take(used()) {
        let Some(c) = c.get() else { continue };
        if lock(c).as_ref().is_some_and(|s| s.set.owner() == tid) {
            release(h, false);
        }
    }
}

/// In a forked child: drops the parent's sets without touching their
/// descriptors, which the parent still counts with.
pub fn forget_all() {
    (0..used()).for_each(|h| release(h, true));
}

/// `PAPI_cleanup_eventset`.
pub fn cleanup(es: c_int) -> Result<c_int, Code> {
    with(es, |s| {
        if s.set.status().running {
            return Err(Code::Eisrun);
        }
        for p in &mut s.profiles {
            p.flush();
        }
        s.profiles.clear();
        s.set.cleanup().map_err(ll)?;
        Ok(0)
    })
}

/// Binds the set to `cidx`, or checks it is bound to it.
fn bind(s: &mut Slot, cidx: usize) -> Result<(), Code> {
    if events::disabled(cidx) {
        return Err(Code::EcmpDisabled);
    }
    match s.component {
        None => {
            s.component = Some(cidx);
            Ok(())
        }
        Some(c) if c == cidx => Ok(()),
        Some(_) => Err(Code::Einval),
    }
}

fn add_code(s: &mut Slot, code: u32) -> Result<(), Code> {
    if s.set.status().running {
        return Err(Code::Eisrun);
    }
    if code & 0xC000_0000 == 0 {
        return Err(Code::Einval);
    }
    let cidx = events::event_component(code)?;
    let before = s.component;
    bind(s, cidx)?;
    if s.set.codes().contains(&code) {
        return Err(Code::Ecnflct);
    }
    if code & 0xC000_0000 == papirus_lowlevel::preset::PRESET_MASK {
        // Known unavailable here (the first query opened it): no new attempt.
        let p = events::preset(code).ok_or(Code::Enoevnt)?;
        if !events::preset_status(p)?.available {
            return Err(Code::Enoevnt);
        }
    }
    s.set.add_code(code).map(drop).map_err(|e| {
        if s.set.is_empty() {
            s.component = before;
        }
        ll(e)
    })
}

/// `PAPI_add_event`.
pub fn add(es: c_int, code: u32) -> Result<c_int, Code> {
    with(es, |s| add_code(s, code).map(|()| 0))
}

/// `PAPI_add_named_event`.
pub fn add_named(es: c_int, name: &str) -> Result<c_int, Code> {
    state::lib()?;
    let code = events::name_to_code(name)?;
    add(es, code)
}

/// `PAPI_add_events`: stops at the first failure; its error if it was the
/// first event, else the number added.
pub fn add_many(es: c_int, codes: &[c_int]) -> Result<c_int, Code> {
    each(es, codes, add_code)
}

/// `op` on each code in turn, as `PAPI_add_events` and `PAPI_remove_events` go.
fn each(es: c_int, codes: &[c_int], op: fn(&mut Slot, u32) -> Result<(), Code>) -> Result<c_int, Code> {
    with(es, |s| {
        for (i, &c) in codes.iter().enumerate() {
            if let Err(e) = op(s, c as u32) {
                return if i == 0 { Err(e) } else { Ok(i as c_int) };
            }
        }
        Ok(0)
    })
}

fn remove_code(s: &mut Slot, code: u32) -> Result<(), Code> {
    if s.set.status().running {
        return Err(Code::Eisrun);
    }
    if !s.set.codes().contains(&code) {
        return Err(Code::Einval);
    }
    if let Some(i) = s.profiles.iter().position(|p| p.code == code) {
        s.profiles[i].flush();
        s.profiles.remove(i);
    }
    s.set.remove_code(code).map_err(ll)
}

/// `PAPI_remove_event`.
pub fn remove(es: c_int, code: u32) -> Result<c_int, Code> {
    with(es, |s| remove_code(s, code).map(|()| 0))
}

/// `PAPI_remove_named_event`.
pub fn remove_named(es: c_int, name: &str) -> Result<c_int, Code> {
    let code = events::name_to_code(name)?;
    remove(es, code)
}

/// `PAPI_remove_events`: as `add_many`.
pub fn remove_many(es: c_int, codes: &[c_int]) -> Result<c_int, Code> {
    each(es, codes, remove_code)
}

/// `PAPI_num_events`.
pub fn num_events(es: c_int) -> Result<c_int, Code> {
    with(es, |s| Ok(s.set.len() as c_int))
}

/// The set's codes.
pub fn codes(es: c_int) -> Result<Vec<u32>, Code> {
    with(es, |s| Ok(s.set.codes()))
}

/// `PAPI_state`.
pub fn status(es: c_int) -> Result<c_int, Code> {
    with(es, |s| Ok(s.set.status().bits() as c_int))
}

/// `PAPI_start`.
pub fn start(es: c_int) -> Result<c_int, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        if s.set.status().running {
            return Err(Code::Eisrun);
        }
        if s.set.is_empty() {
            return Err(Code::Einval);
        }
        s.set.start().map(|()| 0).map_err(ll)
    })
}

/// `PAPI_stop`; `values` may be NULL.
pub fn stop(es: c_int, mut values: Array<i64>) -> Result<c_int, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        if !s.set.status().running {
            return Err(Code::Enotrun);
        }
        let n = s.set.len();
        let r = if values.is_null() { s.set.stop().map(drop) } else { s.set.stop_into(values.slice(n)?) };
        for p in &mut s.profiles {
            p.flush();
        }
        r.map(|()| 0).map_err(ll)
    })
}

/// `PAPI_read`: a stopped set gives the values of its last stop.
pub fn read(es: c_int, mut values: Array<i64>) -> Result<c_int, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        let n = s.set.len();
        s.set.read_into(values.slice(n)?).map(|()| 0).map_err(ll)
    })
}

/// `PAPI_read_ts`: the values and the TSC right after the read.
pub fn read_ts(es: c_int, mut values: Array<i64>) -> Result<i64, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        let n = s.set.len();
        s.set.read_ts(values.slice(n)?).map(|t| t as i64).map_err(ll)
    })
}

/// `PAPI_accum`: adds the values into the caller's and resets; on a
/// stopped set it adds the values of its last stop.
pub fn accum(es: c_int, mut values: Array<i64>) -> Result<c_int, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        let n = s.set.len();
        let out = values.slice(n)?;
        if s.set.status().running {
            return s.set.accum(out).map(|()| 0).map_err(ll);
        }
        let mut now = vec![0i64; n];
        s.set.read_into(&mut now).map_err(ll)?;
        for (o, v) in out.iter_mut().zip(now) {
            *o = o.saturating_add(v);
        }
        s.set.reset().map(|()| 0).map_err(ll)
    })
}

/// `PAPI_reset`.
pub fn reset(es: c_int) -> Result<c_int, Code> {
    with(es, |s| s.set.reset().map(|()| 0).map_err(ll))
}

/// `PAPI_write`: perf has no way to load a counter.
pub fn write(es: c_int) -> Result<c_int, Code> {
    with(es, |s| s.set.write(&[]).map(|()| 0).map_err(ll))
}

/// `PAPI_assign_eventset_component`.
pub fn assign_component(es: c_int, cidx: c_int) -> Result<c_int, Code> {
    let cidx = usize::try_from(cidx).ok().filter(|&c| c < events::COMPONENTS).ok_or(Code::Enocmp)?;
    with(es, |s| {
        if s.component.is_some() {
            return Err(Code::Einval);
        }
        bind(s, cidx).map(|()| 0)
    })
}

/// `PAPI_get_eventset_component`.
pub fn component(es: c_int) -> Result<c_int, Code> {
    with(es, |s| s.component.map(|c| c as c_int).ok_or(Code::Enocmp))
}

/// `PAPI_set_multiplex`.
pub fn set_multiplex(es: c_int) -> Result<c_int, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        let st = s.set.status();
        if st.running {
            return Err(Code::Eisrun);
        }
        if st.multiplexing {
            return Err(Code::Einval);
        }
        s.set.set_multiplex(true).map(|()| 0).map_err(ll)
    })
}

/// PAPI domain bits as perf's privilege levels.
pub fn to_domain(bits: c_int) -> Result<Domain, Code> {
    if !(1..=15).contains(&bits) {
        return Err(Code::EinvalDom);
    }
    let d = Domain { user: bits & 1 != 0, kernel: bits & 2 != 0, hypervisor: bits & 8 != 0 };
    if !(d.user || d.kernel || d.hypervisor) {
        // PAPI_DOM_OTHER alone: nothing perf can filter on.
        return Err(Code::EinvalDom);
    }
    Ok(d)
}

/// perf's privilege levels as PAPI domain bits.
pub fn domain_bits(d: Option<Domain>) -> c_int {
    match d {
        None => 1,
        Some(d) => c_int::from(d.user) | c_int::from(d.kernel) << 1 | c_int::from(d.hypervisor) << 3,
    }
}

/// `PAPI_set_opt(PAPI_DOMAIN)`.
pub fn set_domain(es: c_int, bits: c_int) -> Result<c_int, Code> {
    let d = to_domain(bits)?;
    with(es, |s| s.set.set_domain(Some(d)).map(|()| 0).map_err(ll))
}

/// `PAPI_set_opt(PAPI_GRANUL)`.
pub fn set_granularity(es: c_int, bits: c_int) -> Result<c_int, Code> {
    let g = match bits {
        1 => Granularity::Thread,
        2 => Granularity::Process,
        8 => Granularity::System,
        _ => return Err(Code::Einval),
    };
    with(es, |s| s.set.set_granularity(g).map(|()| 0).map_err(ll))
}

/// `PAPI_set_opt(PAPI_INHERIT)`.
pub fn set_inherit(es: c_int, on: bool) -> Result<c_int, Code> {
    let g = if on { Granularity::Process } else { Granularity::Thread };
    with(es, |s| s.set.set_granularity(g).map(|()| 0).map_err(ll))
}

/// `PAPI_set_opt(PAPI_CPU_ATTACH)`: counts everything on one CPU.
pub fn set_cpu(es: c_int, cpu: u32) -> Result<c_int, Code> {
    with(es, |s| {
        if s.set.status().running {
            return Err(Code::Eisrun);
        }
        if s.set.options().attached.is_some() {
            return Err(Code::Einval);
        }
        let old = s.set.options();
        s.set.set_cpu(Some(cpu)).map_err(ll)?;
        if let Err(e) = s.set.set_granularity(Granularity::System) {
            let _ = s.set.set_cpu(old.cpu);
            return Err(ll(e));
        }
        Ok(0)
    })
}

/// `PAPI_attach`.
pub fn attach(es: c_int, tid: u64) -> Result<c_int, Code> {
    let pid = i32::try_from(tid).map_err(|_| Code::Einval)?;
    with(es, |s| {
        let st = s.set.status();
        if st.running {
            return Err(Code::Eisrun);
        }
        if st.attached || st.cpu_attached {
            return Err(Code::Einval);
        }
        s.set.attach(pid).map(|()| 0).map_err(ll)
    })
}

/// `PAPI_detach`.
pub fn detach(es: c_int) -> Result<c_int, Code> {
    with(es, |s| {
        let st = s.set.status();
        if st.running {
            return Err(Code::Eisrun);
        }
        if !st.attached {
            return Err(Code::Einval);
        }
        s.set.detach().map(|()| 0).map_err(ll)
    })
}

/// `PAPI_overflow`. `PAPI_OVERFLOW_FORCE_SW` is served by the kernel's
/// sampling, which delivers the same handler calls.
pub fn overflow(
    es: c_int,
    code: u32,
    threshold: c_int,
    flags: c_int,
    handler: Option<OverflowFn>,
) -> Result<c_int, Code> {
    with(es, |s| {
        if s.component.is_none() {
            return Err(Code::Enocmp);
        }
        if s.set.status().running {
            return Err(Code::Eisrun);
        }
        if threshold < 0 {
            return Err(Code::Einval);
        }
        if !s.set.codes().contains(&code) {
            return Err(Code::Enoevnt);
        }
        let flags = flags as u32 & !papirus_lowlevel::overflow::OVERFLOW_FORCE_SW;
        if threshold == 0 {
            if s.set.overflow_threshold(code).map_err(ll)? == 0 {
                return Err(Code::Einval);
            }
            let noop: papirus_lowlevel::overflow::OverflowHandler = Arc::new(|_| {});
            return s.set.overflow(code, 0, 0, noop).map(|()| 0).map_err(ll);
        }
        let f = handler.ok_or(Code::Einval)?;
        let h: papirus_lowlevel::overflow::OverflowHandler =
            Arc::new(move |i: &OverflowInfo| call_overflow(f, es, i.address, i.vector, i.context));
        s.set.overflow(code, threshold as u64, flags, h).map(|()| 0).map_err(ll)
    })
}

/// `PAPI_get_overflow_event_index`: the set's indices in `vector`.
pub fn overflow_indices(es: c_int, vector: u64) -> Result<Vec<c_int>, Code> {
    if vector == 0 {
        return Err(Code::Einval);
    }
    with(es, |s| {
        if s.set.is_empty() {
            return Err(Code::Einval);
        }
        let n = s.set.len();
        Ok(papirus_lowlevel::overflow::overflow_event_indices(vector)
            .filter(|&i| i < n)
            .map(|i| i as c_int)
            .collect())
    })
}

/// One region of `PAPI_sprofil` as the caller describes it.
#[derive(Clone, Copy, Debug)]
pub struct ProfilArea {
    /// The caller's bucket buffer.
    pub base: usize,
    /// Its size in bytes.
    pub bytes: usize,
    /// Lowest address profiled.
    pub offset: u64,
    /// PAPI's scale.
    pub scale: u32,
}

/// `PAPI_profil` / `PAPI_sprofil`; threshold 0 turns profiling off.
pub fn profil(
    es: c_int,
    areas: &[ProfilArea],
    code: u32,
    threshold: c_int,
    flags: c_int,
) -> Result<c_int, Code> {
    with(es, |s| {
        // An unbound set holds no event: PAPI says ENOEVNT, which its
        // tests read as "skip", before ENOCMP.
        if !s.set.codes().contains(&code) {
            return Err(Code::Enoevnt);
        }
        if s.set.status().running {
            return Err(Code::Eisrun);
        }
        if threshold < 0 || areas.is_empty() {
            return Err(Code::Einval);
        }
        let at = s.profiles.iter().position(|p| p.code == code);
        if threshold == 0 {
            let i = at.ok_or(Code::Einval)?;
            s.profiles[i].flush();
            s.profiles.remove(i);
            return s.set.sprofil(code, vec![], 0, ProfilFlags::POSIX).map(|_| 0).map_err(ll);
        }
        // PAPI_PROFIL_FORCE_SW: served by the kernel's sampling too.
        let flags = ProfilFlags(flags as u32 & !ProfilFlags::FORCE_SW.0);
        let width = if flags.contains(ProfilFlags::BUCKET_64) {
            8
        } else if flags.contains(ProfilFlags::BUCKET_32) {
            4
        } else {
            2
        };
        let regions: Vec<Region> = areas
            .iter()
            .map(|a| Region { buckets: a.bytes / width, offset: a.offset, scale: a.scale })
            .collect();
        let profile = s.set.sprofil(code, regions, threshold as u64, flags).map_err(ll)?.ok_or(Code::Ebug)?;
        let buffers: Vec<ProfilBuffer> =
            areas.iter().map(|a| ProfilBuffer { base: a.base, buckets: a.bytes / width, width }).collect();
        let copied = buffers.iter().map(|b| vec![0; b.buckets]).collect();
        let sink = ProfilSink { code, profile, buffers, copied };
        match at {
            Some(i) => s.profiles[i] = sink,
            None => s.profiles.push(sink),
        }
        Ok(0)
    })
}
