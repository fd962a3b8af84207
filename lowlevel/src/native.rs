//! Native events: names in perf's syntax, resolved by the substrate's name
//! parser, and the event codes PAPI users pass around.
//!
//! A native code is `0x40000000 | index` into a process-wide registry of
//! names. A name gets its code the first time it is looked up and keeps it
//! for the life of the process, so codes and names convert both ways.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use papirus_substrate::catalog::Catalog;
use papirus_substrate::names::{self, ParsedEvent};
use papirus_substrate::{EventAttr, Kind};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::preset::presets;

/// The bit that marks a native event code.
pub const NATIVE_MASK: u32 = 0x4000_0000;
const INDEX_MASK: u32 = 0x3fff_ffff;

#[derive(Default)]
struct Registry {
    names: Vec<String>,
    codes: HashMap<String, u32>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REG: OnceLock<Mutex<Registry>> = OnceLock::new();
    // Each update is a push plus an insert of the same name; a poisoned lock still holds a usable map.
    REG.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The code of native event `name`, assigned on first use.
pub fn code_of(name: &str) -> u32 {
    let name = name.trim();
    let mut r = registry();
    if let Some(&c) = r.codes.get(name) {
        return c;
    }
    // 2^30 distinct names would exhaust memory long before the index space.
    let code = NATIVE_MASK | (r.names.len() as u32 & INDEX_MASK);
    r.names.push(name.to_string());
    r.codes.insert(name.to_string(), code);
    code
}

/// The name behind a native code, if this process handed it out.
pub fn name_of(code: u32) -> Option<String> {
    if code & 0xC000_0000 != NATIVE_MASK {
        return None;
    }
    registry().names.get((code & INDEX_MASK) as usize).cloned()
}

/// A native event resolved to what the kernel will open.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Its code.
    pub code: u32,
    /// The name as given.
    pub name: String,
    /// What the name parser produced.
    pub parsed: ParsedEvent,
}

/// Resolves a perf-syntax name. Unknown names fail with [`Error::NoSuchEvent`]
/// naming the closest native events and presets.
pub fn resolve(name: &str) -> Result<Resolved> {
    let parser = names::default_parser()?;
    match parser.parse_full(name) {
        Ok(parsed) => Ok(Resolved { code: code_of(name), name: name.trim().to_string(), parsed }),
        Err(papirus_substrate::Error::UnknownEvent { name, mut suggestions }) => {
            let near = closest_presets(&name, 2);
            if name.to_ascii_uppercase().starts_with("PAPI_") {
                suggestions.splice(0..0, near);
            } else {
                suggestions.extend(near);
            }
            suggestions.truncate(4);
            Err(Error::NoSuchEvent { name, suggestions })
        }
        Err(e) => Err(e.into()),
    }
}

/// Resolves the native event with code `code`.
pub fn resolve_code(code: u32) -> Result<Resolved> {
    let name = name_of(code).ok_or(Error::NoSuchCode { code })?;
    resolve(&name)
}

