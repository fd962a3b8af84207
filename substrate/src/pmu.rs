//! PMU discovery from sysfs: every perf PMU the kernel registered, with its
//! type number, the format fields that say where each term's bits go in
//! `config`/`config1`/`config2`/`config3`, the named events it publishes and
//! the CPUs it counts on.
//!
//! The root directory (normally `/sys/bus/event_source/devices`) is a
//! parameter so tests can run on fixture trees of machines they are not on.
//! Nothing here panics on odd sysfs contents: only an unreadable root is an
//! error; a PMU, format field or event that cannot be read or parsed is kept
//! out of the set and reported, with the reason, in [`PmuSet::skipped`].

use std::fs;
use std::path::{Path, PathBuf};

use crate::attr::{Domain, Kind};
use crate::error::{Error, Result};

/// Where Linux lists its perf PMUs.
pub const SYSFS_PMU_ROOT: &str = "/sys/bus/event_source/devices";

/// One of the `perf_event_attr` words a format field writes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigWord {
    /// `config`
    Config,
    /// `config1`
    Config1,
    /// `config2`
    Config2,
    /// `config3` (newer kernels; papirus' attr has no slot for it yet).
    Config3,
}

impl ConfigWord {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "config" => Some(ConfigWord::Config),
            "config1" => Some(ConfigWord::Config1),
            "config2" => Some(ConfigWord::Config2),
            "config3" => Some(ConfigWord::Config3),
            _ => None,
        }
    }

    /// The name sysfs and perf use for the word.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigWord::Config => "config",
            ConfigWord::Config1 => "config1",
            ConfigWord::Config2 => "config2",
            ConfigWord::Config3 => "config3",
        }
    }
}

/// A format field: `umask` is `config:8-15`, AMD's `event` is `config:0-7,32-35`.
///
/// A value's low bits fill the first range, the next bits the second, and so on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    /// The term name (`event`, `umask`, `retprobe`…).
    pub name: String,
    /// The attr word it lives in.
    pub word: ConfigWord,
    /// Bit ranges, inclusive, low bits of the value first.
    pub ranges: Vec<(u8, u8)>,
}

impl FormatField {
    /// Parses the contents of a `format/<name>` file (`config:0-7,32-35`).
    pub fn parse(name: &str, text: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        let (word, bits) = text.split_once(':').ok_or_else(|| format!("`{text}` has no `word:bits`"))?;
        let word = ConfigWord::parse(word.trim()).ok_or_else(|| format!("unknown attr word `{word}`"))?;
        let mut ranges = Vec::new();
        let mut width = 0u32;
        for part in bits.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: u8 = lo.trim().parse().map_err(|_| format!("bad bit `{lo}` in `{text}`"))?;
            let hi: u8 = hi.trim().parse().map_err(|_| format!("bad bit `{hi}` in `{text}`"))?;
            if lo > hi || hi > 63 {
                return Err(format!("bad bit range `{part}` in `{text}`"));
            }
            width += u32::from(hi - lo) + 1;
            ranges.push((lo, hi));
        }
        if width > 64 {
            return Err(format!("`{text}` is wider than 64 bits"));
        }
        Ok(FormatField { name: name.to_string(), word, ranges })
    }

    /// How many bits of a value the field holds.
    pub fn width(&self) -> u32 {
        self.ranges.iter().map(|(lo, hi)| u32::from(hi - lo) + 1).sum()
    }

    /// The largest value the field holds.
    pub fn max_value(&self) -> u64 {
        match self.width() {
            64 => u64::MAX,
            w => (1u64 << w) - 1,
        }
    }

    /// The bits of the word this field owns.
    pub fn mask(&self) -> u64 {
        self.ranges.iter().fold(0, |m, &(lo, hi)| m | range_mask(lo, hi))
    }

    /// Scatters `value` into the field's bits; `None` if it does not fit.
    pub fn scatter(&self, value: u64) -> Option<u64> {
        if value > self.max_value() {
            return None;
        }
        let mut out = 0u64;
        let mut v = value;
        for &(lo, hi) in &self.ranges {
            let w = u32::from(hi - lo) + 1;
            let part = if w == 64 { v } else { v & ((1u64 << w) - 1) };
            out |= part << lo;
            v = v.checked_shr(w).unwrap_or(0);
        }
        Some(out)
    }
}

fn range_mask(lo: u8, hi: u8) -> u64 {
    let w = u32::from(hi - lo) + 1;
    let ones = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    ones << lo
}

/// A named event a PMU publishes in `events/`: `cpu-cycles` is `event=0x3c`.
#[derive(Clone, Debug, PartialEq)]
pub struct PmuAlias {
    /// The file name.
    pub name: String,
    /// The terms, as written (`event=0x3c,umask=0x00`).
    pub terms: String,
    /// The `.scale` factor that turns a count into `unit`, 1 when absent.
    pub scale: f64,
    /// The `.unit` file (`Joules`, `MiB`), if any.
    pub unit: Option<String>,
}

