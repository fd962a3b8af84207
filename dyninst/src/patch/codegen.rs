//! Machine code papirus writes: entry trampolines and the jump to them.
//!
//! An entry trampoline, entered by the `jmp` that replaced the function's
//! first instructions, with the stack exactly as the caller left it:
//!
//! ```text
//! push rax; lahf; seto al; push rax                  ; status flags
//! push rcx rdx rsi rdi r8 r9 r10 r11 rbx             ; what the code may rely on
//! mov rbx, rsp; and rsp, -16; cld                      ; ABI state for the hook
//! mov edi, ARG; lea rsi, [rbx + 88]                    ; id, return-address slot
//! call [rip + hook]
//! mov rsp, rbx; pop …; pop rax; add al, 0x7f; sahf; pop rax
//! <displaced instructions, relocated>
//! jmp <first original instruction not displaced>
//! hook: dq HOOK
//! ```
//!
//! Callee-saved registers are the hook's to preserve (SysV ABI). Vector and
//! x87 registers are not saved: the runtime's hooks never touch them (checked
//! by disassembling them in papirus' tests). No red zone is skipped: at a
//! function's entry everything below the stack pointer belongs to the callee,
//! so neither the pushes nor the hook's frame can clobber live data (this
//! would not hold at a mid-function point).

use iced_x86::code_asm::*;
use iced_x86::{Code, FlowControl, Instruction};

use super::analyze::{EntryPlan, JMP_LEN, Refusal};

/// Bytes from the trampoline's saved-register area to the return-address slot
/// (rax, the flags image and nine more registers).
const SAVED: i32 = 11 * 8;

/// Assembles the entry trampoline of `plan` for address `ip`, calling
/// `hook(arg, slot)` before the displaced instructions run.
pub fn entry_trampoline(plan: &EntryPlan, ip: u64, hook: u64, arg: u32) -> Result<Vec<u8>, Refusal> {
    build(plan, ip, hook, arg).map_err(|e| Refusal::Relocation(e.to_string()))
}

fn build(plan: &EntryPlan, ip: u64, hook: u64, arg: u32) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut hook_ptr = a.create_label();
    let saved = [rcx, rdx, rsi, rdi, r8, r9, r10, r11, rbx];
    // Status flags without pushfq/popfq (popfq alone costs more than the rest
    // of the trampoline here): SF ZF AF PF CF via lahf/sahf, OF via seto.
    a.push(rax)?;
    a.lahf()?;
    a.seto(al)?;
    a.push(rax)?;
    for r in saved {
        a.push(r)?;
    }
    a.mov(rbx, rsp)?;
    a.and(rsp, -16)?;
    a.cld()?;
    a.mov(edi, arg)?;
    a.lea(rsi, qword_ptr(rbx + SAVED))?;
    a.call(qword_ptr(hook_ptr))?;
    a.mov(rsp, rbx)?;
    for r in saved.into_iter().rev() {
        a.pop(r)?;
    }
    a.pop(rax)?;
    a.add(al, 0x7f)?; // OF = the saved seto bit
    a.sahf()?;
    a.pop(rax)?;
    for i in &plan.moved {
        relocate(&mut a, i)?;
    }
    a.jmp(plan.resume())?;
    a.set_label(&mut hook_ptr)?;
    a.dq(&[hook])?;
    a.assemble(ip)
}

/// Adds one displaced instruction. BlockEncoder fixes RIP-relative operands
/// and relative branches for the new address. A call (only ever the last
/// displaced instruction) becomes "push the original return address; jmp":
/// the callee returns into the original code, whose unwind tables cover the
/// return address, rather than into the trampoline.
fn relocate(a: &mut CodeAssembler, i: &Instruction) -> Result<(), IcedError> {
    if matches!(i.flow_control(), FlowControl::Call | FlowControl::IndirectCall) {
        let ret = i.next_ip();
        let mut j = *i;
        j.set_code(if i.code() == Code::Call_rel32_64 { Code::Jmp_rel32_64 } else { Code::Jmp_rm64 });
        a.lea(rsp, qword_ptr(rsp - 8))?;
        a.mov(dword_ptr(rsp), ret as u32)?;
        a.mov(dword_ptr(rsp + 4), (ret >> 32) as u32)?;
        a.add_instruction(j)?;
        return Ok(());
    }
    a.add_instruction(*i)?;
    Ok(())
}

/// The bytes that replace the displaced instructions: `jmp rel32` to the
/// trampoline, then `int3` over the rest of the last displaced instruction.
/// `None` when the trampoline is out of a rel32's reach.
pub fn entry_jump(plan: &EntryPlan, trampoline: u64) -> Option<Vec<u8>> {
    let rel = i32::try_from(trampoline as i64 - (plan.at + JMP_LEN) as i64).ok()?;
    let mut out = vec![0xe9];
    out.extend_from_slice(&rel.to_le_bytes());
    out.resize(plan.moved_len as usize, 0xcc);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::analyze::plan;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    fn decode(bytes: &[u8], ip: u64) -> Vec<Instruction> {
        Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).into_iter().collect()
    }

    #[test]
    fn relocates_rip_relative_operands() {
        let f = 0x7000_0000_1000u64;
        // mov rax,[rip+0x100]; ret
        let p = plan(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0, 0, 0xc3], f).unwrap();
        let tip = f + 0x10_0000;
        let bytes = entry_trampoline(&p, tip, 0x1234_5678_9abc, 7).unwrap();
        let insns = decode(&bytes, tip);
        let load =
            insns.iter().find(|i| i.mnemonic() == Mnemonic::Mov && i.is_ip_rel_memory_operand()).unwrap();
        assert_eq!(load.ip_rel_memory_address(), f + 7 + 0x100);
        let back = insns.iter().find(|i| i.mnemonic() == Mnemonic::Jmp).unwrap();
        assert_eq!(back.near_branch_target(), f + 7, "back to the original code");
        assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Mov && i.immediate32() == 7), "id in edi");
        let hook = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().unwrap());
        assert_eq!(hook, 0x1234_5678_9abc);
        let jump = entry_jump(&p, tip).unwrap();
        assert_eq!(jump.len(), 7);
        assert_eq!(jump[0], 0xe9);
        assert!(jump[5..].iter().all(|&b| b == 0xcc));
        assert!(entry_jump(&p, f + (1 << 32)).is_none());
    }

    #[test]
    fn a_displaced_call_returns_to_the_original_code() {
        let f = 0x7000_0000_1000u64;
        // push rbx; call +0x40; ret
        let p = plan(&[0x53, 0xe8, 0x40, 0, 0, 0, 0xc3], f).unwrap();
        let tip = f - 0x10_0000;
        let insns = decode(&entry_trampoline(&p, tip, 1, 0).unwrap(), tip);
        let jmps: Vec<_> = insns.iter().filter(|i| i.mnemonic() == Mnemonic::Jmp).collect();
        assert_eq!(jmps[0].near_branch_target(), f + 6 + 0x40, "the call became a jmp to its target");
        let pushed: Vec<_> = insns
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Mov && i.op0_kind() == iced_x86::OpKind::Memory)
            .collect();
        assert_eq!(pushed[0].immediate32(), (f + 6) as u32);
        assert_eq!(pushed[1].immediate32(), ((f + 6) >> 32) as u32);
        assert!(insns.iter().all(|i| i.mnemonic() != Mnemonic::Call || i.is_ip_rel_memory_operand()));
    }
}
