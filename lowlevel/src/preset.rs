//! PAPI preset events: the list (names, codes, descriptions) and their
//! definitions per CPU, both read from data files shipped in `data/`.
//!
//! `data/preset_list.csv` holds the PAPI 7 preset list in PAPI's order
//! (code = `0x80000000 | index`). `data/presets.csv` maps presets to native
//! events per CPU family, in a format close to PAPI's `papi_events.csv`; its
//! header describes it. Both are embedded with `include_str!` and parsed on
//! first use; [`PresetTable::parse`] reads a user's own definitions.

use std::fmt;
use std::sync::OnceLock;

use papirus_substrate::attr::consts::PERF_TYPE_RAW;
use papirus_substrate::{EventAttr, Kind};
use serde::Serialize;

use crate::derived::{Derivation, MAX_TERMS, Postfix};
use crate::error::{Error, Result};

/// The bit that marks a preset event code.
pub const PRESET_MASK: u32 = 0x8000_0000;

const LIST: &str = include_str!("../data/preset_list.csv");
const DEFINITIONS: &str = include_str!("../data/presets.csv");

/// One entry of the PAPI preset list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Preset {
    /// Index in PAPI's table.
    pub index: u32,
    /// `PAPI_TOT_CYC`.
    pub name: &'static str,
    /// What it measures, by PAPI's categories (branch, cache, …).
    pub categories: Categories,
    /// A short description (as `papi_avail` prints).
    pub short: &'static str,
    /// A longer description.
    pub long: &'static str,
}

impl Preset {
    /// The event code, `0x80000000 | index`.
    pub fn code(&self) -> u32 {
        PRESET_MASK | self.index
    }
}

/// PAPI's preset categories (`PAPI_PRESET_BIT_*`), a set: bit `n` is
/// category `PAPI_PRESET_ENUM_*` number `n`, as `PAPI_event_info_t`'s
/// `event_type` carries them and `papi_avail --br`, `--cache`, … filter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Categories(pub u32);

impl Categories {
    /// Each category's name in `data/preset_list.csv` and its bit.
    pub const NAMES: [(&'static str, u32); 12] = [
        ("msc", 1 << 3),
        ("ins", 1 << 4),
        ("idl", 1 << 5),
        ("br", 1 << 6),
        ("cnd", 1 << 7),
        ("mem", 1 << 8),
        ("cach", 1 << 9),
        ("l1", 1 << 10),
        ("l2", 1 << 11),
        ("l3", 1 << 12),
        ("tlb", 1 << 13),
        ("fp", 1 << 14),
    ];

    /// Parses space-separated category names; `None` on an unknown one.
    pub fn parse(text: &str) -> Option<Categories> {
        text.split_whitespace().try_fold(Categories(0), |acc, word| {
            let bit = Self::NAMES.iter().find(|(n, _)| *n == word)?.1;
            Some(Categories(acc.0 | bit))
        })
    }

    /// The category names, in PAPI's order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMES.iter().filter(move |(_, bit)| self.0 & bit != 0).map(|(n, _)| *n)
    }
}

/// Every PAPI preset, in PAPI's order.
pub fn presets() -> &'static [Preset] {
    static LIST_PARSED: OnceLock<Vec<Preset>> = OnceLock::new();
    LIST_PARSED.get_or_init(|| parse_list(LIST))
}

fn parse_list(text: &'static str) -> Vec<Preset> {
    // The list is a build input checked by the tests; a malformed line is skipped, not fatal.
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut f = l.splitn(5, ',');
            let index = u32::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
            let name = f.next()?;
            let categories = Categories::parse(f.next()?)?;
            Some(Preset { index, name, categories, short: f.next()?, long: f.next()? })
        })
        .collect()
}

/// The preset named `name` (case-insensitive, as PAPI accepts).
pub fn preset_by_name(name: &str) -> Option<&'static Preset> {
    presets().iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// The preset with event code `code`.
pub fn preset_by_code(code: u32) -> Option<&'static Preset> {
    if code & PRESET_MASK == 0 || code & 0x4000_0000 != 0 {
        return None;
    }
    presets().iter().find(|p| p.code() == code)
}

