//! Unit tests of the name parser: encodings checked against perf's, on
//! fixture PMU trees of machines this is not, and every kind of bad input.

use std::path::{Path, PathBuf};

use super::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A parser over a fixture machine (`intel`, `amd`) and the fixture tracefs.
fn fixture(machine: &str) -> Parser {
    let mut p = Parser::new(PmuSet::discover_at(fixtures().join("sysfs").join(machine)).unwrap());
    p.tracefs_at(Some(fixtures().join("tracefs")));
    p
}

fn parse(p: &Parser, name: &str) -> EventAttr {
    p.parse(name).unwrap_or_else(|e| panic!("`{name}`: {e}"))
}

/// (type, config, config1, config2)
fn enc(a: &EventAttr) -> (u32, u64, u64, u64) {
    (a.pmu_type(), a.config_value(), a.config1_value(), a.config2_value())
}

fn err(p: &Parser, name: &str) -> Error {
    match p.parse(name) {
        Ok(a) => panic!("`{name}` parsed to {a:?}"),
        Err(e) => {
            println!("{name:40} -> {e}");
            e
        }
    }
}

const UK: Domain = Domain { user: true, kernel: true, hypervisor: false };

// Acceptance 8. The encodings are those `perf stat -vv -e NAME true` (perf 6.1)
// printed on this machine: `cycles` type 0 config 0; `instructions:u` type 0
// config 0x1 exclude_kernel=1 exclude_hv=1; `L1-dcache-load-misses` type 3
// config 0x10000; `r00c0` type 4 config 0xc0. For `cpu/event=0xc0,umask=0x00/`
// perf places event in config:0-7 and umask in config:8-15 (Intel and AMD
// format/ files), giving config 0xc0 on the core PMU's type 4.
#[test]
fn acceptance_8_hardware_encodings_match_perf() {
    for machine in ["intel", "amd"] {
        let p = fixture(machine);
        let cycles = parse(&p, "cycles");
        assert_eq!(enc(&cycles), (b::PERF_TYPE_HARDWARE, 0, 0, 0));
        assert_eq!(cycles.kind(), Kind::Hardware);
        // No modifier: papirus' default is user space only (perf's default as root is all).
        assert_eq!(cycles.domain_value(), Domain::USER);

        let ins = parse(&p, "instructions:u");
        assert_eq!(enc(&ins), (0, 1, 0, 0));
        let raw = ins.to_raw();
        assert_eq!((raw.exclude_user(), raw.exclude_kernel(), raw.exclude_hv()), (0, 1, 1));

        let l1 = parse(&p, "L1-dcache-load-misses");
        assert_eq!(enc(&l1), (b::PERF_TYPE_HW_CACHE, 0x10000, 0, 0));

        let cpu = parse(&p, "cpu/event=0xc0,umask=0x00/");
        assert_eq!(enc(&cpu), (4, 0xc0, 0, 0), "{machine}");
        assert_eq!(cpu.kind(), Kind::Hardware, "a core-PMU event needs the hardware PMU");

        let r = parse(&p, "r00c0");
        assert_eq!(enc(&r), (b::PERF_TYPE_RAW, 0xc0, 0, 0));
        assert_eq!(r.kind(), Kind::Hardware);
    }
}

/// (type, config, config1, config2, bp_type, exclude_user, exclude_kernel, exclude_hv)
type AttrFields = (u32, u64, u64, u64, u32, bool, bool, bool);

/// Runs `perf stat -vv -e NAME true` and returns the first attr perf printed.
fn perf_attr(name: &str) -> Option<AttrFields> {
    let out = std::process::Command::new("perf").args(["stat", "-vv", "-e", name, "true"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    let block = text.split("perf_event_attr:").nth(1)?.split("------").next()?;
    let field = |key: &str| -> u64 {
        block
            .lines()
            .find_map(|l| {
                let l = l.trim();
                let v = l.strip_prefix(key)?.trim();
                let v = v.split_whitespace().next()?;
                match v.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16).ok(),
                    None => v.parse().ok(),
                }
            })
            .unwrap_or(0)
    };
    Some((
        field("type ") as u32,
        field("config "),
        field("{ bp_addr, config1 }"),
        field("{ bp_len, config2 }"),
        field("bp_type ") as u32,
        field("exclude_user ") == 1,
        field("exclude_kernel ") == 1,
        field("exclude_hv ") == 1,
    ))
}

