//! Event names as `perf stat -e` takes them, turned into the [`EventAttr`]
//! perf itself would open.
//!
//! # Syntax
//!
//! | form | example | attr |
//! | --- | --- | --- |
//! | hardware | `cycles`, `instructions`, `branch-misses`, `ref-cycles` | `PERF_TYPE_HARDWARE`, config = `PERF_COUNT_HW_*` |
//! | software | `task-clock`, `page-faults`/`faults`, `cs`, `dummy` | `PERF_TYPE_SOFTWARE`, config = `PERF_COUNT_SW_*` |
//! | hw-cache | `L1-dcache-load-misses`, `LLC-loads`, `dTLB-store-misses`, `branch-loads` | `PERF_TYPE_HW_CACHE`, config = cache \| op << 8 \| result << 16 |
//! | raw | `r01c2` | `PERF_TYPE_RAW`, config = the hex number |
//! | sysfs PMU | `cpu/event=0x3c,umask=0x00,cmask=1/`, `msr/tsc/`, `cpu/mem-loads,ldlat=30/` | the PMU's type; terms placed by its `format/` fields |
//! | PMU event alias | `tsc`, `cpu-cycles` (when no table above claims it) | as `pmu/alias/` |
//! | tracepoint | `syscalls:sys_enter_write` | `PERF_TYPE_TRACEPOINT`, config = the tracefs id |
//! | breakpoint | `mem:0x401126:x`, `mem:0x601040/4:w`, `mem:my_function:x` | `PERF_TYPE_BREAKPOINT`, bp_addr, bp_len, bp_type |
//! | uprobe | `uprobe:/usr/bin/prog:main+4`, `uretprobe:/lib/x86_64-linux-gnu/libc.so.6:malloc` | the `uprobe` PMU; config1 = path, config2 = file offset |
//!
//! Modifiers follow a `:` (or directly the closing `/` of a PMU event):
//! `u` user, `k` kernel, `h` hypervisor, in any combination (`:uk`). Any of
//! them restricts counting to the domains named, as perf does.
//!
//! # Defaults
//!
//! Without modifiers an event gets [`Domain::default_for`] its PMU: user
//! space only, so a user without privileges can measure their own programs,
//! except where user only would be refused or count nothing (tracepoints,
//! the scheduler's software events, and PMUs that cannot exclude a mode:
//! msr, RAPL `power`, C-states, uncore). Naming a modifier on one of the
//! latter is an error here rather than an `EINVAL` at open
//! ([`Pmu::counts_all_domains`]).
//!
//! # Breakpoints and probes
//!
//! `mem:ADDR[/LEN][:ACCESS]`: ACCESS is `r`, `w`, `rw` or `x` (perf's
//! default `rw` when omitted), LEN 1, 2, 4 or 8 (default 4 for data, 8 for
//! `x`, the only length x86 takes for execution). Data addresses must be
//! aligned to LEN.
//!
//! `mem:SYMBOL[+OFF][:x]` names a function of the *current executable*
//! (`/proc/self/exe`), resolved through its ELF symbol table and the load
//! address in `/proc/self/maps`; the access defaults to `x`. The address is
//! only meaningful in this process (and children forked from it without
//! `exec`). To probe another program, use `uprobe:`.
//!
//! `uprobe:PATH:SYMBOL[+OFF]` and `uretprobe:PATH:SYMBOL`: PATH is made
//! absolute; the probe sits at the file offset of SYMBOL (plus OFF), computed
//! from the ELF program headers. Symbols are the stored (mangled) names;
//! `name@VERSION` selects a symbol version. `uprobe:PATH:0xADDR` probes a
//! link-time address of PATH, as `perf probe -x PATH 0xADDR` does (code
//! with no symbol, such as an IFUNC's implementation in a stripped libc).

use std::ffi::CString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use perf_event_open_sys::bindings as b;

use crate::attr::{Domain, EventAttr, Kind};
use crate::elf::{ElfFile, closest};
use crate::error::{Error, Result};
use crate::pmu::{ConfigWord, Pmu, PmuSet};

/// Where tracefs is looked for, in order.
pub const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs root in use, mounting tracefs at [`TRACEFS_ROOTS`]`[0]` first
/// when it is mounted at none of them, as perf does. Call it before the
/// first parse ([`default_parser`] looks for tracefs once). The error says
/// why and how to mount it by hand.
pub fn ensure_tracefs() -> std::result::Result<PathBuf, String> {
    if let Some(p) = find_tracefs() {
        return Ok(p);
    }
    let at = Path::new(TRACEFS_ROOTS[0]);
    crate::sys::mount_tracefs(at).map_err(|e| {
        format!(
            "tracefs is not mounted and mounting it at {} failed ({e}); as root: mount -t tracefs nodev {}",
            at.display(),
            at.display()
        )
    })?;
    find_tracefs().ok_or_else(|| format!("tracefs mounted at {} holds no events/ directory", at.display()))
}

/// The first of [`TRACEFS_ROOTS`] that holds tracefs' `events/`.
fn find_tracefs() -> Option<PathBuf> {
    TRACEFS_ROOTS.iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

/// One named event of a fixed-type table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Named {
    /// The canonical name first, then perf's aliases.
    pub names: &'static [&'static str],
    pub config: u64,
    pub description: &'static str,
}

const fn named(names: &'static [&'static str], config: u32, description: &'static str) -> Named {
    Named { names, config: config as u64, description }
}

/// perf's `PERF_TYPE_HARDWARE` names.
pub(crate) const HARDWARE: &[Named] = &[
    named(&["cpu-cycles", "cycles"], b::PERF_COUNT_HW_CPU_CYCLES, "CPU core cycles"),
    named(&["instructions"], b::PERF_COUNT_HW_INSTRUCTIONS, "instructions retired"),
    named(&["cache-references"], b::PERF_COUNT_HW_CACHE_REFERENCES, "last-level cache accesses"),
    named(&["cache-misses"], b::PERF_COUNT_HW_CACHE_MISSES, "last-level cache misses"),
    named(
        &["branch-instructions", "branches"],
        b::PERF_COUNT_HW_BRANCH_INSTRUCTIONS,
        "branch instructions retired",
    ),
    named(&["branch-misses"], b::PERF_COUNT_HW_BRANCH_MISSES, "mispredicted branches"),
    named(&["bus-cycles"], b::PERF_COUNT_HW_BUS_CYCLES, "bus cycles"),
    named(
        &["stalled-cycles-frontend", "idle-cycles-frontend"],
        b::PERF_COUNT_HW_STALLED_CYCLES_FRONTEND,
        "cycles the front end issued nothing",
    ),
    named(
        &["stalled-cycles-backend", "idle-cycles-backend"],
        b::PERF_COUNT_HW_STALLED_CYCLES_BACKEND,
        "cycles the back end retired nothing",
    ),
    named(
        &["ref-cycles"],
        b::PERF_COUNT_HW_REF_CPU_CYCLES,
        "reference cycles, not scaled by frequency changes",
    ),
];