/// A CPU vendor, as far as preset definitions care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// AuthenticAMD
    Amd,
    /// GenuineIntel
    Intel,
    /// Anything else.
    Other,
}

/// The CPU identity the definitions are selected by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// The vendor.
    pub vendor: Vendor,
    /// The display family (extended family included).
    pub family: u32,
    /// The display model (extended model included).
    pub model: u32,
}

impl Cpu {
    /// Parses the first processor's block of `/proc/cpuinfo` text.
    pub fn from_cpuinfo(text: &str) -> Cpu {
        let field = |key: &str| {
            text.lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let vendor = match field("vendor_id").as_deref() {
            Some("AuthenticAMD") => Vendor::Amd,
            Some("GenuineIntel") => Vendor::Intel,
            _ => Vendor::Other,
        };
        let num = |key| field(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        Cpu { vendor, family: num("cpu family"), model: num("model") }
    }
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.vendor {
            Vendor::Amd => "AMD",
            Vendor::Intel => "Intel",
            Vendor::Other => "unknown vendor",
        };
        write!(f, "{v} family {:#x} model {:#x}", self.family, self.model)
    }
}

/// Which CPUs a block of definitions applies to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Selector {
    /// Any CPU: perf's generic events.
    Generic,
    /// One vendor's family, optionally restricted to model ranges (inclusive).
    Family {
        /// The vendor.
        vendor: Vendor,
        /// The family.
        family: u32,
        /// Model ranges; empty means every model.
        models: Vec<(u32, u32)>,
    },
}

impl Selector {
    fn parse(s: &str) -> std::result::Result<Selector, String> {
        if s == "generic" {
            return Ok(Selector::Generic);
        }
        let mut parts = s.split(':');
        let vendor = match parts.next() {
            Some("amd") => Vendor::Amd,
            Some("intel") => Vendor::Intel,
            other => return Err(format!("unknown vendor {other:?}, expected amd, intel or generic")),
        };
        let (mut family, mut models) = (None, Vec::new());
        for p in parts {
            match p.split_once('=') {
                Some(("family", v)) => family = Some(parse_num(v)?),
                Some(("model", v)) => {
                    for r in v.split('+') {
                        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
                        models.push((parse_num(lo)?, parse_num(hi)?));
                    }
                }
                _ => return Err(format!("unknown selector part `{p}`")),
            }
        }
        let family = family.ok_or_else(|| format!("selector `{s}` lacks family="))?;
        Ok(Selector::Family { vendor, family, models })
    }

    /// Whether the selector covers `cpu`.
    pub fn matches(&self, cpu: &Cpu) -> bool {
        match self {
            Selector::Generic => true,
            Selector::Family { vendor, family, models } => {
                *vendor == cpu.vendor
                    && *family == cpu.family
                    && (models.is_empty() || models.iter().any(|&(lo, hi)| (lo..=hi).contains(&cpu.model)))
            }
        }
    }

    fn vendor(&self) -> Option<Vendor> {
        match self {
            Selector::Generic => None,
            Selector::Family { vendor, .. } => Some(*vendor),
        }
    }
}

fn parse_num(s: &str) -> std::result::Result<u32, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("bad number `{s}`"))
}

/// A core-PMU event in the vendor's event-select layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoreEvent {
    /// Event select (up to 12 bits on AMD, 8 on Intel).
    pub event: u16,
    /// Unit mask.
    pub umask: u8,
    /// Counter mask (count cycles with at least this many events).
    pub cmask: u8,
    /// Invert the counter-mask comparison.
    pub inv: bool,
    /// Count rising edges only.
    pub edge: bool,
}

