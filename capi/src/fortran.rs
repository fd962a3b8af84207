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
#![allow(unsafe_code, non_snake_case, missing_docs, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

use crate::exports::*;
use crate::raw::F;
use crate::{Code, events};

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
}
