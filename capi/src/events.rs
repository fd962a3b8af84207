//! Event names and codes, presets' availability, event information,
//! enumeration, and papirus' PMUs seen as PAPI components.
//!
//! Component 0, `perf_event`, holds the presets and every per-thread perf
//! event: software, hardware, hw-cache, raw, core PMU, tracepoint,
//! breakpoint, uprobe and msr events (so one set may mix them, as PAPI's
//! tools and high-level API expect). Component 1, `perf_event_uncore`,
//! holds the PMUs that count per CPU only (those with a sysfs `cpumask`).
//! Enumeration lists perf's named events and the sysfs PMUs' events;
//! tracepoints (thousands here) are found by name, not enumerated, as PAPI
//! does on machines without debugfs.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, OnceLock};

use papirus_lowlevel::avail::PresetStatus;
use papirus_lowlevel::native::{self, NATIVE_MASK, NativeEvent};
use papirus_lowlevel::preset::{PRESET_MASK, Preset, presets};
use papirus_substrate::Kind;
use papirus_substrate::names;

use crate::types::{ComponentInfo, EventInfo, cmp_bits};
use crate::{Code, state};

/// Presets PAPI 7.0 defines (`PAPI_END_idx`); later ones are not exposed.
pub const PRESETS_7_0: u32 = 108;

/// Component indices.
pub const PERF: usize = 0;
/// The per-CPU (uncore) component.
pub const UNCORE: usize = 1;
/// Number of components.
pub const COMPONENTS: usize = 2;

/// The preset with code `code`, if PAPI 7.0 has it.
pub fn preset(code: u32) -> Option<&'static Preset> {
    if code & 0xC000_0000 != PRESET_MASK || code & !PRESET_MASK >= PRESETS_7_0 {
        return None;
    }
    presets().iter().find(|p| p.code() == code)
}

fn preset_named(name: &str) -> Option<&'static Preset> {
    // PAPI's prefix is case-sensitive, the rest is not.
    let rest = name.strip_prefix("PAPI_")?;
    presets().iter().filter(|p| p.index < PRESETS_7_0).find(|p| p.name[5..].eq_ignore_ascii_case(rest))
}

/// Strips PAPI's `component:::` prefix, checking the component exists.
fn strip_component(name: &str) -> Result<&str, Code> {
    match name.split_once(":::") {
        Some(("perf_event" | "perf_event_uncore", rest)) => Ok(rest),
        Some(_) => Err(Code::Enoevnt),
        None => Ok(name),
    }
}

/// `PAPI_event_name_to_code`.
pub fn name_to_code(name: &str) -> Result<u32, Code> {
    let name = name.trim();
    if name.starts_with("PAPI_") {
        return preset_named(name).map(|p| p.code()).ok_or(Code::Enoevnt);
    }
    let bare = strip_component(name)?;
    native::resolve(bare).map(|r| r.code).map_err(|_| Code::Enoevnt)
}

/// `PAPI_event_code_to_name`.
pub fn code_to_name(code: u32) -> Result<String, Code> {
    match code & 0xC000_0000 {
        PRESET_MASK => preset(code).map(|p| p.name.to_string()).ok_or(Code::Enotpreset),
        NATIVE_MASK => native::name_of(code).ok_or(Code::Enoevnt),
        _ => Err(Code::Enoevnt),
    }
}

/// The component a native name belongs to.
fn native_component(pmu: &str) -> usize {
    let uncore = names::default_parser()
        .ok()
        .and_then(|p| p.pmus().get(pmu).map(|p| p.cpumask.is_some() && !p.is_core()))
        .unwrap_or(false);
    if uncore { UNCORE } else { PERF }
}

/// `PAPI_get_event_component`.
pub fn event_component(code: u32) -> Result<usize, Code> {
    match code & 0xC000_0000 {
        PRESET_MASK => preset(code).map(|_| PERF).ok_or(Code::Enoevnt),
        NATIVE_MASK => {
            let r = native::resolve_code(code).map_err(|_| Code::Enoevnt)?;
            Ok(native_component(&r.parsed.pmu))
        }
        _ => Err(Code::Enoevnt),
    }
}