impl CoreEvent {
    fn parse(text: &str) -> std::result::Result<CoreEvent, String> {
        let body = text
            .strip_prefix("cpu/")
            .and_then(|t| t.strip_suffix('/'))
            .ok_or_else(|| format!("`{text}` is not cpu/…/"))?;
        let mut ev = CoreEvent { event: 0, umask: 0, cmask: 0, inv: false, edge: false };
        let mut have_event = false;
        for kv in body.split(',') {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("`{kv}` in `{text}` is not key=value"))?;
            let n = parse_num(v)?;
            let byte = |n: u32| u8::try_from(n).map_err(|_| format!("{k}={v} exceeds 8 bits"));
            match k {
                "event" => {
                    ev.event = u16::try_from(n)
                        .ok()
                        .filter(|&e| e <= 0xfff)
                        .ok_or(format!("event={v} exceeds 12 bits"))?;
                    have_event = true;
                }
                "umask" => ev.umask = byte(n)?,
                "cmask" => ev.cmask = byte(n)?,
                "inv" => ev.inv = n != 0,
                "edge" => ev.edge = n != 0,
                _ => return Err(format!("unknown field `{k}` in `{text}`")),
            }
        }
        if !have_event {
            return Err(format!("`{text}` lacks event="));
        }
        Ok(ev)
    }

    /// The raw `config` for `vendor`: event select bits 7:0 (AMD also
    /// 11:8 in 35:32), umask 15:8, edge 18, inv 23, cmask 31:24 — the layout
    /// of AMD's PERF_CTL and Intel's IA32_PERFEVTSEL registers.
    pub fn config(&self, vendor: Vendor) -> u64 {
        let ev = u64::from(self.event);
        let mut c = (ev & 0xff) | (u64::from(self.umask) << 8) | (u64::from(self.cmask) << 24);
        if vendor == Vendor::Amd {
            c |= (ev >> 8) << 32;
        }
        if self.edge {
            c |= 1 << 18;
        }
        if self.inv {
            c |= 1 << 23;
        }
        c
    }
}

/// One native term of a preset definition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Term {
    /// A perf event name, resolved by the name parser (`cycles`, `L1-dcache-load-misses`).
    Perf {
        /// The name.
        name: String,
    },
    /// A core-PMU event written `cpu/event=…/`, encoded as a raw event.
    Core {
        /// The text as written in the file.
        text: String,
        /// The fields.
        event: CoreEvent,
        /// The vendor whose layout encodes it.
        vendor: Vendor,
    },
}

impl Term {
    /// The term as written in the definition file.
    pub fn text(&self) -> &str {
        match self {
            Term::Perf { name } => name,
            Term::Core { text, .. } => text,
        }
    }

    /// The perf event description of a core-PMU term; `None` for perf names,
    /// which go through the name parser.
    pub fn core_attr(&self) -> Option<EventAttr> {
        match self {
            Term::Perf { .. } => None,
            Term::Core { text, event, vendor } => {
                Some(EventAttr::new(text.clone(), Kind::Hardware, PERF_TYPE_RAW, event.config(*vendor)))
            }
        }
    }
}

/// One preset definition: a derivation over native terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Definition {
    /// The preset's name.
    pub preset: String,
    /// How the terms combine.
    pub derivation: Derivation,
    /// The native terms, in order (`N0`, `N1`, …).
    pub terms: Vec<Term>,
    /// A caveat shown with the definition.
    pub note: Option<String>,
    /// Where the encodings come from.
    pub source: Option<String>,
    /// The 1-based line in the definition file.
    pub line: usize,
}

impl Definition {
    /// The formula with the terms' names filled in.
    pub fn formula(&self) -> String {
        let names: Vec<String> = self.terms.iter().map(|t| t.text().to_string()).collect();
        self.derivation.formula(&names)
    }
}

/// A block of definitions for a list of CPU selectors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Block {
    /// The CPUs the block applies to.
    pub selectors: Vec<Selector>,
    /// Its definitions, in file order.
    pub definitions: Vec<Definition>,
}

/// Parsed preset definitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PresetTable {
    /// The blocks, in file order.
    pub blocks: Vec<Block>,
}

