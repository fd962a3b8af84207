//! Real (wall) time from the TSC, converted to nanoseconds without a system
//! call or a division.
//!
//! # Design
//!
//! [`Clock::raw`] returns TSC ticks (one `rdtsc`, about 9 ns here);
//! [`Clock::scaled`] turns ticks into nanoseconds with a precomputed
//! `mult`/`shift` (one 64×64→128 multiply and a shift). Hot loops store
//! ticks and convert later. [`Clock::now`] does both.
//!
//! The conversion is found once per process ([`clock`] caches it in a
//! `OnceLock`), from the first source that works:
//!
//! 1. the kernel's own conversion (`time_zero`, `time_mult`, `time_shift`)
//!    on a perf mmap page that offers `cap_user_time_zero` — then `scaled`
//!    gives the kernel's perf clock exactly;
//! 2. CPUID leaf 0x15 (TSC/crystal ratio and crystal frequency, Intel),
//!    with leaf 0x16's base frequency when the crystal is not enumerated;
//! 3. the hypervisor's TSC frequency leaf 0x4000_0010 (KVM, VMware);
//! 4. a bounded calibration against `CLOCK_MONOTONIC_RAW`
//!    ([`CALIBRATION_WINDOW`] × at most [`CALIBRATION_ROUNDS`]).
//!
//! Except for method 1, `scaled` is anchored so that it reads
//! `CLOCK_MONOTONIC_RAW` at the moment of calibration.
//!
//! # Caveats
//!
//! - The TSC is used only when it is invariant (CPUID, or Linux's
//!   `constant_tsc` + `nonstop_tsc` flags) *and* the kernel's current
//!   clocksource is `tsc` (the kernel found it synchronised across CPUs).
//!   Otherwise every read is `clock_gettime(CLOCK_MONOTONIC)` through the
//!   vDSO, and ticks are nanoseconds ([`Source::Monotonic`] says why).
//! - Plain `rdtsc` may execute before earlier instructions finish; use
//!   [`Clock::raw_ordered`] at the start of a short measured region.
//! - A calibrated frequency is good to a few ppm; over long intervals the
//!   TSC-derived time drifts from NTP-disciplined `CLOCK_MONOTONIC` as
//!   `CLOCK_MONOTONIC_RAW` does.

use std::sync::OnceLock;
use std::time::Duration;

use perf_event_open_sys::bindings as b;
use serde::Serialize;

use crate::arch;
use crate::attr::{EventAttr, Kind};
use crate::mmap::{NativeCpu, mul_shift, page_size};
use crate::sys;

/// Length of one calibration round against `CLOCK_MONOTONIC_RAW`.
pub const CALIBRATION_WINDOW: Duration = Duration::from_millis(10);
/// Most calibration rounds; calibration stops earlier once two rounds agree.
pub const CALIBRATION_ROUNDS: usize = 5;
/// Two rounds agreeing within this many parts per million end calibration.
pub const CALIBRATION_AGREEMENT_PPM: f64 = 5.0;
/// Samples per calibration endpoint; the one with the tightest TSC bracket wins.
const ENDPOINT_SAMPLES: usize = 7;

/// How the TSC frequency (and conversion) was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TscMethod {
    /// The kernel's `time_mult`/`time_shift`/`time_zero` from a perf mmap page.
    KernelPage,
    /// CPUID leaf 0x15 (TSC/crystal ratio × crystal frequency).
    Cpuid15,
    /// CPUID leaf 0x15's ratio with leaf 0x16's base frequency (MHz precision).
    Cpuid16,
    /// The hypervisor's leaf 0x4000_0010 (TSC kHz).
    HypervisorLeaf,
    /// Measured against `CLOCK_MONOTONIC_RAW`.
    Calibrated,
}

impl std::fmt::Display for TscMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TscMethod::KernelPage => "kernel perf page (time_mult/time_shift/time_zero)",
            TscMethod::Cpuid15 => "cpuid 0x15",
            TscMethod::Cpuid16 => "cpuid 0x15 + 0x16",
            TscMethod::HypervisorLeaf => "hypervisor cpuid 0x40000010",
            TscMethod::Calibrated => "calibrated against CLOCK_MONOTONIC_RAW",
        })
    }
}

