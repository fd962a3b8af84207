//! The exported C functions of `papi.h`, each a thin shell: arguments
//! turned into the checked wrappers of [`crate::raw`] (the `// SAFETY:`
//! comments cite PAPI's contract for each pointer), the body run behind
//! the panic boundary of [`crate::boundary`].
// Each function is documented in `papi.h`, the interface it implements.
#![allow(unsafe_code, non_snake_case, missing_docs, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CString, c_char, c_int, c_uint, c_ulong, c_void};
use std::sync::OnceLock;

use papirus_highlevel::rates;
use papirus_lowlevel::{real_cyc, real_nsec, real_usec, virt_cyc, virt_nsec, virt_usec};

use crate::boundary::{int, value};
use crate::raw::{Array, IdFn, OverflowFn, Ptr, StrOut, c_str};
use crate::types::{ComponentInfo, DmemInfo, EventInfo, ExeInfo, HwInfo, Option_, ShlibInfo, Sprofil};
use crate::{Code, events, hl, info, options, sets, state};

const OK: c_int = 0;

/// A C string argument PAPI requires: EINVAL for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn arg_str(p: *const c_char) -> Result<String, Code> {
    // SAFETY: forwarded contract.
    unsafe { c_str(p) }.map(|s| s.into_owned()).ok_or(Code::Einval)
}

