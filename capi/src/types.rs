//! `#[repr(C)]` mirrors of the structs `papi.h` declares, with PAPI 7.0's
//! sizes and field offsets asserted at compile time (the same figures the
//! tests measure with gcc against Debian's header).

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::mem::{offset_of, size_of};

/// `PAPI_MIN_STR_LEN`.
pub const MIN_STR: usize = 64;
/// `PAPI_MAX_STR_LEN`.
pub const MAX_STR: usize = 128;
/// `PAPI_2MAX_STR_LEN`.
pub const MAX2_STR: usize = 256;
/// `PAPI_HUGE_STR_LEN`.
pub const HUGE_STR: usize = 1024;
/// `PAPI_PMU_MAX`.
pub const PMU_MAX: usize = 80;
/// `PAPI_MAX_INFO_TERMS`.
pub const MAX_INFO_TERMS: usize = 12;

/// `PAPI_event_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct EventInfo {
    pub event_code: c_uint,
    pub symbol: [c_char; HUGE_STR],
    pub short_descr: [c_char; MIN_STR],
    pub long_descr: [c_char; HUGE_STR],
    pub component_index: c_int,
    pub units: [c_char; MIN_STR],
    pub location: c_int,
    pub data_type: c_int,
    pub value_type: c_int,
    pub timescope: c_int,
    pub update_type: c_int,
    pub update_freq: c_int,
    pub count: c_uint,
    pub event_type: c_uint,
    pub derived: [c_char; MIN_STR],
    pub postfix: [c_char; MAX2_STR],
    pub code: [c_uint; MAX_INFO_TERMS],
    pub name: [[c_char; MAX2_STR]; MAX_INFO_TERMS],
    pub note: [c_char; HUGE_STR],
}

/// `PAPI_mh_tlb_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct MhTlb {
    pub type_: c_int,
    pub num_entries: c_int,
    pub page_size: c_int,
    pub associativity: c_int,
}

/// `PAPI_mh_cache_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct MhCache {
    pub type_: c_int,
    pub size: c_int,
    pub line_size: c_int,
    pub num_lines: c_int,
    pub associativity: c_int,
}

/// `PAPI_mh_level_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct MhLevel {
    pub tlb: [MhTlb; 6],
    pub cache: [MhCache; 6],
}

/// `PAPI_mh_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct MhInfo {
    pub levels: c_int,
    pub level: [MhLevel; 4],
}

/// `PAPI_hw_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct HwInfo {
    pub ncpu: c_int,
    pub threads: c_int,
    pub cores: c_int,
    pub sockets: c_int,
    pub nnodes: c_int,
    pub totalcpus: c_int,
    pub vendor: c_int,
    pub vendor_string: [c_char; MAX_STR],
    pub model: c_int,
    pub model_string: [c_char; MAX_STR],
    pub revision: f32,
    pub cpuid_family: c_int,
    pub cpuid_model: c_int,
    pub cpuid_stepping: c_int,
    pub cpu_max_mhz: c_int,
    pub cpu_min_mhz: c_int,
    pub mem_hierarchy: MhInfo,
    pub virtualized: c_int,
    pub virtual_vendor_string: [c_char; MAX_STR],
    pub virtual_vendor_version: [c_char; MAX_STR],
    pub mhz: f32,
    pub clock_mhz: c_int,
    pub reserved: [c_int; 8],
}

/// `PAPI_component_info_t`; the C bitfields are one `u32` (see [`cmp_bits`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct ComponentInfo {
    pub name: [c_char; MAX_STR],
    pub short_name: [c_char; MIN_STR],
    pub description: [c_char; MAX_STR],
    pub version: [c_char; MIN_STR],
    pub support_version: [c_char; MIN_STR],
    pub kernel_version: [c_char; MIN_STR],
    pub disabled_reason: [c_char; HUGE_STR],
    pub disabled: c_int,
    pub initialized: c_int,
    pub cmp_idx: c_int,
    pub num_cntrs: c_int,
    pub num_mpx_cntrs: c_int,
    pub num_preset_events: c_int,
    pub num_native_events: c_int,
    pub default_domain: c_int,
    pub available_domains: c_int,
    pub default_granularity: c_int,
    pub available_granularities: c_int,
    pub hardware_intr_sig: c_int,
    pub component_type: c_int,
    pub pmu_names: [*const c_char; PMU_MAX],
    pub reserved: [c_int; 8],
    pub bits: c_uint,
}

