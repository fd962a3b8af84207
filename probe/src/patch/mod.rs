//! Entry/exit instrumentation by trampolines.
//!
//! Each chosen function's first instructions (after any `endbr64`) are
//! replaced by a `jmp rel32` to a trampoline in an [`arena`] near it. The
//! trampoline saves the general registers and flags, calls a hook of the
//! probe runtime with the function's id and its return-address slot, then
//! runs the displaced instructions (relocated) and jumps back. The runtime's
//! entry hook catches the exit by replacing the return address (see
//! papirus-probe-runtime's `hooks`).
//!
//! How the jump finds room ([`analyze::plan`], [`Tactic`]):
//! - the whole instructions covering the jump's 5 bytes are displaced; a
//!   `ret` or `jmp` among them ends the displaced code, and the bytes after
//!   it, reachable only by a branch, are overwritten (no branch of the
//!   function may land there);
//! - a function shorter than the jump, or one that returns or loops back
//!   into its first bytes, is copied whole into its trampoline, the jump
//!   covering its alignment padding up to the next 16-byte boundary and
//!   never past the next symbol ([`FunctionSpec::limit`]);
//! - a function other code enters a few bytes past its start (glibc's
//!   `__mempcpy_*` jumps to `__memmove_*+3`; found by the module scan of
//!   [`crate::inventory`], handed over as [`Around`]) takes a 2-byte
//!   `jmp rel8` over the instructions before that entry, to a `jmp rel32`
//!   in dead alignment padding within 128 bytes ([`Tactic::Hop`]); the
//!   entry and every byte from it on stay as they are.
//!
//! [`decide`] is the one decision: the patcher applies it to the target's
//! memory and `papirus-probe list --patchable` to the file's bytes, so both
//! refuse the same functions for the same [`Refusal`].
//!
//! Invariants (each has a test in `tests/patcher.rs`, `tests/trampoline.rs`
//! or the unit tests here):
//! - The target computes what it computes uninstrumented. A relocated
//!   instruction keeps every RIP-relative data operand's original absolute
//!   target, whatever it points at (the function's own address, the
//!   displaced bytes); only branches from displaced code to a displaced
//!   instruction go to the copy. An operand that reads or writes the
//!   overwritten bytes is refused, as is a call whose return address would
//!   lie in them. The flags, every general register and the stack are as the
//!   caller left them when the displaced code runs.
//! - No thread executes a partly written patch: the tool patches a process
//!   whose threads are all stopped, refuses (and retries) a function a
//!   stopped thread is inside, and writes every trampoline before any jump.
//! - Nothing returns into bytes that changed under it: a call displaced from
//!   a prologue returns to the original code after the jump, never into it.
//! - A branch into a function lands on an instruction boundary as before:
//!   no entry other code uses lies inside the bytes a jump overwrites, and a
//!   hop's slot is padding no code runs or points at (it follows a `ret`,
//!   `jmp` or `ud2`; no symbol, branch target, RIP-relative operand or
//!   relocation lies in it), re-checked in memory before it is written.
//! - After [`Patcher::remove_all`], every patched byte is the original one;
//!   trampolines stay mapped, since live frames may still run through them.
//!
//! A [`Patcher`] patches a batch of functions at once, with few system calls
//! while the target is stopped (one read per run of nearby functions, one
//! write per arena and per run of nearby jumps), and puts the original bytes
//! back on [`Patcher::remove_all`] or drop.

pub mod analyze;
pub mod arena;
pub mod codegen;
pub mod space;

pub use analyze::{EntryPlan, Refusal, Tactic};
pub use arena::Arena;
pub use space::{AddressSpace, LocalSpace};