// The same comparison, live: every name below goes through this machine's
// perf and papirus, and the attrs must agree. Names without modifiers differ
// only in the domain (papirus: user only by default), so the exclude bits
// are compared where a modifier is given.
#[test]
fn encodings_agree_with_this_machines_perf() {
    if perf_attr("task-clock").is_none() {
        println!("perf is not installed here (or prints no attr): live comparison skipped");
        return;
    }
    let p = Parser::system().unwrap();
    let mut names = vec![
        "cycles",
        "instructions:u",
        "cycles:uk",
        "cache-misses:k",
        "branches",
        "ref-cycles",
        "stalled-cycles-backend",
        "L1-dcache-load-misses",
        "L1-dcache-loads",
        "L1-icache-load-misses",
        "LLC-loads",
        "LLC-store-misses",
        "dTLB-load-misses",
        "iTLB-loads",
        "branch-loads",
        "branch-load-misses",
        "node-prefetches",
        "r00c0",
        "r1a2b",
        "task-clock",
        "cpu-clock:u",
        "page-faults",
        "faults",
        "cs",
        "migrations",
        "major-faults",
        "dummy",
        "mem:0x401126:x",
        "mem:0x601040/4:w",
        "mem:0x601040:rw",
        "mem:0x601040/8",
    ];
    if p.tracefs().is_some() {
        names.extend(["syscalls:sys_enter_write", "sched:sched_switch"]);
    }
    if p.pmus().get("msr").is_some() {
        names.push("msr/tsc/");
    }
    for name in names {
        let a = parse(&p, name);
        let Some(perf) = perf_attr(name) else { panic!("perf printed no attr for `{name}`") };
        let r = a.to_raw();
        let ours = (
            a.pmu_type(),
            a.config_value(),
            a.config1_value(),
            a.config2_value(),
            a.bp_type_value(),
            r.exclude_user() == 1,
            r.exclude_kernel() == 1,
            r.exclude_hv() == 1,
        );
        println!("{name:28} perf {perf:x?}");
        let (t, c, c1, c2, bp) = (ours.0, ours.1, ours.2, ours.3, ours.4);
        assert_eq!((t, c, c1, c2, bp), (perf.0, perf.1, perf.2, perf.3, perf.4), "`{name}`");
        if name.rsplit_once(':').is_some_and(|(_, m)| m.chars().all(|c| "ukh".contains(c)))
            && !name.starts_with("mem:")
        {
            assert_eq!((ours.5, ours.6, ours.7), (perf.5, perf.6, perf.7), "`{name}` exclude bits");
        }
    }
}

#[test]
fn named_tables() {
    let p = fixture("intel");
    let hw = [
        ("cpu-cycles", 0),
        ("cycles", 0),
        ("instructions", 1),
        ("cache-references", 2),
        ("cache-misses", 3),
        ("branch-instructions", 4),
        ("branches", 4),
        ("branch-misses", 5),
        ("bus-cycles", 6),
        ("stalled-cycles-frontend", 7),
        ("idle-cycles-frontend", 7),
        ("stalled-cycles-backend", 8),
        ("ref-cycles", 9),
    ];
    for (n, c) in hw {
        assert_eq!(enc(&parse(&p, n)), (0, c, 0, 0), "{n}");
    }
    let sw = [
        ("cpu-clock", 0),
        ("task-clock", 1),
        ("page-faults", 2),
        ("faults", 2),
        ("context-switches", 3),
        ("cs", 3),
        ("cpu-migrations", 4),
        ("migrations", 4),
        ("minor-faults", 5),
        ("major-faults", 6),
        ("alignment-faults", 7),
        ("emulation-faults", 8),
        ("dummy", 9),
        ("bpf-output", 10),
        ("cgroup-switches", 11),
    ];
    for (n, c) in sw {
        let a = parse(&p, n);
        assert_eq!(enc(&a), (1, c, 0, 0), "{n}");
        assert_eq!(a.kind(), Kind::Software);
        // The scheduler's events count only in kernel context.
        let scheduler = matches!(c, 3 | 4 | 11);
        assert_eq!(a.domain_value(), if scheduler { Domain::ALL } else { Domain::USER }, "{n}");
        assert_eq!(a.name(), n);
    }
}

