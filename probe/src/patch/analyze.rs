//! Deciding whether a function's entry can take a 5-byte jump, and which
//! instructions the jump displaces.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter, Instruction, IntelFormatter, Mnemonic, Register,
};

/// Length of `jmp rel32`.
pub const JMP_LEN: u64 = 5;
/// `endbr64`: an indirect-branch landing pad that stays in place.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// PLT stubs are at most this long.
const PLT_STUB_MAX: u64 = 16;

/// Why a function's entry is left alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The body (after any `endbr64`) is shorter than the jump.
    #[error("{len} bytes after any endbr64: shorter than the 5-byte jump")]
    TooShort {
        /// Bytes available.
        len: u64,
    },
    /// A `ret`, `jmp`, trap or similar ends the code before 5 bytes are covered.
    #[error("`{insn}` at +{offset:#x} ends the code inside the 5 bytes the jump overwrites")]
    EndsEarly {
        /// Offset from the function start.
        offset: u64,
        /// The instruction.
        insn: String,
    },
    /// An instruction in the displaced bytes cannot run elsewhere.
    #[error("`{insn}` at +{offset:#x} cannot be moved: {why}")]
    Unmovable {
        /// Offset from the function start.
        offset: u64,
        /// The instruction.
        insn: String,
        /// Why.
        why: &'static str,
    },
    /// A branch lands inside the displaced bytes.
    #[error("the branch at +{from:#x} targets +{to:#x}, inside the bytes the jump overwrites")]
    BranchIntoPatch {
        /// Offset of the branch from the function start.
        from: u64,
        /// Offset of its target.
        to: u64,
    },
    /// Another symbol starts inside the bytes the jump would overwrite: code may enter there.
    #[error("another symbol starts at +{offset:#x}, inside the bytes the jump overwrites")]
    SymbolInside {
        /// Its offset from the function start.
        offset: u64,
    },
    /// A PLT stub: the function it jumps to is the one to instrument.
    #[error("a PLT stub (`jmp [rip+…]`): instrument the function it jumps to instead")]
    PltStub,
    /// Bytes that do not decode.
    #[error("undecodable instruction at +{offset:#x}")]
    Undecodable {
        /// Offset from the function start.
        offset: u64,
    },
    /// A compiler-split cold part (`f.cold`), entered by a jump from its function, not by a call.
    #[error("a cold part of a function, entered by a jump rather than a call")]
    NotAnEntry,
    /// A stopped thread is in the middle of the bytes the jump would replace.
    #[error("a thread stayed inside its first instructions while papirus waited to patch")]
    ThreadInside,
    /// Another symbol at the same address is already instrumented.
    #[error("already instrumented (an alias at the same address, or patched earlier)")]
    AlreadyPatched,
    /// Left out before patching: an IFUNC whose implementation cannot be
    /// found or patched, or an entry other code jumps into.
    #[error("{0}")]
    NotSelected(String),
    /// The relocated code does not encode at the trampoline's address.
    #[error("cannot relocate the displaced instructions: {0}")]
    Relocation(String),
    /// Code (other code, or the function's own loop) enters past the first
    /// byte, inside the 5 bytes a jump needs, and no `jmp rel8` hop fits either.
    #[error("code enters at +{offset:#x}, inside the 5 bytes a jump needs, and no 2-byte hop fits: {why}")]
    Entered {
        /// Offset of the entry from the function start.
        offset: u64,
        /// Why the hop does not fit.
        why: &'static str,
    },
}

/// How to patch one function's entry.
#[derive(Debug, Clone)]
pub struct EntryPlan {
    /// Function start.
    pub func: u64,
    /// Where the jump goes (after any `endbr64`).
    pub at: u64,
    /// The displaced instructions, decoded at their original addresses.
    pub moved: Vec<Instruction>,
    /// Bytes the displaced instructions occupy: the jump and its `int3`
    /// filler overwrite them (≥ [`JMP_LEN`]), except under [`Tactic::Hop`]
    /// (only the first 2 are overwritten; the rest stay and are never run).
    pub moved_len: u64,
    /// The first byte the patch writes: `at`, or a hop slot below it.
    pub start: u64,
    /// The original bytes from `start` on, as many as the patch writes
    /// (under [`Tactic::Hop`], the bytes between the entry and its slot too,
    /// rewritten unchanged).
    pub original: Vec<u8>,
    /// Under [`Tactic::Hop`]: where the 5-byte `jmp rel32` to the trampoline goes.
    pub hop: Option<u64>,
    /// The whole function runs from the trampoline (see [`Tactic::Whole`]).
    pub tactic: Tactic,
    /// End of the bytes no stopped thread may be inside (past `at`) when the jump is written.
    pub busy_end: u64,
}

