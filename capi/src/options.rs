//! `PAPI_set_opt`, `PAPI_get_opt` and `PAPI_get_cmp_opt`: PAPI's option
//! codes onto the event sets' options and the process defaults.

use std::ffi::{c_int, c_void};

use papirus_lowlevel::Granularity;

use crate::raw::Ptr;
use crate::types::{ItimerOption, Option_, PreloadInfo};
use crate::{Code, events, info, sets, state};

/// Option codes (`papi.h`).
#[allow(missing_docs)]
pub mod opt {
    pub const DETACH: i32 = 1;
    pub const DEBUG: i32 = 2;
    pub const MULTIPLEX: i32 = 3;
    pub const DEFDOM: i32 = 4;
    pub const DOMAIN: i32 = 5;
    pub const DEFGRN: i32 = 6;
    pub const GRANUL: i32 = 7;
    pub const DEF_MPX_NS: i32 = 8;
    pub const MAX_MPX_CTRS: i32 = 11;
    pub const PRELOAD: i32 = 13;
    pub const CLOCKRATE: i32 = 14;
    pub const MAX_HWCTRS: i32 = 15;
    pub const HWINFO: i32 = 16;
    pub const EXEINFO: i32 = 17;
    pub const MAX_CPUS: i32 = 18;
    pub const ATTACH: i32 = 19;
    pub const SHLIBINFO: i32 = 20;
    pub const LIB_VERSION: i32 = 21;
    pub const COMPONENTINFO: i32 = 22;
    pub const DATA_ADDRESS: i32 = 23;
    pub const INSTR_ADDRESS: i32 = 24;
    pub const DEF_ITIMER: i32 = 25;
    pub const DEF_ITIMER_NS: i32 = 26;
    pub const CPU_ATTACH: i32 = 27;
    pub const INHERIT: i32 = 28;
    pub const USER_EVENTS_FILE: i32 = 29;
}

/// The multiplexing and itimer period PAPI reports (10 ms).
const DEF_NS: c_int = 10_000_000;

/// `PAPI_set_opt`.
pub fn set(option: c_int, p: Ptr<Option_>) -> Result<c_int, Code> {
    if option == opt::DEBUG {
        let o = p.get()?;
        let level = union_debug_level(&o);
        if !(0..=2).contains(&level) {
            return Err(Code::Einval);
        }
        state::with(|s| s.debug = level);
        return Ok(0);
    }
    state::lib()?;
    let o = p.get()?;
    let (es, value) = union_triplet(&o);
    match option {
        opt::DEFDOM => {
            sets::to_domain(value).map_err(|_| Code::Einval)?;
            state::set_default_domain(value);
            Ok(0)
        }
        opt::DOMAIN => sets::set_domain(es, value),
        opt::DEFGRN => match value {
            1 | 2 | 8 => {
                state::set_default_granularity(value);
                Ok(0)
            }
            _ => Err(Code::Einval),
        },
        opt::GRANUL => sets::set_granularity(es, value),
        opt::MULTIPLEX => sets::set_multiplex(union_pair(&o).0),
        opt::DEF_MPX_NS | opt::DEF_ITIMER_NS | opt::DEF_ITIMER => {
            let ns = if option == opt::DEF_ITIMER { union_itimer(&o).ns } else { union_pair(&o).1 };
            if ns < 0 { Err(Code::Einval) } else { Ok(0) }
        }
        opt::ATTACH => {
            let (es, tid) = union_attach(&o);
            sets::attach(es, tid)
        }
        opt::DETACH => sets::detach(union_attach(&o).0),
        opt::CPU_ATTACH => {
            let (es, cpu) = union_pair(&o);
            sets::set_cpu(es, cpu as u32)
        }
        opt::INHERIT => {
            let (es, on) = union_pair(&o);
            sets::set_inherit(es, on != 0)
        }
        opt::DATA_ADDRESS | opt::INSTR_ADDRESS => Err(Code::Enosupp),
        opt::USER_EVENTS_FILE => Ok(0),
        _ => Err(Code::Einval),
    }
}