/// perf's `PERF_TYPE_SOFTWARE` names.
pub(crate) const SOFTWARE: &[Named] = &[
    named(&["cpu-clock"], b::PERF_COUNT_SW_CPU_CLOCK, "CPU clock, ns (per-CPU timer)"),
    named(&["task-clock"], b::PERF_COUNT_SW_TASK_CLOCK, "CPU time of the task, ns"),
    named(&["page-faults", "faults"], b::PERF_COUNT_SW_PAGE_FAULTS, "page faults"),
    named(&["context-switches", "cs"], b::PERF_COUNT_SW_CONTEXT_SWITCHES, "context switches"),
    named(&["cpu-migrations", "migrations"], b::PERF_COUNT_SW_CPU_MIGRATIONS, "moves to another CPU"),
    named(&["minor-faults"], b::PERF_COUNT_SW_PAGE_FAULTS_MIN, "page faults served without I/O"),
    named(&["major-faults"], b::PERF_COUNT_SW_PAGE_FAULTS_MAJ, "page faults that read from disk"),
    named(
        &["alignment-faults"],
        b::PERF_COUNT_SW_ALIGNMENT_FAULTS,
        "unaligned accesses fixed up by the kernel",
    ),
    named(&["emulation-faults"], b::PERF_COUNT_SW_EMULATION_FAULTS, "instructions emulated by the kernel"),
    named(&["dummy"], b::PERF_COUNT_SW_DUMMY, "counts nothing (placeholder for sampling)"),
    named(&["bpf-output"], b::PERF_COUNT_SW_BPF_OUTPUT, "output of BPF programs"),
    named(
        &["cgroup-switches"],
        b::PERF_COUNT_SW_CGROUP_SWITCHES,
        "context switches to a task of another cgroup",
    ),
];

/// perf's cache names: the canonical name first. Matching ignores case.
pub(crate) const CACHE_TYPES: &[(&[&str], u64)] = &[
    (&["L1-dcache", "l1-d", "l1d", "L1-data"], b::PERF_COUNT_HW_CACHE_L1D as u64),
    (&["L1-icache", "l1-i", "l1i", "L1-instruction"], b::PERF_COUNT_HW_CACHE_L1I as u64),
    (&["LLC", "L2"], b::PERF_COUNT_HW_CACHE_LL as u64),
    (&["dTLB", "d-tlb", "Data-TLB"], b::PERF_COUNT_HW_CACHE_DTLB as u64),
    (&["iTLB", "i-tlb", "Instruction-TLB"], b::PERF_COUNT_HW_CACHE_ITLB as u64),
    (&["branch", "branches", "bpu", "btb", "bpc"], b::PERF_COUNT_HW_CACHE_BPU as u64),
    (&["node"], b::PERF_COUNT_HW_CACHE_NODE as u64),
];

/// Operations: singular, plural, then other aliases.
pub(crate) const CACHE_OPS: &[(&[&str], u64)] = &[
    (&["load", "loads", "read"], b::PERF_COUNT_HW_CACHE_OP_READ as u64),
    (&["store", "stores", "write"], b::PERF_COUNT_HW_CACHE_OP_WRITE as u64),
    (
        &["prefetch", "prefetches", "speculative-read", "speculative-load"],
        b::PERF_COUNT_HW_CACHE_OP_PREFETCH as u64,
    ),
];

/// Results.
pub(crate) const CACHE_RESULTS: &[(&[&str], u64)] = &[
    (&["refs", "Reference", "ops", "access"], b::PERF_COUNT_HW_CACHE_RESULT_ACCESS as u64),
    (&["misses", "miss"], b::PERF_COUNT_HW_CACHE_RESULT_MISS as u64),
];

/// Which operations perf accepts for each cache (bit n = op n): the
/// instruction cache is not written, TLB and branch-unit stores do not exist.
pub(crate) fn cache_op_valid(cache: u64, op: u64) -> bool {
    let ops = match cache as u32 {
        b::PERF_COUNT_HW_CACHE_L1I => 0b101,
        b::PERF_COUNT_HW_CACHE_ITLB | b::PERF_COUNT_HW_CACHE_BPU => 0b001,
        _ => 0b111,
    };
    ops & (1 << op) != 0
}

/// The name perf prints for a cache event: `L1-dcache-loads`, `L1-dcache-load-misses`.
pub(crate) fn cache_event_name(cache: usize, op: usize, result: usize) -> String {
    let (ty, opn) = (CACHE_TYPES[cache].0[0], CACHE_OPS[op].0);
    if CACHE_RESULTS[result].1 == b::PERF_COUNT_HW_CACHE_RESULT_ACCESS as u64 {
        format!("{ty}-{}", opn[1])
    } else {
        format!("{ty}-{}-{}", opn[0], CACHE_RESULTS[result].0[0])
    }
}

/// Every valid hw-cache event name, perf's spelling, with its config.
pub(crate) fn cache_events() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (ci, (_, c)) in CACHE_TYPES.iter().enumerate() {
        for (oi, (_, o)) in CACHE_OPS.iter().enumerate() {
            if !cache_op_valid(*c, *o) {
                continue;
            }
            for (ri, (_, r)) in CACHE_RESULTS.iter().enumerate() {
                out.push((cache_event_name(ci, oi, ri), c | o << 8 | r << 16));
            }
        }
    }
    out
}

/// An event name resolved: the attr to open plus what perf shows beside the count.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedEvent {
    /// The description to open.
    pub attr: EventAttr,
    /// Who provides it: `hardware`, `software`, `hw-cache`, `raw`,
    /// `tracepoint`, `breakpoint`, or a sysfs PMU name (`msr`, `uprobe`, `cpu`…).
    pub pmu: String,
    /// Multiply a count by this to get `unit` (sysfs `.scale`; 1 otherwise).
    pub scale: f64,
    /// The unit of the scaled value (sysfs `.unit`), if any.
    pub unit: Option<String>,
    /// Whether the name chose the domain with modifiers (`:u`, `/k`);
    /// without, the PMU's default domain applies ([`Domain::default_for`]).
    pub modifiers: bool,
}

