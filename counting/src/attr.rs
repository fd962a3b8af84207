//! The description of one perf event: what `perf_event_attr` holds that a
//! user cares about, built with `&mut self` setters so one description can be
//! opened on many threads or CPUs.

use std::ffi::CString;

use perf_event_open_sys::bindings as b;
use serde::{Deserialize, Serialize};

use crate::sys::perf_event_attr;

/// Privilege domains an event counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Domain {
    /// Count while the CPU runs user code.
    pub user: bool,
    /// Count while it runs kernel code.
    pub kernel: bool,
    /// Count while it runs the hypervisor.
    pub hypervisor: bool,
}

impl Domain {
    /// User space only: what an unprivileged user may count at paranoid 2.
    pub const USER: Domain = Domain { user: true, kernel: false, hypervisor: false };
    /// Kernel only.
    pub const KERNEL: Domain = Domain { user: false, kernel: true, hypervisor: false };
    /// Hypervisor only.
    pub const HYPERVISOR: Domain = Domain { user: false, kernel: false, hypervisor: true };
    /// Everything.
    pub const ALL: Domain = Domain { user: true, kernel: true, hypervisor: true };

    /// The domain an event of `kind` with `config` on the PMU named `pmu`
    /// (its sysfs name: `software`, `msr`, `tracepoint`, …) gets when its
    /// name carries no `:u`/`:k`/`:h` modifier.
    ///
    /// User only, so that a non-root user at `perf_event_paranoid=2` can
    /// measure itself — except where user only would fail or count nothing:
    ///
    /// * tracepoints: most fire with the kernel's own registers, so
    ///   `exclude_kernel` hides every hit (`sched:sched_switch` counts 0);
    ///   `syscalls:*` carry the user registers and count either way:
    ///   all domains;
    /// * software events raised by the scheduler (`context-switches`,
    ///   `cpu-migrations`, `cgroup-switches`) likewise count 0 user only:
    ///   all domains;
    /// * PMUs that cannot exclude a mode reject any `exclude_*` bit with
    ///   EINVAL: `msr`, RAPL `power`, `cstate_*`, and uncore/northbridge PMUs
    ///   (`uncore_*`, `amd_df`, `amd_l3`, `amd_umc_*`, `amd_iommu_*`): all
    ///   domains.
    ///
    /// Opening an all-domain event needs root, CAP_PERFMON or
    /// `perf_event_paranoid` ≤ 1; the open error says so.
    pub fn default_for(kind: Kind, pmu: &str, config: u64) -> Domain {
        const NO_EXCLUDE: [&str; 9] =
            ["msr", "power", "cstate_", "uncore", "amd_df", "amd_l3", "amd_umc", "amd_iommu", "amd_nb"];
        const SCHEDULER: [u32; 3] = [
            b::PERF_COUNT_SW_CONTEXT_SWITCHES,
            b::PERF_COUNT_SW_CPU_MIGRATIONS,
            b::PERF_COUNT_SW_CGROUP_SWITCHES,
        ];
        let scheduler = kind == Kind::Software && SCHEDULER.iter().any(|&c| u64::from(c) == config);
        if kind == Kind::Tracepoint || scheduler || NO_EXCLUDE.iter().any(|p| pmu.starts_with(p)) {
            Domain::ALL
        } else {
            Domain::USER
        }
    }
}

/// The PMU-independent kind of an event, used for messages and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `PERF_TYPE_HARDWARE` and `PERF_TYPE_HW_CACHE`, raw and core-PMU events.
    Hardware,
    /// `PERF_TYPE_SOFTWARE`.
    Software,
    /// `PERF_TYPE_TRACEPOINT`.
    Tracepoint,
    /// `PERF_TYPE_BREAKPOINT`.
    Breakpoint,
    /// A dynamic PMU other than the core one (msr, uprobe, uncore…).
    Dynamic,
}

/// A perf event description. Defaults: disabled at open (enable explicitly),
/// domain user only (see [`EventAttr::default_domain`] for the PMUs where
/// that cannot work), no inherit, not pinned, not exclusive, not enabled
/// by an exec.
///
/// Serialisable: the probe tool resolves names to descriptions and ships
/// them to the runtime in its target, which has no name parser.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventAttr {
    name: String,
    kind: Kind,
    type_: u32,
    config: u64,
    config1: u64,
    config2: u64,
    bp_type: u32,
    domain: Domain,
    inherit: bool,
    pinned: bool,
    exclusive: bool,
    enable_on_exec: bool,
    /// The string a uprobe's config1 points to, kept alive with the description.
    uprobe_path: Option<CString>,
}

impl EventAttr {
    /// A description of event `config` of PMU `type_`, named `name` in messages.
    pub fn new(name: impl Into<String>, kind: Kind, type_: u32, config: u64) -> Self {
        EventAttr {
            name: name.into(),
            kind,
            type_,
            config,
            config1: 0,
            config2: 0,
            bp_type: 0,
            domain: Domain::USER,
            inherit: false,
            pinned: false,
            exclusive: false,
            enable_on_exec: false,
            uprobe_path: None,
        }
    }

