//! The machine, the executable, its shared libraries and its memory, in
//! PAPI's structs. Hardware facts come from the substrate's
//! [`HwInfo`](papirus_substrate::hwinfo::HwInfo); the address maps from
//! `/proc/self/maps`; memory from `/proc/self/status`.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};

use crate::events::fill;
use crate::types::{AddressMap, DmemInfo, ExeInfo, HwInfo, MhCache, MhInfo, ShlibInfo};
use crate::{Code, state};

/// `PAPI_get_hardware_info`: built once, valid for the process.
pub fn hardware() -> Result<*const HwInfo, Code> {
    hardware_ref().map(|h| h as *const HwInfo)
}

/// The hardware description `PAPI_get_hardware_info` points to.
pub fn hardware_ref() -> Result<&'static HwInfo, Code> {
    let lib = state::lib()?;
    static INFO: OnceLock<HwInfo> = OnceLock::new();
    Ok(INFO.get_or_init(|| build_hw(lib.hwinfo())))
}

fn build_hw(hw: Option<&papirus_substrate::hwinfo::HwInfo>) -> HwInfo {
    let mut h = HwInfo {
        ncpu: 0,
        threads: 0,
        cores: 0,
        sockets: 0,
        nnodes: 0,
        totalcpus: 0,
        vendor: 0,
        vendor_string: [0; 128],
        model: 0,
        model_string: [0; 128],
        revision: 0.0,
        cpuid_family: 0,
        cpuid_model: 0,
        cpuid_stepping: 0,
        cpu_max_mhz: 0,
        cpu_min_mhz: 0,
        mem_hierarchy: MhInfo::default(),
        virtualized: 0,
        virtual_vendor_string: [0; 128],
        virtual_vendor_version: [0; 128],
        mhz: 0.0,
        clock_mhz: 0,
        reserved: [0; 8],
    };
    let Some(hw) = hw else { return h };
    let n = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
    h.totalcpus = n(hw.cpus);
    h.nnodes = n(hw.numa_nodes.max(1));
    h.ncpu = n(hw.cpus / hw.numa_nodes.max(1));
    h.threads = n(hw.threads_per_core.max(1));
    h.sockets = n(hw.sockets.max(1));
    h.cores = n((hw.cores / hw.sockets.max(1)).max(1));
    h.vendor = match hw.vendor.as_str() {
        "GenuineIntel" => 1,
        "AuthenticAMD" => 2,
        _ => 0,
    };
    fill(&mut h.vendor_string, &hw.vendor);
    fill(&mut h.model_string, hw.model_name.as_deref().unwrap_or(""));
    h.model = hw.model as c_int;
    h.revision = hw.stepping as f32;
    h.cpuid_family = hw.family as c_int;
    h.cpuid_model = hw.model as c_int;
    h.cpuid_stepping = hw.stepping as c_int;
    let mhz = hw.clock.tsc_hz.map_or(0, |hz| (hz / 1e6).round() as c_int);
    h.cpu_max_mhz = mhz;
    h.cpu_min_mhz = mhz;
    if let Some(v) = &hw.hypervisor {
        h.virtualized = 1;
        fill(&mut h.virtual_vendor_string, &v.signature);
    }
    let mut levels = 0;
    for c in &hw.caches {
        let Some(level) = (c.level as usize).checked_sub(1).filter(|&l| l < 4) else { continue };
        let kind = match c.kind.as_str() {
            "Instruction" => 0x1,
            "Data" => 0x2,
            _ => 0x3,
        };
        let slots = &mut h.mem_hierarchy.level[level].cache;
        if let Some(slot) = slots.iter_mut().find(|s| s.type_ == 0) {
            let lines = c.size_bytes.checked_div(c.line_bytes).unwrap_or(0);
            *slot = MhCache {
                type_: kind,
                size: c_int::try_from(c.size_bytes).unwrap_or(c_int::MAX),
                line_size: c_int::try_from(c.line_bytes).unwrap_or(0),
                num_lines: c_int::try_from(lines).unwrap_or(c_int::MAX),
                associativity: c_int::try_from(c.ways).unwrap_or(0),
            };
        }
        levels = levels.max(level + 1);
    }
    h.mem_hierarchy.levels = levels as c_int;
    h
}