/// Errors that stop a whole patch operation (a single function's problem is a [`Refusal`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// Opening a file the patcher needs.
    #[error("open {what}: {source}")]
    Open {
        /// The file.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Reading the target's memory.
    #[error("read target memory at {addr:#x}: {source}")]
    Read {
        /// Address.
        addr: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing the target's code.
    #[error("write target code at {addr:#x}: {source}")]
    Write {
        /// Address.
        addr: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// No free address range within ±2 GiB.
    #[error("no free memory within ±2 GiB of {near:#x} for trampolines")]
    NoRoom {
        /// The address to reach.
        near: u64,
    },
    /// Mapping an arena failed.
    #[error("map trampoline memory near {near:#x}: {source}")]
    Map {
        /// The address to reach.
        near: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// The target's own error (e.g. the process went away, or exec'd).
    #[error("{0}")]
    Target(Box<crate::Error>),
}

/// Unwinder entry points that get the runtime's `papirus_probe_unwind_begin`
/// hook (libgcc_s): each starts walking the stack, which must then hold real
/// return addresses.
pub const UNWIND_BEGIN: [&str; 4] =
    ["_Unwind_RaiseException", "_Unwind_Resume", "_Unwind_Resume_or_Rethrow", "_Unwind_ForcedUnwind"];
/// Where a C++ catch begins (libstdc++): gets the runtime's `papirus_probe_catch` hook.
pub const CATCH_BEGIN: &str = "__cxa_begin_catch";

/// One function to instrument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    /// Name (for refusals and reports).
    pub name: String,
    /// Address of its first byte.
    pub addr: u64,
    /// Size of its body (from the symbol table).
    pub size: u64,
    /// The hook its trampoline calls.
    pub hook: u64,
    /// The hook's first argument (the function id for the entry hook).
    pub arg: u32,
    /// Where the next symbol after `addr` starts (0 when unknown): the jump
    /// may cover the alignment padding below it, never anything at or past it.
    pub limit: u64,
}

/// A patched function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Name.
    pub name: String,
    /// Address of the first byte patched: the jump, or the slot of a
    /// [`Tactic::Hop`] below it.
    pub at: u64,
    /// Bytes the patch replaced (under a hop, from the slot to the entry's
    /// jump, the bytes between them rewritten unchanged).
    pub original: Vec<u8>,
    /// The trampoline.
    pub trampoline: u64,
}

/// A function left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Name.
    pub name: String,
    /// Address.
    pub addr: u64,
    /// Why.
    pub reason: Refusal,
}

/// What one [`Patcher::instrument`] call did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Functions patched.
    pub installed: Vec<Installed>,
    /// Functions refused.
    pub refused: Vec<Refused>,
    /// Arenas this call mapped (as they stand after it): whoever unmaps the
    /// trampolines later needs every one, those left empty included.
    pub arenas: Vec<Arena>,
    /// How long the target was held stopped for this batch (for
    /// [`Patcher::instrument`] alone: the time it took).
    pub window: std::time::Duration,
}

/// The patcher's decision for one function at `addr` whose body is
/// `code[..size]` (`code` may run on past it: see [`analyze::plan`]), with
/// the next symbol at `limit` (0: unknown). `papirus-probe list --patchable`
/// asks the same question of the file's bytes.
pub fn decide(name: &str, code: &[u8], size: u64, addr: u64, limit: u64) -> Result<EntryPlan, Refusal> {
    if name.contains(".cold") {
        return Err(Refusal::NotAnEntry);
    }
    // Bytes at or past the next symbol belong to it: never padding.
    let room = if limit > addr { limit - addr } else { size };
    let code = &code[..code.len().min(room.max(size) as usize)];
    let plan = analyze::plan(code, size as usize, addr)?;
    if limit > plan.at && limit < plan.resume() {
        return Err(Refusal::SymbolInside { offset: limit - addr });
    }
    Ok(plan)
}

/// What the module's code as a whole tells about one function, which its
/// own bytes cannot: found by a scan of the module's file
/// ([`crate::inventory`]), used by [`decide_around`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Around {
    /// The first address past the function's entry that code outside the
    /// function branches to, within its first bytes (0: none).
    pub entry: u64,
    /// Runs (start, end) of dead bytes near it: `nop`/`int3` alignment
    /// padding after code that does not fall through, which no branch of the
    /// module lands in.
    pub dead: Vec<(u64, u64)>,
}

/// Bytes before a function that [`decide_around`] may need (a hop slot's padding run).
pub const NEAR_BEFORE: u64 = 256;

