//! Raw machine access for the hot path: this thread's slot in initial-exec
//! TLS, the TSC, and the few system calls the runtime makes, all without libc.
//!
//! # Safety
//!
//! The TLS slot is a 16-byte `.tbss` symbol (the thread's slot address and
//! its session epoch) defined below and addressed with
//! the initial-exec model (`@GOTTPOFF` off `fs`): it exists for every thread
//! from its creation, so reading it can neither fault, allocate nor call
//! `__tls_get_addr` (which could recurse into instrumented code). The system
//! calls are issued with the kernel's register convention and clobber only
//! `rcx`, `r11` and the result register.
#![allow(unsafe_code)]

use core::arch::{asm, global_asm};

global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 4",
    ".globl papirus_probe_tls_slot",
    ".hidden papirus_probe_tls_slot",
    ".type papirus_probe_tls_slot,@object",
    ".size papirus_probe_tls_slot,16",
    "papirus_probe_tls_slot:",
    ".zero 16",
    ".popsection",
);

/// This thread's slot address and the session epoch it belongs to ((0, 0)
/// until the thread's first instrumented call).
#[inline(always)]
pub(crate) fn tls_get() -> (usize, u64) {
    let (v, e): (usize, u64);
    // SAFETY: reads the calling thread's own initial-exec TLS words (see module docs).
    unsafe {
        asm!(
            "mov {o}, qword ptr [rip + papirus_probe_tls_slot@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{o}]",
            "mov {e}, qword ptr fs:[{o} + 8]",
            o = out(reg) _,
            v = out(reg) v,
            e = out(reg) e,
            options(nostack, readonly, preserves_flags),
        );
    }
    (v, e)
}

/// Sets this thread's slot address and epoch.
#[inline(always)]
pub(crate) fn tls_set(value: usize, epoch: u64) {
    // SAFETY: writes the calling thread's own initial-exec TLS words (see module docs).
    unsafe {
        asm!(
            "mov {o}, qword ptr [rip + papirus_probe_tls_slot@GOTTPOFF]",
            "mov qword ptr fs:[{o}], {v}",
            "mov qword ptr fs:[{o} + 8], {e}",
            o = out(reg) _,
            v = in(reg) value,
            e = in(reg) epoch,
            options(nostack, preserves_flags),
        );
    }
}

/// The time-stamp counter, unfenced: the cheapest real-time read there is.
#[inline(always)]
pub(crate) fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc reads a counter into edx:eax and has no other effect.
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

#[inline(always)]
fn syscall6(nr: u64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: every system call the runtime makes here (mmap, munmap of its own
    // mappings, gettid, write, and read into a buffer its caller borrows
    // mutably for the call) is memory-safe for those arguments; the kernel
    // returns -errno.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr as i64 => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

const SYS_READ: u64 = 0;
const SYS_WRITE: u64 = 1;
const SYS_MMAP: u64 = 9;
const SYS_MUNMAP: u64 = 11;
const SYS_GETPID: u64 = 39;
const SYS_GETTID: u64 = 186;

/// Anonymous, zero-filled, private read-write memory; `None` when the kernel refuses.
pub(crate) fn mmap_zeroed(len: usize) -> Option<*mut u8> {
    const PROT_RW: u64 = 0x1 | 0x2;
    const MAP_PRIVATE_ANON: u64 = 0x02 | 0x20;
    let r = syscall6(SYS_MMAP, [0, len as u64, PROT_RW, MAP_PRIVATE_ANON, u64::MAX, 0]);
    (!(-4095..=0).contains(&r)).then_some(r as usize as *mut u8)
}

/// Returns a mapping from [`mmap_zeroed`] to the kernel.
pub(crate) fn munmap(addr: *mut u8, len: usize) {
    syscall6(SYS_MUNMAP, [addr as u64, len as u64, 0, 0, 0, 0]);
}

/// `read(2)` of `fd` into the bytes of `words`: the number of bytes read,
/// or `-errno`. (A perf event descriptor's read neither blocks nor fails
/// part-way.)
#[inline(always)]
pub(crate) fn read(fd: i32, words: &mut [u64]) -> i64 {
    syscall6(SYS_READ, [fd as u64, words.as_mut_ptr() as u64, (words.len() * 8) as u64, 0, 0, 0])
}

/// The calling process' id (no libc: reached from the hooks).
pub(crate) fn getpid() -> u32 {
    syscall6(SYS_GETPID, [0; 6]) as u32
}

/// The calling thread's kernel id.
pub(crate) fn gettid() -> u32 {
    syscall6(SYS_GETTID, [0; 6]) as u32
}

/// Writes `msg` to stderr and stops the process with an invalid-opcode trap:
/// the runtime's last resort when its own invariants break (a return through
/// the exit stub with an empty shadow stack), where returning anywhere would
/// corrupt the program.
#[cold]
#[inline(never)]
#[allow(improper_ctypes_definitions)] // only called from Rust; `extern "C"` makes it nounwind
pub(crate) extern "C" fn die(msg: &'static [u8]) -> ! {
    syscall6(SYS_WRITE, [2, msg.as_ptr() as u64, msg.len() as u64, 0, 0, 0]);
    // SAFETY: ud2 raises SIGILL; nothing after it runs.
    unsafe { asm!("ud2", options(noreturn, nomem, nostack)) }
}
