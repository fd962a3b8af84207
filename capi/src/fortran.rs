//! PAPI's Fortran interface (`PAPIF_*`), as gfortran calls it: every
//! argument by reference, results through a trailing `check` (or the
//! argument itself), `CHARACTER` arguments with their hidden lengths last.
//! Each wrapper is exported under the four names PAPI's library has
//! (`papif_x`, `papif_x_`, `papif_x__`, `PAPIF_X`), so Fortran binaries
//! built against PAPI link and run unchanged.
//!
//! Unlike PAPI's, `PAPIF_flops_rate`, `PAPIF_flips_rate` and `PAPIF_epc`
//! take the event by reference, as Fortran passes it (PAPI's read the
//! address as the event code).
// Each function is documented by PAPI's Fortran interface.
#![allow(unsafe_code, non_snake_case, missing_docs, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_int, c_void};

use crate::exports::*;
use crate::raw::F;
use crate::{Code, events, info};

macro_rules! fortran {
    ($( [$($sym:ident),+] $args:tt => $body:expr; )*) => {
        $( fortran_names! { $args => $body; $($sym)+ } )*
    };
}

macro_rules! fortran_names {
    ($args:tt => $body:expr;) => {};
    ($args:tt => $body:expr; $sym:ident $($rest:ident)*) => {
        fortran_fn! { $sym $args => $body }
        fortran_names! { $args => $body; $($rest)* }
    };
}

macro_rules! fortran_fn {
    ($sym:ident ($($a:ident),* $(| $($l:ident),+)?) => $body:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sym($($a: *mut c_void,)* $($($l: usize),+)?) {
            // SAFETY: gfortran passes each argument by reference to a
            // variable of the type PAPI's Fortran interface declares.
            let ($($a,)*) = unsafe { ($(F::new($a),)*) };
            #[allow(unused_unsafe)]
            // SAFETY: the body hands these references on to the C entry
            // point whose contract is the same (PAPI's wrappers do likewise).
            let () = unsafe { $body };
        }
    };
}

macro_rules! fortran0 {
    ($( [$($sym:ident),+] => $body:expr; )*) => {
        $( $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $sym() {
                $body
            }
        )+ )*
    };
}

/// Stores a C entry point's result in `check`.
fn check(c: F, r: c_int) {
    let _ = c.int().set(r);
}

fn int_of(f: F) -> c_int {
    f.int().get().unwrap_or(-1)
}

fn library_init(c: F) {
    check(c, PAPI_library_init(int_of(c)))
}

fn named(name: F, len: usize, c: F, f: impl FnOnce(&std::ffi::CStr) -> c_int) {
    match name.text(len).and_then(|s| std::ffi::CString::new(s).ok()) {
        Some(s) => check(c, f(&s)),
        None => check(c, Code::Einval.value()),
    }
}

fn rates(r: c_int, c: F) {
    check(c, r)
}

fn hardware_info(
    ncpu: F,
    nnodes: F,
    total: F,
    vendor: F,
    vs: F,
    model: F,
    ms: F,
    rev: F,
    mhz: F,
    vl: usize,
    ml: usize,
) {
    match info::hardware_ref() {
        Ok(h) => {
            let _ = (ncpu.int().set(h.ncpu), nnodes.int().set(h.nnodes), total.int().set(h.totalcpus));
            let _ = (vendor.int().set(h.vendor), model.int().set(h.model), rev.real().set(h.revision));
            let _ = mhz.real().set(h.cpu_max_mhz as f32);
            vs.text_out(vl).put_padded(&events::text(&h.vendor_string));
            ms.text_out(ml).put_padded(&events::text(&h.model_string));
        }
        Err(_) => {
            for f in [ncpu, nnodes, total, vendor, model] {
                let _ = f.int().set(0);
            }
            let _ = (rev.real().set(0.0), mhz.real().set(0.0));
        }
    }
}

fn exe_info(full: F, name: F, addrs: [F; 6], c: F, fl: usize, nl: usize) {
    if !crate::state::initialized() {
        return check(c, Code::Enoinit.value());
    }
    let e = info::executable_now();
    full.text_out(fl).put_padded(&events::text(&e.fullname));
    name.text_out(nl).put_padded(&events::text(&e.address_info.name));
    let a = &e.address_info;
    for (f, v) in
        addrs.iter().zip([a.text_start, a.text_end, a.data_start, a.data_end, a.bss_start, a.bss_end])
    {
        let _ = f.long().set(v as i64);
    }
    check(c, 0)
}

