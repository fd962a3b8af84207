//! x86-64 instructions the clocks and counter reads are built on: `rdtsc`,
//! its ordered variants, `cpuid` and `rdpmc`.
//!
//! Each wrapper is one instruction (plus a fence where named). They are
//! written as inline assembly *without* `nomem`, so the compiler treats each
//! as a memory barrier and never moves a load of a perf page across it; the
//! CPU may still execute a plain `rdtsc` early, which is why the ordered
//! variants exist.
//!
//! # Safety
//!
//! `rdtsc`, `rdtscp`, `lfence` and `cpuid` are available on every x86-64 CPU
//! and have no memory effects, so their wrappers are safe. `rdpmc` faults
//! (#GP, delivered as SIGSEGV) unless the kernel enabled it for the calling
//! context, so [`rdpmc`] is an `unsafe fn` whose contract is the kernel's:
//! call it only for an event of the calling thread whose mmap page currently
//! says `cap_user_rdpmc = 1` and `index != 0`.
#![allow(unsafe_code)]

use std::arch::asm;

/// The time stamp counter, unordered: the CPU may execute it before earlier
/// instructions complete. The cheapest read (about 24 TSC cycles on Zen).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc reads a register and has no memory effects; CR4.TSD is
    // clear on Linux (the vDSO itself relies on user-mode rdtsc).
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nostack, preserves_flags)) };
    u64::from(hi) << 32 | u64::from(lo)
}

/// The time stamp counter after all earlier instructions have completed
/// (`lfence; rdtsc`): for the start of a measured region.
#[inline(always)]
pub fn rdtsc_ordered() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: as for `rdtsc`; lfence only orders instruction execution.
    unsafe { asm!("lfence", "rdtsc", out("eax") lo, out("edx") hi, options(nostack, preserves_flags)) };
    u64::from(hi) << 32 | u64::from(lo)
}

/// `rdtscp`: the TSC once all earlier instructions have executed, and
/// `TSC_AUX` (Linux stores the CPU number in its low 12 bits and the node above).
#[inline(always)]
pub fn rdtscp() -> (u64, u32) {
    let (lo, hi, aux): (u32, u32, u32);
    // SAFETY: rdtscp reads registers only; every x86-64 CPU Linux runs papirus
    // on has it (the "rdtscp" cpu flag), and the kernel sets TSC_AUX.
    unsafe {
        asm!("rdtscp", out("eax") lo, out("edx") hi, out("ecx") aux, options(nostack, preserves_flags))
    };
    (u64::from(hi) << 32 | u64::from(lo), aux)
}

/// `lfence`: later instructions do not start before earlier ones complete.
#[inline(always)]
pub fn lfence() {
    // SAFETY: a fence has no architectural effect besides ordering.
    unsafe { asm!("lfence", options(nostack, preserves_flags)) };
}

/// `a × b / c` exactly (the 128-bit product divided by `c`), saturating at
/// `u64::MAX`; 0 when `c` is 0. One `mul` and one `div`: the estimator runs
/// in the probe runtime's hooks, where a call to the compiler's 128-bit
/// division routine would go through the GOT.
#[inline(always)]
pub fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    if c == 0 {
        return 0;
    }
    let p = u128::from(a) * u128::from(b);
    let (hi, lo) = ((p >> 64) as u64, p as u64);
    if hi >= c {
        // The quotient does not fit 64 bits (and `div` would fault).
        return u64::MAX;
    }
    let q: u64;
    // SAFETY: `div` divides rdx:rax by a non-zero divisor larger than rdx,
    // so the quotient fits rax and the instruction cannot fault; it touches
    // registers only.
    unsafe {
        asm!("div {c}", c = in(reg) c, inout("rax") lo => q, inout("rdx") hi => _, options(pure, nomem, nostack));
    }
    q
}

/// The four registers one `cpuid` leaf returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpuid {
    /// EAX
    pub eax: u32,
    /// EBX
    pub ebx: u32,
    /// ECX
    pub ecx: u32,
    /// EDX
    pub edx: u32,
}

/// `cpuid` of `leaf`/`subleaf`. Leaves above the CPU's maximum return
/// whatever the CPU returns for them (check the maximum leaf first).
pub fn cpuid(leaf: u32, subleaf: u32) -> Cpuid {
    // A safe fn on recent compilers, unsafe on older ones within the MSRV.
    #[allow(unused_unsafe)]
    // SAFETY: cpuid exists on every x86-64 CPU and only writes registers.
    let r = unsafe { std::arch::x86_64::__cpuid_count(leaf, subleaf) };
    Cpuid { eax: r.eax, ebx: r.ebx, ecx: r.ecx, edx: r.edx }
}

