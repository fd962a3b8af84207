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

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};
use papirus_substrate::elf::{ElfFile, SymbolKind};
use serde::Serialize;

use super::Function;
use crate::patch::{self, EntryPlan, Tactic};

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
                    match p.tactic {
                        Tactic::Whole => ", moved whole",
                        Tactic::Hop => ", 2-byte hop",
                        Tactic::Prologue => "",
                    }
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
    /// Bytes the displaced instructions occupy: at least 5, which the jump
    /// (and its `int3` filler) overwrites; under a hop, those before the
    /// entry other code uses, of which the `jmp rel8` overwrites 2.
    pub length: u8,
    /// How many instructions run from the trampoline.
    pub instructions: u8,
    /// One of them addresses memory relative to RIP (re-encoded, same target).
    pub rip_relative: bool,
    /// One of them is a relative branch or call (re-targeted when relocated).
    pub relative_branch: bool,
    /// Displaced prologue, the whole function moved, or a hop.
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
        /// Why a 2-byte `jmp rel8` hop does not fit either.
        why: String,
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
            Reason::Entered { from, to, why } => write!(
                f,
                "the code at {from:#x} branches to {to:#x}, inside the bytes the jump overwrites, and no 2-byte \
                 hop fits: {why}"
            ),
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

/// What one linear pass over a module's code finds.
#[derive(Debug, Default)]
struct Scan {
    /// (target, source) of every direct branch and call, sorted.
    branches: Arc<Vec<(u64, u64)>>,
    /// Dead padding runs (start, end), sorted.
    dead: Arc<Vec<(u64, u64)>>,
}

fn scan(elf: &ElfFile) -> Arc<Scan> {
    type Cache = Mutex<HashMap<(PathBuf, usize), Arc<Scan>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (elf.path().to_path_buf(), elf.data().len());
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(b) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return b.clone();
    }
    let mut out = Vec::new();
    // Addresses code may reach other than by a direct branch: symbols,
    // RIP-relative operands (a resolver's `lea` of an implementation) and
    // pointers the loader relocates (every relocation's addend, to err on
    // the safe side).
    let mut taken: Vec<u64> = elf.symbols().iter().map(|s| s.address).collect();
    let mut runs = Vec::new();
    let data = elf.data();
    for s in elf.sections().iter().filter(|s| s.executable && s.allocated) {
        let start = s.file_offset as usize;
        let Some(bytes) = start.checked_add(s.size as usize).and_then(|end| data.get(start..end)) else {
            continue;
        };
        let mut dec = Decoder::with_ip(64, bytes, s.address, DecoderOptions::NONE);
        let mut i = iced_x86::Instruction::default();
        // The run of padding being read, when what precedes it never falls through.
        let mut run: Option<u64> = None;
        let mut after_end = false;
        let mut in_padding = false;
        while dec.can_decode() {
            dec.decode_out(&mut i);
            let pad = !i.is_invalid() && matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3);
            if pad {
                if !in_padding && after_end {
                    run = Some(i.ip());
                }
                in_padding = true;
                continue;
            }
            if let Some(r) = run.take() {
                runs.push((r, i.ip()));
            }
            in_padding = false;
            after_end = !i.is_invalid()
                && (matches!(
                    i.flow_control(),
                    FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
                ) || i.code() == iced_x86::Code::Ud2);
            if i.is_ip_rel_memory_operand() {
                taken.push(i.ip_rel_memory_address());
            }
            if matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
            ) && i.near_branch_target() != 0
            {
                out.push((i.near_branch_target(), i.ip()));
            }
        }
        if let Some(r) = run {
            runs.push((r, s.address + s.size));
        }
    }
    // Addresses relocations store (function pointers in data) are taken too.
    taken.extend(super::ifunc::relocations(elf).map(|[_, _, addend]| addend));
    out.sort_unstable();
    taken.extend(out.iter().map(|b| b.0));
    taken.sort_unstable();
    // A run nothing can reach is dead. Alignment padding ends on an aligned
    // address: a run that does not is no padding the assembler made.
    runs.sort_unstable();
    runs.retain(|&(a, b)| {
        if b % 8 != 0 {
            return false;
        }
        let i = taken.partition_point(|&t| t < a);
        taken.get(i).is_none_or(|&t| t >= b)
    });
    let scan = Arc::new(Scan { branches: Arc::new(out), dead: Arc::new(runs) });
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, scan.clone());
    scan
}

/// Every direct branch and call of `elf`'s executable sections as (target,
/// source) link-time addresses, sorted; decoded once per file.
pub fn branches(elf: &ElfFile) -> Arc<Vec<(u64, u64)>> {
    scan(elf).branches.clone()
}