/// [`decide`], knowing [`Around`] the function: an entry other code uses
/// inside the bytes the jump would overwrite (or a loop of the function's
/// own that [`decide`] refuses) is either left alone by the plan or handled
/// by [`Tactic::Hop`], else refused. `near` holds the bytes
/// from `near_at` (at most [`NEAR_BEFORE`] below `addr`) on, the function's
/// included. `papirus-probe list --patchable` and the patcher both decide
/// here.
pub fn decide_around(
    name: &str,
    near: &[u8],
    near_at: u64,
    size: u64,
    addr: u64,
    limit: u64,
    around: &Around,
) -> Result<EntryPlan, Refusal> {
    let Some(code) = addr.checked_sub(near_at).and_then(|o| near.get(o as usize..)) else {
        return Err(Refusal::Undecodable { offset: 0 });
    };
    let plan = decide(name, code, size, addr, limit);
    // The first entry past `at`: another function's, or the function's own
    // loop back into the bytes neither a prologue nor a whole move can take.
    let own = match &plan {
        Err(Refusal::BranchIntoPatch { to, .. }) => addr + to,
        _ => 0,
    };
    let Some(e) = [around.entry, own].into_iter().filter(|&e| e != 0).min() else {
        return plan;
    };
    let at = analyze::entry_point(code, size as usize, addr);
    let inside = match &plan {
        Ok(p) => e > p.at && e < p.resume(),
        Err(Refusal::NotAnEntry | Refusal::PltStub) => false,
        Err(_) => e > at && e < at + analyze::JMP_LEN,
    };
    if !inside {
        return plan;
    }
    if limit > at && limit < e {
        return Err(Refusal::SymbolInside { offset: limit - addr });
    }
    analyze::plan_hop(near, near_at, addr, size as usize, e, &around.dead)
}

/// [`Around`] each function the module scan found entered, by run-time
/// address, with the function's first bytes as the file holds them (the
/// patcher uses the knowledge only where memory holds those bytes).
static AROUND: std::sync::Mutex<std::collections::BTreeMap<u64, (Vec<u8>, Around)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Records what the module scan found around the function at run-time
/// address `addr`, whose first bytes are `head`: the patcher then decides
/// it by [`decide_around`].
pub fn note_around(addr: u64, head: &[u8], around: Around) {
    AROUND.lock().unwrap_or_else(|e| e.into_inner()).insert(addr, (head.to_vec(), around));
}

fn noted_around(addr: u64) -> Option<(Vec<u8>, Around)> {
    AROUND.lock().unwrap_or_else(|e| e.into_inner()).get(&addr).cloned()
}

/// Bytes read past a function's end: enough for its alignment padding.
const TAIL: u64 = analyze::PADDING_MAX as u64;
/// Functions closer than this share one read.
const READ_GAP: u64 = 4096;
/// Longest single read.
const READ_MAX: u64 = 16 << 20;

/// The code of a batch's functions, read in as few reads as possible.
#[derive(Debug, Default)]
struct CodeCache {
    /// (address, bytes), sorted, disjoint.
    chunks: Vec<(u64, Vec<u8>)>,
}

impl CodeCache {
    fn read<S: AddressSpace>(space: &mut S, funcs: &[FunctionSpec]) -> Result<CodeCache, PatchError> {
        let below = |f: &FunctionSpec| if noted_around(f.addr).is_some() { NEAR_BEFORE } else { 0 };
        let mut spans: Vec<(u64, u64)> = funcs
            .iter()
            .map(|f| (f.addr.saturating_sub(below(f)), f.addr.saturating_add(f.size).saturating_add(TAIL)))
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in spans {
            match merged.last_mut() {
                Some(m) if a <= m.1.saturating_add(READ_GAP) && b.max(m.1) - m.0 <= READ_MAX => {
                    m.1 = m.1.max(b)
                }
                _ => merged.push((a, b)),
            }
        }
        let mut cache = CodeCache::default();
        for (a, b) in merged {
            let mut buf = vec![0; (b - a) as usize];
            if space.read(a, &mut buf).is_ok() {
                cache.chunks.push((a, buf));
                continue;
            }
            // A hole in the span (or the tail past the last mapped page):
            // read each function alone, its padding where readable.
            for f in funcs.iter().filter(|f| (a..b).contains(&f.addr)) {
                let mut body = vec![0; f.size as usize];
                space.read(f.addr, &mut body)?;
                let mut tail = vec![0; TAIL as usize];
                if space.read(f.addr + f.size, &mut tail).is_ok() {
                    body.extend_from_slice(&tail);
                }
                let mut start = f.addr;
                let mut head = vec![0; below(f) as usize];
                if !head.is_empty() && space.read(f.addr - below(f), &mut head).is_ok() {
                    head.extend_from_slice(&body);
                    (start, body) = (f.addr - below(f), head);
                }
                cache.chunks.push((start, body));
            }
        }
        cache.chunks.sort_by_key(|c| c.0);
        Ok(cache)
    }