/// Whether the calling thread can count preset `p` here, cached per
/// process (the answer opens the event once).
pub fn preset_status(p: &'static Preset) -> Result<Arc<PresetStatus>, Code> {
    static CACHE: OnceLock<Mutex<HashMap<u32, Arc<PresetStatus>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(s) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&p.code()) {
        return Ok(s.clone());
    }
    let lib = state::lib()?;
    let s = Arc::new(lib.preset_status(p));
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(p.code(), s.clone());
    Ok(s)
}

/// `PAPI_query_event`: OK only when the event can be added here (nothing
/// is claimed that adding would refuse).
pub fn query(code: u32) -> Result<c_int, Code> {
    state::lib()?;
    match code & 0xC000_0000 {
        PRESET_MASK => {
            let p = preset(code).ok_or(Code::Enotpreset)?;
            if preset_status(p)?.available { Ok(0) } else { Err(Code::Enoevnt) }
        }
        NATIVE_MASK => native::resolve_code(code).map(|_| 0).map_err(|_| Code::Enoevnt),
        _ => Err(Code::Enoevnt),
    }
}

/// The text of a fixed C string field.
pub fn text(src: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = src.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Copies `s` into a fixed C string field, NUL-terminated, truncated.
pub fn fill(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as std::ffi::c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

/// A zeroed `PAPI_event_info_t`.
pub fn blank_info() -> EventInfo {
    EventInfo {
        event_code: 0,
        symbol: [0; 1024],
        short_descr: [0; 64],
        long_descr: [0; 1024],
        component_index: 0,
        units: [0; 64],
        location: 0,
        data_type: 0,
        value_type: 0,
        timescope: 0,
        update_type: 0,
        update_freq: 0,
        count: 0,
        event_type: 0,
        derived: [0; 64],
        postfix: [0; 256],
        code: [0; 12],
        name: [[0; 256]; 12],
        note: [0; 1024],
    }
}

/// `PAPI_get_event_info`. An unavailable preset gives OK with `count` 0
/// and the reason in `note`, as PAPI's `papi_avail` expects.
pub fn info(code: u32) -> Result<EventInfo, Code> {
    let mut info = blank_info();
    info.event_code = code;
    match code & 0xC000_0000 {
        PRESET_MASK => {
            let p = preset(code).ok_or(Code::Enotpreset)?;
            let st = preset_status(p)?;
            fill(&mut info.symbol, p.name);
            // papi_avail lists only presets whose categories match its filter.
            info.event_type = p.categories.0;
            fill(&mut info.short_descr, p.short);
            fill(&mut info.long_descr, p.long);
            if let Some(def) = st.definition.as_ref().filter(|_| st.available) {
                info.count = def.terms.len().min(12) as u32;
                fill(&mut info.derived, def.derivation.papi_name());
                if let papirus_lowlevel::derived::Derivation::Postfix(pf) = &def.derivation {
                    fill(&mut info.postfix, &pf.to_string());
                }
                for (i, t) in def.terms.iter().take(12).enumerate() {
                    fill(&mut info.name[i], t.text());
                    info.code[i] = native::code_of(t.text());
                }
                if let Some(n) = &def.note {
                    fill(&mut info.note, n);
                }
            } else {
                fill(&mut info.derived, "NOT_DERIVED");
                fill(&mut info.note, st.reason.as_deref().unwrap_or("not available here"));
            }
            Ok(info)
        }
        NATIVE_MASK => {
            let r = native::resolve_code(code).map_err(|_| Code::Enoevnt)?;
            fill(&mut info.symbol, &r.name);
            info.component_index = native_component(&r.parsed.pmu) as c_int;
            if let Some(u) = &r.parsed.unit {
                fill(&mut info.units, u);
            }
            let descr = natives()
                .iter()
                .find(|e| e.name == r.name || e.aliases.contains(&r.name))
                .map(|e| e.description.clone())
                .unwrap_or_else(|| format!("{} event {}", r.parsed.pmu, r.name));
            fill(&mut info.long_descr, &descr);
            fill(&mut info.short_descr, &descr);
            Ok(info)
        }
        _ => Err(Code::Enoevnt),
    }
}

/// The native events enumeration offers, in order (tracepoints excluded).
pub fn natives() -> &'static [NativeEvent] {
    static LIST: OnceLock<Vec<NativeEvent>> = OnceLock::new();
    LIST.get_or_init(|| {
        native::enumerate()
            .map(|v| v.into_iter().filter(|e| e.kind != Kind::Tracepoint).collect())
            .unwrap_or_default()
    })
}

fn natives_of(cidx: usize) -> impl Iterator<Item = &'static NativeEvent> {
    natives().iter().filter(move |e| native_component(&e.pmu) == cidx)
}