/// One perf PMU as sysfs describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Pmu {
    /// The directory name (`cpu`, `msr`, `uprobe`…), which perf uses as its name.
    pub name: String,
    /// The `perf_event_attr.type` to open its events with.
    pub type_: u32,
    /// Format fields, by name.
    pub formats: Vec<FormatField>,
    /// Named events, sorted by name.
    pub aliases: Vec<PmuAlias>,
    /// CPUs from `cpumask` (or `cpus` on hybrid machines); `None` if the PMU
    /// has neither file, which means it counts on every CPU.
    pub cpumask: Option<Vec<u32>>,
}

impl Pmu {
    /// The format field named `name`.
    pub fn format(&self, name: &str) -> Option<&FormatField> {
        self.formats.iter().find(|f| f.name == name)
    }

    /// The alias named `name` (sysfs names are case-sensitive; perf compares
    /// them without case, and so does this).
    pub fn alias(&self, name: &str) -> Option<&PmuAlias> {
        self.aliases.iter().find(|a| a.name.eq_ignore_ascii_case(name))
    }

    /// Whether this is a CPU core PMU, whose events need hardware counters.
    pub fn is_core(&self) -> bool {
        matches!(self.name.as_str(), "cpu" | "cpu_core" | "cpu_atom") || self.name.starts_with("armv")
    }

    /// Whether the PMU cannot exclude a privilege mode (msr, RAPL, C-states,
    /// uncore): the kernel refuses any `exclude_*` bit on its events.
    ///
    /// sysfs does not publish the kernel's `PERF_PMU_CAP_NO_EXCLUDE`; this
    /// follows the list of [`Domain::default_for`].
    pub fn counts_all_domains(&self) -> bool {
        Domain::default_for(Kind::Dynamic, &self.name, 0) == Domain::ALL
    }
}

/// Parses a kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpulist(text: &str) -> std::result::Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    let text = text.trim();
    if text.is_empty() {
        return Ok(cpus);
    }
    for part in text.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: u32 = lo.trim().parse().map_err(|_| format!("bad CPU `{lo}` in `{text}`"))?;
        let hi: u32 = hi.trim().parse().map_err(|_| format!("bad CPU `{hi}` in `{text}`"))?;
        if lo > hi || hi - lo > 65_536 {
            return Err(format!("bad CPU range `{part}` in `{text}`"));
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus)
}

/// Every PMU found under one sysfs root.
#[derive(Clone, Debug, PartialEq)]
pub struct PmuSet {
    root: PathBuf,
    pmus: Vec<Pmu>,
    skipped: Vec<String>,
}

impl PmuSet {
    /// Reads this machine's PMUs from [`SYSFS_PMU_ROOT`].
    pub fn discover() -> Result<Self> {
        Self::discover_at(SYSFS_PMU_ROOT)
    }

    /// Reads the PMUs of a sysfs-shaped tree (`<root>/<pmu>/type`, `format/`, `events/`).
    pub fn discover_at(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let mut pmus = Vec::new();
        let mut skipped = Vec::new();
        for entry in read_dir(&root)? {
            let dir = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            match read_pmu(&dir, &name, &mut skipped) {
                Ok(Some(pmu)) => pmus.push(pmu),
                Ok(None) => {}
                Err(e) => skipped.push(format!("{name}: {e}")),
            }
        }
        pmus.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(PmuSet { root, pmus, skipped })
    }

    /// A set built from PMUs already in hand (tests, synthetic machines).
    pub fn from_pmus(root: impl Into<PathBuf>, mut pmus: Vec<Pmu>) -> Self {
        pmus.sort_by(|a, b| a.name.cmp(&b.name));
        PmuSet { root: root.into(), pmus, skipped: Vec::new() }
    }

    /// The root this set was read from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// All PMUs, sorted by name.
    pub fn pmus(&self) -> &[Pmu] {
        &self.pmus
    }

    /// The PMU named `name`.
    pub fn get(&self, name: &str) -> Option<&Pmu> {
        self.pmus.iter().find(|p| p.name == name)
    }

    /// Entries that could not be parsed, each with the reason (kept, not fatal).
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    let io = |source| Error::Io { path: dir.to_path_buf(), source };
    let mut entries = fs::read_dir(dir).map_err(io)?.collect::<std::io::Result<Vec<_>>>().map_err(io)?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

fn read_text(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

fn read_optional(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io { path: path.to_path_buf(), source }),
    }
}

