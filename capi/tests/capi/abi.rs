//! The binary interface against Debian's PAPI 7.0: struct layouts, every
//! `#define` both headers share, the exported symbols and the SONAME.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use papi::types;
use papirus_testkit::{Cc, skip};

use crate::common::{env, include_dir, library};

/// (struct, field or "" for the size) pairs of every struct papi.h exports.
const LAYOUT: &[(&str, &[&str])] = &[
    (
        "PAPI_event_info_t",
        &[
            "event_code",
            "symbol",
            "short_descr",
            "long_descr",
            "component_index",
            "units",
            "location",
            "data_type",
            "value_type",
            "timescope",
            "update_type",
            "update_freq",
            "count",
            "event_type",
            "derived",
            "postfix",
            "code",
            "name",
            "note",
        ],
    ),
    (
        "PAPI_hw_info_t",
        &[
            "ncpu",
            "threads",
            "cores",
            "sockets",
            "nnodes",
            "totalcpus",
            "vendor",
            "vendor_string",
            "model",
            "model_string",
            "revision",
            "cpuid_family",
            "cpuid_model",
            "cpuid_stepping",
            "cpu_max_mhz",
            "cpu_min_mhz",
            "mem_hierarchy",
            "virtualized",
            "virtual_vendor_string",
            "virtual_vendor_version",
            "mhz",
            "clock_mhz",
            "reserved",
        ],
    ),
    ("PAPI_mh_info_t", &["levels", "level"]),
    ("PAPI_mh_level_t", &["tlb", "cache"]),
    ("PAPI_mh_tlb_info_t", &["type", "num_entries", "page_size", "associativity"]),
    ("PAPI_mh_cache_info_t", &["type", "size", "line_size", "num_lines", "associativity"]),
    (
        "PAPI_component_info_t",
        &[
            "name",
            "short_name",
            "description",
            "version",
            "support_version",
            "kernel_version",
            "disabled_reason",
            "disabled",
            "initialized",
            "CmpIdx",
            "num_cntrs",
            "num_mpx_cntrs",
            "num_preset_events",
            "num_native_events",
            "default_domain",
            "available_domains",
            "default_granularity",
            "available_granularities",
            "hardware_intr_sig",
            "component_type",
            "pmu_names",
            "reserved",
        ],
    ),
    (
        "PAPI_address_map_t",
        &["name", "text_start", "text_end", "data_start", "data_end", "bss_start", "bss_end"],
    ),
    ("PAPI_exe_info_t", &["fullname", "address_info"]),
    ("PAPI_shlib_info_t", &["map", "count"]),
    (
        "PAPI_dmem_info_t",
        &[
            "peak",
            "size",
            "resident",
            "high_water_mark",
            "shared",
            "text",
            "library",
            "heap",
            "locked",
            "stack",
            "pagesize",
            "pte",
        ],
    ),
    ("PAPI_sprofil_t", &["pr_base", "pr_size", "pr_off", "pr_scale"]),
    ("PAPI_all_thr_spec_t", &["num", "id", "data"]),
    ("PAPI_preload_info_t", &["lib_preload_env", "lib_preload_sep", "lib_dir_env", "lib_dir_sep"]),
    ("PAPI_debug_option_t", &["level", "handler"]),
    ("PAPI_domain_option_t", &["def_cidx", "eventset", "domain"]),
    ("PAPI_granularity_option_t", &["def_cidx", "eventset", "granularity"]),
    ("PAPI_inherit_option_t", &["eventset", "inherit"]),
    ("PAPI_attach_option_t", &["eventset", "tid"]),
    ("PAPI_cpu_option_t", &["eventset", "cpu_num"]),
    ("PAPI_multiplex_option_t", &["eventset", "ns", "flags"]),
    ("PAPI_itimer_option_t", &["itimer_num", "itimer_sig", "ns", "flags"]),
    ("PAPI_addr_range_option_t", &["eventset", "start", "end", "start_off", "end_off"]),
    ("PAPI_mpx_info_t", &["timer_sig", "timer_num", "timer_us"]),
    (
        "PAPI_option_t",
        &[
            "preload",
            "debug",
            "inherit",
            "granularity",
            "defgranularity",
            "domain",
            "defdomain",
            "attach",
            "cpu",
            "multiplex",
            "itimer",
            "hw_info",
            "shlib_info",
            "exe_info",
            "cmp_info",
            "addr",
            "events_file",
        ],
    ),
];

