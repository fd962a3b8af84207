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
//! The arenas are mapped from a memfd named [`ARENA_NAME`], so the next
//! detach finds the pages that stay by their name in `/proc/PID/maps` and
//! releases them too when nothing can return into them any more: stale
//! words do not pile pages up across attaches.
//!
//! Last, papirus gives back its reference to the runtime library
//! ([`unload_runtime`]), which the loader then unmaps.

use std::collections::BTreeSet;
use std::time::Duration;

use super::ProbeError;
use crate::patch::Arena;
use crate::patch::arena::{ARENA_NAME, TRAMPOLINE_MAX};
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

/// Unmaps the arenas of a stopped process as [`release`] does, together
/// with the pages an earlier detach left mapped (found by their memfd's
/// name, [`ARENA_NAME`], in a private executable mapping). Returns what
/// stays and the bytes unmapped.
pub(super) fn release_recorded(p: &mut Process, arenas: &[Arena]) -> Result<(Kept, u64), ProbeError> {
    let mut all = arenas.to_vec();
    for a in left_earlier(p)? {
        if !all.iter().any(|b| b.base < a.base + a.len && a.base < b.base + b.len) {
            all.push(a);
        }
    }
    let mut kept = release(p, &all)?;
    if !kept.ranges.is_empty() {
        kept.reason.push_str(" (the next detach looks at them again)");
    }
    let released = all.iter().map(|a| a.len).sum::<u64>() - kept.bytes();
    Ok((kept, released))
}

/// Trampoline pages an earlier detach left mapped: the private,
/// executable, read-only mappings of papirus' arena memfd.
fn left_earlier(p: &Process) -> Result<Vec<Arena>, ProbeError> {
    let maps = papirus_substrate::maps::read(p.pid()).map_err(|source| ProbeError::Io {
        op: "read",
        path: format!("/proc/{}/maps", p.pid()).into(),
        source,
    })?;
    let name = format!("/memfd:{ARENA_NAME} (deleted)");
    Ok(maps
        .iter()
        .filter(|m| m.name == name && m.perms.exec && !m.perms.write && m.perms.private)
        .map(|m| Arena { base: m.start, len: m.end - m.start, used: 0 })
        .collect())
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

/// Rounds of letting the target run before the runtime is given back.
const UNLOAD_ROUNDS: usize = 50;

/// The runtime library's file mappings in process `pid`.
fn runtime_maps(pid: i32) -> Result<Vec<papirus_substrate::maps::Mapping>, ProbeError> {
    let module = super::RUNTIME_FILE.trim_end_matches(".so");
    let maps = papirus_substrate::maps::read(pid).map_err(|source| ProbeError::Io {
        op: "read",
        path: format!("/proc/{pid}/maps").into(),
        source,
    })?;
    Ok(maps
        .into_iter()
        .filter(|m| m.inode != 0 && m.name.rsplit('/').next().is_some_and(|b| b.starts_with(module)))
        .collect())
}

/// The target's mapping of the runtime library (its first), if it has one loaded.
pub(super) fn runtime_mapping(pid: i32) -> Option<papirus_substrate::maps::Mapping> {
    runtime_maps(pid).ok()?.into_iter().next()
}

/// Gives back papirus' reference to the runtime library once the session
/// has ended (its thread-exit key deleted, its segment unmapped), so the
/// loader unloads it: nothing of it stays in the target. Returns why it
/// stays when it does.
///
/// A thread ending just then may already have read the deleted key's
/// destructor inside libc and be about to call it, in the runtime: so the
/// target first runs until every thread that was in user space has moved
/// on (its rip changed, or it entered a system call) and none will resume
/// in the runtime's code (its PC or a signal frame's).
pub(super) fn unload_runtime(
    p: &mut Process,
    library: &crate::process::Library,
) -> Result<Option<String>, ProbeError> {
    let mut still: std::collections::BTreeMap<i32, u64> = std::collections::BTreeMap::new();
    for tid in p.threads() {
        let r = p.regs(tid)?;
        if r.orig_rax as i64 == -1 {
            still.insert(tid, r.rip);
        }
    }
    let mut clear = false;
    for _ in 0..UNLOAD_ROUNDS {
        p.run_for(Duration::from_millis(1))?;
        let code: Vec<(u64, u64)> =
            runtime_maps(p.pid())?.iter().filter(|m| m.perms.exec).map(|m| (m.start, m.end)).collect();
        let mut busy = false;
        for tid in p.threads() {
            let r = p.regs(tid)?;
            if still.get(&tid).is_some_and(|&rip| rip == r.rip && r.orig_rax as i64 == -1) {
                busy = true;
            } else {
                still.remove(&tid);
            }
            busy |= p.resume_pcs(tid)?.iter().any(|pc| code.iter().any(|&(s, e)| (s..e).contains(pc)));
        }
        if !busy {
            clear = true;
            break;
        }
    }
    if !clear {
        return Ok(Some(
            "a thread kept running inside it or did not move past the point it was stopped at".into(),
        ));
    }
    let file = |maps: Vec<papirus_substrate::maps::Mapping>| maps.first().map(|m| (m.dev, m.inode));
    let before = file(runtime_maps(p.pid())?);
    p.unload(library)?;
    let after = file(runtime_maps(p.pid())?);
    Ok((after.is_some() && after == before).then(|| {
        "the loader keeps it (another reference: a preload, or a library that depends on it)".to_string()
    }))
}