/// The capability bits of [`ComponentInfo::bits`], as gcc lays out the
/// bitfields on x86-64 (first field in the lowest bit).
pub mod cmp_bits {
    #![allow(missing_docs)]
    pub const HARDWARE_INTR: u32 = 1 << 0;
    pub const PRECISE_INTR: u32 = 1 << 1;
    pub const POSIX1B_TIMERS: u32 = 1 << 2;
    pub const KERNEL_PROFILE: u32 = 1 << 3;
    pub const KERNEL_MULTIPLEX: u32 = 1 << 4;
    pub const FAST_COUNTER_READ: u32 = 1 << 5;
    pub const FAST_REAL_TIMER: u32 = 1 << 6;
    pub const FAST_VIRTUAL_TIMER: u32 = 1 << 7;
    pub const ATTACH: u32 = 1 << 8;
    pub const ATTACH_MUST_PTRACE: u32 = 1 << 9;
    pub const CNTR_UMASKS: u32 = 1 << 10;
    pub const CPU: u32 = 1 << 11;
    pub const INHERIT: u32 = 1 << 12;
}

/// `PAPI_address_map_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct AddressMap {
    pub name: [c_char; HUGE_STR],
    pub text_start: *mut c_void,
    pub text_end: *mut c_void,
    pub data_start: *mut c_void,
    pub data_end: *mut c_void,
    pub bss_start: *mut c_void,
    pub bss_end: *mut c_void,
}

/// `PAPI_exe_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct ExeInfo {
    pub fullname: [c_char; HUGE_STR],
    pub address_info: AddressMap,
}

/// `PAPI_shlib_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct ShlibInfo {
    pub map: *mut AddressMap,
    pub count: c_int,
}

/// `PAPI_dmem_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct DmemInfo {
    pub peak: i64,
    pub size: i64,
    pub resident: i64,
    pub high_water_mark: i64,
    pub shared: i64,
    pub text: i64,
    pub library: i64,
    pub heap: i64,
    pub locked: i64,
    pub stack: i64,
    pub pagesize: i64,
    pub pte: i64,
}

/// `PAPI_sprofil_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct Sprofil {
    pub pr_base: *mut c_void,
    pub pr_size: c_uint,
    pub pr_off: *mut c_void,
    pub pr_scale: c_uint,
}

/// `PAPI_all_thr_spec_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct AllThrSpec {
    pub num: c_int,
    pub id: *mut c_ulong,
    pub data: *mut *mut c_void,
}

/// `PAPI_preload_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct PreloadInfo {
    pub lib_preload_env: [c_char; MAX_STR],
    pub lib_preload_sep: c_char,
    pub lib_dir_env: [c_char; MAX_STR],
    pub lib_dir_sep: c_char,
}

/// `PAPI_debug_option_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct DebugOption {
    pub level: c_int,
    pub handler: Option<unsafe extern "C" fn(c_int) -> c_int>,
}

/// `PAPI_domain_option_t` and `PAPI_granularity_option_t` (same shape).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct DomainOption {
    pub def_cidx: c_int,
    pub eventset: c_int,
    pub value: c_int,
}

/// `PAPI_attach_option_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct AttachOption {
    pub eventset: c_int,
    pub tid: c_ulong,
}

/// `PAPI_cpu_option_t` and `PAPI_inherit_option_t` (two ints).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct PairOption {
    pub eventset: c_int,
    pub value: c_int,
}

/// `PAPI_multiplex_option_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct MultiplexOption {
    pub eventset: c_int,
    pub ns: c_int,
    pub flags: c_int,
}

/// `PAPI_itimer_option_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct ItimerOption {
    pub itimer_num: c_int,
    pub itimer_sig: c_int,
    pub ns: c_int,
    pub flags: c_int,
}

/// `PAPI_addr_range_option_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct AddrRangeOption {
    pub eventset: c_int,
    pub start: *mut c_void,
    pub end: *mut c_void,
    pub start_off: c_int,
    pub end_off: c_int,
}

/// `PAPI_option_t`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub union Option_ {
    pub preload: PreloadInfo,
    pub debug: DebugOption,
    pub domain: DomainOption,
    pub attach: AttachOption,
    pub pair: PairOption,
    pub multiplex: MultiplexOption,
    pub itimer: ItimerOption,
    pub addr: AddrRangeOption,
    pub ptr: *mut c_void,
}

impl std::fmt::Debug for Option_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PAPI_option_t")
    }
}

