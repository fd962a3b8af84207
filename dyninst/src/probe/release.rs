//! Giving back the trampoline arenas at detach.
//!
//! Once every patch is restored and every hijacked return address put back,
//! no code jumps into a trampoline any more. A thread can still come back
//! into one only through an address it holds: its resume PCs (its rip, a
//! restarting syscall, the saved rip of each signal frame it is inside) or a
//! return address on its stack. The trampolines themselves push one while
//! their hook runs; a displaced `call` pushes the original code's address and
//! a function that calls cannot be moved whole, so no other return address
//! points into an arena, but the stacks are checked rather than trusted.
//!
//! With every thread stopped, each thread's stack is read from its rsp to
//! the top of that mapping and every aligned word is compared with the
//! arenas (a word that merely looks like such an address, a stale local, is
//! counted too: keeping a page is always safe). The pages such a word or PC
//! points into (and the next, for the rest of the trampoline) stay mapped;
//! the rest of every arena is unmapped. A thread inside a signal handler may
//! have frames on another stack (a `sigaltstack`) that this scan does not
//! reach: the target runs a moment and the check is tried again, and when
//! such a thread stays, every arena stays.

use std::collections::BTreeSet;
use std::time::Duration;

use super::ProbeError;
use crate::patch::Arena;
use crate::patch::arena::TRAMPOLINE_MAX;
use crate::process::Process;

const PAGE: u64 = 4096;
/// Rounds of letting the target run while a thread is inside a signal handler.
const ROUNDS: usize = 50;
/// Stack bytes read per thread, at most.
const MAX_STACK: u64 = 16 << 20;
/// Kernel return codes that make a syscall restart at `rip - 2`.
const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];

/// What stays of the arenas after [`release`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// Page-aligned ranges left mapped.
    pub ranges: Vec<(u64, u64)>,
    /// Why they stay (empty when nothing stays).
    pub reason: String,
}

impl Kept {
    /// Bytes left mapped.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }
}

/// Unmaps the arenas of a stopped process whose patches are all restored
/// and whose hijacked returns are all put back, keeping the pages a thread
/// may still return into (see the module documentation).
pub(super) fn release(p: &mut Process, arenas: &[Arena]) -> Result<Kept, ProbeError> {
    if arenas.is_empty() {
        return Ok(Kept::default());
    }
    let mut round = 0;
    let pages = loop {
        match live_pages(p, arenas)? {
            Ok(pages) => break pages,
            Err(_) if round < ROUNDS => {
                round += 1;
                p.run_for(Duration::from_millis(1))?;
            }
            Err(doubt) => {
                return Ok(Kept {
                    ranges: arenas.iter().map(|a| (a.base, a.base + a.len)).collect(),
                    reason: format!("{doubt}; the trampoline pages stay for the process' lifetime"),
                });
            }
        }
    };
    let mut kept = Kept::default();
    for a in arenas {
        // Runs of pages to unmap and to keep, in address order.
        let mut at = a.base;
        while at < a.base + a.len {
            let keep = pages.contains(&at);
            let mut end = at + PAGE;
            while end < a.base + a.len && pages.contains(&end) == keep {
                end += PAGE;
            }
            if keep {
                kept.ranges.push((at, end));
            } else {
                p.munmap(at, end - at)?;
            }
            at = end;
        }
    }
    if !kept.ranges.is_empty() {
        kept.reason = "a thread's resume PC or a word of its stack points into them (a frame may still \
                       return there); they stay for the process' lifetime"
            .into();
    }
    Ok(kept)
}

/// Why the pages a thread may still execute cannot be told now.
type Doubt = &'static str;

/// The arena pages some thread may still execute, or why that cannot be
/// told now (a thread inside a signal handler, whose interrupted frames may
/// lie on another stack; a stack not read whole).
fn live_pages(p: &Process, arenas: &[Arena]) -> Result<Result<BTreeSet<u64>, Doubt>, ProbeError> {
    let maps = crate::maps::read(p.pid()).map_err(|source| ProbeError::Io {
        op: "read",
        path: format!("/proc/{}/maps", p.pid()).into(),
        source,
    })?;
    let inside = |v: u64| arenas.iter().any(|a| (a.base..a.base + a.len).contains(&v));
    let mut pages = BTreeSet::new();
    // The page of `v` and those the rest of its trampoline may reach into.
    let mut mark = |v: u64| {
        let arena_end =
            arenas.iter().find(|a| (a.base..a.base + a.len).contains(&v)).map_or(v, |a| a.base + a.len);
        let last = (v + TRAMPOLINE_MAX).min(arena_end - 1);
        let mut page = v & !(PAGE - 1);
        while page <= last {
            pages.insert(page);
            page += PAGE;
        }
    };
    for tid in p.threads() {
        let r = p.regs(tid)?;
        let pcs = p.resume_pcs(tid)?;
        let restarts = (r.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(r.rax as i64));
        if pcs.len() > 1 + usize::from(restarts) {
            return Ok(Err(
                "a thread stayed inside a signal handler, whose interrupted frames may be on a stack \
                           not scanned",
            ));
        }
        for pc in pcs.into_iter().filter(|&pc| inside(pc)) {
            mark(pc);
        }
        // The stack from rsp up: every live frame of the thread.
        let Some(m) = maps.iter().find(|m| (m.start..m.end).contains(&r.rsp)) else {
            return Ok(Err("a thread's stack pointer lies in no mapping"));
        };
        let start = r.rsp & !7;
        let end = m.end.min(start.saturating_add(MAX_STACK));
        let stack = p.read_vec(start, (end - start) as usize)?;
        for w in stack.chunks_exact(8) {
            let v = u64::from_le_bytes(w.try_into().unwrap_or_default());
            if inside(v) {
                mark(v);
            }
        }
        if end < m.end {
            return Ok(Err("a thread's stack is deeper than papirus reads"));
        }
    }
    Ok(Ok(pages))
}
