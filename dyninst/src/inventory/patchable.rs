//! Whether a function's entry can take papirus' jump to a trampoline,
//! decided from the file's bytes by the patcher's own code
//! ([`crate::patch::decide`]), so `papirus-probe list --patchable` shows
//! exactly what `run` and `attach` decide, refusals and their reasons alike.
//! What only a live process can tell (a thread inside the entry, an alias
//! already patched, a trampoline out of reach) is decided at patch time.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use papirus_substrate::elf::{ElfFile, SymbolKind};
use serde::Serialize;

use super::Function;
use crate::patch::{self, EntryPlan, Tactic};

/// Bytes a `jmp rel32` to a trampoline occupies.
pub const JUMP_LEN: u64 = patch::analyze::JMP_LEN;
/// Bytes of `endbr64`, which stays in place ahead of the jump so indirect
/// calls still land on it under IBT.
pub const ENDBR64_LEN: u64 = 4;

/// The outcome of the check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Patchability {
    /// The entry can be patched.
    Patchable(Prologue),
    /// The entry cannot take the jump; why.
    NotPatchable {
        /// The reason.
        reason: Reason,
    },
}

impl Patchability {
    /// Whether the check passed.
    pub fn is_patchable(&self) -> bool {
        matches!(self, Patchability::Patchable(_))
    }
}

impl fmt::Display for Patchability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Patchability::Patchable(p) => {
                write!(
                    f,
                    "yes ({} insn, {} bytes{}{})",
                    p.instructions,
                    p.length,
                    if p.endbr64 { ", endbr64" } else { "" },
                    if p.tactic == Tactic::Whole { ", moved whole" } else { "" }
                )
            }
            Patchability::NotPatchable { reason } => write!(f, "no: {reason}"),
        }
    }
}

/// The instructions the jump displaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Prologue {
    /// The function starts with `endbr64`, which is kept; the jump goes after it.
    pub endbr64: bool,
    /// Offset of the jump from the function's start (4 after `endbr64`, else 0).
    pub offset: u8,
    /// Bytes the jump (and its `int3` filler) overwrites: at least 5.
    pub length: u8,
    /// How many instructions run from the trampoline.
    pub instructions: u8,
    /// One of them addresses memory relative to RIP (re-encoded, same target).
    pub rip_relative: bool,
    /// One of them is a relative branch or call (re-targeted when relocated).
    pub relative_branch: bool,
    /// Displaced prologue, or the whole function moved.
    pub tactic: Tactic,
}

/// Why an entry cannot take the jump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// A PLT stub: patch the import's target instead.
    PltStub,
    /// Not code (a data symbol).
    NotCode,
    /// An IFUNC resolver: its result, the implementation, is what runs.
    Resolver,
    /// The symbol has no size, so the jump could overwrite whatever follows.
    UnknownSize,
    /// The address is not backed by the file (e.g. `.bss`), or the file is cut short.
    NotInFile,
    /// Code elsewhere in the module branches into the bytes the jump would
    /// overwrite (glibc's hand-written routines enter one another past their start).
    Entered {
        /// Link-time address of the branch.
        from: u64,
        /// Link-time address it lands on.
        to: u64,
    },
    /// The patcher's refusal.
    Refused {
        /// What the patcher says.
        why: String,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::PltStub => f.write_str("PLT stub"),
            Reason::NotCode => f.write_str("not code"),
            Reason::Resolver => f.write_str("IFUNC resolver (the implementation it picks is patched)"),
            Reason::UnknownSize => f.write_str("size unknown"),
            Reason::NotInFile => f.write_str("bytes not in the file"),
            Reason::Entered { from, to } => {
                write!(f, "the code at {from:#x} branches to {to:#x}, inside the bytes the jump overwrites")
            }
            Reason::Refused { why } => f.write_str(why),
        }
    }
}

/// The address of the first symbol of `elf` after link-time address `addr`
/// (0 when none): bytes from there on are not `addr`'s padding.
pub fn next_symbol(elf: &ElfFile, addr: u64) -> u64 {
    let syms = elf.symbols();
    let i = syms.partition_point(|s| s.address <= addr);
    syms.get(i).map_or(0, |s| s.address)
}

