//! Deciding whether a function's entry can take a 5-byte jump, and which
//! instructions the jump displaces.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter, Instruction, IntelFormatter, Register,
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
    /// The relocated code does not encode at the trampoline's address.
    #[error("cannot relocate the displaced instructions: {0}")]
    Relocation(String),
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
    /// Bytes the displaced instructions occupy (≥ [`JMP_LEN`]).
    pub moved_len: u64,
    /// The original bytes at `at`, `moved_len` long.
    pub original: Vec<u8>,
}

impl EntryPlan {
    /// Where execution resumes in the original code after the displaced instructions.
    pub fn resume(&self) -> u64 {
        self.at + self.moved_len
    }
}

fn text(i: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(i, &mut out);
    out
}

/// Plans the entry patch of the function whose whole body is `code`, loaded at `func`.
pub fn plan(code: &[u8], func: u64) -> Result<EntryPlan, Refusal> {
    let skip = if code.starts_with(&ENDBR64) { ENDBR64.len() } else { 0 };
    let body = &code[skip..];
    let at = func + skip as u64;
    if (body.len() as u64) < JMP_LEN {
        return Err(Refusal::TooShort { len: body.len() as u64 });
    }
    let mut dec = Decoder::with_ip(64, body, at, DecoderOptions::NONE);
    let mut moved = Vec::new();
    let mut len = 0u64;
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
        let last = len >= JMP_LEN;
        let unmovable = |why| Refusal::Unmovable { offset, insn: text(&i), why };
        if i.code() == Code::Syscall {
            if !last {
                return Err(unmovable("the system call would return inside the overwritten bytes"));
            }
            moved.push(i);
            continue;
        }
        match i.flow_control() {
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch if !last => {
                return Err(Refusal::EndsEarly { offset, insn: text(&i) });
            }
            FlowControl::Interrupt | FlowControl::Exception => {
                return Err(Refusal::EndsEarly { offset, insn: text(&i) });
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                if !last {
                    return Err(unmovable("its return address would lie inside the overwritten bytes"));
                }
                if !matches!(i.code(), Code::Call_rel32_64 | Code::Call_rm64) {
                    return Err(unmovable("unsupported call form"));
                }
                if i.memory_base() == Register::RSP || i.memory_index() == Register::RSP {
                    return Err(unmovable("an indirect call through the stack"));
                }
            }
            FlowControl::XbeginXabortXend => return Err(unmovable("transactional memory")),
            _ => {}
        }
        moved.push(i);
    }
    let end = at + len;
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
    Ok(EntryPlan { func, at, moved, moved_len: len, original })
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x40_1000;

    #[test]
    fn moves_whole_instructions_after_endbr() {
        // endbr64; push rbp; mov rbp,rsp; push r15; ...
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x57, 0xc3];
        let p = plan(&code, F).unwrap();
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
        let p = plan(&code, F).unwrap();
        assert_eq!(p.moved_len, 5);
        assert_eq!(p.moved[1].flow_control(), FlowControl::Return);
    }

    #[test]
    fn refusals() {
        // lea eax,[rdi+1]; ret
        assert_eq!(plan(&[0x8d, 0x47, 0x01, 0xc3], F).unwrap_err(), Refusal::TooShort { len: 4 });
        // xor eax,eax; ret; int3 x4
        let e = plan(&[0x31, 0xc0, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc], F).unwrap_err();
        assert!(matches!(e, Refusal::EndsEarly { offset: 2, .. }), "{e}");
        // endbr64; bnd jmp [rip+0x2f62]; nop
        let plt = [0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x62, 0x2f, 0, 0, 0x0f, 0x1f, 0x44, 0, 0];
        assert_eq!(plan(&plt, F).unwrap_err(), Refusal::PltStub);
        // call rel32; (call not last: push rax first would make it last) -> call at +0 then more
        let e = plan(&[0x31, 0xc0, 0xe8, 0, 0, 0, 0, 0x90, 0xc3], F).unwrap();
        assert_eq!(e.moved_len, 7);
        let e = plan(&[0xe8, 0, 0, 0, 0, 0x90, 0xc3], F).unwrap();
        assert_eq!(e.moved_len, 5);
        // push rbx; mov ebx,edi; test ebx,ebx; jne -4 (into +1): loop back into the patch
        let code = [0x53, 0x89, 0xfb, 0x85, 0xdb, 0x75, 0xfa, 0x5b, 0xc3];
        assert_eq!(plan(&code, F).unwrap_err(), Refusal::BranchIntoPatch { from: 5, to: 1 });
    }
}