/// Reads performance counter `counter` (the mmap page's `index - 1`).
///
/// # Safety
///
/// Faults unless user-mode rdpmc is enabled for this context: the caller
/// must hold the mmap page of an event of the *calling thread* that says
/// `cap_user_rdpmc = 1` and `index = counter + 1`, read within the page's
/// seqlock so a concurrent reschedule is detected.
#[inline(always)]
pub unsafe fn rdpmc(counter: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller guarantees rdpmc is permitted for `counter` (see above).
    unsafe {
        asm!("rdpmc", in("ecx") counter, out("eax") lo, out("edx") hi, options(nostack, preserves_flags))
    };
    u64::from(hi) << 32 | u64::from(lo)
}

/// What `cpuid` says about the CPU's identity and TSC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuIdentity {
    /// The 12-byte vendor string (`AuthenticAMD`, `GenuineIntel`).
    pub vendor: String,
    /// Display family (base + extended when base is 0xF).
    pub family: u32,
    /// Display model (extended model prepended for family 6 and ≥ 0xF).
    pub model: u32,
    /// Stepping.
    pub stepping: u32,
    /// The highest standard leaf.
    pub max_leaf: u32,
    /// The highest extended leaf (0x8000_00xx).
    pub max_ext_leaf: u32,
    /// Invariant TSC (CPUID 0x8000_0007 EDX bit 8): constant rate and
    /// running in deep C-states, what Linux reports as constant_tsc + nonstop_tsc.
    pub invariant_tsc: bool,
    /// CPUID 1 ECX bit 31: running under a hypervisor.
    pub hypervisor: bool,
    /// The hypervisor's signature from leaf 0x4000_0000 (`KVMKVMKVM`, `VMwareVMware`, `Microsoft Hv`…).
    pub hypervisor_signature: Option<String>,
    /// The highest hypervisor leaf.
    pub hypervisor_max_leaf: u32,
}

fn regs_string(words: &[u32]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    String::from_utf8_lossy(&bytes).trim_end_matches('\0').trim().to_string()
}

/// Reads the CPU's identity with `cpuid`.
pub fn identity() -> CpuIdentity {
    let l0 = cpuid(0, 0);
    let vendor = regs_string(&[l0.ebx, l0.edx, l0.ecx]);
    let l1 = if l0.eax >= 1 { cpuid(1, 0) } else { Cpuid::default() };
    let base_family = (l1.eax >> 8) & 0xF;
    let base_model = (l1.eax >> 4) & 0xF;
    let family = if base_family == 0xF { base_family + ((l1.eax >> 20) & 0xFF) } else { base_family };
    let model = if base_family == 0x6 || base_family == 0xF {
        base_model | ((l1.eax >> 16) & 0xF) << 4
    } else {
        base_model
    };
    let max_ext_leaf = cpuid(0x8000_0000, 0).eax;
    let invariant_tsc = max_ext_leaf >= 0x8000_0007 && cpuid(0x8000_0007, 0).edx & (1 << 8) != 0;
    let hypervisor = l1.ecx & (1 << 31) != 0;
    let (hypervisor_signature, hypervisor_max_leaf) = if hypervisor {
        let h = cpuid(0x4000_0000, 0);
        (Some(regs_string(&[h.ebx, h.ecx, h.edx])), h.eax)
    } else {
        (None, 0)
    };
    CpuIdentity {
        vendor,
        family,
        model,
        stepping: l1.eax & 0xF,
        max_leaf: l0.eax,
        max_ext_leaf,
        invariant_tsc,
        hypervisor,
        hypervisor_signature,
        hypervisor_max_leaf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_reads_do_not_go_backwards_on_one_thread() {
        let mut last = rdtsc();
        for _ in 0..10_000 {
            let a = rdtsc_ordered();
            let (b, _) = rdtscp();
            assert!(a >= last && b >= a, "TSC went backwards: {last} {a} {b}");
            last = b;
        }
    }

    #[test]
    fn mul_div_is_exact_and_saturates() {
        assert_eq!(mul_div(1000, 400, 100), 4000);
        assert_eq!(mul_div(1 << 62, 1 << 62, 1 << 61), 1 << 63);
        assert_eq!(mul_div(u64::MAX, u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(mul_div(u64::MAX, 3, 2), u64::MAX, "quotient beyond 64 bits");
        assert_eq!(mul_div(7, 3, 0), 0);
        assert_eq!(mul_div(u64::MAX - 1, u64::MAX, u64::MAX), u64::MAX - 1);
    }

    #[test]
    fn vendor_string_is_twelve_printable_bytes() {
        let id = identity();
        assert_eq!(id.vendor.len(), 12, "{id:?}");
        assert!(id.vendor.chars().all(|c| c.is_ascii_graphic()), "{id:?}");
        assert!(id.max_leaf >= 1);
    }
}