#[test]
fn cache_names_and_aliases() {
    let p = fixture("intel");
    // config = cache | op << 8 | result << 16 (perf_event_open(2), PERF_TYPE_HW_CACHE).
    let cases = [
        ("L1-dcache-loads", 0x00000),
        ("L1-dcache-load-misses", 0x10000),
        ("L1-dcache-stores", 0x00100),
        ("L1-dcache-store-misses", 0x10100),
        ("L1-dcache-prefetches", 0x00200),
        ("l1d-loads", 0x00000),
        ("L1-data-load-miss", 0x10000),
        ("L1-dcache-misses-load", 0x10000),
        ("L1-dcache-misses", 0x10000),
        ("L1-dcache-speculative-read-misses", 0x10200),
        ("L1-icache-load-misses", 0x10001),
        ("LLC-loads", 0x00002),
        ("L2-store-misses", 0x10102),
        ("dTLB-load-misses", 0x10003),
        ("dtlb-store-misses", 0x10103),
        ("Data-TLB-loads", 0x00003),
        ("iTLB-load-misses", 0x10004),
        ("branch-loads", 0x00005),
        ("branch-load-misses", 0x10005),
        ("bpu-loads", 0x00005),
        ("node-loads", 0x00006),
        ("node-prefetch-misses", 0x10206),
        ("LLC-access", 0x00002),
    ];
    for (n, c) in cases {
        let a = parse(&p, n);
        assert_eq!(enc(&a), (b::PERF_TYPE_HW_CACHE, c, 0, 0), "{n}");
        assert_eq!(a.kind(), Kind::Hardware);
    }
    // Hardware names win over the cache reading of the same word.
    assert_eq!(enc(&parse(&p, "branch-misses")), (0, 5, 0, 0));
    assert!(matches!(err(&p, "L1-icache-stores"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "iTLB-prefetches"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "LLC-loads-loads"), Error::UnknownEvent { .. }));
}

#[test]
fn modifiers() {
    let p = fixture("intel");
    let d = |n: &str| parse(&p, n).domain_value();
    assert_eq!(d("cycles:u"), Domain::USER);
    assert_eq!(d("cycles:k"), Domain::KERNEL);
    assert_eq!(d("cycles:h"), Domain::HYPERVISOR);
    assert_eq!(d("cycles:uk"), UK);
    assert_eq!(d("cycles:ku"), UK);
    assert_eq!(d("cycles:ukh"), Domain::ALL);
    assert_eq!(d("task-clock:k"), Domain::KERNEL);
    assert_eq!(d("cpu/event=0x3c/uk"), UK);
    assert_eq!(d("cpu/event=0x3c/:k"), Domain::KERNEL);
    assert_eq!(d("L1-dcache-loads:u"), Domain::USER);
    let raw = parse(&p, "cycles:uk").to_raw();
    assert_eq!((raw.exclude_user(), raw.exclude_kernel(), raw.exclude_hv()), (0, 0, 1));
    // perf's other modifiers are named as such.
    let e = err(&p, "cycles:p").to_string();
    assert!(e.contains("`p`") && e.contains("`u`"), "{e}");
    let e = err(&p, "instructions:z").to_string();
    assert!(e.contains("not a modifier"), "{e}");
    assert!(matches!(err(&p, "cpu/event=0x3c/x"), Error::Malformed { .. }));
}

