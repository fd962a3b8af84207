//! The hooks papirus' trampolines call, and the shared exit stub.
//!
//! Entry trampolines call [`papirus_probe_enter`] with the function's id and
//! the address of its return-address slot. The hook pushes the activation on
//! the thread's shadow stack and replaces the return address with the exit
//! stub's, so every way of returning (each `ret`, a tail call's `ret`) lands in
//! the stub, which asks the exit hook for the real return address.
//!
//! Non-local exits: an activation whose slot lies below the current frame
//! (longjmp, an exception) is closed as *unwound* at the next hook. For C++
//! exceptions the unwinder must see real return addresses, so the patcher also
//! hooks the unwinder's entry points with [`papirus_probe_unwind_begin`]
//! (puts every real return address back) and `__cxa_begin_catch` with
//! [`papirus_probe_catch`] (closes the frames the exception left and hijacks
//! the surviving ones again).
//!
//! None of this code uses vector or x87 registers or calls libc, the
//! counters probe's reads included: the trampolines save only general
//! registers and flags (papirus' test suite disassembles these hooks to
//! check it). A thread's registration is the one exception, and saves the
//! whole extended state itself ([`crate::counters`]).
//!
//! # Safety
//!
//! The hooks dereference the return slot they are given: trampolines pass the
//! slot of the call that entered the function, which is valid, writable stack.
//! Other slots written back are those of activations still live on this
//! thread's stack (the ones below the current frame are discarded first).
#![allow(unsafe_code)]

use core::arch::global_asm;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::state::{self, Word};
use crate::sys;

/// Whether activations are timed (wallclock and counters probes) or only counted (empty probe).
pub(crate) static TIMED: AtomicBool = AtomicBool::new(true);
/// Whether the counters probe reads counters too.
pub(crate) static COUNTERS: AtomicBool = AtomicBool::new(false);

/// Adds the counts since the thread's last read to its `cnow` when the
/// counters probe is on and this thread has counters; `now` is the TSC the
/// hook just read. Returns how many events there are.
#[inline(always)]
fn read_counters(t: &state::Thread, now: u64) -> usize {
    if !COUNTERS.load(Ordering::Relaxed) {
        return 0;
    }
    let n = t.nevents.get();
    if n > 0 {
        crate::counters::read(t, now);
    }
    n as usize
}

/// A timestamp when the probe takes them, else 0.
#[inline(always)]
pub(crate) fn now() -> u64 {
    if TIMED.load(Ordering::Relaxed) { sys::rdtsc() } else { 0 }
}

global_asm!(
    ".pushsection .text.papirus_probe_exit_stub,\"ax\",@progbits",
    ".globl papirus_probe_exit_stub",
    ".hidden papirus_probe_exit_stub",
    ".type papirus_probe_exit_stub,@function",
    ".p2align 4",
    "papirus_probe_exit_stub:",
    // A return site: everything below rsp is dead, flags are dead and DF is
    // clear. The exit hook is integer code: the stack need not be realigned.
    "lea rsp, [rsp - 8]",
    "push rax", "push rdx", "push rcx", "push rsi", "push rdi",
    "push r8", "push r9", "push r10", "push r11",
    "lea rdi, [rsp + 80]",
    "call {exit}",
    "mov qword ptr [rsp + 72], rax",
    "pop r11", "pop r10", "pop r9", "pop r8",
    "pop rdi", "pop rsi", "pop rcx", "pop rdx", "pop rax",
    // Not `ret`: the function's own `ret` already consumed its caller's
    // return-predictor entry, so a second `ret` would mispredict here and
    // leave the predictor one entry short for every return above. The slot
    // now lies below rsp, in the red zone no signal frame overwrites.
    "lea rsp, [rsp + 8]",
    "jmp qword ptr [rsp - 8]",
    ".size papirus_probe_exit_stub, . - papirus_probe_exit_stub",
    ".popsection",
    exit = sym exit_hook,
);

