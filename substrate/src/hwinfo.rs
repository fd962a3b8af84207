//! What the machine offers a measurement layer: CPU identity and topology,
//! caches, the TSC, the hypervisor, hardware counters and perf PMUs.
//!
//! Read from CPUID, `/proc` and sysfs. [`HwInfo::collect_from`] takes the
//! root of those trees so tests can hand in fixtures.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::arch;
use crate::clock::{ClockInfo, clock};
use crate::read::ReadMethod;
use crate::vclock::ThreadClock;

/// The version of the JSON layout `papirus-hwinfo --json` prints.
pub const FORMAT_VERSION: u32 = 1;

/// One cache as sysfs describes it for CPU 0.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cache {
    /// 1, 2, 3…
    pub level: u32,
    /// `Data`, `Instruction` or `Unified`.
    pub kind: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// How many CPUs share one instance.
    pub shared_by_cpus: usize,
    /// Line size in bytes (`coherency_line_size`; 0 when not exposed).
    pub line_bytes: u64,
    /// Associativity in ways (`ways_of_associativity`; 0 when not exposed).
    pub ways: u32,
}

/// The hypervisor, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hypervisor {
    /// The leaf 0x4000_0000 signature (`KVMKVMKVM`).
    pub signature: String,
    /// Its common name (`KVM`), or the signature when unknown.
    pub name: String,
}

/// Hardware performance counters usable through perf.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// General-purpose counters usable here (0 without a core PMU).
    pub general_purpose: u32,
    /// Fixed-function counters usable here.
    pub fixed: u32,
    /// What CPUID claims (general-purpose, fixed), whether or not perf exposes them.
    pub cpuid_claims: (u32, u32),
    /// The core PMU's sysfs name (`cpu`, `cpu_core`), if exposed.
    pub core_pmu: Option<String>,
    /// Why the usable numbers are 0, when they are.
    pub reason: Option<String>,
}

/// A perf PMU from `/sys/bus/event_source/devices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pmu {
    /// Its name.
    pub name: String,
    /// Its `perf_event_attr.type`.
    pub type_: u32,
}

/// Everything papirus reports about the machine.
#[derive(Clone, Debug, Serialize)]
pub struct HwInfo {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// CPUID vendor string.
    pub vendor: String,
    /// Display family.
    pub family: u32,
    /// Display model.
    pub model: u32,
    /// Stepping.
    pub stepping: u32,
    /// `model name` from /proc/cpuinfo.
    pub model_name: Option<String>,
    /// Online logical CPUs.
    pub cpus: usize,
    /// Physical cores (distinct package/core pairs).
    pub cores: usize,
    /// Logical CPUs per core.
    pub threads_per_core: usize,
    /// Sockets (distinct packages).
    pub sockets: usize,
    /// NUMA nodes (at least 1).
    pub numa_nodes: usize,
    /// Caches of CPU 0, by level.
    pub caches: Vec<Cache>,
    /// The real-time clock setup: TSC frequency, how found, usability.
    pub clock: ClockInfo,
    /// How virtual (thread CPU) time is read here (see [`crate::vclock`]).
    pub virtual_time: ReadMethod,
    /// The hypervisor, if CPUID reports one.
    pub hypervisor: Option<Hypervisor>,
    /// Hardware counters.
    pub counters: Counters,
    /// `/sys/bus/event_source/devices/cpu/rdpmc` (0 off, 1 for own events, 2 always), if present.
    pub rdpmc: Option<u32>,
    /// `/proc/sys/kernel/perf_event_paranoid`, if readable.
    pub perf_event_paranoid: Option<i32>,
    /// The PMUs perf offers.
    pub pmus: Vec<Pmu>,
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Parses a sysfs cache size (`32K`, `1024K`, `32M`, `512`).
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1024),
        'M' | 'm' => (&s[..s.len() - 1], 1024 * 1024),
        'G' | 'g' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mul)
}

/// The CPU numbers of a sysfs list (`0-3,8,10-11`); none when it is malformed.
fn cpus_of(list: &str) -> Vec<u32> {
    crate::pmu::parse_cpulist(list).unwrap_or_default()
}

/// The online CPUs (`/sys/devices/system/cpu/online`); empty when unreadable.
pub fn online_cpus() -> Vec<u32> {
    read_trim(Path::new("/sys/devices/system/cpu/online")).map(|s| cpus_of(&s)).unwrap_or_default()
}

fn hypervisor_name(sig: &str) -> String {
    match sig {
        "KVMKVMKVM" => "KVM",
        "VMwareVMware" => "VMware",
        "Microsoft Hv" => "Hyper-V",
        "XenVMMXenVMM" => "Xen",
        "TCGTCGTCGTCG" => "QEMU TCG",
        "bhyve bhyve" => "bhyve",
        "ACRNACRNACRN" => "ACRN",
        other => other,
    }
    .to_string()
}