#[test]
fn pmu_terms_on_intel() {
    let p = fixture("intel");
    // event | umask << 8 | edge << 18 | inv << 23 | cmask << 24
    let a = parse(&p, "cpu/event=0x3c,umask=0x01,edge,inv,cmask=2/");
    assert_eq!(enc(&a), (4, 0x3c | 0x01 << 8 | 1 << 18 | 1 << 23 | 2 << 24, 0, 0));
    assert_eq!(
        enc(&parse(&p, "cpu/event=0xd1,umask=0x01,any=1,in_tx,in_tx_cp/")),
        (4, 0x1d1 | 1 << 21 | 3 << 32, 0, 0)
    );
    // An alias expands in place; later terms override its fields.
    assert_eq!(enc(&parse(&p, "cpu/mem-loads/")), (4, 0x1cd, 3, 0));
    assert_eq!(enc(&parse(&p, "cpu/mem-loads,ldlat=30/")), (4, 0x1cd, 30, 0));
    assert_eq!(enc(&parse(&p, "cpu/cache-misses/")), (4, 0x412e, 0, 0));
    assert_eq!(enc(&parse(&p, "cpu/cache-misses,umask=0x4f/")), (4, 0x4f2e, 0, 0));
    assert_eq!(enc(&parse(&p, "cpu/ref-cycles/")), (4, 0x0300, 0, 0));
    assert_eq!(
        enc(&parse(&p, "cpu/event=0xb7,umask=0x01,offcore_rsp=0x10003c0091/")),
        (4, 0x1b7, 0x10003c0091, 0)
    );
    assert_eq!(enc(&parse(&p, "cpu/event=0xc6,frontend=0x400406/")), (4, 0xc6, 0x400406, 0));
    assert_eq!(enc(&parse(&p, "cpu/config=0x1234,config1=5,config2=7/")), (4, 0x1234, 5, 7));
    // A bare sysfs alias resolves to its PMU (the tables above win for shared names).
    assert_eq!(enc(&parse(&p, "mem-stores")), (4, 0x82d0, 0, 0));
    assert_eq!(enc(&parse(&p, "cpu-cycles")), (0, 0, 0, 0));
    let named = parse(&p, "cpu/event=0x3c,name=my-cycles/");
    assert_eq!(named.name(), "my-cycles");
    // Scale and unit of a sysfs event, and a system-wide PMU's domain.
    let pkg = p.parse_full("power/energy-pkg/").unwrap();
    assert_eq!(enc(&pkg.attr), (14, 2, 0, 0));
    assert_eq!((pkg.pmu.as_str(), pkg.unit.as_deref()), ("power", Some("Joules")));
    assert_eq!(pkg.scale, 2f64.powi(-32), "RAPL energy unit");
    assert_eq!(pkg.attr.domain_value(), Domain::ALL);
    assert_eq!(pkg.attr.kind(), Kind::Dynamic);
    let tsc = parse(&p, "msr/tsc/");
    assert_eq!((enc(&tsc), tsc.domain_value()), ((9, 0, 0, 0), Domain::ALL));
    assert_eq!(enc(&parse(&p, "msr/aperf/")), (9, 1, 0, 0));
    assert_eq!(enc(&parse(&p, "tsc")), (9, 0, 0, 0));
    let e = err(&p, "msr/tsc/u").to_string();
    assert!(e.contains("every privilege level"), "{e}");
}

#[test]
fn pmu_terms_on_amd() {
    let p = fixture("amd");
    // AMD's 12-bit event select: low 8 bits in config:0-7, high 4 in config:32-35.
    assert_eq!(enc(&parse(&p, "cpu/event=0x1c0/")), (4, 0x1_0000_00c0, 0, 0));
    assert_eq!(enc(&parse(&p, "cpu/event=0xc0,umask=0x00/u")), (4, 0xc0, 0, 0));
    assert_eq!(
        enc(&parse(&p, "cpu/event=0x3c,umask=0x2,cmask=1,inv/")),
        (4, 0x3c | 0x2 << 8 | 1 << 24 | 1 << 23, 0, 0)
    );
    assert_eq!(enc(&parse(&p, "msr/irperf/")), (10, 5, 0, 0));
    let e = err(&p, "cpu/event=0x1000/").to_string();
    assert!(e.contains("does not fit 12 bits") && e.contains("config:0-7,32-35"), "{e}");
    // Intel-only fields are unknown here.
    match err(&p, "cpu/event=0x3c,any/") {
        Error::UnknownTerm { pmu, term, .. } => assert_eq!((pmu.as_str(), term.as_str()), ("cpu", "any")),
        e => panic!("{e:?}"),
    }
}