/// One mapping of `/proc/self/maps`.
struct Mapping {
    start: usize,
    end: usize,
    perms: String,
    path: String,
}

fn maps() -> Vec<Mapping> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let path = f.nth(3).unwrap_or("").to_string();
            let (a, b) = range.split_once('-')?;
            Some(Mapping {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                perms: perms.to_string(),
                path,
            })
        })
        .collect()
}

/// The address map of the object at `path`: text is its executable
/// mapping, data its writable one, bss the anonymous mapping right after.
fn map_of(all: &[Mapping], path: &str, name: &str) -> AddressMap {
    let mut m = AddressMap {
        name: [0; 1024],
        text_start: std::ptr::null_mut(),
        text_end: std::ptr::null_mut(),
        data_start: std::ptr::null_mut(),
        data_end: std::ptr::null_mut(),
        bss_start: std::ptr::null_mut(),
        bss_end: std::ptr::null_mut(),
    };
    fill(&mut m.name, name);
    let p = |a: usize| a as *mut c_void;
    for (i, x) in all.iter().enumerate().filter(|(_, x)| x.path == path) {
        if x.perms.contains('x') && m.text_start.is_null() {
            (m.text_start, m.text_end) = (p(x.start), p(x.end));
        } else if x.perms.starts_with("rw") {
            (m.data_start, m.data_end) = (p(x.start), p(x.end));
            if let Some(b) = all.get(i + 1).filter(|b| b.path.is_empty() && b.start == x.end) {
                (m.bss_start, m.bss_end) = (p(b.start), p(b.end));
            }
        }
    }
    m
}

/// `PAPI_get_executable_info`: built once, valid for the process.
pub fn executable() -> Result<*const ExeInfo, Code> {
    state::lib()?;
    // An address, since the struct holds pointers (not `Sync`).
    static INFO: OnceLock<usize> = OnceLock::new();
    let a = *INFO.get_or_init(|| Box::leak(Box::new(executable_now())) as *const ExeInfo as usize);
    Ok(a as *const ExeInfo)
}

/// The executable's path and address map, read now.
pub fn executable_now() -> ExeInfo {
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
    let base = exe.rsplit('/').next().unwrap_or("").to_string();
    let mut info = ExeInfo { fullname: [0; 1024], address_info: map_of(&maps(), &exe, &base) };
    fill(&mut info.fullname, &exe);
    info
}

/// `PAPI_get_shared_lib_info`: read again on each call (libraries come
/// and go with dlopen); earlier results stay valid for the process.
pub fn shared_libs() -> Result<*const ShlibInfo, Code> {
    state::lib()?;
    let all = maps();
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
    let mut seen: Vec<&str> = vec![];
    for m in &all {
        if m.path.starts_with('/')
            && m.path != exe
            && m.perms.contains('x')
            && !seen.contains(&m.path.as_str())
        {
            seen.push(&m.path);
        }
    }
    let list: Vec<AddressMap> = seen.iter().map(|p| map_of(&all, p, p)).collect();
    let count = list.len() as c_int;
    let map = Box::leak(list.into_boxed_slice()).as_mut_ptr();
    // Each call's result is kept (PAPI callers never free it).
    static KEEP: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let info = Box::leak(Box::new(ShlibInfo { map, count })) as *const ShlibInfo;
    KEEP.lock().unwrap_or_else(|p| p.into_inner()).push(info as usize);
    Ok(info)
}

/// `PAPI_get_dmem_info`, in kB (pagesize in bytes) as PAPI reports.
pub fn dmem() -> Result<DmemInfo, Code> {
    state::lib()?;
    let status = std::fs::read_to_string("/proc/self/status").map_err(|_| Code::Esys)?;
    let kb = |key: &str| -> i64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let page = 4096;
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let shared_pages: i64 = statm.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(DmemInfo {
        peak: kb("VmPeak:"),
        size: kb("VmSize:"),
        resident: kb("VmRSS:"),
        high_water_mark: kb("VmHWM:"),
        shared: shared_pages * page / 1024,
        text: kb("VmExe:"),
        library: kb("VmLib:"),
        heap: kb("VmData:"),
        locked: kb("VmLck:"),
        stack: kb("VmStk:"),
        pagesize: page,
        pte: kb("VmPTE:"),
    })
}