/// What real time is read from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Source {
    /// `rdtsc`, scaled.
    Tsc,
    /// `clock_gettime(CLOCK_MONOTONIC)` (vDSO), because the TSC is not usable.
    Monotonic {
        /// Why the TSC was not used.
        reason: String,
    },
}

/// Whether the TSC can serve as a clock here, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TscCheck {
    /// CPUID 0x8000_0007 EDX bit 8.
    pub invariant_cpuid: bool,
    /// `/proc/cpuinfo` lists `constant_tsc` and `nonstop_tsc`.
    pub constant_nonstop_flags: bool,
    /// `/sys/devices/system/clocksource/clocksource0/current_clocksource`.
    pub clocksource: Option<String>,
}

impl TscCheck {
    /// Reads the evidence from CPUID, `/proc/cpuinfo` and sysfs.
    pub fn detect() -> Self {
        let flags = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
            s.lines().find(|l| l.starts_with("flags")).map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.contains(&"constant_tsc") && f.contains(&"nonstop_tsc")
            })
        });
        TscCheck {
            invariant_cpuid: arch::identity().invariant_tsc,
            constant_nonstop_flags: flags.unwrap_or(false),
            clocksource: std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .ok()
            .map(|s| s.trim().to_string()),
        }
    }

    /// `Ok` when the TSC is usable, else the reason.
    pub fn verdict(&self) -> Result<(), String> {
        if !self.invariant_cpuid && !self.constant_nonstop_flags {
            return Err(
                "the TSC is not invariant (no invariant-TSC cpuid bit, no constant_tsc+nonstop_tsc)".into()
            );
        }
        match self.clocksource.as_deref() {
            Some("tsc") => Ok(()),
            Some(other) => {
                Err(format!("the kernel's clocksource is {other}, not tsc (TSC not trusted across CPUs)"))
            }
            None => Err("the current clocksource could not be read from sysfs".into()),
        }
    }
}

/// Real time: TSC ticks and their conversion to nanoseconds.
#[derive(Clone, Debug)]
pub struct Clock {
    source: Source,
    mult: u64,
    shift: u32,
    offset: u64,
    tsc_hz: Option<f64>,
    method: Option<TscMethod>,
    check: TscCheck,
}

/// A serialisable summary of how the clock was set up.
#[derive(Clone, Debug, Serialize)]
pub struct ClockInfo {
    /// What reads come from.
    pub source: Source,
    /// TSC frequency in Hz, when known.
    pub tsc_hz: Option<f64>,
    /// How it was found.
    pub method: Option<TscMethod>,
    /// The usability evidence.
    pub check: TscCheck,
    /// The conversion multiplier (ns = (ticks × mult) >> shift + offset).
    pub mult: u64,
    /// The conversion shift.
    pub shift: u32,
}

static CLOCK: OnceLock<Clock> = OnceLock::new();

/// The process-wide clock, set up on first use (up to about 50 ms when it
/// has to calibrate).
pub fn clock() -> &'static Clock {
    CLOCK.get_or_init(Clock::new)
}

/// Sets up [`clock`] on a thread of its own, so that a calibration (mostly
/// sleeping) overlaps with the caller's work instead of delaying the first
/// caller that needs the clock; that caller then waits only for what is
/// left of it. Does nothing after the first call, or once the clock is set up.
pub fn set_up_in_background() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if CLOCK.get().is_none() {
            // Without a thread (none can be made), the first use sets it up.
            let _ = std::thread::Builder::new().name("papirus-clock".into()).spawn(clock);
        }
    });
}

// The process-wide clock is shared by every thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Clock>();
};