#[test]
fn tracepoints() {
    let p = fixture("intel");
    let a = parse(&p, "syscalls:sys_enter_write");
    assert_eq!(enc(&a), (b::PERF_TYPE_TRACEPOINT, 840, 0, 0));
    assert_eq!((a.kind(), a.domain_value()), (Kind::Tracepoint, Domain::ALL));
    assert_eq!(enc(&parse(&p, "sched:sched_switch")), (2, 372, 0, 0));
    assert_eq!(parse(&p, "sched:sched_switch:u").domain_value(), Domain::USER);
    match err(&p, "syscalls:sys_enter_writ") {
        Error::UnknownEvent { suggestions, .. } => assert_eq!(suggestions[0], "syscalls:sys_enter_write"),
        e => panic!("{e:?}"),
    }
    match err(&p, "syscals:sys_enter_write") {
        Error::UnknownEvent { suggestions, .. } => assert_eq!(suggestions[0], "syscalls:sys_enter_write"),
        e => panic!("{e:?}"),
    }
    let e = err(&p, "ftrace:bprint").to_string();
    assert!(e.contains("no id"), "{e}");
    assert!(matches!(err(&p, "syscalls:sys_enter_*"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "syscalls:"), Error::Malformed { .. }));
    let mut none = fixture("intel");
    none.tracefs_at(None);
    assert!(matches!(err(&none, "syscalls:sys_enter_write"), Error::NoTracefs { .. }));
}