/// Up to `n` preset names close to `name` (edit distance), best first.
pub fn closest_presets(name: &str, n: usize) -> Vec<String> {
    let up = name.to_ascii_uppercase();
    let mut scored: Vec<(usize, &str)> =
        presets().iter().map(|p| (distance(&up, p.name), p.name)).filter(|&(d, _)| d <= 3).collect();
    scored.sort();
    scored.into_iter().take(n).map(|(_, s)| s.to_string()).collect()
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// One native event of this machine, as listed by `papirus-native-avail`.
#[derive(Clone, Debug, Serialize)]
pub struct NativeEvent {
    /// Its code in this process.
    pub code: u32,
    /// The name to add it by.
    pub name: String,
    /// Other names.
    pub aliases: Vec<String>,
    /// The PMU (or table) that provides it.
    pub pmu: String,
    /// Its kind.
    pub kind: Kind,
    /// What it counts.
    pub description: String,
    /// The unit of its scaled value (sysfs `.unit`), if any.
    pub unit: Option<String>,
    /// Multiply a count by this to get `unit` (sysfs `.scale`; 1 otherwise).
    pub scale: f64,
}

/// Every native event the machine offers (perf's tables, sysfs PMU events,
/// tracepoints), each with its code.
pub fn enumerate() -> Result<Vec<NativeEvent>> {
    let parser = names::default_parser()?;
    let cat = Catalog::new(parser);
    Ok(cat
        .events()
        .iter()
        .map(|e| {
            // Tracepoints have no unit; parsing each would read thousands of id files.
            let parsed = (e.kind != Kind::Tracepoint).then(|| parser.parse_full(&e.name).ok()).flatten();
            NativeEvent {
                code: code_of(&e.name),
                name: e.name.clone(),
                aliases: e.aliases.clone(),
                pmu: e.pmu.clone(),
                kind: e.kind,
                description: e.description.clone(),
                unit: parsed.as_ref().and_then(|p| p.unit.clone()),
                scale: parsed.map_or(1.0, |p| p.scale),
            }
        })
        .collect())
}

/// Whether `attr` opens (and so can count) for the calling thread here;
/// the substrate's error says why not.
pub fn check(attr: &EventAttr) -> Result<()> {
    attr.open(papirus_substrate::Target::ThisThread).map(drop).map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    #[test]
    fn codes_are_stable_and_convert_both_ways() {
        let a = code_of("task-clock");
        assert_eq!(a & 0xC000_0000, NATIVE_MASK);
        assert_eq!(code_of("task-clock"), a);
        assert_eq!(code_of("  task-clock "), a);
        let b = code_of("page-faults");
        assert_ne!(a, b);
        assert_eq!(name_of(a).as_deref(), Some("task-clock"));
        assert_eq!(name_of(b).as_deref(), Some("page-faults"));
        assert_eq!(name_of(NATIVE_MASK | 0x3fff_fff0), None);
        assert_eq!(name_of(0x8000_0001), None, "a preset code is not native");
    }

    #[test]
    fn modifiers_are_recognised() {
        let modifiers = |n: &str| resolve(n).unwrap().parsed.modifiers;
        assert!(modifiers("task-clock:u") && modifiers("cs:k") && modifiers("page-faults:uk"));
        assert!(!modifiers("task-clock") && !modifiers("msr/tsc/"));
        assert!(!modifiers("mem:0x401126:x"), "an access type is no modifier");
        // Without a modifier, scheduler events count every domain (user only would count 0).
        let cs = resolve("context-switches").unwrap();
        assert_eq!(cs.parsed.attr.domain_value(), papirus_substrate::Domain::ALL);
        assert_eq!(resolve("cs:u").unwrap().parsed.attr.domain_value(), papirus_substrate::Domain::USER);
    }

    #[test]
    fn papi_spellings_resolve_to_perf_events() {
        let a = resolve("perf::TASK-CLOCK").unwrap();
        assert_eq!(a.parsed.attr.config_value(), resolve("task-clock").unwrap().parsed.attr.config_value());
        assert_eq!(a.name, "perf::TASK-CLOCK", "the name stays as given");
        assert_eq!(
            resolve("perf::PAGE-FAULTS:u").unwrap().parsed.attr.domain_value(),
            papirus_substrate::Domain::USER
        );
        assert!(resolve("perf_raw::r01c2").is_ok());
        let lib = crate::init().unwrap();
        let mut set = lib.event_set();
        set.add_all(["perf::TASK-CLOCK", "perf::PAGE-FAULTS"]).unwrap();
        assert_eq!(set.len(), 2);
        // An unavailable preset fails with the machine's reason, the text papirus-stat prints too.
        let mut set = lib.event_set();
        match set.add_named("PAPI_TOT_CYC") {
            Ok(_) => println!("PAPI_TOT_CYC counts here"),
            Err(e) => {
                assert!(e.to_string().starts_with("preset PAPI_TOT_CYC is not available here: "), "{e}")
            }
        }
    }

    #[test]
    fn unknown_names_get_suggestions() {
        let e = resolve("task-clok").unwrap_err();
        assert_eq!(e.code(), Code::Enoevnt);
        assert!(e.to_string().contains("task-clock"), "{e}");
        let e = resolve_code(NATIVE_MASK | 0x3fff_0000).unwrap_err();
        assert!(matches!(e, Error::NoSuchCode { .. }));
        assert_eq!(e.code(), Code::Enoevnt);
        assert_eq!(closest_presets("PAPI_TOT_CY", 1), vec!["PAPI_TOT_CYC".to_string()]);
    }

    #[test]
    fn this_machine_enumerates_software_events_with_codes() {
        let all = enumerate().unwrap();
        let tc = all.iter().find(|e| e.name == "task-clock").expect("task-clock is listed");
        assert_eq!(name_of(tc.code).as_deref(), Some("task-clock"));
        assert_eq!(resolve("task-clock").unwrap().code, tc.code);
    }
}