    /// Renames the event (the name used in errors and reports).
    pub fn name_as(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = name.into();
        self
    }
    /// Sets `config1` (also `bp_addr` for breakpoints).
    pub fn config1(&mut self, v: u64) -> &mut Self {
        self.config1 = v;
        self
    }
    /// Sets `config2` (also `bp_len` for breakpoints, the file offset for uprobes).
    pub fn config2(&mut self, v: u64) -> &mut Self {
        self.config2 = v;
        self
    }
    /// Replaces `config`.
    pub fn config(&mut self, v: u64) -> &mut Self {
        self.config = v;
        self
    }
    /// Sets the breakpoint type (`HW_BREAKPOINT_R`/`W`/`X`).
    pub fn bp_type(&mut self, v: u32) -> &mut Self {
        self.bp_type = v;
        self
    }
    /// Sets the counting domain.
    pub fn domain(&mut self, d: Domain) -> &mut Self {
        self.domain = d;
        self
    }
    /// Sets the domain to [`Domain::default_for`] this event's kind and
    /// config on the PMU named `pmu`: what the name parser applies when the user gave no
    /// modifier. [`EventAttr::new`] itself starts with user only.
    pub fn default_domain(&mut self, pmu: &str) -> &mut Self {
        self.domain = Domain::default_for(self.kind, pmu, self.config);
        self
    }
    /// Counts children created after the event is opened.
    pub fn inherit(&mut self, on: bool) -> &mut Self {
        self.inherit = on;
        self
    }
    /// Keeps the event (or group leader) always on the PMU, or in error state.
    pub fn pinned(&mut self, on: bool) -> &mut Self {
        self.pinned = on;
        self
    }
    /// Asks for the PMU to itself while the group is scheduled.
    pub fn exclusive(&mut self, on: bool) -> &mut Self {
        self.exclusive = on;
        self
    }
    /// Enables the event when its task next calls `execve`, so a task opened
    /// before its exec counts exactly the new program (as `perf stat` counts a
    /// command it starts).
    pub fn enable_on_exec(&mut self, on: bool) -> &mut Self {
        self.enable_on_exec = on;
        self
    }
    /// Points config1 at a path for the uprobe PMU; the string lives with `self`.
    pub fn uprobe_path(&mut self, path: CString) -> &mut Self {
        self.uprobe_path = Some(path);
        self
    }

    /// The name used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The kind of event.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The PMU type number (`perf_event_attr.type`).
    pub fn pmu_type(&self) -> u32 {
        self.type_
    }
    /// Whether this is task-clock or cpu-clock: a software event that grows
    /// with the thread's (or CPU's) running time, so it can be read like the
    /// thread's CPU time.
    pub fn is_clock(&self) -> bool {
        self.type_ == b::PERF_TYPE_SOFTWARE
            && (self.config == u64::from(b::PERF_COUNT_SW_TASK_CLOCK)
                || self.config == u64::from(b::PERF_COUNT_SW_CPU_CLOCK))
    }
    /// `config`.
    pub fn config_value(&self) -> u64 {
        self.config
    }
    /// `config1`, as it will be opened (the uprobe path pointer is not shown).
    pub fn config1_value(&self) -> u64 {
        self.config1
    }
    /// `config2`.
    pub fn config2_value(&self) -> u64 {
        self.config2
    }
    /// The breakpoint type.
    pub fn bp_type_value(&self) -> u32 {
        self.bp_type
    }
    /// The counting domain.
    pub fn domain_value(&self) -> Domain {
        self.domain
    }
    /// Whether children are counted.
    pub fn is_inherited(&self) -> bool {
        self.inherit
    }
    /// The uprobe path, if this is a uprobe.
    pub fn uprobe_path_value(&self) -> Option<&CString> {
        self.uprobe_path.as_ref()
    }

    /// The kernel struct for this description. Disabled at open; the caller
    /// adds `read_format` and sampling fields.
    pub fn to_raw(&self) -> perf_event_attr {
        let mut a = perf_event_attr {
            type_: self.type_,
            size: std::mem::size_of::<perf_event_attr>() as u32,
            config: self.config,
            ..Default::default()
        };
        a.bp_type = self.bp_type;
        let config1 = match &self.uprobe_path {
            Some(p) => p.as_ptr() as u64,
            None => self.config1,
        };
        a.__bindgen_anon_3.config1 = config1;
        a.__bindgen_anon_4.config2 = self.config2;
        a.set_disabled(1);
        a.set_exclude_user(u64::from(!self.domain.user));
        a.set_exclude_kernel(u64::from(!self.domain.kernel));
        a.set_exclude_hv(u64::from(!self.domain.hypervisor));
        a.set_inherit(u64::from(self.inherit));
        a.set_pinned(u64::from(self.pinned));
        a.set_exclusive(u64::from(self.exclusive));
        a.set_enable_on_exec(u64::from(self.enable_on_exec));
        a
    }
}

/// Well-known `perf_event_attr` constants, re-exported for the layers above.
pub mod consts {
    pub use super::b::{
        PERF_COUNT_HW_CACHE_BPU, PERF_COUNT_HW_CACHE_DTLB, PERF_COUNT_HW_CACHE_ITLB, PERF_COUNT_HW_CACHE_L1D,
        PERF_COUNT_HW_CACHE_L1I, PERF_COUNT_HW_CACHE_LL, PERF_COUNT_HW_CACHE_NODE, PERF_TYPE_BREAKPOINT,
        PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT,
    };
}