fn layout_program() -> String {
    let mut s =
        String::from("#include <stdio.h>\n#include <stddef.h>\n#include <papi.h>\nint main(void) {\n");
    for (ty, fields) in LAYOUT {
        s += &format!("  printf(\"{ty} %zu %zu\\n\", sizeof({ty}), _Alignof({ty}));\n");
        for f in *fields {
            s += &format!(
                "  printf(\"{ty}.{f} %zu %zu\\n\", offsetof({ty}, {f}), sizeof((({ty} *)0)->{f}));\n"
            );
        }
    }
    // The bitfield word of PAPI_component_info_t: which bit each flag is.
    s += "  { PAPI_component_info_t c; unsigned *w = (unsigned *)((char *)&c + offsetof(PAPI_component_info_t, reserved) + sizeof c.reserved);\n";
    for f in [
        "hardware_intr",
        "precise_intr",
        "posix1b_timers",
        "kernel_profile",
        "kernel_multiplex",
        "fast_counter_read",
        "fast_real_timer",
        "fast_virtual_timer",
        "attach",
        "attach_must_ptrace",
        "cntr_umasks",
        "cpu",
        "inherit",
    ] {
        s += &format!("    *w = 0; c.{f} = 1; printf(\"bit.{f} %u\\n\", *w);\n");
    }
    s += "  }\n  return 0;\n}\n";
    s
}

fn run_with(dir: &Path, name: &str, text: &str, include: Option<&Path>) -> String {
    let mut cc = Cc::from_text(dir, &format!("{name}.c"), text);
    if let Some(i) = include {
        cc.arg(format!("-I{}", i.display()));
    }
    let exe = cc.build(dir, name);
    let o = Command::new(&exe).output().unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

fn debian_or_skip() -> bool {
    match &env().debian {
        Ok(()) => true,
        Err(e) => {
            skip(format!("Debian's libpapi-dev is not available: {e}"));
            false
        }
    }
}

#[test]
fn struct_layouts_match_debian_and_the_rust_mirrors() {
    if !debian_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = layout_program();
    let ours = run_with(dir.path(), "layout_ours", &text, Some(&include_dir()));
    let theirs = run_with(dir.path(), "layout_debian", &text, None);
    assert_eq!(ours, theirs, "papirus' papi.h lays out a struct differently from Debian's");
    let got: BTreeMap<&str, Vec<usize>> = ours
        .lines()
        .map(|l| {
            let mut w = l.split(' ');
            (w.next().unwrap(), w.map(|n| n.parse().unwrap()).collect())
        })
        .collect();
    // The Rust mirrors the library fills agree with the C compiler.
    let check = |key: &str, rust: usize| assert_eq!(got[key][0], rust, "{key}");
    check("PAPI_event_info_t", size_of::<types::EventInfo>());
    check("PAPI_event_info_t.note", offset_of!(types::EventInfo, note));
    check("PAPI_event_info_t.name", offset_of!(types::EventInfo, name));
    check("PAPI_hw_info_t", size_of::<types::HwInfo>());
    check("PAPI_hw_info_t.mem_hierarchy", offset_of!(types::HwInfo, mem_hierarchy));
    check("PAPI_hw_info_t.virtualized", offset_of!(types::HwInfo, virtualized));
    check("PAPI_component_info_t", size_of::<types::ComponentInfo>());
    check("PAPI_component_info_t.pmu_names", offset_of!(types::ComponentInfo, pmu_names));
    check("PAPI_exe_info_t", size_of::<types::ExeInfo>());
    check("PAPI_shlib_info_t", size_of::<types::ShlibInfo>());
    check("PAPI_dmem_info_t", size_of::<types::DmemInfo>());
    check("PAPI_sprofil_t", size_of::<types::Sprofil>());
    check("PAPI_sprofil_t.pr_scale", offset_of!(types::Sprofil, pr_scale));
    check("PAPI_option_t", size_of::<types::Option_>());
    check("PAPI_all_thr_spec_t", size_of::<types::AllThrSpec>());
    check("PAPI_preload_info_t.lib_dir_env", offset_of!(types::PreloadInfo, lib_dir_env));
    check("bit.inherit", types::cmp_bits::INHERIT as usize);
    check("bit.attach_must_ptrace", types::cmp_bits::ATTACH_MUST_PTRACE as usize);
    check("bit.hardware_intr", types::cmp_bits::HARDWARE_INTR as usize);
}

/// Object-like macros of `header` (with its includes) and their text.
fn macros(include: Option<&Path>, header: &str) -> BTreeMap<String, String> {
    let mut c = Command::new("gcc");
    c.args(["-dM", "-E", "-x", "c", "-"]);
    if let Some(i) = include {
        c.arg(format!("-I{}", i.display()));
    }
    let mut child =
        c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    writeln!(child.stdin.take().unwrap(), "#include <{header}>").unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .filter_map(|l| l.split_once(' ').map(|(n, v)| (n.to_string(), v.to_string())))
        .filter(|(n, _)| {
            !n.contains('(') && (n.starts_with("PAPI") || n.starts_with("IS_") || n.starts_with("USER_EVENT"))
        })
        .collect()
}

#[test]
fn every_shared_define_has_debians_value() {
    if !debian_or_skip() {
        return;
    }
    let ours = macros(Some(&include_dir()), "papi.h");
    let theirs = macros(None, "papi.h");
    let missing: Vec<&String> = theirs.keys().filter(|k| !ours.contains_key(*k)).collect();
    assert!(missing.is_empty(), "papirus' papi.h lacks {missing:?}");
    let shared: Vec<&String> = ours.keys().filter(|k| theirs.contains_key(*k)).collect();
    assert!(shared.len() > 300, "{} shared macros", shared.len());
    let mut text = String::from("#include <stdio.h>\n#include <papi.h>\nint main(void) {\n");
    for m in &shared {
        text += &format!("  printf(\"{m} %lld\\n\", (long long)({m}));\n");
    }
    text += "  return 0;\n}\n";
    let dir = tempfile::tempdir().unwrap();
    let a = run_with(dir.path(), "defs_ours", &text, Some(&include_dir()));
    let b = run_with(dir.path(), "defs_debian", &text, None);
    for (x, y) in a.lines().zip(b.lines()) {
        assert_eq!(x, y, "a #define differs from Debian's papi.h");
    }
    assert_eq!(a.lines().count(), shared.len());
    // The Fortran constants: fpapi.h has Debian's names and values.
    let parse = |p: &Path| -> BTreeMap<String, String> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .map(|l| {
                let mut w = l.split_whitespace();
                (w.next().unwrap().to_string(), w.collect::<Vec<_>>().join(" "))
            })
            .collect()
    };
    assert_eq!(parse(&include_dir().join("fpapi.h")), parse(Path::new("/usr/include/fpapi.h")));
}