// ---------------------------------------------------------------------------
// Library, errors, debug.

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_library_init(version: c_int) -> c_int {
    int(|| state::library_init(version))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_is_initialized() -> c_int {
    int(|| Ok(state::is_initialized()))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_shutdown() {
    value((), || {
        state::shutdown();
        Ok(())
    })
}

fn messages() -> &'static [CString] {
    static M: OnceLock<Vec<CString>> = OnceLock::new();
    M.get_or_init(|| Code::ALL.iter().map(|c| CString::new(c.describe()).unwrap_or_default()).collect())
}

/// The text of error `code`, or NULL for a code PAPI does not define.
pub fn strerror(code: c_int) -> *mut c_char {
    match usize::try_from(-(code as i64)).ok().and_then(|i| messages().get(i)) {
        // C callers never write through it (PAPI's type lacks const).
        Some(s) => s.as_ptr().cast_mut(),
        None => std::ptr::null_mut(),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_strerror(code: c_int) -> *mut c_char {
    value(std::ptr::null_mut(), || Ok(strerror(code)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_perror(msg: *const c_char) {
    // SAFETY: PAPI_perror takes NULL or a NUL-terminated message.
    let msg = unsafe { c_str(msg) }.map(|s| s.into_owned()).unwrap_or_default();
    value((), || {
        let code = crate::boundary::last_error();
        let text = Code::from_value(code).map_or("unknown error", Code::describe);
        if msg.is_empty() {
            eprintln!("{text}");
        } else {
            eprintln!("{msg}: {text}");
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_debug(level: c_int) -> c_int {
    int(|| {
        if !(0..=2).contains(&level) {
            return Err(Code::Einval);
        }
        state::with(|s| s.debug = level);
        Ok(OK)
    })
}

// ---------------------------------------------------------------------------
// Threads.

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_thread_init(id_fn: Option<IdFn>) -> c_int {
    int(|| state::thread_init(id_fn))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_thread_id() -> c_ulong {
    value(Code::Ebug.value() as c_ulong, || Ok(state::thread_id()))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_register_thread() -> c_int {
    int(|| {
        state::lib()?;
        state::register_current();
        Ok(OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_unregister_thread() -> c_int {
    int(|| {
        state::lib()?;
        state::unregister_current()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_list_threads(tids: *mut c_ulong, number: *mut c_int) -> c_int {
    // SAFETY: `number` is NULL or an int; `tids` NULL or `*number` ids.
    let (n, mut out) = unsafe { (Ptr::new(number), Array::new(tids)) };
    int(|| {
        state::lib()?;
        let want = n.get()?;
        let ids = state::thread_ids();
        if out.is_null() {
            n.set(ids.len() as c_int)?;
            return Ok(OK);
        }
        if want <= 0 {
            return Err(Code::Einval);
        }
        let dst = out.slice(want as usize)?;
        let k = ids.len().min(dst.len());
        dst[..k].copy_from_slice(&ids[..k]);
        n.set(k as c_int)?;
        Ok(OK)
    })
}

const TLS_ALL_THREADS: c_int = 0x10;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_thr_specific(tag: c_int, ptr: *mut *mut c_void) -> c_int {
    // SAFETY: `ptr` is NULL or a `void *` (a PAPI_all_thr_spec_t * with
    // PAPI_TLS_ALL_THREADS) to fill.
    let out = unsafe { Ptr::new(ptr) };
    int(|| {
        state::lib()?;
        let slot = usize::try_from(tag & !TLS_ALL_THREADS).ok().filter(|&t| t < 4).ok_or(Code::Einval)?;
        if tag & TLS_ALL_THREADS == 0 {
            return out.set(state::thr_specific(slot) as *mut c_void).map(|()| OK);
        }
        // SAFETY: with PAPI_TLS_ALL_THREADS the argument is a
        // PAPI_all_thr_spec_t * whose arrays hold `num` entries.
        let spec = unsafe { Ptr::new(ptr.cast::<crate::types::AllThrSpec>()) };
        let mut s = spec.get()?;
        let all = state::all_thr_specific(slot);
        // SAFETY: `id` and `data` hold `num` entries (or are NULL).
        let (mut ids, mut data) = unsafe { (Array::new(s.id), Array::new(s.data)) };
        let k = all.len().min(usize::try_from(s.num).unwrap_or(0));
        if let Ok(ids) = ids.slice(k) {
            ids.iter_mut().zip(&all).for_each(|(d, (id, _))| *d = *id);
        }
        if let Ok(data) = data.slice(k) {
            data.iter_mut().zip(&all).for_each(|(d, (_, v))| *d = *v as *mut c_void);
        }
        s.num = k as c_int;
        spec.set(s).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_thr_specific(tag: c_int, ptr: *mut c_void) -> c_int {
    int(|| {
        state::lib()?;
        let slot = usize::try_from(tag).ok().filter(|&t| t < 4).ok_or(Code::Einval)?;
        state::set_thr_specific(slot, ptr as usize);
        Ok(OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_lock(lck: c_int) -> c_int {
    int(|| {
        let i = usize::try_from(lck).ok().filter(|&i| i < state::LOCKS).ok_or(Code::Einval)?;
        state::lock(i);
        Ok(OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_unlock(lck: c_int) -> c_int {
    int(|| {
        let i = usize::try_from(lck).ok().filter(|&i| i < state::LOCKS).ok_or(Code::Einval)?;
        state::unlock(i);
        Ok(OK)
    })
}

// ---------------------------------------------------------------------------
// Components.

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_num_components() -> c_int {
    int(|| Ok(events::COMPONENTS as c_int))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_component_info(cidx: c_int) -> *const ComponentInfo {
    value(std::ptr::null(), || {
        let c = usize::try_from(cidx).map_err(|_| Code::Enocmp)?;
        events::component_info(c).ok_or(Code::Enocmp)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_component_index(name: *const c_char) -> c_int {
    // SAFETY: a NUL-terminated component name (or NULL).
    let name = unsafe { arg_str(name) };
    int(|| events::component_index(&name?))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_event_component(code: c_int) -> c_int {
    int(|| events::event_component(code as u32).map(|c| c as c_int))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_eventset_component(es: c_int) -> c_int {
    int(|| sets::component(es))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_assign_eventset_component(es: c_int, cidx: c_int) -> c_int {
    int(|| sets::assign_component(es, cidx))
}

fn disable(cidx: usize) -> Result<c_int, Code> {
    if cidx >= events::COMPONENTS {
        return Err(Code::Enocmp);
    }
    if state::initialized() {
        return Err(Code::Enoinit);
    }
    state::with(|s| s.disabled.insert(cidx, "disabled by the application (PAPI_disable_component)".into()));
    Ok(OK)
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_disable_component(cidx: c_int) -> c_int {
    int(|| disable(usize::try_from(cidx).map_err(|_| Code::Enocmp)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_disable_component_by_name(name: *const c_char) -> c_int {
    // SAFETY: a NUL-terminated component name (or NULL).
    let name = unsafe { arg_str(name) };
    int(|| disable(events::component_index(&name?)? as usize))
}

fn hw_counters() -> Result<c_int, Code> {
    Ok(state::lib()?.machine().hw_counters.unwrap_or(0) as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_num_cmp_hwctrs(cidx: c_int) -> c_int {
    int(|| match cidx {
        0 => hw_counters(),
        1 => Ok(0),
        _ => Err(Code::Ecmp),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_num_hwctrs() -> c_int {
    int(hw_counters)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_cmp_opt(option: c_int, ptr: *mut Option_, cidx: c_int) -> c_int {
    // SAFETY: NULL or a PAPI_option_t.
    let p = unsafe { Ptr::new(ptr) };
    int(|| options::get_cmp(option, p, cidx))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_cmp_domain(domain: c_int, cidx: c_int) -> c_int {
    int(|| {
        if cidx != 0 {
            return Err(Code::Enocmp);
        }
        state::lib()?;
        sets::to_domain(domain).map_err(|_| Code::Einval)?;
        state::set_default_domain(domain);
        Ok(OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_domain(domain: c_int) -> c_int {
    PAPI_set_cmp_domain(domain, 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_cmp_granularity(granularity: c_int, cidx: c_int) -> c_int {
    int(|| {
        if cidx != 0 {
            return Err(Code::Enocmp);
        }
        state::lib()?;
        if ![1, 2, 8].contains(&granularity) {
            return Err(Code::Einval);
        }
        state::set_default_granularity(granularity);
        Ok(OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_granularity(granularity: c_int) -> c_int {
    PAPI_set_cmp_granularity(granularity, 0)
}

// ---------------------------------------------------------------------------
// Event sets.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_create_eventset(es: *mut c_int) -> c_int {
    // SAFETY: NULL or an int holding PAPI_NULL, where the handle goes.
    let p = unsafe { Ptr::new(es) };
    int(|| {
        state::lib()?;
        if p.get()? != -1 {
            return Err(Code::Einval);
        }
        p.set(sets::create()?).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_destroy_eventset(es: *mut c_int) -> c_int {
    // SAFETY: NULL or the int holding the handle, set to PAPI_NULL here.
    let p = unsafe { Ptr::new(es) };
    int(|| {
        sets::destroy(p.get()?)?;
        p.set(-1).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_cleanup_eventset(es: c_int) -> c_int {
    int(|| sets::cleanup(es))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_add_event(es: c_int, code: c_int) -> c_int {
    int(|| sets::add(es, code as u32))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_add_named_event(es: c_int, name: *const c_char) -> c_int {
    // SAFETY: NULL or a NUL-terminated event name.
    let name = unsafe { arg_str(name) };
    int(|| sets::add_named(es, &name?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_add_events(es: c_int, codes: *mut c_int, number: c_int) -> c_int {
    // SAFETY: NULL or `number` event codes.
    let mut a = unsafe { Array::new(codes) };
    int(|| {
        let n = usize::try_from(number).ok().filter(|&n| n > 0).ok_or(Code::Einval)?;
        let codes = a.slice(n)?.to_vec();
        sets::add_many(es, &codes)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_remove_event(es: c_int, code: c_int) -> c_int {
    int(|| sets::remove(es, code as u32))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_remove_named_event(es: c_int, name: *const c_char) -> c_int {
    // SAFETY: NULL or a NUL-terminated event name.
    let name = unsafe { arg_str(name) };
    int(|| sets::remove_named(es, &name?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_remove_events(es: c_int, codes: *mut c_int, number: c_int) -> c_int {
    // SAFETY: NULL or `number` event codes.
    let mut a = unsafe { Array::new(codes) };
    int(|| {
        let n = usize::try_from(number).ok().filter(|&n| n > 0).ok_or(Code::Einval)?;
        let codes = a.slice(n)?.to_vec();
        sets::remove_many(es, &codes)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_num_events(es: c_int) -> c_int {
    int(|| sets::num_events(es))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_list_events(es: c_int, codes: *mut c_int, number: *mut c_int) -> c_int {
    // SAFETY: `number` is an int; `codes` NULL or `*number` ints.
    let (n, mut out) = unsafe { (Ptr::new(number), Array::new(codes)) };
    int(|| {
        let want = n.get()?;
        if want < 0 || (out.is_null() && want > 0) {
            return Err(Code::Einval);
        }
        let list = sets::codes(es)?;
        if out.is_null() || want == 0 {
            return n.set(list.len() as c_int).map(|()| OK);
        }
        let dst = out.slice(want as usize)?;
        let k = list.len().min(dst.len());
        for (d, c) in dst.iter_mut().zip(&list) {
            *d = *c as c_int;
        }
        n.set(k as c_int).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_state(es: c_int, status: *mut c_int) -> c_int {
    // SAFETY: NULL or an int.
    let p = unsafe { Ptr::new(status) };
    int(|| {
        if p.is_null() {
            return Err(Code::Einval);
        }
        p.set(sets::status(es)?).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_start(es: c_int) -> c_int {
    int(|| sets::start(es))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_stop(es: c_int, values: *mut i64) -> c_int {
    // SAFETY: NULL or PAPI_num_events(es) long longs.
    let v = unsafe { Array::new(values) };
    int(|| sets::stop(es, v))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_read(es: c_int, values: *mut i64) -> c_int {
    // SAFETY: NULL or PAPI_num_events(es) long longs.
    let v = unsafe { Array::new(values) };
    int(|| sets::read(es, v))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_read_ts(es: c_int, values: *mut i64, cyc: *mut i64) -> c_int {
    // SAFETY: NULL or PAPI_num_events(es) long longs; `cyc` NULL or one.
    let (v, c) = unsafe { (Array::new(values), Ptr::new(cyc)) };
    int(|| {
        let t = sets::read_ts(es, v)?;
        c.set(t).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_accum(es: c_int, values: *mut i64) -> c_int {
    // SAFETY: NULL or PAPI_num_events(es) long longs.
    let v = unsafe { Array::new(values) };
    int(|| sets::accum(es, v))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_reset(es: c_int) -> c_int {
    int(|| sets::reset(es))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_write(es: c_int, _values: *mut i64) -> c_int {
    int(|| sets::write(es))
}

// ---------------------------------------------------------------------------
// Options.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_set_opt(option: c_int, ptr: *mut Option_) -> c_int {
    // SAFETY: NULL or a PAPI_option_t.
    let p = unsafe { Ptr::new(ptr) };
    int(|| options::set(option, p))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_opt(option: c_int, ptr: *mut Option_) -> c_int {
    // SAFETY: NULL or a PAPI_option_t.
    let p = unsafe { Ptr::new(ptr) };
    int(|| options::get(option, p))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_multiplex_init() -> c_int {
    int(|| Ok(OK))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_set_multiplex(es: c_int) -> c_int {
    int(|| sets::set_multiplex(es))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_multiplex(es: c_int) -> c_int {
    // As PAPI: any error reads as "not multiplexed".
    int(|| Ok(sets::status(es).map_or(0, |b| c_int::from(b & 0x40 != 0))))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_attach(es: c_int, tid: c_ulong) -> c_int {
    int(|| sets::attach(es, tid))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_detach(es: c_int) -> c_int {
    int(|| sets::detach(es))
}

// ---------------------------------------------------------------------------
// Names, enumeration, information.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_event_name_to_code(name: *const c_char, code: *mut c_int) -> c_int {
    // SAFETY: NULL or a NUL-terminated name; NULL or an int.
    let (name, out) = unsafe { (c_str(name).map(|s| s.into_owned()), Ptr::new(code)) };
    int(|| {
        let name = name.ok_or(Code::Einval)?;
        if out.is_null() {
            return Err(Code::Einval);
        }
        state::lib()?;
        out.set(events::name_to_code(&name)? as c_int).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_event_code_to_name(code: c_int, out: *mut c_char) -> c_int {
    // SAFETY: NULL or PAPI_MAX_STR_LEN bytes.
    let out = unsafe { StrOut::new(out, 128) };
    int(|| {
        let name = events::code_to_name(code as u32)?;
        out.put(&name).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_query_event(code: c_int) -> c_int {
    int(|| events::query(code as u32))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_query_named_event(name: *const c_char) -> c_int {
    // SAFETY: NULL or a NUL-terminated name.
    let name = unsafe { arg_str(name) };
    int(|| {
        state::lib()?;
        events::query(events::name_to_code(&name?)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_event_info(code: c_int, info: *mut EventInfo) -> c_int {
    // SAFETY: NULL or a PAPI_event_info_t.
    let p = unsafe { Ptr::new(info) };
    int(|| {
        if p.is_null() {
            return Err(Code::Einval);
        }
        state::lib()?;
        p.set(events::info(code as u32)?).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_enum_event(code: *mut c_int, modifier: c_int) -> c_int {
    // SAFETY: NULL or an int.
    let p = unsafe { Ptr::new(code) };
    int(|| {
        let next = events::enumerate(p.get()? as u32, modifier, None)?;
        p.set(next as c_int).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_enum_cmp_event(code: *mut c_int, modifier: c_int, cidx: c_int) -> c_int {
    // SAFETY: NULL or an int.
    let p = unsafe { Ptr::new(code) };
    int(|| {
        let c = usize::try_from(cidx).map_err(|_| Code::Enocmp)?;
        let next = events::enumerate(p.get()? as u32, modifier, Some(c))?;
        p.set(next as c_int).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_hardware_info() -> *const HwInfo {
    value(std::ptr::null(), info::hardware)
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_executable_info() -> *const ExeInfo {
    value(std::ptr::null(), info::executable)
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_shared_lib_info() -> *const ShlibInfo {
    value(std::ptr::null(), info::shared_libs)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_dmem_info(dest: *mut DmemInfo) -> c_int {
    // SAFETY: NULL or a PAPI_dmem_info_t.
    let p = unsafe { Ptr::new(dest) };
    int(|| {
        if p.is_null() {
            return Err(Code::Einval);
        }
        p.set(info::dmem()?).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_enum_dev_type(_modifier: c_int, _handle: *mut *mut c_void) -> c_int {
    // No sysdetect component: device queries are not offered.
    int(|| Err(Code::Enosupp))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_dev_type_attr(_handle: *mut c_void, _attr: c_int, _value: *mut c_void) -> c_int {
    int(|| Err(Code::Enosupp))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_dev_attr(
    _handle: *mut c_void,
    _id: c_int,
    _attr: c_int,
    _value: *mut c_void,
) -> c_int {
    int(|| Err(Code::Enosupp))
}

// ---------------------------------------------------------------------------
// Timers: the TSC and the thread's CPU time, no system call on the fast path.

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_real_cyc() -> i64 {
    value(0, || Ok(real_cyc() as i64))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_real_nsec() -> i64 {
    value(0, || Ok(real_nsec() as i64))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_real_usec() -> i64 {
    value(0, || Ok(real_usec() as i64))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_virt_cyc() -> i64 {
    value(0, || Ok(virt_cyc() as i64))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_virt_nsec() -> i64 {
    value(0, || Ok(virt_nsec() as i64))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_get_virt_usec() -> i64 {
    value(0, || Ok(virt_usec() as i64))
}

// ---------------------------------------------------------------------------
// Overflow and profiling.

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_overflow(
    es: c_int,
    code: c_int,
    threshold: c_int,
    flags: c_int,
    handler: Option<OverflowFn>,
) -> c_int {
    int(|| sets::overflow(es, code as u32, threshold, flags, handler))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_get_overflow_event_index(
    es: c_int,
    vector: i64,
    array: *mut c_int,
    number: *mut c_int,
) -> c_int {
    // SAFETY: `number` NULL or an int; `array` NULL or `*number` ints.
    let (n, mut out) = unsafe { (Ptr::new(number), Array::new(array)) };
    int(|| {
        let want = n.get()?;
        if want < 1 || out.is_null() {
            return Err(Code::Einval);
        }
        let idx = sets::overflow_indices(es, vector as u64)?;
        let dst = out.slice(want as usize)?;
        let k = idx.len().min(dst.len());
        dst[..k].copy_from_slice(&idx[..k]);
        n.set(k as c_int).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_profil(
    buf: *mut c_void,
    bufsiz: c_uint,
    offset: *mut c_void,
    scale: c_uint,
    es: c_int,
    code: c_int,
    threshold: c_int,
    flags: c_int,
) -> c_int {
    int(|| {
        if buf.is_null() && threshold > 0 {
            return Err(Code::Einval);
        }
        let area =
            sets::ProfilArea { base: buf as usize, bytes: bufsiz as usize, offset: offset as u64, scale };
        sets::profil(es, &[area], code as u32, threshold, flags)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_sprofil(
    prof: *mut Sprofil,
    profcnt: c_int,
    es: c_int,
    code: c_int,
    threshold: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: NULL or `profcnt` PAPI_sprofil_t.
    let mut a = unsafe { Array::new(prof) };
    int(|| {
        let n = usize::try_from(profcnt).ok().filter(|&n| n > 0).ok_or(Code::Einval)?;
        let areas: Vec<sets::ProfilArea> = a
            .slice(n)?
            .iter()
            .map(|p| sets::ProfilArea {
                base: p.pr_base as usize,
                bytes: p.pr_size as usize,
                offset: p.pr_off as u64,
                scale: p.pr_scale,
            })
            .collect();
        sets::profil(es, &areas, code as u32, threshold, flags)
    })
}

// ---------------------------------------------------------------------------
// Rates and the high-level API.

fn rate_event(code: c_int) -> Result<String, Code> {
    events::code_to_name(code as u32).map_err(|_| Code::Enoevnt)
}

fn set_f32(p: &Ptr<f32>, v: f64) -> Result<(), Code> {
    p.set(v as f32)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_flops_rate(
    event: c_int,
    rtime: *mut f32,
    ptime: *mut f32,
    flpops: *mut i64,
    mflops: *mut f32,
) -> c_int {
    // SAFETY: each is NULL or one value to fill.
    let (r, p, c, m) = unsafe { (Ptr::new(rtime), Ptr::new(ptime), Ptr::new(flpops), Ptr::new(mflops)) };
    int(|| {
        if r.is_null() || p.is_null() || c.is_null() || m.is_null() {
            return Err(Code::Einval);
        }
        let x = rates::flops_rate(&rate_event(event)?).map_err(|e| e.code())?;
        set_f32(&r, x.real_time_s)?;
        set_f32(&p, x.proc_time_s)?;
        c.set(x.count)?;
        set_f32(&m, x.rate).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_flips_rate(
    event: c_int,
    rtime: *mut f32,
    ptime: *mut f32,
    flpins: *mut i64,
    mflips: *mut f32,
) -> c_int {
    // SAFETY: each is NULL or one value to fill.
    let (r, p, c, m) = unsafe { (Ptr::new(rtime), Ptr::new(ptime), Ptr::new(flpins), Ptr::new(mflips)) };
    int(|| {
        if r.is_null() || p.is_null() || c.is_null() || m.is_null() {
            return Err(Code::Einval);
        }
        let x = rates::flips_rate(&rate_event(event)?).map_err(|e| e.code())?;
        set_f32(&r, x.real_time_s)?;
        set_f32(&p, x.proc_time_s)?;
        c.set(x.count)?;
        set_f32(&m, x.rate).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_ipc(rtime: *mut f32, ptime: *mut f32, ins: *mut i64, ipc: *mut f32) -> c_int {
    // SAFETY: each is NULL or one value to fill.
    let (r, p, c, m) = unsafe { (Ptr::new(rtime), Ptr::new(ptime), Ptr::new(ins), Ptr::new(ipc)) };
    int(|| {
        if r.is_null() || p.is_null() || c.is_null() || m.is_null() {
            return Err(Code::Einval);
        }
        let x = rates::ipc().map_err(|e| e.code())?;
        set_f32(&r, x.real_time_s)?;
        set_f32(&p, x.proc_time_s)?;
        c.set(x.count)?;
        set_f32(&m, x.rate).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_epc(
    event: c_int,
    rtime: *mut f32,
    ptime: *mut f32,
    ref_: *mut i64,
    core: *mut i64,
    evt: *mut i64,
    epc: *mut f32,
) -> c_int {
    // SAFETY: each is NULL or one value to fill.
    let (r, p, rf, co, ev, m) = unsafe {
        (Ptr::new(rtime), Ptr::new(ptime), Ptr::new(ref_), Ptr::new(core), Ptr::new(evt), Ptr::new(epc))
    };
    int(|| {
        if r.is_null() || p.is_null() || rf.is_null() || co.is_null() || ev.is_null() || m.is_null() {
            return Err(Code::Einval);
        }
        let name = if event == 0 { None } else { Some(rate_event(event)?) };
        let x = rates::epc(name.as_deref()).map_err(|e| e.code())?;
        set_f32(&r, x.real_time_s)?;
        set_f32(&p, x.proc_time_s)?;
        rf.set(x.ref_cycles)?;
        co.set(x.core_cycles)?;
        ev.set(x.events)?;
        set_f32(&m, x.epc).map(|()| OK)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_rate_stop() -> c_int {
    int(|| rates::rate_stop().map(|()| OK).map_err(|e| e.code()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_hl_region_begin(region: *const c_char) -> c_int {
    // SAFETY: NULL or a NUL-terminated region name.
    let name = unsafe { arg_str(region) };
    int(|| hl::begin(&name?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_hl_read(region: *const c_char) -> c_int {
    // SAFETY: NULL or a NUL-terminated region name.
    let name = unsafe { arg_str(region) };
    int(|| hl::read_region(&name?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PAPI_hl_region_end(region: *const c_char) -> c_int {
    // SAFETY: NULL or a NUL-terminated region name.
    let name = unsafe { arg_str(region) };
    int(|| hl::end(&name?))
}

#[unsafe(no_mangle)]
pub extern "C" fn PAPI_hl_stop() -> c_int {
    int(hl::stop)
}