    /// At least `len` bytes at `addr` (more when cached: what follows them).
    fn get(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let i = self.chunks.partition_point(|c| c.0 <= addr).checked_sub(1)?;
        let (base, bytes) = &self.chunks[i];
        let from = (addr - base) as usize;
        (from as u64 + len <= bytes.len() as u64).then(|| &bytes[from..])
    }
}

/// Jumps (sorted by address) merged into writes: jumps closer than a page
/// share one write, the code between them rewritten unchanged from `code`.
fn merge_writes(jumps: &[(u64, Vec<u8>)], code: &CodeCache) -> Vec<(u64, Vec<u8>)> {
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    for (at, bytes) in jumps {
        if let Some((start, buf)) = out.last_mut() {
            let end = *start + buf.len() as u64;
            if *at >= end
                && *at - end < READ_GAP
                && let Some(gap) = code.get(end, *at - end)
            {
                buf.extend_from_slice(&gap[..(*at - end) as usize]);
                buf.extend_from_slice(bytes);
                continue;
            }
        }
        out.push((*at, bytes.clone()));
    }
    out
}

/// Patches functions of one address space.
#[derive(Debug)]
pub struct Patcher<S: AddressSpace> {
    space: S,
    arenas: Vec<Arena>,
    installed: Vec<Installed>,
    pcs: Vec<u64>,
}

impl<S: AddressSpace> Patcher<S> {
    /// A patcher for `space`.
    pub fn new(space: S) -> Self {
        Patcher { space, arenas: Vec::new(), installed: Vec::new(), pcs: Vec::new() }
    }

    /// A patcher that owns patches made earlier (e.g. before detaching from
    /// and re-attaching to a process), so it can remove them.
    pub fn adopt(space: S, installed: Vec<Installed>) -> Self {
        Patcher { space, arenas: Vec::new(), installed, pcs: Vec::new() }
    }

    /// Gives up ownership of the patches without removing them (the program
    /// goes on running instrumented).
    pub fn keep(mut self) -> Vec<Installed> {
        std::mem::take(&mut self.installed)
    }

    /// Program counters of the target's stopped threads: a function whose
    /// displaced bytes hold one past their first byte is refused
    /// ([`Refusal::ThreadInside`]) rather than patched under that thread.
    pub fn set_thread_pcs(&mut self, pcs: Vec<u64>) {
        self.pcs = pcs;
    }

    /// Functions patched so far.
    pub fn installed(&self) -> &[Installed] {
        &self.installed
    }

    /// Arenas mapped so far.
    pub fn arenas(&self) -> &[Arena] {
        &self.arenas
    }