/// Counter numbers CPUID claims for this vendor: (general-purpose, fixed).
fn cpuid_counters(id: &arch::CpuIdentity) -> (u32, u32) {
    match id.vendor.as_str() {
        "GenuineIntel" if id.max_leaf >= 0xA => {
            let a = arch::cpuid(0xA, 0);
            let version = a.eax & 0xFF;
            let gp = (a.eax >> 8) & 0xFF;
            let fixed = if version > 1 { a.edx & 0x1F } else { 0 };
            (gp, fixed)
        }
        "AuthenticAMD" | "HygonGenuine" => {
            // PerfMonV2 enumerates the count; before it, PerfCtrExtCore means 6.
            if id.max_ext_leaf >= 0x8000_0022 && arch::cpuid(0x8000_0022, 0).eax & 1 != 0 {
                (arch::cpuid(0x8000_0022, 0).ebx & 0xF, 0)
            } else if id.max_ext_leaf >= 0x8000_0001 && arch::cpuid(0x8000_0001, 0).ecx & (1 << 23) != 0 {
                (6, 0)
            } else {
                (4, 0)
            }
        }
        _ => (0, 0),
    }
}

/// Where perf lists its PMUs, under `/sys`.
const PMU_DIR: &str = "bus/event_source/devices";

/// The PMUs in `dir`, by type.
fn pmus_in(dir: &Path) -> Vec<Pmu> {
    let mut pmus: Vec<Pmu> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let type_ = read_trim(&e.path().join("type"))?.parse().ok()?;
                    Some(Pmu { name, type_ })
                })
                .collect()
        })
        .unwrap_or_default();
    pmus.sort_by_key(|p| p.type_);
    pmus
}

impl Hypervisor {
    /// The hypervisor CPUID reports for `id`, if any.
    pub fn of(id: &arch::CpuIdentity) -> Option<Hypervisor> {
        id.hypervisor_signature
            .as_ref()
            .map(|s| Hypervisor { signature: s.clone(), name: hypervisor_name(s) })
    }
}

impl Counters {
    /// This machine's hardware counters, as [`HwInfo::counters`] reports
    /// them, without the rest of [`HwInfo`]: choosing and checking events
    /// needs these and never waits for the clock.
    pub fn collect(id: &arch::CpuIdentity) -> Counters {
        let dir = Path::new("/sys").join(PMU_DIR);
        Counters::of(&dir, &pmus_in(&dir), id)
    }

    /// The counters of the core PMU among `pmus` (found in `pmu_dir`).
    fn of(pmu_dir: &Path, pmus: &[Pmu], id: &arch::CpuIdentity) -> Counters {
        let core_pmu = pmus
            .iter()
            .find(|p| {
                p.type_ == perf_event_open_sys::bindings::PERF_TYPE_RAW
                    || p.name == "cpu"
                    || p.name == "cpu_core"
            })
            .map(|p| p.name.clone());
        let claims = cpuid_counters(id);
        match core_pmu {
            Some(_) => Counters {
                general_purpose: claims.0,
                fixed: claims.1,
                cpuid_claims: claims,
                core_pmu,
                reason: None,
            },
            None => Counters {
                general_purpose: 0,
                fixed: 0,
                cpuid_claims: claims,
                core_pmu: None,
                reason: Some(format!(
                    "no core PMU in {} (found: {}){}",
                    pmu_dir.display(),
                    pmus.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
                    if id.hypervisor { ": the hypervisor does not expose one to this guest" } else { "" }
                )),
            },
        }
    }
}

impl HwInfo {
    /// Collects from this machine.
    pub fn collect() -> HwInfo {
        HwInfo::collect_from(Path::new("/"))
    }