/// `PAPI_get_opt`: a value returned, or the option filled in.
pub fn get(option: c_int, p: Ptr<Option_>) -> Result<c_int, Code> {
    match option {
        opt::LIB_VERSION => return Ok(state::VER_CURRENT),
        opt::DEBUG => {
            let level = state::with(|s| s.debug);
            let mut o = p.get()?;
            o.debug = crate::types::DebugOption { level, handler: None };
            p.set(o)?;
            return Ok(0);
        }
        _ => {}
    }
    let lib = state::lib()?;
    let ptr_out = |v: *const c_void| -> Result<c_int, Code> {
        let mut o = p.get()?;
        o.ptr = v.cast_mut();
        p.set(o)?;
        Ok(0)
    };
    match option {
        opt::DEFDOM => Ok(state::defaults().0),
        opt::DEFGRN => Ok(state::defaults().1),
        opt::MAX_MPX_CTRS => Ok(384),
        opt::MAX_HWCTRS => Ok(lib.machine().hw_counters.unwrap_or(0) as c_int),
        opt::CLOCKRATE => {
            Ok(papirus_substrate::clock::clock().tsc_hz().map_or(0, |h| (h / 1e6).round() as c_int))
        }
        opt::MAX_CPUS => Ok(lib.machine().cpus as c_int),
        opt::HWINFO => ptr_out(info::hardware()?.cast()),
        opt::EXEINFO => ptr_out(info::executable()?.cast()),
        opt::SHLIBINFO => ptr_out(info::shared_libs()?.cast()),
        opt::COMPONENTINFO => ptr_out(events::component_info(events::PERF).ok_or(Code::Ebug)?.cast()),
        opt::PRELOAD => {
            let mut pre = PreloadInfo {
                lib_preload_env: [0; 128],
                lib_preload_sep: b' ' as _,
                lib_dir_env: [0; 128],
                lib_dir_sep: b':' as _,
            };
            events::fill(&mut pre.lib_preload_env, "LD_PRELOAD");
            events::fill(&mut pre.lib_dir_env, "LD_LIBRARY_PATH");
            let mut o = p.get()?;
            o.preload = pre;
            p.set(o)?;
            Ok(0)
        }
        opt::DEF_MPX_NS | opt::DEF_ITIMER_NS => {
            let mut o = p.get()?;
            o.multiplex.ns = DEF_NS;
            p.set(o)?;
            Ok(DEF_NS)
        }
        opt::DEF_ITIMER => {
            let mut o = p.get()?;
            o.itimer = ItimerOption { itimer_num: 2, itimer_sig: libc::SIGPROF, ns: DEF_NS, flags: 0 };
            p.set(o)?;
            Ok(0)
        }
        opt::DOMAIN
        | opt::GRANUL
        | opt::INHERIT
        | opt::CPU_ATTACH
        | opt::ATTACH
        | opt::DETACH
        | opt::MULTIPLEX => {
            let mut o = p.get()?;
            let es = union_pair(&o).0;
            let (options, status) = sets::with(es, |s| Ok((s.set.options(), s.set.status())))?;
            let r = match option {
                opt::DOMAIN => {
                    let v = sets::domain_bits(options.domain);
                    o.domain.value = v;
                    v
                }
                opt::GRANUL => {
                    let v = match options.granularity {
                        Granularity::Thread => 1,
                        Granularity::Process => 2,
                        Granularity::System => 8,
                    };
                    o.domain.value = v;
                    v
                }
                opt::INHERIT => {
                    let v = c_int::from(options.granularity == Granularity::Process);
                    o.pair.value = v;
                    v
                }
                opt::CPU_ATTACH => {
                    o.pair.value = options.cpu.map_or(0, |c| c as c_int);
                    c_int::from(status.cpu_attached)
                }
                opt::ATTACH => {
                    o.attach.tid = options.attached.map_or(0, |p| p as u64);
                    c_int::from(status.attached)
                }
                opt::DETACH => c_int::from(!status.attached),
                _ => {
                    o.multiplex.ns = DEF_NS;
                    o.multiplex.flags = 0;
                    c_int::from(status.multiplexing)
                }
            };
            p.set(o)?;
            Ok(r)
        }
        _ => Err(Code::Einval),
    }
}

/// `PAPI_get_cmp_opt`.
pub fn get_cmp(option: c_int, p: Ptr<Option_>, cidx: c_int) -> Result<c_int, Code> {
    let c = usize::try_from(cidx).ok().filter(|&c| c < events::COMPONENTS).ok_or(Code::Ecmp)?;
    let lib = state::lib()?;
    match option {
        opt::MAX_HWCTRS => {
            Ok(if c == events::PERF { lib.machine().hw_counters.unwrap_or(0) as c_int } else { 0 })
        }
        opt::MAX_MPX_CTRS => Ok(384),
        opt::DEFDOM => Ok(if c == events::PERF { state::defaults().0 } else { 15 }),
        opt::DEFGRN => Ok(if c == events::PERF { state::defaults().1 } else { 8 }),
        opt::SHLIBINFO => {
            if p.is_null() {
                return Err(Code::Einval);
            }
            get(option, p)
        }
        opt::COMPONENTINFO => {
            let mut o = p.get()?;
            o.ptr = events::component_info(c).ok_or(Code::Ecmp)?.cast_mut().cast();
            p.set(o)?;
            Ok(0)
        }
        _ => Err(Code::Einval),
    }
}

// The union's members read here are plain integers at offset 0; which one
// the caller filled is given by the option code, as in C.
fn union_triplet(o: &Option_) -> (c_int, c_int) {
    let d = union_domain(o);
    (d.0, d.1)
}

fn union_domain(o: &Option_) -> (c_int, c_int) {
    let raw = union_ints(o);
    (raw[1], raw[2])
}

fn union_pair(o: &Option_) -> (c_int, c_int) {
    let raw = union_ints(o);
    (raw[0], raw[1])
}

fn union_itimer(o: &Option_) -> ItimerOption {
    let raw = union_ints(o);
    ItimerOption { itimer_num: raw[0], itimer_sig: raw[1], ns: raw[2], flags: raw[3] }
}

fn union_debug_level(o: &Option_) -> c_int {
    union_ints(o)[0]
}

fn union_attach(o: &Option_) -> (c_int, u64) {
    let raw = union_ints(o);
    (raw[0], (raw[2] as u32 as u64) | ((raw[3] as u32 as u64) << 32))
}

/// The union's first 16 bytes as four ints (every option read here fits).
fn union_ints(o: &Option_) -> [c_int; 4] {
    crate::raw::union_ints(o)
}