/// Address of the exit stub that hijacked returns land in.
#[inline(always)]
pub fn exit_stub() -> u64 {
    let a: u64;
    // SAFETY: only computes the address of the hidden stub defined above, RIP
    // relative (a plain function pointer would cost a load through the GOT).
    unsafe {
        core::arch::asm!(
            "lea {a}, [rip + papirus_probe_exit_stub]",
            a = out(reg) a,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    a
}

/// Entry hook: records an activation of function `fid` and hijacks its return.
///
/// # Safety
///
/// `slot` must be the return-address slot of the call that entered the
/// function (the trampoline's contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_enter(fid: u32, slot: *mut u64) {
    let Some(t) = state::current() else { return };
    let Some(g) = t.enter() else { return };
    let now = now();
    let nev = read_counters(t, now);
    // SAFETY: `slot` is the live return slot (function contract).
    let ret = unsafe { slot.read() };
    let d = g.reap_below(slot as u64, ret != exit_stub(), now, nev);
    if g.push(d, fid, slot as u64, ret, now, nev) {
        // SAFETY: as above.
        unsafe { slot.write(exit_stub()) };
    }
}

/// Exit hook, called by the exit stub with the stack pointer after the
/// function's `ret`; closes the activation and returns the real return address.
unsafe extern "C" fn exit_hook(rsp_after_ret: u64) -> u64 {
    let Some(t) = state::current() else {
        sys::die(b"papirus-probe-runtime: exit stub reached on a thread without tables\n")
    };
    // A hook interrupted by a signal never hijacks the handler's returns, so
    // a return through the stub always finds the tables free.
    let Some(g) = t.enter() else { sys::die(b"papirus-probe-runtime: exit stub reached inside a hook\n") };
    let now = now();
    let nev = read_counters(t, now);
    let Some(ret) = g.close_at(rsp_after_ret - 8, now, nev) else {
        sys::die(b"papirus-probe-runtime: exit stub reached with an empty shadow stack\n")
    };
    ret
}

/// The unwinder hooks' common start: takes the thread's tables and closes
/// the activations below `slot` (those the exception already left).
fn closing_below(slot: *mut u64) -> Option<state::Guard> {
    let t = state::current()?;
    let g = t.enter()?;
    let now = now();
    let nev = read_counters(t, now);
    g.reap_below(slot as u64, false, now, nev);
    Some(g)
}

/// Unwinder entry hook (`_Unwind_RaiseException`, `_Unwind_Resume`, …): puts
/// every live hijacked return address back so the unwinder sees the real callers.
///
/// # Safety
///
/// `slot` must be the return slot of the call into the unwinder.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_unwind_begin(_arg: u32, slot: *mut u64) {
    let Some(g) = closing_below(slot) else { return };
    let stub = exit_stub();
    // Innermost first: activations sharing a slot (tail calls) chain through
    // the stub, and the outermost of them holds the real caller.
    for i in (0..g.depth()).rev() {
        let (s, ret) = g.frame(i);
        let p = s as *mut u64;
        // SAFETY: slots at or above the current frame belong to live activations.
        unsafe {
            if p.read() == stub {
                p.write(ret);
            }
        }
    }
}

/// `__cxa_begin_catch` hook: closes the activations the exception unwound
/// and hijacks the returns of the surviving ones again.
///
/// # Safety
///
/// `slot` must be the return slot of the call to `__cxa_begin_catch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn papirus_probe_catch(_arg: u32, slot: *mut u64) {
    let Some(g) = closing_below(slot) else { return };
    let stub = exit_stub();
    for i in 0..g.depth() {
        let (s, ret) = g.frame(i);
        let p = s as *mut u64;
        // SAFETY: slots above the catching frame belong to live activations.
        unsafe {
            if p.read() == ret {
                p.write(stub);
            }
        }
    }
}
