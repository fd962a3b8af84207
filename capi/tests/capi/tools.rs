//! PAPI's command-line tools as papirus' C programs (capi/tools), built
//! with their Makefile against papirus' library and run.

use std::path::Path;
use std::process::Command;

use papirus_testkit::{debian_package, runs, skip};

use crate::common::{Lib, assert_ok, env, run};

#[test]
fn papi_tools_build_and_report() {
    if let Err(e) = debian_package("make", || runs("make", &["--version"])) {
        skip(format!("make is not available: {e}"));
        return;
    }
    let dir = &env().papirus_lib;
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools");
    let o =
        Command::new("make").arg("-C").arg(&tools).arg(format!("TARGET={}", dir.display())).output().unwrap();
    assert_ok("make -C capi/tools", &o);
    let text = |name: &str, args: &[&str]| {
        let mut c = Command::new(dir.join(name));
        c.args(args).env("LD_LIBRARY_PATH", dir);
        let o = c.output().unwrap();
        assert_ok(name, &o);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let avail = text("papi_avail", &[]);
    assert!(avail.contains("Of 108 possible events"), "{avail}");
    assert!(avail.contains("PAPI_TOT_CYC"), "{avail}");
    let native = text("papi_native_avail", &[]);
    assert!(native.contains("Native Events in Component: perf_event"), "{native}");
    assert!(native.contains("task-clock"), "{native}");
    let cl = text("papi_command_line", &["perf::TASK-CLOCK", "perf::PAGE-FAULTS"]);
    let count = |key: &str| -> i64 {
        cl.lines()
            .find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|r| r.trim_start_matches(" :").split_whitespace().next()?.parse().ok())
            })
            .unwrap_or_else(|| panic!("no {key} in {cl}"))
    };
    assert!(count("perf::TASK-CLOCK") > 1_000_000, "{cl}");
    assert!(count("perf::PAGE-FAULTS") >= 8000, "the workload touches 32 MiB: {cl}");
    let cost = text("papi_cost", &["-t", "2000"]);
    assert!(cost.contains("Total cost for PAPI_read (2 counters) over 2000 iterations"), "{cost}");
    let res = text("papi_clockres", &[]);
    assert!(res.contains("PAPI_get_virt_nsec :"), "{res}");
    // The tools ran on papirus' library, found by their RPATH as well.
    let o = run(&dir.join("papi_avail"), Lib::Debian, &[]);
    assert_ok("papi_avail without LD_LIBRARY_PATH", &o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("(papirus)"));
}

/// Debian's own PAPI tools (`papi-tools`), binaries built for PAPI 7.0, run
/// unchanged with papirus' library found first.
#[test]
fn debians_papi_tools_run_unchanged_on_papirus() {
    if let Err(e) = debian_package("papi-tools", || Path::new("/usr/bin/papi_avail").exists()) {
        skip(format!("Debian's papi-tools are not available: {e}"));
        return;
    }
    let text = |name: &str, args: &[&str]| {
        let mut c = Command::new(Path::new("/usr/bin").join(name));
        c.args(args).env("LD_LIBRARY_PATH", &env().papirus_lib);
        let o = c.output().unwrap();
        assert_ok(name, &o);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let components = text("papi_component_avail", &[]);
    assert!(components.contains("papirus:"), "not on papirus' library:\n{components}");
    // papi_avail shows the presets whose categories match its filter (all by default).
    let avail = text("papi_avail", &[]);
    assert!(avail.contains("Of 108 possible events"), "{avail}");
    let listed = |out: &str, name: &str| out.lines().any(|l| l.starts_with(&format!("{name} ")));
    assert!(listed(&avail, "PAPI_TOT_CYC") && listed(&avail, "PAPI_L1_DCM"), "{avail}");
    let branches = text("papi_avail", &["--br"]);
    assert!(listed(&branches, "PAPI_BR_MSP") && !listed(&branches, "PAPI_L1_DCM"), "{branches}");
    // papi_mem_info prints each cache's geometry as sysfs gives it.
    let sysfs = |f: &str| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index0/{f}"));
    if let (Ok(line), Ok(ways)) = (sysfs("coherency_line_size"), sysfs("ways_of_associativity")) {
        let mem = text("papi_mem_info", &[]);
        let l1 = mem.split("L1 Data Cache:").nth(1).unwrap_or_else(|| panic!("no L1 data cache:\n{mem}"));
        let field = |key: &str| {
            let l = l1.lines().find_map(|l| l.split_once(key)).map(|(_, v)| v.split_whitespace().next());
            l.flatten().unwrap_or_else(|| panic!("no {key} in\n{mem}"))
        };
        assert_eq!(field("Line size:"), line.trim(), "{mem}");
        assert_eq!(field("Associativity:"), ways.trim(), "{mem}");
    } else {
        skip("sysfs gives no line size or associativity for cpu0's first cache");
    }
}