    /// Collects with `/proc` and `/sys` taken under `root` (CPUID and the
    /// clocks always come from this machine).
    pub fn collect_from(root: &Path) -> HwInfo {
        let sys = root.join("sys");
        let id = arch::identity();
        let model_name = std::fs::read_to_string(root.join("proc/cpuinfo")).ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        let cpu_dir = sys.join("devices/system/cpu");
        let online = read_trim(&cpu_dir.join("online")).map(|s| cpus_of(&s)).unwrap_or_default();
        let mut cores = BTreeSet::new();
        let mut sockets = BTreeSet::new();
        for cpu in &online {
            let topo = cpu_dir.join(format!("cpu{cpu}/topology"));
            let pkg = read_trim(&topo.join("physical_package_id")).unwrap_or_default();
            let core = read_trim(&topo.join("core_id")).unwrap_or_default();
            sockets.insert(pkg.clone());
            cores.insert((pkg, core));
        }
        let cpus = online.len();
        let threads_per_core = if cores.is_empty() { 0 } else { cpus / cores.len() };
        let numa_nodes =
            read_trim(&sys.join("devices/system/node/online")).map_or(1, |s| cpus_of(&s).len().max(1));

        let mut caches = Vec::new();
        for i in 0.. {
            let d = cpu_dir.join(format!("cpu0/cache/index{i}"));
            if !d.exists() {
                break;
            }
            let (Some(level), Some(kind), Some(size)) = (
                read_trim(&d.join("level")).and_then(|s| s.parse().ok()),
                read_trim(&d.join("type")),
                read_trim(&d.join("size")).and_then(|s| parse_size(&s)),
            ) else {
                continue;
            };
            let shared_by_cpus = read_trim(&d.join("shared_cpu_list")).map_or(1, |s| cpus_of(&s).len());
            let number = |f: &str| read_trim(&d.join(f)).and_then(|s| s.parse().ok()).unwrap_or(0);
            caches.push(Cache {
                level,
                kind,
                size_bytes: size,
                shared_by_cpus,
                line_bytes: number("coherency_line_size"),
                ways: number("ways_of_associativity") as u32,
            });
        }

        let pmu_dir = sys.join(PMU_DIR);
        let pmus = pmus_in(&pmu_dir);
        let counters = Counters::of(&pmu_dir, &pmus, &id);
        let rdpmc = counters
            .core_pmu
            .as_ref()
            .and_then(|n| read_trim(&pmu_dir.join(n).join("rdpmc")))
            .and_then(|s| s.parse().ok());
        HwInfo {
            format_version: FORMAT_VERSION,
            vendor: id.vendor.clone(),
            family: id.family,
            model: id.model,
            stepping: id.stepping,
            model_name,
            cpus,
            cores: cores.len(),
            threads_per_core,
            sockets: sockets.len(),
            numa_nodes,
            caches,
            clock: clock().info(),
            // A throwaway reader on this thread: its event is closed at once.
            virtual_time: ThreadClock::new().method(),
            hypervisor: Hypervisor::of(&id),
            counters,
            rdpmc,
            perf_event_paranoid: read_trim(&root.join("proc/sys/kernel/perf_event_paranoid"))
                .and_then(|s| s.parse().ok()),
            pmus,
        }
    }
}