struct Conv {
    mult: u64,
    shift: u32,
    offset: Option<u64>,
    hz: f64,
    method: TscMethod,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// Detects the TSC and its frequency (prefer the shared [`clock`]).
    pub fn new() -> Clock {
        let check = TscCheck::detect();
        if let Err(reason) = check.verdict() {
            return Clock::monotonic(reason, check);
        }
        let conv = kernel_conversion(&*sys::kernel())
            .or_else(cpuid_frequency)
            .or_else(hypervisor_frequency)
            .or_else(|| calibrate().map(|hz| from_hz(hz, TscMethod::Calibrated)));
        let Some(conv) = conv else {
            return Clock::monotonic(
                "CLOCK_MONOTONIC_RAW unreadable: TSC calibration impossible".into(),
                check,
            );
        };
        let offset = conv.offset.unwrap_or_else(|| {
            // Anchor ticks to CLOCK_MONOTONIC_RAW's line.
            let (tsc, ns) = paired_sample();
            ns.wrapping_sub(mul_shift(tsc, conv.mult, conv.shift))
        });
        Clock {
            source: Source::Tsc,
            mult: conv.mult,
            shift: conv.shift,
            offset,
            tsc_hz: Some(conv.hz),
            method: Some(conv.method),
            check,
        }
    }

    fn monotonic(reason: String, check: TscCheck) -> Clock {
        Clock {
            source: Source::Monotonic { reason },
            mult: 1,
            shift: 0,
            offset: 0,
            tsc_hz: None,
            method: None,
            check,
        }
    }

    /// Raw ticks: TSC cycles, or nanoseconds of `CLOCK_MONOTONIC` when the
    /// TSC is not usable. Compare or subtract freely; convert with [`scaled`](Self::scaled).
    #[inline(always)]
    pub fn raw(&self) -> u64 {
        match self.source {
            Source::Tsc => arch::rdtsc(),
            Source::Monotonic { .. } => monotonic_ns(),
        }
    }

    /// Raw ticks taken after all earlier instructions completed (`lfence; rdtsc`).
    #[inline(always)]
    pub fn raw_ordered(&self) -> u64 {
        match self.source {
            Source::Tsc => arch::rdtsc_ordered(),
            Source::Monotonic { .. } => monotonic_ns(),
        }
    }

    /// Nanoseconds at raw tick value `raw`.
    #[inline(always)]
    pub fn scaled(&self, raw: u64) -> u64 {
        mul_shift(raw, self.mult, self.shift).wrapping_add(self.offset)
    }

    /// Nanoseconds between two raw values (0 if `end` is before `start`).
    #[inline(always)]
    pub fn delta_ns(&self, start: u64, end: u64) -> u64 {
        mul_shift(end.saturating_sub(start), self.mult, self.shift)
    }

    /// Nanoseconds now: `scaled(raw())`.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        self.scaled(self.raw())
    }

    /// Microseconds now.
    #[inline(always)]
    pub fn now_us(&self) -> u64 {
        self.now() / 1000
    }

    /// Ticks to nanoseconds as `(mult, shift)`: `ns = (ticks × mult) >> shift`.
    pub fn tick_scale(&self) -> (u64, u32) {
        (self.mult, self.shift)
    }

    /// Whether raw ticks are TSC cycles.
    pub fn is_tsc(&self) -> bool {
        self.source == Source::Tsc
    }

    /// The TSC frequency in Hz, when the TSC is used.
    pub fn tsc_hz(&self) -> Option<f64> {
        self.tsc_hz
    }

    /// The TSC's rate for the counting core's readers, when real time is
    /// read from the TSC.
    pub fn tsc_rate(&self) -> Option<crate::read::TscRate> {
        let hz = self.tsc_hz.filter(|_| self.is_tsc())?;
        Some(crate::read::TscRate { mult: self.mult, shift: self.shift, hz })
    }

    /// How the conversion was found.
    pub fn method(&self) -> Option<TscMethod> {
        self.method
    }

    /// Everything about the setup, serialisable.
    pub fn info(&self) -> ClockInfo {
        ClockInfo {
            source: self.source.clone(),
            tsc_hz: self.tsc_hz,
            method: self.method,
            check: self.check.clone(),
            mult: self.mult,
            shift: self.shift,
        }
    }
}

fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC is always present on Linux; 0 only if the vDSO and the
    // syscall both fail, which the kernel does not do for valid clock ids.
    sys::clock_gettime(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// `(mult, shift)` with shift 32 for a frequency in Hz: no division at read time.
fn from_hz(hz: f64, method: TscMethod) -> Conv {
    let mult = (1e9 * (1u64 << 32) as f64 / hz).round() as u64;
    Conv { mult, shift: 32, offset: None, hz, method }
}

/// The kernel's conversion from a perf page of a dummy event on this thread.
fn kernel_conversion(k: &dyn sys::Sys) -> Option<Conv> {
    // Disabled and user-only, as descriptions are by default.
    let dummy = u64::from(b::PERF_COUNT_SW_DUMMY);
    let mut attr = EventAttr::new("dummy", Kind::Software, b::PERF_TYPE_SOFTWARE, dummy).to_raw();
    let fd = k.perf_event_open(&mut attr, 0, -1, None, 0).ok()?;
    use std::os::fd::AsFd;
    let map = k.mmap(fd.as_fd(), page_size()).ok()?;
    let r = map.read(&NativeCpu, false)?;
    if !(r.caps.user_time && r.caps.user_time_zero) || r.conv.mult == 0 {
        return None;
    }
    let hz = 1e9 * 2f64.powi(i32::from(r.conv.shift)) / f64::from(r.conv.mult);
    Some(Conv {
        mult: u64::from(r.conv.mult),
        shift: u32::from(r.conv.shift),
        offset: Some(r.conv.zero),
        hz,
        method: TscMethod::KernelPage,
    })
}

fn cpuid_frequency() -> Option<Conv> {
    let id = arch::identity();
    if id.max_leaf < 0x15 {
        return None;
    }
    let l15 = arch::cpuid(0x15, 0);
    if l15.eax == 0 || l15.ebx == 0 {
        return None;
    }
    if l15.ecx != 0 {
        let hz = f64::from(l15.ecx) * f64::from(l15.ebx) / f64::from(l15.eax);
        return Some(from_hz(hz, TscMethod::Cpuid15));
    }
    // No crystal frequency: on these parts the TSC runs at the base frequency.
    if id.max_leaf >= 0x16 {
        let mhz = arch::cpuid(0x16, 0).eax & 0xFFFF;
        if mhz != 0 {
            return Some(from_hz(f64::from(mhz) * 1e6, TscMethod::Cpuid16));
        }
    }
    None
}

fn hypervisor_frequency() -> Option<Conv> {
    let id = arch::identity();
    let sig = id.hypervisor_signature.as_deref()?;
    if !(sig == "KVMKVMKVM" || sig == "VMwareVMware") || id.hypervisor_max_leaf < 0x4000_0010 {
        return None;
    }
    let khz = arch::cpuid(0x4000_0010, 0).eax;
    (khz != 0).then(|| from_hz(f64::from(khz) * 1e3, TscMethod::HypervisorLeaf))
}

/// A TSC value and the `CLOCK_MONOTONIC_RAW` reading taken at its moment:
/// the midpoint of the tightest of a few ordered brackets.
fn paired_sample() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..ENDPOINT_SAMPLES {
        let t0 = arch::rdtsc_ordered();
        let ns = sys::clock_gettime(libc::CLOCK_MONOTONIC_RAW).unwrap_or(0);
        let t1 = arch::rdtsc_ordered();
        let width = t1.wrapping_sub(t0);
        if width < best.0 {
            best = (width, t0 + width / 2, ns);
        }
    }
    (best.1, best.2)
}