fn dynamic_symbols(lib: &Path) -> Vec<(String, String)> {
    let o = Command::new("nm").args(["-D", "--defined-only"]).arg(lib).output().expect("nm (binutils)");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3).then(|| (w[1].to_string(), w[2].to_string()))
        })
        .collect()
}

#[test]
fn exports_soname_and_symbols_as_debian() {
    let lib = library();
    let o = Command::new("readelf").arg("-d").arg(&lib).output().expect("readelf");
    let dynamic = String::from_utf8_lossy(&o.stdout);
    assert!(dynamic.contains("Library soname: [libpapi.so.7.0]"), "{dynamic}");
    let ours = dynamic_symbols(&lib);
    let data: Vec<_> = ours.iter().filter(|(t, _)| !matches!(t.as_str(), "T" | "W" | "i")).collect();
    assert!(data.is_empty(), "exported non-functions: {data:?}");
    let names: std::collections::BTreeSet<&str> = ours.iter().map(|(_, n)| n.as_str()).collect();
    let stray: Vec<_> =
        names.iter().filter(|n| !n.starts_with("PAPI_") && !n.to_lowercase().starts_with("papif_")).collect();
    assert!(stray.is_empty(), "exports beyond PAPI's interface: {stray:?}");
    assert_eq!(names.iter().filter(|n| n.starts_with("PAPI_")).count(), 89);
    let o = Command::new("readelf").arg("-V").arg(&lib).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains(".gnu.version_d"),
        "no symbol versions, as Debian's"
    );
    if !debian_or_skip() {
        return;
    }
    let deb = dynamic_symbols(Path::new("/usr/lib/x86_64-linux-gnu/libpapi.so.7.0"));
    let theirs: Vec<&str> = deb.iter().map(|(_, n)| n.as_str()).filter(|n| n.starts_with("PAPI_")).collect();
    let missing: Vec<_> = theirs.iter().filter(|n| !names.contains(*n)).collect();
    assert!(missing.is_empty(), "C entry points Debian's libpapi has and papirus' lacks: {missing:?}");
    let fortran: Vec<&str> =
        deb.iter().map(|(_, n)| n.as_str()).filter(|n| n.to_lowercase().starts_with("papif_")).collect();
    let absent: Vec<_> = fortran.iter().filter(|n| !names.contains(*n)).collect();
    assert!(absent.is_empty(), "Fortran wrappers Debian's libpapi has and papirus' lacks: {absent:?}");
    assert_eq!(
        names.len(),
        theirs.len() + fortran.len(),
        "exactly Debian's {} functions",
        theirs.len() + fortran.len()
    );
}

#[test]
fn pkg_config_file_points_at_the_headers_and_library() {
    let deps = library();
    let profile = deps.parent().and_then(Path::parent).filter(|p| p.join("papi.pc").exists());
    let dir = profile.unwrap_or_else(|| deps.parent().unwrap());
    let pc = std::fs::read_to_string(dir.join("papi.pc")).expect("build.rs writes papi.pc");
    assert!(pc.contains("Version: 7.0.0.0"), "{pc}");
    assert!(pc.contains(&format!("includedir={}", include_dir().display())), "{pc}");
    assert!(pc.contains("Libs: -L${libdir} -lpapi"), "{pc}");
    assert_eq!(std::fs::read_to_string(dir.join("papi-7.0.pc")).unwrap(), pc, "Debian's alias");
}