/// Turns event names into attrs over one set of PMUs and one tracefs.
#[derive(Clone, Debug)]
pub struct Parser {
    pmus: PmuSet,
    tracefs: Option<PathBuf>,
    /// The process whose modules `mem:SYMBOL` resolves in (`None`: this one).
    symbols_of: Option<i32>,
    /// Whether `tracefs` was set by [`Parser::tracefs_at`] rather than found.
    tracefs_given: bool,
}

static DEFAULT: OnceLock<Parser> = OnceLock::new();

/// This machine's parser: sysfs PMUs and tracefs, discovered on first use.
///
/// A failed discovery is returned and retried on the next call.
pub fn default_parser() -> Result<&'static Parser> {
    if let Some(p) = DEFAULT.get() {
        return Ok(p);
    }
    let p = Parser::system()?;
    Ok(DEFAULT.get_or_init(|| p))
}

/// Parses `name` with [`default_parser`].
pub fn parse_event(name: &str) -> Result<EventAttr> {
    default_parser()?.parse(name)
}

/// Modifier letters perf knows; papirus implements `u`, `k` and `h`.
const PERF_MODIFIERS: &str = "ukhGHIpPSDWebR";

impl Parser {
    /// A parser over `pmus`, with tracefs found at the usual places.
    pub fn new(pmus: PmuSet) -> Self {
        Parser { pmus, tracefs: find_tracefs(), symbols_of: None, tracefs_given: false }
    }

    /// This machine's PMUs and tracefs.
    pub fn system() -> Result<Self> {
        Ok(Self::new(PmuSet::discover()?))
    }

    /// Uses `root` as tracefs (a directory holding `events/`), or none.
    pub fn tracefs_at(&mut self, root: Option<PathBuf>) -> &mut Self {
        self.tracefs = root;
        self.tracefs_given = true;
        self
    }

    /// Resolves `mem:SYMBOL` in the modules mapped by process `pid` (its
    /// `/proc/PID/maps`) instead of this executable; `None` goes back to this one.
    pub fn symbols_in(&mut self, pid: Option<i32>) -> &mut Self {
        self.symbols_of = pid;
        self
    }

    /// The PMUs names resolve against.
    pub fn pmus(&self) -> &PmuSet {
        &self.pmus
    }

    /// The tracefs root in use, if any.
    pub fn tracefs(&self) -> Option<&Path> {
        self.tracefs.as_deref()
    }

    /// The tracefs root for a tracepoint: the one found at creation, else
    /// (for a parser that was not given one) a tracefs mounted since, so a
    /// long-lived parser sees a mount made after it was created.
    fn tracefs_root(&self) -> Option<PathBuf> {
        match &self.tracefs {
            Some(r) => Some(r.clone()),
            None if !self.tracefs_given => find_tracefs(),
            None => None,
        }
    }

    /// The attr for `name`.
    pub fn parse(&self, name: &str) -> Result<EventAttr> {
        self.parse_full(name).map(|p| p.attr)
    }

    /// The attr for `name` with its provider, scale and unit.
    pub fn parse_full(&self, name: &str) -> Result<ParsedEvent> {
        let name = name.trim();
        if name.is_empty() {
            return Err(malformed(name, "empty event name"));
        }
        if let Some(perf) = papi_spelling(name)? {
            return self.parse_full(&perf);
        }
        if let Some(rest) = strip_prefix_ci(name, "mem:") {
            return self.breakpoint(name, rest);
        }
        if let Some(rest) = strip_prefix_ci(name, "uprobe:") {
            return self.uprobe(name, rest, false);
        }
        if let Some(rest) = strip_prefix_ci(name, "uretprobe:") {
            return self.uprobe(name, rest, true);
        }
        if let Some(slash) = name.find('/') {
            return self.pmu_event(name, slash);
        }
        // `base:mods`, unless the last segment is not modifiers (a tracepoint).
        let (base, mods) = match name.rsplit_once(':') {
            Some((base, m)) if !base.is_empty() && is_modifier_text(m) => (base, Some(m)),
            _ => (name, None),
        };
        if base.contains(':') {
            return self.tracepoint(name, base, mods);
        }
        // `sched:u`-like names: a tracepoint whose name only looks like modifiers.
        if mods.is_some() && self.tracefs.as_ref().is_some_and(|t| t.join("events").join(base).is_dir()) {
            return self.tracepoint(name, name, None);
        }
        self.symbolic(name, base, mods)
    }

    /// Every name a bare word can resolve to, for suggestions.
    fn bare_names(&self) -> Vec<String> {
        let mut v: Vec<String> =
            HARDWARE.iter().chain(SOFTWARE).flat_map(|n| n.names.iter().map(|s| s.to_string())).collect();
        v.extend(cache_events().into_iter().map(|(n, _)| n));
        for p in self.pmus.pmus() {
            for a in &p.aliases {
                v.push(a.name.clone());
                v.push(format!("{}/{}/", p.name, a.name));
            }
        }
        v
    }

    /// Hardware, software, hw-cache, raw or a bare PMU alias.
    fn symbolic(&self, event: &str, base: &str, mods: Option<&str>) -> Result<ParsedEvent> {
        let fixed =
            |kind, type_, config, pmu| plain(event, EventAttr::new(event, kind, type_, config), mods, pmu);
        if let Some(n) = HARDWARE.iter().find(|n| n.names.contains(&base)) {
            return fixed(Kind::Hardware, b::PERF_TYPE_HARDWARE, n.config, "hardware");
        }
        if let Some(n) = SOFTWARE.iter().find(|n| n.names.contains(&base)) {
            return fixed(Kind::Software, b::PERF_TYPE_SOFTWARE, n.config, "software");
        }
        if let Some(config) = parse_cache(event, base)? {
            return fixed(Kind::Hardware, b::PERF_TYPE_HW_CACHE, config, "hw-cache");
        }
        if let Some(hex) = base.strip_prefix('r')
            && !hex.is_empty()
            && hex.bytes().all(|c| c.is_ascii_hexdigit())
        {
            let config = u64::from_str_radix(hex, 16)
                .map_err(|_| malformed(event, format!("raw event `{base}` is wider than 64 bits")))?;
            return fixed(Kind::Hardware, b::PERF_TYPE_RAW, config, "raw");
        }
        // A bare sysfs alias, core PMU first as perf does.
        let mut owners: Vec<&Pmu> = self.pmus.pmus().iter().filter(|p| p.alias(base).is_some()).collect();
        owners.sort_by_key(|p| !p.is_core());
        if let Some(pmu) = owners.first() {
            return self.pmu_terms(event, pmu, base, mods);
        }
        Err(Error::UnknownEvent {
            name: event.to_string(),
            suggestions: closest(base, self.bare_names().iter().map(String::as_str), 3),
        })
    }

