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
//! such a thread stays, every arena stays. So do they while a thread waits
//! in `vfork`: its child runs in the same memory, outside papirus' hold.
//!
//! What stays is written into a record in the runtime library (which stays
//! loaded), so the next detach finds those pages, checks they are still
//! the bytes papirus left there, and releases them too when nothing can
//! return into them any more: stale words do not pile pages up across
//! attaches.

use std::collections::BTreeSet;
use std::time::Duration;

use super::ProbeError;
use crate::patch::Arena;
use crate::patch::arena::TRAMPOLINE_MAX;
use crate::process::Process;
use papirus_probe_abi::KEPT_RANGES;

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

/// Unmaps the arenas of a stopped process as [`release`] does, together
/// with the pages an earlier detach left mapped (found in the runtime's
/// record and checked to be the same bytes in the same anonymous
/// executable mapping), and records what stays for the next detach.
/// Returns what stays and the bytes unmapped.
pub(super) fn release_recorded(p: &mut Process, arenas: &[Arena]) -> Result<(Kept, u64), ProbeError> {
    let module = super::RUNTIME_FILE.trim_end_matches(".so");
    // A runtime without the record (an older build still loaded) keeps nothing across attaches.
    let record = match p.module_function(module, "papirus_probe_kept") {
        Ok(f) => Some(p.call(f, &[])?).filter(|&a| a != 0),
        Err(_) => None,
    };
    let mut all = arenas.to_vec();
    if let Some(at) = record {
        all.extend(recorded(p, at)?);
    }
    let mut kept = release(p, &all)?;
    if let Some(at) = record {
        let mut words = vec![0u64; 3 * KEPT_RANGES];
        for (i, &(start, end)) in kept.ranges.iter().take(KEPT_RANGES).enumerate() {
            words[3 * i..3 * i + 3].copy_from_slice(&[
                start,
                end,
                fnv(&p.read_vec(start, (end - start) as usize)?),
            ]);
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        p.write_memory(at, &bytes)?;
    }
    if !kept.ranges.is_empty() {
        kept.reason.push_str(if record.is_none() || kept.ranges.len() > KEPT_RANGES {
            " (not all recorded for the next attach to check again: those stay for the process' lifetime)"
        } else {
            " (the next attach checks them again)"
        });
    }
    let released = all.iter().map(|a| a.len).sum::<u64>() - kept.bytes();
    Ok((kept, released))
}

/// The ranges of the runtime's record at `at` that are still what the
/// record says: wholly inside one anonymous executable, non-writable
/// mapping, with the recorded bytes.
fn recorded(p: &Process, at: u64) -> Result<Vec<Arena>, ProbeError> {
    let words: Vec<u64> = p
        .read_vec(at, 3 * KEPT_RANGES * 8)?
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        .collect();
    let maps = papirus_substrate::maps::read(p.pid()).map_err(|source| ProbeError::Io {
        op: "read",
        path: format!("/proc/{}/maps", p.pid()).into(),
        source,
    })?;
    let mut out = Vec::new();
    for r in words.chunks_exact(3) {
        let (start, end, hash) = (r[0], r[1], r[2]);
        if start == 0 || end <= start || start % PAGE != 0 || end % PAGE != 0 || end - start > 1 << 30 {
            continue;
        }
        let ours = maps.iter().any(|m| {
            m.start <= start
                && end <= m.end
                && m.perms.exec
                && !m.perms.write
                && m.inode == 0
                && m.name.is_empty()
        });
        if ours && p.read_vec(start, (end - start) as usize).is_ok_and(|b| fnv(&b) == hash) {
            out.push(Arena { base: start, len: end - start, used: 0 });
        }
    }
    Ok(out)
}

/// Whether the thread with registers `r` is in a `vfork` (or a `clone`
/// with `CLONE_VFORK`, as `posix_spawn` makes): the child shares the
/// address space and runs until it calls execve or exits.
fn in_vfork(p: &Process, r: &crate::process::Regs) -> bool {
    let vfork = libc::CLONE_VFORK as u64;
    match r.orig_rax as i64 {
        libc::SYS_vfork => true,
        libc::SYS_clone => r.rdi & vfork != 0,
        // clone3: the flags open its `struct clone_args`.
        libc::SYS_clone3 => p.read_u64(r.rdi).map_or(true, |flags| flags & vfork != 0),
        _ => false,
    }
}

/// FNV-1a, 64 bits.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Unmaps the arenas of a stopped process whose patches are all restored
/// and whose hijacked returns are all put back, keeping the pages a thread
/// may still return into (see the module documentation).
fn release(p: &mut Process, arenas: &[Arena]) -> Result<Kept, ProbeError> {
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
                    reason: format!("{doubt}; the trampoline pages stay"),
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
        kept.reason =
            "a thread's resume PC or a word of its stack points into them (a frame may still return there)"
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
    let maps = papirus_substrate::maps::read(p.pid()).map_err(|source| ProbeError::Io {
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
        if in_vfork(p, &r) {
            return Ok(Err(
                "a thread waits in vfork: its child runs in the same memory, on frames not scanned",
            ));
        }
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