/// How the jump finds room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tactic {
    /// The first whole instructions covering 5 bytes are displaced; the
    /// trampoline runs them and jumps back behind them.
    Prologue,
    /// The whole function is copied into the trampoline and never runs in
    /// place again: for bodies shorter than the jump (the jump then also
    /// covers the function's alignment padding), bodies that return or jump
    /// away within their first 5 bytes, and small loops back into them.
    Whole,
    /// Other code enters the function a few bytes past its start (glibc's
    /// `__mempcpy_*` jumps to `__memmove_*+3`): a 2-byte `jmp rel8` covers
    /// only the bytes before that entry and goes to a 5-byte `jmp rel32` in
    /// dead alignment padding within its reach, which goes to the
    /// trampoline. The trampoline runs the instructions before the entry and
    /// jumps back to the entry.
    Hop,
}

impl EntryPlan {
    /// Where execution resumes in the original code after the displaced instructions.
    pub fn resume(&self) -> u64 {
        self.at + self.moved_len
    }

    /// The bytes the patch writes.
    pub fn patched(&self) -> std::ops::Range<u64> {
        self.start..self.start + self.original.len() as u64
    }
}

fn text(i: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(i, &mut out);
    out
}

/// Longest function copied whole into its trampoline.
pub const WHOLE_MAX: usize = 96;
/// Most padding bytes a function can have before the next 16-byte boundary.
pub const PADDING_MAX: usize = 15;

/// Plans the entry patch of the function loaded at `func` whose body is
/// `code[..size]`. Bytes of `code` past `size` are what follows the body:
/// the alignment padding a short function's jump may cover. Only the bytes
/// up to the next 16-byte boundary are taken as padding: compilers align
/// functions to 16 bytes, so no other function starts there.
pub fn plan(code: &[u8], size: usize, func: u64) -> Result<EntryPlan, Refusal> {
    let size = size.min(code.len());
    let end = func + size as u64;
    let room = (end.next_multiple_of(16) - end) as usize;
    let code = &code[..code.len().min(size + room)];
    let skip = if code[..size].starts_with(&ENDBR64) { ENDBR64.len() } else { 0 };
    let at = func + skip as u64;
    match plan_prologue(&code[..size], skip, func) {
        Ok(p) => Ok(p),
        Err(Refusal::TooShort { .. } | Refusal::EndsEarly { .. } | Refusal::BranchIntoPatch { .. })
            if size - skip <= WHOLE_MAX =>
        {
            plan_whole(&code[skip..size], &code[size..], at, func)
        }
        Err(e) => Err(e),
    }
}

/// The run of `nop`/`int3` instructions at the start of `after`, in bytes.
fn padding(after: &[u8]) -> u64 {
    let mut len = 0;
    for i in Decoder::new(64, after, DecoderOptions::NONE) {
        if i.is_invalid() || !matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
            break;
        }
        len += i.len() as u64;
    }
    len
}