    /// `pmu/terms/mods`.
    fn pmu_event(&self, event: &str, slash: usize) -> Result<ParsedEvent> {
        let pmu_name = &event[..slash];
        let rest = &event[slash + 1..];
        let Some(close) = rest.rfind('/') else {
            return Err(malformed(event, format!("`{pmu_name}/` is not closed: write `{pmu_name}/TERMS/`")));
        };
        let (terms, mods) = (&rest[..close], &rest[close + 1..]);
        let mods = mods.strip_prefix(':').unwrap_or(mods);
        if pmu_name.is_empty() {
            return Err(malformed(event, "no PMU name before `/`"));
        }
        let Some(pmu) = self.pmus.get(pmu_name) else {
            if matches!(pmu_name, "cpu" | "cpu_core" | "cpu_atom")
                && !self.pmus.pmus().iter().any(Pmu::is_core)
            {
                return Err(Error::NoHardwarePmu { event: event.to_string() });
            }
            return Err(Error::UnknownPmu {
                name: pmu_name.to_string(),
                event: event.to_string(),
                suggestions: closest(pmu_name, self.pmus.pmus().iter().map(|p| p.name.as_str()), 3),
            });
        };
        if !mods.is_empty() && !is_modifier_text(mods) {
            return Err(malformed(
                event,
                format!("`{mods}` after the closing `/` is not a modifier (u, k, h)"),
            ));
        }
        self.pmu_terms(event, pmu, terms, (!mods.is_empty()).then_some(mods))
    }

