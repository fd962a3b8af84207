//! Every PC a stopped thread will execute from: its own, the restart point of
//! the system call it is in, and the saved PC of every signal frame it is
//! inside (on its stack or on a `sigaltstack`). Code at any of these addresses
//! must not change under the thread.
//!
//! Signal frames are found as the kernel builds them on x86-64
//! (`__setup_rt_frame`): the handler's return address (`sa_restorer`) at the
//! frame, the `ucontext` 8 bytes above it, the saved registers in its
//! `uc_mcontext`. A word of the stack is taken as a frame when it points at
//! glibc's restorer (`mov $15,%rax; syscall`, the bytes libunwind and gdb also
//! recognise) and the context above it is plausible (user code segment, saved
//! rsp above the frame, saved rip in executable memory, and its signal blocked
//! in the thread now, as it is while its handler runs). That last test tells a
//! live frame from a stale copy left higher on the stack by an earlier signal;
//! a handler installed with `SA_NODEFER` leaves its signal unblocked and is
//! missed. A false positive only makes the patcher defer a function. Handlers
//! installed with another restorer (not glibc's) are not recognised.

use std::collections::HashMap;

use super::Process;
use crate::error::{Error, Result};
use papirus_substrate::maps::{self, Mapping};

/// glibc's `__restore_rt`: `mov $15,%rax; syscall`.
const RESTORER: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
/// Offsets in the frame, from the restorer slot: the ucontext, then in it the
/// saved rsp, rip and the cs/gs/fs/ss word (`uc_mcontext` at uc+40).
const UC: u64 = 8;
const SAVED_RSP: u64 = UC + 160;
const SAVED_RIP: u64 = UC + 168;
const SAVED_CS: u64 = UC + 184;
/// The frame's `siginfo` follows the kernel's 304-byte `ucontext`; `si_signo` opens it.
const SIGNO: u64 = UC + 304;
/// The 64-bit user code segment selector.
const USER_CS: u64 = 0x33;
/// Kernel return codes that make a syscall restart at `rip - 2` when the
/// thread resumes without a handler running (ERESTARTSYS, ERESTARTNOINTR,
/// ERESTARTNOHAND, ERESTART_RESTARTBLOCK).
const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];
/// Bounds: stack bytes read per mapping, and stacks followed through frames.
const MAX_SCAN: u64 = 16 << 20;
const MAX_HOPS: usize = 16;

impl Process {
    /// Every address thread `tid` will resume at (see the module documentation):
    /// its rip, `rip - 2` when it is in a syscall that will restart, and the
    /// saved rip of each signal frame it is inside. The first is always its rip.
    pub fn resume_pcs(&self, tid: i32) -> Result<Vec<u64>> {
        let r = self.regs(tid)?;
        let mut pcs = vec![r.rip];
        if (r.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(r.rax as i64)) {
            pcs.push(r.rip.wrapping_sub(2));
        }
        // No handler, no signal frame.
        let caught = super::status_field(self.pid, "SigCgt").and_then(|c| u64::from_str_radix(&c, 16).ok());
        if caught == Some(0) {
            return Ok(pcs);
        }
        let mappings = maps::read(self.pid)
            .map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })?;
        let mut restorers = HashMap::new();
        let blocked = self.blocked_signals(tid);
        let mut sp = r.rsp;
        for _ in 0..MAX_HOPS {
            let Some(m) = mapping_of(&mappings, sp).filter(|m| m.perms.write) else { break };
            let Some(next) = self.scan(m, sp, &mappings, &mut restorers, blocked, &mut pcs) else { break };
            sp = next;
        }
        Ok(pcs)
    }

    /// Scans `[sp, end of m)` for signal frames, adding their saved rips; returns
    /// the saved rsp of a frame that leads to another mapping (an alternate
    /// signal stack's frame returning to the thread's stack), to scan next.
    fn scan(
        &self,
        m: &Mapping,
        sp: u64,
        mappings: &[Mapping],
        restorers: &mut HashMap<u64, bool>,
        blocked: Option<u64>,
        pcs: &mut Vec<u64>,
    ) -> Option<u64> {
        let start = sp.next_multiple_of(8);
        let end = m.end.min(start.saturating_add(MAX_SCAN));
        let stack = self.read_vec(start, end.checked_sub(start)? as usize).ok()?;
        let word = |at: u64| -> Option<u64> {
            let i = at.checked_sub(start)? as usize;
            Some(u64::from_le_bytes(stack.get(i..i + 8)?.try_into().ok()?))
        };
        let exec = |a: u64| mapping_of(mappings, a).is_some_and(|m| m.perms.exec);
        for i in (0..stack.len().saturating_sub(8)).step_by(8) {
            let at = start + i as u64;
            let Some(v) = word(at) else { continue };
            if !exec(v) {
                continue;
            }
            let is_restorer = *restorers.entry(v).or_insert_with(|| {
                let mut b = [0u8; RESTORER.len()];
                self.read_memory(v, &mut b).is_ok() && b == RESTORER
            });
            if !is_restorer {
                continue;
            }
            // Fields past the end of this mapping cannot be a frame.
            let (Some(rsp), Some(rip), Some(cs)) =
                (word(at + SAVED_RSP), word(at + SAVED_RIP), word(at + SAVED_CS))
            else {
                continue;
            };
            if cs & 0xffff != USER_CS || rsp <= at || !exec(rip) {
                continue;
            }
            let signo = word(at + SIGNO).map_or(0, |w| w & 0xffff_ffff);
            let live = match blocked {
                Some(mask) if (1..=64).contains(&signo) => mask & (1 << (signo - 1)) != 0,
                // Mask or signal unknown: count the frame (deferring is safe).
                _ => true,
            };
            if !live {
                continue;
            }
            pcs.push(rip);
            if !(m.start..m.end).contains(&rsp) {
                return Some(rsp);
            }
        }
        None
    }
}

impl Process {
    /// Thread `tid`'s blocked signals (`SigBlk` of its status), bit N-1 for signal N.
    fn blocked_signals(&self, tid: i32) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", self.pid)).ok()?;
        let hex = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
        u64::from_str_radix(hex.trim(), 16).ok()
    }
}

fn mapping_of(mappings: &[Mapping], addr: u64) -> Option<&Mapping> {
    mappings.iter().find(|m| (m.start..m.end).contains(&addr))
}