/// Checks one instruction that is to run from the trampoline. `last` says
/// whether execution leaves the displaced code after it.
fn check_movable(i: &Instruction, func: u64, last: bool, whole: bool) -> Result<(), Refusal> {
    let offset = i.ip() - func;
    let unmovable = |why| Refusal::Unmovable { offset, insn: text(i), why };
    // A system call returns to the next instruction of the copy; a thread
    // blocked in it in place is past `at`, so the patch waits for it.
    if i.code() == Code::Syscall {
        return Ok(());
    }
    match i.flow_control() {
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
            if !last && !whole =>
        {
            Err(Refusal::EndsEarly { offset, insn: text(i) })
        }
        FlowControl::Interrupt | FlowControl::Exception => Err(Refusal::EndsEarly { offset, insn: text(i) }),
        FlowControl::Call | FlowControl::IndirectCall => {
            if !last || whole {
                return Err(unmovable("its return address would lie inside the overwritten bytes"));
            }
            if !matches!(i.code(), Code::Call_rel32_64 | Code::Call_rm64) {
                return Err(unmovable("unsupported call form"));
            }
            if i.memory_base() == Register::RSP || i.memory_index() == Register::RSP {
                return Err(unmovable("an indirect call through the stack"));
            }
            Ok(())
        }
        FlowControl::XbeginXabortXend => Err(unmovable("transactional memory")),
        _ => Ok(()),
    }
}

/// A RIP-relative operand that reads or writes the bytes the jump overwrites
/// would see the jump (`lea` only takes the address, which stays right).
fn check_data(i: &Instruction, func: u64, at: u64, end: u64) -> Result<(), Refusal> {
    if i.is_ip_rel_memory_operand() && i.mnemonic() != Mnemonic::Lea {
        let t = i.ip_rel_memory_address();
        if (at..end).contains(&t) {
            return Err(Refusal::Unmovable {
                offset: i.ip() - func,
                insn: text(i),
                why: "it accesses the bytes the jump overwrites",
            });
        }
    }
    Ok(())
}

fn plan_prologue(code: &[u8], skip: usize, func: u64) -> Result<EntryPlan, Refusal> {
    let body = &code[skip..];
    let at = func + skip as u64;
    if (body.len() as u64) < JMP_LEN {
        return Err(Refusal::TooShort { len: body.len() as u64 });
    }
    let mut dec = Decoder::with_ip(64, body, at, DecoderOptions::NONE);
    let mut moved = Vec::new();
    let mut len = 0u64;
    // After a `ret` or `jmp` within the first 5 bytes, the rest of the bytes
    // the jump covers run only when branched to, which the scan below rules
    // out: they are overwritten, not moved.
    let mut terminal = false;
    while len < JMP_LEN {
        if !dec.can_decode() {
            return Err(Refusal::TooShort { len });
        }
        let i = dec.decode();
        let offset = i.ip() - func;
        if i.is_invalid() {
            return Err(Refusal::Undecodable { offset });
        }
        if moved.is_empty()
            && i.code() == Code::Jmp_rm64
            && i.is_ip_rel_memory_operand()
            && (code.len() as u64) <= PLT_STUB_MAX
        {
            return Err(Refusal::PltStub);
        }
        len += i.len() as u64;
        if terminal {
            continue;
        }
        let ends = matches!(
            i.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        );
        check_movable(&i, func, len >= JMP_LEN || ends, false)?;
        terminal = ends;
        moved.push(i);
    }
    let end = at + len;
    for i in &moved {
        check_data(i, func, at, end)?;
    }
    // Any branch of the function into the displaced bytes (other than their
    // first byte, where the jump itself lands) would execute half of our jump.
    let mut dec = Decoder::with_ip(64, code, func, DecoderOptions::NONE);
    for i in &mut dec {
        if i.is_invalid() {
            continue;
        }
        let target = match i.flow_control() {
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call => {
                i.near_branch_target()
            }
            _ => continue,
        };
        if target > at && target < end {
            return Err(Refusal::BranchIntoPatch { from: i.ip() - func, to: target - func });
        }
    }
    let original = body[..len as usize].to_vec();
    Ok(EntryPlan {
        func,
        at,
        moved,
        moved_len: len,
        start: at,
        original,
        hop: None,
        tactic: Tactic::Prologue,
        busy_end: end,
    })
}

/// Length of `jmp rel8`.
pub const JMP8_LEN: u64 = 2;
/// How far below its own end a `jmp rel8` reaches.
pub const HOP_BACK: u64 = 128;
/// How far above its own end a `jmp rel8` reaches.
pub const HOP_FORWARD: u64 = 127;

