//! A cheap first look at whether a function's entry can take a 5-byte
//! `jmp rel32` to a trampoline.
//!
//! This is a pre-check, not the relocation itself (that lives in
//! [`crate::patch`]): it decodes the instructions the jump would overwrite
//! and refuses entries where doing so is clearly wrong. It does not look
//! for branches from elsewhere in the function into the overwritten bytes.

use std::fmt;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};
use papirus_substrate::elf::{ElfFile, SymbolKind};
use serde::Serialize;

use super::Function;

/// Bytes a `jmp rel32` to a trampoline occupies.
pub const JUMP_LEN: u64 = 5;
/// Bytes of `endbr64`, which stays in place ahead of the jump so indirect
/// calls still land on it under IBT.
pub const ENDBR64_LEN: u64 = 4;
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// Longest x86 instruction: enough lookahead past the jump's 5 bytes.
const MAX_INSN: usize = 15;

/// The outcome of the pre-check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Patchability {
    /// The entry looks patchable.
    Patchable(Prologue),
    /// The entry cannot take the jump; why.
    NotPatchable {
        /// The reason.
        reason: Reason,
    },
}

impl Patchability {
    /// Whether the pre-check passed.
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
                    "yes ({} insn, {} bytes{})",
                    p.instructions,
                    p.length,
                    if p.endbr64 { ", endbr64" } else { "" }
                )
            }
            Patchability::NotPatchable { reason } => write!(f, "no: {reason}"),
        }
    }
}

/// The instructions the jump would displace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Prologue {
    /// The function starts with `endbr64`, which is kept; the jump goes after it.
    pub endbr64: bool,
    /// Offset of the jump from the function's start (4 after `endbr64`, else 0).
    pub offset: u8,
    /// Bytes of whole instructions displaced (at least 5).
    pub length: u8,
    /// How many instructions that is.
    pub instructions: u8,
    /// One of them addresses memory relative to RIP (to be re-encoded when relocated).
    pub rip_relative: bool,
    /// One of them is a relative branch or call (to be re-targeted when relocated).
    pub relative_branch: bool,
}

/// Why an entry cannot take the jump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// A PLT stub: patch the import's target instead.
    PltStub,
    /// Not code (a data symbol).
    NotCode,
    /// The symbol has no size, so the jump could overwrite whatever follows.
    UnknownSize,
    /// Fewer bytes than the jump needs (after `endbr64`).
    TooSmall {
        /// The function's size.
        size: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The address is not backed by the file (e.g. `.bss`), or the file is cut short.
    NotInFile,
    /// Bytes that do not decode as an instruction.
    Undecodable {
        /// Offset from the function's start.
        offset: u64,
    },
    /// An instruction that ends or traps the flow (ret, int3, ud2, hlt, or a
    /// jump before the last displaced instruction): what follows it may be
    /// another function or a branch target.
    FlowEnds {
        /// Offset from the function's start.
        offset: u64,
        /// The instruction.
        mnemonic: String,
    },
    /// The displaced instructions run past the end of the function.
    RunsPastEnd {
        /// Bytes the instructions would take.
        length: u64,
        /// The function's size.
        size: u64,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::PltStub => f.write_str("PLT stub"),
            Reason::NotCode => f.write_str("not code"),
            Reason::UnknownSize => f.write_str("size unknown"),
            Reason::TooSmall { size, needed } => write!(f, "too small ({size} < {needed} bytes)"),
            Reason::NotInFile => f.write_str("bytes not in the file"),
            Reason::Undecodable { offset } => write!(f, "undecodable at +{offset}"),
            Reason::FlowEnds { offset, mnemonic } => write!(f, "{mnemonic} at +{offset}"),
            Reason::RunsPastEnd { length, size } => write!(f, "prologue {length} bytes > size {size}"),
        }
    }
}

/// Runs the pre-check on `func` of `elf` (link-time address `func.link_address`).
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
    if func.kind == SymbolKind::Object {
        return Err(Reason::NotCode);
    }
    if func.size == 0 {
        return Err(Reason::UnknownSize);
    }
    let bytes = elf
        .bytes_at(func.link_address, (ENDBR64_LEN + JUMP_LEN) as usize + MAX_INSN)
        .ok_or(Reason::NotInFile)?;
    let endbr64 = bytes.starts_with(&ENDBR64) && func.size >= ENDBR64_LEN;
    let start = if endbr64 { ENDBR64_LEN } else { 0 };
    let needed = start + JUMP_LEN;
    if func.size < needed {
        return Err(Reason::TooSmall { size: func.size, needed });
    }
    let code = bytes.get(start as usize..).ok_or(Reason::NotInFile)?;
    let mut decoder = Decoder::with_ip(64, code, func.link_address + start, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    let (mut length, mut count, mut rip_relative, mut relative_branch) = (0u64, 0u8, false, false);
    while length < JUMP_LEN {
        let offset = start + length;
        if !decoder.can_decode() {
            return Err(Reason::NotInFile);
        }
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            return Err(Reason::Undecodable { offset });
        }
        length += insn.len() as u64;
        count += 1;
        rip_relative |= insn.is_ip_rel_memory_operand();
        let last = length >= JUMP_LEN;
        let ends = match insn.flow_control() {
            FlowControl::Next => insn.mnemonic() == Mnemonic::Hlt,
            FlowControl::Call | FlowControl::IndirectCall => false,
            FlowControl::ConditionalBranch => false,
            // A jump that is the last displaced instruction is relocated
            // whole (a tail-call thunk); one earlier leaves displaced
            // bytes that only branches from elsewhere reach.
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => !last,
            FlowControl::Interrupt => insn.mnemonic() != Mnemonic::Syscall,
            FlowControl::Return | FlowControl::Exception | FlowControl::XbeginXabortXend => true,
        };
        if ends {
            return Err(Reason::FlowEnds {
                offset,
                mnemonic: format!("{:?}", insn.mnemonic()).to_lowercase(),
            });
        }
        relative_branch |= matches!(
            insn.flow_control(),
            FlowControl::Call | FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) && insn.near_branch_target() != 0;
    }
    if start + length > func.size {
        return Err(Reason::RunsPastEnd { length: start + length, size: func.size });
    }
    Ok(Prologue {
        endbr64,
        offset: start as u8,
        length: length as u8,
        instructions: count,
        rip_relative,
        relative_branch,
    })
}