fn human_size(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

impl fmt::Display for HwInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = |f: &mut fmt::Formatter<'_>, k: &str, v: String| writeln!(f, "{k:<22} {v}");
        row(f, "vendor", self.vendor.clone())?;
        row(f, "model name", self.model_name.clone().unwrap_or_else(|| "-".into()))?;
        row(f, "family/model/stepping", format!("{:#x}/{:#x}/{}", self.family, self.model, self.stepping))?;
        row(
            f,
            "topology",
            format!(
                "{} cpus, {} cores, {} threads/core, {} sockets, {} NUMA nodes",
                self.cpus, self.cores, self.threads_per_core, self.sockets, self.numa_nodes
            ),
        )?;
        for c in &self.caches {
            row(
                f,
                &format!("L{} {}", c.level, c.kind.to_lowercase()),
                format!(
                    "{}{}{} (shared by {} cpus)",
                    human_size(c.size_bytes),
                    if c.line_bytes > 0 { format!(", {} B lines", c.line_bytes) } else { String::new() },
                    if c.ways > 0 { format!(", {}-way", c.ways) } else { String::new() },
                    c.shared_by_cpus
                ),
            )?;
        }
        let tsc = match (self.clock.tsc_hz, self.clock.method) {
            (Some(hz), Some(m)) => format!("{:.3} MHz ({m})", hz / 1e6),
            _ => "-".into(),
        };
        row(f, "TSC frequency", tsc)?;
        let src = match &self.clock.source {
            crate::clock::Source::Tsc => "tsc".to_string(),
            crate::clock::Source::Monotonic { reason } => format!("CLOCK_MONOTONIC ({reason})"),
        };
        row(f, "real time source", src)?;
        let vt = match &self.virtual_time {
            ReadMethod::PageTime => "perf page cap_user_time extrapolation".to_string(),
            ReadMethod::ReadPlusTsc => {
                "CLOCK_THREAD_CPUTIME_ID + TSC while the perf page lock holds".to_string()
            }
            ReadMethod::Syscall { reason } => format!("CLOCK_THREAD_CPUTIME_ID syscall ({reason})"),
            // A thread's CPU time is never on a hardware counter.
            ReadMethod::Rdpmc => "rdpmc".to_string(),
        };
        row(f, "virtual time", vt)?;
        row(
            f,
            "hypervisor",
            self.hypervisor.as_ref().map_or("none".into(), |h| format!("{} ({})", h.name, h.signature)),
        )?;
        let c = &self.counters;
        let mut counters = format!("{} general-purpose, {} fixed", c.general_purpose, c.fixed);
        if let Some(r) = &c.reason {
            counters += &format!(" — {r}; cpuid claims {}+{}", c.cpuid_claims.0, c.cpuid_claims.1);
        }
        row(f, "hardware counters", counters)?;
        row(f, "rdpmc", self.rdpmc.map_or("not available (no core PMU)".into(), |v| v.to_string()))?;
        row(f, "perf_event_paranoid", self.perf_event_paranoid.map_or("-".into(), |v| v.to_string()))?;
        row(
            f,
            "PMUs",
            self.pmus.iter().map(|p| format!("{}({})", p.name, p.type_)).collect::<Vec<_>>().join(", "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    /// A fake machine root in a private directory, removed when dropped.
    fn fixture(name: &str) -> tempfile::TempDir {
        let dir = tempfile::Builder::new().prefix(&format!("papirus-hwinfo-{name}-")).tempdir().unwrap();
        let root = dir.path();
        write(root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU 9000\n");
        write(root, "proc/sys/kernel/perf_event_paranoid", "2\n");
        write(root, "sys/devices/system/cpu/online", "0-3\n");
        for (cpu, core) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
            write(root, &format!("sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"), "0\n");
            write(root, &format!("sys/devices/system/cpu/cpu{cpu}/topology/core_id"), &format!("{core}\n"));
        }
        write(root, "sys/devices/system/node/online", "0-1\n");
        for (i, (level, kind, size, shared)) in
            [(1, "Data", "48K", "0-1"), (2, "Unified", "2048K", "0-1"), (3, "Unified", "32M", "0-3")]
                .iter()
                .enumerate()
        {
            let d = format!("sys/devices/system/cpu/cpu0/cache/index{i}");
            write(root, &format!("{d}/level"), &format!("{level}\n"));
            write(root, &format!("{d}/type"), &format!("{kind}\n"));
            write(root, &format!("{d}/size"), &format!("{size}\n"));
            write(root, &format!("{d}/shared_cpu_list"), &format!("{shared}\n"));
            write(root, &format!("{d}/coherency_line_size"), "64\n");
            write(root, &format!("{d}/ways_of_associativity"), &format!("{}\n", 4 << level));
        }
        for (pmu, t) in [("software", 1), ("tracepoint", 2), ("breakpoint", 5)] {
            write(root, &format!("sys/bus/event_source/devices/{pmu}/type"), &format!("{t}\n"));
        }
        dir
    }

    #[test]
    fn fixture_topology_caches_and_missing_core_pmu() {
        let dir = fixture("nopmu");
        let root = dir.path();
        let h = HwInfo::collect_from(root);
        assert_eq!(h.model_name.as_deref(), Some("Test CPU 9000"));
        assert_eq!((h.cpus, h.cores, h.threads_per_core, h.sockets, h.numa_nodes), (4, 2, 2, 1, 2));
        assert_eq!(h.caches.len(), 3);
        assert_eq!(
            h.caches[0],
            Cache {
                level: 1,
                kind: "Data".into(),
                size_bytes: 48 * 1024,
                shared_by_cpus: 2,
                line_bytes: 64,
                ways: 8
            }
        );
        assert_eq!(h.caches[2].size_bytes, 32 << 20);
        assert_eq!(h.counters.general_purpose, 0);
        assert!(h.counters.reason.as_deref().unwrap().contains("software, tracepoint, breakpoint"));
        assert_eq!(h.rdpmc, None);
        assert_eq!(h.perf_event_paranoid, Some(2));
        // With a core PMU the CPUID numbers are reported, and rdpmc is read.
        write(root, "sys/bus/event_source/devices/cpu/type", "4\n");
        write(root, "sys/bus/event_source/devices/cpu/rdpmc", "1\n");
        let h = HwInfo::collect_from(root);
        assert_eq!(h.counters.core_pmu.as_deref(), Some("cpu"));
        assert_eq!(h.counters.reason, None);
        assert_eq!((h.counters.general_purpose, h.counters.fixed), h.counters.cpuid_claims);
        assert_eq!(h.rdpmc, Some(1));
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["format_version"], FORMAT_VERSION);
        assert!(h.to_string().contains("Test CPU 9000"));
    }

    #[test]
    fn list_and_size_parsing() {
        assert_eq!(cpus_of("0-3,8,10-11").len(), 7);
        assert_eq!(cpus_of(""), Vec::<u32>::new());
        assert_eq!(cpus_of("5-2,x"), Vec::<u32>::new(), "a malformed list counts nothing");
        assert_eq!(cpus_of("0,2-3"), vec![0, 2, 3]);
        assert_eq!(parse_size("32K"), Some(32768));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("K"), None);
        assert_eq!(hypervisor_name("KVMKVMKVM"), "KVM");
    }
}