// PAPI 7.0's layout, x86-64 (LP64).
const _: () = {
    assert!(size_of::<EventInfo>() == 6680);
    assert!(offset_of!(EventInfo, symbol) == 4);
    assert!(offset_of!(EventInfo, short_descr) == 1028);
    assert!(offset_of!(EventInfo, long_descr) == 1092);
    assert!(offset_of!(EventInfo, component_index) == 2116);
    assert!(offset_of!(EventInfo, units) == 2120);
    assert!(offset_of!(EventInfo, location) == 2184);
    assert!(offset_of!(EventInfo, update_freq) == 2204);
    assert!(offset_of!(EventInfo, count) == 2208);
    assert!(offset_of!(EventInfo, event_type) == 2212);
    assert!(offset_of!(EventInfo, derived) == 2216);
    assert!(offset_of!(EventInfo, postfix) == 2280);
    assert!(offset_of!(EventInfo, code) == 2536);
    assert!(offset_of!(EventInfo, name) == 2584);
    assert!(offset_of!(EventInfo, note) == 5656);

    assert!(size_of::<MhTlb>() == 16);
    assert!(size_of::<MhCache>() == 20);
    assert!(size_of::<MhLevel>() == 216);
    assert!(offset_of!(MhLevel, cache) == 96);
    assert!(size_of::<MhInfo>() == 868);
    assert!(size_of::<HwInfo>() == 1480);
    assert!(offset_of!(HwInfo, vendor_string) == 28);
    assert!(offset_of!(HwInfo, model) == 156);
    assert!(offset_of!(HwInfo, model_string) == 160);
    assert!(offset_of!(HwInfo, revision) == 288);
    assert!(offset_of!(HwInfo, cpuid_family) == 292);
    assert!(offset_of!(HwInfo, cpu_max_mhz) == 304);
    assert!(offset_of!(HwInfo, cpu_min_mhz) == 308);
    assert!(offset_of!(HwInfo, mem_hierarchy) == 312);
    assert!(offset_of!(HwInfo, virtualized) == 1180);
    assert!(offset_of!(HwInfo, virtual_vendor_string) == 1184);
    assert!(offset_of!(HwInfo, virtual_vendor_version) == 1312);
    assert!(offset_of!(HwInfo, mhz) == 1440);
    assert!(offset_of!(HwInfo, clock_mhz) == 1444);
    assert!(offset_of!(HwInfo, reserved) == 1448);

    assert!(size_of::<ComponentInfo>() == 2272);
    assert!(offset_of!(ComponentInfo, short_name) == 128);
    assert!(offset_of!(ComponentInfo, description) == 192);
    assert!(offset_of!(ComponentInfo, version) == 320);
    assert!(offset_of!(ComponentInfo, support_version) == 384);
    assert!(offset_of!(ComponentInfo, kernel_version) == 448);
    assert!(offset_of!(ComponentInfo, disabled_reason) == 512);
    assert!(offset_of!(ComponentInfo, disabled) == 1536);
    assert!(offset_of!(ComponentInfo, component_type) == 1584);
    assert!(offset_of!(ComponentInfo, pmu_names) == 1592);
    assert!(offset_of!(ComponentInfo, reserved) == 2232);
    assert!(offset_of!(ComponentInfo, bits) == 2264);

    assert!(size_of::<AddressMap>() == 1072);
    assert!(offset_of!(AddressMap, text_start) == 1024);
    assert!(offset_of!(AddressMap, bss_end) == 1064);
    assert!(size_of::<ExeInfo>() == 2096);
    assert!(offset_of!(ExeInfo, address_info) == 1024);
    assert!(size_of::<ShlibInfo>() == 16);
    assert!(offset_of!(ShlibInfo, count) == 8);
    assert!(size_of::<DmemInfo>() == 96);
    assert!(offset_of!(DmemInfo, pte) == 88);
    assert!(size_of::<Sprofil>() == 32);
    assert!(offset_of!(Sprofil, pr_size) == 8);
    assert!(offset_of!(Sprofil, pr_off) == 16);
    assert!(offset_of!(Sprofil, pr_scale) == 24);
    assert!(size_of::<AllThrSpec>() == 24);
    assert!(offset_of!(AllThrSpec, data) == 16);

    assert!(size_of::<PreloadInfo>() == 258);
    assert!(offset_of!(PreloadInfo, lib_dir_env) == 129);
    assert!(size_of::<DebugOption>() == 16);
    assert!(offset_of!(DebugOption, handler) == 8);
    assert!(size_of::<DomainOption>() == 12);
    assert!(size_of::<AttachOption>() == 16);
    assert!(offset_of!(AttachOption, tid) == 8);
    assert!(size_of::<MultiplexOption>() == 12);
    assert!(size_of::<ItimerOption>() == 16);
    assert!(size_of::<AddrRangeOption>() == 32);
    assert!(offset_of!(AddrRangeOption, start_off) == 24);
    assert!(size_of::<Option_>() == 264);
};