fn event_info(code: F, sym: F, long: F, short: F, count: F, note: F, c: F, lens: [usize; 4]) {
    match events::info(int_of(code) as u32) {
        Ok(i) => {
            sym.text_out(lens[0]).put_padded(&events::text(&i.symbol));
            long.text_out(lens[1]).put_padded(&events::text(&i.long_descr));
            short.text_out(lens[2]).put_padded(&events::text(&i.short_descr));
            note.text_out(lens[3]).put_padded(&events::text(&i.note));
            let _ = count.int().set(i.count as c_int);
            check(c, 0)
        }
        Err(e) => check(c, e.value()),
    }
}

/// `PAPIF_get_domain` / `PAPIF_get_granularity`: the default (mode
/// PAPI_DEFDOM / PAPI_DEFGRN) or the set's.
fn get_setting(es: F, out: F, mode: F, c: F, domain: bool) {
    let (dd, dg) = crate::state::defaults();
    if int_of(mode) == if domain { 4 } else { 6 } {
        let _ = out.int().set(if domain { dd } else { dg });
        return check(c, 0);
    }
    match crate::sets::with(int_of(es), |s| Ok(s.set.options())) {
        Ok(o) => {
            let v = if domain {
                crate::sets::domain_bits(o.domain)
            } else {
                match o.granularity {
                    papirus_lowlevel::Granularity::Thread => 1,
                    papirus_lowlevel::Granularity::Process => 2,
                    papirus_lowlevel::Granularity::System => 8,
                }
            };
            let _ = out.int().set(v);
            check(c, 0)
        }
        Err(e) => check(c, e.value()),
    }
}

fn options_for(es: c_int) -> crate::types::Option_ {
    crate::types::Option_ { domain: crate::types::DomainOption { def_cidx: 0, eventset: es, value: 0 } }
}

fortran0! {
    [papif_shutdown, papif_shutdown_, papif_shutdown__, PAPIF_SHUTDOWN] => PAPI_shutdown();
}