/// Splits a line at commas outside `/…/` and `"…"`.
fn fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut slash, mut quote) = (Vec::new(), String::new(), false, false);
    for ch in line.chars() {
        match ch {
            '"' => quote = !quote,
            '/' if !quote => {
                slash = !slash;
                cur.push(ch);
            }
            ',' if !slash && !quote => out.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    out.push(cur);
    out.into_iter().map(|f| f.trim().to_string()).collect()
}

impl PresetTable {
    /// The definitions shipped with papirus (`data/presets.csv`).
    pub fn builtin() -> &'static PresetTable {
        static TABLE: OnceLock<PresetTable> = OnceLock::new();
        // The built-in file is checked by the unit tests; an error here would be a
        // packaging bug, reported by those tests, so fall back to an empty table.
        TABLE.get_or_init(|| {
            PresetTable::parse(DEFINITIONS, "built-in presets.csv").unwrap_or(PresetTable { blocks: vec![] })
        })
    }

    /// Parses a definition file; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<PresetTable> {
        let err = |line: usize, reason: String| Error::PresetFile { file: file.to_string(), line, reason };
        let mut blocks: Vec<Block> = Vec::new();
        let mut in_cpu_list = false;
        let mut source: Option<String> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let f = fields(l);
            match f[0].as_str() {
                "CPU" => {
                    let sel = Selector::parse(f.get(1).map(String::as_str).unwrap_or(""))
                        .map_err(|e| err(line, e))?;
                    if !in_cpu_list {
                        blocks.push(Block { selectors: vec![], definitions: vec![] });
                        source = None;
                    }
                    let block = blocks.last_mut().ok_or_else(|| err(line, "no block".into()))?;
                    if block.selectors.iter().filter_map(Selector::vendor).any(|v| Some(v) != sel.vendor()) {
                        return Err(err(line, "one block may not mix vendors".into()));
                    }
                    block.selectors.push(sel);
                    in_cpu_list = true;
                }
                "SRC" => {
                    source = Some(f.get(1).cloned().ok_or_else(|| err(line, "SRC lacks its text".into()))?);
                }
                "PRESET" => {
                    in_cpu_list = false;
                    let block =
                        blocks.last_mut().ok_or_else(|| err(line, "PRESET before any CPU line".into()))?;
                    let vendor = block.selectors.iter().find_map(Selector::vendor);
                    let def = parse_preset(&f, vendor, source.clone(), line).map_err(|e| err(line, e))?;
                    block.definitions.push(def);
                }
                other => {
                    return Err(err(
                        line,
                        format!("unknown line kind `{other}`, expected CPU, SRC or PRESET"),
                    ));
                }
            }
        }
        Ok(PresetTable { blocks })
    }

    /// The definitions of `preset` for `cpu`, best first: every alternative
    /// from the first matching CPU-specific block that defines it, then those
    /// of the generic block.
    pub fn definitions(&self, cpu: &Cpu, preset: &str) -> Vec<&Definition> {
        let mut out: Vec<&Definition> = Vec::new();
        fn of<'a>(b: &'a Block, preset: &str) -> Vec<&'a Definition> {
            b.definitions.iter().filter(|d| d.preset.eq_ignore_ascii_case(preset)).collect()
        }
        let specific = self
            .blocks
            .iter()
            .filter(|b| b.selectors.iter().any(|s| *s != Selector::Generic && s.matches(cpu)))
            .map(|b| of(b, preset))
            .find(|d| !d.is_empty());
        out.extend(specific.unwrap_or_default());
        for b in self.blocks.iter().filter(|b| b.selectors.contains(&Selector::Generic)) {
            out.extend(of(b, preset));
        }
        out
    }

    /// Whether any block names `cpu` specifically (not just the generic block).
    pub fn knows_cpu(&self, cpu: &Cpu) -> bool {
        self.blocks.iter().any(|b| b.selectors.iter().any(|s| *s != Selector::Generic && s.matches(cpu)))
    }
}