/// Where the jump goes in the function at `func` whose body is `code[..size]`: after any `endbr64`.
pub fn entry_point(code: &[u8], size: usize, func: u64) -> u64 {
    func + if code[..size.min(code.len())].starts_with(&ENDBR64) { ENDBR64.len() as u64 } else { 0 }
}

/// Whether `bytes` decode as `nop` and `int3` instructions only, ending exactly at their end.
fn all_padding(bytes: &[u8]) -> bool {
    !bytes.is_empty() && padding(bytes) == bytes.len() as u64
}

/// Plans [`Tactic::Hop`] for the function at `func` whose body is
/// `near[func - near_at..][..size]`, entered by other code at `entry`
/// (`at` < `entry` < `at` + 5): the instructions before `entry` are
/// displaced (they must end exactly there), a `jmp rel8` replaces their
/// first 2 bytes, and the `jmp rel32` goes to a 5-byte slot of one of the
/// `dead` runs (start, end): alignment padding that the module's code never
/// runs (it follows code that does not fall through, and no branch lands in
/// it). The slot's bytes are checked here to still be `nop`/`int3`, and
/// every byte from the slot to the entry must lie in `near`.
pub fn plan_hop(
    near: &[u8],
    near_at: u64,
    func: u64,
    size: usize,
    entry: u64,
    dead: &[(u64, u64)],
) -> Result<EntryPlan, Refusal> {
    let Some(code) = func.checked_sub(near_at).and_then(|o| near.get(o as usize..)) else {
        return Err(Refusal::Undecodable { offset: 0 });
    };
    let size = size.min(code.len());
    let at = entry_point(code, size, func);
    let skip = (at - func) as usize;
    let offset = entry - func;
    let refuse = |why| Refusal::Entered { offset, why };
    if entry < at + JMP8_LEN {
        return Err(refuse("fewer than 2 bytes lie before the entry"));
    }
    let mut dec = Decoder::with_ip(64, &code[skip..size], at, DecoderOptions::NONE);
    let mut moved = Vec::new();
    let mut len = 0u64;
    while at + len < entry {
        if !dec.can_decode() {
            return Err(refuse("the body ends before the entry"));
        }
        let i = dec.decode();
        if i.is_invalid() {
            return Err(Refusal::Undecodable { offset: i.ip() - func });
        }
        len += i.len() as u64;
        check_movable(&i, func, at + len >= entry, false)?;
        moved.push(i);
    }
    if at + len != entry {
        return Err(refuse("the entry is not an instruction boundary of the function"));
    }
    // The function's own branches may land on the entry, never between it and `at`.
    for i in Decoder::with_ip(64, &code[..size], func, DecoderOptions::NONE) {
        if !i.is_invalid()
            && matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
            )
            && i.near_branch_target() > at
            && i.near_branch_target() < entry
        {
            return Err(Refusal::BranchIntoPatch { from: i.ip() - func, to: i.near_branch_target() - func });
        }
    }
    // The closest slot within the rel8's reach at or after the entry (the
    // patch then spans the function's own bytes only), else below `at`.
    let from = at + JMP8_LEN;
    let (lo, hi) = (from.saturating_sub(HOP_BACK), from + HOP_FORWARD);
    let near_end = near_at + near.len() as u64;
    let mut best: Option<u64> = None;
    for &(s, e) in dead {
        if s < near_at || e > near_end || e < s + JMP_LEN {
            continue;
        }
        if !all_padding(&near[(s - near_at) as usize..(e - near_at) as usize]) {
            continue;
        }
        let below = (e - JMP_LEN).min(at.saturating_sub(JMP_LEN));
        let above = s.max(entry);
        for c in [below, above] {
            let fits = c >= s && c + JMP_LEN <= e && (lo..=hi).contains(&c);
            let apart = c + JMP_LEN <= at || c >= entry;
            // The patch rewrites every byte from the slot to the entry: none
            // may belong to other code, which may be patched too.
            let (gap_lo, gap_hi) = if c < func { (c + JMP_LEN, func) } else { (func + size as u64, c) };
            let clear = gap_lo >= gap_hi
                || all_padding(&near[(gap_lo - near_at) as usize..(gap_hi - near_at) as usize]);
            let rank = |c: u64| (c < at, c.abs_diff(at));
            if fits && apart && clear && best.is_none_or(|b| rank(c) < rank(b)) {
                best = Some(c);
            }
        }
    }
    let Some(slot) = best else {
        return Err(refuse(
            "no dead padding of 5 bytes within a jmp rel8's reach without other code between",
        ));
    };
    for i in &moved {
        check_data(i, func, at, at + JMP8_LEN)?;
        check_data(i, func, slot, slot + JMP_LEN)?;
    }
    let start = slot.min(at);
    let end = (slot + JMP_LEN).max(at + JMP8_LEN);
    let original = near[(start - near_at) as usize..(end - near_at) as usize].to_vec();
    Ok(EntryPlan {
        func,
        at,
        moved,
        moved_len: len,
        start,
        original,
        hop: Some(slot),
        tactic: Tactic::Hop,
        busy_end: at + JMP8_LEN,
    })
}