const ENUM_EVENTS: c_int = 0;
const ENUM_FIRST: c_int = 1;
const NTV_ENUM_UMASKS: c_int = 15;

/// `PAPI_enum_cmp_event` (and `PAPI_enum_event` with `cidx` None): the
/// next code after `*code`, per PAPI's rules.
pub fn enumerate(code: u32, modifier: c_int, cidx: Option<usize>) -> Result<u32, Code> {
    state::lib()?;
    if code & 0xC000_0000 == PRESET_MASK {
        if cidx.is_some_and(|c| c != PERF) {
            return Err(Code::Enocmp);
        }
        let start = if modifier == ENUM_FIRST { 0 } else { (code & !PRESET_MASK) + 1 };
        for idx in start..PRESETS_7_0 {
            let Some(p) = preset(PRESET_MASK | idx) else { continue };
            // PAPI tests the modifier with `& PAPI_PRESET_ENUM_AVAIL`.
            if modifier & 2 != 0 && !preset_status(p)?.available {
                continue;
            }
            return Ok(p.code());
        }
        return Err(Code::Enoevnt);
    }
    if code & 0xC000_0000 != NATIVE_MASK {
        return Err(Code::Einval);
    }
    if modifier == NTV_ENUM_UMASKS {
        // perf's and sysfs' events carry no unit masks to walk.
        return Err(Code::Einval);
    }
    if modifier != ENUM_FIRST && modifier != ENUM_EVENTS {
        return Err(Code::Einval);
    }
    let comps: Vec<usize> = match cidx {
        Some(c) if c < COMPONENTS => vec![c],
        Some(_) => return Err(Code::Enocmp),
        None => (0..COMPONENTS).collect(),
    };
    let mut list = comps.into_iter().flat_map(natives_of);
    let next = if modifier == ENUM_FIRST {
        list.next()
    } else {
        let name = native::name_of(code);
        list.skip_while(|e| Some(&e.name) != name.as_ref()).nth(1)
    };
    // PAPI ends native enumerations with EINVAL.
    next.map(|e| native::code_of(&e.name)).ok_or(Code::Einval)
}

/// A component's description, built once and kept for the process (so
/// the pointer stays valid, as PAPI's do): the enabled one, or the one
/// saying why it is disabled.
pub fn component_info(cidx: usize) -> Option<*const ComponentInfo> {
    // Addresses, since the struct holds C string pointers (not `Sync`).
    static INFOS: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    let (on, off) = *INFOS.get_or_init(build_components).get(cidx)?;
    let by_app = state::with(|s| s.disabled.contains_key(&cidx));
    Some((if by_app { off } else { on }) as *const ComponentInfo)
}

/// Whether component `cidx` is disabled (no PMU of its kind here, or
/// `PAPI_disable_component` before init).
pub fn disabled(cidx: usize) -> bool {
    (cidx == UNCORE && pmus_of(UNCORE).is_empty()) || state::with(|s| s.disabled.contains_key(&cidx))
}

fn pmus_of(cidx: usize) -> Vec<String> {
    names::default_parser()
        .map(|p| {
            p.pmus()
                .pmus()
                .iter()
                .filter(|p| native_component(&p.name) == cidx)
                .map(|p| p.name.clone())
                .collect()
        })
        .unwrap_or_default()
}

