//! Every event this machine offers, by name: perf's hardware, software and
//! hw-cache tables, each sysfs PMU's named events, and every tracepoint.
//!
//! Listing reads directories and checks that each tracepoint has an `id`
//! (ftrace's internal events have none and cannot be opened): 2,362 events
//! in 14 ms here. Whether an event really opens is a separate, slower
//! question, [`check`]: an open and a close each, and closing a tracepoint
//! event waits for the kernel (about 60 ms here, so all 2,300 tracepoints
//! take over two minutes; software and PMU events take well under 1 ms).

use serde::Serialize;

use crate::attr::Kind;
use crate::error::Result;
use crate::event::Target;
use crate::names::{HARDWARE, Parser, SOFTWARE, cache_events, tracepoint_names};

/// One event a user can name.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventInfo {
    /// The name to pass to [`Parser::parse`].
    pub name: String,
    /// Other names for the same event (`cycles` for `cpu-cycles`).
    pub aliases: Vec<String>,
    /// Who provides it: `hardware`, `software`, `hw-cache`, `tracepoint`, or a sysfs PMU.
    pub pmu: String,
    /// Its kind.
    pub kind: Kind,
    /// What it counts (for sysfs events: the terms, scale and unit).
    pub description: String,
}

/// The events of one machine (or fixture tree), in a stable order:
/// hardware, software, hw-cache, sysfs PMUs by name, tracepoints.
#[derive(Clone, Debug)]
pub struct Catalog {
    events: Vec<EventInfo>,
}

impl Catalog {
    /// Lists everything `parser` can name.
    pub fn new(parser: &Parser) -> Self {
        let mut events = Vec::new();
        let table = |events: &mut Vec<EventInfo>, t: &[crate::names::Named], pmu: &str, kind: Kind| {
            for n in t {
                events.push(EventInfo {
                    name: n.names[0].to_string(),
                    aliases: n.names[1..].iter().map(|s| s.to_string()).collect(),
                    pmu: pmu.to_string(),
                    kind,
                    description: n.description.to_string(),
                });
            }
        };
        table(&mut events, HARDWARE, "hardware", Kind::Hardware);
        table(&mut events, SOFTWARE, "software", Kind::Software);
        for (name, config) in cache_events() {
            events.push(EventInfo {
                name,
                aliases: Vec::new(),
                pmu: "hw-cache".into(),
                kind: Kind::Hardware,
                description: format!("hardware cache event, config {config:#x}"),
            });
        }
        for pmu in parser.pmus().pmus() {
            let kind = if pmu.is_core() { Kind::Hardware } else { Kind::Dynamic };
            for a in &pmu.aliases {
                let mut description = a.terms.clone();
                if let Some(unit) = &a.unit {
                    description.push_str(&format!(" (×{} {unit})", a.scale));
                } else if a.scale != 1.0 {
                    description.push_str(&format!(" (×{})", a.scale));
                }
                events.push(EventInfo {
                    name: format!("{}/{}/", pmu.name, a.name),
                    aliases: vec![a.name.clone()],
                    pmu: pmu.name.clone(),
                    kind,
                    description,
                });
            }
        }
        if let Some(root) = parser.tracefs() {
            for name in tracepoint_names(root) {
                events.push(EventInfo {
                    name,
                    aliases: Vec::new(),
                    pmu: "tracepoint".into(),
                    kind: Kind::Tracepoint,
                    description: "kernel tracepoint".into(),
                });
            }
        }
        Catalog { events }
    }

    /// All events.
    pub fn events(&self) -> &[EventInfo] {
        &self.events
    }

    /// The event named `name` or with `name` among its aliases.
    pub fn find(&self, name: &str) -> Option<&EventInfo> {
        self.events.iter().find(|e| e.name == name || e.aliases.iter().any(|a| a == name))
    }
}