/// Plans [`Tactic::Whole`] for `body` (after any `endbr64`) at `at`, with
/// `after` the bytes behind it up to the next symbol.
fn plan_whole(body: &[u8], after: &[u8], at: u64, func: u64) -> Result<EntryPlan, Refusal> {
    let mut moved: Vec<Instruction> =
        Decoder::with_ip(64, body, at, DecoderOptions::NONE).into_iter().collect();
    if let Some(i) = moved.iter().find(|i| i.is_invalid()) {
        return Err(Refusal::Undecodable { offset: i.ip() - func });
    }
    // Alignment padding inside the symbol's size counts as padding too.
    let used = moved.iter().rposition(|i| !matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3));
    let Some(used) = used else {
        return Err(Refusal::TooShort { len: 0 });
    };
    moved.truncate(used + 1);
    let last = moved[used];
    let body_len = last.next_ip() - at;
    let tail: Vec<u8> = body[body_len as usize..].iter().chain(after).copied().collect();
    let pad = padding(&tail);
    if body_len + pad < JMP_LEN {
        return Err(Refusal::TooShort { len: body_len + pad });
    }
    let last = &last;
    // Execution must never fall off the copy's end into the trampoline's data.
    if !matches!(
        last.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    ) {
        return Err(Refusal::Unmovable {
            offset: last.ip() - func,
            insn: text(last),
            why: "the function's last instruction falls through into what follows it",
        });
    }
    let moved_len = body_len.max(JMP_LEN);
    for i in &moved {
        check_movable(i, func, false, true)?;
        check_data(i, func, at, at + moved_len)?;
        let target = match i.flow_control() {
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch => i.near_branch_target(),
            _ => continue,
        };
        // Branches into the overwritten bytes go to the copy: each must land on an instruction.
        if (at..at + moved_len).contains(&target) && !moved.iter().any(|m| m.ip() == target) {
            return Err(Refusal::BranchIntoPatch { from: i.ip() - func, to: target - func });
        }
    }
    let mut original = body[..body_len as usize].to_vec();
    original.extend_from_slice(&tail[..(moved_len - body_len) as usize]);
    Ok(EntryPlan {
        func,
        at,
        moved,
        moved_len,
        start: at,
        original,
        hop: None,
        tactic: Tactic::Whole,
        busy_end: at + moved_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x40_1000;

    #[test]
    fn moves_whole_instructions_after_endbr() {
        // endbr64; push rbp; mov rbp,rsp; push r15; ...
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x57, 0xc3];
        let p = plan(&code, code.len(), F).unwrap();
        assert_eq!(p.at, F + 4);
        assert_eq!(p.moved.len(), 3);
        assert_eq!(p.moved_len, 6);
        assert_eq!(p.resume(), F + 10);
        assert_eq!(p.original, code[4..10]);
    }

    #[test]
    fn five_byte_function_ending_in_ret_is_movable() {
        // lea eax,[rdi+rdi*2+1]; ret
        let code = [0x8d, 0x44, 0x3f, 0x01, 0xc3];
        let p = plan(&code, code.len(), F).unwrap();
        assert_eq!(p.moved_len, 5);
        assert_eq!(p.moved[1].flow_control(), FlowControl::Return);
    }

    #[test]
    fn refusals() {
        // lea eax,[rdi+1]; ret, and the next function right behind it
        assert_eq!(plan(&[0x8d, 0x47, 0x01, 0xc3, 0x55], 4, F).unwrap_err(), Refusal::TooShort { len: 4 });
        // xor eax,eax; int3; ret: a trap inside the moved code
        let e = plan(&[0x31, 0xc0, 0xcc, 0xc3, 0x90, 0x90], 4, F).unwrap_err();
        assert!(matches!(e, Refusal::EndsEarly { offset: 2, .. }), "{e}");
        // xor eax,eax; ret; int3 x4 inside the symbol's size: the jump covers
        // two int3 that only a branch could reach, and none does
        let p = plan(&[0x31, 0xc0, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc], 7, F).unwrap();
        assert_eq!((p.tactic, p.moved.len(), p.moved_len), (Tactic::Prologue, 2, 5));
        // jmp +3; nop x3; ret; with a loop back to +2: refused, too long to move whole
        let mut code = vec![0xeb, 0x03, 0x90, 0x90, 0x90, 0xc3];
        code.resize(WHOLE_MAX, 0x90);
        code.extend_from_slice(&[0xeb, (0x100 - (WHOLE_MAX + 2 - 2)) as u8, 0xc3]);
        assert_eq!(
            plan(&code, code.len(), F).unwrap_err(),
            Refusal::BranchIntoPatch { from: WHOLE_MAX as u64, to: 2 }
        );
        // xor eax,eax; call rax; pop rbx: the call returns into the overwritten bytes
        let e = plan(&[0x31, 0xc0, 0xff, 0xd0, 0x5b], 5, F).unwrap_err();
        assert!(matches!(e, Refusal::Unmovable { offset: 2, .. }), "{e}");
        // endbr64; bnd jmp [rip+0x2f62]; nop
        let plt = [0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x62, 0x2f, 0, 0, 0x0f, 0x1f, 0x44, 0, 0];
        assert_eq!(plan(&plt, plt.len(), F).unwrap_err(), Refusal::PltStub);
        // call rel32; (call not last: push rax first would make it last) -> call at +0 then more
        let e = plan(&[0x31, 0xc0, 0xe8, 0, 0, 0, 0, 0x90, 0xc3], 9, F).unwrap();
        assert_eq!(e.moved_len, 7);
        let e = plan(&[0xe8, 0, 0, 0, 0, 0x90, 0xc3], 7, F).unwrap();
        assert_eq!(e.moved_len, 5);
        // push rbx; mov ebx,edi; test ebx,ebx; jne -4 (into +1), 0x60 bytes long:
        // a loop back into the patch, too long to move whole
        let mut code = vec![0x53, 0x89, 0xfb, 0x85, 0xdb, 0x75, 0xfa];
        code.resize(WHOLE_MAX + 1, 0x90);
        code.push(0xc3);
        assert_eq!(plan(&code, code.len(), F).unwrap_err(), Refusal::BranchIntoPatch { from: 5, to: 1 });
        // mov eax,[rip-6]: reads its own bytes, which the jump replaces
        let e = plan(&[0x8b, 0x05, 0xfa, 0xff, 0xff, 0xff, 0xc3], 7, F).unwrap_err();
        assert!(matches!(e, Refusal::Unmovable { offset: 0, .. }), "{e}");
    }

    #[test]
    fn hop_covers_only_the_bytes_before_an_entry() {
        // 8 bytes of padding after a `ret`, then: push rbx; mov ebx,edi;
        // (+3, entered from elsewhere) lea eax,[rbx+1]; pop rbx; ret
        let pad = [0xc3, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
        let body = [0x53, 0x89, 0xfb, 0x8d, 0x43, 0x01, 0x5b, 0xc3];
        let near: Vec<u8> = pad.iter().chain(&body).copied().collect();
        let near_at = F - pad.len() as u64;
        let dead = [(near_at + 1, F)];
        let p = plan_hop(&near, near_at, F, body.len(), F + 3, &dead).unwrap();
        assert_eq!((p.tactic, p.moved.len(), p.moved_len, p.resume()), (Tactic::Hop, 2, 3, F + 3));
        assert_eq!((p.hop, p.start, p.busy_end), (Some(F - 5), F - 5, F + 2));
        assert_eq!(p.original, near[4..11]);
        let jump = crate::patch::codegen::entry_jump(&p, F + 0x1000).unwrap();
        let rel32 = (0x1000i32 + 5 - 5).to_le_bytes();
        assert_eq!(
            jump,
            [0xe9, rel32[0], rel32[1], rel32[2], rel32[3], 0xeb, 0xf9],
            "jmp rel32; jmp rel8 -7"
        );
        // The entry mid-instruction, too close, or no dead bytes within reach: refused.
        let e = plan_hop(&near, near_at, F, body.len(), F + 2, &dead).unwrap_err();
        assert!(matches!(e, Refusal::Entered { offset: 2, .. }), "{e}");
        let e = plan_hop(&near, near_at, F, body.len(), F + 1, &dead).unwrap_err();
        assert!(matches!(e, Refusal::Entered { offset: 1, .. }), "{e}");
        let e = plan_hop(&near, near_at, F, body.len(), F + 3, &[]).unwrap_err();
        assert!(matches!(e, Refusal::Entered { offset: 3, .. }), "{e}");
        // A "dead" run whose bytes are not padding is not used.
        let e = plan_hop(&near, near_at, F, body.len(), F + 3, &[(near_at, F)]).unwrap_err();
        assert!(matches!(e, Refusal::Entered { offset: 3, .. }), "{e}");
        // Another function between the padding and this one: refused, its bytes may be patched too.
        let other = [0x31, 0xc0, 0xc3]; // xor eax,eax; ret
        let apart: Vec<u8> = pad.iter().chain(&other).chain(&body).copied().collect();
        let apart_at = F - (pad.len() + other.len()) as u64;
        let e =
            plan_hop(&apart, apart_at, F, body.len(), F + 3, &[(apart_at + 1, apart_at + 9)]).unwrap_err();
        assert!(matches!(e, Refusal::Entered { offset: 3, .. }), "{e}");
        // Its own branch between the jump and the entry: refused.
        let mut looped = near.clone();
        looped.extend_from_slice(&[0xeb, 0xf7]); // jmp to F+1 from F+8
        let e = plan_hop(&looped, near_at, F, body.len() + 2, F + 3, &dead).unwrap_err();
        assert_eq!(e, Refusal::BranchIntoPatch { from: 8, to: 1 });
    }

    #[test]
    fn short_functions_move_whole_over_their_padding() {
        // lea eax,[rdi+1]; ret; then padding to the 16-byte boundary
        let code = [0x8d, 0x47, 0x01, 0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x90, 0x90];
        let p = plan(&code, 4, F).unwrap();
        assert_eq!(p.tactic, Tactic::Whole);
        assert_eq!(p.moved.len(), 2);
        assert_eq!(p.moved_len, 5);
        assert_eq!(p.original, code[..5]);
        // endbr64; ret; int3 padding
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc];
        let p = plan(&code, 5, F).unwrap();
        assert_eq!((p.at, p.moved_len, p.busy_end), (F + 4, 5, F + 9));
        // the same at an address 3 bytes before a 16-byte boundary: no padding to use
        let at = F + 16 - 4 - 3;
        assert_eq!(plan(&code, 5, at).unwrap_err(), Refusal::TooShort { len: 3 });
        // xor eax,eax; ret; nop: ends early, moved whole
        let p = plan(&[0x31, 0xc0, 0xc3, 0x90, 0x90, 0x90], 3, F).unwrap();
        assert_eq!((p.tactic, p.moved_len), (Tactic::Whole, 5));
        // test edi,edi; je +1; ret; xor eax,eax; ret: the branch lands just past the jump
        let p = plan(&[0x85, 0xff, 0x74, 0x01, 0xc3, 0x31, 0xc0, 0xc3], 8, F).unwrap();
        assert_eq!((p.tactic, p.moved_len, p.moved.len()), (Tactic::Prologue, 5, 3));
    }
}