    /// Plans every function, writes all trampolines, then all jumps. Functions
    /// that cannot be patched are returned as refused; an error means the
    /// target could not be read or written, and nothing of this batch's jumps
    /// was written.
    ///
    /// System calls are batched for a stopped target: code is read in one
    /// read per run of nearby functions, each arena's new trampolines go in
    /// one write, and the jumps in one write per run of nearby jumps.
    pub fn instrument(&mut self, funcs: &[FunctionSpec]) -> Result<Outcome, PatchError> {
        let started = std::time::Instant::now();
        let mut out = Outcome::default();
        let known = self.arenas.len();
        let code = CodeCache::read(&mut self.space, funcs)?;
        // Bytes patched already (start -> end), this batch's included.
        let mut taken: std::collections::BTreeMap<u64, u64> =
            self.installed.iter().map(|i| (i.at, i.at + i.original.len() as u64)).collect();
        let mut jumps: Vec<(u64, Vec<u8>)> = Vec::new();
        // Per arena touched: where this batch's trampolines start, and their bytes.
        let mut runs: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        for f in funcs {
            let refuse = |reason| Refused { name: f.name.clone(), addr: f.addr, reason };
            let Some(bytes) = code.get(f.addr, f.size) else {
                out.refused.push(refuse(Refusal::Undecodable { offset: 0 }));
                continue;
            };
            let decided = match noted_around(f.addr) {
                None => decide(&f.name, bytes, f.size, f.addr, f.limit),
                // The file's code, not what memory holds here: the scan's knowledge does not apply.
                Some((head, around)) if !bytes.starts_with(&head) => Err(Refusal::Entered {
                    offset: around.entry.saturating_sub(f.addr),
                    why: "the code in memory differs from the module file's",
                }),
                Some((_, around)) => {
                    let near_at = f.addr.saturating_sub(NEAR_BEFORE);
                    // As many bytes as `list --patchable` reads from the file, so both decide alike.
                    let len = f.addr - near_at + f.size + TAIL;
                    match code.get(near_at, f.addr - near_at + f.size) {
                        Some(near) => {
                            let near = &near[..near.len().min(len as usize)];
                            decide_around(&f.name, near, near_at, f.size, f.addr, f.limit, &around)
                        }
                        None => {
                            let own = &bytes[..bytes.len().min((f.size + TAIL) as usize)];
                            decide_around(&f.name, own, f.addr, f.size, f.addr, f.limit, &around)
                        }
                    }
                }
            };
            let plan = match decided {
                Ok(p) => p,
                Err(r) => {
                    out.refused.push(refuse(r));
                    continue;
                }
            };
            if self.pcs.iter().any(|&pc| pc > plan.at && pc < plan.busy_end) {
                out.refused.push(refuse(Refusal::ThreadInside));
                continue;
            }
            // Patches never overlap, so only the last one starting below our end can reach into us.
            let span = plan.patched();
            if taken.range(..span.end).next_back().is_some_and(|(_, &end)| end > span.start) {
                out.refused.push(refuse(Refusal::AlreadyPatched));
                continue;
            }
            let arena = self.arena_for(plan.at)?;
            let tramp = self.arenas[arena].next();
            let bytes = match codegen::entry_trampoline(&plan, tramp, f.hook, f.arg) {
                Ok(b) if b.len() as u64 <= arena::TRAMPOLINE_MAX => b,
                Ok(b) => {
                    out.refused.push(refuse(Refusal::Relocation(format!("{} bytes of trampoline", b.len()))));
                    continue;
                }
                Err(r) => {
                    out.refused.push(refuse(r));
                    continue;
                }
            };
            let Some(jump) = codegen::entry_jump(&plan, tramp) else {
                out.refused.push(refuse(Refusal::Relocation("trampoline out of rel32 reach".into())));
                continue;
            };
            let run = match runs.iter().position(|r| r.0 == arena) {
                Some(i) => i,
                None => {
                    runs.push((arena, tramp, Vec::new()));
                    runs.len() - 1
                }
            };
            let len = (bytes.len() as u64).next_multiple_of(16);
            let (_, start, buf) = &mut runs[run];
            buf.extend_from_slice(&bytes);
            buf.resize((tramp + len - *start) as usize, 0xcc);
            self.arenas[arena].commit(bytes.len() as u64);
            taken.insert(span.start, span.end);
            jumps.push((span.start, jump));
            out.installed.push(Installed {
                name: f.name.clone(),
                at: span.start,
                original: plan.original,
                trampoline: tramp,
            });
        }
        for (_, at, bytes) in &runs {
            self.space.write_code(*at, bytes)?;
        }
        jumps.sort_by_key(|j| j.0);
        let writes = merge_writes(&jumps, &code);
        for (k, (at, bytes)) in writes.iter().enumerate() {
            if let Err(e) = self.space.write_code(*at, bytes) {
                // Leave nothing half-done: undo this batch's jumps.
                for (at, bytes) in &writes[..k] {
                    let original = code.get(*at, bytes.len() as u64).map(|b| b[..bytes.len()].to_vec());
                    if let Some(o) = original {
                        let _ = self.space.write_code(*at, &o);
                    }
                }
                return Err(e);
            }
        }
        self.installed.extend(out.installed.iter().cloned());
        out.arenas = self.arenas[known..].to_vec();
        out.window = started.elapsed();
        Ok(out)
    }

    fn arena_for(&mut self, addr: u64) -> Result<usize, PatchError> {
        if let Some(i) = self.arenas.iter().position(|a| a.serves(addr)) {
            return Ok(i);
        }
        let base = self.space.map_code_near(addr, arena::ARENA_LEN)?;
        self.arenas.push(Arena { base, len: arena::ARENA_LEN, used: 0 });
        let i = self.arenas.len() - 1;
        if self.arenas[i].serves(addr) { Ok(i) } else { Err(PatchError::NoRoom { near: addr }) }
    }