    /// Encodes comma-separated `terms` for `pmu`.
    fn pmu_terms(&self, event: &str, pmu: &Pmu, terms: &str, mods: Option<&str>) -> Result<ParsedEvent> {
        let mut enc = Encoder { event, pmu, words: [0; 3], set_name: None, pending: Vec::new() };
        let mut scale = 1.0;
        let mut unit = None;
        if terms.trim().is_empty() {
            return Err(malformed(event, format!("no terms between the slashes of `{}/…/`", pmu.name)));
        }
        for term in terms.split(',') {
            let term = term.trim();
            if term.is_empty() {
                return Err(malformed(event, "empty term (two commas in a row, or a trailing comma)"));
            }
            let (key, value) = key_value(term);
            if key.is_empty() {
                return Err(malformed(event, format!("term `{term}` has no name")));
            }
            if value.is_none()
                && pmu.format(key).is_none()
                && let Some(alias) = pmu.alias(key)
            {
                for aterm in alias.terms.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                    let (k, v) = key_value(aterm);
                    if v == Some("?") {
                        enc.pending.push((alias.name.clone(), k.to_string()));
                        continue;
                    }
                    enc.term(k, v, true)?;
                }
                scale = alias.scale;
                unit = alias.unit.clone();
                continue;
            }
            enc.term(key, value, false)?;
        }
        if let Some((alias, field)) = enc.pending.first() {
            return Err(malformed(
                event,
                format!(
                    "event `{alias}` of `{}` needs a value for `{field}`: write `{}/{alias},{field}=N/`",
                    pmu.name, pmu.name
                ),
            ));
        }
        let kind = match pmu.type_ {
            b::PERF_TYPE_SOFTWARE => Kind::Software,
            b::PERF_TYPE_TRACEPOINT => Kind::Tracepoint,
            b::PERF_TYPE_BREAKPOINT => Kind::Breakpoint,
            b::PERF_TYPE_HARDWARE | b::PERF_TYPE_HW_CACHE | b::PERF_TYPE_RAW => Kind::Hardware,
            _ if pmu.is_core() => Kind::Hardware,
            _ => Kind::Dynamic,
        };
        let mut attr =
            EventAttr::new(enc.set_name.unwrap_or(event).to_string(), kind, pmu.type_, enc.words[0]);
        attr.config1(enc.words[1]).config2(enc.words[2]);
        let modifiers = apply_modifiers(event, &mut attr, mods, &pmu.name, pmu.counts_all_domains())?;
        Ok(ParsedEvent { attr, pmu: pmu.name.clone(), scale, unit, modifiers })
    }

    /// `subsystem:name`.
    fn tracepoint(&self, event: &str, base: &str, mods: Option<&str>) -> Result<ParsedEvent> {
        let (sys, tp) = base.split_once(':').unwrap_or((base, ""));
        if sys.is_empty() || tp.is_empty() || tp.contains(':') {
            return Err(malformed(
                event,
                "a tracepoint is `subsystem:name` (e.g. `syscalls:sys_enter_write`)",
            ));
        }
        if let Some(c) = base.chars().find(|c| matches!(c, '*' | '?' | '[' | ']' | '{' | '}')) {
            return Err(malformed(
                event,
                format!("`{c}`: globs select many tracepoints; name one (`catalog::Catalog` lists them)"),
            ));
        }
        if let Some(c) =
            base.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
        {
            return Err(malformed(event, format!("`{c}` cannot appear in a tracepoint name")));
        }
        let not_modifier = || malformed(event, format!("`{tp}` is not a modifier: use `u`, `k` or `h`"));
        let found = self.tracefs_root();
        let Some(root) = &found else {
            if self.symbolic(sys, sys, None).is_ok() {
                return Err(not_modifier());
            }
            return Err(Error::NoTracefs { event: event.to_string() });
        };
        let events = root.join("events");
        let id_path = events.join(sys).join(tp).join("id");
        let text = match fs::read_to_string(&id_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // `instructions:z`: a known event with a letter that is no modifier.
                if !events.join(sys).is_dir() && !sys.contains('/') && self.symbolic(sys, sys, None).is_ok() {
                    return Err(not_modifier());
                }
                if events.join(sys).join(tp).is_dir() {
                    return Err(malformed(
                        event,
                        "tracefs lists it but gives it no id: ftrace's own events cannot be opened through perf",
                    ));
                }
                let candidates = if events.join(sys).is_dir() {
                    list_dirs(&events.join(sys)).into_iter().map(|t| format!("{sys}:{t}")).collect()
                } else {
                    tracepoint_names(root)
                };
                return Err(Error::UnknownEvent {
                    name: event.to_string(),
                    suggestions: closest(base, candidates.iter().map(String::as_str), 3),
                });
            }
            Err(source) => return Err(Error::Io { path: id_path, source }),
        };
        let id: u64 = text.trim().parse().map_err(|_| Error::Malformed {
            event: event.to_string(),
            reason: format!("{} holds `{}`, not a tracepoint id", id_path.display(), text.trim()),
        })?;
        plain(event, EventAttr::new(event, Kind::Tracepoint, b::PERF_TYPE_TRACEPOINT, id), mods, "tracepoint")
    }

    /// `mem:ADDR[/LEN][:ACCESS][:MODS]` or `mem:SYMBOL[+OFF][/LEN][:ACCESS][:MODS]`.
    fn breakpoint(&self, event: &str, rest: &str) -> Result<ParsedEvent> {
        let bad = |reason: String| Error::BadAddress { event: event.to_string(), reason };
        // Peel access and modifiers from the right, so `::` inside a symbol survives.
        let mut spec = rest;
        let mut mods = None;
        let mut access = None;
        if let Some((l, r)) = spec.rsplit_once(':')
            && !r.is_empty()
            && r.chars().all(|c| "ukh".contains(c))
        {
            mods = Some(r);
            spec = l;
        }
        if let Some((l, r)) = spec.rsplit_once(':')
            && !r.is_empty()
            && r.chars().all(|c| "rwx".contains(c))
        {
            access = Some(r);
            spec = l;
        }
        let (target, len) = match spec.rsplit_once('/') {
            Some((t, l)) => {
                let len = parse_number(l).ok_or_else(|| bad(format!("length `{l}` is not a number")))?;
                (t, Some(len))
            }
            None => (spec, None),
        };
        if target.is_empty() {
            return Err(bad("no address: write `mem:0xADDR[/LEN][:rwx]` or `mem:FUNCTION:x`".into()));
        }
        let (addr, is_symbol) = match parse_number(target) {
            Some(a) => (a, false),
            None if target.starts_with(|c: char| c.is_ascii_digit()) => {
                return Err(bad(format!("`{target}` is not a number (hex needs `0x`)")));
            }
            None => match self.symbols_of {
                None => (self_symbol_address(event, target)?, true),
                Some(pid) => (process_symbol_address(event, target, pid)?, true),
            },
        };
        let bp_type = match access.unwrap_or(if is_symbol { "x" } else { "rw" }) {
            a if a.contains('x') && a.len() > 1 => {
                return Err(bad(format!(
                    "`{a}`: x86 watches execution or data access, not both; use `x`, `r`, `w` or `rw`"
                )));
            }
            "x" => b::HW_BREAKPOINT_X,
            a => {
                let mut t = 0;
                if a.contains('r') {
                    t |= b::HW_BREAKPOINT_R;
                }
                if a.contains('w') {
                    t |= b::HW_BREAKPOINT_W;
                }
                t
            }
        };
        let exec = bp_type == b::HW_BREAKPOINT_X;
        let len = len.unwrap_or(if exec { 8 } else { 4 });
        if exec && len != 8 {
            return Err(bad(format!("length {len}: x86 execution breakpoints take length 8 only")));
        }
        if !matches!(len, 1 | 2 | 4 | 8) {
            return Err(bad(format!("length {len}: x86 debug registers watch 1, 2, 4 or 8 bytes")));
        }
        if addr == 0 {
            return Err(bad("address 0 is never mapped".into()));
        }
        if !exec && addr % len != 0 {
            return Err(bad(format!("address {addr:#x} is not aligned to its length {len}")));
        }
        // User space on x86-64 ends below 2^47 (2^56 with 5-level paging); kernel above 2^63.
        if (1u64 << 56..0xffff_8000_0000_0000).contains(&addr) {
            return Err(bad(format!("address {addr:#x} is not canonical on x86-64")));
        }
        let mut attr = EventAttr::new(event, Kind::Breakpoint, b::PERF_TYPE_BREAKPOINT, 0);
        attr.bp_type(bp_type).config1(addr).config2(len);
        plain(event, attr, mods, "breakpoint")
    }

    /// `uprobe:PATH:SYMBOL[+OFF]`, `uretprobe:PATH:SYMBOL`, or `0xADDR` for SYMBOL.
    fn uprobe(&self, event: &str, rest: &str, ret: bool) -> Result<ParsedEvent> {
        let prefix = if ret { "uretprobe" } else { "uprobe" };
        let Some((path, target)) = rest.rsplit_once(':') else {
            return Err(malformed(event, format!("write `{prefix}:PATH:SYMBOL`")));
        };
        if path.is_empty() || target.is_empty() {
            return Err(malformed(
                event,
                format!("write `{prefix}:PATH:SYMBOL` (path and symbol both needed)"),
            ));
        }
        let (symbol, offset) = symbol_and_offset(event, target)?;
        if ret && offset != 0 {
            return Err(malformed(event, "a return probe sits at a function's entry; drop the `+OFFSET`"));
        }
        let Some(pmu) = self.pmus.get("uprobe") else {
            return Err(Error::UnknownPmu {
                name: "uprobe".into(),
                event: event.to_string(),
                suggestions: Vec::new(),
            });
        };
        let abs = fs::canonicalize(path).map_err(|source| Error::NoSuchFile {
            event: event.to_string(),
            path: PathBuf::from(path),
            source,
        })?;
        let elf = ElfFile::open(&abs)?;
        let vaddr = match symbol.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok()) {
            Some(addr) => addr + offset,
            None => {
                let sym = elf.lookup_function(symbol)?;
                if offset != 0 && sym.size != 0 && offset >= sym.size {
                    return Err(malformed(
                        event,
                        format!("offset {offset:#x} is past the end of `{symbol}` ({} bytes)", sym.size),
                    ));
                }
                sym.address.wrapping_add(offset)
            }
        };
        let file_offset = elf.vaddr_to_file_offset(vaddr).ok_or_else(|| Error::Elf {
            path: abs.clone(),
            reason: format!("`{symbol}` at {vaddr:#x} lies in no loadable segment"),
        })?;
        let mut config = 0;
        if ret {
            let field = pmu.format("retprobe").filter(|f| f.word == ConfigWord::Config).ok_or_else(|| {
                malformed(
                    event,
                    "this kernel's uprobe PMU has no `format/retprobe`; return probes are unavailable",
                )
            })?;
            config = field.scatter(1).unwrap_or(0);
        }
        let c_path = CString::new(abs.as_os_str().as_encoded_bytes())
            .map_err(|_| malformed(event, "the path contains a NUL byte"))?;
        let mut attr = EventAttr::new(event, Kind::Dynamic, pmu.type_, config);
        attr.uprobe_path(c_path).config2(file_offset).default_domain(&pmu.name);
        Ok(ParsedEvent { attr, pmu: pmu.name.clone(), scale: 1.0, unit: None, modifiers: false })
    }
}

/// Accumulates `pmu/…/` terms into config words.
struct Encoder<'a> {
    event: &'a str,
    pmu: &'a Pmu,
    words: [u64; 3],
    set_name: Option<&'a str>,
    /// `(alias, field)` pairs an alias left as `field=?`.
    pending: Vec<(String, String)>,
}