fn leak_cstr(s: &str) -> *const std::ffi::c_char {
    let c = std::ffi::CString::new(s).unwrap_or_default();
    c.into_raw()
}

fn build_components() -> Vec<(usize, usize)> {
    let lib = papirus_lowlevel::init().ok();
    let counters = lib.as_ref().and_then(|l| l.machine().hw_counters).unwrap_or(0) as c_int;
    let mut out = vec![];
    for cidx in 0..COMPONENTS {
        let mut c = ComponentInfo {
            name: [0; 128],
            short_name: [0; 64],
            description: [0; 128],
            version: [0; 64],
            support_version: [0; 64],
            kernel_version: [0; 64],
            disabled_reason: [0; 1024],
            disabled: 0,
            initialized: 1,
            cmp_idx: cidx as c_int,
            num_cntrs: 0,
            num_mpx_cntrs: 384,
            num_preset_events: 0,
            num_native_events: natives_of(cidx).count() as c_int,
            default_domain: 1,
            available_domains: 1 | 2 | 8,
            default_granularity: 1,
            available_granularities: 1 | 2 | 8,
            hardware_intr_sig: papirus_substrate::signal::default_signal(),
            component_type: 0,
            pmu_names: [std::ptr::null(); 80],
            reserved: [0; 8],
            bits: cmp_bits::HARDWARE_INTR
                | cmp_bits::KERNEL_PROFILE
                | cmp_bits::KERNEL_MULTIPLEX
                | cmp_bits::FAST_REAL_TIMER
                | cmp_bits::FAST_VIRTUAL_TIMER
                | cmp_bits::ATTACH
                | cmp_bits::ATTACH_MUST_PTRACE
                | cmp_bits::CPU
                | cmp_bits::INHERIT,
        };
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        fill(&mut c.kernel_version, kernel.trim());
        fill(&mut c.version, "papirus 0.1");
        fill(&mut c.support_version, "perf_event_open(2)");
        let pmus: Vec<String> = if cidx == PERF {
            fill(&mut c.name, "perf_event");
            fill(&mut c.short_name, "perf");
            fill(
                &mut c.description,
                "papirus: Linux perf_event per-thread events (software, hardware, tracepoint, breakpoint, uprobe, msr)",
            );
            c.num_cntrs = counters;
            c.num_preset_events = presets()
                .iter()
                .filter(|p| p.index < PRESETS_7_0)
                .filter(|p| preset_status(p).is_ok_and(|s| s.available))
                .count() as c_int;
            let mut v = vec!["perf".to_string(), "perf_raw".to_string()];
            v.extend(pmus_of(PERF));
            v
        } else {
            fill(&mut c.name, "perf_event_uncore");
            fill(&mut c.short_name, "peu");
            fill(&mut c.description, "papirus: Linux perf_event per-CPU (uncore) PMUs");
            c.default_domain = 15;
            c.default_granularity = 8;
            c.hardware_intr_sig = 0;
            c.bits &= !(cmp_bits::HARDWARE_INTR | cmp_bits::KERNEL_PROFILE | cmp_bits::FAST_VIRTUAL_TIMER);
            let v = pmus_of(UNCORE);
            if v.is_empty() {
                c.disabled = Code::Enocntr.value();
                fill(&mut c.disabled_reason, "no per-CPU (uncore) PMU is exposed to this machine");
            }
            v
        };

        for (slot, name) in c.pmu_names.iter_mut().zip(pmus.iter()) {
            *slot = leak_cstr(name);
        }
        let mut off = c;
        off.disabled = Code::EcmpDisabled.value();
        fill(&mut off.disabled_reason, "disabled by the application (PAPI_disable_component)");
        let leak = |c: ComponentInfo| Box::leak(Box::new(c)) as *const ComponentInfo as usize;
        out.push((leak(c), leak(off)));
    }
    out
}

/// `PAPI_get_component_index`: by exact name.
pub fn component_index(name: &str) -> Result<c_int, Code> {
    match name {
        "perf_event" => Ok(PERF as c_int),
        "perf_event_uncore" => Ok(UNCORE as c_int),
        _ => Err(Code::Enocmp),
    }
}