/// The dead padding of `elf`'s code as (start, end) link-time addresses,
/// sorted: runs of `nop`/`int3` that follow an instruction that never falls
/// through (`ret`, `jmp`, `ud2`) and end on an 8-byte boundary, with no
/// symbol, branch target, RIP-relative operand or relocated pointer inside
/// them. A [`Tactic::Hop`]
/// puts its `jmp rel32` there.
pub fn dead_runs(elf: &ElfFile) -> Arc<Vec<(u64, u64)>> {
    scan(elf).dead.clone()
}

/// [`patch::Around`] the function at link-time address `func` (its body
/// `body`, its jump at `at`) in `elf`, at link-time addresses: the first
/// entry from outside the body into its first `span` bytes past `at`, and
/// the dead runs within a `jmp rel8`'s reach.
pub fn around(elf: &ElfFile, body: Range<u64>, at: u64, span: u64) -> patch::Around {
    let s = scan(elf);
    let entry = entered(&s.branches, body, at, at + span).map_or(0, |(_, to)| to);
    let (lo, hi) = (at.saturating_sub(patch::NEAR_BEFORE), at + 2 * patch::analyze::HOP_FORWARD);
    let first = s.dead.partition_point(|&(_, b)| b <= lo);
    let dead = s.dead[first..].iter().take_while(|&&(a, _)| a < hi).copied().collect();
    patch::Around { entry, dead }
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
    let link = func.link_address;
    let limit = next_symbol(elf, link);
    let body = link..link + func.size;
    let at = patch::analyze::entry_point(code, func.size as usize, link);
    let around = around(elf, body, at, func.size + tail as u64);
    if around.entry == 0 {
        // A loop of its own back into the first bytes may still take a hop.
        match patch::decide(&func.name, code, func.size, link, limit) {
            Ok(plan) => return Ok(prologue(&plan)),
            Err(patch::Refusal::BranchIntoPatch { .. }) => {}
            Err(r) => return Err(Reason::Refused { why: r.to_string() }),
        }
    }
    let (near_at, near) = near(elf, link, code);
    // The patcher decides this function by the same knowledge, at its run-time address.
    let bias = func.address.wrapping_sub(link);
    let head = &code[..code.len().min(func.size as usize).min(HEAD_LEN)];
    patch::note_around(func.address, head, shifted(&around, bias));
    match patch::decide_around(&func.name, near, near_at, func.size, link, limit, &around) {
        Ok(plan) => Ok(prologue(&plan)),
        // Another function's branch; the function's own loop is the patcher's refusal as it stands.
        Err(patch::Refusal::Entered { why, offset }) if around.entry == link + offset => {
            let from =
                entered(&branches(elf), link..link + func.size, at, around.entry + 1).map_or(0, |e| e.0);
            Err(Reason::Entered { from, to: around.entry, why: why.to_string() })
        }
        Err(r) => Err(Reason::Refused { why: r.to_string() }),
    }
}

/// First bytes of a function the patcher compares with memory before using
/// what the module scan found around it.
pub const HEAD_LEN: usize = 16;

/// The bytes of `elf` from up to [`patch::NEAR_BEFORE`] below `link` on,
/// `code` (the function's bytes) included, with where they start.
pub fn near<'a>(elf: &'a ElfFile, link: u64, code: &'a [u8]) -> (u64, &'a [u8]) {
    let near_at = link.saturating_sub(patch::NEAR_BEFORE);
    match elf.bytes_at(near_at, (link - near_at) as usize + code.len()) {
        Some(b) => (near_at, b),
        None => (link, code),
    }
}

/// `around` moved by `bias` (link time to run time); no entry stays none.
pub fn shifted(around: &patch::Around, bias: u64) -> patch::Around {
    patch::Around {
        entry: if around.entry == 0 { 0 } else { around.entry.wrapping_add(bias) },
        dead: around.dead.iter().map(|&(a, b)| (a.wrapping_add(bias), b.wrapping_add(bias))).collect(),
    }
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
    fn dead_runs_of_this_libc_are_padding_after_code_that_does_not_fall_through() {
        let Some(elf) = crate::inventory::tests::system_libc() else { return };
        let dead = dead_runs(&elf);
        assert!(dead.len() > 1000, "{} runs", dead.len());
        let targets = branches(&elf);
        for &(a, b) in dead.iter() {
            let bytes = elf.bytes_at(a, (b - a) as usize).unwrap();
            let pad = Decoder::with_ip(64, bytes, a, DecoderOptions::NONE)
                .into_iter()
                .all(|i| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3));
            assert!(pad, "{a:#x}..{b:#x}");
            let i = targets.partition_point(|t| t.0 < a);
            assert!(targets.get(i).is_none_or(|t| t.0 >= b), "{a:#x}..{b:#x} is branched to");
            assert!(elf.symbols().iter().all(|s| !(a..b).contains(&s.address)), "{a:#x}: a symbol");
        }
    }

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