impl<'a> Encoder<'a> {
    fn term(&mut self, key: &str, value: Option<&'a str>, from_alias: bool) -> Result<()> {
        let event = self.event;
        let number = |v: Option<&str>| -> Result<u64> {
            match v {
                None => Ok(1),
                Some(v) => parse_number(v)
                    .ok_or_else(|| malformed(event, format!("`{key}={v}`: `{v}` is not a number"))),
            }
        };
        if let Some(field) = self.pmu.format(key) {
            let v = number(value)?;
            let bits = field.scatter(v).ok_or_else(|| {
                malformed(
                    event,
                    format!(
                        "`{key}={v:#x}` does not fit {} bits ({key} is {}:{})",
                        field.width(),
                        field.word.as_str(),
                        ranges_text(&field.ranges)
                    ),
                )
            })?;
            let slot = self.slot(field.word)?;
            *slot = (*slot & !field.mask()) | bits;
            self.pending.retain(|(_, f)| f != key);
            return Ok(());
        }
        let word = match key {
            "config" => Some(ConfigWord::Config),
            "config1" => Some(ConfigWord::Config1),
            "config2" => Some(ConfigWord::Config2),
            "config3" => Some(ConfigWord::Config3),
            _ => None,
        };
        if let Some(word) = word {
            let v = value.ok_or_else(|| malformed(event, format!("`{key}` needs a value: `{key}=0x…`")))?;
            let v = number(Some(v))?;
            *self.slot(word)? = v;
            return Ok(());
        }
        if key == "name" && !from_alias {
            self.set_name =
                Some(value.ok_or_else(|| malformed(event, "`name` needs a value: `name=my-event`"))?);
            return Ok(());
        }
        const SAMPLING: [&str; 16] = [
            "period",
            "freq",
            "branch_type",
            "time",
            "call-graph",
            "stack-size",
            "max-stack",
            "inherit",
            "no-inherit",
            "overwrite",
            "no-overwrite",
            "percore",
            "aux-output",
            "aux-sample-size",
            "metric-id",
            "cpu",
        ];
        if SAMPLING.contains(&key) {
            return Err(malformed(
                event,
                format!(
                    "perf's `{key}` term sets how perf samples or schedules, not what is counted; papirus sets that through its API, not the name"
                ),
            ));
        }
        let candidates: Vec<&str> = self
            .pmu
            .formats
            .iter()
            .map(|f| f.name.as_str())
            .chain(self.pmu.aliases.iter().map(|a| a.name.as_str()))
            .collect();
        Err(Error::UnknownTerm {
            event: event.to_string(),
            pmu: self.pmu.name.clone(),
            term: key.to_string(),
            suggestions: closest(key, candidates.into_iter(), 3),
        })
    }

    fn slot(&mut self, word: ConfigWord) -> Result<&mut u64> {
        match word {
            ConfigWord::Config => Ok(&mut self.words[0]),
            ConfigWord::Config1 => Ok(&mut self.words[1]),
            ConfigWord::Config2 => Ok(&mut self.words[2]),
            ConfigWord::Config3 => {
                Err(malformed(self.event, "config3 terms are not supported by papirus' attr yet"))
            }
        }
    }
}

/// `key=value` or a bare `key`, trimmed.
fn key_value(term: &str) -> (&str, Option<&str>) {
    match term.split_once('=') {
        Some((k, v)) => (k.trim(), Some(v.trim())),
        None => (term, None),
    }
}

fn ranges_text(ranges: &[(u8, u8)]) -> String {
    ranges
        .iter()
        .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
        .collect::<Vec<_>>()
        .join(",")
}

/// One item of an event list: a lone event, or a `{a,b}` group whose
/// members perf counts together (one group, read atomically).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListItem {
    /// The event names, group modifiers (`{a,b}:u`) already applied to each.
    pub events: Vec<String>,
    /// Written as a `{…}` group.
    pub group: bool,
}

/// Splits an event list as `perf stat -e` takes it: at commas, except inside
/// a PMU's `pmu/…/` terms and inside `{…}` groups. Blank items are dropped;
/// a brace that does not close or nests is an error.
pub fn split_event_list(list: &str) -> Result<Vec<ListItem>> {
    let bad = |reason: &str| malformed(list, reason);
    let mut items = Vec::new();
    let (mut cur, mut members) = (String::new(), None::<Vec<String>>);
    let mut in_terms = false;
    let mut chars = list.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '/' if in_terms => {
                in_terms = false;
                cur.push(ch);
            }
            // `pmu/` at the start of an item opens terms up to the next `/`;
            // paths (`uprobe:/bin/x:f`, `mem:0x10/8`) have a `:` before theirs.
            '/' => {
                let head = cur.trim();
                in_terms =
                    !head.is_empty() && head.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
                cur.push(ch);
            }
            ',' if in_terms => cur.push(ch),
            ',' => {
                let name = std::mem::take(&mut cur).trim().to_string();
                match &mut members {
                    Some(m) => m.push(name),
                    None => items.push(ListItem { events: vec![name], group: false }),
                }
            }
            '{' => {
                if members.is_some() {
                    return Err(bad("groups do not nest: `{` inside `{…}`"));
                }
                if !cur.trim().is_empty() {
                    return Err(bad("`{` must start an item: put a comma before the group"));
                }
                cur.clear();
                members = Some(Vec::new());
            }
            '}' => {
                let Some(mut m) = members.take() else {
                    return Err(bad("`}` without a `{`"));
                };
                m.push(std::mem::take(&mut cur).trim().to_string());
                let mut mods = String::new();
                if chars.peek() == Some(&':') {
                    chars.next();
                    while let Some(&c) = chars.peek() {
                        if c == ',' {
                            break;
                        }
                        mods.push(c);
                        chars.next();
                    }
                    if !is_modifier_text(mods.trim()) {
                        return Err(bad("a group's `:` is followed by modifiers only (`{a,b}:u`)"));
                    }
                }
                let mods = mods.trim();
                let events: Vec<String> = m
                    .into_iter()
                    .filter(|e| !e.is_empty())
                    .map(|e| if mods.is_empty() { e } else { with_modifiers(&e, mods) })
                    .collect();
                if events.is_empty() {
                    return Err(bad("an empty group `{}`"));
                }
                items.push(ListItem { events, group: true });
                match chars.peek() {
                    None | Some(',') => {}
                    Some(_) => return Err(bad("a group ends at `}` or `}:MODS`, then a comma")),
                }
            }
            _ => cur.push(ch),
        }
    }
    if members.is_some() {
        return Err(bad("a `{` group is not closed"));
    }
    items.push(ListItem { events: vec![cur.trim().to_string()], group: false });
    items.retain(|i| !(i.events.len() == 1 && i.events[0].is_empty()));
    Ok(items)
}