fortran! {
    [papif_library_init, papif_library_init_, papif_library_init__, PAPIF_LIBRARY_INIT] (c) => library_init(c);
    [papif_is_initialized, papif_is_initialized_, papif_is_initialized__, PAPIF_IS_INITIALIZED] (level) => { let _ = level.int().set(PAPI_is_initialized()); };
    [papif_create_eventset, papif_create_eventset_, papif_create_eventset__, PAPIF_CREATE_EVENTSET] (es, c) => check(c, PAPI_create_eventset(es.ptr()));
    [papif_destroy_eventset, papif_destroy_eventset_, papif_destroy_eventset__, PAPIF_DESTROY_EVENTSET] (es, c) => check(c, PAPI_destroy_eventset(es.ptr()));
    [papif_cleanup_eventset, papif_cleanup_eventset_, papif_cleanup_eventset__, PAPIF_CLEANUP_EVENTSET] (es, c) => check(c, PAPI_cleanup_eventset(int_of(es)));
    [papif_add_event, papif_add_event_, papif_add_event__, PAPIF_ADD_EVENT] (es, code, c) => check(c, PAPI_add_event(int_of(es), int_of(code)));
    [papif_add_named_event, papif_add_named_event_, papif_add_named_event__, PAPIF_ADD_NAMED_EVENT] (es, name, c | len) => named(name, len, c, |s| PAPI_add_named_event(int_of(es), s.as_ptr()));
    [papif_add_events, papif_add_events_, papif_add_events__, PAPIF_ADD_EVENTS] (es, codes, n, c) => check(c, PAPI_add_events(int_of(es), codes.ptr(), int_of(n)));
    [papif_remove_event, papif_remove_event_, papif_remove_event__, PAPIF_REMOVE_EVENT] (es, code, c) => check(c, PAPI_remove_event(int_of(es), int_of(code)));
    [papif_remove_named_event, papif_remove_named_event_, papif_remove_named_event__, PAPIF_REMOVE_NAMED_EVENT] (es, name, c | len) => named(name, len, c, |s| PAPI_remove_named_event(int_of(es), s.as_ptr()));
    [papif_remove_events, papif_remove_events_, papif_remove_events__, PAPIF_REMOVE_EVENTS] (es, codes, n, c) => check(c, PAPI_remove_events(int_of(es), codes.ptr(), int_of(n)));
    [papif_num_events, papif_num_events_, papif_num_events__, PAPIF_NUM_EVENTS] (es, count) => { let _ = count.int().set(PAPI_num_events(int_of(es))); };
    [papif_list_events, papif_list_events_, papif_list_events__, PAPIF_LIST_EVENTS] (es, codes, n, c) => check(c, PAPI_list_events(int_of(es), codes.ptr(), n.ptr()));
    [papif_start, papif_start_, papif_start__, PAPIF_START] (es, c) => check(c, PAPI_start(int_of(es)));
    [papif_stop, papif_stop_, papif_stop__, PAPIF_STOP] (es, v, c) => check(c, PAPI_stop(int_of(es), v.ptr()));
    [papif_read, papif_read_, papif_read__, PAPIF_READ] (es, v, c) => check(c, PAPI_read(int_of(es), v.ptr()));
    [papif_read_ts, papif_read_ts_, papif_read_ts__, PAPIF_READ_TS] (es, v, cyc, c) => check(c, PAPI_read_ts(int_of(es), v.ptr(), cyc.ptr()));
    [papif_accum, papif_accum_, papif_accum__, PAPIF_ACCUM] (es, v, c) => check(c, PAPI_accum(int_of(es), v.ptr()));
    [papif_reset, papif_reset_, papif_reset__, PAPIF_RESET] (es, c) => check(c, PAPI_reset(int_of(es)));
    [papif_write, papif_write_, papif_write__, PAPIF_WRITE] (es, v, c) => check(c, PAPI_write(int_of(es), v.ptr()));
    [papif_state, papif_state_, papif_state__, PAPIF_STATE] (es, st, c) => check(c, PAPI_state(int_of(es), st.ptr()));
    [papif_event_name_to_code, papif_event_name_to_code_, papif_event_name_to_code__, PAPIF_EVENT_NAME_TO_CODE] (name, code, c | len) => named(name, len, c, |s| PAPI_event_name_to_code(s.as_ptr(), code.ptr()));
    [papif_event_code_to_name, papif_event_code_to_name_, papif_event_code_to_name__, PAPIF_EVENT_CODE_TO_NAME] (code, name, c | len) => {
        match events::code_to_name(int_of(code) as u32) {
            Ok(n) => {
                name.text_out(len).put_padded(&n);
                check(c, 0)
            }
            Err(e) => check(c, e.value()),
        }
    };
    [papif_query_event, papif_query_event_, papif_query_event__, PAPIF_QUERY_EVENT] (code, c) => check(c, PAPI_query_event(int_of(code)));
    [papif_query_named_event, papif_query_named_event_, papif_query_named_event__, PAPIF_QUERY_NAMED_EVENT] (name, c | len) => named(name, len, c, |s| PAPI_query_named_event(s.as_ptr()));
    [papif_enum_event, papif_enum_event_, papif_enum_event__, PAPIF_ENUM_EVENT] (code, m, c) => check(c, PAPI_enum_event(code.ptr(), int_of(m)));
    [papif_get_real_cyc, papif_get_real_cyc_, papif_get_real_cyc__, PAPIF_GET_REAL_CYC] (t) => { let _ = t.long().set(PAPI_get_real_cyc()); };
    [papif_get_real_usec, papif_get_real_usec_, papif_get_real_usec__, PAPIF_GET_REAL_USEC] (t) => { let _ = t.long().set(PAPI_get_real_usec()); };
    [papif_get_real_nsec, papif_get_real_nsec_, papif_get_real_nsec__, PAPIF_GET_REAL_NSEC] (t) => { let _ = t.long().set(PAPI_get_real_nsec()); };
    [papif_get_virt_cyc, papif_get_virt_cyc_, papif_get_virt_cyc__, PAPIF_GET_VIRT_CYC] (t) => { let _ = t.long().set(PAPI_get_virt_cyc()); };
    [papif_get_virt_usec, papif_get_virt_usec_, papif_get_virt_usec__, PAPIF_GET_VIRT_USEC] (t) => { let _ = t.long().set(PAPI_get_virt_usec()); };
    [papif_num_hwctrs, papif_num_hwctrs_, papif_num_hwctrs__, PAPIF_num_hwctrs] (n) => { let _ = n.int().set(PAPI_num_hwctrs()); };
    [papif_num_cmp_hwctrs, papif_num_cmp_hwctrs_, papif_num_cmp_hwctrs__, PAPIF_num_cmp_hwctrs] (cidx, n) => { let _ = n.int().set(PAPI_num_cmp_hwctrs(int_of(cidx))); };
    [papif_get_clockrate, papif_get_clockrate_, papif_get_clockrate__, PAPIF_GET_CLOCKRATE] (cr) => { let _ = cr.int().set(PAPI_get_opt(14, std::ptr::null_mut()).max(0)); };
    [papif_multiplex_init, papif_multiplex_init_, papif_multiplex_init__, PAPIF_MULTIPLEX_INIT] (c) => check(c, PAPI_multiplex_init());
    [papif_set_multiplex, papif_set_multiplex_, papif_set_multiplex__, PAPIF_SET_MULTIPLEX] (es, c) => check(c, PAPI_set_multiplex(int_of(es)));
    [papif_get_multiplex, papif_get_multiplex_, papif_get_multiplex__, PAPIF_GET_MULTIPLEX] (es, c) => check(c, PAPI_get_multiplex(int_of(es)));
    [papif_assign_eventset_component, papif_assign_eventset_component_, papif_assign_eventset_component__, PAPIF_ASSIGN_EVENTSET_COMPONENT] (es, cidx, c) => check(c, PAPI_assign_eventset_component(int_of(es), int_of(cidx)));
    [papif_set_domain, papif_set_domain_, papif_set_domain__, PAPIF_SET_DOMAIN] (d, c) => check(c, PAPI_set_domain(int_of(d)));
    [papif_set_granularity, papif_set_granularity_, papif_set_granularity__, PAPIF_SET_GRANULARITY] (g, c) => check(c, PAPI_set_granularity(int_of(g)));
    [papif_set_cmp_domain, papif_set_cmp_domain_, papif_set_cmp_domain__, PAPIF_SET_CMP_DOMAIN] (d, cidx, c) => check(c, PAPI_set_cmp_domain(int_of(d), int_of(cidx)));
    [papif_set_cmp_granularity, papif_set_cmp_granularity_, papif_set_cmp_granularity__, PAPIF_SET_CMP_GRANULARITY] (g, cidx, c) => check(c, PAPI_set_cmp_granularity(int_of(g), int_of(cidx)));
    [papif_set_debug, papif_set_debug_, papif_set_debug__, PAPIF_SET_DEBUG] (l, c) => check(c, PAPI_set_debug(int_of(l)));
    [papif_register_thread, papif_register_thread_, papif_register_thread__, PAPIF_REGISTER_THREAD] (c) => check(c, PAPI_register_thread());
    [papif_unregister_thread, papif_unregister_thread_, papif_unregister_thread__, PAPIF_UNREGISTER_THREAD] (c) => check(c, PAPI_unregister_thread());
    [papif_unregster_thread, papif_unregster_thread_, papif_unregster_thread__, PAPIF_UNREGSTER_THREAD] (c) => check(c, PAPI_unregister_thread());
    [papif_thread_id, papif_thread_id_, papif_thread_id__, PAPIF_THREAD_ID] (id) => { let _ = id.long().set(PAPI_thread_id() as i64); };
    [papif_lock, papif_lock_, papif_lock__, PAPIF_LOCK] (l, c) => check(c, PAPI_lock(int_of(l)));
    [papif_unlock, papif_unlock_, papif_unlock__, PAPIF_unlock] (l, c) => check(c, PAPI_unlock(int_of(l)));
    [papif_perror, papif_perror_, papif_perror__, PAPIF_PERROR] (msg | len) => {
        let m = std::ffi::CString::new(msg.text(len).unwrap_or_default()).unwrap_or_default();
        PAPI_perror(m.as_ptr())
    };
    [papif_flops_rate, papif_flops_rate_, papif_flops_rate__, PAPIF_FLOPS_RATE] (ev, r, p, n, m, c) => rates(PAPI_flops_rate(int_of(ev), r.ptr(), p.ptr(), n.ptr(), m.ptr()), c);
    [papif_flips_rate, papif_flips_rate_, papif_flips_rate__, PAPIF_FLIPS_RATE] (ev, r, p, n, m, c) => rates(PAPI_flips_rate(int_of(ev), r.ptr(), p.ptr(), n.ptr(), m.ptr()), c);
    [papif_ipc, papif_ipc_, papif_ipc__, PAPIF_IPC] (r, p, n, m, c) => rates(PAPI_ipc(r.ptr(), p.ptr(), n.ptr(), m.ptr()), c);
    [papif_epc, papif_epc_, papif_epc__, PAPIF_EPC] (ev, r, p, rf, co, e, m, c) => rates(PAPI_epc(int_of(ev), r.ptr(), p.ptr(), rf.ptr(), co.ptr(), e.ptr(), m.ptr()), c);
    [papif_rate_stop, papif_rate_stop_, papif_rate_stop__, PAPIF_RATE_STOP] (c) => check(c, PAPI_rate_stop());
    [papif_hl_region_begin, papif_hl_region_begin_, papif_hl_region_begin__, PAPIF_HL_REGION_BEGIN] (name, c | len) => named(name, len, c, |s| PAPI_hl_region_begin(s.as_ptr()));
    [papif_hl_read, papif_hl_read_, papif_hl_read__, PAPIF_HL_READ] (name, c | len) => named(name, len, c, |s| PAPI_hl_read(s.as_ptr()));
    [papif_hl_region_end, papif_hl_region_end_, papif_hl_region_end__, PAPIF_HL_REGION_END] (name, c | len) => named(name, len, c, |s| PAPI_hl_region_end(s.as_ptr()));
    [papif_hl_stop, papif_hl_stop_, papif_hl_stop__, PAPIF_HL_STOP] (c) => check(c, PAPI_hl_stop());
    [papif_get_dmem_info, papif_get_dmem_info_, papif_get_dmem_info__, PAPIF_GET_DMEM_INFO] (dest, c) => check(c, PAPI_get_dmem_info(dest.ptr()));
    [papif_get_hardware_info, papif_get_hardware_info_, papif_get_hardware_info__, PAPIF_GET_HARDWARE_INFO] (n, nn, t, v, vs, m, ms, r, mhz | vl, ml) => hardware_info(n, nn, t, v, vs, m, ms, r, mhz, vl, ml);
    [papif_get_exe_info, papif_get_exe_info_, papif_get_exe_info__, PAPIF_GET_EXE_INFO] (full, name, ts, te, ds, de, bs, be, c | fl, nl) => exe_info(full, name, [ts, te, ds, de, bs, be], c, fl, nl);
    [papif_get_event_info, papif_get_event_info_, papif_get_event_info__, PAPIF_GET_EVENT_INFO] (code, sym, long, short, count, note, _flags, c | l1, l2, l3, l4) => event_info(code, sym, long, short, count, note, c, [l1, l2, l3, l4]);
    [papif_get_preload, papif_get_preload_, papif_get_preload__, PAPIF_GET_PRELOAD] (env, c | len) => {
        env.text_out(len).put_padded("LD_PRELOAD");
        check(c, 0)
    };
    [papif_get_domain, papif_get_domain_, papif_get_domain__, PAPIF_GET_DOMAIN] (es, d, mode, c) => get_setting(es, d, mode, c, true);
    [papif_get_granularity, papif_get_granularity_, papif_get_granularity__, PAPIF_GET_GRANULARITY] (es, g, mode, c) => get_setting(es, g, mode, c, false);
    [papif_set_event_domain, papif_set_event_domain_, papif_set_event_domain__, PAPIF_SET_EVENT_DOMAIN] (es, d, c) => {
        let mut o = options_for(int_of(es));
        o.domain.value = int_of(d);
        check(c, PAPI_set_opt(5, &mut o))
    };
    [papif_set_inherit, papif_set_inherit_, papif_set_inherit__, PAPIF_SET_INHERIT] (_inherit, c) => {
        // PAPI's wrapper names no event set (it passes an uninitialised one).
        check(c, Code::Einval.value())
    };
    [papif_thread_init, papif_thread_init_, papif_thread_init__, PAPIF_THREAD_INIT] (handle, c) => check(c, PAPI_thread_init(crate::raw::id_fn_at(handle.ptr::<c_void>() as usize)));
    [papif_enum_dev_type, papif_enum_dev_type_, papif_enum_dev_type__, PAPIF_ENUM_DEV_TYPE] (_m, _h, c) => check(c, Code::Enosupp.value());
    [papif_get_dev_type_attr, papif_get_dev_type_attr_, papif_get_dev_type_attr__, PAPIF_GET_DEV_TYPE_ATTR] (_h, _a, _v, _s, c | _len) => check(c, Code::Enosupp.value());
    [papif_get_dev_attr, papif_get_dev_attr_, papif_get_dev_attr__, PAPIF_GET_DEV_ATTR] (_h, _i, _a, _v, _s, c | _len) => check(c, Code::Enosupp.value());
}