/// Every direct branch and call of `elf`'s executable sections as (target,
/// source) link-time addresses, sorted; decoded once per file.
pub fn branches(elf: &ElfFile) -> Arc<Vec<(u64, u64)>> {
    type Cache = Mutex<HashMap<(PathBuf, usize), Arc<Vec<(u64, u64)>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (elf.path().to_path_buf(), elf.data().len());
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(b) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return b.clone();
    }
    let mut out = Vec::new();
    let data = elf.data();
    for s in elf.sections().iter().filter(|s| s.executable && s.allocated) {
        let start = s.file_offset as usize;
        let Some(bytes) = start.checked_add(s.size as usize).and_then(|end| data.get(start..end)) else {
            continue;
        };
        let mut dec = Decoder::with_ip(64, bytes, s.address, DecoderOptions::NONE);
        let mut i = iced_x86::Instruction::default();
        while dec.can_decode() {
            dec.decode_out(&mut i);
            if matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
            ) && i.near_branch_target() != 0
            {
                out.push((i.near_branch_target(), i.ip()));
            }
        }
    }
    out.sort_unstable();
    let out = Arc::new(out);
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, out.clone());
    out
}

/// The first branch of `branches` from outside `body` landing in (at, end).
pub fn entered(branches: &[(u64, u64)], body: Range<u64>, at: u64, end: u64) -> Option<(u64, u64)> {
    let i = branches.partition_point(|b| b.0 <= at);
    branches[i..]
        .iter()
        .take_while(|b| b.0 < end)
        .find(|b| !body.contains(&b.1))
        .map(|&(to, from)| (from, to))
}

/// Checks `func` of `elf` (link-time address `func.link_address`).
pub fn check(elf: &ElfFile, func: &Function) -> Patchability {
    match check_inner(elf, func) {
        Ok(p) => Patchability::Patchable(p),
        Err(reason) => Patchability::NotPatchable { reason },
    }
}

fn check_inner(elf: &ElfFile, func: &Function) -> Result<Prologue, Reason> {
    if func.section.starts_with(".plt")
        || elf.plt_stubs().binary_search_by_key(&func.link_address, |p| p.address).is_ok()
    {
        return Err(Reason::PltStub);
    }
    match func.kind {
        SymbolKind::Object => return Err(Reason::NotCode),
        SymbolKind::Ifunc => return Err(Reason::Resolver),
        _ => {}
    }
    if func.size == 0 {
        return Err(Reason::UnknownSize);
    }
    let tail = patch::analyze::PADDING_MAX;
    let code = elf
        .bytes_at(func.link_address, func.size as usize + tail)
        .or_else(|| elf.bytes_at(func.link_address, func.size as usize))
        .ok_or(Reason::NotInFile)?;
    let limit = next_symbol(elf, func.link_address);
    let plan = patch::decide(&func.name, code, func.size, func.link_address, limit)
        .map_err(|r| Reason::Refused { why: r.to_string() })?;
    let body = func.link_address..func.link_address + func.size;
    if let Some((from, to)) = entered(&branches(elf), body, plan.at, plan.resume()) {
        return Err(Reason::Entered { from, to });
    }
    Ok(prologue(&plan))
}

fn prologue(plan: &EntryPlan) -> Prologue {
    let relative = |i: &iced_x86::Instruction| {
        matches!(
            i.flow_control(),
            FlowControl::Call | FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        )
    };
    Prologue {
        endbr64: plan.at != plan.func,
        offset: (plan.at - plan.func) as u8,
        length: plan.moved_len.min(u8::MAX.into()) as u8,
        instructions: plan.moved.len().min(u8::MAX.into()) as u8,
        rip_relative: plan.moved.iter().any(|i| i.is_ip_rel_memory_operand()),
        relative_branch: plan.moved.iter().any(relative),
        tactic: plan.tactic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entered_ignores_the_function_itself_and_its_first_byte() {
        // (target, source), sorted by target.
        let b = [(0x1000, 0x2000), (0x1003, 0x1010), (0x1003, 0x3000), (0x1008, 0x2000)];
        assert_eq!(entered(&b, 0x1000..0x1020, 0x1000, 0x1005), Some((0x3000, 0x1003)));
        assert_eq!(entered(&b[..2], 0x1000..0x1020, 0x1000, 0x1005), None, "its own loop is not an entry");
        assert_eq!(
            entered(&b, 0x1000..0x1020, 0x1004, 0x1008),
            None,
            "a branch to the jump's first byte is fine"
        );
    }
}