/// Every event name of a list, groups flattened (see [`split_event_list`]).
pub fn split_event_names(list: &str) -> Result<Vec<String>> {
    Ok(split_event_list(list)?.into_iter().flat_map(|i| i.events).collect())
}

/// `name` with perf modifiers `mods` appended the way its syntax takes them.
fn with_modifiers(name: &str, mods: &str) -> String {
    if name.ends_with('/') { format!("{name}{mods}") } else { format!("{name}:{mods}") }
}

/// libpfm4's spellings of perf's generic events whose perf name is not the
/// lower-cased, dash-separated PAPI one.
const PFM_RENAMES: [(&str, &str); 4] = [
    ("PAGE_FAULTS_MIN", "minor-faults"),
    ("PAGE_FAULTS_MAJ", "major-faults"),
    ("CPU_CLOCK", "cpu-clock"),
    ("BUS_CYCLES", "bus-cycles"),
];

/// PAPI's (libpfm4's) spellings turned into perf's: `perf::TASK-CLOCK`,
/// `perf::PERF_COUNT_SW_PAGE_FAULTS:u`, `perf_raw::r01c2`. `None` when
/// `name` is not one.
pub fn papi_spelling(name: &str) -> Result<Option<String>> {
    if let Some(raw) = strip_prefix_ci(name, "perf_raw::") {
        return Ok(Some(raw.to_string()));
    }
    let Some(rest) = strip_prefix_ci(name, "perf::") else { return Ok(None) };
    let mut parts = rest.split(':');
    let base = parts.next().unwrap_or_default();
    if base.is_empty() {
        return Err(malformed(name, "write `perf::EVENT[:u|:k]`, e.g. `perf::TASK-CLOCK`"));
    }
    // libpfm4 qualifiers: `u`, `k`, `h` alone or `=1` (on) / `=0` (off).
    let mut mods = String::new();
    for q in parts {
        let bad = || malformed(name, format!("qualifier `{q}`: perf:: events take u, k, h (=0|1)"));
        let (flag, on) = match q.split_once('=') {
            Some((f, "1")) => (f, true),
            Some((f, "0")) => (f, false),
            None => (q, true),
            Some(_) => return Err(bad()),
        };
        let flag = flag.to_ascii_lowercase();
        if !matches!(flag.as_str(), "u" | "k" | "h") {
            return Err(bad());
        }
        if on {
            mods.push_str(&flag);
        }
    }
    let up = base.to_ascii_uppercase();
    let stem = ["PERF_COUNT_HW_CACHE_", "PERF_COUNT_HW_", "PERF_COUNT_SW_"]
        .iter()
        .find_map(|p| up.strip_prefix(p))
        .unwrap_or(&up);
    let perf = match PFM_RENAMES.iter().find(|(k, _)| *k == stem) {
        Some((_, v)) => v.to_string(),
        None => stem.to_ascii_lowercase().replace('_', "-"),
    };
    Ok(Some(if mods.is_empty() { perf } else { with_modifiers(&perf, &mods) }))
}

fn malformed(event: &str, reason: impl Into<String>) -> Error {
    Error::Malformed { event: event.to_string(), reason: reason.into() }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

fn is_modifier_text(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| PERF_MODIFIERS.contains(c))
}

/// A number as perf writes it: `0x` hex or decimal.
fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `attr` of a PMU that names no scale or unit, with modifiers `mods`.
fn plain(event: &str, mut attr: EventAttr, mods: Option<&str>, pmu: &str) -> Result<ParsedEvent> {
    let modifiers = apply_modifiers(event, &mut attr, mods, pmu, false)?;
    Ok(ParsedEvent { attr, pmu: pmu.to_string(), scale: 1.0, unit: None, modifiers })
}

/// Applies `u`/`k`/`h`, or without them the default domain of an event of
/// PMU `pmu` ([`Domain::default_for`]); `fixed_domain` PMUs refuse modifiers.
/// Returns whether modifiers were given.
fn apply_modifiers(
    event: &str,
    attr: &mut EventAttr,
    mods: Option<&str>,
    pmu: &str,
    fixed_domain: bool,
) -> Result<bool> {
    let Some(mods) = mods else {
        attr.default_domain(pmu);
        return Ok(false);
    };
    if let Some(c) = mods.chars().find(|c| !"ukh".contains(*c)) {
        return Err(malformed(
            event,
            format!(
                "modifier `{c}` is perf's but papirus supports only `u` (user), `k` (kernel) and `h` (hypervisor)"
            ),
        ));
    }
    if fixed_domain {
        return Err(malformed(
            event,
            format!("this PMU counts every privilege level and cannot honour `:{mods}`; drop the modifier"),
        ));
    }
    attr.domain(Domain {
        user: mods.contains('u'),
        kernel: mods.contains('k'),
        hypervisor: mods.contains('h'),
    });
    Ok(true)
}

/// `L1-dcache-load-misses` and its aliases; `None` if `base` starts with no cache name.
fn parse_cache(event: &str, base: &str) -> Result<Option<u64>> {
    // Longest cache alias that prefixes the name, then `-`-separated op and result.
    let lower = base.to_ascii_lowercase();
    let Some((cache, len)) = CACHE_TYPES
        .iter()
        .flat_map(|(names, c)| names.iter().map(move |n| (*c, n.len(), n.to_ascii_lowercase())))
        .filter(|(_, len, n)| {
            lower.starts_with(n.as_str()) && (lower.len() == *len || lower.as_bytes()[*len] == b'-')
        })
        .max_by_key(|(_, len, _)| *len)
        .map(|(c, len, _)| (c, len))
    else {
        return Ok(None);
    };
    let rest = &lower[len..];
    if rest.is_empty() {
        // A bare cache name (`LLC`, `branch`) is no event; leave it unknown.
        return Ok(None);
    }
    let mut op = None;
    let mut result = None;
    let mut parts = rest[1..].split('-').peekable();
    while let Some(first) = parts.next() {
        // Some aliases themselves contain `-` (`speculative-read`).
        let word = match parts.peek() {
            Some(next) if is_cache_word(&format!("{first}-{next}")) => {
                let joined = format!("{first}-{next}");
                parts.next();
                joined
            }
            _ => first.to_string(),
        };
        let find = |table: &[(&[&str], u64)]| {
            table
                .iter()
                .find(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(&word)))
                .map(|(_, v)| *v)
        };
        if op.is_none()
            && let Some(o) = find(CACHE_OPS)
        {
            op = Some(o);
        } else if result.is_none()
            && let Some(r) = find(CACHE_RESULTS)
        {
            result = Some(r);
        } else {
            return Ok(None);
        }
    }
    let op = op.unwrap_or(b::PERF_COUNT_HW_CACHE_OP_READ as u64);
    let result = result.unwrap_or(b::PERF_COUNT_HW_CACHE_RESULT_ACCESS as u64);
    if !cache_op_valid(cache, op) {
        let (cname, _) =
            CACHE_TYPES.iter().find(|(_, c)| *c == cache).map(|(n, c)| (n[0], c)).unwrap_or(("?", &0));
        let oname = CACHE_OPS.iter().find(|(_, o)| *o == op).map(|(n, _)| n[0]).unwrap_or("?");
        return Err(malformed(event, format!("{cname} has no `{oname}` operation in perf's cache events")));
    }
    Ok(Some(cache | op << 8 | result << 16))
}