    /// Puts every patched function's original bytes back, one read and one
    /// write per run of nearby patches. Trampolines stay mapped: frames
    /// inside them finish normally.
    pub fn remove_all(&mut self) -> Result<(), PatchError> {
        self.installed.sort_by_key(|i| i.at);
        while !self.installed.is_empty() {
            // The last run of patches less than a page apart.
            let mut first = self.installed.len() - 1;
            while first > 0 {
                let (a, b) = (&self.installed[first - 1], &self.installed[first]);
                if b.at - (a.at + a.original.len() as u64) >= READ_GAP {
                    break;
                }
                first -= 1;
            }
            let run = &self.installed[first..];
            let start = run[0].at;
            let end = run.iter().map(|i| i.at + i.original.len() as u64).max().unwrap_or(start);
            let mut bytes = vec![0; (end - start) as usize];
            self.space.read(start, &mut bytes)?;
            for i in run {
                let off = (i.at - start) as usize;
                bytes[off..off + i.original.len()].copy_from_slice(&i.original);
            }
            self.space.write_code(start, &bytes)?;
            self.installed.truncate(first);
        }
        Ok(())
    }
}

impl<S: AddressSpace> Drop for Patcher<S> {
    fn drop(&mut self) {
        // Best effort: a target that is gone needs no restoring.
        let _ = self.remove_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x40_1000;

    #[test]
    fn decide_keeps_to_the_next_symbol() {
        // xor eax,eax; ret; then nop padding
        let code = [0x31, 0xc0, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90];
        assert_eq!(decide("f", &code, 3, F, 0).unwrap_err(), Refusal::TooShort { len: 3 }, "limit unknown");
        assert_eq!(decide("f", &code, 3, F, F + 4).unwrap_err(), Refusal::TooShort { len: 4 });
        assert_eq!(decide("f", &code, 3, F, F + 5).unwrap().moved_len, 5);
        // push rbx; mov ebx,edi; pop rbx; ret with a symbol at +2
        let code = [0x53, 0x89, 0xfb, 0x5b, 0xc3, 0x90];
        assert_eq!(decide("f", &code, 5, F, F + 2).unwrap_err(), Refusal::SymbolInside { offset: 2 });
        assert_eq!(decide("f.cold", &code, 5, F, 0).unwrap_err(), Refusal::NotAnEntry);
    }

    #[test]
    fn decide_around_hops_only_over_entries_inside_the_jump() {
        // ret; nopl 0(rax,rax) (dead), then at F: mov eax,edi; (+2) dec eax;
        // jne +2 (own loop back to +2, 0x60 bytes on: too long to move whole); ret
        let mut near = vec![0xc3, 0x0f, 0x1f, 0x44, 0, 0];
        let near_at = F - near.len() as u64;
        near.extend_from_slice(&[0x89, 0xf8, 0xff, 0xc8]);
        near.resize(near.len() + 0x60, 0x90);
        near.extend_from_slice(&[0x75, (0x100 - 0x64) as u8, 0xc3]);
        let size = near.len() as u64 - 6;
        let dead = Around { entry: 0, dead: vec![(F - 5, F)] };
        let p = decide_around("f", &near, near_at, size, F, 0, &dead).unwrap();
        assert_eq!((p.tactic, p.moved_len, p.hop, p.patched()), (Tactic::Hop, 2, Some(F - 5), F - 5..F + 2));
        // Another function entering at +2 of a 4-byte body with no padding
        // after it: the same hop, though a 5-byte jump has no room.
        let short = &near[..12];
        let entered = Around { entry: F + 2, ..dead.clone() };
        assert_eq!(decide("f", &short[6..], 4, F, 0).unwrap_err(), Refusal::TooShort { len: 4 });
        let p = decide_around("f", short, near_at, 4, F, 0, &entered).unwrap();
        assert_eq!((p.tactic, p.resume(), p.hop), (Tactic::Hop, F + 2, Some(F - 5)));
        // An entry past the displaced bytes leaves the plan alone.
        let code = [0x53, 0x89, 0xfb, 0x5b, 0xc3, 0x90, 0x90];
        let later = Around { entry: F + 6, dead: vec![] };
        assert_eq!(decide_around("f", &code, F, 5, F, 0, &later).unwrap().tactic, Tactic::Prologue);
        // Entered at +3 with nowhere to hop: refused with the reason.
        let e = decide_around("f", &code, F, 5, F, 0, &Around { entry: F + 3, dead: vec![] }).unwrap_err();
        assert!(matches!(e, Refusal::Entered { offset: 3, .. }), "{e}");
        // A symbol between the jump and the entry: refused.
        let e = decide_around("f", &near, near_at, size, F, F + 1, &dead).unwrap_err();
        assert_eq!(e, Refusal::SymbolInside { offset: 1 });
    }
}