fn parse_preset(
    f: &[String],
    vendor: Option<Vendor>,
    source: Option<String>,
    line: usize,
) -> std::result::Result<Definition, String> {
    let name = f.get(1).ok_or("PRESET lacks a name")?;
    if preset_by_name(name).is_none() {
        return Err(format!("`{name}` is not a PAPI preset"));
    }
    let op = f.get(2).ok_or("PRESET lacks a derivation")?;
    let mut rest = &f[3..];
    let mut postfix_text = None;
    if op == "DERIVED_POSTFIX" {
        postfix_text = Some(rest.first().ok_or("DERIVED_POSTFIX lacks its expression")?.clone());
        rest = &rest[1..];
    }
    let mut terms = Vec::new();
    let mut note = None;
    let mut it = rest.iter();
    while let Some(t) = it.next() {
        if t == "NOTE" {
            note = Some(it.next().ok_or("NOTE lacks its text")?.clone());
            continue;
        }
        if t.is_empty() {
            return Err("empty term".into());
        }
        let term = if t.starts_with("cpu/") {
            let v =
                vendor.ok_or(format!("`{t}` needs a vendor block; the generic block takes perf names"))?;
            Term::Core { text: t.clone(), event: CoreEvent::parse(t)?, vendor: v }
        } else {
            Term::Perf { name: t.clone() }
        };
        if let (Term::Core { event, .. }, Some(Vendor::Intel)) = (&term, vendor)
            && event.event > 0xff
        {
            return Err(format!("`{t}`: Intel event selects have 8 bits"));
        }
        terms.push(term);
    }
    if terms.is_empty() || terms.len() > MAX_TERMS {
        return Err(format!("{} terms; a preset has 1 to {MAX_TERMS}", terms.len()));
    }
    let derivation = match op.as_str() {
        "NOT_DERIVED" if terms.len() == 1 => Derivation::NotDerived,
        "NOT_DERIVED" => return Err("NOT_DERIVED takes exactly one term".into()),
        "DERIVED_ADD" => Derivation::Add,
        "DERIVED_SUB" => Derivation::Sub,
        "DERIVED_POSTFIX" => {
            Derivation::Postfix(Postfix::parse(postfix_text.as_deref().unwrap_or(""), terms.len())?)
        }
        other => return Err(format!("unknown derivation `{other}`")),
    };
    Ok(Definition { preset: name.clone(), derivation, terms, note, source, line })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_has_every_papi7_preset_in_order() {
        let p = presets();
        assert_eq!(p.len(), 110);
        for (i, e) in p.iter().enumerate() {
            assert_eq!(e.index as usize, i, "{} out of order", e.name);
            assert!(e.name.starts_with("PAPI_") && !e.short.is_empty() && !e.long.is_empty());
            assert_ne!(e.categories, Categories(0), "{} has no category", e.name);
        }
        // PAPI 7.0's categories (papi_common_strings.h).
        let cats = |n: &str| preset_by_name(n).unwrap().categories.names().collect::<Vec<_>>();
        assert_eq!(cats("PAPI_L1_ICM"), ["ins", "cach", "l1"]);
        assert_eq!(cats("PAPI_BR_MSP"), ["br", "cnd"]);
        assert_eq!(cats("PAPI_TOT_CYC"), ["msc"]);
        assert_eq!(preset_by_name("PAPI_FP_OPS").unwrap().categories, Categories(1 << 14 | 1 << 4));
        // Spot checks against papiStdEventDefs.h.
        assert_eq!(preset_by_name("PAPI_L1_DCM").unwrap().code(), 0x8000_0000);
        assert_eq!(preset_by_name("PAPI_TOT_INS").unwrap().code(), 0x8000_0032);
        assert_eq!(preset_by_name("PAPI_TOT_CYC").unwrap().code(), 0x8000_003b);
        assert_eq!(preset_by_name("papi_fp_ops").unwrap().code(), 0x8000_0066);
        assert_eq!(preset_by_name("PAPI_REF_CYC").unwrap().code(), 0x8000_006b);
        assert_eq!(preset_by_code(0x8000_002e).unwrap().name, "PAPI_BR_MSP");
        assert!(preset_by_code(0x8000_00ff).is_none());
        assert!(preset_by_code(0x4000_0001).is_none());
    }

    #[test]
    fn the_builtin_definitions_parse() {
        let t = PresetTable::parse(DEFINITIONS, "presets.csv").unwrap();
        assert!(t.blocks.len() >= 8);
        assert!(
            t.blocks.iter().all(|b| b.definitions.iter().all(|d| d.source.is_some())),
            "every line cites a source"
        );
        assert_eq!(&t, PresetTable::builtin());
    }

    #[test]
    fn bad_files_are_reported_with_their_line() {
        let e =
            PresetTable::parse("CPU,generic\nPRESET,PAPI_NOPE,NOT_DERIVED,cycles\n", "x.csv").unwrap_err();
        assert_eq!(e.to_string(), "x.csv:2: `PAPI_NOPE` is not a PAPI preset");
        let e = PresetTable::parse("CPU,generic\nPRESET,PAPI_TOT_CYC,NOT_DERIVED,cpu/event=0x3c/\n", "x")
            .unwrap_err();
        assert!(e.to_string().contains("needs a vendor block"), "{e}");
        let e =
            PresetTable::parse("CPU,intel:family=6\nPRESET,PAPI_TOT_CYC,NOT_DERIVED,cpu/event=0x13c/\n", "x")
                .unwrap_err();
        assert!(e.to_string().contains("8 bits"), "{e}");
        let e = PresetTable::parse(
            "CPU,amd:family=0x17\nPRESET,PAPI_L1_DCH,DERIVED_POSTFIX,N0|N1|,cpu/event=1/,cpu/event=2/",
            "x",
        )
        .unwrap_err();
        assert!(e.to_string().contains("leaves 2 values"), "{e}");
        let e = PresetTable::parse("PRESET,PAPI_TOT_CYC,NOT_DERIVED,cycles", "x").unwrap_err();
        assert!(e.to_string().contains("before any CPU"), "{e}");
    }

    #[test]
    fn cpuinfo_is_parsed() {
        let c =
            Cpu::from_cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n");
        assert_eq!(c, Cpu { vendor: Vendor::Amd, family: 0x1a, model: 2 });
        assert_eq!(Cpu::from_cpuinfo("").vendor, Vendor::Other);
    }

    /// What a preset resolves to on `cpu`: its derivation and raw configs.
    fn resolve(cpu: Cpu, preset: &str) -> (String, Vec<u64>) {
        let d = PresetTable::builtin().definitions(&cpu, preset);
        let d = d.first().unwrap_or_else(|| panic!("{preset} undefined on {cpu}"));
        let configs = d
            .terms
            .iter()
            .map(|t| {
                let a = t.core_attr().unwrap_or_else(|| panic!("{preset} on {cpu} is not a core event"));
                assert_eq!(a.pmu_type(), PERF_TYPE_RAW);
                a.config_value()
            })
            .collect();
        (d.derivation.papi_name().to_string(), configs)
    }

    const ZEN2: Cpu = Cpu { vendor: Vendor::Amd, family: 0x17, model: 0x31 };
    const ZEN3: Cpu = Cpu { vendor: Vendor::Amd, family: 0x19, model: 0x01 };
    const ZEN4: Cpu = Cpu { vendor: Vendor::Amd, family: 0x19, model: 0x11 };
    const ZEN5: Cpu = Cpu { vendor: Vendor::Amd, family: 0x1a, model: 0x02 };
    const SKL: Cpu = Cpu { vendor: Vendor::Intel, family: 6, model: 0x5e };
    const SKX: Cpu = Cpu { vendor: Vendor::Intel, family: 6, model: 0x55 };
    const ICL: Cpu = Cpu { vendor: Vendor::Intel, family: 6, model: 0x7e };

    // Expected configs restate the vendors' documented encodings: AMD PPR
    // PMCxEEE with umask UU is config 0x0E_0000_UUEE (event bits 11:8 at
    // 35:32); Intel event EE umask UU is 0xUUEE.
    #[test]
    fn amd_zen_presets_resolve_to_the_ppr_encodings() {
        for cpu in [ZEN2, ZEN3, ZEN4, ZEN5] {
            assert_eq!(resolve(cpu, "PAPI_TOT_CYC"), ("NOT_DERIVED".into(), vec![0x76]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_TOT_INS"), ("NOT_DERIVED".into(), vec![0xc0]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_BR_INS"), ("NOT_DERIVED".into(), vec![0xc2]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_BR_MSP"), ("NOT_DERIVED".into(), vec![0xc3]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_BR_TKN"), ("NOT_DERIVED".into(), vec![0xc4]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_BR_CN"), ("NOT_DERIVED".into(), vec![0xd1]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_BR_UCN"), ("DERIVED_SUB".into(), vec![0xc2, 0xd1]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L1_DCA"), ("NOT_DERIVED".into(), vec![0x40]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L1_DCM"), ("NOT_DERIVED".into(), vec![0xc860]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L1_DCH"), ("DERIVED_SUB".into(), vec![0x40, 0xc860]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_TLB_DM"), ("NOT_DERIVED".into(), vec![0xf045]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_TLB_IM"), ("NOT_DERIVED".into(), vec![0xff85]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L2_DCM"), ("NOT_DERIVED".into(), vec![0x0864]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L2_ICM"), ("NOT_DERIVED".into(), vec![0x0164]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L2_TCM"), ("NOT_DERIVED".into(), vec![0x0964]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_LD_INS"), ("NOT_DERIVED".into(), vec![0x0129]), "{cpu}");
        }
        assert_eq!(resolve(ZEN2, "PAPI_FP_OPS"), ("NOT_DERIVED".into(), vec![0xff03]));
        assert_eq!(resolve(ZEN3, "PAPI_FP_OPS"), ("NOT_DERIVED".into(), vec![0xff03]));
        assert_eq!(resolve(ZEN4, "PAPI_FP_OPS"), ("NOT_DERIVED".into(), vec![0x1f03]));
        assert_eq!(resolve(ZEN5, "PAPI_FP_OPS"), ("NOT_DERIVED".into(), vec![0x0f03]));
        assert_eq!(resolve(ZEN2, "PAPI_L1_ICM"), ("NOT_DERIVED".into(), vec![0x81]));
        assert_eq!(resolve(ZEN2, "PAPI_STL_ICY"), ("NOT_DERIVED".into(), vec![0x0287]));
        // PMCx18E: event bits 11:8 (0x1) land in config bits 35:32.
        assert_eq!(resolve(ZEN3, "PAPI_L1_ICM"), ("NOT_DERIVED".into(), vec![0x1_0000_188e]));
        assert_eq!(resolve(ZEN4, "PAPI_L1_ICA"), ("NOT_DERIVED".into(), vec![0x1_0000_1f8e]));
    }

    #[test]
    fn intel_presets_resolve_to_the_sdm_encodings() {
        for cpu in [SKL, SKX, ICL] {
            assert_eq!(resolve(cpu, "PAPI_TOT_CYC"), ("NOT_DERIVED".into(), vec![0x3c]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_TOT_INS"), ("NOT_DERIVED".into(), vec![0xc0]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_BR_INS"), ("NOT_DERIVED".into(), vec![0xc4]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_REF_CYC"), ("NOT_DERIVED".into(), vec![0x0300]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L1_DCM"), ("NOT_DERIVED".into(), vec![0x0151]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L1_ICM"), ("NOT_DERIVED".into(), vec![0x0283]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L2_DCM"), ("DERIVED_ADD".into(), vec![0x2124, 0x2224]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_L2_TCM"), ("NOT_DERIVED".into(), vec![0x3f24]), "{cpu}");
            assert_eq!(
                resolve(cpu, "PAPI_L2_DCH"),
                ("DERIVED_POSTFIX".into(), vec![0xe124, 0xe224, 0x2124, 0x2224]),
                "{cpu}"
            );
            assert_eq!(resolve(cpu, "PAPI_L3_TCM"), ("NOT_DERIVED".into(), vec![0x412e]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_LD_INS"), ("NOT_DERIVED".into(), vec![0x81d0]), "{cpu}");
            assert_eq!(resolve(cpu, "PAPI_SR_INS"), ("NOT_DERIVED".into(), vec![0x82d0]), "{cpu}");
            // UOPS_ISSUED.STALL_CYCLES: 0e/01 with cmask 1 (bits 31:24) and inv (bit 23).
            assert_eq!(resolve(cpu, "PAPI_STL_ICY"), ("NOT_DERIVED".into(), vec![0x0180_010e]), "{cpu}");
        }
        assert_eq!(resolve(SKL, "PAPI_BR_MSP"), ("NOT_DERIVED".into(), vec![0x01c5]));
        assert_eq!(resolve(SKL, "PAPI_BR_CN"), ("NOT_DERIVED".into(), vec![0x01c4]));
        assert_eq!(resolve(SKL, "PAPI_BR_TKN"), ("DERIVED_SUB".into(), vec![0x01c4, 0x10c4]));
        assert_eq!(resolve(SKL, "PAPI_TLB_DM"), ("DERIVED_ADD".into(), vec![0x0108, 0x0149]));
        assert_eq!(
            resolve(SKL, "PAPI_FP_OPS"),
            ("DERIVED_POSTFIX".into(), vec![0x03c7, 0x04c7, 0x18c7, 0x20c7])
        );
        assert_eq!(
            resolve(SKX, "PAPI_DP_OPS"),
            ("DERIVED_POSTFIX".into(), vec![0x01c7, 0x04c7, 0x10c7, 0x40c7])
        );
        assert_eq!(resolve(SKX, "PAPI_FP_INS"), ("NOT_DERIVED".into(), vec![0xffc7]));
        assert_eq!(resolve(ICL, "PAPI_BR_MSP"), ("NOT_DERIVED".into(), vec![0x11c5]));
        assert_eq!(resolve(ICL, "PAPI_BR_CN"), ("NOT_DERIVED".into(), vec![0x11c4]));
        assert_eq!(resolve(ICL, "PAPI_BR_TKN"), ("NOT_DERIVED".into(), vec![0x01c4]));
        assert_eq!(resolve(ICL, "PAPI_TLB_IM"), ("NOT_DERIVED".into(), vec![0x0e85]));
    }

    /// Every preset on every CPU the table knows, as text: the meaning of
    /// `data/presets.csv`, pinned by `tests/golden/presets-by-cpu.txt`.
    /// `PAPIRUS_BLESS=1 cargo test -p papirus-lowlevel --lib golden` rewrites it.
    #[test]
    fn golden_resolution_of_every_preset() {
        let other = Cpu { vendor: Vendor::Other, family: 0, model: 0 };
        let mut out = String::from(
            "# format_version 1: preset -> first definition per CPU (raw configs for core events)\n",
        );
        for (label, cpu) in [
            ("zen2", ZEN2),
            ("zen3", ZEN3),
            ("zen4", ZEN4),
            ("zen5", ZEN5),
            ("skylake", SKL),
            ("skylake-x", SKX),
            ("icelake", ICL),
            ("other", other),
        ] {
            out.push_str(&format!("[{label}: {cpu}]\n"));
            for p in presets() {
                let defs = PresetTable::builtin().definitions(&cpu, p.name);
                let line = match defs.first() {
                    None => "-".to_string(),
                    Some(d) => {
                        let terms: Vec<String> = d
                            .terms
                            .iter()
                            .map(|t| {
                                t.core_attr()
                                    .map_or(t.text().to_string(), |a| format!("{:#x}", a.config_value()))
                            })
                            .collect();
                        let alts = if defs.len() > 1 {
                            format!(" (+{} alternatives)", defs.len() - 1)
                        } else {
                            String::new()
                        };
                        format!("{} {}{alts}", d.derivation.papi_name(), terms.join(","))
                    }
                };
                out.push_str(&format!("{} {line}\n", p.name));
            }
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/presets-by-cpu.txt");
        if std::env::var_os("PAPIRUS_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &out).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(golden == out, "preset resolution changed; inspect and rerun with PAPIRUS_BLESS=1");
    }

    #[test]
    fn other_cpus_fall_back_to_perf_generic_events() {
        let arm = Cpu { vendor: Vendor::Other, family: 0, model: 0 };
        let d = PresetTable::builtin().definitions(&arm, "PAPI_TOT_CYC");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].terms, vec![Term::Perf { name: "cycles".into() }]);
        let d = PresetTable::builtin().definitions(&arm, "PAPI_L1_DCM");
        assert_eq!(d.len(), 2, "loads+stores, then loads only");
        assert_eq!(d[0].derivation, Derivation::Add);
        // A known CPU tries its own encoding first, then the generic one.
        let d = PresetTable::builtin().definitions(&ZEN3, "PAPI_TOT_CYC");
        assert_eq!(d.len(), 2);
        assert!(matches!(d[0].terms[0], Term::Core { .. }));
        assert!(PresetTable::builtin().definitions(&arm, "PAPI_CA_SNP").is_empty());
        assert!(PresetTable::builtin().knows_cpu(&ZEN5) && !PresetTable::builtin().knows_cpu(&arm));
    }
}