/// The TSC frequency measured against `CLOCK_MONOTONIC_RAW`, in rounds of
/// [`CALIBRATION_WINDOW`] until two agree within [`CALIBRATION_AGREEMENT_PPM`]
/// or [`CALIBRATION_ROUNDS`] ran (then the median).
pub fn calibrate() -> Option<f64> {
    sys::clock_gettime(libc::CLOCK_MONOTONIC_RAW).ok()?;
    let mut rounds: Vec<f64> = Vec::with_capacity(CALIBRATION_ROUNDS);
    for _ in 0..CALIBRATION_ROUNDS {
        let (t0, n0) = paired_sample();
        std::thread::sleep(CALIBRATION_WINDOW);
        let (t1, n1) = paired_sample();
        let (dt, dn) = (t1.wrapping_sub(t0), n1.wrapping_sub(n0));
        if dn == 0 || dt == 0 {
            continue;
        }
        let hz = dt as f64 * 1e9 / dn as f64;
        if let Some(&prev) = rounds.last()
            && ((hz - prev) / prev).abs() * 1e6 <= CALIBRATION_AGREEMENT_PPM
        {
            return Some((hz + prev) / 2.0);
        }
        rounds.push(hz);
    }
    if rounds.is_empty() {
        return None;
    }
    Some(crate::stats::median(&rounds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hz_conversion_has_no_division_and_is_exact_to_a_ppb() {
        let c = from_hz(2_596_120_000.0, TscMethod::Calibrated);
        // One second of ticks is one second, to within a nanosecond.
        let ns = mul_shift(2_596_120_000, c.mult, c.shift);
        assert!(ns.abs_diff(1_000_000_000) <= 1, "{ns}");
        // Ten hours of ticks do not overflow.
        let ten_h = 2_596_120_000u64 * 36_000;
        let ns = mul_shift(ten_h, c.mult, c.shift);
        assert!(ns.abs_diff(36_000_000_000_000) < 40_000, "{ns}");
    }

    #[test]
    fn kernel_page_conversion_is_taken_verbatim() {
        use crate::mmap::{Caps, PageImage, TimeConv};
        use crate::sys::mock::MockSys;

        let img = PageImage::new();
        // A 3 GHz TSC as the kernel publishes it: mult/2^shift = 1/3 ns.
        let conv = TimeConv { shift: 31, mult: 715_827_883, zero: 1_000_000, ..TimeConv::default() };
        img.set_time_conv(conv);
        img.bump_lock(2);
        // Without cap_user_time_zero the page is not used.
        assert!(kernel_conversion(&*MockSys::with_page(&img)).is_none());
        img.set_caps(Caps { user_time: true, user_time_zero: true, ..Caps::default() });
        img.bump_lock(2);
        let c = kernel_conversion(&*MockSys::with_page(&img)).expect("page offers the conversion");
        assert_eq!(c.method, TscMethod::KernelPage);
        assert_eq!((c.mult, c.shift, c.offset), (715_827_883, 31, Some(1_000_000)));
        assert!((c.hz - 3e9).abs() < 10.0, "{}", c.hz);
        // 3e9 ticks are one second after time_zero.
        let ns = mul_shift(3_000_000_000, c.mult, c.shift).wrapping_add(1_000_000);
        assert!(ns.abs_diff(1_001_000_000) <= 1, "{ns}");
    }

    #[test]
    fn verdict_explains_an_unusable_tsc() {
        let mut c = TscCheck {
            invariant_cpuid: false,
            constant_nonstop_flags: true,
            clocksource: Some("tsc".into()),
        };
        assert!(c.verdict().is_ok());
        c.clocksource = Some("kvm-clock".into());
        assert!(c.verdict().unwrap_err().contains("kvm-clock"));
        c.constant_nonstop_flags = false;
        assert!(c.verdict().unwrap_err().contains("not invariant"));
    }

    #[test]
    fn monotonic_fallback_ticks_are_nanoseconds() {
        let c = Clock::monotonic("test".into(), TscCheck::detect());
        let a = c.raw();
        let b = c.raw_ordered();
        assert!(b >= a);
        assert_eq!(c.scaled(12_345), 12_345);
        assert_eq!(c.delta_ns(a, b), b - a);
        assert!(!c.is_tsc());
    }
}