#[test]
fn tracepoints_on_this_machine() {
    let p = Parser::system().unwrap();
    let Some(root) = p.tracefs() else {
        println!("tracefs is not mounted here: skipped");
        return;
    };
    let id: u64 = std::fs::read_to_string(root.join("events/syscalls/sys_enter_write/id"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(enc(&parse(&p, "syscalls:sys_enter_write")), (2, id, 0, 0));
}

#[test]
fn breakpoints_by_address() {
    let p = fixture("intel");
    // perf stat -vv -e mem:0x401126:x: type 5, bp_type 4, bp_addr 0x401126, bp_len 8.
    let x = parse(&p, "mem:0x401126:x");
    assert_eq!((enc(&x), x.bp_type_value()), ((5, 0, 0x401126, 8), b::HW_BREAKPOINT_X));
    assert_eq!(x.kind(), Kind::Breakpoint);
    let w = parse(&p, "mem:0x601040/4:w");
    assert_eq!((enc(&w), w.bp_type_value()), ((5, 0, 0x601040, 4), b::HW_BREAKPOINT_W));
    // perf's defaults: access rw, length 4.
    let rw = parse(&p, "mem:0x601040");
    assert_eq!((enc(&rw), rw.bp_type_value()), ((5, 0, 0x601040, 4), b::HW_BREAKPOINT_RW));
    let r = parse(&p, "mem:6295616/8:r");
    assert_eq!((enc(&r), r.bp_type_value()), ((5, 0, 6295616, 8), b::HW_BREAKPOINT_R));
    assert_eq!(parse(&p, "mem:0x601040:w:k").domain_value(), Domain::KERNEL);
    assert_eq!(parse(&p, "mem:0x601040:u").domain_value(), Domain::USER);
}

#[test]
fn bad_addresses() {
    let p = fixture("intel");
    for (name, why) in [
        ("mem:0xzz", "not a number"),
        ("mem:12ab", "not a number"),
        ("mem:0x601041/4:w", "not aligned"),
        ("mem:0x401126/4:x", "length 8 only"),
        ("mem:0x601040/3", "1, 2, 4 or 8"),
        ("mem:0x601040/x:w", "length `x`"),
        ("mem:0x601040:rx", "not both"),
        ("mem:0", "never mapped"),
        ("mem:0x1000000000000000:x", "not canonical"),
        ("mem:", "no address"),
    ] {
        match err(&p, name) {
            Error::BadAddress { reason, .. } => assert!(reason.contains(why), "`{name}`: {reason}"),
            e => panic!("`{name}`: {e:?}"),
        }
    }
}

#[test]
fn probe_files_that_do_not_exist_or_are_not_elf() {
    let p = Parser::system().unwrap();
    if p.pmus().get("uprobe").is_none() {
        println!("no uprobe PMU on this kernel: skipped");
        return;
    }
    match err(&p, "uprobe:/nonexistent/papirus/prog:main") {
        Error::NoSuchFile { path, .. } => assert_eq!(path, Path::new("/nonexistent/papirus/prog")),
        e => panic!("{e:?}"),
    }
    assert!(matches!(err(&p, "uretprobe:/proc/self/exe:main+4"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "uprobe:/proc/self/exe"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "uprobe:/proc/self/exe:"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "uprobe:/proc/self/exe:main+zz"), Error::Malformed { .. }));
    assert!(matches!(err(&p, "uprobe:/etc/hostname:main"), Error::Elf { .. }));
}

#[test]
fn unknown_names_suggest_the_closest() {
    let p = fixture("intel");
    for (bad, best) in [
        ("task-clok", "task-clock"),
        ("cyclse", "cycles"),
        ("instruction", "instructions"),
        ("page-fault", "page-faults"),
        ("L1-dcache-load-mises", "L1-dcache-load-misses"),
        ("mem-load", "mem-loads"),
    ] {
        match err(&p, bad) {
            Error::UnknownEvent { name, suggestions } => {
                assert_eq!(name, bad);
                assert_eq!(suggestions.len(), 3, "{suggestions:?}");
                assert_eq!(suggestions[0], best, "{bad}: {suggestions:?}");
            }
            e => panic!("`{bad}`: {e:?}"),
        }
    }
    let msg = err(&p, "task-clok").to_string();
    assert!(msg.contains("did you mean `task-clock`"), "{msg}");
}

#[test]
fn malformed_terms_unknown_pmus_and_terms() {
    let p = fixture("intel");
    for name in [
        "cpu/event=0xzz/",
        "cpu/event=0x3c,,umask=1/",
        "cpu/event=0x3c,/",
        "cpu/event=0x3c",
        "cpu//",
        "cpu/=5/",
        "cpu/event=0x100/",
        "cpu/config/",
        "cpu/period=100000/",
        "cpu/call-graph=dwarf/",
        "cpu/config3=1/",
        "/event=1/",
        "",
        "r",
        "r123456789abcdef01",
    ] {
        assert!(matches!(err(&p, name), Error::Malformed { .. } | Error::UnknownEvent { .. }), "`{name}`");
    }
    assert!(matches!(err(&p, "r123456789abcdef01"), Error::Malformed { .. }));
    let e = err(&p, "cpu/period=100000/").to_string();
    assert!(e.contains("`period`"), "{e}");
    let mut no_core = Parser::new(PmuSet::discover_at(fixtures().join("sysfs/broken")).unwrap());
    no_core.tracefs_at(None);
    let e = err(&no_core, "cpu/event=0xc0/").to_string();
    assert!(e.contains("no hardware PMU is exposed"), "{e}");
    match err(&p, "cpuu/event=0x3c/") {
        Error::UnknownPmu { name, suggestions, .. } => {
            assert_eq!(name, "cpuu");
            assert_eq!(suggestions[0], "cpu");
        }
        e => panic!("{e:?}"),
    }
    match err(&p, "cpu/evnt=0x3c/") {
        Error::UnknownTerm { term, suggestions, .. } => {
            assert_eq!(term, "evnt");
            assert_eq!(suggestions[0], "event");
        }
        e => panic!("{e:?}"),
    }
    match err(&p, "msr/tssc/") {
        Error::UnknownTerm { suggestions, .. } => assert_eq!(suggestions[0], "tsc"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn default_parser_is_cached() {
    let a = default_parser().unwrap() as *const Parser;
    let b = default_parser().unwrap() as *const Parser;
    assert_eq!(a, b);
    assert_eq!(enc(&parse_event("task-clock").unwrap()), (1, 1, 0, 0));
    assert!(matches!(parse_event("task-clok"), Err(Error::UnknownEvent { .. })));
}

// powerpc's hv_24x7 publishes events whose parameters the user must give,
// written `name=?` in sysfs (`domain=2,offset=0xe0,starting_index=?`).
#[test]
fn alias_parameters_marked_with_a_question_mark_must_be_given() {
    use crate::pmu::{FormatField, PmuAlias};
    let pmu = Pmu {
        name: "hv_24x7".into(),
        type_: 30,
        formats: vec![
            FormatField::parse("domain", "config:0-3").unwrap(),
            FormatField::parse("offset", "config:16-31").unwrap(),
            FormatField::parse("starting_index", "config:32-47").unwrap(),
        ],
        aliases: vec![PmuAlias {
            name: "PM_PB_CYC".into(),
            terms: "domain=2,offset=0xe0,starting_index=?".into(),
            scale: 1.0,
            unit: None,
        }],
        cpumask: None,
    };
    let mut p = Parser::new(PmuSet::from_pmus("/nonexistent", vec![pmu]));
    p.tracefs_at(None);
    assert_eq!(enc(&parse(&p, "hv_24x7/PM_PB_CYC,starting_index=5/")), (30, 2 | 0xe0 << 16 | 5 << 32, 0, 0));
    let e = err(&p, "hv_24x7/PM_PB_CYC/").to_string();
    assert!(e.contains("needs a value for `starting_index`"), "{e}");
}

fn names(list: &str) -> Vec<String> {
    split_event_names(list).unwrap_or_else(|e| panic!("`{list}`: {e}"))
}

#[test]
fn event_lists_split_outside_pmu_terms_and_groups() {
    assert_eq!(
        names("task-clock, cpu/event=0x3c,umask=0x00/u,msr/tsc/,,PAPI_TOT_INS"),
        ["task-clock", "cpu/event=0x3c,umask=0x00/u", "msr/tsc/", "PAPI_TOT_INS"]
    );
    // Slashes after a `:` are paths or lengths, not PMU terms.
    assert_eq!(
        names("uprobe:/usr/bin/x:main,mem:0x1000/8:w,page-faults"),
        ["uprobe:/usr/bin/x:main", "mem:0x1000/8:w", "page-faults"]
    );
    let items = split_event_list("cycles,{task-clock,cpu/event=0x3c,umask=1/}:u,page-faults").unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0], ListItem { events: vec!["cycles".into()], group: false });
    assert_eq!(
        items[1],
        ListItem { events: vec!["task-clock:u".into(), "cpu/event=0x3c,umask=1/u".into()], group: true }
    );
    assert!(!items[2].group);
    assert!(split_event_list("").unwrap().is_empty());
    for bad in ["{a,b", "a}", "{a,{b}}", "{}", "x{a}", "{a}:zz", "{a}b"] {
        assert!(matches!(split_event_list(bad), Err(Error::Malformed { .. })), "`{bad}` is refused");
    }
}

#[test]
fn papi_spellings_become_perf_names() {
    let s = |n: &str| papi_spelling(n).unwrap();
    assert_eq!(s("perf::TASK-CLOCK").as_deref(), Some("task-clock"));
    assert_eq!(s("perf::PAGE-FAULTS").as_deref(), Some("page-faults"));
    assert_eq!(s("PERF::perf_count_sw_page_faults_min:u").as_deref(), Some("minor-faults:u"));
    assert_eq!(s("perf::PERF_COUNT_HW_CPU_CYCLES:u=1:k=0").as_deref(), Some("cpu-cycles:u"));
    assert_eq!(s("perf_raw::r01c2").as_deref(), Some("r01c2"));
    assert_eq!(s("task-clock"), None);
    assert!(papi_spelling("perf::").is_err() && papi_spelling("perf::CYCLES:q").is_err());
    let p = fixture("intel");
    assert_eq!(enc(&parse(&p, "perf::TASK-CLOCK")), enc(&parse(&p, "task-clock")));
    assert_eq!(enc(&parse(&p, "perf_raw::r01c2")), enc(&parse(&p, "r01c2")));
}

#[test]
fn mem_symbols_resolve_in_another_process() {
    let mut p = fixture("intel");
    let me = std::process::id() as i32;
    let own = parse(&p, "mem:main:x").config1_value();
    p.symbols_in(Some(me));
    // This process through /proc/PID: the same address as through /proc/self.
    match p.parse("mem:main:x") {
        Ok(a) => assert_eq!(a.config1_value(), own),
        Err(e) => println!("skipped: /proc/{me}/map_files is not readable here: {e}"),
    }
    assert!(matches!(p.parse("mem:no_such_function_here:x"), Err(Error::BadAddress { .. })));
}