fn is_cache_word(w: &str) -> bool {
    CACHE_OPS.iter().chain(CACHE_RESULTS).any(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(w)))
}

fn list_dirs(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    rd.filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every `subsystem:name` under a tracefs root that perf can open (has an
/// `id`; ftrace's internal events do not), sorted.
pub(crate) fn tracepoint_names(root: &Path) -> Vec<String> {
    let events = root.join("events");
    let mut out = Vec::new();
    for sys in list_dirs(&events) {
        let dir = events.join(&sys);
        for tp in list_dirs(&dir) {
            if dir.join(&tp).join("id").exists() {
                out.push(format!("{sys}:{tp}"));
            }
        }
    }
    out.sort();
    out
}

/// `name[+OFF]` of a `mem:` or `uprobe:` target.
fn symbol_and_offset<'a>(event: &str, target: &'a str) -> Result<(&'a str, u64)> {
    match target.split_once('+') {
        Some((s, o)) => {
            Ok((s, parse_number(o).ok_or_else(|| malformed(event, format!("offset `{o}` is not a number")))?))
        }
        None => Ok((target, 0)),
    }
}

/// One file-backed line of `/proc/PID/maps`.
struct MapLine {
    start: u64,
    end: u64,
    offset: u64,
    path: String,
}

fn map_lines(maps: &str) -> impl Iterator<Item = MapLine> + '_ {
    maps.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let (range, _perms, off, _dev, _inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let path = f.collect::<Vec<_>>().join(" ");
        let (start, end) = range.split_once('-')?;
        Some(MapLine {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            offset: u64::from_str_radix(off, 16).ok()?,
            path,
        })
    })
}

/// Where link-time address `vaddr` of `elf`, mapped from file `path`,
/// lies at run time: the first of its `maps` lines that gives a load bias.
fn runtime_address(elf: &ElfFile, maps: &[MapLine], path: &str, vaddr: u64) -> Option<u64> {
    maps.iter()
        .filter(|m| m.path == path)
        .find_map(|m| elf.load_bias(m.start, m.offset))
        .map(|bias| bias.wrapping_add(vaddr))
}

/// Largest `/proc/PID/maps` read (a process with ~200,000 mappings).
const MAX_MAPS_BYTES: u64 = 32 << 20;
/// Largest module read to look a symbol up in (libxul-sized libraries fit).
const MAX_MODULE_BYTES: u64 = 1 << 30;

/// Reads at most `bound` bytes of the regular file at `path` (a `/proc`
/// link a target controls: never a FIFO or device, never unbounded).
fn read_regular_bounded(path: &Path, bound: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let file = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() || meta.len() > bound {
        return Err(Error::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(format!("not a regular file of at most {bound} bytes")),
        });
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(bound).read_to_end(&mut data).map_err(io)?;
    Ok(data)
}

/// The run-time address of function `target` (`name[+OFF]`) of this executable.
fn self_symbol_address(event: &str, target: &str) -> Result<u64> {
    let (symbol, offset) = symbol_and_offset(event, target)?;
    let exe = fs::read_link("/proc/self/exe")
        .map_err(|source| Error::Io { path: "/proc/self/exe".into(), source })?;
    let elf = ElfFile::open(&exe)?;
    let sym = elf.lookup_function(symbol)?;
    let maps_path = Path::new("/proc/self/maps");
    let maps =
        fs::read_to_string(maps_path).map_err(|source| Error::Io { path: maps_path.into(), source })?;
    let lines: Vec<MapLine> = map_lines(&maps).collect();
    let vaddr = sym.address.wrapping_add(offset);
    runtime_address(&elf, &lines, &exe.to_string_lossy(), vaddr).ok_or_else(|| Error::Elf {
        path: exe.clone(),
        reason: "not found in /proc/self/maps, so its load address is unknown".into(),
    })
}

/// The run-time address of function `target` (`name[+OFF]`) in the first
/// module of process `pid` that defines it, in the order of its
/// `/proc/PID/maps` (the executable first). Modules are read through
/// `/proc/PID/map_files`, so a file renamed or replaced since it was mapped
/// is still the one the process runs.
fn process_symbol_address(event: &str, target: &str, pid: i32) -> Result<u64> {
    let (symbol, offset) = symbol_and_offset(event, target)?;
    let maps_path = PathBuf::from(format!("/proc/{pid}/maps"));
    let maps = String::from_utf8_lossy(&read_regular_bounded(&maps_path, MAX_MAPS_BYTES)?).into_owned();
    let lines: Vec<MapLine> = map_lines(&maps).filter(|m| m.path.starts_with('/')).collect();
    let mut tried: Vec<&str> = Vec::new();
    for first in &lines {
        if tried.contains(&first.path.as_str()) {
            continue;
        }
        tried.push(&first.path);
        let link = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", first.start, first.end));
        let Ok(data) = read_regular_bounded(&link, MAX_MODULE_BYTES) else { continue };
        let Ok(elf) = ElfFile::parse(&first.path, data) else { continue };
        let Ok(sym) = elf.lookup_function(symbol) else { continue };
        if let Some(at) = runtime_address(&elf, &lines, &first.path, sym.address.wrapping_add(offset)) {
            return Ok(at);
        }
    }
    Err(Error::BadAddress {
        event: event.to_string(),
        reason: format!(
            "no function `{symbol}` in the {} modules mapped by process {pid} (their files are read through \
             /proc/{pid}/map_files, which needs CAP_SYS_ADMIN)",
            tried.len()
        ),
    })
}

#[cfg(test)]
mod tests;