/// Whether `event` opens here: parses it, opens it on the calling thread
/// (on the first CPU of its PMU's cpumask for system-wide PMUs such as RAPL
/// or uncore, which count no task), and closes it. The error is the
/// parser's or the kernel's, with its reason.
pub fn check(parser: &Parser, event: &EventInfo) -> Result<()> {
    let attr = parser.parse(&event.name)?;
    let pmu = parser.pmus().get(&event.pmu).filter(|p| !p.is_core());
    let target = match pmu.and_then(|p| p.cpumask.as_ref()).and_then(|m| m.first()) {
        Some(&cpu) => Target::Cpu(cpu),
        None => Target::ThisThread,
    };
    attr.open(target).map(drop)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::pmu::PmuSet;

    #[test]
    fn fixture_catalog_lists_tables_and_aliases_and_every_name_parses() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/intel");
        let mut parser = Parser::new(PmuSet::discover_at(root).unwrap());
        parser.tracefs_at(None);
        let cat = Catalog::new(&parser);
        assert_eq!(cat.find("cycles").unwrap().name, "cpu-cycles");
        assert_eq!(cat.find("cpu-cycles").unwrap().pmu, "hardware");
        assert_eq!(cat.find("cs").unwrap().name, "context-switches");
        assert_eq!(cat.find("L1-dcache-load-misses").unwrap().pmu, "hw-cache");
        assert!(cat.find("L1-icache-stores").is_none(), "perf has no instruction-cache stores");
        let pkg = cat.find("power/energy-pkg/").unwrap();
        assert!(pkg.description.contains("Joules"), "{}", pkg.description);
        assert_eq!(cat.find("cpu/mem-loads/").unwrap().kind, Kind::Hardware);
        // 10 hardware + 12 software + 32 cache (7 caches: 3+2+3+3+1+1+3 ops, 2 results each).
        let count = |p: &str| cat.events().iter().filter(|e| e.pmu == p).count();
        assert_eq!((count("hardware"), count("software"), count("hw-cache")), (10, 12, 32));
        for e in cat.events() {
            for n in std::iter::once(&e.name).chain(&e.aliases) {
                parser.parse(n).unwrap_or_else(|err| panic!("catalog name `{n}` does not parse: {err}"));
            }
        }
    }

    #[test]
    fn this_machine_lists_tracepoints_fast() {
        let parser = Parser::system().unwrap();
        let t = std::time::Instant::now();
        let cat = Catalog::new(&parser);
        let took = t.elapsed();
        let tps = cat.events().iter().filter(|e| e.kind == Kind::Tracepoint).count();
        println!("{} events ({tps} tracepoints) listed in {took:?}", cat.events().len());
        match parser.tracefs() {
            Some(_) => {
                let tp = cat.find("syscalls:sys_enter_write").expect("syscall tracepoints listed");
                assert_eq!(tp.pmu, "tracepoint");
                assert!(parser.parse(&tp.name).is_ok());
            }
            None => println!("tracefs not mounted here: no tracepoints listed"),
        }
        if let Some(msr) = parser.pmus().get("msr") {
            assert!(cat.find("msr/tsc/").is_some(), "msr PMU {msr:?} not in catalog");
        }
    }

    #[test]
    fn check_opens_what_this_machine_has_and_gives_the_reason_otherwise() {
        let parser = Parser::system().unwrap();
        let cat = Catalog::new(&parser);
        let mut opens = Vec::new();
        let t = std::time::Instant::now();
        let mut checked = 0;
        let mut hardware_refused = Vec::new();
        for e in
            cat.events().iter().filter(|e| e.kind != Kind::Tracepoint || e.name == "syscalls:sys_enter_write")
        {
            checked += 1;
            match check(&parser, e) {
                Ok(()) => opens.push(e.name.as_str()),
                Err(err) => {
                    // Anything refused must say why in the kernel's terms.
                    assert!(err.errno().is_some(), "`{}` failed without an errno: {err}", e.name);
                    if e.kind == Kind::Hardware {
                        hardware_refused.push(e.name.as_str());
                    } else {
                        println!("{:28} {err}", e.name);
                    }
                }
            }
        }
        println!("{} hardware events refused: {}", hardware_refused.len(), hardware_refused.join(" "));
        println!(
            "{} of {checked} checked events open here in {:?}: {}",
            opens.len(),
            t.elapsed(),
            opens.join(" ")
        );
        // Every Linux kernel counts its own task's CPU time.
        assert!(opens.contains(&"task-clock"), "{opens:?}");
        let cycles = cat.find("cycles").unwrap();
        match check(&parser, cycles) {
            Ok(()) => println!("this machine has a hardware PMU: cycles opens"),
            Err(e) => {
                assert!(matches!(e, crate::Error::Unsupported { hardware: true, .. }), "{e:?}");
                println!("cycles: {e}");
            }
        }
    }
}