/// Reads one PMU directory; `None` if it is not a PMU (no `type` file).
fn read_pmu(dir: &Path, name: &str, skipped: &mut Vec<String>) -> Result<Option<Pmu>> {
    let Some(type_text) = read_optional(&dir.join("type"))? else {
        return Ok(None);
    };
    let type_ = type_text.trim().parse::<u32>().map_err(|_| Error::Malformed {
        event: name.to_string(),
        reason: format!("{}/type holds `{}`, not a number", dir.display(), type_text.trim()),
    })?;

    let mut formats = Vec::new();
    let format_dir = dir.join("format");
    if format_dir.is_dir() {
        for e in read_dir(&format_dir)? {
            let field = e.file_name().to_string_lossy().into_owned();
            let text = read_text(&e.path())?;
            match FormatField::parse(&field, &text) {
                Ok(f) => formats.push(f),
                Err(why) => skipped.push(format!("{name}/format/{field}: {why}")),
            }
        }
    }

    let mut aliases = Vec::new();
    let events_dir = dir.join("events");
    if events_dir.is_dir() {
        for e in read_dir(&events_dir)? {
            let file = e.file_name().to_string_lossy().into_owned();
            // `.scale`, `.unit`, `.snapshot` and `.per-pkg` describe their event.
            if file.contains('.') {
                continue;
            }
            let terms = read_text(&e.path())?.trim().to_string();
            let scale = match read_optional(&events_dir.join(format!("{file}.scale")))? {
                Some(s) => match s.trim().parse::<f64>() {
                    Ok(v) if v.is_finite() => v,
                    _ => {
                        skipped.push(format!("{name}/events/{file}.scale: `{}` is not a number", s.trim()));
                        continue;
                    }
                },
                None => 1.0,
            };
            let unit = read_optional(&events_dir.join(format!("{file}.unit")))?
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty());
            aliases.push(PmuAlias { name: file, terms, scale, unit });
        }
    }

    let mask_text = match read_optional(&dir.join("cpumask"))? {
        Some(t) => Some(t),
        None => read_optional(&dir.join("cpus"))?,
    };
    let cpumask = match mask_text {
        Some(t) => match parse_cpulist(&t) {
            Ok(c) => Some(c),
            Err(why) => {
                skipped.push(format!("{name}/cpumask: {why}"));
                None
            }
        },
        None => None,
    };

    Ok(Some(Pmu { name: name.to_string(), type_, formats, aliases, cpumask }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(machine: &str) -> PmuSet {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs").join(machine);
        PmuSet::discover_at(root).expect("fixture tree reads")
    }

    #[test]
    fn format_ranges_parse_and_scatter() {
        let amd = FormatField::parse("event", "config:0-7,32-35\n").unwrap();
        assert_eq!(amd.word, ConfigWord::Config);
        assert_eq!(amd.ranges, vec![(0, 7), (32, 35)]);
        assert_eq!(amd.width(), 12);
        assert_eq!(amd.mask(), 0x0000_000f_0000_00ff);
        // Low 8 bits go to 0-7, the next 4 to 32-35.
        assert_eq!(amd.scatter(0x1c0), Some(0x1_0000_00c0));
        assert_eq!(amd.scatter(0xfff), Some(0xf_0000_00ff));
        assert_eq!(amd.scatter(0x1000), None);

        let bit = FormatField::parse("any", "config:21").unwrap();
        assert_eq!(bit.ranges, vec![(21, 21)]);
        assert_eq!(bit.scatter(1), Some(1 << 21));
        assert_eq!(bit.scatter(2), None);

        let full = FormatField::parse("offcore_rsp", "config1:0-63").unwrap();
        assert_eq!(full.word, ConfigWord::Config1);
        assert_eq!(full.max_value(), u64::MAX);
        assert_eq!(full.scatter(u64::MAX), Some(u64::MAX));
    }

    #[test]
    fn format_garbage_is_an_error_not_a_panic() {
        for bad in [
            "",
            "config",
            "config:",
            "config:8-4",
            "config:0-64",
            "confug:0-7",
            "config:a-b",
            "config:0-63,0-1",
        ] {
            assert!(FormatField::parse("x", bad).is_err(), "`{bad}` accepted");
        }
    }

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<u32>::new());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("x").is_err());
    }

    #[test]
    fn intel_fixture() {
        let set = fixture("intel");
        assert!(set.skipped().is_empty(), "{:?}", set.skipped());
        let cpu = set.get("cpu").unwrap();
        assert_eq!(cpu.type_, 4);
        assert!(cpu.is_core() && !cpu.counts_all_domains());
        assert_eq!(cpu.cpumask, None);
        let f = |n: &str| cpu.format(n).unwrap_or_else(|| panic!("format {n}"));
        assert_eq!((f("event").word, f("event").ranges.clone()), (ConfigWord::Config, vec![(0, 7)]));
        assert_eq!(f("umask").ranges, vec![(8, 15)]);
        assert_eq!(f("edge").ranges, vec![(18, 18)]);
        assert_eq!(f("pc").ranges, vec![(19, 19)]);
        assert_eq!(f("any").ranges, vec![(21, 21)]);
        assert_eq!(f("inv").ranges, vec![(23, 23)]);
        assert_eq!(f("cmask").ranges, vec![(24, 31)]);
        assert_eq!(f("in_tx").ranges, vec![(32, 32)]);
        assert_eq!(f("in_tx_cp").ranges, vec![(33, 33)]);
        assert_eq!((f("ldlat").word, f("ldlat").ranges.clone()), (ConfigWord::Config1, vec![(0, 15)]));
        assert_eq!(f("frontend").ranges, vec![(0, 23)]);
        assert_eq!(
            (f("offcore_rsp").word, f("offcore_rsp").ranges.clone()),
            (ConfigWord::Config1, vec![(0, 63)])
        );
        assert_eq!(cpu.alias("cpu-cycles").unwrap().terms, "event=0x3c");
        assert_eq!(cpu.alias("instructions").unwrap().terms, "event=0xc0");
        assert_eq!(cpu.alias("cache-misses").unwrap().terms, "event=0x2e,umask=0x41");
        assert_eq!(cpu.alias("ref-cycles").unwrap().terms, "event=0x00,umask=0x03");
        assert_eq!(cpu.alias("CPU-CYCLES").unwrap().name, "cpu-cycles");
        let slots = cpu.alias("topdown-total-slots").unwrap();
        assert_eq!(slots.scale, 4.0);
        assert_eq!(slots.unit, None);

        let power = set.get("power").unwrap();
        assert_eq!(power.cpumask, Some(vec![0]));
        assert!(power.counts_all_domains());
        let pkg = power.alias("energy-pkg").unwrap();
        assert_eq!(pkg.terms, "event=0x02");
        assert_eq!(pkg.unit.as_deref(), Some("Joules"));
        assert_eq!(pkg.scale, 2f64.powi(-32), "RAPL energy unit");
    }

    #[test]
    fn amd_fixture() {
        let set = fixture("amd");
        assert!(set.skipped().is_empty(), "{:?}", set.skipped());
        let cpu = set.get("cpu").unwrap();
        assert_eq!(cpu.type_, 4);
        assert_eq!(cpu.format("event").unwrap().ranges, vec![(0, 7), (32, 35)]);
        assert_eq!(cpu.format("umask").unwrap().ranges, vec![(8, 15)]);
        assert_eq!(cpu.format("edge").unwrap().ranges, vec![(18, 18)]);
        assert_eq!(cpu.format("inv").unwrap().ranges, vec![(23, 23)]);
        assert_eq!(cpu.format("cmask").unwrap().ranges, vec![(24, 31)]);
        assert!(cpu.format("any").is_none());
    }

    #[test]
    fn broken_fixture_entries_are_skipped_with_reasons() {
        let set = fixture("broken");
        // `good` reads; `notype` is not a PMU; `badtype` fails to parse.
        assert!(set.get("good").is_some());
        assert!(set.get("notype").is_none());
        assert!(set.get("badtype").is_none());
        let good = set.get("good").unwrap();
        assert!(good.format("bad").is_none());
        assert!(good.format("event").is_some());
        let text = set.skipped().join("\n");
        assert!(text.contains("badtype"), "{text}");
        assert!(text.contains("good/format/bad"), "{text}");
        assert!(text.contains("good/events/weird.scale"), "{text}");
    }

    #[test]
    fn this_machine() {
        let set = PmuSet::discover().expect("sysfs readable");
        // Every Linux kernel with perf registers these three fixed-type PMUs.
        assert_eq!(set.get("software").map(|p| p.type_), Some(1));
        assert_eq!(set.get("tracepoint").map(|p| p.type_), Some(2));
        assert_eq!(set.get("breakpoint").map(|p| p.type_), Some(5));
        match set.get("uprobe") {
            Some(up) => {
                let ret = up.format("retprobe").expect("uprobe PMU publishes format/retprobe");
                assert_eq!(ret.word, ConfigWord::Config);
                assert_eq!(ret.width(), 1);
            }
            None => println!("no uprobe PMU on this kernel (CONFIG_UPROBE_EVENTS off)"),
        }
        match set.get("msr") {
            Some(msr) => {
                // The x86 msr driver: format event=config:0-63, tsc is event 0.
                assert_eq!(msr.alias("tsc").map(|a| a.terms.as_str()), Some("event=0x00"), "{msr:?}");
                assert_eq!(msr.format("event").map(|f| f.ranges.clone()), Some(vec![(0, 63)]));
                assert!(msr.counts_all_domains());
            }
            None => println!("no msr PMU on this machine"),
        }
        for p in set.pmus() {
            println!("{} type {} formats {} aliases {}", p.name, p.type_, p.formats.len(), p.aliases.len());
        }
    }
}
